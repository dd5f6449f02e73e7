"""pypto_sched.integrations.ray on a local Ray instance: two replicas of the reference backend
give exactly the one-process output for prefill and generation, also when an actor is killed
mid-run; a backend's ExecutionError is raised once, never retried; missing resources are a
one-line error at once.

One local Ray instance (two CPUs) serves the whole module; it costs seconds to start.
"""

from __future__ import annotations

import math
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pypto_sched import (
    ExecutionError,
    GenerationResult,
    InvalidConfigError,
    InvalidInputError,
    PlannerConfig,
    SamplingParams,
    execute_schedule,
    generate,
    load_backend,
    partition_requests,
    plan_prefill,
)

ray = pytest.importorskip("ray", reason="the Ray executor needs the ray extra")

from pypto_sched.integrations.ray import (  # noqa: E402  (after the skip)
    BatchProgress,
    RayReplicas,
    ReplicaError,
    default_resources,
    ray_session,
)

pytestmark = pytest.mark.slow

VOCAB_SIZE = 64  # the reference backend's tiny random model
#: Half a CPU per actor: the shared pair leaves one of the instance's two CPUs for the pools
#: single tests start.
HALF_CPU = {"CPU": 0.5}
LENGTHS = [5, 40, 17, 90, 3, 64, 33, 12, 1, 27]
CONFIGS = {
    "round_robin": PlannerConfig(max_num_batched_tokens=64, long_prefill_token_threshold=16),
    "packed": PlannerConfig(max_num_batched_tokens=48, policy="packed", max_num_seqs=4),
}


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    with ray_session(num_cpus=2, include_dashboard=False, log_to_driver=False):
        yield


@pytest.fixture(scope="module")
def replicas(cluster: None) -> Iterator[RayReplicas]:
    with RayReplicas(
        "reference", num_replicas=2, resources=HALF_CPU, poll_seconds=0.02, start_timeout=60
    ) as pool:
        yield pool


@pytest.fixture(scope="module")
def prompts() -> list[np.ndarray]:
    rng = np.random.default_rng(3)
    return [rng.integers(0, VOCAB_SIZE, size=n) for n in LENGTHS]


def one_process_prefill(prompts: list[np.ndarray], config: PlannerConfig) -> Any:
    backend = load_backend("reference")
    schedule = plan_prefill([len(p) for p in prompts], config)
    return execute_schedule(schedule, backend, prompts, return_greedy=True)


def one_process_generate(prompts: list[np.ndarray], **options: Any) -> GenerationResult:
    return generate(load_backend("reference"), prompts, **options)


def assert_same_sequences(got: Any, want: GenerationResult) -> None:
    assert len(got.sequences) == len(want.sequences)
    for r, (a, b) in enumerate(zip(got.sequences, want.sequences, strict=True)):
        assert a.token_ids.tolist() == b.token_ids.tolist(), f"request {r}"
        assert a.finish_reason == b.finish_reason, f"request {r}"


@pytest.mark.parametrize("policy", list(CONFIGS))
def test_prefill_on_two_replicas_gives_the_one_process_tokens_and_logits(
    replicas: RayReplicas, prompts: list[np.ndarray], policy: str
) -> None:
    want = one_process_prefill(prompts, CONFIGS[policy])
    got = replicas.prefill(prompts, config=CONFIGS[policy], return_logits=True)
    np.testing.assert_array_equal(got.greedy_token_ids, want.greedy_token_ids)
    assert got.logits is not None
    # Rows batched differently round differently in the last bits (float64), within the
    # backend's tolerance; the tokens are exactly equal.
    tolerance = load_backend("reference").tolerance
    np.testing.assert_allclose(got.logits, want.logits, rtol=0, atol=tolerance)
    assert all(got.num_dispatches)  # both replicas worked
    assert got.num_restarts == 0


def test_prefill_returns_logits_only_when_asked(
    replicas: RayReplicas, prompts: list[np.ndarray]
) -> None:
    got = replicas.prefill(prompts, config=CONFIGS["packed"])
    assert got.logits is None
    assert got.greedy_token_ids.shape == (len(prompts),)


