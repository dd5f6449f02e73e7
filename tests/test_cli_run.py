"""``pypto-sched backends`` and ``pypto-sched run`` over a toy backend installed by hand.

The command line only parses and renders here: statuses come from
``pypto_sched.backends.backend_statuses``, progress from the driver's ``on_dispatch`` and
verification from ``pypto_sched.verify_against_one_shot``; the tests check each is used.
"""

from __future__ import annotations

import json
import sys
import textwrap
from collections.abc import Iterator
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt
import pytest
from cli_helpers import run, run_json

import pypto_sched
from pypto_sched.backends import DispatchInput, DispatchOutput
from pypto_sched.cli import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from pypto_sched.cli import run as run_command
from pypto_sched.runtime import backends

SEED_256 = [
    "--lengths",
    "3338x16",
    "--max-num-batched-tokens",
    "8192",
    "--long-prefill-token-threshold",
    "256",
]


TOY_MODULE = """
from pypto_sched.backends import describe_factory
from toy_backend_impl import ToyBackend

@describe_factory(
    options={
        "vocab_size": "columns of the logits (default 50)",
        "skew": "drift per token",
        "tie": "a near-tie at the argmax",
        "fail": "fail on a dispatch",
        "device": "the device",
    }
)
def create(**options):
    return ToyBackend(**options)

def unavailable(**options):
    return ToyBackend(**options)

unavailable.is_available = lambda: (False, "no toy device here")

def needy(checkpoint, *, dtype="float64", **options):
    return ToyBackend(**options)
"""


