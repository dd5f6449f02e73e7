"""A stand-in for ``torch_npu``, for tests only: reference math in torch plus the documented
constraints of each op the NPU path calls, asserted on every call.

The conftest loads this file as the module ``torch_npu`` (into ``sys.modules``), so the
backend's NPU op path runs on CPU tensors and its marshalling (layouts, dtypes, lengths,
block tables, masks, slots) is checked in CI. The constraints come from the torch_npu / CANN
operator documentation; a call that breaks one raises ``AssertionError`` naming the rule.

Where the documented versions disagree, the fake asserts what every one of them allows, and
says which documents it relied on next to the rule:

* [FIA-old]: Ascend/op-plugin ``docs/context/torch_npu-npu_fused_infer_attention_score.md``
  (torch_npu's own documentation of the op);
* [FIA-V4]: ops-transformer
  ``attention/fused_infer_attention_score/docs/aclnnFusedInferAttentionScoreV4.md``
  (its PagedAttention table and the TND section);
* [SCAT]: Ascend/op-plugin ``docs/context/torch_npu-npu_scatter_pa_kv_cache.md``;
* [ROPE]: ops-transformer ``posembedding/apply_rotary_pos_emb/docs/aclnnApplyRotaryPosEmb.md``.

Like the real module on import, it sets ``torch.version.cann`` (to :data:`CANN_VERSION`) and
names torch's private-use device ``npu`` (so ``torch.device("npu")`` parses); the TND
prefill call reads ``torch.version.cann`` when called, so a test can pretend to an older
CANN by patching it.

Two deliberate extensions, so the NPU path's marshalling runs in CI without an NPU:
:data:`TAKES_CPU_TENSORS` tells the backend its ops take CPU tensors (the real torch_npu
has no such attribute, and the backend refuses ``ops="npu"`` on a CPU device for it), and
``npu_fused_infer_attention_score`` accepts float32 on CPU tensors (the real kernel takes
float16 and bfloat16 only), so float32 runs can be compared with transformers at 1e-4. The
backend never sends float32 to a real NPU: it keeps float32 models' pages in bfloat16 there
(``NpuOps.kv_cache_dtype``).

``CALLS`` counts calls per op, and ``LAYOUTS`` the attention calls per layout, so tests can
check the NPU kernels really ran, and which form of the attention kernel did.
"""

from __future__ import annotations

import collections
from typing import Any

import torch
import torch.nn.functional as F

#: The ops of this module take CPU tensors (see the module docstring).
TAKES_CPU_TENSORS = True
#: The CANN version this fake reports, as torch_npu does, in ``torch.version.cann``.
CANN_VERSION = "8.3.RC1"

torch.version.cann = CANN_VERSION  # type: ignore[attr-defined]


def register_npu_device() -> None:
    """Name torch's private-use device "npu", as torch_npu does on import, so that
    ``torch.device("npu")`` parses. Process-wide and for good (other libraries then take an
    NPU to be present: transformers fails to run), so not done on import here: a test that
    needs it calls it in a subprocess."""
    torch.utils.rename_privateuse1_backend("npu")  # type: ignore[attr-defined]


CALLS: collections.Counter[str] = collections.Counter()
#: ``npu_fused_infer_attention_score`` calls per ``input_layout``.
LAYOUTS: collections.Counter[str] = collections.Counter()

_HALF = (torch.float16, torch.bfloat16)
_FLOATS = (torch.float32, *_HALF)
_MASK_SIZE = 2048
# [FIA-V4] TND, head_dim != 512, no rope: Q_D = K_D = V_D = 64 or 128 (or Q_D = K_D = 192
# with V_D = 128, which a Qwen3 never has); the kernel's message in vllm-ascend PR #9632
# says the same. [FIA-old] admits only 128 or 192 there, and no PagedAttention at all:
# hence the CANN floor below, not a narrower set.
_TND_HEAD_DIMS = (64, 128)
# [FIA-old] PagedAttention with Q_S > 1: block_size a multiple of 128 in [128, 512];
# [FIA-V4] TND (GQA or MHA) over [blocks, block_size, H] pages: block_size <= 128, 16-aligned.
# 128 is the one size both allow.
_TND_BLOCK_SIZE = 128
# [FIA-old] lists "page attention" among what TND with D != 512 does not support; the TND
# call over pages works from CANN 8.3 (vllm-ascend makes it only when torch.version.cann
# starts with "8.3"; issue #4373 is the failure on an older one).
_TND_MIN_CANN = (8, 3)
# [FIA-old] and [FIA-V4] (TND): at most 4,096 entries in actual_seq_lengths(_kv); [FIA-old]
# (Q_S = 1): B <= 65,536 and KV_S <= 262,144.
_TND_MAX_ROWS = 4096
_DECODE_MAX_ROWS = 65536
_DECODE_MAX_KEYS = 262144