@settings(max_examples=6)
@given(st.lists(st.integers(min_value=1, max_value=80), min_size=1, max_size=7))
def test_prefill_of_any_batch_equals_one_process(replicas: RayReplicas, lengths: list[int]) -> None:
    rng = np.random.default_rng(len(lengths))
    batch = [rng.integers(0, VOCAB_SIZE, size=n) for n in lengths]
    want = one_process_prefill(batch, CONFIGS["round_robin"])
    got = replicas.prefill(batch, config=CONFIGS["round_robin"])
    np.testing.assert_array_equal(got.greedy_token_ids, want.greedy_token_ids)


@pytest.mark.parametrize(
    "options",
    [
        {"config": CONFIGS["round_robin"], "max_new_tokens": 8},
        {"config": CONFIGS["packed"], "max_new_tokens": [3, 9, 1, 6, 8, 2, 5, 7, 4, 6],
         "sampling": SamplingParams(temperature=0.9, top_k=20, seed=11)},
        {"config": CONFIGS["packed"], "max_new_tokens": 6, "kv_page_size": 4,
         "num_kv_pages": 30, "stop_token_ids": [5],
         "sampling": SamplingParams(temperature=1.3, seed=2)},
        {"config": CONFIGS["packed"], "max_new_tokens": 5,
         "sampling": [SamplingParams(temperature=0.7, seed=s) for s in range(10)]},
        {"config": CONFIGS["round_robin"],
         "sampling": [SamplingParams(max_tokens=1 + s % 4) for s in range(10)]},
    ],
    ids=[
        "greedy", "sampled", "small pool, stop token", "one sampling a request",
        "max_tokens a request, no max_new_tokens",
    ],
)  # fmt: skip
def test_generate_on_two_replicas_equals_one_process(
    replicas: RayReplicas, prompts: list[np.ndarray], options: dict[str, Any]
) -> None:
    want = one_process_generate(prompts, **options)
    got = replicas.generate(prompts, **options)
    assert_same_sequences(got, want)
    assert all(stats is not None for stats in got.stats)


def test_a_small_pool_preempts_on_the_replicas_and_still_equals_one_process(
    replicas: RayReplicas, prompts: list[np.ndarray]
) -> None:
    options: dict[str, Any] = {
        "config": CONFIGS["round_robin"], "max_new_tokens": 10, "kv_page_size": 4,
        "num_kv_pages": 26,
    }  # fmt: skip
    got = replicas.generate(prompts, **options)
    assert sum(s.num_preemptions for s in got.stats if s is not None) > 0
    assert_same_sequences(got, one_process_generate(prompts, **options))


def test_progress_covers_every_request_and_token_once(
    replicas: RayReplicas, prompts: list[np.ndarray]
) -> None:
    seen: list[BatchProgress] = []
    replicas.generate(prompts, config=CONFIGS["packed"], max_new_tokens=40, on_progress=seen.append)
    last = seen[-1]
    assert last.num_requests == last.num_requests_done == len(prompts)
    assert last.num_tokens == last.num_tokens_done == 40 * len(prompts)
    assert last.spread == 0.0
    assert len(last.replicas) == 2
    done = [p.num_tokens_done for p in seen]
    assert done == sorted(done)


def test_an_actor_killed_mid_run_is_replaced_and_the_output_is_unchanged(
    replicas: RayReplicas, prompts: list[np.ndarray]
) -> None:
    options: dict[str, Any] = {"config": CONFIGS["round_robin"], "max_new_tokens": 150}
    want = one_process_generate(prompts, **options)
    killed: list[BatchProgress] = []

    def kill_replica_0_once(progress: BatchProgress) -> None:
        first = progress.replicas[0]
        if not killed and 0 < first.num_tokens_done < first.num_tokens:
            killed.append(progress)
            ray.kill(replicas.actors[0])

    got = replicas.generate(prompts, on_progress=kill_replica_0_once, **options)
    assert killed, "the run ended before replica 0 reported progress"
    assert got.num_restarts == 1
    assert_same_sequences(got, want)


def test_a_dead_actor_before_the_run_is_replaced(
    replicas: RayReplicas, prompts: list[np.ndarray]
) -> None:
    ray.kill(replicas.actors[1])
    got = replicas.prefill(prompts, config=CONFIGS["packed"])
    assert got.num_restarts == 1
    np.testing.assert_array_equal(
        got.greedy_token_ids, one_process_prefill(prompts, CONFIGS["packed"]).greedy_token_ids
    )


