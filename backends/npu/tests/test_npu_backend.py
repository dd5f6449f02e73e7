"""The backend keeps the pypto_sched Backend contract: discovery, check_backend, outputs only
for final rows, K/V written only at the dispatch's slots, both embedding paths, warmup inside
the budget, and clear errors for misuse."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import attrs
import numpy as np
import pytest

from pypto_sched import (
    BackendError,
    CheckpointError,
    ExecutionError,
    InvalidInputError,
    PlannerConfig,
    Schedule,
    dispatch_arrays,
    generate,
    plan_pages,
    plan_prefill,
    plan_warmup,
)
from pypto_sched.backends import Backend, DispatchInput, list_backends, load_backend
from pypto_sched.execute import execute_schedule
from pypto_sched.testing import check_backend

pytest.importorskip("torch", reason="the npu backend runs on torch")

import torch

import pypto_sched_npu
from pypto_sched_npu import NpuBackend, PagedKVCache

Backends = Callable[..., NpuBackend]
PATHS = ("torch", "npu")
# The NPU kernels take pages of 128 slots only; the CPU path takes any size.
PAGE = {"torch": 4, "npu": 128}


def test_every_public_name_is_exported() -> None:
    public = {name for name in dir(pypto_sched_npu) if not name.startswith("_")}
    modules = {"backend", "ops"}
    assert sorted(public - modules) == sorted(pypto_sched_npu.__all__)


def test_backend_is_discovered_under_the_name_npu(checkpoints: dict[str, Path]) -> None:
    assert "npu" in list_backends()
    backend = load_backend("npu", checkpoint=checkpoints["tied"], device="cpu")
    assert isinstance(backend, NpuBackend)
    assert isinstance(backend, Backend)
    assert backend.name == "npu"


@pytest.mark.parametrize("model", ["tied", "untied", "sharded"])
def test_cpu_path_passes_check_backend(model: str, backends: Backends) -> None:
    check_backend(backends(model), max_examples=12, seed=len(model))


@pytest.mark.parametrize("model", ["tied", "sharded"])
def test_fake_npu_path_passes_check_backend_with_its_page_sizes(
    model: str, backends: Backends
) -> None:
    check_backend(backends(model, ops="npu"), max_examples=6, seed=len(model), page_sizes=(128,))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_cpu_path_passes_check_backend_in_half_precision(dtype: str, backends: Backends) -> None:
    check_backend(backends("tied", dtype=dtype), max_examples=4, seed=7)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("ops", PATHS)
def test_half_precision_logits_stay_near_transformers(
    dtype: str, ops: str, backends: Backends, reference: Any
) -> None:
    backend = backends("untied", ops=ops, dtype=dtype)
    prompts = [np.arange(n, dtype=np.int64) % 101 for n in (150, 40, 7)]
    schedule = plan_prefill(
        [p.size for p in prompts], PlannerConfig(max_num_batched_tokens=64, policy="packed")
    )
    result = execute_schedule(schedule, backend, prompts, page_size=PAGE[ops])
    expected = reference.batch("untied", prompts)
    assert np.abs(result.logits - expected).max() <= backend.tolerance


def _one_dispatch(lengths: list[int], starts: list[int], page: int) -> Any:
    """The arrays of a single dispatch running ``starts[r]:lengths[r]`` of each request,
    all final."""
    config = PlannerConfig(max_num_batched_tokens=sum(lengths))
    schedule = plan_prefill(lengths, config, num_computed_tokens=starts)
    tables = plan_pages(lengths, page_size=page, num_pages=sum(-(-n // page) for n in lengths))
    return dispatch_arrays(schedule.dispatch(0), tables), tables


def _batch(arrays: Any, *, logits: bool, greedy: bool, embeddings: Any = None) -> DispatchInput:
    return DispatchInput(
        arrays=arrays,
        token_ids=np.arange(arrays.num_tokens, dtype=np.int64) % 101,
        input_embeddings=embeddings,
        return_logits=logits,
        return_greedy=greedy,
    )


@pytest.mark.parametrize("ops", PATHS)
def test_an_intermediate_dispatch_returns_nothing_but_what_was_asked(
    ops: str, backends: Backends
) -> None:
    backend = backends("tied", ops=ops)
    config = PlannerConfig(max_num_batched_tokens=300, long_prefill_token_threshold=128)
    schedule = plan_prefill([300], config)
    page = PAGE[ops]
    tables = plan_pages([300], page_size=page, num_pages=-(-300 // page))
    arrays = dispatch_arrays(schedule.dispatch(0), tables)
    assert not arrays.is_final.any()
    cache = backend.new_cache(num_pages=tables.num_pages, page_size=page)
    quiet = backend.run_dispatch(_batch(arrays, logits=False, greedy=False), cache)
    assert quiet.logits is None
    assert quiet.greedy_token_ids is None
    asked = backend.run_dispatch(_batch(arrays, logits=True, greedy=True), cache)
    assert asked.logits is not None
    assert asked.logits.shape == (0, backend.vocab_size)
    assert asked.greedy_token_ids is not None
    assert asked.greedy_token_ids.shape == (0,)


@pytest.mark.parametrize("ops", PATHS)
def test_kv_is_written_only_at_the_dispatch_slots(ops: str, backends: Backends) -> None:
    backend = backends("untied", ops=ops)
    page = PAGE[ops]
    arrays, tables = _one_dispatch([9, 5, 12], [4, 0, 11], page)
    cache = backend.new_cache(num_pages=tables.num_pages, page_size=page)
    sentinel = 7.0
    for layer in cache.layers:
        layer.key.fill_(sentinel)
        layer.value.fill_(sentinel)
    cache.mark_written(np.arange(cache.num_slots))  # the rows' prefixes, filled by hand
    backend.run_dispatch(_batch(arrays, logits=True, greedy=False), cache)
    written = np.zeros(cache.num_slots, dtype=bool)
    written[arrays.slot_mapping] = True
    for layer in cache.layers:
        for pages in (layer.key, layer.value):
            untouched = (pages.reshape(cache.num_slots, -1) == sentinel).all(dim=1).numpy()
            np.testing.assert_array_equal(untouched, ~written)


@pytest.mark.parametrize("ops", PATHS)
def test_a_context_no_dispatch_wrote_is_refused_not_read_as_zeros(
    ops: str, backends: Backends
) -> None:
    backend = backends("untied", ops=ops)
    page = PAGE[ops]
    # Request 1 starts a page and 3 positions in: position page + 1 is its first unwritten.
    arrays, tables = _one_dispatch([9, page + 8], [0, page + 3], page)
    cache = backend.new_cache(num_pages=tables.num_pages, page_size=page)
    slots = arrays.context_slots(1)  # request 1 is row 1
    cache.mark_written(slots[: page + 1])
    with pytest.raises(
        InvalidInputError,
        match=rf"row 1 reads position {page + 1} of request 1, which no dispatch has written",
    ):
        backend.run_dispatch(_batch(arrays, logits=True, greedy=False), cache)
    cache.mark_written(slots[page + 2 : page + 3])  # the rest of its prefix
    backend.run_dispatch(_batch(arrays, logits=True, greedy=False), cache)
    # What a dispatch writes, the next one may read: request 0 goes on from 9 tokens.
    later, _ = _one_dispatch([12, page + 8], [9, page + 3], page)
    backend.run_dispatch(_batch(later, logits=True, greedy=False), cache)
    with pytest.raises(InvalidInputError, match=r"'slots' must be in \[0, "):
        cache.mark_written([cache.num_slots])


@pytest.mark.parametrize("ops", PATHS)
def test_host_and_device_embeddings_give_the_same_logits(ops: str, backends: Backends) -> None:
    backend = backends("sharded", ops=ops)
    arrays, tables = _one_dispatch([20, 33], [0, 0], PAGE[ops])
    device = _batch(arrays, logits=True, greedy=True)
    host = _batch(arrays, logits=True, greedy=True, embeddings=backend.embed(device.token_ids))
    outputs = [
        backend.run_dispatch(
            batch, backend.new_cache(num_pages=tables.num_pages, page_size=PAGE[ops])
        )
        for batch in (device, host)
    ]
    np.testing.assert_array_equal(outputs[0].logits, outputs[1].logits)
    np.testing.assert_array_equal(outputs[0].greedy_token_ids, outputs[1].greedy_token_ids)


def test_the_npu_path_runs_each_kernel_once_per_layer(
    backends: Backends, fake_npu_module: ModuleType
) -> None:
    backend = backends("untied", ops="npu")  # head_dim 128: the rotary kernel's only size
    arrays, tables = _one_dispatch([130, 5], [0, 0], 128)
    fake_npu_module.reset_calls()
    backend.run_dispatch(
        _batch(arrays, logits=True, greedy=True),
        backend.new_cache(num_pages=tables.num_pages, page_size=128),
    )
    layers = backend.model.config.num_hidden_layers
    assert dict(fake_npu_module.CALLS) == {
        "npu_scatter_pa_kv_cache": layers,
        "npu_fused_infer_attention_score": layers,
        "npu_apply_rotary_pos_emb": layers,
        "npu_swiglu": layers,
        # input, post-attention, q and k norms per layer, and the final norm
        "npu_rms_norm": 4 * layers + 1,
    }
    # The last layer attends only the final rows' last tokens: one-token rows, the decode call.
    assert dict(fake_npu_module.LAYOUTS) == {"TND": layers - 1, "BSH": 1}


@pytest.mark.parametrize(
    "rows",
    [
        [(300, 128, False)],
        [(300, 128, False), (40, 40, True)],
        [(5, 5, True), (7, 7, True)],
    ],
    ids=["intermediate", "intermediate-and-final", "whole-prompts"],
)
def test_the_last_layer_attends_only_final_rows_last_tokens(
    rows: list[tuple[int, int, bool]], backends: Backends, fake_npu_module: ModuleType
) -> None:
    """Each row is (prompt length, chunk from 0, final)."""
    backend = backends("tied", ops="npu")
    lengths = [length for length, _, _ in rows]
    config = PlannerConfig(max_num_batched_tokens=512)
    chunks = [[r, 0, chunk, final] for r, (_, chunk, final) in enumerate(rows)]
    rest = [[r, chunk, n - chunk, True] for r, (n, chunk, final) in enumerate(rows) if not final]
    schedule = Schedule.from_dispatches(config, lengths, [chunks, rest] if rest else [chunks])
    tables = plan_pages(lengths, page_size=128, num_pages=sum(-(-n // 128) for n in lengths))
    arrays = dispatch_arrays(schedule.dispatch(0), tables)
    fake_npu_module.reset_calls()
    output = backend.run_dispatch(
        _batch(arrays, logits=True, greedy=True),
        backend.new_cache(num_pages=tables.num_pages, page_size=128),
    )
    finals = sum(final for _, _, final in rows)
    assert output.logits is not None
    assert output.logits.shape == (finals, backend.vocab_size)
    layers = backend.model.config.num_hidden_layers
    # Intermediate chunks reach no attention in the last layer; final rows, one decode call.
    expected = {"TND": layers - 1, "BSH": 1} if finals else {"TND": layers - 1}
    assert dict(fake_npu_module.LAYOUTS) == expected


def test_a_decode_only_dispatch_takes_the_bsh_decode_call_in_every_layer(
    backends: Backends, fake_npu_module: ModuleType
) -> None:
    backend = backends("tied", ops="npu")
    arrays, tables = _one_dispatch([130, 5, 1], [129, 4, 0], 128)
    cache = backend.new_cache(num_pages=tables.num_pages, page_size=128)
    cache.mark_written(np.arange(cache.num_slots))  # the contexts, as if decoded before
    fake_npu_module.reset_calls()
    output = backend.run_dispatch(_batch(arrays, logits=True, greedy=True), cache)
    assert output.greedy_token_ids is not None
    assert output.greedy_token_ids.shape == (3,)
    layers = backend.model.config.num_hidden_layers
    assert dict(fake_npu_module.LAYOUTS) == {"BSH": layers}


# -- warmup ------------------------------------------------------------------------------------


class _Recorder:
    """Wraps a backend's run_dispatch to record each dispatch's token count."""

    def __init__(self, backend: NpuBackend, monkeypatch: pytest.MonkeyPatch) -> None:
        self.tokens: list[int] = []
        run = backend.run_dispatch

        def recording(batch: DispatchInput, cache: Any) -> Any:
            self.tokens.append(batch.arrays.num_tokens)
            return run(batch, cache)

        monkeypatch.setattr(backend, "run_dispatch", recording)


@pytest.mark.parametrize(
    ("config", "batch_size", "max_seq_len"),
    [
        # The seed's case: 16 prompts of 3,338 tokens, threshold 256.
        (PlannerConfig(max_num_batched_tokens=8192, long_prefill_token_threshold=256), 16, 3338),
        # A budget smaller than the batch: fewer rows, one token each.
        (PlannerConfig(max_num_batched_tokens=5), 8, 100),
        (PlannerConfig(max_num_batched_tokens=512, policy="packed", max_num_seqs=3), 8, 40),
    ],
)
@pytest.mark.parametrize("ops", PATHS)
def test_warmup_runs_the_planned_shapes_within_the_budget(
    config: PlannerConfig,
    batch_size: int,
    max_seq_len: int,
    ops: str,
    backends: Backends,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    backend = backends("tied", ops=ops)
    recorder = _Recorder(backend, monkeypatch)
    shapes = backend.warmup(
        config, batch_size=batch_size, max_seq_len=max_seq_len, page_size=PAGE[ops]
    )
    assert shapes == plan_warmup(config, batch_size=batch_size, max_seq_len=max_seq_len)
    assert recorder.tokens == [shape.num_tokens for shape in shapes]
    assert max(recorder.tokens) <= config.effective_budget


# -- misuse ------------------------------------------------------------------------------------


def test_a_foreign_cache_is_rejected(backends: Backends) -> None:
    backend = backends("tied")
    arrays, _ = _one_dispatch([5], [0], 4)
    with pytest.raises(InvalidInputError, match="'cache' must come from this backend"):
        backend.run_dispatch(_batch(arrays, logits=True, greedy=False), object())


def test_a_cache_of_another_layout_is_rejected_before_any_kernel_runs(backends: Backends) -> None:
    # As the reference backend does: another model's pages fail inside torch, and pages of
    # another dtype run and silently lose precision (bfloat16 pages for a float32 model).
    backend = backends("tied")  # 2 layers, 2 KV heads of 64, float32, on the CPU
    arrays, _ = _one_dispatch([5], [0], 4)
    batch = _batch(arrays, logits=True, greedy=False)
    layout = r"'cache' must have this backend's layout \(2 layers of \[2, 4, 2, 64\] "
    own = backend.new_cache(num_pages=2, page_size=4)
    # (A bfloat16 model's own pages are float32 on a CPU without bfloat16 kernels.)
    halved = PagedKVCache.allocate(
        num_layers=2, num_pages=2, page_size=4, num_kv_heads=2, head_dim=64,
        dtype=torch.bfloat16, device=torch.device("cpu"), heads_first=True,
    )  # fmt: skip
    slots_first = PagedKVCache.allocate(
        num_layers=2, num_pages=2, page_size=4, num_kv_heads=2, head_dim=64,
        dtype=torch.float32, device=torch.device("cpu"),
    )  # fmt: skip
    others = {
        "KV heads": (
            backends("untied").new_cache(num_pages=2, page_size=4),
            r"layer 0 key pages \[2, 4, 1, 128\]",
        ),
        "dtype": (halved, r"layer 0 key pages .* torch\.bfloat16"),
        # The NPU kernels' order, slots first: the torch path keeps KV heads first on the CPU.
        "memory order": (slots_first, r"layer 0 key pages strides \[512, 128, 64, 1\]"),
    }
    for other, found in others.values():
        with pytest.raises(
            InvalidInputError, match=layout + r"torch\.float32 on cpu, KV heads first\): " + found
        ):
            backend.run_dispatch(batch, other)
    with pytest.raises(InvalidInputError, match=layout + r".*\): 1 layers$"):
        backend.run_dispatch(batch, attrs.evolve(own, layers=own.layers[:1]))
    value = attrs.evolve(own.layers[1], value=own.layers[1].value[..., :32])
    with pytest.raises(InvalidInputError, match=r"layer 1 value pages \[2, 4, 2, 32\]"):
        backend.run_dispatch(batch, attrs.evolve(own, layers=(own.layers[0], value)))


def test_the_npu_path_rejects_another_backends_cache_of_pages_it_cannot_take(
    backends: Backends,
) -> None:
    arrays, _ = _one_dispatch([5], [0], 4)
    batch, npu = _batch(arrays, logits=True, greedy=False), backends("tied", ops="npu")
    torch_pages = backends("tied").new_cache(num_pages=2, page_size=4)  # KV heads first
    with pytest.raises(InvalidInputError, match=r"slots first\): layer 0 key pages strides"):
        npu.run_dispatch(batch, torch_pages)
    slots_first = PagedKVCache.allocate(
        num_layers=2, num_pages=2, page_size=4, num_kv_heads=2, head_dim=64,
        dtype=torch.float32, device=torch.device("cpu"),
    )  # fmt: skip
    with pytest.raises(InvalidInputError, match=r"'page_size' must be 128 .*: 4$"):
        npu.run_dispatch(batch, slots_first)


def test_a_dispatch_paged_differently_from_the_cache_is_rejected(backends: Backends) -> None:
    backend = backends("tied")
    arrays, _ = _one_dispatch([5], [0], 4)
    with pytest.raises(InvalidInputError, match="page_size must match the cache's 8: 4"):
        backend.run_dispatch(
            _batch(arrays, logits=True, greedy=False), backend.new_cache(num_pages=9, page_size=8)
        )
    two_pages, _ = _one_dispatch([3, 3], [0, 0], 4)
    one_page = backend.new_cache(num_pages=1, page_size=4)
    with pytest.raises(InvalidInputError, match=r"pages in \[0, 1\): page 1"):
        backend.run_dispatch(_batch(two_pages, logits=True, greedy=False), one_page)


@pytest.mark.parametrize("ops", PATHS)
@pytest.mark.parametrize("target", ["spare page", "other request's page"])
def test_a_write_outside_the_requests_pages_is_refused_before_any_kernel_runs(
    ops: str, target: str, backends: Backends
) -> None:
    backend, page = backends("tied", ops=ops), PAGE[ops]
    lengths = [6, 9]
    spare = sum(-(-n // page) for n in lengths)  # the page after the requests' own
    schedule = plan_prefill(lengths, PlannerConfig(max_num_batched_tokens=100))
    tables = plan_pages(lengths, page_size=page, num_pages=spare + 1)
    arrays = dispatch_arrays(schedule.dispatch(0), tables)
    slots = arrays.slot_mapping.copy()
    slots[7] = spare * page + 1 if target == "spare page" else 1  # request 1's position 1
    bad = attrs.evolve(arrays, slot_mapping=slots)
    cache = backend.new_cache(num_pages=spare + 1, page_size=page)
    message = (
        rf"row 1 would write position 1 of request 1 to slot {slots[7]} "
        rf"\(page {slots[7] // page}\), outside its pages "
        + re.escape(str(tables.table(1).tolist()))
    )
    with pytest.raises(InvalidInputError, match=message):
        backend.run_dispatch(_batch(bad, logits=True, greedy=False), cache)
    assert not any(kv.key.any() or kv.value.any() for kv in cache.layers)


@pytest.mark.parametrize("ops", PATHS)
@pytest.mark.parametrize("fault", ["spare page", "page not granted"])
def test_a_decode_write_outside_the_requests_pages_is_refused_before_any_kernel_runs(
    ops: str, fault: str, backends: Backends
) -> None:
    """A decode-only dispatch (one token per row at its context's last position) whose first
    row opens a new page: its token must land in that page, granted in its block table."""
    backend, page = backends("tied", ops=ops), PAGE[ops]
    lengths = [page + 1, 5]
    arrays, tables = _one_dispatch(lengths, [n - 1 for n in lengths], page)
    assert arrays.num_tokens == arrays.num_rows  # decode only
    spare = tables.num_pages
    slots, block_tables = arrays.slot_mapping.copy(), arrays.block_tables.copy()
    if fault == "spare page":
        slots[0] = spare * page
    else:  # the slot the new page would give, but the page is missing from the table
        block_tables[0, 1] = -1
    bad = attrs.evolve(arrays, slot_mapping=slots, block_tables=block_tables)
    cache = backend.new_cache(num_pages=spare + 1, page_size=page)
    owned = [int(p) for p in block_tables[0] if p >= 0]
    message = (
        rf"row 0 would write position {page} of request 0 to slot {slots[0]} "
        rf"\(page {slots[0] // page}\), outside its pages " + re.escape(str(owned))
    )
    with pytest.raises(InvalidInputError, match=message):
        backend.run_dispatch(_batch(bad, logits=False, greedy=True), cache)
    assert not any(kv.key.any() or kv.value.any() for kv in cache.layers)


def test_host_embeddings_of_the_wrong_shape_are_rejected(backends: Backends) -> None:
    backend = backends("tied")
    arrays, tables = _one_dispatch([5], [0], 4)
    wrong = np.zeros((5, backend.hidden_size + 1), dtype=np.float32)
    with pytest.raises(InvalidInputError, match=r"'input_embeddings' must be \[5, 64\]"):
        backend.run_dispatch(
            _batch(arrays, logits=True, greedy=False, embeddings=wrong),
            backend.new_cache(num_pages=tables.num_pages, page_size=4),
        )


def test_token_ids_outside_the_vocabulary_are_rejected(backends: Backends) -> None:
    backend = backends("tied")
    arrays, tables = _one_dispatch([3], [0], 4)
    batch = DispatchInput(
        arrays=arrays,
        token_ids=np.array([0, 101, 2]),
        input_embeddings=None,
        return_logits=True,
        return_greedy=False,
    )
    with pytest.raises(InvalidInputError, match=r"'token_ids' must be 3 ids in \[0, 101\)"):
        backend.run_dispatch(batch, backend.new_cache(num_pages=tables.num_pages, page_size=4))
    with pytest.raises(InvalidInputError, match="'token_ids' must be 1 ids"):
        backend.embed(np.array([-1]))


def test_the_npu_path_rejects_pages_its_kernel_cannot_take(backends: Backends) -> None:
    backend = backends("tied", ops="npu")
    for page in (16, 256, 512):
        with pytest.raises(InvalidInputError, match=rf"'page_size' must be 128 .*: {page}$"):
            backend.new_cache(num_pages=4, page_size=page)
    with pytest.raises(InvalidInputError, match="'num_pages' must be an int >= 1: 0"):
        backend.new_cache(num_pages=0, page_size=128)


@pytest.mark.parametrize("ops", PATHS)
def test_greedy_ids_from_non_finite_logits_are_refused(ops: str, backends: Backends) -> None:
    # Only ids come back on the greedy path, so the driver cannot see the logits: the argmax
    # of a NaN row would be a valid-looking id unless the backend refuses it.
    model = backends("tied", ops=ops).model
    backend = NpuBackend(attrs.evolve(model, norm=torch.full_like(model.norm, float("nan"))))
    config = PlannerConfig(max_num_batched_tokens=256)
    with pytest.raises(ExecutionError, match="dispatch 0") as raised:
        generate(backend, [[1, 2, 3], [4]], config=config, max_new_tokens=3, kv_page_size=PAGE[ops])
    assert raised.value.dispatch == 0
    assert isinstance(raised.value.__cause__, BackendError)
    assert "logits must be finite to give greedy ids: final row 0 (request 0)" in str(raised.value)


def test_bad_options_are_rejected(checkpoints: dict[str, Path]) -> None:
    with pytest.raises(InvalidInputError, match="'dtype' must be one of"):
        NpuBackend.from_checkpoint(checkpoints["tied"], dtype="int8")
    with pytest.raises(InvalidInputError, match="'ops' must be one of"):
        NpuBackend.from_checkpoint(checkpoints["tied"], ops="gpu")  # type: ignore[arg-type]
    for device in ("abc", 5):
        with pytest.raises(
            InvalidInputError, match=rf"^'device' must be a torch device .*: {device!r}$"
        ):
            NpuBackend.from_checkpoint(checkpoints["tied"], device=device)  # type: ignore[arg-type]
    # Devices torch names but the backend does not run on: refused before loading anything,
    # not a bare AssertionError from torch (cuda) or a failure at the first dispatch (meta).
    for other in ("cuda", "cuda:0", "meta", torch.device("meta"), "xpu"):
        with pytest.raises(InvalidInputError, match=r"^'device' must be an NPU or CPU device") as e:
            load_backend("npu", checkpoint=checkpoints["tied"], device=other)
        assert str(e.value).endswith(f": {other!r}")
    with pytest.raises(
        CheckpointError, match=r"^the checkpoint directory must be a path .*: 5 \(int\)$"
    ):
        load_backend("npu", checkpoint=5)


def test_metadata_follows_the_checkpoint(backends: Backends) -> None:
    backend = backends("untied", dtype="bfloat16")
    assert (backend.vocab_size, backend.hidden_size) == (101, 96)
    assert backend.dtype == torch.bfloat16
    assert backend.tolerance > backends("untied").tolerance
    assert "ops='torch'" in repr(backend)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_keeps_its_promise_on_a_deeper_model_with_larger_logits(
    tmp_path: Path, dtype: str
) -> None:
    """Rounding errs in proportion to the logits' size: on 8 layers with weights of unit
    gain (logits of about 10, where the tiny models' are about 1) an absolute tolerance
    alone (0.1 in bfloat16, 0.02 in float16) was broken by chunking, 0.109 and 0.0215. The
    relative term keeps the promise, and check_backend holds the backend to it."""
    transformers = pytest.importorskip("transformers", reason="the checkpoint is written by it")
    torch.manual_seed(0)
    config = transformers.Qwen3Config(
        vocab_size=101, hidden_size=128, intermediate_size=256, num_hidden_layers=8,
        num_attention_heads=2, num_key_value_heads=1, head_dim=64,
        max_position_embeddings=1024, tie_word_embeddings=False,
    )  # fmt: skip
    model = transformers.Qwen3ForCausalLM(config).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if parameter.ndim == 2:  # unit gain; embeddings and the head three times that
                gain = 3.0 if "embed" in name or "lm_head" in name else 1.0
                parameter.copy_(gain * torch.randn_like(parameter) / parameter.shape[1] ** 0.5)
            else:
                parameter.copy_(1 + 0.3 * torch.randn_like(parameter))
    model.save_pretrained(tmp_path)
    backend = NpuBackend.from_checkpoint(tmp_path, dtype=dtype, device="cpu", ops="torch")
    assert backend.relative_tolerance == 4 * torch.finfo(getattr(torch, dtype)).eps
    check_backend(backend, max_examples=20, generation_examples=0, page_sizes=(16,))


def test_an_option_the_npu_backend_does_not_take_is_refused_by_name(
    checkpoints: dict[str, Path],
) -> None:
    with pytest.raises(InvalidInputError, match=r"^unknown options \[.seed.\]"):
        load_backend("npu", checkpoint=checkpoints["tied"], seed=0)


def test_a_weight_beyond_float16s_range_is_refused_when_loaded_not_run_as_nan(
    checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    import shutil

    from safetensors.numpy import load_file, save_file

    shutil.copytree(checkpoints["tied"], tmp_path, dirs_exist_ok=True)
    path = tmp_path / "model.safetensors"
    tensors = load_file(path)
    name = "model.layers.0.mlp.down_proj.weight"
    tensors[name][1, 2] = 1e5  # float16 holds at most 65504
    save_file(tensors, path, metadata={"format": "pt"})
    with pytest.raises(
        CheckpointError,
        match=rf"tensor '{re.escape(name)}' holds 100000 at \[1, 2\], beyond torch.float16's "
        r"range \(at most 65504\)",
    ):
        NpuBackend.from_checkpoint(tmp_path, dtype="float16", device="cpu")
    assert NpuBackend.from_checkpoint(tmp_path, dtype="bfloat16", device="cpu").dtype == (
        torch.bfloat16
    )