def reset_calls() -> None:
    CALLS.clear()
    LAYOUTS.clear()


def _require(condition: bool, op: str, message: str) -> None:
    if not condition:
        raise AssertionError(f"{op}: {message}")


# -- npu_rms_norm ------------------------------------------------------------------------------


def npu_rms_norm(
    x: torch.Tensor, gamma: torch.Tensor, epsilon: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns ``(y, rstd)``: a tuple, not a tensor. Like the real kernel it normalises over
    the trailing dimensions that ``gamma`` covers (all of them, for a multi-dim gamma)."""
    op = "npu_rms_norm"
    CALLS[op] += 1
    _require(x.dtype in _FLOATS, op, f"x must be float16, bfloat16 or float32: {x.dtype}")
    _require(gamma.dtype == x.dtype, op, f"gamma dtype {gamma.dtype} must match x {x.dtype}")
    _require(2 <= x.dim() <= 8, op, f"x must have 2 to 8 dims: {x.dim()}")
    _require(
        tuple(gamma.shape) == tuple(x.shape[x.dim() - gamma.dim() :]),
        op,
        f"gamma {list(gamma.shape)} must match the trailing dims of x {list(x.shape)}",
    )
    x32 = x.float()
    axes = tuple(range(-gamma.dim(), 0))
    rstd = torch.rsqrt(x32.pow(2).mean(axes, keepdim=True) + epsilon)
    return gamma * (x32 * rstd).to(x.dtype), rstd


# -- npu_apply_rotary_pos_emb ------------------------------------------------------------------


def npu_apply_rotary_pos_emb(
    query: torch.Tensor,
    key: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    layout: str = "BSND",
    rotary_mode: str = "half",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotates ``query`` and ``key`` in place and returns them."""
    op = "npu_apply_rotary_pos_emb"
    CALLS[op] += 1
    _require(layout == "BSND", op, f"this fake emulates layout 'BSND': {layout!r}")
    _require(rotary_mode == "half", op, f"rotary_mode must be 'half': {rotary_mode!r}")
    for name, tensor in (("query", query), ("key", key), ("cos", cos), ("sin", sin)):
        _require(tensor.dim() == 4, op, f"{name} must be 4-D (BSND): {list(tensor.shape)}")
        _require(tensor.is_contiguous(), op, f"{name} must be contiguous")
        _require(tensor.dtype == query.dtype, op, f"{name} dtype must match query's")
    dim = query.shape[-1]
    # [ROPE]: the last dim D of query, key, cos and sin must equal 128.
    _require(dim == 128, op, f"head_dim must be 128: {dim}")
    for name, tensor in (("key", key), ("cos", cos), ("sin", sin)):
        _require(
            tuple(tensor.shape[:2]) == tuple(query.shape[:2]) and tensor.shape[-1] == dim,
            op,
            f"{name} {list(tensor.shape)} must share B, S and D with query {list(query.shape)}",
        )
    _require(cos.shape[2] == 1 and sin.shape[2] == 1, op, "cos and sin must have N == 1")
    _require(cos.shape == sin.shape, op, "cos and sin must have the same shape")
    for tensor in (query, key):
        half = dim // 2
        rotated = torch.cat((-tensor[..., half:], tensor[..., :half]), dim=-1)
        tensor.copy_(tensor * cos + rotated * sin)
    return query, key


# -- npu_swiglu --------------------------------------------------------------------------------


def npu_swiglu(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """``swish(A) * B`` where ``A`` is the first half of ``x`` along ``dim``."""
    op = "npu_swiglu"
    CALLS[op] += 1
    _require(x.dtype in _FLOATS, op, f"x must be float16, bfloat16 or float32: {x.dtype}")
    _require(x.is_contiguous(), op, "x must be contiguous")
    _require(x.numel() > 0, op, "x must not be empty")
    _require(x.shape[dim] % 2 == 0, op, f"x.shape[{dim}] must be even: {x.shape[dim]}")
    gate, up = x.chunk(2, dim=dim)
    return F.silu(gate) * up


# -- npu_scatter_pa_kv_cache -------------------------------------------------------------------


def npu_scatter_pa_kv_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    compress_lens: torch.Tensor | None = None,
    compress_seq_offsets: torch.Tensor | None = None,
    seq_lens: torch.Tensor | None = None,
    cache_mode: str = "PA_NZ",
) -> None:
    """Writes ``key``/``value`` ``[T, N, D]`` into ``[blocks, block_size, N, D]`` caches."""
    op = "npu_scatter_pa_kv_cache"
    CALLS[op] += 1
    # [SCAT] (its English edition): cache_mode None or 'Norm' means the ND layout, 'PA_NZ'
    # (the default) the NZ one. Older editions have no cache_mode at all: hence the
    # torch-npu floor in backends/npu/pyproject.toml.
    _require(
        cache_mode == "Norm",
        op,
        f"an ND [blocks, block_size, N, D] cache needs cache_mode='Norm' (the default "
        f"'PA_NZ' expects the NZ layout): {cache_mode!r}",
    )
    _require(
        compress_lens is None and compress_seq_offsets is None and seq_lens is None,
        op,
        "the compression arguments apply to 4-D keys only",
    )
    for name, tensor in (("key", key), ("value", value)):
        _require(tensor.dim() == 3, op, f"{name} must be [T, N, D]: {list(tensor.shape)}")
    # [SCAT]: no input may be non-contiguous.
    for name, tensor in (
        ("key", key), ("value", value), ("key_cache", key_cache), ("value_cache", value_cache),
        ("slot_mapping", slot_mapping),
    ):  # fmt: skip
        _require(tensor.is_contiguous(), op, f"{name} must be contiguous")
    for name, tensor in (("value", value), ("key_cache", key_cache), ("value_cache", value_cache)):
        _require(tensor.dtype == key.dtype, op, f"{name} dtype {tensor.dtype} must be {key.dtype}")
    _require(key.shape[:2] == value.shape[:2], op, "key and value must share T and N")
    for name, cache, source in (("key_cache", key_cache, key), ("value_cache", value_cache, value)):
        _require(cache.dim() == 4, op, f"{name} must be 4-D: {list(cache.shape)}")
        _require(
            tuple(cache.shape[2:]) == tuple(source.shape[1:]),
            op,
            f"{name} {list(cache.shape)} must be [blocks, block_size, "
            f"{source.shape[1]}, {source.shape[2]}]",
        )
    _require(
        slot_mapping.dtype in (torch.int32, torch.int64),
        op,
        f"slot_mapping must be int32 or int64: {slot_mapping.dtype}",
    )
    _require(
        slot_mapping.dim() == 1 and slot_mapping.shape[0] == key.shape[0],
        op,
        f"slot_mapping must be [T] = [{key.shape[0]}]: {list(slot_mapping.shape)}",
    )
    slots = slot_mapping.long()
    num_slots = key_cache.shape[0] * key_cache.shape[1]
    if slots.numel():
        _require(
            int(slots.min()) >= 0 and int(slots.max()) < num_slots,
            op,
            f"slot_mapping values must be in [0, {num_slots - 1}]: "
            f"[{int(slots.min())}, {int(slots.max())}]",
        )
        _require(
            bool((slots.sort().values.diff() > 0).all()), op, "slot_mapping values must be unique"
        )
    heads, dim = key.shape[1], key.shape[2]
    key_cache.view(-1, heads, dim)[slots] = key
    value_cache.view(-1, value.shape[1], value.shape[2])[slots] = value


# -- npu_fused_infer_attention_score -----------------------------------------------------------

# Masks already found to be the upper triangle, by storage address: the full comparison of
# 4M entries is done once per mask, not once per layer. Holding the tensors keeps their
# addresses from being reused by another tensor. (Masks are never written in place.)
_CHECKED_MASKS: dict[int, torch.Tensor] = {}


def _is_upper_triangle(mask: torch.Tensor) -> bool:
    key = mask.data_ptr()
    if key not in _CHECKED_MASKS:
        upper = torch.triu(torch.ones(_MASK_SIZE, _MASK_SIZE, dtype=torch.bool), 1)
        if not torch.equal(mask.reshape(_MASK_SIZE, _MASK_SIZE).bool().cpu(), upper):
            return False
        _CHECKED_MASKS[key] = mask
    return True


def npu_fused_infer_attention_score(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    atten_mask: torch.Tensor | None = None,
    actual_seq_lengths: list[int] | None = None,
    actual_seq_lengths_kv: list[int] | None = None,
    block_table: torch.Tensor | None = None,
    num_heads: int = 1,
    scale: float = 1.0,
    pre_tokens: int = 2147483647,
    next_tokens: int = 2147483647,
    input_layout: str = "BSH",
    num_key_value_heads: int = 0,
    sparse_mode: int = 0,
    inner_precise: int = 0,
    block_size: int = 0,
    softmax_lse_flag: bool = False,
    **unused: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PageAttention in two layouts; returns ``(attention_out, softmax_lse)``.

    * ``"TND"`` (prefill and mixed dispatches): query ``[T, N, D]``, ``actual_seq_lengths``
      the cumulative query ends, ``sparse_mode=3`` with the 2048 x 2048 mask.
    * ``"BSH"`` with ``S == 1`` (incremental decode, the kernel's IncreFlashAttention
      branch): query ``[B, 1, N * D]``, ``actual_seq_lengths`` each row's own query length
      (1, not cumulative), no mask, ``sparse_mode=0``; the output is ``[B, 1, N * D]``.
    """
    op = "npu_fused_infer_attention_score"
    CALLS[op] += 1
    extra = sorted(name for name, given in unused.items() if given is not None)
    _require(not extra, op, f"this fake does not emulate {extra}")
    _require(
        input_layout in ("TND", "BSH"),
        op,
        f"this fake emulates input_layout 'TND' (prefill) and 'BSH' (decode): {input_layout!r}",
    )
    LAYOUTS[input_layout] += 1
    _require(not softmax_lse_flag, op, "softmax_lse_flag is not emulated")
    heads, decode = num_heads, input_layout == "BSH"
    if decode:
        tokens, dim, ends = _bsh_decode_query(query, heads, actual_seq_lengths)
    else:
        _require(query.dim() == 3, op, f"query must be [T, N, D] for TND: {list(query.shape)}")
        tokens, given, dim = query.shape
        _require(given == heads, op, f"num_heads {heads} must equal query's N {given}")
        ends = _tnd_query_ends(actual_seq_lengths, tokens)
    _require(query.is_contiguous(), op, "query must be contiguous")
    cpu_float32 = query.dtype == torch.float32 and query.device.type == "cpu"
    _require(
        query.dtype in _HALF or cpu_float32,
        op,
        f"query must be float16 or bfloat16 (float32 only in this fake, on CPU): {query.dtype}",
    )
    _require(dim % 16 == 0, op, f"head_dim must be a multiple of 16 for float inputs: {dim}")
    if not decode:
        _check_tnd_paged(query.dtype, cpu_float32, dim, block_size)
    kv_heads = num_key_value_heads or num_heads
    _require(num_heads % kv_heads == 0, op, "num_heads must be a multiple of num_key_value_heads")
    _require(num_heads // kv_heads <= 64, op, "num_heads / num_key_value_heads must be <= 64")

    # PageAttention: key/value are the caches viewed as [blocks, block_size, kv_heads * D].
    _require(block_table is not None, op, "this fake emulates PageAttention: pass block_table")
    assert block_table is not None
    for name, tensor in (("key", key), ("value", value)):
        _require(tensor.dtype == query.dtype, op, f"{name} dtype must match query's")
        _require(tensor.is_contiguous(), op, f"{name} must be contiguous")
        _require(
            tensor.dim() == 3 and tensor.shape[2] == kv_heads * dim,
            op,
            f"{name} must be [blocks, block_size, {kv_heads * dim}]: {list(tensor.shape)}",
        )
    _require(key.shape == value.shape, op, "key and value must have the same shape")
    blocks = key.shape[0]
    _require(block_size == key.shape[1], op, f"block_size {block_size} != {key.shape[1]}")

    batch = len(ends)
    # [FIA-old] and [FIA-V4] (TND): actual_seq_lengths and actual_seq_lengths_kv hold at
    # most 4,096 entries; [FIA-old] (Q_S = 1): B at most 65,536.
    most = _DECODE_MAX_ROWS if decode else _TND_MAX_ROWS
    _require(batch <= most, op, f"{input_layout} takes at most {most} rows (B): {batch}")
    query_lens = [b - a for a, b in zip([0, *ends], ends, strict=False)]
    kv_lens = actual_seq_lengths_kv
    _require(
        isinstance(kv_lens, list) and all(type(n) is int for n in kv_lens),
        op,
        f"actual_seq_lengths_kv must be a list of ints: {type(kv_lens).__name__}",
    )
    assert kv_lens is not None
    _require(
        len(kv_lens) == batch, op, f"actual_seq_lengths_kv must have B = {batch} entries: {kv_lens}"
    )

    if decode:
        # [FIA-old] and [FIA-V4], Q_S = 1 with float16/bfloat16 pages: 16-aligned; [FIA-V4]
        # caps it at 512 outside head_dim 64/128 GQA.
        _require(
            block_size % 16 == 0 and 16 <= block_size <= 512,
            op,
            f"block_size must be a multiple of 16 in [16, 512]: {block_size}",
        )

    _require(
        block_table.dtype == torch.int32, op, f"block_table must be int32: {block_table.dtype}"
    )
    _require(
        block_table.dim() == 2 and block_table.shape[0] == batch,
        op,
        f"block_table must be [B = {batch}, pages]: {list(block_table.shape)}",
    )
    needed = max(-(-n // block_size) for n in kv_lens)
    _require(
        block_table.shape[1] >= needed,
        op,
        f"block_table must hold {needed} pages per row (the longest kv): {block_table.shape[1]}",
    )
    _require(
        block_table.numel() == 0
        or (int(block_table.min()) >= 0 and int(block_table.max()) < blocks),
        op,
        f"block ids are not checked by the kernel, so every entry must be in [0, {blocks})",
    )
    if decode:  # [FIA-old] (Q_S = 1): KV_S at most 262,144
        _require(
            max(kv_lens) <= _DECODE_MAX_KEYS,
            op,
            f"each row's kv length must be <= {_DECODE_MAX_KEYS}: {max(kv_lens)}",
        )
    for query_len, kv_len in zip(query_lens, kv_lens, strict=True):
        _require(
            kv_len >= query_len,
            op,
            f"each row's kv length must be >= its query length: {kv_len} < {query_len}",
        )

    if decode:
        _require(
            sparse_mode == 0 and atten_mask is None,
            op,
            f"one query token per row sees its whole context: BSH decode takes no atten_mask "
            f"and sparse_mode 0: sparse_mode {sparse_mode}, atten_mask "
            f"{None if atten_mask is None else list(atten_mask.shape)}",
        )
    else:
        _check_causal_mask(sparse_mode, atten_mask)

    groups = heads // kv_heads
    keys = key.view(blocks * block_size, kv_heads, dim)
    values = value.view(blocks * block_size, kv_heads, dim)
    flat = query.view(tokens, heads, dim)
    out = torch.empty_like(flat)
    for row, (start, end, kv) in enumerate(zip([0, *ends], ends, kv_lens, strict=False)):
        position = torch.arange(kv)
        slots = block_table[row].long()[position // block_size] * block_size + position % block_size
        k = keys[slots].float().repeat_interleave(groups, dim=1)  # [kv, heads, D]
        v = values[slots].float().repeat_interleave(groups, dim=1)
        q = flat[start:end].float()  # [q, heads, D]
        scores = torch.einsum("qhd,khd->hqk", q, k) * scale
        # Right-down causal: query i sees keys j <= kv - q + i.
        offset = kv - (end - start)
        hidden = position[None, :] > torch.arange(end - start)[:, None] + offset
        scores = scores.masked_fill(hidden[None], float("-inf"))
        out[start:end] = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).to(query.dtype)
    return out.view(query.shape), torch.zeros(1)


def _check_tnd_paged(dtype: torch.dtype, cpu_float32: bool, dim: int, block_size: int) -> None:
    """The TND prefill call over paged K/V: CANN, dtype, head_dim and block size."""
    op = "npu_fused_infer_attention_score"
    cann = getattr(torch.version, "cann", None) or ""
    parts = cann.split(".")
    release = tuple(int(p) for p in parts[:2]) if all(p.isdigit() for p in parts[:2]) else ()
    _require(
        len(release) == 2 and release >= _TND_MIN_CANN,
        op,
        f"TND over PagedAttention needs CANN >= 8.3: torch.version.cann is {cann!r}",
    )
    # [FIA-old] TND with D != 512: bfloat16 only ([FIA-V4] adds float16, not every version).
    _require(
        dtype == torch.bfloat16 or cpu_float32,
        op,
        f"TND takes bfloat16 only (float32 only in this fake, on CPU): {dtype}",
    )
    _require(
        dim in _TND_HEAD_DIMS,
        op,
        f"TND over PagedAttention takes head_dim {' or '.join(map(str, _TND_HEAD_DIMS))}: {dim}",
    )
    _require(
        block_size == _TND_BLOCK_SIZE,
        op,
        f"TND over PagedAttention takes block_size {_TND_BLOCK_SIZE} only: {block_size}",
    )


def _tnd_query_ends(actual_seq_lengths: list[int] | None, tokens: int) -> list[int]:
    """TND: ``actual_seq_lengths`` are the cumulative query ends, the last one ``T``."""
    op = "npu_fused_infer_attention_score"
    ends = actual_seq_lengths
    _require(
        isinstance(ends, list) and all(type(n) is int for n in ends),
        op,
        f"actual_seq_lengths must be a list of ints: {type(ends).__name__}",
    )
    assert ends is not None
    _require(len(ends) >= 1, op, "actual_seq_lengths must not be empty (it sets B for TND)")
    _require(
        all(b >= a for a, b in zip([0, *ends], ends, strict=False)),
        op,
        f"actual_seq_lengths must be cumulative (non-decreasing, >= 0): {ends}",
    )
    _require(ends[-1] == tokens, op, f"actual_seq_lengths must end at T = {tokens}: {ends[-1]}")
    return ends


def _bsh_decode_query(
    query: torch.Tensor, num_heads: int, actual_seq_lengths: list[int] | None
) -> tuple[int, int, list[int]]:
    """BSH with one query token per row: ``(B, D, the rows' query ends)``."""
    op = "npu_fused_infer_attention_score"
    _require(query.dim() == 3, op, f"query must be [B, S, H] for BSH: {list(query.shape)}")
    batch, seq, hidden = query.shape
    _require(
        seq == 1, op, f"this fake emulates BSH for incremental decode only: S must be 1: {seq}"
    )
    _require(batch >= 1, op, "query must hold at least one row")
    _require(
        num_heads >= 1 and hidden % num_heads == 0,
        op,
        f"query's H {hidden} must be num_heads {num_heads} x head_dim",
    )
    lengths = actual_seq_lengths
    if lengths is not None:
        _require(
            isinstance(lengths, list) and all(type(n) is int for n in lengths),
            op,
            f"actual_seq_lengths must be a list of ints: {type(lengths).__name__}",
        )
        _require(
            lengths == [1] * batch,
            op,
            f"for BSH actual_seq_lengths holds each row's own query length (not cumulative), "
            f"B = {batch} entries of S = 1: {lengths}",
        )
    return batch, hidden // num_heads, list(range(1, batch + 1))


def _check_causal_mask(sparse_mode: int, atten_mask: torch.Tensor | None) -> None:
    op = "npu_fused_infer_attention_score"
    _require(sparse_mode == 3, op, f"this fake emulates TND with sparse_mode 3: {sparse_mode}")
    _require(atten_mask is not None, op, "sparse_mode 3 requires atten_mask")
    assert atten_mask is not None
    _require(
        atten_mask.dtype in (torch.int8, torch.uint8, torch.bool),
        op,
        f"atten_mask must be int8, uint8 or bool: {atten_mask.dtype}",
    )
    _require(
        tuple(atten_mask.shape[-2:]) == (_MASK_SIZE, _MASK_SIZE)
        and all(n == 1 for n in atten_mask.shape[:-2]),
        op,
        f"sparse_mode 3 needs the {_MASK_SIZE}x{_MASK_SIZE} mask: {list(atten_mask.shape)}",
    )
    _require(
        _is_upper_triangle(atten_mask),
        op,
        "atten_mask must be 1 strictly above the diagonal and 0 elsewhere",
    )
