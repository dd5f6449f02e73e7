"""Hypothesis profiles for the test suite.

``default`` keeps the whole suite to a couple of minutes on two cores; ``ci`` runs more
examples per property. Pick one with the ``HYPOTHESIS_PROFILE`` environment variable. Both
turn the per-example deadline off: run times vary with machine load, and a slow example is
not a wrong one.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "default",
    deadline=None,
    max_examples=60,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "ci",
    deadline=None,
    max_examples=400,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


@pytest.fixture(autouse=True)
def _plain_output(monkeypatch: pytest.MonkeyPatch) -> None:
    """Command output as a pipe gets it, whatever the terminal running the tests."""
    for name in ("COLUMNS", "FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE"):
        monkeypatch.delenv(name, raising=False)
