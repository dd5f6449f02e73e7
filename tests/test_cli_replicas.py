"""``--replicas``: ``plan`` shows the partition of ``partition_requests`` without Ray;
``run`` gives the greedy tokens of a one-device run on two Ray actors; bad combinations are
usage errors."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pypto_sched import PlannerConfig, partition_requests, plan_prefill
from pypto_sched.cli import EXIT_FAILED, EXIT_OK, EXIT_USAGE, main

LONG_TAILED = [
    "--workload",
    "lognormal",
    "--num-requests",
    "40",
    "--max-num-batched-tokens",
    "2048",
]
RUN = ["run", "--backend", "reference", "--lengths", "300x4,50,700,9",
       "--max-num-batched-tokens", "512", "--policy", "packed"]  # fmt: skip

GENERATE = ["generate", "--backend", "reference", "--prompts", "-", "--max-new-tokens", "1",
            "--max-num-batched-tokens", "8"]  # fmt: skip


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    status = main([*argv, "--format", "json"])
    out, err = capsys.readouterr()
    assert (status, err) == (EXIT_OK, "")
    return json.loads(out)


def test_plan_replicas_shows_partition_requests_and_each_parts_dispatches(
    capsys: pytest.CaptureFixture[str],
) -> None:
    data = run_json(capsys, "plan", *LONG_TAILED, "--replicas", "3")
    lengths = np.array(data["prompt_lengths"])
    partition = partition_requests(lengths, 3)
    shown = data["partition"]
    assert [r["requests"] for r in shown["replicas"]] == [p.tolist() for p in partition.parts]
    assert [r["tokens"] for r in shown["replicas"]] == partition.loads.tolist()
    assert (shown["makespan"], shown["lower_bound"]) == (
        partition.makespan,
        partition.lower_bound,
    )
    config = PlannerConfig(max_num_batched_tokens=2048)
    assert [r["dispatches"] for r in shown["replicas"]] == [
        plan_prefill(lengths[p], config).num_dispatches for p in partition.parts
    ]


def test_plan_replicas_text_names_the_balance(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", *LONG_TAILED, "--replicas", "4"]) == EXIT_OK
    out = capsys.readouterr().out
    assert "4 replicas, longest first by tokens: makespan" in out
    assert out.count("\n") > 4


def test_plan_replicas_text_shows_the_first_16_replicas_and_says_how_many_more(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["plan", *LONG_TAILED, "--replicas", "100000"]) == EXIT_OK
    out = capsys.readouterr().out
    assert out.endswith("... and 99,984 more (see --format json)\n")
    assert out.count("\n") < 60
    assert main(["plan", *LONG_TAILED, "--replicas", "16"]) == EXIT_OK
    assert "more (see --format json)" not in capsys.readouterr().out.splitlines()[-1]


def test_plan_without_replicas_has_no_partition(capsys: pytest.CaptureFixture[str]) -> None:
    assert "partition" not in run_json(capsys, "plan", *LONG_TAILED)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["plan", *LONG_TAILED, "--replicas", "0"], "--replicas: must be >= 1: 0"),
        (
            ["plan", *LONG_TAILED, "--replicas", "10000001"],
            "--replicas: must be <= 100000: 10000001",
        ),
        ([*RUN, "--replicas", "100001"], "--replicas: must be <= 100000: 100001"),
        ([*GENERATE, "--replicas", "100001"], "--replicas: must be <= 100000: 100001"),
        ([*RUN, "--replicas", "2", "--verify"], "--verify runs on one device"),
        ([*RUN, "--ray-address", "auto"], "--ray-address: only with --replicas"),
        ([*RUN, "--replica-resource", "NPU=1"], "--replica-resource: only with --replicas"),
        ([*RUN, "--replicas", "2", "--replica-resource", "NPU"], "must be NAME=AMOUNT"),
        ([*RUN, "--replicas", "2", "--replica-resource", "NPU=-1"], "AMOUNT >= 0: 'NPU=-1'"),
    ],
)
def test_bad_replica_options_are_usage_errors(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    assert main(argv) == EXIT_USAGE
    err = capsys.readouterr().err
    assert message in err
    assert err.count("\n") == 1


needs_ray = pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="needs ray")


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    """One local Ray instance the commands join (each would otherwise start its own: seconds
    each; ``docs/scaling-out.md`` runs the command that does)."""
    from pypto_sched.integrations.ray import ray_session

    with ray_session(num_cpus=2, include_dashboard=False, log_to_driver=False):
        yield


@pytest.mark.slow
@needs_ray
def test_run_on_two_replicas_gives_the_one_device_greedy_tokens(
    capsys: pytest.CaptureFixture[str], cluster: None
) -> None:
    one = run_json(capsys, *RUN)
    assert main([*RUN, "--replicas", "2", "--progress", "--format", "json"]) == EXIT_OK
    out, err = capsys.readouterr()
    two = json.loads(out)
    assert "7/7 requests, 1,959/1,959 tokens, 2 replicas (spread 0%)" in err  # the last update
    assert two["greedy_token_ids"] == one["greedy_token_ids"]
    assert two["replicas"]["num_replicas"] == 2
    assert sum(two["replicas"]["tokens"]) == one["num_tokens"]
    assert all(two["replicas"]["num_dispatches"])


@pytest.mark.slow
@needs_ray
def test_generate_on_two_replicas_writes_the_one_process_lines(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, cluster: None
) -> None:
    rng = np.random.default_rng(5)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        "".join(
            json.dumps({"token_ids": rng.integers(0, 64, size=n).tolist()}) + "\n"
            for n in (5, 40, 300, 17, 90, 3, 64)
        )
    )
    argv = ["generate", "--backend", "reference", "--prompts", str(prompts),
            "--max-new-tokens", "6", "--max-num-batched-tokens", "64", "--temperature", "0.8",
            "--sampling-seed", "3"]  # fmt: skip
    assert main(argv) == EXIT_OK
    one = capsys.readouterr().out
    assert main([*argv, "--replicas", "2"]) == EXIT_OK
    two, err = capsys.readouterr()
    assert two == one
    assert "replicas: 2 (tokens" in err


@pytest.mark.slow
@needs_ray
def test_lines_with_their_own_sampling_on_two_replicas_write_the_one_process_lines(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, cluster: None
) -> None:
    rng = np.random.default_rng(6)
    own: list[tuple[int, dict[str, Any]]] = [
        (5, {"temperature": 0.9, "seed": 4}),
        (40, {}),
        (300, {"max_tokens": 3, "top_k": 5, "temperature": 1.2}),
        (17, {"ignore_eos": True, "stop_token_ids": [7]}),
        (90, {"top_p": 0.5, "temperature": 0.7}),
    ]
    lines = [{"token_ids": rng.integers(0, 64, size=n).tolist(), **keys} for n, keys in own]
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(line) + "\n" for line in lines))
    argv = ["generate", "--backend", "reference", "--prompts", str(prompts),
            "--max-new-tokens", "6", "--max-num-batched-tokens", "64",
            "--sampling-seed", "3"]  # fmt: skip
    assert main(argv) == EXIT_OK
    one = capsys.readouterr().out
    assert main([*argv, "--replicas", "2"]) == EXIT_OK
    two, _ = capsys.readouterr()
    assert two == one
    stop = tmp_path / "stop.jsonl"
    stop.write_text(json.dumps({"token_ids": [1, 2, 3], "stop": ["x"]}) + "\n")
    assert main([*argv[:3], "--prompts", str(stop), "--replicas", "2"]) != EXIT_OK
    assert "--replicas: lines with stop strings need one process" in capsys.readouterr().err


@pytest.mark.slow
@needs_ray
def test_replicas_the_cluster_cannot_hold_are_one_line_at_once(
    capsys: pytest.CaptureFixture[str], cluster: None
) -> None:
    assert main([*RUN, "--replicas", "1", "--replica-resource", "NPU=1"]) == EXIT_FAILED
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "asking {'NPU': 1.0} each do not fit the Ray cluster: its nodes have room for 0" in err


@pytest.mark.slow
@needs_ray
@pytest.mark.skipif(importlib.util.find_spec("pypto_sched_npu") is None, reason="needs npu")
def test_the_npu_backend_on_replicas_runs_on_the_cpu_of_a_cluster_without_npus(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, cluster: None
) -> None:
    """It asked Ray for an NPU per actor and failed ("room for 0"), though the backend runs
    on the CPU here; asked for explicitly, the error says what to do."""
    from pypto_sched_reference import TINY_MODEL, Weights, save_checkpoint

    save_checkpoint(Weights.random(TINY_MODEL, seed=0), tmp_path / "model")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"token_ids": [1] * n}) + "\n" for n in (5, 9, 3)))
    argv = ["generate", "--backend", "npu", "--backend-option", f"checkpoint={tmp_path}/model",
            "--prompts", str(prompts), "--max-new-tokens", "2",
            "--max-num-batched-tokens", "16"]  # fmt: skip
    assert main(argv) == EXIT_OK
    one = capsys.readouterr().out
    assert main([*argv, "--replicas", "1"]) == EXIT_OK
    assert capsys.readouterr().out == one
    assert main([*argv, "--replicas", "1", "--replica-resource", "NPU=1"]) == EXIT_FAILED
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "room for 0" in err
    assert "it has no 'NPU' at all: ask each replica for what it has" in err


@pytest.mark.slow
@needs_ray
def test_generate_on_replicas_names_a_request_the_pool_cannot_hold_as_one_device_does(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, cluster: None
) -> None:
    prompts = tmp_path / "prompts.jsonl"
    lengths = (300, 5, 1, 77, 120, 40, 40, 600, 2, 90)
    prompts.write_text("".join(json.dumps({"token_ids": [1] * n}) + "\n" for n in lengths))
    argv = ["generate", "--backend", "reference", "--prompts", str(prompts),
            "--max-new-tokens", "6", "--max-num-batched-tokens", "64", "--kv-page-size", "16",
            "--num-kv-pages", "30"]  # fmt: skip
    assert main(argv) == EXIT_USAGE
    one = capsys.readouterr().err
    assert "--num-kv-pages: must hold every request alone: request 7 needs 605 tokens" in one
    assert main([*argv, "--replicas", "2"]) == EXIT_USAGE
    assert capsys.readouterr().err == one