def test_losing_an_actor_more_than_max_restarts_times_is_a_replica_error(
    cluster: None, prompts: list[np.ndarray]
) -> None:
    with RayReplicas(
        "reference", num_replicas=1, max_restarts=0, resources=HALF_CPU, start_timeout=60
    ) as pool:
        ray.kill(pool.actors[0])
        with pytest.raises(ReplicaError, match=r"replica 0 lost its actor 1 times"):
            pool.prefill(prompts, config=CONFIGS["packed"])
        # The failed job left a live actor in its place: the next job runs, restarting none.
        got = pool.prefill(prompts, config=CONFIGS["packed"])
        assert got.num_restarts == 0


def test_an_execution_error_is_raised_once_not_retried(
    cluster: None, prompts: list[np.ndarray], tmp_path: Path
) -> None:
    log = tmp_path / "attempts"

    def failing_backend(**options: Any) -> Any:
        class Failing:  # the reference backend, whose device faults on every dispatch
            name = "failing"

            def __init__(self) -> None:
                self.inner = load_backend("reference")
                self.tolerance = self.inner.tolerance
                self.vocab_size = self.inner.vocab_size
                self.hidden_size = self.inner.hidden_size

            def new_cache(self, *, num_pages: int, page_size: int) -> Any:
                return self.inner.new_cache(num_pages=num_pages, page_size=page_size)

            def embed(self, token_ids: Any) -> Any:
                return self.inner.embed(token_ids)

            def run_dispatch(self, batch: Any, cache: Any) -> Any:
                with log.open("a") as file:
                    file.write("attempt\n")
                raise RuntimeError("device fault")

        return Failing()

    with (
        RayReplicas(
            failing_backend, num_replicas=1, max_restarts=3, resources=HALF_CPU, start_timeout=60
        ) as pool,
        pytest.raises(ExecutionError, match="device fault") as error,
    ):
        pool.prefill(prompts, config=CONFIGS["packed"])
    assert error.value.dispatch == 0
    assert repr(error.value.__cause__) == "RuntimeError('device fault')"  # as on one device
    assert log.read_text().splitlines() == ["attempt"]


def test_a_backend_error_names_the_request_by_its_index_in_the_batch_in_prefill_and_generate(
    cluster: None,
) -> None:
    """As one device names it, never by its place in a replica's part (before, prefill named
    request 1, a healthy prompt, for the batch's request 2)."""
    poison = 7

    def poisoned_backend(**options: Any) -> Any:
        inner = load_backend("reference")

        class Poisoned:  # the reference backend, failing on any dispatch holding token 7
            name = "poisoned"
            tolerance = inner.tolerance
            relative_tolerance = 0.125  # read by the driver (--verify's near-ties)
            vocab_size = inner.vocab_size
            hidden_size = inner.hidden_size

            def new_cache(self, *, num_pages: int, page_size: int) -> Any:
                return inner.new_cache(num_pages=num_pages, page_size=page_size)

            def embed(self, token_ids: Any) -> Any:
                return inner.embed(token_ids)

            def run_dispatch(self, batch: Any, cache: Any) -> Any:
                if poison in np.asarray(batch.token_ids).tolist():
                    raise RuntimeError("token 7 is poison")
                return inner.run_dispatch(batch, cache)

        return Poisoned()

    prompts = [np.array([1, 2, 3, 4]), np.array([5, 6, 8, 9, 10, 11]), np.array([12, 13, poison])]
    config = PlannerConfig(max_num_batched_tokens=4, policy="packed")
    # Request 2 is not at place 2 of its part: a name by place would be another request.
    parts = [part.tolist() for part in partition_requests([4, 6, 3], 2).parts]
    assert all(part.index(2) != 2 for part in parts if 2 in part)
    with RayReplicas(
        poisoned_backend, num_replicas=2, resources=HALF_CPU, start_timeout=60
    ) as pool:
        assert (pool.tolerance, pool.relative_tolerance) == (load_backend("reference").tolerance,
                                                             0.125)  # fmt: skip
        for run in (
            lambda: pool.prefill(prompts, config=config),
            lambda: pool.generate(prompts, config=config, max_new_tokens=2),
        ):
            with pytest.raises(ExecutionError, match=r"request 2 tokens 0:3"):
                run()


