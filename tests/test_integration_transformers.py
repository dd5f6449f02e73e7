"""pypto_sched as the scheduler of transformers' continuous batching, on tiny random Qwen3s.

The oracle is transformers itself: greedy ``generate()`` on each prompt alone, and the
server's own ``"fifo"`` scheduler. The batches the server runs are recorded through the
scheduler's ``on_batch`` hook and checked against the planner config with plain loops.
"""

from __future__ import annotations

import copy
import logging
import subprocess
import sys
import threading
import types
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="the transformers integration runs models on torch")
pytest.importorskip("transformers", reason="the transformers integration needs transformers")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM  # noqa: E402
from transformers.generation.configuration_utils import ContinuousBatchingConfig  # noqa: E402
from transformers.generation.continuous_batching.scheduler import (  # noqa: E402
    SCHEDULER_MAPPING,
    FIFOScheduler,
)

from pypto_sched import (  # noqa: E402
    POLICIES,
    InvalidConfigError,
    PlannerConfig,
    PrefillState,
    decode_rows_first,
)
from pypto_sched.integrations.transformers import (  # noqa: E402
    ORDERS,
    PyptoScheduler,
    ScheduledBatch,
    ScheduledRow,
    register,
)

VOCAB = 96
PAGE = 8  # the server's cache page size in every run here

# The server logs warnings for CPU runs (no psutil, no eos token) that say nothing here.
logging.getLogger("ContinuousBatchingLogger").setLevel(logging.ERROR)


def tiny_qwen3() -> Any:
    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=256,
    )
    model: Any = Qwen3ForCausalLM(config)
    return model.eval()


@pytest.fixture(autouse=True)
def _restore_scheduler_mapping() -> Iterator[None]:
    """Each test registers what it needs; the server's registry is left as it was."""
    before = dict(SCHEDULER_MAPPING)
    yield
    SCHEDULER_MAPPING.clear()
    SCHEDULER_MAPPING.update(before)


@pytest.fixture(scope="module")
def model() -> Any:
    return tiny_qwen3()


@pytest.fixture(scope="module")
def reference() -> Any:
    """Greedy ``generate()`` on one prompt, by a second copy of the model (continuous
    batching switches its model's attention to a paged one)."""
    model = tiny_qwen3()
    cache: dict[tuple[tuple[int, ...], int], list[int]] = {}

    def generate(prompt: Sequence[int], max_new_tokens: int) -> list[int]:
        key = (tuple(prompt), max_new_tokens)
        if key not in cache:
            input_ids = torch.tensor([list(prompt)])
            with torch.no_grad():
                out = model.generate(
                    input_ids=input_ids,
                    attention_mask=torch.ones_like(input_ids),
                    max_new_tokens=max_new_tokens,
                    min_new_tokens=max_new_tokens,
                    do_sample=False,
                    pad_token_id=0,
                    eos_token_id=None,
                )
            cache[key] = out[0, input_ids.shape[1] :].tolist()
        return cache[key]

    return generate


def generation_config(max_new_tokens: int) -> GenerationConfig:
    return GenerationConfig(  # type: ignore[no-untyped-call]
        max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=-1, pad_token_id=0
    )


def run_batch(
    model: Any,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    scheduler_type: str,
    server: ContinuousBatchingConfig,
) -> list[list[int]]:
    """The tokens ``generate_batch`` returns for each prompt, in prompt order, with the
    server configured by ``server`` and the scheduler ``scheduler_type``."""
    server = copy.copy(server)  # the server fills in what is left unset
    server.scheduler_type = scheduler_type
    outputs = model.generate_batch(
        [list(p) for p in prompts],
        generation_config=generation_config(max_new_tokens),
        continuous_batching_config=server,
        progress_bar=False,
        warmup=False,
    )
    by_index = sorted(outputs.values(), key=lambda out: int(out.request_id.rsplit("_", 1)[1]))
    for out, prompt in zip(by_index, prompts, strict=True):
        assert out.error is None, out.error
        assert out.prompt_ids == list(prompt)
    return [list(out.generated_tokens) for out in by_index]


def check_batches(
    batches: Sequence[ScheduledBatch],
    config: PlannerConfig,
    *,
    max_batch_tokens: int,
    max_rows: int | None = None,
) -> None:
    """Every recorded batch obeys ``config`` within the server's limits (``max_rows``:
    the server's ``max_requests_per_batch``)."""
    cap = min(config.chunk_cap, max_batch_tokens)
    budget = min(config.max_num_batched_tokens, max_batch_tokens)
    rows = [n for n in (config.max_num_seqs, max_rows) if n is not None]
    assert batches, "the server did not run our scheduler"
    for batch in batches:
        assert batch.num_tokens <= budget, batch
        if rows:
            assert len(batch.rows) <= min(rows), batch
        ids = [row.request_id for row in batch.rows]
        assert len(ids) == len(set(ids)), batch
        # packed's work-conserving tail: a lone prefill request with nothing reserved (no
        # decode in the batch) may take the whole budget, past the threshold
        alone = config.policy == "packed" and len(batch.rows) == 1
        decoding = True
        for row in batch.rows:
            assert row.length >= 1, batch
            if not row.is_prefill:
                assert decoding, f"decode rows come first: {batch}"
                continue
            decoding = False
            assert row.length <= (budget if alone else cap), f"a chunk above the cap {cap}: {row}"
            if not row.is_final and config.chunk_alignment is not None:
                assert row.end % config.chunk_alignment == 0, (
                    f"a non-final chunk off the pages: {row}"
                )
        prefill_rows = [row for row in batch.rows if row.is_prefill]
        assert sum(row.length for row in prefill_rows) <= config.effective_budget, batch
        if batch.under_safety_margin and any(row.start == 0 for row in prefill_rows):
            # under the margin a request starts only as the one row of its batch
            assert len(batch.rows) == 1, f"a new request beside others under the margin: {batch}"
        if config.policy == "round_robin" and len(prefill_rows) > 1:
            # round_robin runs one request a dispatch, or every request whole
            assert all(row.is_final and row.start == 0 for row in prefill_rows), batch


