"""Print pip constraints pinning every declared ``>=`` floor, so a job can test them.

Reads the ``pyproject.toml`` of the core and of each backend; ``make test-min`` installs with
these constraints to prove that the lowest versions the projects allow do work.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROJECTS = ["pyproject.toml", "backends/reference/pyproject.toml", "backends/npu/pyproject.toml"]
FLOOR = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*>=\s*([0-9][^,;\s]*)")


def floors() -> dict[str, str]:
    found: dict[str, str] = {}
    for name in PROJECTS:
        project = tomllib.loads((ROOT / name).read_text())["project"]
        requirements = list(project.get("dependencies", []))
        for extra in project.get("optional-dependencies", {}).values():
            requirements.extend(extra)
        for requirement in requirements:
            match = FLOOR.match(requirement)
            if match is None:
                continue
            package, version = match[1].lower().replace("_", "-"), match[2]
            if found.get(package, version) != version:
                sys.exit(f"{package}: two different floors, {found[package]} and {version}")
            found[package] = version
    return found


def main(argv: list[str]) -> None:
    """``--exclude NAME ...`` leaves those packages out (the job does not install them)."""
    excluded = set(argv[argv.index("--exclude") + 1 :]) if "--exclude" in argv else set()
    for package, version in sorted(floors().items()):
        if package not in excluded:
            print(f"{package}=={version}")


if __name__ == "__main__":
    main(sys.argv[1:])
