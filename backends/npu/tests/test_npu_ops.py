"""The two op sets agree, and the fake torch_npu rejects every call that breaks a documented
constraint of the real kernel (so a marshalling slip in the NPU path fails on CPU)."""

from __future__ import annotations

from types import ModuleType, SimpleNamespace
from typing import Any

import attrs
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pypto_sched import (
    PagePool,
    PlannerConfig,
    StepChunk,
    dispatch_arrays,
    plan_pages,
    plan_prefill,
)

pytest.importorskip("torch", reason="the npu backend runs on torch")

import torch
import torch.nn.functional as F

from pypto_sched_npu import PagedKVCache
from pypto_sched_npu.ops import AttentionShape, NpuOps, TorchOps, _torch_ops
from pypto_sched_npu.ops._npu_ops import NpuAttention, NpuDecodeAttention, causal_mask
from pypto_sched_npu.ops._torch_ops import (
    OneTokenRows,
    RowGroup,
    TorchAttention,
    _row_groups,
)

SHAPE = AttentionShape(num_heads=4, num_kv_heads=2, head_dim=64)


@pytest.fixture
def npu_ops(fake_npu_module: ModuleType) -> NpuOps:
    return NpuOps(fake_npu_module)


def _random(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def test_projection_weights_keep_their_shape_and_values_in_each_layout(npu_ops: NpuOps) -> None:
    weight = _random(6, 4)
    portable, npu = TorchOps().projection_weight(weight), npu_ops.projection_weight(weight)
    torch.testing.assert_close(portable, weight, rtol=0, atol=0)
    torch.testing.assert_close(npu, weight, rtol=0, atol=0)
    assert portable.t().is_contiguous()  # stored [in, out] on the portable path
    assert npu.is_contiguous()  # as stored, [out, in], for the NPU's matmuls
    x = _random(3, 4, seed=1)
    torch.testing.assert_close(F.linear(x, portable), x @ weight.t())


def test_rms_norm_swiglu_and_rotary_agree(npu_ops: NpuOps, fake_npu_module: ModuleType) -> None:
    torch_ops = TorchOps()
    x, weight = _random(7, 4, 64), _random(64, seed=1)
    torch.testing.assert_close(
        npu_ops.rms_norm(x, weight, 1e-6), torch_ops.rms_norm(x, weight, 1e-6)
    )
    gate_up = _random(7, 96)
    gated = F.silu(gate_up[:, :48]) * gate_up[:, 48:]
    # Each on its own copy: the torch op computes in place in the gate half.
    torch.testing.assert_close(npu_ops.swiglu(gate_up.clone()), gated)
    torch.testing.assert_close(torch_ops.swiglu(gate_up.clone()), gated)
    angles = _random(7, 64, seed=2)
    cos, sin = torch.cat((angles, angles), -1).cos(), torch.cat((angles, angles), -1).sin()
    for dim, kernel_calls in ((128, 1), (64, 0), (32, 0)):  # 64 and 32: the portable rotary
        fake_npu_module.reset_calls()
        q, k = _random(7, 4, dim, seed=3), _random(7, 2, dim, seed=4)
        expected = torch_ops.rotary(q, k, cos[:, :dim], sin[:, :dim])
        got = npu_ops.rotary(q.clone(), k.clone(), cos[:, :dim], sin[:, :dim])
        torch.testing.assert_close(got, expected)
        assert fake_npu_module.CALLS["npu_apply_rotary_pos_emb"] == kernel_calls


def _dispatch(page: int) -> Any:
    """One dispatch of three rows: a fresh prompt, a chunk after a cached prefix, and one
    token after a long prefix (so the block tables are padded)."""
    lengths, computed = [40, 300, 200], [0, 130, 199]
    schedule = plan_prefill(
        lengths, PlannerConfig(max_num_batched_tokens=512), num_computed_tokens=computed
    )
    tables = plan_pages(lengths, page_size=page, num_pages=sum(-(-n // page) for n in lengths))
    arrays = dispatch_arrays(schedule.dispatch(0), tables)
    assert (arrays.block_tables == -1).any()
    return arrays, tables


def _filled_cache(tables: Any, seed: int, *, heads_first: bool = False) -> PagedKVCache:
    cache = PagedKVCache.allocate(
        num_layers=1,
        num_pages=tables.num_pages,
        page_size=tables.page_size,
        num_kv_heads=SHAPE.num_kv_heads,
        head_dim=SHAPE.head_dim,
        dtype=torch.float32,
        device=torch.device("cpu"),
        heads_first=heads_first,
    )
    cache.layers[0].key.copy_(_random(*cache.layers[0].key.shape, seed=seed))
    cache.layers[0].value.copy_(_random(*cache.layers[0].value.shape, seed=seed + 1))
    return cache


def _own_cache(ops: TorchOps | NpuOps, tables: Any, seed: int) -> PagedKVCache:
    """A random cache in the memory order ``ops`` keep on the CPU (KV heads first for the
    torch path, slots first for the NPU path): each path checked on its own layout."""
    heads_first = ops.kv_heads_first(torch.device("cpu"))
    return _filled_cache(tables, seed, heads_first=heads_first)


def test_the_torch_path_keeps_its_cpu_pages_kv_heads_first(npu_ops: NpuOps) -> None:
    cpu = torch.device("cpu")
    assert TorchOps().kv_heads_first(cpu)
    assert not TorchOps().kv_heads_first(torch.device("cuda"))
    assert not npu_ops.kv_heads_first(cpu)
    _, tables = _dispatch(128)
    pages = _own_cache(TorchOps(), tables, seed=8).layers[0].key
    assert list(pages.shape) == [tables.num_pages, 128, SHAPE.num_kv_heads, SHAPE.head_dim]
    assert pages.transpose(1, 2).is_contiguous()
    # The same values as the slots-first cache made from the same numbers.
    assert torch.equal(pages, _filled_cache(tables, seed=8).layers[0].key)


def test_paged_attention_agrees_on_both_paths(npu_ops: NpuOps) -> None:
    arrays, tables = _dispatch(128)
    tokens = arrays.num_tokens
    query = _random(tokens, SHAPE.num_heads, SHAPE.head_dim, seed=5)
    key = _random(tokens, SHAPE.num_kv_heads, SHAPE.head_dim, seed=6)
    value = _random(tokens, SHAPE.num_kv_heads, SHAPE.head_dim, seed=7)
    outputs, caches = [], []
    for ops in (TorchOps(), npu_ops):
        cache = _own_cache(ops, tables, seed=8)
        attention = ops.attention(arrays, SHAPE, device=torch.device("cpu"), dtype=torch.float32)
        attention.write_kv(key, value, cache.layers[0])
        outputs.append(attention.attend(query, cache.layers[0]))
        caches.append(cache)
    torch.testing.assert_close(outputs[1], outputs[0], atol=1e-5, rtol=1e-5)
    assert torch.equal(caches[0].layers[0].key, caches[1].layers[0].key)
    assert torch.equal(caches[0].layers[0].value, caches[1].layers[0].value)


def test_fresh_prompts_of_different_lengths_attend_causally_and_agree(npu_ops: NpuOps) -> None:
    """Rows whose chunk is their whole context take the kernel's causal flag instead of a
    mask, padded to the group's longest chunk, and agree with the NPU path's reference."""
    lengths = [200, 150, 255, 129]
    schedule = plan_prefill(lengths, PlannerConfig(max_num_batched_tokens=1024))
    tables = plan_pages(lengths, page_size=128, num_pages=sum(-(-n // 128) for n in lengths))
    arrays = dispatch_arrays(schedule.dispatch(0), tables)
    assert schedule.num_dispatches == 1
    torch_attention = TorchOps().attention(
        arrays, SHAPE, device=torch.device("cpu"), dtype=torch.float32
    )
    [group] = torch_attention.groups
    assert isinstance(group, RowGroup)
    assert group.causal
    assert group.mask is None
    assert group.padded_index is not None
    query = _random(arrays.num_tokens, SHAPE.num_heads, SHAPE.head_dim, seed=5)
    key = _random(arrays.num_tokens, SHAPE.num_kv_heads, SHAPE.head_dim, seed=6)
    value = _random(arrays.num_tokens, SHAPE.num_kv_heads, SHAPE.head_dim, seed=7)
    outputs = []
    for attention, ops in (
        (torch_attention, TorchOps()),
        (
            npu_ops.attention(arrays, SHAPE, device=torch.device("cpu"), dtype=torch.float32),
            npu_ops,
        ),
    ):
        cache = _own_cache(ops, tables, seed=8)
        attention.write_kv(key, value, cache.layers[0])
        outputs.append(attention.attend(query, cache.layers[0]))
    torch.testing.assert_close(outputs[1], outputs[0], atol=1e-5, rtol=1e-5)
    # A prompt's first token sees only itself: its output is its value, per query group.
    second = int(arrays.cu_seqlens[1])
    torch.testing.assert_close(outputs[0][second], value[second].repeat_interleave(2, dim=0))


def _decode_dispatch(page: int) -> Any:
    """One decode-only dispatch: four rows of one token at each context's last position (a
    first token, one opening a second page, a long context, a short one)."""
    lengths = [1, 129, 300, 17]
    schedule = plan_prefill(
        lengths,
        PlannerConfig(max_num_batched_tokens=512),
        num_computed_tokens=[n - 1 for n in lengths],
    )
    tables = plan_pages(lengths, page_size=page, num_pages=sum(-(-n // page) for n in lengths))
    arrays = dispatch_arrays(schedule.dispatch(0), tables)
    assert arrays.num_tokens == arrays.num_rows == len(lengths)
    return arrays, tables


@pytest.mark.parametrize("page", [128, 16])
def test_decode_only_attention_agrees_on_both_paths(
    page: int, npu_ops: NpuOps, fake_npu_module: ModuleType
) -> None:
    arrays, tables = _decode_dispatch(page)
    query = _random(arrays.num_tokens, SHAPE.num_heads, SHAPE.head_dim, seed=5)
    key = _random(arrays.num_tokens, SHAPE.num_kv_heads, SHAPE.head_dim, seed=6)
    value = _random(arrays.num_tokens, SHAPE.num_kv_heads, SHAPE.head_dim, seed=7)
    outputs, caches = [], []
    fake_npu_module.reset_calls()
    for ops in (TorchOps(), npu_ops):
        cache = _own_cache(ops, tables, seed=8)
        attention = ops.attention(arrays, SHAPE, device=torch.device("cpu"), dtype=torch.float32)
        attention.write_kv(key, value, cache.layers[0])
        outputs.append(attention.attend(query, cache.layers[0]))
        caches.append(cache)
    assert dict(fake_npu_module.LAYOUTS) == {"BSH": 1}
    assert outputs[1].shape == query.shape
    torch.testing.assert_close(outputs[1], outputs[0], atol=1e-5, rtol=1e-5)
    assert torch.equal(caches[0].layers[0].key, caches[1].layers[0].key)
    # The first row's only key is its own: its output is its value, repeated per group.
    torch.testing.assert_close(outputs[0][0], value[0].repeat_interleave(2, dim=0))


@st.composite
def _generation_dispatches(draw: st.DrawFn) -> tuple[Any, PagePool[int]]:
    """A dispatch of a generation: rows of one token (decode) or more (prefill chunks) at
    the end of contexts whose pages a pool handed out one at a time, round robin, so that
    block tables interleave and a page freed by a finished request is reused."""
    decode_only = draw(st.booleans())
    page = draw(st.sampled_from([16, 32, 128] if decode_only else [128]))
    contexts = draw(st.lists(st.integers(1, 300), min_size=1, max_size=5))
    lengths = [1 if decode_only else draw(st.integers(1, min(c, 40))) for c in contexts]
    num_pages = sum(-(-c // page) for c in contexts) + 1
    pool: PagePool[int] = PagePool(num_pages=num_pages, page_size=page)
    pool = pool.hold(-1, 1)  # a request that leaves after the first round
    for held in range(page, max(contexts) + page, page):
        for request, context in enumerate(contexts):
            pool = pool.hold(request, min(held, context))
        if held == page:
            pool = pool.release(-1)  # its page goes to whoever grows next
    rows = {
        r: StepChunk(start=c - n, length=n, is_final=True)
        for r, (c, n) in enumerate(zip(contexts, lengths, strict=True))
    }
    return dispatch_arrays(rows, pool), pool


@settings(max_examples=30, deadline=None)
@given(dispatch=_generation_dispatches())
def test_both_op_paths_agree_on_any_generation_dispatch(
    dispatch: tuple[Any, PagePool[int]], fake_npu_module: ModuleType
) -> None:
    arrays, pool = dispatch
    npu_ops = NpuOps(fake_npu_module)
    tables = pool.block_tables(list(range(arrays.num_rows)))
    query = _random(arrays.num_tokens, SHAPE.num_heads, SHAPE.head_dim, seed=5)
    key = _random(arrays.num_tokens, SHAPE.num_kv_heads, SHAPE.head_dim, seed=6)
    value = _random(arrays.num_tokens, SHAPE.num_kv_heads, SHAPE.head_dim, seed=7)
    outputs, caches = [], []
    fake_npu_module.reset_calls()
    for ops in (TorchOps(), npu_ops):
        cache = _own_cache(ops, tables, seed=8)
        attention = ops.attention(arrays, SHAPE, device=torch.device("cpu"), dtype=torch.float32)
        attention.write_kv(key, value, cache.layers[0])
        outputs.append(attention.attend(query, cache.layers[0]))
        caches.append(cache)
    layout = "BSH" if arrays.num_tokens == arrays.num_rows else "TND"
    assert dict(fake_npu_module.LAYOUTS) == {layout: 1}
    torch.testing.assert_close(outputs[1], outputs[0], atol=1e-5, rtol=1e-5)
    assert torch.equal(caches[0].layers[0].key, caches[1].layers[0].key)
    assert torch.equal(caches[0].layers[0].value, caches[1].layers[0].value)


@st.composite
def _prefill_dispatches(draw: st.DrawFn) -> tuple[Any, Any]:
    """A dispatch of a chunked prefill (some rows intermediate, some final, some after a
    cached prefix) and its block tables."""
    lengths = draw(st.lists(st.integers(1, 300), min_size=1, max_size=4))
    computed = [draw(st.integers(0, n - 1)) for n in lengths]
    config = PlannerConfig(
        max_num_batched_tokens=draw(st.integers(16, 400)),
        long_prefill_token_threshold=draw(st.sampled_from([8, 64, 512])),
        policy=draw(st.sampled_from(["round_robin", "packed"])),
    )
    schedule = plan_prefill(lengths, config, num_computed_tokens=computed)
    index = draw(st.integers(0, schedule.num_dispatches - 1))
    tables = plan_pages(lengths, page_size=128, num_pages=sum(-(-n // 128) for n in lengths))
    return dispatch_arrays(schedule.dispatch(index), tables), tables


@settings(max_examples=25, deadline=None)
@given(dispatch=_prefill_dispatches())
def test_final_rows_last_tokens_attend_as_one_token_rows_as_in_their_chunks(
    dispatch: tuple[Any, Any], fake_npu_module: ModuleType
) -> None:
    """What the model's last layer relies on: attending only the final rows' last tokens,
    as one-token rows (``DispatchArrays.last_tokens``), gives the rows of the whole dispatch's
    attention at those tokens, on both paths."""
    arrays, tables = dispatch
    last = arrays.last_tokens()
    finals = np.flatnonzero(arrays.is_final)
    np.testing.assert_array_equal(last.seq_lens, arrays.seq_lens[finals])
    np.testing.assert_array_equal(last.positions, arrays.seq_lens[finals] - 1)
    np.testing.assert_array_equal(
        last.slot_mapping, [arrays.context_slots(row)[-1] for row in finals]
    )
    np.testing.assert_array_equal(last.cu_seqlens, np.arange(finals.size + 1))
    if not finals.size:
        return
    keep = torch.from_numpy(np.array(arrays.logits_indices))
    query = _random(arrays.num_tokens, SHAPE.num_heads, SHAPE.head_dim, seed=5)
    key = _random(arrays.num_tokens, SHAPE.num_kv_heads, SHAPE.head_dim, seed=6)
    value = _random(arrays.num_tokens, SHAPE.num_kv_heads, SHAPE.head_dim, seed=7)
    for ops in (TorchOps(), NpuOps(fake_npu_module)):
        cache = _own_cache(ops, tables, seed=8)
        cpu, f32 = torch.device("cpu"), torch.float32
        whole = ops.attention(arrays, SHAPE, device=cpu, dtype=f32)
        whole.write_kv(key, value, cache.layers[0])
        expected = whole.attend(query, cache.layers[0])[keep]
        kept = ops.attention(last, SHAPE, device=cpu, dtype=f32)
        got = kept.attend(query[keep], cache.layers[0])
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


@given(
    rows=st.lists(
        st.integers(1, 4096).flatmap(lambda c: st.tuples(st.integers(1, c), st.just(c))),
        min_size=1,
        max_size=40,
    )
)
def test_torch_row_groups_partition_the_rows_and_at_most_double_a_rows_padding(
    rows: list[tuple[int, int]],
) -> None:
    query_lens = np.array([q for q, _ in rows], dtype=np.int64)
    seq_lens = np.array([c for _, c in rows], dtype=np.int64)
    groups = _row_groups(query_lens, seq_lens)
    assert sorted(np.concatenate(groups).tolist()) == list(range(len(rows)))
    for group in groups:
        assert group.tolist() == sorted(group.tolist())
        longest_chunk, longest_context = query_lens[group].max(), seq_lens[group].max()
        assert (longest_chunk < 2 * query_lens[group]).all()
        assert (longest_context <= 2 * seq_lens[group]).all()


def test_decode_rows_of_similar_contexts_share_one_group() -> None:
    groups = _row_groups(np.ones(5, dtype=np.int64), np.array([300, 160, 299, 151, 200]))
    assert [g.tolist() for g in groups] == [[0, 1, 2, 3, 4]]
    mixed = _row_groups(np.array([1, 1, 256, 1]), np.array([300, 40, 1000, 290]))
    assert sorted(g.tolist() for g in mixed) == [[0, 3], [1], [2]]


def test_a_dispatch_with_a_longer_row_takes_the_prefill_call(
    npu_ops: NpuOps, fake_npu_module: ModuleType
) -> None:
    arrays, tables = _dispatch(128)  # its last row is one token, the others are not
    fake_npu_module.reset_calls()
    attention = npu_ops.attention(arrays, SHAPE, device=torch.device("cpu"), dtype=torch.float32)
    query = _random(arrays.num_tokens, SHAPE.num_heads, SHAPE.head_dim)
    attention.attend(query, _filled_cache(tables, seed=1).layers[0])
    assert dict(fake_npu_module.LAYOUTS) == {"TND": 1}


@pytest.mark.parametrize(
    ("cann", "head_dim", "dtype", "problem"),
    [
        ("8.3.RC1", 64, torch.float32, None),  # float32 pages: CPU tensors, the fake only
        ("8.5.0", 128, torch.bfloat16, None),
        ("10.0.RC1", 64, torch.bfloat16, None),
        ("8.2.RC1", 64, torch.bfloat16, "CANN 8.2.RC1 is older than 8.3"),
        (None, 64, torch.bfloat16, "CANN None is older than 8.3 or unknown"),
        ("8.3.RC1", 32, torch.bfloat16, "head_dim 32 is not one of [64, 128]"),
        ("8.3.RC1", 192, torch.bfloat16, "head_dim 192"),
        ("8.3.RC1", 128, torch.float16, "takes bfloat16, not float16"),
    ],
)
def test_prefill_dispatches_take_the_portable_attention_where_the_tnd_call_cannot_run(
    cann: str | None,
    head_dim: int,
    dtype: torch.dtype,
    problem: str | None,
    fake_npu_module: ModuleType,
) -> None:
    ops = NpuOps(fake_npu_module, cann_version=cann)
    shape = AttentionShape(num_heads=4, num_kv_heads=2, head_dim=head_dim)
    cpu = torch.device("cpu")
    if problem is None:
        assert ops.prefill_problem(shape, dtype) is None
    else:
        assert problem in (ops.prefill_problem(shape, dtype) or "")
    arrays, _ = _dispatch(128)
    prefill = ops.attention(arrays, shape, device=cpu, dtype=dtype)
    assert isinstance(prefill, NpuAttention if problem is None else TorchAttention)
    decode, _ = _decode_dispatch(128)  # the decode call has none of these limits
    assert isinstance(ops.attention(decode, shape, device=cpu, dtype=dtype), NpuDecodeAttention)


def test_the_cann_version_is_what_torch_npu_reports(
    fake_npu_module: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert NpuOps(fake_npu_module).cann_version == fake_npu_module.CANN_VERSION
    monkeypatch.setattr(torch.version, "cann", "8.2.RC1", raising=False)
    assert NpuOps(fake_npu_module).cann_version == "8.2.RC1"
    monkeypatch.delattr(torch.version, "cann")
    assert NpuOps(fake_npu_module).cann_version is None


def test_the_portable_fallback_writes_and_attends_as_the_torch_path(
    fake_npu_module: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under an older CANN a prefill dispatch calls no attention kernel and still gives the
    torch path's K/V and outputs (the fake would refuse a TND call there)."""
    monkeypatch.setattr(torch.version, "cann", "8.2.RC1")
    arrays, tables = _dispatch(128)
    query = _random(arrays.num_tokens, SHAPE.num_heads, SHAPE.head_dim, seed=5)
    key = _random(arrays.num_tokens, SHAPE.num_kv_heads, SHAPE.head_dim, seed=6)
    value = _random(arrays.num_tokens, SHAPE.num_kv_heads, SHAPE.head_dim, seed=7)
    fake_npu_module.reset_calls()
    outputs, caches = [], []
    for ops in (TorchOps(), NpuOps(fake_npu_module)):
        cache = _own_cache(ops, tables, seed=8)
        attention = ops.attention(arrays, SHAPE, device=torch.device("cpu"), dtype=torch.float32)
        attention.write_kv(key, value, cache.layers[0])
        outputs.append(attention.attend(query, cache.layers[0]))
        caches.append(cache)
    assert not fake_npu_module.CALLS
    torch.testing.assert_close(outputs[1], outputs[0], rtol=0, atol=0)
    assert torch.equal(caches[0].layers[0].key, caches[1].layers[0].key)


def test_float32_pages_become_bfloat16_on_a_real_npu_only(npu_ops: NpuOps) -> None:
    npu: Any = SimpleNamespace(type="npu")
    cpu = torch.device("cpu")
    assert npu_ops.kv_cache_dtype(torch.float32, npu) == torch.bfloat16
    assert npu_ops.kv_cache_dtype(torch.float16, npu) == torch.float16
    assert npu_ops.kv_cache_dtype(torch.float32, cpu) == torch.float32
    assert TorchOps().kv_cache_dtype(torch.float32, npu) == torch.float32


# -- the fake enforces the documented constraints ------------------------------------------------


def _attention_call(page: int = 128) -> dict[str, Any]:
    """Keyword arguments of a valid attention call, as the NPU path marshals them."""
    arrays, tables = _dispatch(page)
    cache = _filled_cache(tables, seed=9).layers[0]
    table = np.where(arrays.block_tables < 0, 0, arrays.block_tables).astype(np.int32)
    return {
        "query": _random(arrays.num_tokens, SHAPE.num_heads, SHAPE.head_dim).bfloat16(),
        "key": cache.key.view(tables.num_pages, page, -1).bfloat16(),
        "value": cache.value.view(tables.num_pages, page, -1).bfloat16(),
        "atten_mask": causal_mask(torch.device("cpu")),
        "block_table": torch.from_numpy(table),
        "input_layout": "TND",
        "block_size": page,
        "actual_seq_lengths": arrays.cu_seqlens[1:].tolist(),
        "actual_seq_lengths_kv": arrays.seq_lens.tolist(),
        "num_heads": SHAPE.num_heads,
        "num_key_value_heads": SHAPE.num_kv_heads,
        "scale": SHAPE.scale,
        "sparse_mode": 3,
    }


def test_the_fake_accepts_the_npu_paths_attention_call(fake_npu_module: ModuleType) -> None:
    out, _ = fake_npu_module.npu_fused_infer_attention_score(**_attention_call())
    assert out.dtype == torch.bfloat16


def _narrow_heads(call: dict[str, Any]) -> None:
    """The same call with head_dim 32 (half of each head)."""
    call["query"] = call["query"][..., :32].contiguous()
    for name in ("key", "value"):
        pages, page, hidden = call[name].shape
        heads = hidden // SHAPE.head_dim
        call[name] = call[name].view(pages, page, heads, -1)[..., :32].reshape(pages, page, -1)


def _padded_table(call: dict[str, Any]) -> None:
    call["block_table"] = call["block_table"].clone()
    call["block_table"][0, -1] = -1


@pytest.mark.parametrize(
    ("change", "rule"),
    [
        (lambda c: c.update(input_layout="BNSD"), "input_layout 'TND' .* and 'BSH'"),
        (lambda c: c.update(input_layout="BSH"), "S must be 1"),
        (lambda c: c.update(query=c["query"].float().to(torch.float64)), "float16 or bfloat16"),
        (lambda c: c.update(actual_seq_lengths=[40, 211, 1]), "must be cumulative"),
        (lambda c: c.update(actual_seq_lengths=np.array([40, 210, 211])), "list of ints"),
        (
            lambda c: c.update(actual_seq_lengths_kv=np.cumsum([40, 300, 200]).tolist()),
            "block_table must hold",
        ),
        (lambda c: c.update(actual_seq_lengths_kv=[40, 100, 200]), "kv length must be >="),
        (lambda c: c.update(block_table=c["block_table"].long()), "block_table must be int32"),
        (_padded_table, "every entry must be in"),
        (lambda c: c.update(atten_mask=None), "requires atten_mask"),
        (lambda c: c.update(atten_mask=c["atten_mask"][:1024, :1024]), "2048x2048 mask"),
        (lambda c: c.update(atten_mask=c["atten_mask"].T.contiguous()), "strictly above"),
        (lambda c: c.update(sparse_mode=0), "sparse_mode 3"),
        (lambda c: c.update(num_heads=2), "num_heads 2 must equal"),
        (lambda c: c.update(block_size=64), "block_size 128 only: 64"),
        (
            lambda c: c.update({n: c[n].half() for n in ("query", "key", "value")}),
            "TND takes bfloat16 only",
        ),
        (_narrow_heads, "takes head_dim 64 or 128: 32"),
    ],
)
def test_the_fake_rejects_a_broken_attention_call(
    change: Any, rule: str, fake_npu_module: ModuleType
) -> None:
    call = _attention_call()
    change(call)
    with pytest.raises(AssertionError, match=rule):
        fake_npu_module.npu_fused_infer_attention_score(**call)


def test_the_fake_takes_at_most_4096_rows_in_a_tnd_call(fake_npu_module: ModuleType) -> None:
    rows = 4097  # one query token and one key each
    call = _attention_call()
    call.update(
        query=torch.zeros(rows, SHAPE.num_heads, SHAPE.head_dim, dtype=torch.bfloat16),
        actual_seq_lengths=list(range(1, rows + 1)),
        actual_seq_lengths_kv=[1] * rows,
        block_table=torch.zeros(rows, 1, dtype=torch.int32),
    )
    with pytest.raises(AssertionError, match="TND takes at most 4096 rows"):
        fake_npu_module.npu_fused_infer_attention_score(**call)
    call.update(
        query=call["query"][:4096].contiguous(),
        actual_seq_lengths=call["actual_seq_lengths"][:4096],
        actual_seq_lengths_kv=[1] * 4096,
        block_table=call["block_table"][:4096],
    )
    fake_npu_module.npu_fused_infer_attention_score(**call)


def test_a_dispatch_of_more_rows_than_a_call_takes_attends_with_the_portable_path(
    npu_ops: NpuOps,
) -> None:
    """A budget above 4,096 tokens plans mixed dispatches of more rows than the TND call
    takes (one-token rows beside a longer one): the portable attention runs them."""
    cpu = torch.device("cpu")
    for ones, want in [(4095, NpuAttention), (4096, TorchAttention)]:
        lengths = [1] * ones + [2]
        schedule = plan_prefill(lengths, PlannerConfig(max_num_batched_tokens=8192))
        tables = plan_pages(lengths, page_size=128, num_pages=len(lengths))
        arrays = dispatch_arrays(schedule.dispatch(0), tables)
        assert arrays.num_rows == ones + 1
        problem = npu_ops.rows_problem(arrays, decode_only=False)
        assert (problem is None) == (want is NpuAttention)
        attention = npu_ops.attention(arrays, SHAPE, device=cpu, dtype=torch.float32)
        assert type(attention) is want
    arrays, _ = _decode_dispatch(128)
    assert npu_ops.rows_problem(arrays, decode_only=True) is None
    long_row = _with_longest_row(arrays, 262145)
    assert "262145 keys" in (npu_ops.rows_problem(long_row, decode_only=True) or "")


def _with_longest_row(arrays: Any, longest: int) -> Any:
    """``arrays`` as seen by ``rows_problem`` with one row of ``longest`` keys."""
    seq_lens = arrays.seq_lens.copy()
    seq_lens[0] = longest
    return SimpleNamespace(num_rows=arrays.num_rows, seq_lens=seq_lens)


@pytest.mark.parametrize("page", [16, 256])
def test_the_fake_takes_only_128_slot_blocks_for_prefill(
    page: int, fake_npu_module: ModuleType
) -> None:
    with pytest.raises(AssertionError, match=f"block_size 128 only: {page}"):
        fake_npu_module.npu_fused_infer_attention_score(**_attention_call(page=page))


@pytest.mark.parametrize("cann", ["8.2.RC1", "7.0.0", "", None])
def test_the_fake_refuses_the_prefill_call_before_cann_8_3(
    cann: str | None, fake_npu_module: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.version, "cann", cann, raising=False)
    with pytest.raises(AssertionError, match=r"needs CANN >= 8\.3"):
        fake_npu_module.npu_fused_infer_attention_score(**_attention_call())
    fake_npu_module.npu_fused_infer_attention_score(**_decode_call())  # decode: any CANN


def _decode_call(page: int = 128) -> dict[str, Any]:
    """Keyword arguments of a valid decode-only attention call, as the NPU path marshals them."""
    arrays, tables = _decode_dispatch(page)
    cache = _filled_cache(tables, seed=9).layers[0]
    table = np.where(arrays.block_tables < 0, 0, arrays.block_tables).astype(np.int32)
    rows = arrays.num_rows
    return {
        "query": _random(rows, 1, SHAPE.num_heads * SHAPE.head_dim).half(),
        "key": cache.key.view(tables.num_pages, page, -1).half(),
        "value": cache.value.view(tables.num_pages, page, -1).half(),
        "block_table": torch.from_numpy(table),
        "input_layout": "BSH",
        "block_size": page,
        "actual_seq_lengths": [1] * rows,
        "actual_seq_lengths_kv": arrays.seq_lens.tolist(),
        "num_heads": SHAPE.num_heads,
        "num_key_value_heads": SHAPE.num_kv_heads,
        "scale": SHAPE.scale,
    }


@pytest.mark.parametrize("page", [128, 16])
def test_the_fake_accepts_the_npu_paths_decode_call(page: int, fake_npu_module: ModuleType) -> None:
    call = _decode_call(page)
    out, _ = fake_npu_module.npu_fused_infer_attention_score(**call)
    assert out.shape == call["query"].shape
    assert out.dtype == torch.float16
    call.pop("actual_seq_lengths")  # optional for one query token per row
    again, _ = fake_npu_module.npu_fused_infer_attention_score(**call)
    assert torch.equal(again, out)


@pytest.mark.parametrize(
    ("change", "rule"),
    [
        (lambda c: c.update(query=c["query"].view(2, 2, -1)), "S must be 1: 2"),
        (lambda c: c.update(actual_seq_lengths=[1, 2, 3, 4]), "not cumulative"),
        (lambda c: c.update(actual_seq_lengths=[1, 1]), "B = 4 entries"),
        (lambda c: c.update(atten_mask=causal_mask(torch.device("cpu"))), "no atten_mask"),
        (lambda c: c.update(sparse_mode=3), "sparse_mode 0"),
        (lambda c: c.update(num_heads=3), "H 256 must be num_heads 3"),
        (lambda c: c.update(num_key_value_heads=1), r"key must be \[blocks, block_size, 64\]"),
        (lambda c: c.update(block_table=c["block_table"].long()), "block_table must be int32"),
        (lambda c: c.update(block_table=c["block_table"][:3]), r"block_table must be \[B = 4"),
        (lambda c: c.update(actual_seq_lengths_kv=[1, 129, 300]), "B = 4 entries"),
        (lambda c: c.update(actual_seq_lengths_kv=[1, 129, 600, 17]), "must hold 5 pages"),
        (lambda c: c.update(block_size=64), "block_size 64"),
        (lambda c: c.update(query=c["query"].float().double()), "float16 or bfloat16"),
    ],
)
def test_the_fake_rejects_a_broken_decode_call(
    change: Any, rule: str, fake_npu_module: ModuleType
) -> None:
    call = _decode_call()
    change(call)
    with pytest.raises(AssertionError, match=rule):
        fake_npu_module.npu_fused_infer_attention_score(**call)


def test_the_fake_rejects_decode_blocks_off_its_grid(fake_npu_module: ModuleType) -> None:
    with pytest.raises(AssertionError, match=r"multiple of 16 in \[16, 512\]: 8"):
        fake_npu_module.npu_fused_infer_attention_score(**_decode_call(page=8))


def _scatter_call() -> dict[str, Any]:
    cache = torch.zeros(4, 128, 2, 64, dtype=torch.float16)
    return {
        "key": torch.ones(3, 2, 64, dtype=torch.float16),
        "value": torch.ones(3, 2, 64, dtype=torch.float16),
        "key_cache": cache,
        "value_cache": cache.clone(),
        "slot_mapping": torch.tensor([0, 5, 511], dtype=torch.int32),
        "cache_mode": "Norm",
    }


def test_the_fake_scatter_writes_the_slots(fake_npu_module: ModuleType) -> None:
    call = _scatter_call()
    fake_npu_module.npu_scatter_pa_kv_cache(**call)
    written = (call["key_cache"].view(512, -1) != 0).any(dim=1)
    assert written.nonzero().flatten().tolist() == [0, 5, 511]


@pytest.mark.parametrize(
    ("change", "rule"),
    [
        (lambda c: c.pop("cache_mode"), "cache_mode='Norm'"),
        (lambda c: c.update(slot_mapping=torch.tensor([0, 5, 512])), r"in \[0, 511\]"),
        (lambda c: c.update(slot_mapping=torch.tensor([0, 5, -1])), r"in \[0, 511\]"),
        (lambda c: c.update(slot_mapping=torch.tensor([0, 5, 5])), "unique"),
        (lambda c: c.update(slot_mapping=torch.tensor([0.0, 1.0, 2.0])), "int32 or int64"),
        (lambda c: c.update(key=c["key"].float()), "dtype"),
        (lambda c: c.update(value_cache=torch.zeros(4, 2, 128, 64).half()), "must be"),
        (
            lambda c: c.update(key_cache=torch.zeros(128, 4, 2, 64).half().transpose(0, 1)),
            "key_cache must be contiguous",
        ),
        (
            lambda c: c.update(
                slot_mapping=torch.tensor([0, 9, 5, 7, 511, 3], dtype=torch.int32)[::2]
            ),
            "slot_mapping must be contiguous",
        ),
    ],
)
def test_the_fake_rejects_a_broken_scatter(
    change: Any, rule: str, fake_npu_module: ModuleType
) -> None:
    call = _scatter_call()
    change(call)
    with pytest.raises(AssertionError, match=rule):
        fake_npu_module.npu_scatter_pa_kv_cache(**call)


def test_the_fake_rms_norm_returns_a_tuple(fake_npu_module: ModuleType) -> None:
    result = fake_npu_module.npu_rms_norm(_random(3, 8), torch.ones(8), epsilon=1e-6)
    assert isinstance(result, tuple)
    assert len(result) == 2
    with pytest.raises(AssertionError, match="gamma dtype"):
        fake_npu_module.npu_rms_norm(_random(3, 8), torch.ones(8).half())


def test_the_fake_rotary_works_in_place_on_128_only(fake_npu_module: ModuleType) -> None:
    q, k = _random(1, 5, 4, 128), _random(1, 5, 2, 128)
    cos, sin = torch.ones(1, 5, 1, 128), torch.zeros(1, 5, 1, 128)
    q_out, k_out = fake_npu_module.npu_apply_rotary_pos_emb(q, k, cos, sin)
    assert q_out is q
    assert k_out is k
    for dim in (64, 32):
        small = _random(1, 5, 4, dim)
        with pytest.raises(AssertionError, match=f"head_dim must be 128: {dim}"):
            fake_npu_module.npu_apply_rotary_pos_emb(
                small, small.clone(), cos[..., :dim].contiguous(), sin[..., :dim].contiguous()
            )


def test_the_fake_swiglu_gates_with_the_first_half(fake_npu_module: ModuleType) -> None:
    gate, up = _random(3, 8), _random(3, 8, seed=1)
    out = fake_npu_module.npu_swiglu(torch.cat((gate, up), -1), dim=-1)
    torch.testing.assert_close(out, torch.nn.functional.silu(gate) * up)
    with pytest.raises(AssertionError, match="must be even"):
        fake_npu_module.npu_swiglu(_random(3, 7))


def _naive_attention(query: torch.Tensor, cache: PagedKVCache, arrays: Any) -> torch.Tensor:
    """Each row's last query over its context slots, by the softmax's definition."""
    groups = SHAPE.num_heads // SHAPE.num_kv_heads
    keys = cache.layers[0].key.reshape(-1, SHAPE.num_kv_heads, SHAPE.head_dim).double()
    values = cache.layers[0].value.reshape(-1, SHAPE.num_kv_heads, SHAPE.head_dim).double()
    out = []
    for row in range(arrays.num_rows):
        slots = torch.from_numpy(np.array(arrays.context_slots(row)))
        key = keys[slots].repeat_interleave(groups, dim=1)
        value = values[slots].repeat_interleave(groups, dim=1)
        scores = torch.einsum("hd,khd->hk", query[row].double(), key) * SHAPE.scale
        out.append(torch.einsum("hk,khd->hd", scores.softmax(dim=-1), value))
    return torch.stack(out)


def _scattered_decode_dispatch() -> tuple[Any, PagePool[int]]:
    """Two decode rows whose three pages lie 60 pages apart (a request in between left)."""
    pool: PagePool[int] = PagePool(num_pages=100, page_size=16)
    pool = pool.hold(0, 20).hold(1, 60 * 16).hold(2, 30).hold(0, 40).release(1)
    rows = {r: StepChunk(start=n - 1, length=1, is_final=True) for r, n in ((0, 40), (2, 30))}
    return dispatch_arrays(rows, pool), pool


def _one_token_case(case: str, *, heads_first: bool) -> tuple[Any, PagedKVCache]:
    """Decode rows whose pages lie ``"close"`` together or ``"scattered"``, and a random cache
    stored in the given order."""
    if case == "close":
        arrays, tables = _decode_dispatch(16)
        cache = _filled_cache(tables, seed=8, heads_first=heads_first)
    else:
        arrays, _ = _scattered_decode_dispatch()
        cache = PagedKVCache.allocate(
            num_layers=1, num_pages=100, page_size=16, num_kv_heads=SHAPE.num_kv_heads,
            head_dim=SHAPE.head_dim, dtype=torch.float32, device=torch.device("cpu"),
            heads_first=heads_first,
        )  # fmt: skip
        cache.layers[0].key.copy_(_random(*cache.layers[0].key.shape, seed=8))
        cache.layers[0].value.copy_(_random(*cache.layers[0].value.shape, seed=9))
    return arrays, cache


@pytest.mark.parametrize("heads_first", [True, False])
@pytest.mark.parametrize("case", ["close", "scattered"])
def test_one_token_rows_read_close_pages_in_place_and_gather_scattered_ones(
    case: str, heads_first: bool
) -> None:
    """In place or gathered, from pages stored KV heads first (the torch path's on the CPU)
    or slots first (the NPU path's, which falls back to this attention)."""
    arrays, cache = _one_token_case(case, heads_first=heads_first)
    attention = TorchOps().attention(arrays, SHAPE, device=torch.device("cpu"), dtype=torch.float32)
    (group,) = attention.groups
    assert isinstance(group, OneTokenRows)
    assert (group.first_page is not None) == (case == "close")
    query = _random(arrays.num_rows, SHAPE.num_heads, SHAPE.head_dim, seed=5)
    got = attention.attend(query, cache.layers[0])
    expected = _naive_attention(query, cache, arrays)
    torch.testing.assert_close(got.double(), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("heads_first", [True, False])
@pytest.mark.parametrize("case", ["close", "scattered"])
def test_off_the_cpu_one_token_rows_attend_as_a_row_group_with_the_same_result(
    case: str, heads_first: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CUDA route (one-token rows through SDPA, the path measured on an H200), taken on
    the CPU by naming no device for the in-place path: the same attention."""
    from pypto_sched_npu.ops import _torch_ops

    monkeypatch.setattr(_torch_ops, "IN_PLACE_DEVICE_TYPES", ())
    arrays, cache = _one_token_case(case, heads_first=heads_first)
    attention = TorchOps().attention(arrays, SHAPE, device=torch.device("cpu"), dtype=torch.float32)
    assert not any(isinstance(group, OneTokenRows) for group in attention.groups)
    query = _random(arrays.num_rows, SHAPE.num_heads, SHAPE.head_dim, seed=5)
    got = attention.attend(query, cache.layers[0])
    expected = _naive_attention(query, cache, arrays)
    torch.testing.assert_close(got.double(), expected, atol=1e-5, rtol=1e-5)


def test_a_lone_row_reads_its_consecutive_pages_in_either_order(npu_ops: NpuOps) -> None:
    """A chunk after a cached prefix, alone in its dispatch, pages in order: read without a
    gather (a view of slots-first pages, a copy of KV-heads-first ones), as the NPU path's
    reference attends it."""
    lengths = [300]
    schedule = plan_prefill(
        lengths, PlannerConfig(max_num_batched_tokens=512), num_computed_tokens=[130]
    )
    tables = plan_pages(lengths, page_size=128, num_pages=3)
    arrays = dispatch_arrays(schedule.dispatch(0), tables)
    query = _random(arrays.num_tokens, SHAPE.num_heads, SHAPE.head_dim, seed=5)
    cpu = torch.device("cpu")
    npu_attention = npu_ops.attention(arrays, SHAPE, device=cpu, dtype=torch.float32)
    expected = npu_attention.attend(query, _filled_cache(tables, seed=8).layers[0])
    for heads_first in (True, False):
        attention = TorchOps().attention(arrays, SHAPE, device=cpu, dtype=torch.float32)
        (group,) = attention.groups
        assert isinstance(group, RowGroup)
        assert group.first_page == 0
        cache = _filled_cache(tables, seed=8, heads_first=heads_first)
        got = attention.attend(query, cache.layers[0])
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_one_token_rows_convert_reduced_precision_pages_a_few_at_a_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    arrays, tables = _decode_dispatch(16)
    cache = _filled_cache(tables, seed=8, heads_first=True)
    query = _random(arrays.num_rows, SHAPE.num_heads, SHAPE.head_dim, seed=5)
    expected = _naive_attention(query, cache, arrays)
    halved = PagedKVCache(
        num_pages=cache.num_pages,
        page_size=cache.page_size,
        layers=tuple(
            attrs.evolve(kv, key=kv.key.bfloat16(), value=kv.value.bfloat16())
            for kv in cache.layers
        ),
    )
    monkeypatch.setattr(OneTokenRows, "CONVERT_MATRICES", 5)  # 32 pages of 4 heads: several
    attention = TorchAttention.prepare(
        arrays, SHAPE, device=torch.device("cpu"), dtype=torch.bfloat16
    )
    got = attention.attend(query.bfloat16(), halved.layers[0])
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.double(), expected, atol=0.05, rtol=0.05)


@pytest.mark.parametrize("native", [True, False])
def test_reduced_precision_runs_in_float32_where_the_cpu_lacks_kernels_for_it(
    native: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(_torch_ops._NATIVE_CPU_CHECKS, torch.bfloat16, lambda: native)
    ops, cpu = TorchOps(), torch.device("cpu")
    weight = _random(8, 16).bfloat16()
    stored = ops.projection_weight(weight)
    assert stored.dtype == (torch.bfloat16 if native else torch.float32)
    assert torch.equal(stored.bfloat16(), weight)
    assert ops.kv_cache_dtype(torch.bfloat16, cpu) == stored.dtype
    assert ops.kv_cache_dtype(torch.float32, cpu) == torch.float32
    # A chunk after a cached prefix takes a mask, in the dtype attention computes in.
    arrays, tables = _dispatch(128)
    cache = _filled_cache(tables, seed=8, heads_first=True)
    cache = PagedKVCache(
        num_pages=cache.num_pages,
        page_size=cache.page_size,
        layers=tuple(
            attrs.evolve(kv, key=kv.key.to(stored.dtype), value=kv.value.to(stored.dtype))
            for kv in cache.layers
        ),
    )
    query = _random(arrays.num_tokens, SHAPE.num_heads, SHAPE.head_dim, seed=5)
    wide = TorchOps().attention(arrays, SHAPE, device=cpu, dtype=torch.float32)
    expected = wide.attend(query, _filled_cache(tables, seed=8).layers[0])
    attention = ops.attention(arrays, SHAPE, device=cpu, dtype=torch.bfloat16)
    got = attention.attend(query.bfloat16(), cache.layers[0])
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), expected, atol=0.05, rtol=0.05)