def test_an_error_inside_the_actors_is_raised_as_is_and_the_replicas_still_work(
    replicas: RayReplicas, prompts: list[np.ndarray]
) -> None:
    # Two pages of 4 tokens cannot hold the 90-token prompt: generate() refuses it.
    with pytest.raises(InvalidConfigError, match="'num_kv_pages' must hold every request alone"):
        replicas.generate(
            prompts, config=CONFIGS["packed"], max_new_tokens=4, kv_page_size=4, num_kv_pages=2
        )
    got = replicas.prefill(prompts, config=CONFIGS["packed"])
    want = one_process_prefill(prompts, CONFIGS["packed"])
    np.testing.assert_array_equal(got.greedy_token_ids, want.greedy_token_ids)


def test_the_replicas_take_the_kv_pools_retired_names_as_generate_does(
    replicas: RayReplicas, prompts: list[np.ndarray]
) -> None:
    options: dict[str, Any] = {"config": CONFIGS["packed"], "max_new_tokens": 3}
    want = replicas.generate(prompts, **options, kv_page_size=4, num_kv_pages=30)
    with pytest.warns(DeprecationWarning, match="RayReplicas.generate's") as warned:
        got = replicas.generate(prompts, **options, page_size=4, num_pages=30)
    assert sorted(str(w.message) for w in warned) == [
        "RayReplicas.generate's 'num_pages' is deprecated: use 'num_kv_pages'",
        "RayReplicas.generate's 'page_size' is deprecated: use 'kv_page_size'",
    ]
    assert {w.filename for w in warned} == {__file__}  # the caller's line, which filters show
    assert [s.token_ids.tolist() for s in got.sequences] == [
        s.token_ids.tolist() for s in want.sequences
    ]
    with pytest.raises(InvalidInputError, match=r"^'num_pages' must not be given with 'num_kv_"):
        replicas.generate(prompts, **options, num_pages=30, num_kv_pages=30)


def test_a_request_the_pool_cannot_hold_is_named_by_its_index_in_the_batch(
    replicas: RayReplicas, prompts: list[np.ndarray]
) -> None:
    # Pages of 4: request 3 (90 tokens and 4 new) needs 24 pages; every other fits in 20.
    # It is first in its replica's part, so a replica would call it request 0.
    kwargs: dict[str, Any] = {"max_new_tokens": 4, "kv_page_size": 4, "num_kv_pages": 20}
    with pytest.raises(InvalidConfigError) as one:
        generate(load_backend("reference"), prompts, config=CONFIGS["packed"], **kwargs)
    with pytest.raises(InvalidConfigError) as two:
        replicas.generate(prompts, config=CONFIGS["packed"], **kwargs)
    assert "request 3 needs 93 tokens" in str(one.value)
    assert str(two.value) == str(one.value)


def test_a_request_beyond_the_models_positions_is_named_by_its_index_in_the_batch(
    cluster: None, prompts: list[np.ndarray]
) -> None:
    with RayReplicas(
        "reference", num_replicas=2, options={"max_position_embeddings": 50},
        resources=HALF_CPU, start_timeout=60,
    ) as pool:  # fmt: skip
        assert pool.max_position_embeddings == 50
        # Requests 3 (90 tokens) and 5 (64) are too long; 3 is named first.
        with pytest.raises(InvalidInputError, match=r"^'prompts\[3\]': a prompt of 90 tokens"):
            pool.prefill(prompts, config=CONFIGS["packed"])
        with pytest.raises(InvalidInputError, match=r"^'prompts\[3\]': a prompt of 90 tokens"):
            pool.generate(prompts, config=CONFIGS["packed"], max_new_tokens=2)
        with pytest.raises(InvalidInputError, match=r"^'request_stop_token_ids\[7\]'"):
            pool.generate(
                prompts[:3] * 3 + prompts[:1], config=CONFIGS["packed"], max_new_tokens=2,
                request_stop_token_ids=[[]] * 7 + [[-1]] + [[]] * 2,
            )  # fmt: skip


def test_a_backend_that_cannot_be_built_is_its_own_error_at_once(cluster: None) -> None:
    from pypto_sched_reference import InvalidModelError

    with pytest.raises(InvalidInputError, match=r"^unknown options \['no_such_option'\]"):
        RayReplicas("reference", num_replicas=1, options={"no_such_option": 1}, resources=HALF_CPU)
    with pytest.raises(InvalidModelError, match="drop the options"):
        RayReplicas("reference", num_replicas=1, options={"checkpoint": ".", "seed": 1},
                    resources=HALF_CPU)  # fmt: skip