def check_prefills(
    batches: Sequence[ScheduledBatch], prompts: Sequence[Sequence[int]], config: PlannerConfig
) -> None:
    """With a cache that holds every request at once (nothing is offloaded): each prompt's
    chunks tile it, from where the prefix cache left off to its end, the last one final;
    and ``packed`` never has more than ``max_num_partial_prefills`` prompts part-way."""
    position: dict[str, int] = {}
    done: set[str] = set()
    for batch in batches:
        for row in batch.rows:
            if not row.is_prefill:
                assert row.request_id in done, f"a decode before the prefill ended: {row}"
                continue
            assert row.request_id not in done, f"a chunk after the final one: {row}"
            assert position.setdefault(row.request_id, row.start) == row.start, row
            position[row.request_id] = row.end
            length = len(prompts[int(row.request_id.rsplit("_", 1)[1])])
            assert row.is_final == (row.end == length), row
            if row.is_final:
                done.add(row.request_id)
        partial = len(set(position) - done)
        if config.max_num_partial_prefills is not None:
            assert partial <= config.max_num_partial_prefills, batch
    assert len(done) == len(prompts), "a prompt was not prefilled"


def checked_progress(scheduler: type[PyptoScheduler], name: str = "pypto_sched") -> None:
    """Register under ``name`` a ``scheduler`` that checks, after every batch, that its
    progress mirror holds what its prefill state holds."""

    class Checked(scheduler):  # type: ignore[valid-type, misc]
        def schedule_batch(
            self, token_budget: int, cache_budget: int
        ) -> tuple[list[Any] | None, bool, int, int]:
            result: tuple[list[Any] | None, bool, int, int] = super().schedule_batch(
                token_budget, cache_budget
            )
            held = {
                request_id: (request.prompt_length, request.num_computed_tokens)
                for request_id, request in self.prefill_state.items()
            }
            assert self.progress == held
            return result

    SCHEDULER_MAPPING[name] = Checked


def live_server(model: Any, new_tokens: int) -> Any:
    """A continuous-batching server of 32-token batches run by the registered
    ``"pypto_sched"``, not started: requests may be added before and while it runs."""
    return model.init_continuous_batching(
        generation_config=generation_config(new_tokens),
        continuous_batching_config=ContinuousBatchingConfig(
            page_size=PAGE, num_blocks=64, max_batch_tokens=32, scheduler_type="pypto_sched"
        ),
    )


def collect(manager: Any, count: int) -> dict[str, Any]:
    """Start ``manager`` and return the first ``count`` results by request id, each without
    an error; the server is stopped whatever happens."""
    manager.start()
    try:
        results: dict[str, Any] = {}
        while len(results) < count:
            result = manager.get_result(timeout=30)
            assert result is not None, f"no result after {sorted(results)}"
            assert result.error is None, result.error
            results[result.request_id] = result
    finally:
        manager.stop(block=True, timeout=30)
    return results


def submit_arrivals(
    manager: Any,
    after: int,
    arrivals: dict[int, int],
    prompts: Sequence[Sequence[int]],
    ids: Sequence[str],
    new_tokens: int,
) -> None:
    """Add to ``manager`` the requests ``arrivals`` (request index -> the batch after which
    it is submitted, 0: before the server starts) submits after batch ``after``."""
    for i, batch_number in arrivals.items():
        if batch_number == after:
            manager.add_request(list(prompts[i]), request_id=ids[i], max_new_tokens=new_tokens)