class ToyBackend:
    """A backend whose "model" reads the whole context back from its KV cache: final logits
    depend on every token and position of the prompt, so a chunk written to the wrong slot
    or read from the wrong page shows up as a logit difference."""

    name: ClassVar[str] = "toy"

    def __init__(
        self,
        *,
        vocab_size: int = 50,
        skew: float = 0.0,
        tie: float = 0.0,
        fail: bool = False,
        device: str = "toy",
    ) -> None:
        if vocab_size < 2:
            raise ValueError(f"'vocab_size' must be >= 2: {vocab_size}")
        if device != "toy":
            raise RuntimeError(f"no such device: {device}")
        self._vocab_size = vocab_size
        self._skew = skew  # nonzero: chunked prefill drifts from one-shot (a broken backend)
        # nonzero: a near-tie of columns 0 and 1 that a final chunk shorter than the prompt
        # breaks the other way, by 2 * tie
        self._tie = tie
        self._fail = fail  # the device fails on the second dispatch
        self._dispatches = 0

    @property
    def tolerance(self) -> float:
        return 1e-9

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def hidden_size(self) -> int:
        return 4

    def new_cache(self, *, num_pages: int, page_size: int) -> npt.NDArray[np.int64]:
        return np.full(num_pages * page_size, -1, dtype=np.int64)

    def embed(self, token_ids: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
        return np.zeros((token_ids.size, 4))

    def run_dispatch(self, batch: DispatchInput, cache: npt.NDArray[np.int64]) -> DispatchOutput:
        self._dispatches += 1
        if self._fail and self._dispatches == 2:
            raise RuntimeError("device lost")
        arrays = batch.arrays
        cache[arrays.slot_mapping] = batch.token_ids
        rows = []
        for row in np.flatnonzero(arrays.is_final):
            length = int(arrays.seq_lens[row])
            positions = np.arange(length)
            table = arrays.block_tables[row]
            slots = table[positions // arrays.page_size] * arrays.page_size
            context = cache[slots + positions % arrays.page_size]
            signal = float(np.sum(context * (positions + 1)) % 9973)
            signal += self._skew * arrays.query_lens[row]
            if self._tie:
                near_tie = np.zeros(self._vocab_size)
                whole = arrays.query_lens[row] == length
                near_tie[:2] = [1.0, 1.0 + (self._tie if whole else -self._tie)]
                rows.append(near_tie)
            else:
                rows.append(np.cos(signal + np.arange(self._vocab_size)))
        logits = np.array(rows).reshape(-1, self._vocab_size)
        return DispatchOutput(
            logits=logits if batch.return_logits else None,
            greedy_token_ids=logits.argmax(axis=1) if batch.return_greedy else None,
        )


@pytest.fixture
def toy_entry_points(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[EntryPoint]]:
    """Entry points of a toy backend, one that cannot run here and one that fails to load,
    installed as the only backends."""
    (tmp_path / "toy_backend.py").write_text(textwrap.dedent(TOY_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    impl = type(sys)("toy_backend_impl")
    impl.ToyBackend = ToyBackend  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "toy_backend_impl", impl)
    group = backends.ENTRY_POINT_GROUP
    points = [
        EntryPoint("toy", "toy_backend:create", group),
        EntryPoint("ghost", "toy_backend:unavailable", group),
        EntryPoint("broken", "no_such_module_xyz:create", group),
    ]
    monkeypatch.setattr(backends, "entry_points", lambda *, group: points)
    backends.refresh_backends()
    yield points
    backends.refresh_backends()


# -- backends --------------------------------------------------------------------------------


@pytest.mark.usefixtures("toy_entry_points")
def test_backends_lists_each_with_whether_it_runs_here(capsys: pytest.CaptureFixture[str]) -> None:
    data = run_json(capsys, "backends")
    assert [(r["name"], r["available"]) for r in data] == [
        ("broken", False),
        ("ghost", False),
        ("toy", True),
    ]
    assert "No module named 'no_such_module_xyz'" in data[0]["reason"]
    assert data[1]["reason"] == "no toy device here"
    assert data == [status.to_dict() for status in backends.backend_statuses()]
    status, out, _ = run(capsys, "backends")
    assert status == EXIT_OK
    assert out.splitlines()[0].split() == ["name", "version", "entry", "point", "runs", "here"]
    assert "ghost" in out
    assert "no: no toy device here" in out


@pytest.mark.usefixtures("toy_entry_points")
def test_backends_lists_the_options_each_factory_declares(
    capsys: pytest.CaptureFixture[str],
) -> None:
    data = {row["name"]: row for row in run_json(capsys, "backends")}
    assert data["toy"]["options"] == {
        "vocab_size": "columns of the logits (default 50)",
        "skew": "drift per token",
        "tie": "a near-tie at the argmax",
        "fail": "fail on a dispatch",
        "device": "the device",
    }
    assert data["ghost"]["options"] == {}
    _, out, _ = run(capsys, "backends")
    lines = out.splitlines()
    heading = lines.index("toy options (--backend-option KEY=VALUE):")
    assert lines[heading + 1].split() == ["option", "meaning"]
    assert lines[heading + 3].split() == [
        "vocab_size",
        "columns",
        "of",
        "the",
        "logits",
        "(default",
        "50)",
    ]
    assert lines[heading + 4].split() == ["skew", "drift", "per", "token"]
    assert "ghost options" not in out


@pytest.mark.parametrize("name", ["reference", "npu"])
def test_both_backends_declare_their_factory_options(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    installed = {ep.name for ep in entry_points(group=backends.ENTRY_POINT_GROUP)}
    if name not in installed:
        pytest.skip(f"the {name} backend is not installed")
    status = backends.backend_status(name)
    if not status.available and "failed to load" in status.reason:
        pytest.skip(f"the {name} backend does not import here: {status.reason}")
    expected = {
        "reference": {"checkpoint", "seed", "dtype", "num_hidden_layers"},
        "npu": {"checkpoint", "dtype", "device", "ops"},
    }[name]
    assert expected <= set(status.options)
    assert all(status.options.values())
    listed = {row["name"]: row for row in run_json(capsys, "backends")}
    assert listed[name]["options"] == dict(status.options)


# -- run -------------------------------------------------------------------------------------


@pytest.mark.usefixtures("toy_entry_points")
def test_run_verifies_chunked_prefill_against_one_shot(
    capsys: pytest.CaptureFixture[str],
) -> None:
    data = run_json(
        capsys,
        "run",
        "--backend",
        "toy",
        "--backend-option",
        "vocab_size=40",
        "--lengths",
        "37,5,64",
        "--max-num-batched-tokens",
        "16",
        "--verify",
        "--seed",
        "3",
    )
    assert data["backend"] == "toy"
    assert data["num_dispatches"] == 8  # 3 + 1 + 4 chunks of at most 16, one per dispatch
    assert data["num_tokens"] == 106
    assert len(data["greedy_token_ids"]) == 3
    assert all(0 <= t < 40 for t in data["greedy_token_ids"])
    verify = data["verify"]
    assert verify["passed"] is True
    assert verify["max_abs_logit_diff"] <= 1e-9
    assert verify["greedy_agree"] == 3
    assert verify["problem"] is None


@pytest.mark.usefixtures("toy_entry_points")
def test_run_text_summary_and_progress(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run(
        capsys,
        "run",
        "--backend",
        "toy",
        *SEED_256,
        "--policy",
        "packed",
        "--max-num-seqs",
        "16",
        "--verify",
        "--progress",
    )
    assert status == EXIT_OK
    assert out.splitlines()[0] == "16 requests, 53,408 tokens on backend 'toy' (packed)"
    assert "dispatches           14" in out
    assert (
        "PASS vs one-shot: max |logit diff| 0 (tolerance 1e-09); greedy ids agree for 16 of 16 "
        "requests; one-shot run" in out
    )
    assert "prefill" in err  # the progress bars' labels
    assert "one-shot" in err


@pytest.mark.usefixtures("toy_entry_points")
def test_run_progress_is_the_drivers_on_dispatch_callback_on_the_backend_itself(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[tuple[str, int, int | None]] = []
    real = pypto_sched.execute_schedule

    def spy(schedule: Any, backend: Any, token_ids: Any, **options: Any) -> Any:
        assert type(backend) is ToyBackend  # no wrapper counts the dispatches
        on_dispatch = options["on_dispatch"]
        assert callable(on_dispatch)

        def record(done: pypto_sched.DispatchDone) -> None:
            seen.append((type(backend).__name__, done.index, done.num_dispatches))
            on_dispatch(done)

        return real(schedule, backend, token_ids, **{**options, "on_dispatch": record})

    monkeypatch.setattr(run_command, "execute_schedule", spy)
    status, _, err = run(
        capsys,
        "run",
        "--backend",
        "toy",
        "--lengths",
        "20,9",
        "--max-num-batched-tokens",
        "8",
        "--progress",
    )
    assert status == EXIT_OK
    assert seen == [("ToyBackend", i, 5) for i in range(5)]  # 8+8+4 and 8+1
    assert "5/5" in err


@pytest.mark.usefixtures("toy_entry_points")
def test_run_verify_is_the_librarys_rule_on_the_chunked_result(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[dict[str, Any]] = []
    real = pypto_sched.verify_against_one_shot

    def spy(*args: Any, **options: Any) -> Any:
        calls.append(options)
        return real(*args, **options)

    monkeypatch.setattr(run_command, "verify_against_one_shot", spy)
    data = run_json(
        capsys,
        "run",
        "--backend",
        "toy",
        "--lengths",
        "20,9",
        "--max-num-batched-tokens",
        "8",
        "--verify",
    )
    assert len(calls) == 1
    chunked = calls[0]["chunked"]
    assert isinstance(chunked, pypto_sched.ExecutionResult)
    assert chunked.greedy_token_ids is not None
    assert chunked.greedy_token_ids.tolist() == data["greedy_token_ids"]
    assert data["verify"]["passed"] is True


@pytest.mark.usefixtures("toy_entry_points")
def test_run_verify_passes_a_near_tie_broken_the_other_way(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Chunked and one-shot logits differ by 2e-10 (within the tolerance 1e-9) and their
    # argmax differs: a correct backend at a near-tie, not a mismatch.
    data = run_json(
        capsys,
        "run",
        "--backend",
        "toy",
        "--backend-option",
        "tie=1e-10",
        "--lengths",
        "20,30",
        "--max-num-batched-tokens",
        "8",
        "--verify",
    )
    assert data["greedy_token_ids"] == [0, 0]  # one-shot would say [1, 1]
    assert data["verify"]["passed"] is True
    assert data["verify"]["max_abs_logit_diff"] == pytest.approx(2e-10)


@pytest.mark.usefixtures("toy_entry_points")
def test_run_exits_1_when_chunked_prefill_differs_from_one_shot(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status, out, err = run(
        capsys,
        "run",
        "--backend",
        "toy",
        "--backend-option",
        "skew=0.5",
        "--lengths",
        "40x2",
        "--max-num-batched-tokens",
        "16",
        "--verify",
        "--format",
        "json",
    )
    assert (status, err) == (EXIT_FAILED, "")
    verify = json.loads(out)["verify"]
    assert verify["passed"] is False
    assert verify["problem"].startswith("final logits of request 0 at position 39 differ")


def test_a_missing_required_backend_option_is_named_as_the_option_to_give(
    capsys: pytest.CaptureFixture[str], toy_entry_points: list[EntryPoint]
) -> None:
    toy_entry_points.append(EntryPoint("needy", "toy_backend:needy", backends.ENTRY_POINT_GROUP))
    backends.refresh_backends()
    argv = ["--lengths", "8x3", "--max-num-batched-tokens", "8"]
    code, out, err = run(capsys, "run", "--backend", "needy", *argv)
    assert (code, out) == (EXIT_USAGE, "")
    assert err == (
        "pypto-sched: error: --backend-option: backend 'needy' needs --backend-option "
        "checkpoint=VALUE\n"
    )
    code, _, err = run(capsys, "run", "--backend", "needy", "--backend-option", "checkpoint=x",
                       "--backend-option", "colour=3", *argv)  # fmt: skip
    assert code == EXIT_USAGE
    assert err.startswith("pypto-sched: error: --backend-option: backend 'needy': ")
    assert "colour" in err


@pytest.mark.usefixtures("toy_entry_points")
@pytest.mark.parametrize(
    ("argv", "status", "message"),
    [
        (["--backend", "nope"], EXIT_USAGE, "--backend: must be an installed backend"),
        (["--backend", "toy", "--backend-option", "colour=3"], EXIT_USAGE, "colour"),
        (["--backend", "toy", "--backend-option", "oops"], EXIT_USAGE, "expected KEY=VALUE"),
        (
            ["--backend", "toy", "--backend-option", "vocab_size=-1"],
            EXIT_USAGE,
            "--backend-option: backend 'toy': 'vocab_size' must be >= 2: -1",
        ),
        (
            ["--backend", "toy", "--backend-option", "vocab_size=" + "9" * 5000],
            EXIT_USAGE,
            "--backend-option: backend 'toy'",
        ),
        (
            ["--backend", "toy", "--backend-option", "vocab_size=" + "[" * 100_000],
            EXIT_USAGE,
            "--backend-option: backend 'toy'",
        ),
        (["--backend", "toy", "--num-computed", "1x3"], EXIT_USAGE, "empty KV cache"),
        (["--backend", "toy", "--seed", "-1"], EXIT_USAGE, "--seed: must be >= 0: -1"),
        (
            ["--backend", "toy", "--kv-page-size", "0"],
            EXIT_USAGE,
            "--kv-page-size: must be >= 1: 0",
        ),
        (
            ["--backend", "toy", "--max-num-seqs", "0"],
            EXIT_USAGE,
            "--max-num-seqs: must be >= 1: 0",
        ),
        (
            ["--backend", "toy", "--backend-option", "device=npu"],
            EXIT_FAILED,
            "backend 'toy' could not be created: RuntimeError: no such device: npu",
        ),
        (
            ["--backend", "toy", "--backend-option", "fail=true"],
            EXIT_FAILED,
            "backend 'toy' failed on dispatch 1 of 3 (request 1 tokens 0:8): RuntimeError: "
            "device lost",
        ),
    ],
)
def test_run_bad_input_exits_with_one_line(
    capsys: pytest.CaptureFixture[str], argv: list[str], status: int, message: str
) -> None:
    code, out, err = run(capsys, "run", *argv, "--lengths", "8x3", "--max-num-batched-tokens", "8")
    assert (code, out) == (status, "")
    assert err.count("\n") == 1
    assert message in err


@pytest.mark.usefixtures("toy_entry_points")
def test_run_refuses_more_tokens_than_it_draws_ids_for(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(
        capsys,
        "run",
        "--backend",
        "toy",
        "--lengths",
        "2000000x51",
        "--max-num-batched-tokens",
        "100000",
    )
    assert (code, out) == (EXIT_USAGE, "")
    assert err == (
        "pypto-sched: error: --lengths: run draws token ids for at most 100,000,000 tokens: "
        "102,000,000\n"
    )


def test_run_refuses_a_prompt_longer_than_the_model_as_generate_does(
    capsys: pytest.CaptureFixture[str],
) -> None:
    pytest.importorskip("pypto_sched_reference")
    code, out, err = run(
        capsys, "run", "--backend", "reference", "--backend-option", "max_position_embeddings=16",
        "--lengths", "40", "--max-num-batched-tokens", "64", "--verify",
    )  # fmt: skip
    assert (code, out) == (EXIT_USAGE, "")
    assert err.count("\n") == 1
    assert (
        "--lengths: request 0: a prompt of 40 tokens runs 40 positions, more than the model's 16 "
        "(max_position_embeddings)" in err
    )


def test_run_takes_seed_with_a_lengths_list_for_its_token_ids(
    capsys: pytest.CaptureFixture[str],
) -> None:
    pytest.importorskip("pypto_sched_reference")
    argv = ["run", "--backend", "reference", "--lengths", "5,9", "--max-num-batched-tokens", "8"]
    seeded = [run_json(capsys, *argv, "--seed", str(seed))["greedy_token_ids"] for seed in (0, 3)]
    assert run_json(capsys, *argv)["greedy_token_ids"] == seeded[0]
    assert seeded[0] != seeded[1]


def test_the_summary_counts_one_request_and_one_token_in_the_singular(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from pypto_sched.core._validate import check_positions

    status, out, _ = run(capsys, "run", "--backend", "reference", "--lengths", "1",
                         "--max-num-batched-tokens", "8")  # fmt: skip
    assert status == EXIT_OK
    assert out.startswith("1 request, 1 token on backend 'reference'")
    with pytest.raises(pypto_sched.InvalidInputError, match="of 1 token and 1 new token runs 1"):
        check_positions("prompts[0]", 1, 0, max_new_tokens=1)


@pytest.mark.usefixtures("toy_entry_points")
def test_run_takes_page_size_as_its_chunk_alignment_and_kv_page_default(
    capsys: pytest.CaptureFixture[str],
) -> None:
    base = ["run", "--backend", "toy", "--lengths", "13,6", "--max-num-batched-tokens", "8"]
    base += ["--format", "json"]
    status, expected, err = run(capsys, *base, "--chunk-alignment", "4")
    assert (status, err) == (EXIT_OK, "")
    status, out, err = run(capsys, *base, "--page-size", "4")
    assert (status, err) == (
        EXIT_OK,
        "pypto-sched: warning: --page-size is deprecated: use --chunk-alignment\n",
    )
    drop = ("seconds", "tokens_per_second")  # timings
    mine, theirs = json.loads(out), json.loads(expected)
    assert {k: v for k, v in mine.items() if k not in drop} == {
        k: v for k, v in theirs.items() if k not in drop
    }
    assert mine["config"]["chunk_alignment"] == 4