def _cpus_free_again(cpus: float) -> bool:
    """Whether the instance's free CPUs come back to ``cpus`` within a few seconds (Ray
    reports a killed actor's resources freed a moment later)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if ray.available_resources().get("CPU", 0.0) == cpus:
            return True
        time.sleep(0.1)
    return False


def test_an_actor_that_dies_while_starting_is_a_replica_error_and_none_is_left(
    cluster: None, tmp_path: Path
) -> None:
    """A process lost while it builds the backend (out of memory loading weights, say): one
    line, and the healthy replicas started beside it are stopped, not leaked."""
    cpus = ray.available_resources().get("CPU", 0.0)
    flag = tmp_path / "died"

    def dies_once(**options: Any) -> Any:
        import os

        try:
            os.close(os.open(flag, os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            pass  # the other replica: it is built, and alive when the first dies
        else:
            os._exit(1)
        time.sleep(0.5)
        return load_backend("reference", **options)

    with pytest.raises(ReplicaError, match="died while it started") as error:
        RayReplicas(dies_once, num_replicas=2, resources=HALF_CPU, start_timeout=60)
    assert "\n" not in str(error.value)
    assert _cpus_free_again(cpus)


def test_an_option_that_does_not_pickle_is_refused_before_any_actor_starts(
    cluster: None,
) -> None:
    import threading

    with pytest.raises(InvalidInputError, match=r"^option 'lock' cannot be sent to the Ray"):
        RayReplicas("reference", num_replicas=1, options={"lock": threading.Lock()})


def test_resources_may_ask_for_memory_not_for_what_ray_reserves(cluster: None) -> None:
    with RayReplicas(
        "reference", num_replicas=1, resources={**HALF_CPU, "memory": 2**20}, start_timeout=60
    ) as pool:
        assert pool.prefill([[1, 2, 3]], config=CONFIGS["packed"]).greedy_token_ids.shape == (1,)
    for name in ("object_store_memory", "bundle"):
        with pytest.raises(InvalidInputError, match=f"cannot ask for '{name}'"):
            RayReplicas("reference", num_replicas=1, resources={**HALF_CPU, name: 1})


def test_a_session_refuses_bad_options_and_an_address_nobody_listens_on_at_once() -> None:
    """In a process of its own: the module's instance is connected, and a session then takes
    no address. Port 1 refuses connections (ray.init waited minutes on it)."""
    code = """if True:
        import time
        from pypto_sched import InvalidInputError
        from pypto_sched.integrations.ray import ReplicaError, ray_session
        started = time.monotonic()
        try:
            with ray_session("127.0.0.1:1"):
                pass
        except ReplicaError as error:
            print("address:", time.monotonic() - started < 30, error)
        for options in ({"num_cpus": "x"}, {"bogus_option": 1}):
            try:
                with ray_session(**options):
                    pass
            except InvalidInputError as error:
                print("options:", error)
    """
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    lines = out.stdout.splitlines()
    assert len(lines) == 3, out.stdout + out.stderr
    assert lines[0].startswith("address: True could not join the Ray cluster at '127.0.0.1:1'")
    assert lines[1].startswith("options: 'init_options' were refused by ray.init")
    assert lines[2].startswith("options: 'init_options'")
    assert "bogus_option" in lines[2]


@pytest.mark.parametrize(
    ("resources", "num_replicas"), [({"NPU": 1}, 1), ({"CPU": 1}, 3), ({"GPU": 1}, 1)]
)
def test_missing_resources_are_a_one_line_error_at_once(
    cluster: None, resources: dict[str, float], num_replicas: int
) -> None:
    started = time.perf_counter()
    with pytest.raises(ReplicaError, match="do not fit the Ray cluster") as error:
        RayReplicas("reference", num_replicas=num_replicas, resources=resources)
    assert time.perf_counter() - started < 5
    assert "\n" not in str(error.value)
    assert str(error.value).startswith(f"{num_replicas} replicas asking")  # as --replicas says
    assert str(next(iter(resources))) in str(error.value)


def test_total_stats_add_up_the_replicas(replicas: RayReplicas, prompts: list[np.ndarray]) -> None:
    got = replicas.generate(prompts, config=CONFIGS["packed"], max_new_tokens=5)
    parts = [s for s in got.stats if s is not None]
    total = got.total_stats
    assert total.num_generated_tokens == 5 * len(prompts)
    assert total.num_prompt_tokens == sum(LENGTHS)
    assert total.num_dispatches == sum(s.num_dispatches for s in parts)
    first = [s.first_token_dispatch + 1 for s in got.sequences]
    assert total.mean_time_to_first_token == pytest.approx(np.mean(first))
    assert total.max_time_to_first_token == max(first)


def test_a_session_inside_a_running_one_uses_it_and_refuses_another_address(
    cluster: None,
) -> None:
    with ray_session():
        assert ray.is_initialized()
    assert ray.is_initialized()  # not stopped: this session did not start it
    with pytest.raises(InvalidInputError, match="'address' must be None"), ray_session("auto"):
        pass


def test_the_npu_backend_asks_for_an_npu_and_the_others_for_a_cpu() -> None:
    assert default_resources("npu") == {"NPU": 1.0}
    assert default_resources("reference") == {"CPU": 1.0}
    assert default_resources(load_backend) == {"CPU": 1.0}


def test_the_npu_backend_asks_for_a_cpu_where_it_runs_on_the_cpu() -> None:
    """On a cluster without NPUs it asked for one per actor and failed ("room for 0"),
    though the backend itself runs on the CPU there."""
    no_npu = {"CPU": 2.0, "memory": 1e9}
    npus = {"CPU": 16.0, "NPU": 8.0}
    assert default_resources("npu", cluster=no_npu) == {"CPU": 1.0}
    assert default_resources("npu", cluster=npus) == {"NPU": 1.0}
    assert default_resources("npu", {"device": "cpu"}, cluster=npus) == {"CPU": 1.0}
    assert default_resources("npu", {"device": "npu"}, cluster=no_npu) == {"NPU": 1.0}
    assert default_resources("reference", cluster=npus) == {"CPU": 1.0}


def test_importing_pypto_sched_does_not_import_ray() -> None:
    code = "import sys, pypto_sched, pypto_sched.integrations; print('ray' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"start_timeout": "300"}, "'start_timeout' must be a number of seconds > 0: '300' (str)"),
        (
            {"start_timeout": math.nan},
            "'start_timeout' must be a finite number of seconds > 0: nan",
        ),
        ({"start_timeout": -1}, "'start_timeout' must be a finite number of seconds > 0: -1"),
        ({"poll_seconds": 0.0}, "'poll_seconds' must be a finite number of seconds > 0: 0.0"),
        ({"poll_seconds": math.inf}, "'poll_seconds' must be a finite number of seconds > 0: inf"),
        ({"poll_seconds": True}, "'poll_seconds' must be a number of seconds > 0: True (bool)"),
        ({"poll_seconds": 10**400}, "'poll_seconds' must be a finite number of seconds > 0: 1"),
        ({"options": [("seed", 1)]}, "'options' must be a mapping or None: [('seed', 1)] (list)"),
        ({"resources": "CPU=1"}, "'resources' must be a mapping or None: 'CPU=1' (str)"),
        ({"backend": 7}, "'backend' must be a backend's name or a factory: 7 (int)"),
    ],
)
def test_replicas_refuse_bad_arguments_at_construction_before_ray_is_asked(
    arguments: dict[str, Any], message: str
) -> None:
    """They took strings, NaN and negatives, and failed later with bare ValueErrors."""
    arguments = {"backend": "reference", "num_replicas": 1, **arguments}
    with pytest.raises(InvalidInputError) as error:
        RayReplicas(**arguments)
    assert str(error.value).startswith(message)


def test_a_session_refuses_an_address_that_is_not_a_string() -> None:
    message = r"^'address' must be a string or None: 6379 \(int"
    with pytest.raises(InvalidInputError, match=message), ray_session(6379):  # type: ignore[arg-type]
        pass


def test_a_session_started_here_gives_back_the_callers_sigterm_handler() -> None:
    """ray.init puts in a SIGTERM handler that prints a stack and exits with status 1; the
    CLI's own (which ends a run as Ctrl-C does, status 143) must survive it, and a caller
    without one keeps Ray's."""
    code = """if True:
        import signal
        from pypto_sched.integrations.ray import ray_session

        def mine(signum, frame):
            pass

        with ray_session():
            print("default kept Ray's:", signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL)
        signal.signal(signal.SIGTERM, mine)
        with ray_session():
            print("ours given back:", signal.getsignal(signal.SIGTERM) is mine)
    """
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300
    )
    assert out.stdout.splitlines() == ["default kept Ray's: True", "ours given back: True"], (
        out.stdout + out.stderr
    )