def blocks_needed(prompts: Sequence[Sequence[int]], new_tokens: int) -> int:
    return sum(-(-(len(prompt) + new_tokens) // PAGE) for prompt in prompts)


def random_prompts(seed: int, lengths: Sequence[int]) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(1, VOCAB, (n,), generator=generator).tolist() for n in lengths]


# -- the package boundary --------------------------------------------------------------------


def test_importing_pypto_sched_imports_no_transformers() -> None:
    code = (
        "import sys, pypto_sched, pypto_sched.integrations\n"
        "assert 'transformers' not in sys.modules, 'transformers was imported'\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_register_offers_the_scheduler_under_its_name() -> None:
    config = PlannerConfig(max_num_batched_tokens=64)
    scheduler = register(config, name="pypto_sched_test_register")
    assert SCHEDULER_MAPPING["pypto_sched_test_register"] is scheduler
    assert issubclass(scheduler, PyptoScheduler)
    assert scheduler.planner_config is config
    assert SCHEDULER_MAPPING["fifo"] is FIFOScheduler  # the server's own are untouched


@pytest.mark.parametrize("config", [None, {"max_num_batched_tokens": 64}])
def test_register_rejects_what_is_not_a_planner_config(config: object) -> None:
    with pytest.raises(InvalidConfigError, match="'config' must be a PlannerConfig"):
        register(config)  # type: ignore[arg-type]


def test_a_config_that_does_not_fit_the_server_fails_every_request(model: Any) -> None:
    """Pages of 48 tokens cannot be cut within the server's 32 tokens a batch."""
    register(PlannerConfig(max_num_batched_tokens=64, chunk_alignment=48))
    outputs = model.generate_batch(
        [[1, 2, 3]],
        generation_config=generation_config(2),
        continuous_batching_config=ContinuousBatchingConfig(
            page_size=PAGE, num_blocks=16, max_batch_tokens=32, scheduler_type="pypto_sched"
        ),
        progress_bar=False,
        warmup=False,
    )
    (output,) = outputs.values()
    assert output.error is not None
    assert "does not fit the server (32 tokens a batch)" in output.error
    assert "'chunk_alignment' must be <=" in output.error


def test_a_config_that_does_not_fit_the_server_is_about_the_field_it_breaks() -> None:
    scheduler = register(PlannerConfig(max_num_batched_tokens=64, chunk_alignment=48))
    # (The scheduler reads only the token budget of the server's cache before it refuses.)
    cache: Any = types.SimpleNamespace(max_batch_tokens=32)
    with pytest.raises(InvalidConfigError, match=r"^the planner config does not fit") as info:
        scheduler(cache, None, 4)
    assert info.value.parameter == "chunk_alignment"


# -- the same tokens as transformers -----------------------------------------------------------

# (prompt lengths, new tokens, planner config, server's num_blocks, max_batch_tokens,
# max_requests_per_batch). num_blocks of 8-token pages: 64 holds everything at once; the
# small ones cannot, so the server offloads or requests wait for blocks.
WORKLOADS = [
    pytest.param(
        [5, 70, 13, 41, 9],
        4,
        PlannerConfig(max_num_batched_tokens=64, long_prefill_token_threshold=16),
        64,
        64,
        None,
        id="round_robin-threshold",
    ),
    pytest.param(
        [5, 70, 13, 41, 9],
        4,
        PlannerConfig(
            max_num_batched_tokens=48,
            long_prefill_token_threshold=24,
            policy="packed",
            max_num_partial_prefills=2,
            chunk_alignment=PAGE,
        ),
        64,
        64,
        None,
        id="packed-partial-aligned",
    ),
    pytest.param(
        [60, 3, 33, 47, 21, 8],
        5,
        PlannerConfig(max_num_batched_tokens=32, long_prefill_token_threshold=16, policy="packed"),
        10,
        48,
        None,
        id="packed-small-cache",
    ),
    pytest.param(
        [60, 3, 33, 47, 21, 8],
        5,
        PlannerConfig(
            max_num_batched_tokens=40, long_prefill_token_threshold=16, chunk_alignment=PAGE
        ),
        10,
        48,
        None,
        id="round_robin-small-cache-aligned",
    ),
    pytest.param(
        [30, 12, 50, 7],
        3,
        PlannerConfig(max_num_batched_tokens=64, max_num_seqs=2, policy="packed"),
        64,
        32,
        3,
        id="packed-rows-server-budget",
    ),
]


@pytest.mark.parametrize(
    ("lengths", "new_tokens", "config", "num_blocks", "max_batch_tokens", "max_requests"),
    WORKLOADS,
)
def test_generate_batch_returns_the_tokens_of_fifo_and_generate(
    model: Any,
    reference: Any,
    lengths: list[int],
    new_tokens: int,
    config: PlannerConfig,
    num_blocks: int,
    max_batch_tokens: int,
    max_requests: int | None,
) -> None:
    prompts = random_prompts(sum(lengths), lengths)
    batches: list[ScheduledBatch] = []
    checked_progress(register(config, on_batch=batches.append))
    server = ContinuousBatchingConfig(
        page_size=PAGE,
        num_blocks=num_blocks,
        max_batch_tokens=max_batch_tokens,
        max_requests_per_batch=max_requests,
    )
    ours = run_batch(model, prompts, new_tokens, "pypto_sched", server)
    fifo = run_batch(model, prompts, new_tokens, "fifo", server)
    expected = [reference(prompt, new_tokens) for prompt in prompts]
    assert ours == expected
    assert fifo == expected
    check_batches(batches, config, max_batch_tokens=max_batch_tokens, max_rows=max_requests)
    if blocks_needed(prompts, new_tokens) <= num_blocks:
        check_prefills(batches, prompts, config)
    else:  # the case this row is here for
        assert blocks_needed(prompts, new_tokens) > 2 * num_blocks


@pytest.mark.parametrize("policy", POLICIES)
def test_chunks_are_cut_anywhere_without_page_size_and_on_pages_with_it(
    model: Any, reference: Any, policy: str
) -> None:
    """The server's paged cache takes chunks that end inside a page: without ``page_size``
    the budget left after the decodes is used to the token, with it every non-final chunk
    ends on a page; the tokens are the same both ways."""
    prompts = random_prompts(5, [45, 70, 13, 52, 9, 31])
    server = ContinuousBatchingConfig(page_size=PAGE, num_blocks=64, max_batch_tokens=30)
    expected = [reference(prompt, 4) for prompt in prompts]
    assert run_batch(model, prompts, 4, "fifo", server) == expected
    ends_inside_a_page = {}
    for page_size in (None, PAGE):
        config = PlannerConfig(
            max_num_batched_tokens=30,
            long_prefill_token_threshold=20,
            chunk_alignment=page_size,
            policy=policy,  # type: ignore[arg-type]
        )
        batches: list[ScheduledBatch] = []
        checked_progress(register(config, on_batch=batches.append))
        assert run_batch(model, prompts, 4, "pypto_sched", server) == expected
        check_batches(batches, config, max_batch_tokens=30)
        check_prefills(batches, prompts, config)
        ends_inside_a_page[page_size] = any(
            row.is_prefill and not row.is_final and row.end % PAGE
            for batch in batches
            for row in batch.rows
        )
    assert ends_inside_a_page == {None: True, PAGE: False}


@st.composite
def workloads(draw: st.DrawFn) -> dict[str, Any]:
    """A workload and a planner config, with a server cache from ample down to one that
    holds a little more than the largest request."""
    lengths = draw(st.lists(st.integers(1, 72), min_size=1, max_size=5))
    new_tokens = draw(st.integers(1, 5))
    policy = draw(st.sampled_from(POLICIES))
    budget = draw(st.integers(PAGE, 64))
    threshold = draw(st.one_of(st.none(), st.integers(PAGE, 40)))
    partial = draw(st.one_of(st.none(), st.integers(1, 3))) if policy == "packed" else None
    max_batch_tokens = draw(st.integers(PAGE, 64))
    order = draw(st.sampled_from(ORDERS))
    # no alignment, the server's pages, or any page size that fits the server's batch
    page_size = draw(
        st.one_of(
            st.none(),
            st.just(PAGE),
            st.integers(1, min(budget, threshold or budget, max_batch_tokens)),
        )
    )
    config = PlannerConfig(
        max_num_batched_tokens=budget,
        long_prefill_token_threshold=threshold,
        max_num_seqs=draw(st.one_of(st.none(), st.integers(1, 6))),
        chunk_alignment=page_size,
        policy=policy,
        max_num_partial_prefills=partial,
    )
    largest = -(-(max(lengths) + new_tokens) // PAGE)
    return {
        "prompts": random_prompts(draw(st.integers(0, 2**16)), lengths),
        "new_tokens": new_tokens,
        "config": config,
        "num_blocks": draw(st.integers(largest + 1, 64)),
        "max_batch_tokens": max_batch_tokens,
        "order": order,
    }


@settings(max_examples=6)
@given(workload=workloads())
def test_generated_workloads_give_the_tokens_of_fifo_and_generate_within_the_config(
    model: Any, reference: Any, workload: dict[str, Any]
) -> None:
    prompts, new_tokens = workload["prompts"], workload["new_tokens"]
    config = workload["config"]
    batches: list[ScheduledBatch] = []
    checked_progress(register(config, on_batch=batches.append, order=workload["order"]))
    server = ContinuousBatchingConfig(
        page_size=PAGE,
        num_blocks=workload["num_blocks"],
        max_batch_tokens=workload["max_batch_tokens"],
    )
    ours = run_batch(model, prompts, new_tokens, "pypto_sched", server)
    expected = [reference(prompt, new_tokens) for prompt in prompts]
    assert ours == expected
    assert run_batch(model, prompts, new_tokens, "fifo", server) == expected
    check_batches(batches, config, max_batch_tokens=workload["max_batch_tokens"])
    if blocks_needed(prompts, new_tokens) <= workload["num_blocks"]:
        check_prefills(batches, prompts, config)


def test_shared_prefixes_hit_the_server_prefix_cache_and_keep_the_tokens(
    model: Any, reference: Any
) -> None:
    """Prompts that share three pages: the server finds the prefix in its cache when a
    later request starts, and the planner takes the request up from there."""
    (prefix,) = random_prompts(3, [3 * PAGE])
    prompts = [prefix + tail for tail in random_prompts(4, [5, 17, 2, 30])]
    config = PlannerConfig(
        max_num_batched_tokens=32, long_prefill_token_threshold=16, policy="packed"
    )
    batches: list[ScheduledBatch] = []
    checked_progress(register(config, on_batch=batches.append))
    server = ContinuousBatchingConfig(page_size=PAGE, num_blocks=64, max_batch_tokens=32)
    ours = run_batch(model, prompts, 3, "pypto_sched", server)
    assert ours == [reference(prompt, 3) for prompt in prompts]
    check_batches(batches, config, max_batch_tokens=32)
    check_prefills(batches, prompts, config)
    first_rows: dict[str, ScheduledRow] = {}
    for batch in batches:
        for row in batch.rows:
            first_rows.setdefault(row.request_id, row)
    assert any(row.start > 0 for row in first_rows.values()), "no prefix-cache hit"


def test_a_prefix_cache_hit_runs_in_the_batch_that_finds_it_as_under_fifo(
    model: Any, reference: Any
) -> None:
    """``packed`` without a threshold runs ``"fifo"``'s very batches, prefix-cache hits
    included: a request the hit moves forward is planned again from there in the same batch
    (before, its planned room went unused and it ran a batch later: 9 batches, not 5)."""
    (system,) = random_prompts(5, [4 * PAGE])
    prompts = [system + tail for tail in random_prompts(6, [5, 17, 2, 30, 9, 12, 20, 3])]
    fifo_batches: list[list[tuple[str, int]]] = []

    class RecordedFifo(FIFOScheduler):
        def schedule_batch(self, token_budget: int, cache_budget: int) -> Any:
            result = super().schedule_batch(token_budget, cache_budget)
            if result[0]:
                rows = [(f.state.request_id, f.query_length) for f in result[0]]
                fifo_batches.append(rows)
            return result

    SCHEDULER_MAPPING["recorded_fifo"] = RecordedFifo
    batches: list[ScheduledBatch] = []
    checked_progress(
        register(PlannerConfig(max_num_batched_tokens=64, policy="packed"), on_batch=batches.append)
    )
    server = ContinuousBatchingConfig(page_size=PAGE, num_blocks=64, max_batch_tokens=64)
    ours = run_batch(model, prompts, 3, "pypto_sched", server)
    assert run_batch(model, prompts, 3, "recorded_fifo", server) == ours
    assert ours == [reference(prompt, 3) for prompt in prompts]
    assert [[(r.request_id, r.length) for r in b.rows] for b in batches] == fifo_batches
    assert any(row.start > 0 for batch in batches for row in batch.rows if row.is_prefill)


@pytest.mark.parametrize("order", ORDERS)
def test_shared_prefixes_in_a_cache_too_small_give_the_tokens_of_fifo(
    model: Any, reference: Any, order: str
) -> None:
    """A row refused for want of a free block, then a prefix-cache hit further down the same
    plan: the batch is planned again, and the refused request was asked again and reported
    starved twice, so the server offloaded it twice and queued it twice, and the scheduler
    failed every request removing it twice."""
    (prefix,) = random_prompts(21, [9])
    tails = random_prompts(22, [18, 15, 14, 16])
    prompts = [prefix[:4] + tails[0], prefix + tails[1], prefix[:8] + tails[2], prefix + tails[3]]
    prompts.append(prompts[3][:21])
    config = PlannerConfig(
        max_num_batched_tokens=1000, policy="packed", chunk_alignment=8, max_num_partial_prefills=2
    )
    checked_progress(register(config, order=order))  # type: ignore[arg-type]
    server = ContinuousBatchingConfig(page_size=4, num_blocks=17, max_batch_tokens=64)
    assert 2 * blocks_needed(prompts, 18) > 3 * 17  # in 4-token pages: it holds under a third
    ours = run_batch(model, prompts, 18, "pypto_sched", server)
    assert ours == run_batch(model, prompts, 18, "fifo", server)
    assert ours == [reference(prompt, 18) for prompt in prompts]


def test_requests_part_way_before_a_prefix_hit_keep_their_partial_prefill_places(
    model: Any, reference: Any
) -> None:
    """After a prefix-cache hit the rest of the batch is planned without the requests that
    already ran in it; those still part-way hold places under max_num_partial_prefills (4
    prompts were part-way against a limit of 2)."""
    (base,) = random_prompts(33, [60])
    tails = random_prompts(34, [16, 46, 42, 68, 47, 40, 68])
    shared = [0, 0, 52, 28, 12, 25, 0]
    prompts = [base[:k] + tail for k, tail in zip(shared, tails, strict=True)]
    config = PlannerConfig(
        max_num_batched_tokens=64,
        long_prefill_token_threshold=16,
        policy="packed",
        max_num_partial_prefills=2,
    )
    batches: list[ScheduledBatch] = []
    register(config, on_batch=batches.append)
    server = ContinuousBatchingConfig(page_size=4, num_blocks=400, max_batch_tokens=64)
    ours = run_batch(model, prompts, 6, "pypto_sched", server)
    assert ours == [reference(prompt, 6) for prompt in prompts]
    check_batches(batches, config, max_batch_tokens=64)
    check_prefills(batches, prompts, config)  # at most 2 prompts part-way after any batch
    starts = [row.start for batch in batches for row in batch.rows if row.is_prefill]
    assert any(start > 0 and start % 4 == 0 for start in starts[:8]), "no prefix-cache hit"


def test_a_lone_request_with_a_prefix_hit_is_served_in_the_first_batch_it_is_asked_for(
    model: Any, reference: Any
) -> None:
    """An empty batch tells the server there is nothing to do (it then sleeps before asking
    again), so a hit must not leave the batch empty (before, the first batch asked with B
    waiting was empty)."""
    (first,) = random_prompts(7, [3 * PAGE])
    later = [*first, 5, 9, 2, 7, 1, 3]
    scheduler = register(PlannerConfig(max_num_batched_tokens=64, policy="packed"))
    asked: list[list[tuple[str, int]] | None] = []

    class Spy(scheduler):  # type: ignore[misc,valid-type]
        def schedule_batch(self, token_budget: int, cache_budget: int) -> Any:
            result = super().schedule_batch(token_budget, cache_budget)
            if "B" in self.active_requests:
                rows = result[0]
                asked.append(
                    None if rows is None else [(f.state.request_id, f.query_length) for f in rows]
                )
            return result

    SCHEDULER_MAPPING["spy"] = Spy
    server = ContinuousBatchingConfig(
        page_size=PAGE, num_blocks=64, max_batch_tokens=64, scheduler_type="spy"
    )
    manager = model.init_continuous_batching(
        generation_config=generation_config(2), continuous_batching_config=server
    )
    manager.start()
    try:
        manager.add_request(first, request_id="A")
        assert manager.get_result(request_id="A", timeout=60).generated_tokens == reference(
            first, 2
        )
        manager.add_request(later, request_id="B")
        result = manager.get_result(request_id="B", timeout=60)
    finally:
        manager.stop(block=True, timeout=30)
    assert result.generated_tokens == reference(later, 2)
    assert asked[0] == [("B", len(later) - 3 * PAGE)]  # from the hit, in the first batch


@pytest.mark.parametrize("policy", POLICIES)
def test_a_batch_whose_planned_rows_are_all_refused_is_planned_again_without_them(
    model: Any, reference: Any, policy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server refuses the one row planned first (the first request asked, the first
    time); the batch is planned again without it and runs the other request, and the
    refused one runs later."""
    prompts = random_prompts(4, [20, 9])
    refused: list[str] = []
    real = PyptoScheduler._run_prefill_row

    def refuse_the_first(self: PyptoScheduler, state: Any, *args: Any, **kwargs: Any) -> bool:
        if not refused:
            refused.append(state.request_id)
            return False
        return real(self, state, *args, **kwargs)

    monkeypatch.setattr(PyptoScheduler, "_run_prefill_row", refuse_the_first)
    # 8 tokens a batch: one row is planned, a chunk of the first request
    config = PlannerConfig(max_num_batched_tokens=8, policy=policy)  # type: ignore[arg-type]
    batches: list[ScheduledBatch] = []
    register(config, on_batch=batches.append)
    server = ContinuousBatchingConfig(page_size=PAGE, num_blocks=64, max_batch_tokens=8)
    tokens = run_batch(model, prompts, 3, "pypto_sched", server)
    assert tokens == [reference(prompt, 3) for prompt in prompts]
    assert len(refused) == 1
    first = batches[0].rows
    assert [row.request_id for row in first] != refused
    assert len(first) == 1
    assert first[0].start == 0


@pytest.mark.parametrize("policy", POLICIES)
def test_a_request_that_fits_a_tiny_cache_finishes_as_under_fifo(
    model: Any, reference: Any, policy: str
) -> None:
    """A 2-block cache (16 tokens), three requests, one of which fits (5 + 4 - 1 tokens of
    KV): fifo finishes it and fails the other two ("No requests can be scheduled"). Ours
    failed all three: the server queues it last (it sorts prompts by their tokens,
    descending, for prefix sharing), and once a new request found no free block the batch
    was planned without new requests, the one that fits among them."""
    prompts = [[1] * 5, [2] * 30, [3] * 40]
    server = ContinuousBatchingConfig(page_size=PAGE, num_blocks=2, max_batch_tokens=64)

    def outcomes(scheduler_type: str) -> list[tuple[bool, list[int]]]:
        server.scheduler_type = scheduler_type
        outputs = model.generate_batch(
            prompts,
            generation_config=generation_config(4),
            continuous_batching_config=copy.copy(server),
            progress_bar=False,
            warmup=False,
        )
        by_index = sorted(outputs.values(), key=lambda o: int(o.request_id.rsplit("_", 1)[1]))
        return [(out.error is None, list(out.generated_tokens)) for out in by_index]

    fifo = outcomes("fifo")
    assert fifo == [(True, reference(prompts[0], 4)), (False, []), (False, [])]
    register(PlannerConfig(max_num_batched_tokens=64, policy=policy))  # type: ignore[arg-type]
    assert outcomes("pypto_sched") == fifo


def test_a_request_the_server_resets_mid_prefill_joins_the_planner_where_the_server_queues_it(
    model: Any, reference: Any
) -> None:
    """A cache too small for the batch: the server resets starved prefilling requests to
    their start and queues them last; the planner must not put them ahead of requests the
    server queued before them (before, they went to the front)."""
    prompts = random_prompts(8, [24, 24, 24, 24])
    scheduler = register(
        PlannerConfig(max_num_batched_tokens=32, long_prefill_token_threshold=12, policy="packed")
    )
    resets: list[tuple[str, list[str], list[str]]] = []

    class Spy(scheduler):  # type: ignore[misc,valid-type]
        def _reconcile(self) -> None:
            before = dict(self.progress)
            super()._reconcile()
            waiting = list(self.waiting_requests_order)
            for request_id in waiting:
                was = before.get(request_id)
                if was and was[1] > 0 and self.waiting_requests[request_id].position_offset == 0:
                    planner = [r for r in self.prefill_state if r in waiting]
                    resets.append((request_id, waiting, planner))

    SCHEDULER_MAPPING["spy"] = Spy
    server = ContinuousBatchingConfig(page_size=PAGE, num_blocks=6, max_batch_tokens=32)
    assert run_batch(model, prompts, 12, "spy", server) == [reference(p, 12) for p in prompts]
    assert resets, "no request was reset: the case this test is for"
    for request_id, waiting, planner in resets:
        assert planner == waiting, (request_id, waiting, planner)


def test_cancelling_a_request_mid_prefill_frees_its_blocks_and_keeps_the_others_tokens(
    model: Any, reference: Any
) -> None:
    prompts = random_prompts(11, [64, 20, 37, 9])
    ids = [f"r{i}" for i in range(len(prompts))]
    victim = ids[0]
    new_tokens = 4
    cancelled = threading.Event()
    after_cancel: list[tuple[bool, bool, bool, bool]] = []
    manager: Any = None

    def on_batch(batch: ScheduledBatch) -> None:
        scheduler = manager.batch_processor.scheduler
        if cancelled.is_set():
            after_cancel.append(
                (
                    victim in scheduler.prefill_state,
                    victim in scheduler.active_requests or victim in scheduler.waiting_requests,
                    any(victim in a.block_table for a in scheduler.cache.cache_allocators.values()),
                    any(row.request_id == victim for row in batch.rows),
                )
            )
        elif any(row.request_id == victim and not row.is_final for row in batch.rows):
            manager.cancel_request(victim)  # applied before the next batch is scheduled
            cancelled.set()

    config = PlannerConfig(
        max_num_batched_tokens=32, long_prefill_token_threshold=16, policy="packed"
    )
    register(config, on_batch=on_batch)
    manager = live_server(model, new_tokens)
    for request_id, prompt in zip(ids, prompts, strict=True):
        manager.add_request(prompt, request_id=request_id, max_new_tokens=new_tokens)
    results = collect(manager, len(ids) - 1)
    assert cancelled.is_set()
    assert after_cancel, "no batch ran after the cancellation"
    assert set(after_cancel) == {(False, False, False, False)}
    assert victim not in results
    for request_id, prompt in zip(ids[1:], prompts[1:], strict=True):
        assert results[request_id].generated_tokens == reference(prompt, new_tokens)


@pytest.mark.parametrize(
    ("lengths", "new_tokens", "num_blocks"),
    [([58, 120, 81, 12], 13, 29), ([113, 88, 7, 78, 2, 72, 41, 11], 16, 35)],
)
def test_under_the_safety_margin_prompts_part_way_go_on_and_new_ones_wait(
    model: Any, reference: Any, lengths: list[int], new_tokens: int, num_blocks: int
) -> None:
    """Under the server's safety margin, a prompt part-way keeps running beside the decodes
    (the server's own schedulers stop it), no new request starts beside them, and every
    chunk leaves each decoding request a free block: on these workloads no decode starves,
    so the server never offloads a request (each prompt is prefilled once, in order),
    while without that reserve one would."""
    prompts = random_prompts(1, lengths)
    config = PlannerConfig(
        max_num_batched_tokens=12, long_prefill_token_threshold=8, policy="packed"
    )
    batches: list[ScheduledBatch] = []
    checked_progress(register(config, on_batch=batches.append))
    server = ContinuousBatchingConfig(page_size=PAGE, num_blocks=num_blocks, max_batch_tokens=12)
    expected = [reference(prompt, new_tokens) for prompt in prompts]
    assert run_batch(model, prompts, new_tokens, "pypto_sched", server) == expected
    assert run_batch(model, prompts, new_tokens, "fifo", server) == expected
    check_batches(batches, config, max_batch_tokens=12)
    check_prefills(batches, prompts, config)  # nothing offloaded: each prompt tiled once
    beside_decodes = [
        [row for row in batch.rows if row.is_prefill]
        for batch in batches
        if batch.under_safety_margin and not batch.rows[0].is_prefill
    ]
    assert any(row.start > 0 for rows in beside_decodes for row in rows), "none went on"
    assert all(row.start > 0 for rows in beside_decodes for row in rows), "a new one started"


@pytest.mark.parametrize(
    ("lengths", "new_tokens", "num_blocks", "max_batch_tokens"),
    [([67, 4, 5, 10, 43, 71], 22, 22, 16), ([3, 4, 95, 4], 13, 15, 12)],
)
def test_under_the_safety_margin_a_new_request_starts_only_alone(
    model: Any,
    reference: Any,
    lengths: list[int],
    new_tokens: int,
    num_blocks: int,
    max_batch_tokens: int,
) -> None:
    """Caches too small for the workload, where the server offloads requests: under the
    margin a request starts (its first chunk, or again after an offload) only as the one
    row of its batch, and the tokens are those of ``generate()``."""
    prompts = random_prompts(1, lengths)
    config = PlannerConfig(max_num_batched_tokens=max_batch_tokens, policy="packed")
    batches: list[ScheduledBatch] = []
    checked_progress(register(config, on_batch=batches.append))
    server = ContinuousBatchingConfig(
        page_size=PAGE, num_blocks=num_blocks, max_batch_tokens=max_batch_tokens
    )
    expected = [reference(prompt, new_tokens) for prompt in prompts]
    assert run_batch(model, prompts, new_tokens, "pypto_sched", server) == expected
    check_batches(batches, config, max_batch_tokens=max_batch_tokens)  # new ones start alone
    assert any(batch.under_safety_margin for batch in batches), "never under the margin"


@pytest.mark.parametrize("policy", POLICIES)
def test_under_the_safety_margin_planning_does_not_remove_each_waiting_request(
    model: Any, policy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A long queue under the margin: the batches are planned without the waiting requests,
    taken out of the state at once, not one removal each (a removal each per batch cost
    4 ms a batch with 800 queued, 7x the server's own scheduler); the tokens are
    ``"fifo"``'s."""
    prompts = random_prompts(3, [3 + i % 10 for i in range(120)])
    config = PlannerConfig(max_num_batched_tokens=32, policy=policy)  # type: ignore[arg-type]
    batches: list[ScheduledBatch] = []
    checked_progress(register(config, on_batch=batches.append))
    removals: list[object] = []
    real = PrefillState.remove

    def counted(state: PrefillState[Any], request_id: Any) -> PrefillState[Any]:
        removals.append(request_id)
        return real(state, request_id)

    monkeypatch.setattr(PrefillState, "remove", counted)
    server = ContinuousBatchingConfig(page_size=PAGE, num_blocks=10, max_batch_tokens=32)
    ours = run_batch(model, prompts, 8, "pypto_sched", server)
    assert ours == run_batch(model, prompts, 8, "fifo", server)
    under = sum(batch.under_safety_margin for batch in batches)
    assert under > 30, under  # many batches, each with a long queue waiting
    assert len(removals) <= len(prompts), len(removals)


@pytest.mark.parametrize("policy", POLICIES)
def test_requests_added_while_the_server_runs_get_the_tokens_of_generate(
    model: Any, reference: Any, policy: str
) -> None:
    """Requests submitted between batches (from the batch hook, so at known points of the
    run) join the planner's state mid-prefill of others and still get ``generate()``'s
    tokens; one submitted mid-run and cancelled after its first chunk leaves without a trace;
    the batches obey the config throughout."""
    prompts = random_prompts(17, [50, 6, 23, 41, 12, 30, 3])
    ids = [f"r{i}" for i in range(len(prompts))]
    # request index -> the batch after which it is submitted (0: before the server starts)
    arrivals = {0: 0, 1: 0, 2: 1, 3: 2, 4: 2, 5: 4, 6: 5}
    (victim_prompt,) = random_prompts(18, [72])
    victim, victim_added = "victim", 3
    cancelled_after: list[int] = []  # the batch after which the victim is cancelled
    new_tokens = 4
    manager: Any = None
    batches: list[ScheduledBatch] = []

    def submit(after: int) -> None:
        submit_arrivals(manager, after, arrivals, prompts, ids, new_tokens)
        if after == victim_added:
            manager.add_request(victim_prompt, request_id=victim, max_new_tokens=new_tokens)

    def on_batch(batch: ScheduledBatch) -> None:
        batches.append(batch)
        if not cancelled_after and any(row.request_id == victim for row in batch.rows):
            manager.cancel_request(victim)  # applied before the next batch is scheduled
            cancelled_after.append(len(batches))
        submit(len(batches))  # drained by the server before the next batch is scheduled

    config = PlannerConfig(
        max_num_batched_tokens=32,
        long_prefill_token_threshold=16,
        policy=policy,  # type: ignore[arg-type]
    )
    checked_progress(register(config, on_batch=on_batch))
    manager = live_server(model, new_tokens)
    submit(0)
    results = collect(manager, len(ids))
    for request_id, prompt in zip(ids, prompts, strict=True):
        assert results[request_id].generated_tokens == reference(prompt, new_tokens)
    assert victim not in results
    victim_rows = [row for batch in batches for row in batch.rows if row.request_id == victim]
    assert cancelled_after, "the victim never ran"
    assert not any(row.is_final for row in victim_rows), "cancelled after its prefill"
    assert not [
        (number, row)
        for number, batch in enumerate(batches, start=1)
        for row in batch.rows
        if row.request_id == victim and number > cancelled_after[0]
    ]
    check_batches(batches, config, max_batch_tokens=32)
    first_batch: dict[str, int] = {}
    for number, batch in enumerate(batches, start=1):
        for row in batch.rows:
            first_batch.setdefault(row.request_id, number)
    for i, after in arrivals.items():
        assert first_batch[ids[i]] > after, f"{ids[i]} ran before it was submitted"
    # the case this test is for: requests joined while another was part-way in its prefill
    prefill_batches: dict[str, list[int]] = {}
    for number, batch in enumerate(batches, start=1):
        for row in batch.rows:
            if row.is_prefill:
                prefill_batches.setdefault(row.request_id, []).append(number)
    joined_mid_prefill = [
        ids[i]
        for i, after in arrivals.items()
        if any(spans[0] <= after < spans[-1] for spans in prefill_batches.values())
    ]
    assert len(joined_mid_prefill) >= 2, prefill_batches


@pytest.mark.parametrize("name", ["fifo", "prefill_first"])
def test_register_refuses_the_name_of_another_scheduler(name: str) -> None:
    builtin = SCHEDULER_MAPPING[name]
    with pytest.raises(InvalidConfigError, match=rf"^'name' '{name}' is another scheduler's"):
        register(PlannerConfig(max_num_batched_tokens=64), name=name)
    assert SCHEDULER_MAPPING[name] is builtin
    first = register(PlannerConfig(max_num_batched_tokens=64), name="ours")
    assert register(PlannerConfig(max_num_batched_tokens=32), name="ours") is not first


def test_register_rejects_an_unknown_admission_order() -> None:
    with pytest.raises(InvalidConfigError, match="'order' must be one of"):
        register(PlannerConfig(max_num_batched_tokens=64), order="longest_first")  # type: ignore[arg-type]


@pytest.mark.parametrize("on_batch", [5, "x"])
def test_register_rejects_an_observer_that_cannot_be_called(on_batch: Any) -> None:
    # (Found at registration, not when the first batch fails every request.)
    with pytest.raises(InvalidConfigError, match=r"^'on_batch' must be callable or None: "):
        register(PlannerConfig(max_num_batched_tokens=64), on_batch=on_batch)


@pytest.mark.parametrize("token_budget", ["x", None, 0])
def test_step_config_names_a_bad_token_budget(token_budget: Any) -> None:
    scheduler = register(PlannerConfig(max_num_batched_tokens=64, max_num_seqs=4), name="t")
    # (Building the scheduler reads only the server cache's max_batch_tokens.)
    cache: Any = type("Cache", (), {"max_batch_tokens": 64})()
    instance = scheduler(cache, None, 8)
    assert instance.step_config(32) == PlannerConfig(max_num_batched_tokens=32, max_num_seqs=4)
    with pytest.raises(InvalidConfigError, match=r"^'token_budget' must be "):
        instance.step_config(token_budget)


@pytest.mark.parametrize(
    ("safety_margin", "max_requests", "message"),
    [
        (None, 0, r"^'max_requests_per_batch' must be >= 1: 0$"),
        (1.5, 8, r"^'safety_margin' must be None or a number in \[0, 1\]: 1.5$"),
        ("0.1", 8, r"^'safety_margin' must be None or a number in \[0, 1\]: '0.1'$"),
    ],
)
def test_the_scheduler_checks_what_the_server_builds_it_with(
    safety_margin: Any, max_requests: Any, message: str
) -> None:
    scheduler = register(PlannerConfig(max_num_batched_tokens=64), name="t")
    cache: Any = type("Cache", (), {"max_batch_tokens": 64})()
    with pytest.raises(InvalidConfigError, match=message):
        scheduler(cache, safety_margin, max_requests)


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("policy", POLICIES)
def test_requests_join_the_planner_in_the_admission_order(
    model: Any, reference: Any, policy: str, order: str
) -> None:
    """Requests start in the order they join the planner: by arrival, or, shortest first,
    each group the server queued between two batches sorted by prompt length and never
    ahead of an earlier group; the tokens are ``generate()``'s either way."""
    lengths = [50, 6, 23, 41, 35, 28, 12, 30, 3, 19]
    prompts = random_prompts(23, lengths)
    ids = [f"r{i}" for i in range(len(prompts))]
    # request index -> the batch after which it is submitted (0: before the server starts)
    arrivals = {0: 0, 1: 0, 2: 0, 3: 0, 4: 0, 5: 0, 6: 2, 7: 2, 8: 3, 9: 3}
    new_tokens = 3
    manager: Any = None
    batches: list[ScheduledBatch] = []

    def submit(after: int) -> None:
        submit_arrivals(manager, after, arrivals, prompts, ids, new_tokens)

    def on_batch(batch: ScheduledBatch) -> None:
        batches.append(batch)
        submit(len(batches))  # drained by the server before the next batch is scheduled

    config = PlannerConfig(
        max_num_batched_tokens=32,
        long_prefill_token_threshold=16,
        policy=policy,  # type: ignore[arg-type]
    )
    checked_progress(register(config, on_batch=on_batch, order=order))  # type: ignore[arg-type]
    manager = live_server(model, new_tokens)
    submit(0)
    results = collect(manager, len(ids))
    for request_id, prompt in zip(ids, prompts, strict=True):
        assert results[request_id].generated_tokens == reference(prompt, new_tokens)
    check_batches(batches, config, max_batch_tokens=32)
    started: list[str] = []
    start_batch: dict[str, int] = {}
    for number, batch in enumerate(batches, start=1):
        for row in batch.rows:
            if row.is_prefill and row.request_id not in started:
                started.append(row.request_id)
                start_batch[row.request_id] = number
    by_length = order == "shortest_first"
    expected = sorted(
        range(len(ids)), key=lambda i: (arrivals[i], lengths[i] if by_length else 0, i)
    )
    assert started == [ids[i] for i in expected]
    # the case this test is for: shorter requests arrived while longer, earlier ones waited
    assert any(
        arrivals[j] < arrivals[i] < start_batch[ids[j]] and lengths[i] < lengths[j]
        for i in arrivals
        for j in arrivals
    ), start_batch


def test_the_class_put_in_the_mapping_by_hand_fails_each_request_saying_to_register(
    model: Any,
) -> None:
    """Without register() it has no planner config: every request failed with an
    AttributeError on 'planner_config'."""
    SCHEDULER_MAPPING["by_hand"] = PyptoScheduler
    server = ContinuousBatchingConfig(
        page_size=PAGE, num_blocks=8, max_batch_tokens=32, scheduler_type="by_hand"
    )
    outputs = model.generate_batch(
        [[1, 2, 3], [4, 5]],
        generation_config=generation_config(2),
        continuous_batching_config=server,
        progress_bar=False,
        warmup=False,
    )
    assert len(outputs) == 2
    for output in outputs.values():
        assert str(output.error) == (
            "PyptoScheduler has no planner config: put it in SCHEDULER_MAPPING with "
            "pypto_sched.integrations.transformers.register(config, name=...), not by hand, "
            "and ask for scheduler_type=name"
        )


def test_the_decode_rows_follow_the_planners_decode_first_rule(
    model: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The decode rows are built by :func:`pypto_sched.decode_rows_first`, the rule the
    generation planner uses: what it reports taken is every batch's decode rows."""
    taken: list[tuple[int, int]] = []

    def spy(requests: Any, config: PlannerConfig, *, take_row: Any) -> tuple[int, int]:
        result = decode_rows_first(requests, config, take_row=take_row)
        taken.append(result)
        return result

    monkeypatch.setattr("pypto_sched.integrations.transformers.decode_rows_first", spy)
    batches: list[ScheduledBatch] = []
    config = PlannerConfig(max_num_batched_tokens=16, max_num_seqs=3)
    register(config, on_batch=batches.append)
    server = ContinuousBatchingConfig(page_size=PAGE, num_blocks=64, max_batch_tokens=16)
    run_batch(model, random_prompts(5, [5, 9, 3, 7]), 4, "pypto_sched", server)
    decodes = [[row for row in batch.rows if not row.is_prefill] for batch in batches]
    ran = [(sum(row.length for row in rows), len(rows)) for rows in decodes]
    assert [t for t in taken if t != (0, 0)] == [r for r in ran if r != (0, 0)]
    assert max(rows for _, rows in ran) == 3  # four requests decode, three rows a batch
    check_batches(batches, config, max_batch_tokens=16)
