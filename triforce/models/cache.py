"""KV caches for the model layer: full, StreamingLLM (sink + window) and retrieval (fixed budget).

All three are fixed-size after construction: every buffer is allocated in ``__init__`` and only
written in place afterwards, so memory does not grow during decoding (and the buffers can be captured
in a CUDA graph). Per-sequence lengths live on the device; ``rollback`` and ``commit_path`` never
synchronise with the host. The one exception is ``select_rows``, when finished sequences leave the batch:
the buffers shrink to the rows kept (a full or retrieval cache narrows them in place; a StreamingLLM
cache gathers its kept rows into smaller ones).

The seam with :class:`triforce.models.Llama` (docs/model_interface.md): a forward of ``T`` tokens calls
``step = cache.begin(T, ...)`` once (slots, RoPE positions, lengths, tree mask: built once and reused by
every layer), then ``cache.attend(layer, q, k, v, step, k_raw)`` per layer (writes the new keys/values
at ``lengths .. lengths+T-1`` and runs ``tk.verify_attention`` with ``cache_seqlens = lengths + T``),
then ``cache.end(step)``. On the CPU's fused path the model layer runs all layers and this side of them in
one native call instead, for the caches whose ``attend`` is only that write and attention: each cache
says so, and hands over its buffers, in ``_native_buffers`` (docs/model.md, "One native call per forward").

Each cache keeps ``_bound``, a host-side upper bound of ``max(lengths)``, so capacity checks need no
device read in the common case; only when the bound says a forward might overflow do we read the true
lengths once (and raise if it really does).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch

import triforce_kernels as tk
from triforce_kernels.tree_mask import tree_attention_mask_trusted
from triforce_kernels.verify_attention import verify_attention_trusted
from .config import DeltaNet, LlamaConfig, Mamba1
from .rope import apply_rope, rope_attention_scale, rope_cos_sin, rope_inv_freq, rope_local_inv_freq, rows_inv_freq

__all__ = ["FullCache", "StreamingCache", "RetrievalCache", "TokenTree"]


class TokenTree:
    """A token tree for a tree forward (``tree_parents=``): ``parents`` int ``[B, T]`` with its attention
    mask (``tk.tree_attention_mask``) and node depths, built once and reused by every forward given this
    object. A plain ``parents`` tensor is instead rebuilt and re-checked per forward, and the check reads
    the values: one host synchronisation per forward on a GPU.

    - ``TokenTree(parents)``: from an int32/int64 ``[B, T]`` tensor, checked like
      ``tk.tree_attention_mask`` (``ValueError`` if it is not a tree in topological order).
    - ``TokenTree.static(parents_row, batch_size, device)``: the same tree in every row, from a list of
      ints checked on the host: no device read, one upload at construction.
    - ``tree.prefix(n)``: the tree of its first ``n`` nodes (nodes are in topological order, so a prefix
      is a tree), built once per ``n``.

    Attributes: ``parents`` ``[B, T]``, ``mask`` bool ``[B, T, T]``, ``depths`` int64 ``[B, T]``.
    """

    __slots__ = ("parents", "mask", "depths", "_prefixes")

    def __init__(self, parents: torch.Tensor):
        self._set(parents, tk.tree_attention_mask(parents))

    def _set(self, parents, mask):
        self.parents, self.mask = parents, mask
        self.depths = mask.sum(-1) - 1
        self._prefixes = {}
        return self

    @classmethod
    def static(cls, parents_row, batch_size: int, device=None) -> "TokenTree":
        """One tree for all ``batch_size`` rows; ``parents_row``: ``[-1, p1, p2, ...]`` with
        ``0 <= p_t < t``."""
        row = list(parents_row)
        if not row or any(isinstance(p, bool) or not isinstance(p, int) for p in row) or row[0] != -1 \
                or any(not 0 <= p < t for t, p in enumerate(row) if t):
            raise ValueError(f"parents_row must describe a tree in topological order: [-1, p1, p2, ...] with "
                             f"0 <= p_t < t, got {row!r}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        one = torch.tensor([row], dtype=torch.int64, device=device)
        T = len(row)
        mask = tree_attention_mask_trusted(one).expand(batch_size, T, T).contiguous()
        return cls._trusted(one.expand(batch_size, T), mask)

    @classmethod
    def _trusted(cls, parents: torch.Tensor, mask: torch.Tensor | None = None) -> "TokenTree":
        """A tree valid by construction (built by the engines): no check, no device read."""
        tree = cls.__new__(cls)
        return tree._set(parents, tree_attention_mask_trusted(parents) if mask is None else mask)

    def prefix(self, n: int) -> "TokenTree":
        T = self.parents.shape[1]
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= T:
            raise ValueError(f"prefix: n must be an int in [1, {T}], got {n!r}")
        if n == T:
            return self
        if n not in self._prefixes:
            self._prefixes[n] = TokenTree._trusted(self.parents[:, :n], self.mask[:, :n, :n].contiguous())
        return self._prefixes[n]


_CACHE_OPS: dict = {}


def _cache_op(name: str, switch: str = "TRIFORCE_SHIFT_SLOTS"):
    """The extension's CPU op ``triforce_C::<name>`` for the StreamingLLM cache's bookkeeping (csrc/ops.h,
    "caches": ``shift_slots_``, a row's window shifted in place, one memmove per layer; ``rope_into_``, the sinks
    rotated again in one pass) and DeepSeek-V3.2's indexer (``index_scores``), or ``None`` without the extension or
    with the environment variable ``switch`` at ``0`` (PyTorch's ops). Looked up once."""
    if name not in _CACHE_OPS:
        _CACHE_OPS[name] = None
        if os.environ.get(switch, "1") != "0":
            try:
                from triforce_kernels._backend import _extension

                _extension()
                _CACHE_OPS[name] = getattr(torch.ops.triforce_C, name, None)
            except Exception:  # no extension built
                pass
    return _CACHE_OPS[name]


@dataclass
class Step:
    """Metadata of one forward, built once by ``cache.begin`` and reused by every layer."""
    T: int
    batch_index: torch.Tensor      # int64 [B, 1]
    slots: torch.Tensor            # int64 [B, T]: cache slots the new tokens are written to
    positions: torch.Tensor        # int64 [B, T]: RoPE positions of the new tokens
    seqlens: torch.Tensor          # int32 [B]: lengths + T (tk.verify_attention's cache_seqlens)
    counts: torch.Tensor           # int32 [B]: real tokens appended per row (< T for padded prefill rows)
    tree_mask: torch.Tensor | None  # bool [B, T, T]
    query_index: torch.Tensor | None = None  # int64 [B]: token whose query is kept as last_query
    query_valid: torch.Tensor | None = None  # bool [B]
    # int32 [B] per sliding window W: verify_attention's cache_leftpad on the layers with that window (a
    # StreamingLLM cache's sinks that the window no longer reaches); None: every layer starts at slot 0
    leftpad: dict | None = None
    # the convolution layers' plan (_KVCache._conv_plan), made by the first of them and reused by the others
    conv: tuple | None = None


# The tokens a cache can roll back over LFM2's convolution layers (config.conv_layers): each such layer keeps its
# inputs of the last CONV_HISTORY + conv_kernel positions (fewer where the cache holds fewer) in a ring (docs/model.md,
# "LFM2"); a rollback or commit_path deeper than that raises on the CPU
CONV_HISTORY = 512


def short_conv(win: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """LFM2's causal depthwise convolution of each token's window ``win`` ``[B, T, K, C]`` (its ``K - 1``
    predecessors, oldest first, then itself) with ``weight`` ``[C, 1, K]`` (``nn.Conv1d``'s) and ``bias`` ``[C]`` or
    None: the products summed in float32 in tap order, rounded once to ``win``'s dtype. Token by token the same
    arithmetic whatever the step's length, so a pass keeps the bits of its steps."""
    w = weight.reshape(weight.shape[0], -1).float()
    acc = win[:, :, 0].float() * w[:, 0]
    for k in range(1, w.shape[1]):
        acc = acc + win[:, :, k].float() * w[:, k]
    if bias is not None:
        acc = acc + bias.float()
    return acc.to(win.dtype)


# The recurrent layers' states a cache keeps to go back to (config.recurrent: Mamba-2's, gated DeltaNet's):
# SSM_CHECKPOINTS of them, taken at the start of
# a forward at least SSM_CHECKPOINT_STRIDE tokens after the last one (or before it, after a rollback): a rollback within
# about SSM_CHECKPOINTS x SSM_CHECKPOINT_STRIDE tokens replays at most a stride and a forward's tokens; one before the
# oldest raises on the CPU (docs/model.md, "Mamba-2")
SSM_CHECKPOINTS = 8
SSM_CHECKPOINT_STRIDE = 16


def ssm_update(state, x, B, dt, decay):
    """One token of a Mamba-2 layer's state space model, in float32: ``state`` ``[b, H, P, N]`` times ``decay``
    (``exp(dt A)``, ``[b, H]``) plus ``(dt B) x`` (``x`` ``[b, H, P]``, ``B`` ``[b, H, N]``: its group's, per head;
    ``dt`` ``[b, H]``; one ``addcmul``). Token by token the same arithmetic wherever it runs (a step, a tree's node, a
    replay), so a pass keeps the bits of its steps."""
    return torch.addcmul(state * decay[:, :, None, None], (dt[:, :, None] * B)[:, :, None, :], x[..., None])


def ssm_readout(state, C, D, x):
    """A Mamba-2 layer's output of one token from its state ``[b, H, P, N]``: ``state C + D x`` (``C`` ``[b, H,
    N]``, ``D`` ``[H]``, ``x`` ``[b, H, P]``), float32."""
    return (state * C[:, :, None, :]).sum(-1) + D[:, None] * x


def ssm_scan(state, x, B, C, dt, decay, D, counts=None) -> torch.Tensor:
    """A Mamba-2 layer's state space model over T tokens, float32: ``state`` ``[b, H, P, N]`` advanced in place over
    each row's first ``counts[b]`` tokens (None: all), ``x`` ``[b, T, H, P]``, ``B`` and ``C`` ``[b, T, G, N]``,
    ``dt`` and ``decay`` ``[b, T, H]``, ``D`` ``[H]`` -> the outputs ``[b, T, H, P]``. On the CPU with the extension
    ``triforce_C::ssm_scan_`` (csrc/cpu/ssm.cpp: each state row read once for all T tokens; its own arithmetic, the
    same for every T and every thread count); else :func:`ssm_update` and :func:`ssm_readout` token by token. Every
    path of the model layer (a step, a tree's node, a replay, the cache-free forward) goes through it, so a process's
    bits are one implementation's."""
    op = _cache_op("ssm_scan_", "TRIFORCE_SSM_SCAN")
    if op is not None and state.device.type == "cpu" and not torch.compiler.is_compiling():
        return op(state, x.contiguous(), B.contiguous(), C.contiguous(), dt.contiguous(), decay.contiguous(),
                  D.contiguous(), counts)
    b, T = x.shape[:2]
    rep = x.shape[2] // B.shape[2]
    Bh, Ch = (t.repeat_interleave(rep, dim=2) for t in (B, C))
    real = None if counts is None else torch.arange(T, device=x.device)[None] < counts.long()[:, None]
    now, out = state, []
    for t in range(T):
        new = ssm_update(now, x[:, t], Bh[:, t], dt[:, t], decay[:, t])
        now = new if real is None else torch.where(real[:, t, None, None, None], new, now)
        out.append(ssm_readout(now, Ch[:, t], D, x[:, t]))
    state.copy_(now)
    return torch.stack(out, 1) if out else x.new_empty(x.shape)


def delta_update(state, k, v, beta, decay):
    """One token of a gated DeltaNet layer's state, in float32: ``state`` ``[b, H, K, V]`` times ``decay`` (``exp(g)``,
    ``[b, H]``; or ``[b, H, K]``, a decay per key channel, each state row's: Kimi's KDA), then the delta rule with its
    key ``k`` ``[b, H, K]`` (L2-normalised), value ``v`` ``[b, H, V]`` and ``beta`` ``[b, H]``: ``S + k (beta (v -
    S^T k))^T``. Token by token the same arithmetic wherever it runs."""
    s = state * (decay[:, :, None, None] if decay.dim() == 2 else decay[..., None])
    delta = (v - (s * k[..., None]).sum(-2)) * beta[..., None]
    return torch.addcmul(s, k[..., None], delta[:, :, None, :])


def delta_scan(state, q, k, v, beta, decay, counts=None) -> torch.Tensor | None:
    """A gated DeltaNet layer over T tokens, float32: ``state`` ``[b, Hv, K, V]`` advanced in place over each row's
    first ``counts[b]`` tokens (None: all) with the keys ``k`` ``[b, T, Hk, K]`` (each key head serving ``Hv / Hk``
    consecutive value heads), values ``v`` ``[b, T, Hv, V]``, ``beta`` and ``decay`` ``[b, T, Hv]`` (``decay`` also
    ``[b, T, Hv, K]``: one per key channel, Kimi's KDA) -> the outputs
    ``S^T q`` ``[b, T, Hv, V]`` of the queries ``q`` (as ``k``, scaled), or None without queries (a replay). On the CPU
    with the extension ``triforce_C::delta_scan_`` (csrc/cpu/delta.cpp: each head's state read once for all T tokens,
    the same arithmetic for every T and thread count); else :func:`delta_update` token by token. Every path of the
    model layer goes through it."""
    op = _cache_op("delta_scan_", "TRIFORCE_DELTA_SCAN")
    if op is not None and state.device.type == "cpu" and not torch.compiler.is_compiling():
        out = op(state, None if q is None else q.contiguous(), k.contiguous(), v.contiguous(), beta.contiguous(),
                 decay.contiguous(), counts)
        return out if q is not None else None
    b, T = k.shape[:2]
    rep = v.shape[2] // k.shape[2]
    kh = k.repeat_interleave(rep, dim=2)
    qh = None if q is None else q.repeat_interleave(rep, dim=2)
    real = None if counts is None else torch.arange(T, device=k.device)[None] < counts.long()[:, None]
    now, out = state, []
    for t in range(T):
        new = delta_update(now, kh[:, t], v[:, t], beta[:, t], decay[:, t])
        now = new if real is None else torch.where(real[:, t, None, None, None], new, now)
        if qh is not None:
            out.append((now * qh[:, t, ..., None]).sum(-2))
    state.copy_(now)
    if q is None:
        return None
    return torch.stack(out, 1) if out else v.new_empty(v.shape)


def selective_scan(state, x, dt, A, B, C, counts=None) -> torch.Tensor | None:
    """A Mamba(-1) layer's selective state space model over T tokens, float32: ``state`` ``[b, D, N]`` advanced in
    place over each row's first ``counts[b]`` tokens (None: all) with ``x`` and ``dt`` ``[b, T, D]``, ``A`` ``[D, N]``,
    ``B`` ``[b, T, N]``: ``h * exp(dt A) + (dt B) x`` per channel; -> the readouts ``h . C`` ``[b, T, D]`` of ``C``
    (``[b, T, N]``), or None without it (a replay). On the CPU with the extension ``triforce_C::selective_scan_``
    (csrc/cpu/selective.cpp: each channel's state read once for all T tokens, the same arithmetic for every T and
    thread count); else PyTorch's ops token by token, the same arithmetic for every token wherever it runs (a step, a
    tree's node, a replay: every elementwise function value by value). Every path of the model layer goes through
    it."""
    op = _cache_op("selective_scan_", "TRIFORCE_SELECTIVE_SCAN")
    if op is not None and state.device.type == "cpu" and not torch.compiler.is_compiling():
        out = op(state, x.contiguous(), dt.contiguous(), A.contiguous(), B.contiguous(),
                 None if C is None else C.contiguous(), counts)
        return out if C is not None else None
    from .llama import _lanewise

    T = x.shape[1]
    real = None if counts is None else torch.arange(T, device=x.device)[None] < counts.long()[:, None]
    now, out = state, []
    for t in range(T):
        decay = _lanewise(torch.exp, dt[:, t, :, None] * A)
        new = torch.addcmul(now * decay, (dt[:, t, :, None] * B[:, t, None, :]), x[:, t, :, None])
        now = new if real is None else torch.where(real[:, t, None, None], new, now)
        if C is not None:
            out.append((now * C[:, t, None, :]).sum(-1))
    state.copy_(now)
    if C is None:
        return None
    return torch.stack(out, 1) if out else x.new_empty(x.shape)


def _per_row(mask: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
    """A ``[b]`` row mask shaped to broadcast over a state ``[b, ...]`` (a recurrent layer's: 4-D, Mamba(-1)'s 3-D)."""
    return mask.view(-1, *([1] * (state.dim() - 1)))


def conv_windows(x: torch.Tensor, kernel: int) -> torch.Tensor:
    """Each token's window ``[B, T, kernel, C]`` of ``x`` ``[B, T, C]`` with nothing before it (zeros): the
    cache-free forward's."""
    ext = torch.nn.functional.pad(x, (0, 0, kernel - 1, 0))
    return ext.unfold(1, kernel, 1).transpose(-1, -2)


def check_values(t: torch.Tensor) -> bool:
    """Whether the values of ``t`` may be read for a check: on the CPU, where it is free (on a GPU it would
    be a host sync: callers clamp there instead), and not while compiling (a graph break). One switch
    for every such check of the model layer: the host-sync tests turn it off to take the GPU's path."""
    return t.device.type == "cpu" and not torch.compiler.is_compiling()


def as_device(device) -> torch.device:
    """The device a tensor allocated on ``device`` reports: ``"cuda"`` names the current GPU as
    ``cuda:N`` and ``"cpu:0"`` is ``cpu``. Devices the model layer compares (a cache's with its model's)
    go through this, so that two names of one device are equal."""
    return torch.empty(0, device=device).device


def _check_lengths(name: str, t, batch_size: int, device) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of shape [{batch_size}], got {type(t).__name__}")
    if t.dtype not in (torch.int32, torch.int64) or tuple(t.shape) != (batch_size,):
        raise ValueError(f"{name} must be an int32/int64 tensor of shape [{batch_size}], "
                         f"got {t.dtype} {list(t.shape)}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device} but the cache is on {device}")
    return t


def rows_in_place(live: list[int]) -> list[int]:
    """The order in which a cache's ``select_rows`` keeps the rows ``live`` (sorted, distinct) with the fewest
    copies: a live row below ``len(live)`` stays where it is, and each dropped row's place there takes a live
    row from past it."""
    n = len(live)
    stay = [r for r in live if r < n]
    movers = iter(r for r in live if r >= n)
    kept = set(stay)
    return [i if i in kept else next(movers) for i in range(n)]


def _check_rows(rows, batch_size: int, device) -> tuple[list[int], torch.Tensor]:
    """-> ``rows`` as host ints (a tensor is read: a host sync on a GPU) and as an int64 tensor on ``device``."""
    idx = None
    if isinstance(rows, torch.Tensor):
        if rows.dim() != 1 or rows.dtype.is_floating_point or rows.dtype.is_complex or rows.dtype == torch.bool:
            raise ValueError(f"rows must be a 1-D integer tensor or a list of ints, got {rows.dtype} "
                             f"{list(rows.shape)}")
        idx, rows = rows.to(device, torch.int64), rows.tolist()
    if not isinstance(rows, (list, tuple)) or any(isinstance(r, bool) or not isinstance(r, int) for r in rows):
        raise ValueError(f"rows must be a list of ints or a 1-D integer tensor, got {rows!r}")
    rows = list(rows)
    if not rows or len(set(rows)) != len(rows) or not all(0 <= r < batch_size for r in rows):
        raise ValueError(f"rows must be distinct row indices in [0, {batch_size}), at least one, got {rows}")
    return rows, idx if idx is not None else torch.tensor(rows, dtype=torch.int64, device=device)


def _moves(rows: list[int]):
    """``[(dst, src), ...]``: the copies that take ``rows`` in place, or ``None`` where a copy would overwrite a
    row before it is read (a kept row that moves must come from past the first ``len(rows)`` rows)."""
    n = len(rows)
    if any(r != i and r < n for i, r in enumerate(rows)):
        return None
    return [(i, r) for i, r in enumerate(rows) if r != i]


def _take_rows(t: torch.Tensor, idx: torch.Tensor, moves, upto: int) -> torch.Tensor:
    """``t[idx]`` along dimension 0: in place with ``moves`` (copying each moved row's first ``upto`` entries
    of dimension 1), then narrowed; gathered into a new tensor when ``moves`` is ``None``."""
    if moves is None:
        return t[idx]
    for dst, src in moves:
        t[dst, :upto].copy_(t[src, :upto])
    return t[: idx.numel()]


def _rows_long(config: LlamaConfig, batch_size: int, capacity: int, rope_long, device) -> torch.Tensor | None:
    """A cache's ``rope_long`` from its ``rope_long`` argument: None (the default: every row long when the cache
    has more slots than ``config.rope_long_from``), a bool for every row, or a bool tensor ``[B]``; None for a
    model without LongRoPE."""
    start = config.rope_long_from
    if start is None:
        return None
    if rope_long is None:
        rope_long = capacity > start
    if isinstance(rope_long, bool):
        return torch.full((batch_size,), rope_long, dtype=torch.bool, device=device)
    if not isinstance(rope_long, torch.Tensor) or rope_long.dtype != torch.bool \
            or tuple(rope_long.shape) != (batch_size,):
        raise ValueError(f"rope_long must be None, a bool or a bool tensor [batch_size={batch_size}], got "
                         f"{rope_long!r}")
    return rope_long.to(device).clone()


_STEPS = object()  # (attention's tree_mask default: the step's)


def attention(q, k, v, step: Step, window: int, scale: float, softcap: float, sinks=None, alibi=None, *,
              seqlens=None, tree_mask=_STEPS, leftpad=None) -> torch.Tensor:
    """``verify_attention`` of ``q`` over the buffers ``k``, ``v`` for ``step`` (on a layer with a window, from the
    step's ``leftpad`` for it where it has one; ``alibi``: its ``alibi_slopes``, float32 ``[Hq]``, or None; over a
    cache that holds chosen slots, a StreamingLLM or retrieval cache, the distances are those of the slots a query
    sees, as StreamingLLM runs ALiBi). ``sinks`` (GPT-OSS: a logit per
    query head, ``[Hq]``) joins each softmax's denominator without a value: a query's output times
    ``Z / (Z + exp(sink)) = sigmoid(lse - sink)``, ``lse = ln Z`` the kernel's log-sum-exp of its scores, computed in
    float32 value by value (each query's bits its own, so a pass keeps the bits of its steps); a query that sees
    nothing stays 0. ``seqlens``, ``tree_mask`` and ``leftpad``: the step's replaced (:func:`chunked_attention`)."""
    if leftpad is None:
        leftpad = step.leftpad.get(window) if window and step.leftpad else None
    seqlens = step.seqlens if seqlens is None else seqlens
    tree_mask = step.tree_mask if tree_mask is _STEPS else tree_mask
    if sinks is None:
        return verify_attention_trusted(q, k, v, seqlens, tree_mask, window, scale, softcap,
                                        cache_leftpad=leftpad, alibi_slopes=alibi)
    from .llama import _row_sigmoid

    out, lse = verify_attention_trusted(q, k, v, seqlens, tree_mask, window, scale, softcap,
                                        return_lse=True, cache_leftpad=leftpad, alibi_slopes=alibi)
    z = lse - sinks.float()[:, None]  # [B, Hq, T]
    factor = _row_sigmoid(z).transpose(1, 2)[..., None]
    return (out.float() * factor).to(out.dtype)


def chunked_attention(q, k, v, step: Step, chunk: int, scale: float, softcap: float, sinks=None,
                      alibi=None) -> torch.Tensor:
    """:func:`attention` on a layer of chunks of ``chunk`` positions over a cache whose slots are the positions (a
    full cache): the query at position p sees ``p - p % chunk .. p`` only (Llama 4's chunked layers, transformers'
    chunked mask). Where every query of a row is in the chunk of the row's first new token (a step that crosses no
    chunk boundary), one call from that chunk's start (``cache_leftpad``). Otherwise (a read of the step's chunks on
    the host: a synchronisation on a GPU, as a mixture's layer has anyway) the queries of each later chunk are
    computed apart: for a causal step whose rows start at one position (a prefill), each chunk's run of queries over
    the slots up to its end, from its start (no mask, no wasted work); else (tree steps, rows of different lengths)
    every query again over the new tokens of that chunk alone (the step's mask narrowed, no prefix), each query's
    output taken from its own chunk's call."""
    T = step.T
    start = step.seqlens - T  # int32 [B]: each row's first new position (slot = position)
    first = torch.div(start, chunk, rounding_mode="floor")
    lo = first * chunk
    if T == 1:
        return attention(q, k, v, step, 0, scale, softcap, sinks, alibi, leftpad=lo)
    ahead = torch.div(step.positions, chunk, rounding_mode="floor") - first[:, None]  # [B, T]: chunks past the first
    spans = int(ahead.max())
    if spans <= 0:
        return attention(q, k, v, step, 0, scale, softcap, sinks, alibi, leftpad=lo)
    if step.tree_mask is None and bool((start == start[0]).all()):  # one run of queries per chunk, as its own step
        s0, outs, t = int(start[0]), [], 0
        while t < T:
            begin = (s0 + t) - (s0 + t) % chunk
            t1 = min(T, begin + chunk - s0)
            outs.append(attention(q[:, t:t1], k, v, step, 0, scale, softcap, sinks, alibi, seqlens=start + t1,
                                  leftpad=torch.full_like(start, begin)))
            t = t1
        return torch.cat(outs, 1)
    out = attention(q, k, v, step, 0, scale, softcap, sinks, alibi, leftpad=lo)
    base = step.tree_mask if step.tree_mask is not None else torch.ones(
        T, T, dtype=torch.bool, device=q.device).tril().expand(q.shape[0], T, T)
    for m in range(1, spans + 1):
        mine = (ahead == m)  # [B, T]: the queries (and the new keys) of the m-th chunk past the first
        got = attention(q, k, v, step, 0, scale, softcap, sinks, alibi, tree_mask=base & mine[:, None, :],
                        leftpad=start)
        out = torch.where(mine[:, :, None, None], got, out)
    return out


def indexed_attention(q, k, index_k, index_q, weights, prefix, tree_mask, topk: int, n: int, scale: float,
                      softcap: float, choice=None) -> tuple:
    """DeepSeek-V3.2's sparse attention: each query of ``q`` ``[B, T, H, D]`` over its ``topk`` best keys of the
    buffer ``k`` ``[B, >= n, 1, D]`` (the values are the keys: the latent attention's) by the indexer's score, and
    over every key it sees where it sees at most ``topk``. Query ``t`` of row ``b`` sees the keys before the step's
    (slots below ``prefix[b]``) and the step's keys at ``prefix[b] + j`` for ``j <= t`` (``tree_mask``, bool
    ``[B, T, T]``: its ancestors-or-self), all below ``n`` (a host-side bound). The score of key ``s`` for query
    ``t``: ``sum_h weights[b, t, h] * relu(index_q[b, t, h] . index_k[b, s] / sqrt(index_head_dim))`` in float32,
    as transformers' DeepseekV32Indexer computes it; its best ``topk`` are kept (on equal scores the earlier slots,
    where transformers' ``topk`` picks any), and the query attends to them in slot order through
    ``verify_attention`` (each query a row of its own: a query's bits are those of a one-token step over the same
    keys, whatever the pass; over every key it sees, those of the dense attention). The queries go in blocks that
    keep the scores and the gathered keys to some 256 MB. -> ``(output [B, T, H, D], choice)``: ``choice`` the
    chosen slots (int64 ``[B, T, K]``, in slot order, ``K = min(topk, n)``) and their count per query (``[B, T]``);
    given as ``choice`` (GLM-5's layers that share the previous layer's), the indexer's arguments are not read."""
    B, T, H, D = q.shape
    K = min(topk, n)
    dev = q.device
    block = max(1, min(T, (1 << 26) // max(1, B * K * D)))
    if choice is None:
        block = max(1, min(block, (1 << 26) // max(1, B * index_q.shape[2] * n)))
    out, chosen_all, counts = [], [], []
    rows = torch.arange(B, device=dev)[:, None, None]
    keys = None if choice is not None else index_k[:, :n]
    for t0 in range(0, T, block):
        t1 = min(T, t0 + block)
        if choice is None:
            chosen, count = _choose(keys, index_q, weights, prefix, tree_mask, K, t0, t1)
        else:
            chosen, count = choice[0][:, t0:t1], choice[1][:, t0:t1]
        gathered = k[rows, chosen].reshape(B * (t1 - t0), K, 1, D)  # each query's keys in slot order
        o = verify_attention_trusted(q[:, t0:t1].reshape(B * (t1 - t0), 1, H, D), gathered, gathered,
                                     count.reshape(-1).to(torch.int32), None, 0, scale, softcap)
        out.append(o.view(B, t1 - t0, H, D))
        chosen_all.append(chosen)
        counts.append(count)
    if len(out) == 1:
        return out[0], (chosen_all[0], counts[0])
    return torch.cat(out, 1), (torch.cat(chosen_all, 1), torch.cat(counts, 1))


@torch.no_grad()
def _choose(keys, index_q, weights, prefix, tree_mask, K: int, t0: int, t1: int) -> tuple:
    """:func:`indexed_attention`'s choice for the step's queries ``t0 .. t1 - 1`` over the index ``keys`` ``[B, n,
    Dh]``: ``(slots [B, t, K], count [B, t])``, the first ``count`` slots chosen, in slot order (the others 0). No
    gradient: a choice (as transformers' indexer, under ``no_grad``)."""
    B, T, n_heads, Dh = index_q.shape
    n, dev = keys.shape[1], index_q.device
    slot = torch.arange(n, device=dev)
    score = _index_scores(keys, index_q[:, t0:t1].float(), weights[:, t0:t1].float(), Dh ** -0.5)
    j = slot - prefix[:, None, None]  # the step's key j at slot prefix + j
    t = torch.arange(t0, t1, device=dev)[None, :, None]
    if tree_mask is None:
        seen = j <= t
    else:
        seen = tree_mask[:, t0:t1].gather(-1, j.clamp(0, T - 1).expand(B, t1 - t0, n)) & (j < T)
    seen = seen | (j < 0)
    score = score.masked_fill(~seen, float("-inf"))
    # the K best: those above the K-th best score, then the earliest of those equal to it (topk's values are
    # the same whichever of equal scores it picks); where a query sees fewer, every key it sees
    kth = torch.topk(score, K, dim=-1, sorted=False).values.amin(-1, keepdim=True)
    take = score > kth
    tie = (score == kth) & seen
    take |= tie & (tie.cumsum(-1) <= K - take.sum(-1, keepdim=True))
    chosen = torch.zeros(B, t1 - t0, K + 1, dtype=torch.long, device=dev)  # (column K: the others' write-off)
    chosen.scatter_(-1, torch.where(take, take.cumsum(-1) - 1, K), slot.expand(B, t1 - t0, n))
    return chosen[..., :K], take.sum(-1)


def _index_scores(keys, q, w, scale: float) -> torch.Tensor:
    """The indexer's scores ``[B, t, n]`` (float32) of the queries ``q`` ``[B, t, heads, Dh]`` (float32) with head
    weights ``w`` ``[B, t, heads]`` against ``keys`` ``[B, n, Dh]``: ``sum_h w_h relu(scale * q_h . k)``. On the CPU
    with the extension, ``triforce_C::index_scores`` (csrc/cpu/dsa.cpp: one pass over the keys, a 16-bit cache's
    converted on the fly; ``TRIFORCE_INDEX_SCORES=0`` turns it off); else the products by :func:`linear` over blocks
    of ``_KEY_BLOCK`` keys made float32, then the ATen ops, as transformers' DeepseekV32Indexer orders them. Either
    way a score's bits are its query's and key's alone, whatever the pass."""
    B, t, n_heads, Dh = q.shape
    n = keys.shape[1]
    native = _cache_op("index_scores", "TRIFORCE_INDEX_SCORES") if keys.device.type == "cpu" else None
    if native is not None:
        return torch.stack([native(q[b], keys[b], w[b], scale) for b in range(B)]).view(B, t, n)
    score = torch.empty(B, t, n, device=q.device)
    for s0 in range(0, n, _KEY_BLOCK):  # (a block's scores stay in the caches)
        s1 = min(n, s0 + _KEY_BLOCK)
        for b in range(B):
            s = _linear(q[b].reshape(-1, Dh), keys[b, s0:s1].float()).view(t, n_heads, s1 - s0)
            torch.sum(s.mul_(scale).relu_().mul_(w[b, :, :, None]), 1, out=score[b, :, s0:s1])
    return score


_KEY_BLOCK = 8192  # keys scored at a time by _index_scores' ATen path


def _linear(x, w):
    from .llama import linear

    return linear(x, w)


class _KVCache:
    """Shared machinery: per-layer k/v ``[B, capacity, Hkv, D]``, lengths, rollback, commit_path."""

    def __init__(self, config: LlamaConfig, batch_size: int, capacity: int, device=None, dtype=None):
        if not isinstance(config, LlamaConfig):
            raise TypeError(f"config must be a LlamaConfig, got {type(config).__name__}")
        for name, v in (("batch_size", batch_size), ("capacity", capacity)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        dtype = dtype or torch.get_default_dtype()
        if dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise TypeError(f"dtype must be float32/float16/bfloat16, got {dtype}")
        self.config = config
        self.batch_size = batch_size
        self.capacity = capacity
        self.device = as_device(device if device is not None else "cpu")
        self.dtype = dtype
        self.num_layers = config.num_hidden_layers
        # each layer's [B, capacity, Hkv, D] (Hkv: the layer's own, MiMo-V2-Flash's sliding layers twice the others')
        shapes = [(batch_size, capacity, config.layer_kv_heads(i), config.head_dim) for i in range(self.num_layers)]
        # DeepSeek's latent attention (config.mla): its values are its cached keys (the latent, and the RoPE'd dims,
        # whose share of the output the model drops), so v[layer] is k[layer] (one buffer, not two copies)
        self.values_are_keys = config.mla is not None
        self.k, self.v = self._allocate(shapes)
        self.lengths = torch.zeros(batch_size, dtype=torch.int32, device=self.device)
        self._batch_index = torch.arange(batch_size, device=self.device)[:, None]
        self._bound = 0  # host-side upper bound of max(lengths)
        # Each layer's sliding window for verify_attention (0: none), over the ranks of the keys a query sees.
        # A cache whose ranks are in position order applies the model's: the full cache, and a retrieval
        # cache's windowed layers, which hold the most recent positions (RetrievalCache, exact_windows). A
        # StreamingLLM cache applies it from the first sink the window still reaches (StreamingCache._leftpads).
        self.windows = (0,) * self.num_layers
        # Each layer's chunk of positions (Llama 4's chunked layers; 0: none), applied where slots are positions (the
        # full cache); the other caches' layers see what they hold, as a draft's (docs/model.md, "Llama 4")
        self.chunks = (0,) * self.num_layers
        self.scale = config.attention_scale  # the attention scores' scale
        self.softcap = config.attn_softcap or 0.0  # Gemma 2's cap on them (0: none)
        slopes = config.alibi_slopes  # ALiBi's (BLOOM, MPT, Falcon-RW): verify_attention's alibi_slopes, or None
        self.alibi = None if slopes is None else torch.tensor(slopes, dtype=torch.float32, device=self.device)
        self._rope_long = None  # LongRoPE's choice per row: a full or StreamingLLM cache's own (_rows_long)
        # LFM2's convolution layers: each one's inputs [B, ring + 1, hidden] (None on the other layers), the input of
        # the token at position p of its sequence at p % ring (the last slot takes the writes that keep nothing); per
        # row the positions whose inputs the ring holds, [conv_lo, conv_hi) less what the ring overwrote
        self.conv_kernel = config.conv_kernel
        # (Mamba's layers: and the tokens a replay may go back over, from the oldest checkpoint)
        self.conv_ring = min(capacity, CONV_HISTORY) + self.conv_kernel + (
            SSM_CHECKPOINTS * SSM_CHECKPOINT_STRIDE if config.recurrent is not None else 0)
        self.conv = [torch.zeros(batch_size, self.conv_ring + 1, config.conv_width(i), device=self.device, dtype=dtype)
                     if c else None for i, c in enumerate(config.conv_layers)]
        self._conv_span = torch.zeros(2, batch_size, dtype=torch.int64, device=self.device) \
            if self.conv_kernel else None
        # The recurrent layers (config.recurrent: Mamba-2's, gated DeltaNet's): each one's state [B, *state_shape]
        # (float32) at sequence position ssm_at (-1: none: after a tree, or a rollback, the next forward rebuilds it),
        # the states at the start of the last SSM_CHECKPOINTS forwards (and their positions), and a ring as the
        # convolution's of what each token adds to the state (float32: Mamba's x, B, dt and decay; DeltaNet's key,
        # value, beta and decay), from which a rollback's state is replayed from the checkpoint before it
        r = self.recurrent = config.recurrent
        if r is not None:
            shape = (batch_size,) + r.state_shape
            self.ssm = [torch.zeros(shape, device=self.device) if c else None for c in r.layers]
            self.ssm_in = [torch.zeros(batch_size, self.conv_ring + 1, r.ring_width, device=self.device) if c else None
                           for c in r.layers]
            self.ssm_at = torch.zeros(batch_size, dtype=torch.int64, device=self.device)
            self._ckpt = [torch.zeros((SSM_CHECKPOINTS,) + shape, device=self.device) if c else None
                          for c in r.layers]
            self._ckpt_pos = torch.full((SSM_CHECKPOINTS, batch_size), -1, dtype=torch.int64, device=self.device)
            self._mamba1_A = [None] * self.num_layers  # (Mamba(-1)'s A per layer, for its replays: _replay)
            self._ckpt_next = 0

    @property
    def rope_long(self) -> torch.Tensor | None:
        """LongRoPE: bool ``[B]``, the rows whose tokens the model rotates with the long factors (docs/model.md,
        "LongRoPE"); None for every other RoPE."""
        return self._rope_long

    # ---- LFM2's convolution layers (config.conv_layers)
    def _seq_offset(self):
        """The sequence position of slot 0 (int64 ``[B]``), or None where slots are positions (a full cache)."""
        return None

    def _seq_lengths(self) -> torch.Tensor:
        off = self._seq_offset()
        return self.lengths.long() if off is None else self.lengths.long() + off

    def _conv_plan(self, step: Step) -> tuple:
        """``(history slots [B, K-1], history present [B, K-1], windows [B, T, K], write slots [B, T])`` of a step:
        the ring slots of the inputs of the ``K - 1`` positions before the step, each token's window as indices into
        those and the step's tokens (its ancestors along a tree, oldest first, then itself), and where each token's
        input goes (the ring's last slot for padding and, in a step longer than the ring, what it would overwrite)."""
        K, R, dev = self.conv_kernel, self.conv_ring, self.device
        B, T = step.slots.shape
        off = self._seq_offset()
        seq0 = step.slots[:, 0] if off is None else step.slots[:, 0] + off
        hp = seq0[:, None] + torch.arange(1 - K, 0, device=dev)
        present = hp >= 0
        hist = torch.where(present, hp % R, R)
        back = torch.arange(K - 1, -1, -1, device=dev)  # steps back, oldest first
        t = torch.arange(T, device=dev)
        if step.tree_mask is None:
            win = (t[:, None] - back).expand(B, T, K)
        else:  # the ancestor at each depth: one of the token's ancestors-or-self; before the tree: -1, -2, ...
            mask = step.tree_mask
            depth = mask.sum(-1) - 1
            want = depth[:, :, None] - back  # [B, T, K]
            hit = mask[:, :, None, :] & (depth[:, None, None, :] == want[..., None])
            win = torch.where(want >= 0, hit.to(torch.uint8).argmax(-1), want)
        counts = step.counts.long()[:, None]
        kept = (t < counts) & (t >= counts - R)
        write = torch.where(kept, (seq0[:, None] + t) % R, R)
        return hist, present, win + (K - 1), write

    def convolve(self, layer: int, x: torch.Tensor, step: Step, weight: torch.Tensor,
                 bias: torch.Tensor | None) -> torch.Tensor:
        """LFM2's convolution of the step's inputs ``x`` ``[B, T, hidden]`` at layer ``layer`` over each token's
        window (:func:`short_conv`): the inputs before the step from this layer's ring, which then takes the step's
        (in the cache's dtype, in which it computes, as :meth:`attend`)."""
        if step.conv is None:
            step.conv = self._conv_plan(step)
        hist, present, win, write = step.conv
        ring = self.conv[layer]
        xin = x.to(ring.dtype)
        before = torch.where(present[..., None], ring[self._batch_index, hist], 0)
        ext = torch.cat([before, xin], 1)
        out = short_conv(ext[self._batch_index[:, :, None], win], weight, bias)
        ring[self._batch_index, write] = xin
        return out.to(x.dtype)

    def _conv_reach(self, targets: torch.Tensor) -> None:
        """Raise (a CPU cache: the values are read for free there) where a row's next forward at sequence length
        ``targets`` would read inputs its rings no longer hold (a rollback deeper than they keep), or, with recurrent
        layers, where no checkpoint of their states at or before it remains, or its replay's inputs are gone."""
        if self._conv_span is None or not check_values(targets):
            return
        lo, hi = self._conv_span
        start = (targets - (self.conv_kernel - 1)).clamp(min=0)
        if self.recurrent is not None:  # (the replay reads from the checkpoint on)
            best = self._best_checkpoint(targets)[0]
            moved = targets != self.ssm_at
            if bool((moved & (best < 0)).any()):
                raise ValueError(f"{type(self).__name__}: a row would go back to {targets.tolist()} tokens, before "
                                 f"every checkpoint of its recurrent layers' states ({self._ckpt_pos.tolist()}): roll "
                                 f"back at most ~{SSM_CHECKPOINTS * SSM_CHECKPOINT_STRIDE} tokens "
                                 "(triforce.models.cache.SSM_CHECKPOINTS, SSM_CHECKPOINT_STRIDE)")
            start = torch.where(moved, torch.minimum(start, best.clamp(min=0)), start)
        bad = (targets > 0) & ((start < lo) | (hi - start > self.conv_ring) | (start > hi))
        if bool(bad.any()):
            raise ValueError(f"{type(self).__name__}: a row would go back to {targets[bad].tolist()} tokens, but its "
                             f"convolution layers hold the inputs of positions {lo[bad].tolist()} .. "
                             f"{hi[bad].tolist()} less what their ring of {self.conv_ring} overwrote: roll back at "
                             f"most {CONV_HISTORY} tokens (triforce.models.cache.CONV_HISTORY)")

    # ---- the recurrent layers (config.recurrent: Mamba-2's, gated DeltaNet's)
    def _best_checkpoint(self, targets: torch.Tensor) -> tuple:
        """``(position, index)`` per row of its latest checkpoint at or before ``targets`` (position -1: none)."""
        pos = self._ckpt_pos
        best = torch.where((pos >= 0) & (pos <= targets[None]), pos, -1).max(0)
        return best.values, best.indices

    def _ssm_materialize(self, targets: torch.Tensor) -> None:
        """Each recurrent layer's state at sequence length ``targets`` (int64 ``[B]``): kept where it is there, else the
        latest checkpoint at or before it with the ring's tokens from there replayed (:meth:`_replay`). One host read
        (the replay's length)."""
        need = self.ssm_at != targets
        if not bool(need.any()):
            return
        self._conv_reach(targets)
        best, j = self._best_checkpoint(targets)
        start = best.clamp(min=0)
        n = torch.where(need, targets - start, 0)
        R, B = self.conv_ring, self.batch_size
        rows = torch.arange(B, device=self.device)
        span = torch.arange(int(n.max()), device=self.device)
        at = torch.where(span[None] < n[:, None], (start[:, None] + span) % R, R)  # [B, steps] ring slots
        # (every row from one checkpoint, the engines' case: replayed in place; else gathered and merged)
        whole = check_values(j) and bool(need.all()) and bool((j == j[0]).all())
        for layer, ring in enumerate(self.ssm_in):
            if ring is None:
                continue
            if whole:
                state = self.ssm[layer].copy_(self._ckpt[layer][int(j[0])])
            else:
                state = self._ckpt[layer][j, rows]  # (a copy: the checkpoint stays)
            self._replay(layer, state, ring[self._batch_index, at], n)
            if not whole:
                self.ssm[layer].copy_(torch.where(_per_row(need, state), state, self.ssm[layer]))
        self.ssm_at.copy_(torch.where(need, targets, self.ssm_at))

    def _replay(self, layer: int, state: torch.Tensor, saved: torch.Tensor, n: torch.Tensor) -> None:
        """Advance ``state`` (one layer's, ``[B, *state_shape]``) in place over each row's first ``n[b]`` tokens of
        ``saved`` ``[B, steps, ring_width]`` (what :meth:`_recur` kept of them), through the layer's own scan."""
        r, B = self.recurrent, state.shape[0]
        if isinstance(r, Mamba1):  # (its A: the layer's parameter, which its forwards hand the cache)
            x, dt, b = saved.split([r.inner, r.inner, r.state], dim=-1)
            selective_scan(state, x, dt, self._mamba1_A[layer], b, None, n)
            return
        if isinstance(r, DeltaNet):
            k, v, beta, decay = saved.split([r.k_heads * r.k_dim, r.v_heads * r.v_dim, r.v_heads, r.decay_width],
                                            dim=-1)
            if r.channel_decay:  # (Kimi's KDA: a decay per key channel)
                decay = decay.reshape(B, -1, r.v_heads, r.k_dim)
            delta_scan(state, None, k.reshape(B, -1, r.k_heads, r.k_dim), v.reshape(B, -1, r.v_heads, r.v_dim), beta,
                       decay, n)
            return
        x, bg, dt, decay = saved.split([r.inner, r.groups * r.state, r.heads, r.heads], dim=-1)
        bg = bg.reshape(B, -1, r.groups, r.state)
        ssm_scan(state, x.reshape(B, -1, r.heads, r.head_dim), bg, torch.zeros_like(bg), dt, decay,
                 torch.zeros(r.heads, device=state.device), n)

    def _ssm_checkpoint(self, positions: torch.Tensor, always: bool = False) -> None:
        """The states (at ``positions``) into the next checkpoint where the latest is at or before every row's position
        by less than :data:`SSM_CHECKPOINT_STRIDE` tokens (and ``always`` is not set), else none."""
        last = self._ckpt_pos[(self._ckpt_next - 1) % SSM_CHECKPOINTS]
        if not always and self._ckpt_next and bool(((last >= 0) & (last <= positions)
                                                    & (positions - last < SSM_CHECKPOINT_STRIDE)).all()):
            return
        slot = self._ckpt_next % SSM_CHECKPOINTS
        for ckpt, state in zip(self._ckpt, self.ssm):
            if ckpt is not None:
                ckpt[slot].copy_(state)
        self._ckpt_pos[slot] = positions
        self._ckpt_next += 1

    def _ssm_begin(self, step: Step) -> None:
        """A forward's start: the states at its first token's position, checkpointed."""
        off = self._seq_offset()
        start = step.slots[:, 0] if off is None else step.slots[:, 0] + off
        self._ssm_materialize(start)
        self._ssm_checkpoint(start)

    def _ssm_take(self, src: "_KVCache", positions: torch.Tensor) -> None:
        """``src``'s states at ``positions`` (rebuilt there where they are not) as this cache's, checkpointed."""
        src._ssm_materialize(positions)
        for mine, theirs in zip(self.ssm, src.ssm):
            if mine is not None:
                mine.copy_(theirs)
        self.ssm_at.copy_(positions)
        self._ssm_checkpoint(positions, always=True)

    def scan(self, layer: int, x, B, C, dt, decay, D, step: Step) -> torch.Tensor:
        """A Mamba-2 layer's state space model over the step's tokens (float32: ``x`` ``[b, T, H, P]``, ``B`` and
        ``C`` ``[b, T, G, N]``, ``dt`` and ``decay`` ``[b, T, H]``, ``D`` ``[H]``; :func:`ssm_scan`) -> ``[b, T, H, P]``
        (:meth:`_recur`: each token's x, B, dt and decay kept for a replay)."""
        b, T = x.shape[:2]
        saved = torch.cat([x.reshape(b, T, -1), B.reshape(b, T, -1), dt, decay], -1)
        return self._recur(layer, saved, step, lambda state, t, n: ssm_scan(
            state, x[:, t], B[:, t], C[:, t], dt[:, t], decay[:, t], D, n))

    def delta_rule(self, layer: int, q, k, v, beta, decay, step: Step) -> torch.Tensor:
        """A gated DeltaNet layer over the step's tokens (float32: ``q``, ``k`` ``[b, T, Hk, K]``, ``v`` ``[b, T, Hv,
        V]``, ``beta`` and ``decay`` ``[b, T, Hv]``, Kimi's KDA's decay ``[b, T, Hv, K]``; :func:`delta_scan`) ->
        ``[b, T, Hv, V]`` (:meth:`_recur`: each token's key, value, beta and decay kept for a replay)."""
        b, T = k.shape[:2]
        saved = torch.cat([k.reshape(b, T, -1), v.reshape(b, T, -1), beta, decay.reshape(b, T, -1)], -1)
        return self._recur(layer, saved, step, lambda state, t, n: delta_scan(
            state, q[:, t], k[:, t], v[:, t], beta[:, t], decay[:, t], n))

    def selective(self, layer: int, x, dt, A, B, C, step: Step) -> torch.Tensor:
        """A Mamba(-1) layer's selective state space model over the step's tokens (float32: ``x`` and ``dt`` ``[b, T,
        D]``, ``A`` ``[D, N]``, ``B`` and ``C`` ``[b, T, N]``; :func:`selective_scan`) -> ``[b, T, D]``
        (:meth:`_recur`: each token's x, dt and B kept for a replay, which takes ``A`` as this call gives it)."""
        self._mamba1_A[layer] = A
        saved = torch.cat([x, dt, B], -1)
        return self._recur(layer, saved, step, lambda state, t, n: selective_scan(
            state, x[:, t], dt[:, t], A, B[:, t], C[:, t], n))

    def _recur(self, layer: int, saved: torch.Tensor, step: Step, run) -> torch.Tensor:
        """A recurrent layer over the step's tokens from its state at the step's start, each token from its parent's
        state along a tree: ``run(state, tokens, counts)`` advances ``state`` in place over the step's ``tokens`` (a
        slice) and returns their outputs. A chain's rows advance the layer's state over their real tokens; ``saved``
        ``[b, T, ring_width]`` goes to the layer's ring (the convolution's slots, ``step.conv``) for a later rollback's
        replay (:meth:`_replay`)."""
        b, T = saved.shape[:2]
        self.ssm_in[layer][self._batch_index, step.conv[3]] = saved
        state, out = self.ssm[layer], []
        if step.tree_mask is None:
            return run(state, slice(None), step.counts)
        mask = step.tree_mask
        depth = mask.sum(-1) - 1
        parent = torch.where(depth > 0, (mask & (depth[:, None, :] == depth[..., None] - 1)).to(torch.uint8).argmax(-1),
                             -1)
        nodes = state.new_empty((b, T) + tuple(state.shape[1:]))
        rows = torch.arange(b, device=saved.device)
        for t in range(T):  # (each node from its parent's state, a copy)
            p = parent[:, t]
            node = torch.where(_per_row(p < 0, state), state, nodes[rows, p.clamp(min=0)])
            out.append(run(node, slice(t, t + 1), None)[:, 0])
            nodes[:, t] = node
        return torch.stack(out, 1)

    def _conv_copy(self, src: "_KVCache", upto: torch.Tensor) -> None:
        """The inputs of positions ``upto - K + 1 .. upto - 1`` (int64 ``[B]``) from ``src``'s rings into this
        cache's; the rows then hold ``[upto - K + 1, upto)`` (and go on from ``upto``)."""
        if self._conv_span is None:
            return
        K = self.conv_kernel
        p = upto[:, None] + torch.arange(1 - K, 0, device=self.device)
        ok = p >= 0
        dst = torch.where(ok, p % self.conv_ring, self.conv_ring)
        srcs = torch.where(ok, p % src.conv_ring, src.conv_ring)
        for mine, theirs in zip(self.conv, src.conv):
            if mine is not None:
                mine[self._batch_index, dst] = theirs[self._batch_index, srcs]
        self._conv_span[0] = (upto - (K - 1)).clamp(min=0)
        self._conv_span[1] = upto

    def _allocate(self, shapes):
        """Per-layer ``k`` and ``v`` buffers, layer i's of ``shapes[i]`` (zeros; ``v``'s the same tensors as ``k``'s
        where the values are the keys)."""
        k = [torch.zeros(shape, device=self.device, dtype=self.dtype) for shape in shapes]
        if self.values_are_keys:
            return k, list(k)
        return k, [torch.zeros(shape, device=self.device, dtype=self.dtype) for shape in shapes]

    # ---- buffers that move with token slots (k, v, and k_raw for the streaming cache; each once)
    def _slot_buffers(self, layer: int):
        return (self.k[layer],) if self.values_are_keys else (self.k[layer], self.v[layer])

    def memory_bytes(self) -> int:
        """Bytes held by the cache's tensors (constant after construction)."""
        return sum(t.numel() * t.element_size() for t in self._tensors())

    def _tensors(self):
        yield self.lengths
        for layer in range(self.num_layers):
            yield from self._slot_buffers(layer)
        yield from self._conv_tensors()

    def _conv_tensors(self):
        yield from (t for t in self.conv if t is not None)
        if self._conv_span is not None:
            yield self._conv_span
        if self.recurrent is not None:
            for part in (self.ssm, self.ssm_in, self._ckpt):
                yield from (t for t in part if t is not None)
            yield from (self.ssm_at, self._ckpt_pos)

    def reset(self) -> None:
        """Forget every token (lengths = 0); buffers are kept."""
        self.lengths.zero_()
        self._bound = 0
        if self._conv_span is not None:
            self._conv_span.zero_()
        if self.recurrent is not None:
            for t in self.ssm:
                if t is not None:
                    t.zero_()
            self.ssm_at.zero_()
            self._ckpt_pos.fill_(-1)

    # ---- rows leaving the batch
    def select_rows(self, rows) -> None:
        """Keep the sequences ``rows`` and drop the others: row ``i`` becomes the old row ``rows[i]`` and
        ``batch_size`` becomes ``len(rows)``. ``rows``: distinct row indices (a list of ints or a 1-D integer
        tensor, read on the host), at least one. The engines call it when finished sequences leave the batch
        (docs/engines.md, "Finished rows leave the batch"), on every cache of the call with the same ``rows``.

        A full or retrieval cache moves the rows it keeps into the first ``len(rows)`` rows of its buffers in
        place and narrows them (no allocation) when every kept row either stays or comes from past that range
        (:func:`rows_in_place` orders them so): only the moved rows' tokens are copied. Otherwise, and for a
        StreamingLLM cache's joint buffer, the kept rows are gathered into new buffers. Graphs captured on this
        cache are dropped (:mod:`triforce.models.graphs`): the next forwards capture the new shape."""
        from . import graphs

        rows, idx = _check_rows(rows, self.batch_size, self.device)
        moves = _moves(rows)
        self._select_rows(idx, moves)
        self.batch_size = len(rows)
        self._batch_index = self._batch_index[: len(rows)]
        graphs.forget(self)

    def _select_rows(self, idx: torch.Tensor, moves) -> None:
        upto = self._bound  # slots past every row's length are never read
        for layer in range(self.num_layers):
            self.k[layer] = _take_rows(self.k[layer], idx, moves, upto)
            self.v[layer] = self.k[layer] if self.values_are_keys else _take_rows(self.v[layer], idx, moves, upto)
        self.lengths = self.lengths[idx]
        if self._rope_long is not None:
            self._rope_long = self._rope_long[idx]
        self._select_conv(idx)

    def _select_conv(self, idx: torch.Tensor) -> None:
        self.conv = [None if t is None else t[idx] for t in self.conv]
        if self._conv_span is not None:
            self._conv_span = self._conv_span[:, idx]
        if self.recurrent is not None:
            self.ssm, self.ssm_in = ([None if t is None else t[idx] for t in part] for part in (self.ssm, self.ssm_in))
            self._ckpt = [None if t is None else t[:, idx] for t in self._ckpt]
            self.ssm_at, self._ckpt_pos = self.ssm_at[idx], self._ckpt_pos[:, idx]

    # ---- capacity
    def _room(self) -> int:
        return self.capacity

    def tighten_bound(self, max_length: int) -> None:
        """``max_length``: ``max(lengths)`` now, read by the caller in a read it makes anyway (the engines'
        once-per-step read). Capacity checks then need no read of their own until the cache has grown
        past it again. Never loosens the bound."""
        self._bound = min(self._bound, int(max_length))

    def _ensure_room(self, T: int) -> None:
        room = self._room()
        if self._bound + T > room:
            self._bound = int(self.lengths.max())  # one device read, only near the limit
            if self._bound + T > room:
                raise ValueError(f"{type(self).__name__} is full: a sequence holds {self._bound} tokens and "
                                 f"{T} more do not fit in {room} slots (allocate a larger cache)")

    def _position_offset(self):
        return None

    # ---- one forward
    def begin(self, T: int, tree_parents=None, counts=None, query_index=None, query_valid=None) -> Step:
        self._ensure_room(T)
        ar = torch.arange(T, device=self.device)
        slots = self.lengths.long()[:, None] + ar
        tree_mask = None
        if tree_parents is None:
            positions = slots
        else:
            tree = tree_parents if isinstance(tree_parents, TokenTree) else TokenTree(tree_parents)
            tree_mask = tree.mask
            positions = self.lengths.long()[:, None] + tree.depths
        off = self._position_offset()
        if off is not None:
            positions = positions + off[:, None]
        if counts is None:
            counts = torch.full((self.batch_size,), T, dtype=torch.int32, device=self.device)
        step = Step(T, self._batch_index, slots, positions, self.lengths + T, counts, tree_mask, query_index,
                    query_valid)
        if self.recurrent is not None:
            self._ssm_begin(step)
        return step

    def _write(self, layer: int, k, v, step: Step) -> None:
        self.k[layer][step.batch_index, step.slots] = k
        if not self.values_are_keys:  # (else v holds k's values: the model passes its keys as the values)
            self.v[layer][step.batch_index, step.slots] = v

    def attend(self, layer: int, q, k, v, step: Step, k_raw=None, sinks=None) -> torch.Tensor:
        """Write the step's keys/values at ``lengths .. lengths+T-1`` and attend over the cache (each query over
        the last ``windows[layer]`` positions it sees, where that is not 0; ``sinks``: :func:`attention`'s)."""
        self._write(layer, k, v, step)
        if self.chunks[layer]:
            return chunked_attention(q, self.k[layer], self.v[layer], step, self.chunks[layer], self.scale,
                                     self.softcap, sinks, self.alibi)
        return attention(q, self.k[layer], self.v[layer], step, self.windows[layer], self.scale, self.softcap, sinks,
                         self.alibi)

    def _native_buffers(self, step: Step):
        """``(k, v, k_raw, last_query)``, lists of per-layer buffers (``[]`` where the cache keeps none), when
        this cache's ``attend`` of every layer is exactly: record ``last_query``, write the step's keys (and
        un-RoPE'd keys) and values at ``step.slots``, ``verify_attention`` over ``k[layer]``, ``v[layer]``
        with ``step.seqlens``, ``step.tree_mask`` and ``windows[layer]``. The model layer then runs its layers and
        this cache's side of them in one native call (``triforce_C::decoder_layers``, csrc/cpu/decoder.cpp). ``None``
        otherwise (a subclass that changes ``attend`` or ``_write``, a StreamingLLM cache's large step)."""
        if self._changed(_KVCache):
            return None
        return self.k, self.v, [], []

    def _changed(self, cls) -> bool:
        """Whether a subclass replaced ``cls.attend`` or ``_write`` (the native path then steps aside)."""
        return type(self).attend is not cls.attend or type(self)._write is not _KVCache._write

    def end(self, step: Step) -> None:
        self.lengths.add_(step.counts)
        self._bound += step.T
        self._conv_end(step)

    def _conv_end(self, step: Step) -> None:
        """After a forward: the rows' rings hold their inputs up to their length (and those they held); the recurrent
        layers' states are at that length after a chain, at none after a tree (the next forward rebuilds them)."""
        if self._conv_span is not None:
            torch.maximum(self._conv_span[1], self._seq_lengths(), out=self._conv_span[1])
        if self.recurrent is not None:
            self.ssm_at.copy_(self._seq_lengths() if step.tree_mask is None else torch.full_like(self.ssm_at, -1))

    # ---- speculative bookkeeping
    def rollback(self, new_lengths: torch.Tensor) -> None:
        """Drop each sequence's tail: ``lengths = min(lengths, new_lengths)``; ``new_lengths >= 0``, checked
        (``ValueError``) on a CPU cache, clamped at 0 on a GPU (a check there would be a host sync)."""
        _check_lengths("new_lengths", new_lengths, self.batch_size, self.device)
        if check_values(new_lengths) and bool((new_lengths < 0).any()):
            raise ValueError(f"new_lengths must be >= 0, got {new_lengths.tolist()}")
        if self._conv_span is not None:
            target = torch.minimum(self.lengths.long(), new_lengths.long().clamp(0, self.capacity))
            off = self._seq_offset()
            self._conv_reach(target if off is None else target + off)
        torch.minimum(self.lengths, new_lengths.clamp(0, self.capacity).to(torch.int32), out=self.lengths)

    def commit_path(self, base_lengths: torch.Tensor, path: torch.Tensor, num_accepted: torch.Tensor) -> None:
        """After a tree forward appended T nodes at ``base_lengths``: keep nodes
        ``path[b, :num_accepted[b]+1]`` compacted to slots ``base .. base+num_accepted`` and set
        ``lengths = base + num_accepted + 1``. Checked (``ValueError``) on a CPU cache, where it is free:
        ``0 <= num_accepted < depth+1``, ``0 <= base``, ``base + num_accepted + 1 <= lengths`` and each kept
        path entry in ``[0, lengths - base)`` (a node the forward appended). On a GPU, no host sync: the
        counts are clamped into ``[0, depth]``, the bases at 0, and slots past the capacity are never
        written."""
        _check_lengths("base_lengths", base_lengths, self.batch_size, self.device)
        _check_lengths("num_accepted", num_accepted, self.batch_size, self.device)
        if not isinstance(path, torch.Tensor) or path.dim() != 2 or path.shape[0] != self.batch_size \
                or path.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"path must be an int32/int64 tensor [{self.batch_size}, depth+1]")
        P = path.shape[1]
        j = torch.arange(P, device=self.device)
        if check_values(num_accepted):
            self._check_commit(base_lengths.long(), path.long(), num_accepted.long(), j)
        base_lengths, num_accepted = base_lengths.clamp(min=0), num_accepted.clamp(0, P - 1)
        base = base_lengths.long()[:, None]
        keep = (j[None] <= num_accepted.long()[:, None]) & (path >= 0)
        if self._conv_span is not None:  # (the kept nodes' inputs, as their keys: node path[j] to position base + j)
            off = self._seq_offset()
            seq = base if off is None else base + off[:, None]
            self._conv_reach(seq[:, 0])
            R = self.conv_ring
            fro = (seq + path.long().clamp(min=0)) % R
            to = torch.where(keep, (seq + j) % R, R)
            for ring in (*self.conv, *(self.ssm_in if self.recurrent is not None else ())):
                if ring is not None:
                    ring[self._batch_index, to] = ring[self._batch_index, fro]
        src = base + path.long().clamp(min=0)
        # An entry not kept repeats entry 0's move (the same value to the same slot), so no two entries
        # ever write different values to one slot (a clamped slot index past the capacity could).
        src = torch.where(keep, src, src[:, :1]).clamp(max=self.capacity - 1)
        dst = torch.where(keep, base + j, base).clamp(max=self.capacity - 1)
        for layer in range(self.num_layers):
            for buf in self._slot_buffers(layer):
                buf[self._batch_index, dst] = buf[self._batch_index, src]  # gathers first: ranges overlap
        new_len = (base_lengths.long() + num_accepted.long() + 1).to(torch.int32)
        self._after_commit(base_lengths, new_len, P)
        self.lengths.copy_(new_len)

    def _check_commit(self, base, path, num_accepted, j) -> None:
        P = path.shape[1]
        if bool(((num_accepted < 0) | (num_accepted >= P)).any()):
            raise ValueError(f"num_accepted must be in [0, {P - 1}] (path has {P} entries), "
                             f"got {num_accepted.tolist()}")
        appended = self.lengths.long() - base
        if bool(((base < 0) | (num_accepted + 1 > appended)).any()):
            raise ValueError(f"base_lengths + num_accepted + 1 must be <= lengths (the nodes the tree forward "
                             f"appended): base_lengths {base.tolist()}, num_accepted {num_accepted.tolist()}, "
                             f"lengths {self.lengths.tolist()}")
        kept = j[None] <= num_accepted[:, None]
        if bool((kept & ((path < 0) | (path >= appended[:, None]))).any()):
            raise ValueError(f"path: the kept entries must be nodes the tree forward appended, in [0, lengths - "
                             f"base_lengths), got {path.tolist()} with num_accepted {num_accepted.tolist()}")

    def _after_commit(self, base_lengths, new_lengths, max_new: int) -> None:
        pass


class FullCache(_KVCache):
    """Full KV cache: per layer ``k``, ``v`` ``[B, max_len, Hkv, D]`` and per-sequence ``lengths``.

    With ``chunk_size``, also keeps (for building a :class:`RetrievalCache`):

    - ``chunk_keys[layer]``: float32 ``[B, max_len // chunk_size, Hkv, D]``, the mean key of every
      complete chunk, maintained incrementally: after each forward, ``tk.chunk_mean_keys`` runs on the
      newly completed chunks only (valid for chunks ``< lengths // chunk_size``; a rollback below a chunk
      boundary makes that chunk be recomputed when it completes again);
    - ``last_query[layer]``: ``[B, Hq, D]``, the (RoPE'd) query of token 0 of the latest forward (after
      a prefill: of each prompt's last token).

    Args:
        config: the model's :class:`LlamaConfig`.
        batch_size: sequences.
        max_len: slots per sequence (prompt + generated + one speculative step), at most
            ``config.max_position_embeddings + speculative_slack``.
        device, dtype: of the buffers (any of float32 / float16 / bfloat16, whatever the model's: see
            ``Llama.kv_dtype``).
        chunk_size: enables chunk-mean keys, see above.
        speculative_slack: slots allowed past the model's context, for the speculative tail of a
            sequence that ends at the context limit: those tokens are verified but never emitted (a
            causal forward's earlier logits do not depend on them), so positions past the context
            never reach the output.
        rope_long: LongRoPE only: which rows the model rotates with its long factors, a bool for all or a bool
            tensor ``[B]``; default: all where ``max_len`` exceeds ``config.rope_long_from`` (the engines choose
            per row: docs/model.md, "LongRoPE").
    """

    def __init__(self, config: LlamaConfig, batch_size: int, max_len: int, device=None, dtype=None,
                 chunk_size: int | None = None, speculative_slack: int = 0, rope_long=None):
        if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 1:
            raise ValueError(f"max_len must be a positive int, got {max_len!r}")
        if max_len > config.max_position_embeddings + speculative_slack:
            raise ValueError(f"max_len {max_len} exceeds the model's context "
                             f"(max_position_embeddings = {config.max_position_embeddings})")
        super().__init__(config, batch_size, max_len, device, dtype)
        self._rope_long = _rows_long(config, batch_size, max_len, rope_long, self.device)
        self.windows = config.layer_windows  # slot = position: the model's sliding windows apply
        self.chunks = config.layer_chunks  # (and Llama 4's chunks)
        self.max_len = max_len
        self.chunk_size = chunk_size
        self.chunk_keys = self.last_query = None
        # DeepSeek-V3.2's sparse attention (config.dsa): each token's indexer key per layer, [B, max_len, head_dim]
        # (None on GLM-5's layers that share the previous layer's choice)
        self._dsa = config.dsa  # (read once: every layer's attend reads it)
        self.index_k = None if self._dsa is None else [
            None if shared else torch.zeros(batch_size, max_len, self._dsa.head_dim, device=self.device,
                                            dtype=self.dtype) for shared in self._dsa.shared]
        self._choice = None  # GLM-5: (step, the last full layer's choice) for the shared layers after it
        if chunk_size is not None:
            if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or not 1 <= chunk_size <= max_len:
                raise ValueError(f"chunk_size must be an int in [1, max_len={max_len}], got {chunk_size!r}")
            C = max_len // chunk_size
            self._chunk_store = [torch.zeros(batch_size, C + 1, config.layer_kv_heads(i), config.head_dim,  # +1:
                                             device=self.device, dtype=torch.float32)  # the write-off slot
                                 for i in range(self.num_layers)]
            self.chunk_keys = [t[:, :C] for t in self._chunk_store]
            self.last_query = [torch.zeros(batch_size, config.layer_heads(i), config.head_dim,
                                           device=self.device, dtype=dtype) for i in range(self.num_layers)]

    @property
    def num_chunks(self) -> torch.Tensor:
        """int32 ``[B]``: complete chunks per sequence (``lengths // chunk_size``)."""
        return torch.div(self.lengths, self.chunk_size, rounding_mode="floor")

    def _tensors(self):
        yield from super()._tensors()
        if self.chunk_size is not None:
            yield from self._chunk_store
            yield from self.last_query

    def _slot_buffers(self, layer: int):
        own = super()._slot_buffers(layer)
        return own if self.index_k is None or self.index_k[layer] is None else (*own, self.index_k[layer])

    def _select_rows(self, idx, moves) -> None:
        super()._select_rows(idx, moves)
        if self.index_k is not None:
            self.index_k = [None if t is None else _take_rows(t, idx, moves, self._bound) for t in self.index_k]
        if self.chunk_size is not None:
            C = self.max_len // self.chunk_size
            upto = min(self._bound // self.chunk_size + 1, C)
            self._chunk_store = [_take_rows(t, idx, moves, upto) for t in self._chunk_store]
            self.chunk_keys = [t[:, :C] for t in self._chunk_store]
            self.last_query = [t[idx] for t in self.last_query]

    def attend(self, layer, q, k, v, step, k_raw=None, sinks=None, index=None):
        """:meth:`_KVCache.attend`, recording ``last_query``; ``index``: DeepSeek-V3.2's indexer's ``(q, k, w)``
        (``llama.Indexer``): its keys written to ``index_k`` and each query attending to its ``topk`` best keys
        (:func:`indexed_attention`; while no query can see more than ``topk`` keys, the dense attention over
        them all)."""
        if self.chunk_size is not None:
            lq = self.last_query[layer]
            if step.query_index is None:
                lq.copy_(q[:, 0])
            else:
                picked = q[self._batch_index[:, 0], step.query_index]
                lq.copy_(torch.where(step.query_valid[:, None, None], picked, lq))
        if index is None:
            return super().attend(layer, q, k, v, step, sinks=sinks)
        shared = isinstance(index, str)  # GLM-5's "shared": the previous full layer's choice
        if not shared:
            self.index_k[layer][step.batch_index, step.slots] = index[1]
        topk, n = self._dsa.topk, min(self._bound + step.T, self.capacity)
        if n <= topk:
            return super().attend(layer, q, k, v, step, sinks=sinks)
        self._write(layer, k, v, step)
        lengths = self.lengths.long()
        if shared:
            if self._choice is None or self._choice[0] is not step:
                raise RuntimeError(f"layer {layer} shares the previous full layer's choice of keys (GLM-5's "
                                   "indexer_types), which this forward has not made (a draft head's tap between them)")
            return indexed_attention(q, self.k[layer], None, None, None, lengths, step.tree_mask, topk, n,
                                     self.scale, self.softcap, choice=self._choice[1])[0]
        out, choice = indexed_attention(q, self.k[layer], self.index_k[layer], index[0], index[2], lengths,
                                        step.tree_mask, topk, n, self.scale, self.softcap)
        if any(self._dsa.shared):
            self._choice = (step, choice)
        return out

    def _native_buffers(self, step):
        if self._changed(FullCache):
            return None
        return self.k, self.v, [], (self.last_query if self.chunk_size is not None else [])

    def end(self, step):
        if self.chunk_size is not None:
            self._update_chunk_means(self.lengths, self.lengths + step.counts, step.T)
        super().end(step)

    def _after_commit(self, base_lengths, new_lengths, max_new):
        if self.chunk_size is not None:
            self._update_chunk_means(base_lengths, new_lengths, max_new)

    def _update_chunk_means(self, start, end, max_new: int) -> None:
        """Recompute the means of the chunks completed by tokens ``[start, end)`` (``end - start <=
        max_new``): chunks ``start // cs .. end // cs - 1``, at most ``max_new // cs + 1`` per row."""
        cs = self.chunk_size
        C = self.max_len // cs
        n = max_new // cs + 1
        first = torch.div(start.long(), cs, rounding_mode="floor")
        cidx = first[:, None] + torch.arange(n, device=self.device)  # [B, n]
        valid = cidx < torch.div(end.long(), cs, rounding_mode="floor")[:, None]
        dst = torch.where(valid, cidx, C)  # invalid -> write-off slot C
        pos = (first[:, None] * cs + torch.arange(n * cs, device=self.device)).clamp(max=self.capacity - 1)
        for layer in range(self.num_layers):
            if not self.k[layer].shape[2]:  # (a layer without keys: LFM2's convolutions)
                continue
            gathered = self.k[layer][self._batch_index, pos]  # [B, n*cs, Hkv, D]: the new chunks only
            self._chunk_store[layer][self._batch_index, dst] = tk.chunk_mean_keys(gathered, cs)


_FREE = torch.iinfo(torch.int64).max  # StreamingCache.slot_pos of a slot that holds no token


def _rope_groups(config: LlamaConfig, device) -> list:
    """``[(layers, inv_freq, inv_freq_long, scale)]``: the layers that share one RoPE (``slice(None)``: all, else
    an index tensor), its inverse frequencies (LongRoPE's short and long ones; else None for the long) and its
    factor on cos and sin (YaRN's, LongRoPE's). One group, but two for Gemma 3 (its sliding layers' own RoPE
    base, plain RoPE) and SmolLM3 (its NoPE layers' zero frequencies: a re-rotation leaves their keys as they
    are)."""
    long = None if config.rope_long_from is None else rope_inv_freq(config, device, long=True)
    main = (rope_inv_freq(config, device), long, rope_attention_scale(config))
    local = rope_local_inv_freq(config, device)
    if local is None:
        return [(slice(None), *main)]
    n = config.num_hidden_layers
    own = [not r for r in config.rope_layers]
    groups = [(torch.tensor([i for i in range(n) if own[i] == flag], device=device), *rope)
              for flag, rope in ((False, main), (True, (local, None, 1.0))) if flag in own]
    return groups


class StreamingCache(_KVCache):
    """StreamingLLM cache: the first ``sink`` tokens and the most recent ``window``.

    Slots ``[0, sink + window + max_step)`` per layer. Eviction happens at the start of a forward,
    never of the tokens the current forward appends: a sequence holding ``L > sink + window`` tokens
    first drops its oldest non-sink tokens down to ``sink + window``; then the ``T`` new tokens are
    appended and attend to the sinks, the window and (causally) each other. ``rollback`` drops the most
    recent tokens, and then the next forward sees exactly the sinks and the tokens that precede the
    rolled-back ones (at most ``window``). A forward of more than ``max_step`` tokens (a chunk of
    prefill) runs in a temporary buffer and evicts at its end instead (it cannot be rolled back).

    The model sees every token at its StreamingLLM position: the new queries at ``L + t`` and a kept
    token ``r`` tokens older than the first new one at ``L - r``; the sinks at ``0 .. sink-1``. So the
    relative positions it sees stay within ``sink + window + max_step``, whatever the length of the
    sequence. Nothing moves to achieve that: RoPE is relative, so a window key rotated once (by the
    model, at the token's position in the sequence minus ``frame``) keeps its distance to every later
    query, and only the few sink keys are re-rotated from their un-rotated copies (``k_raw``) when an
    eviction changes their distance. An eviction overwrites the evicted slots with the tokens past
    ``sink + window`` (``max_step`` at most), so the window is held in no particular slot order
    (``slot_pos`` records each slot's position in the sequence), and its cost does not grow with the
    window. ``frame`` (per row) is re-based, re-rotating the window once from ``k_raw``, whenever
    the positions given to RoPE would pass the model's context, so RoPE angles stay within those of
    the model's own context.

    A layer with a sliding window W sees the last W positions the cache holds: no sink its step's first query
    no longer reaches (:meth:`_leftpads`), and, where W is shorter than ``window + max_step``, the window's last
    ranks over recent tokens kept in position order (an eviction then copies the window into order instead of
    moving the evicted slots only: ``_in_order``). With ``window >= W - 1`` that is what the model's window
    shows.

    Args:
        config, batch_size, device, dtype: as :class:`FullCache`.
        sink: attention-sink tokens kept forever (>= 0).
        window: recent tokens kept (>= 1).
        max_step: most tokens appended by one rollback-able forward (e.g. gamma + 1).
        rope_long: LongRoPE only, as :class:`FullCache`'s (default: by ``sink + window + max_step``); ``fill_from``
            takes the full cache's.
    """

    cuda_graphs = True  # the eviction replayed from a CUDA graph on a GPU (_evict)

    def __init__(self, config: LlamaConfig, batch_size: int, sink: int, window: int, max_step: int,
                 device=None, dtype=None, rope_long=None):
        for name, v, lo in (("sink", sink, 0), ("window", window, 1), ("max_step", max_step, 1)):
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ValueError(f"{name} must be an int >= {lo}, got {v!r}")
        if sink + window + max_step > config.max_position_embeddings:
            raise ValueError(f"sink + window + max_step = {sink + window + max_step} exceeds the model's context "
                             f"(max_position_embeddings = {config.max_position_embeddings})")
        super().__init__(config, batch_size, sink + window + max_step, device, dtype)
        self._rope_long = _rows_long(config, batch_size, self.capacity, rope_long, self.device)
        self.sink, self.window, self.max_step = sink, window, max_step
        self.keep = sink + window
        self.windows = config.layer_windows  # from each row's leftpad (_leftpads)
        # A window shorter than what the cache may hold past its sinks counts its last ranks among the recent
        # tokens: they must then be in position order, so an eviction sorts them (_settle)
        self._in_order = any(0 < w < window + max_step for w in self.windows)
        B, cap = batch_size, self.capacity
        self._ropes = _rope_groups(config, self.device)
        self._rope_of = [next(g for g, (layers, *_) in enumerate(self._ropes)
                              if isinstance(layers, slice) or i in layers.tolist()) for i in range(self.num_layers)]
        self._pos_limit = config.max_position_embeddings
        # slot_pos[b, s]: position in the sequence of the token in non-sink slot s (_FREE: none)
        self.slot_pos = torch.full((B, cap), _FREE, dtype=torch.int64, device=self.device)
        self.evicted = torch.zeros(B, dtype=torch.int64, device=self.device)  # sequence length - lengths
        self.frame = torch.zeros(B, dtype=torch.int64, device=self.device)  # RoPE position = position - frame
        self._slot = torch.arange(cap, device=self.device)[None]
        # an eviction moves as many slots as it must on the CPU (reading that count is free there); on
        # other devices it moves a fixed width (padding copies a slot onto itself) so it never syncs
        self._read_width = self.device.type == "cpu"
        # and moves only the real ones with a Triton kernel where it runs (a PyTorch gather and scatter
        # of the fixed width would copy every padding slot onto itself: triforce_kernels/triton/slot_move.py)
        self._triton_move = self.device.type == "cuda" and tk.backend_status("triton", self.device)[0]
        # on the CPU, with the extension: the sorted eviction (_in_order) shifts a row's window in place, and a
        # float32 cache's sinks are rotated again in one native pass (_rotate; 16-bit ones through apply_rope)
        self._shift_in_place = True
        self._native_rope = self.device.type == "cpu" and self.dtype == torch.float32
        self._big = None  # a prefill-sized forward's selection, from _big_begin to end
        self._host_state()

    def _host_state(self):
        self._next_bound = 0    # host upper bound of the next token's RoPE position (sequence length - frame)
        self._ordered = True    # slots hold the tokens in sequence order (no eviction has reordered them)
        self._rolled = False    # a rollback / commit_path since the last forward

    def _allocate(self, shapes):
        # k, v and k_raw of every layer are views of one tensor, so an eviction moves them in one op (k and k_raw
        # only where the values are the keys: _raw, the index of k_raw's part); layers of fewer KV heads than the
        # most (MiMo-V2-Flash's full layers) view their first heads of it (strided over H, as verify_attention reads)
        self._raw = 1 if self.values_are_keys else 2
        self._heads = [shape[2] for shape in shapes]
        widest = max(shapes, key=lambda shape: shape[2])
        self._kvr = torch.zeros((self._raw + 1, self.num_layers) + tuple(widest), device=self.device, dtype=self.dtype)
        k, v, self.k_raw = self._layer_views()
        return k, v

    def _layer_views(self):
        """Per-layer ``k``, ``v`` and ``k_raw`` lists: views of the joint buffer (``v``'s ``k``'s where the values
        are the keys), each of its layer's KV heads."""
        def views(part):
            return [t if t.shape[2] == h else t[:, :, :h] for t, h in zip(part.unbind(0), self._heads)]
        k, raw = views(self._kvr[0]), views(self._kvr[self._raw])
        return k, views(self._kvr[1]) if self._raw == 2 else list(k), raw

    def _slot_buffers(self, layer):
        return (self.k[layer], self.k_raw[layer]) if self.values_are_keys else (
            self.k[layer], self.v[layer], self.k_raw[layer])

    def _tensors(self):
        yield from (self.lengths, self._kvr)  # (the joint buffer: the layers' views may leave heads out of it)
        yield from (self.slot_pos, self.evicted, self.frame)
        yield from self._conv_tensors()

    def reset(self) -> None:
        super().reset()
        self.slot_pos.fill_(_FREE)
        self.evicted.zero_()
        self.frame.zero_()
        self._host_state()

    def rollback(self, new_lengths: torch.Tensor) -> None:
        super().rollback(new_lengths)
        self._rolled = True

    def _select_rows(self, idx, moves) -> None:
        # k, v and k_raw stay views of one joint buffer (batch is its third dimension): a gather, of a
        # window-sized cache
        self._kvr = self._kvr[:, :, idx]
        self.k, self.v, self.k_raw = self._layer_views()
        self.lengths, self.slot_pos, self.evicted, self.frame = (
            t[idx] for t in (self.lengths, self.slot_pos, self.evicted, self.frame))
        if self._rope_long is not None:
            self._rope_long = self._rope_long[idx]
        self._select_conv(idx)

    def _after_commit(self, base_lengths, new_lengths, max_new: int) -> None:
        # the kept path now fills slots base .. base + num_accepted in sequence order; the other nodes'
        # slots get positions >= the new length, i.e. free
        j = torch.arange(max_new, device=self.device)
        base = base_lengths.long()[:, None]
        kept = j[None] < new_lengths.long()[:, None] - base  # entry 0 always; the others repeat it
        dst = torch.where(kept, base + j, base).clamp(max=self.capacity - 1)
        self.slot_pos[self._batch_index, dst] = base + self.evicted[:, None] + torch.where(kept, j, 0)
        self._rolled = True

    def _position_offset(self):
        return self.evicted - self.frame

    def _seq_offset(self):
        return self.evicted

    def fill_from(self, full: "FullCache", lengths: torch.Tensor | None = None) -> None:
        """Load the cache from a prefilled :class:`FullCache` of the same model instead of prefilling it:
        row ``b`` then holds what this cache keeps of the first ``lengths[b]`` tokens of ``full``'s row
        (default: all of them; at most ``full.lengths``): the first ``sink`` and the last ``window``,
        with ``full``'s values and keys. Those were computed with the whole context before them (a
        prefill of this cache computes the window's from the sinks and the window only), which for a
        draft is the better approximation of the target, and it costs a copy instead of a second
        prefill. ``k_raw`` is ``full``'s keys rotated back; where tokens were evicted, the sinks are
        re-rotated to their StreamingLLM positions. No host sync."""
        if not isinstance(full, FullCache):
            raise TypeError(f"full must be a FullCache, got {type(full).__name__}")
        c, fc = self.config, full.config
        if (c.num_hidden_layers, c.kv_heads_per_layer, c.head_dim) != (
                fc.num_hidden_layers, fc.kv_heads_per_layer, fc.head_dim):
            raise ValueError("full was built for a different model config (layers / KV heads / head_dim)")
        if (full.batch_size, full.dtype, full.device) != (self.batch_size, self.dtype, self.device):
            raise ValueError(f"full holds {full.batch_size} sequences in {full.dtype} on {full.device}; this cache "
                             f"{self.batch_size} in {self.dtype} on {self.device}")
        n = full.lengths.long() if lengths is None else torch.minimum(
            _check_lengths("lengths", lengths, self.batch_size, self.device).long(), full.lengths.long())
        self.reset()
        keep, sink, bi = self.keep, self.sink, self._batch_index
        n = n.clamp(min=0)
        kept = n.clamp(max=keep)
        evicted = n - kept
        slot = self._slot[:, :keep]
        pos = torch.where(slot < sink, slot, slot + evicted[:, None])  # sequence position of slot's token
        valid = slot < kept[:, None]
        src = torch.where(valid, pos, 0)  # a full cache's RoPE position is its slot
        inverse = []  # per RoPE group: the inverse rotation (and YaRN's factor undone)
        if self._rope_long is not None and full.rope_long is not None:
            self._rope_long.copy_(full.rope_long)  # its keys were rotated so: this cache rotates as they were
        for _, inv_freq, long, scale in self._ropes:
            cos, sin = rope_cos_sin(rows_inv_freq(inv_freq, long, self._rope_long), src, self.dtype, 1.0 / scale)
            inverse.append((cos, sin.neg_()))
        for layer in range(self.num_layers):
            k = full.k[layer][bi, src]
            self.k[layer][:, :keep] = k
            if not self.values_are_keys:
                self.v[layer][:, :keep] = full.v[layer][bi, src]
            self.k_raw[layer][:, :keep] = apply_rope(k, *inverse[self._rope_of[layer]])
        self.slot_pos[:, :keep] = torch.where(valid, pos, _FREE)
        self.evicted.copy_(evicted)
        self.lengths.copy_(kept.to(torch.int32))
        if self._conv_span is not None:  # (the convolution layers' last inputs: full's, which must hold them)
            full._conv_reach(n)
            self._conv_copy(full, n)
        if self.recurrent is not None:  # (and the recurrent layers' states there)
            self._ssm_take(full, n)
        self._bound = min(keep, full._bound)
        self._next_bound = full._bound  # frame 0: the next position is at most full's longest row
        if sink:  # rows that evicted tokens see their sinks just before the window (_sink_positions)
            exact = self._kvr[0, :, :, :sink].clone()
            self._rotate(slice(0, sink), self._sink_positions())
            moved = (evicted > 0)[None, :, None, None, None]
            self._kvr[0, :, :, :sink] = torch.where(moved, self._kvr[0, :, :, :sink], exact)

    # ---- eviction
    def _settle(self) -> None:
        """Evict down to ``sink + window`` and fill the slots of evicted or rolled-back tokens with the
        kept tokens past the new length, so that slots ``[0, lengths)`` hold exactly the kept tokens (in
        position order where a windowed layer needs it: ``_in_order``)."""
        n = self.lengths.long()
        L = n.clamp(max=self.keep)
        total = n + self.evicted
        lo = total - (L - self.sink).clamp(min=0)  # kept non-sink tokens: positions [lo, total)
        s, pos = self._slot, self.slot_pos
        kept = (s >= self.sink) & (pos >= lo[:, None]) & (pos < total[:, None])
        below = s < L[:, None]
        if self._in_order:
            self._sort_kept(kept)
        else:
            self._fill_holes(kept, below)
        pos.masked_fill_(~below, _FREE)
        self.evicted.add_(n - L)
        self.lengths.copy_(L.to(torch.int32))
        self._bound = min(self._bound, self.keep)

    def _sort_kept(self, kept) -> None:
        """Slots ``[sink, keep)``: the kept tokens in position order, then the others. On the CPU only the rows
        whose slots change move, a row already in order by one copy of a contiguous run (its window shifted
        down by what it evicts); elsewhere every row at a fixed width (no host read)."""
        s, pos = self._slot, self.slot_pos
        # the sinks' slots are not kept: they sort after every kept token, with the free ones
        frm = torch.where(kept, pos, _FREE).sort(dim=1, stable=True).indices[:, : self.keep - self.sink]
        dst = s[:, self.sink: self.keep].expand_as(frm)
        bi = self._batch_index
        if self._read_width:
            moved = (frm != dst).any(1)
            shift = frm[:, 0] - self.sink
            run = (frm == dst + shift[:, None]).all(1) & moved  # a contiguous run from sink + shift
            shift_slots = _cache_op("shift_slots_") if self._shift_in_place and self._kvr.is_contiguous() else None
            if shift_slots is not None and bool(run.any()):  # those rows in place, one memmove per layer and row
                parts = self._kvr.shape[0] * self.num_layers
                shift_slots(self._kvr.view(parts, self.batch_size, self._kvr.shape[3], -1),
                            torch.where(run, shift, 0), self.sink, self.keep)
            for b in moved.nonzero().flatten().tolist():
                if not run[b]:
                    self._kvr[:, :, b, dst[b]] = self._kvr[:, :, b, frm[b]]
                elif shift_slots is None:
                    e = int(shift[b])
                    self._kvr[:, :, b, self.sink: self.keep] = self._kvr[:, :, b, self.sink + e: self.keep + e].clone()
        else:
            self._kvr[:, :, bi, dst] = self._kvr[:, :, bi, frm]
        pos[bi, dst] = pos[bi, frm]

    def _fill_holes(self, kept, below) -> None:
        """The slots of evicted or rolled-back tokens below the new length get the kept tokens past it (as
        many moves as there are holes: the window is then in no particular order)."""
        s, pos = self._slot, self.slot_pos
        hole = ~kept & below & (s >= self.sink)
        src = kept & ~below
        count = torch.minimum(hole.sum(1), src.sum(1))  # equal, unless lengths were set by hand
        cap = self.capacity
        width = int(count.max()) if self._read_width else cap - self.sink
        if width > 0:
            dst = torch.where(hole, s, s + cap).sort(1).values[:, :width]  # the holes first, in slot order
            frm = torch.where(src, s, s + cap).sort(1).values[:, :width]
            pad = torch.arange(width, device=self.device)[None] >= count[:, None]
            dst = torch.where(pad, cap - 1, dst)  # padding copies slot cap-1 onto itself (never a hole)
            frm = torch.where(pad, cap - 1, frm)
            bi = self._batch_index
            if self._triton_move and not self._read_width:
                from triforce_kernels.triton.slot_move import move_slots
                parts = self._kvr.shape[0] * self.num_layers
                move_slots(self._kvr.view(parts, self.batch_size, cap, -1), dst, frm, count)
            else:
                self._kvr[:, :, bi, dst] = self._kvr[:, :, bi, frm]
            pos[bi, dst] = pos[bi, frm]
            self._ordered = False

    def _sink_positions(self):
        """RoPE positions ``[B, sink]`` of the sink slots: ``slot + evicted - frame``."""
        return torch.arange(self.sink, device=self.device)[None] + (self.evicted - self.frame)[:, None]

    def _rotate(self, slots: slice, positions) -> None:
        """``k`` of every layer at ``slots`` = ``k_raw`` rotated at ``positions`` ``[B, n]``."""
        for layers, inv_freq, long, scale in self._ropes:  # one group (all layers) but for Gemma 3's two RoPEs
            inv_freq = rows_inv_freq(inv_freq, long, self._rope_long)
            cos, sin = rope_cos_sin(inv_freq, positions, self.dtype, scale)  # [B, n, 1, D]: the group's layers
            rope_into = _cache_op("rope_into_") if self._native_rope and isinstance(layers, slice) else None
            if rope_into is not None:  # one native pass into k's slots, apply_rope's bits
                rope_into(self._kvr[0, layers, :, slots], self._kvr[self._raw, layers, :, slots], cos, sin)
            else:
                self._kvr[0, layers, :, slots] = apply_rope(self._kvr[self._raw, layers, :, slots], cos, sin)

    def _rebase(self) -> None:
        """``frame = evicted``: every kept token at its StreamingLLM position, re-rotated from ``k_raw``."""
        self.frame.copy_(self.evicted)
        s = self._slot
        rel = torch.where(s < self.sink, s, self.slot_pos - self.frame[:, None])
        self._rotate(slice(None), rel.clamp(0, self.capacity))  # free slots: any angle
        self._next_bound = self._bound

    def _evict(self, rotate_sinks: bool) -> None:
        """``_settle``, then the sinks' re-rotation when ``rotate_sinks``. On a GPU (a fixed width, no host
        read) this is device work on the cache's own buffers only, some 50 small ops: eagerly they took
        ~1.6 ms of launches per draft step on an H200 (``bench_streaming_cache``'s ``streaming_begin_end``,
        against ~0.1 ms for a full cache), so it is replayed from a CUDA graph per cache
        (:func:`triforce.models.graphs.replayed`; ``cuda_graphs`` and ``TRIFORCE_CUDA_GRAPHS=0`` turn it off)."""
        if self._read_width:  # the width is read on the host: nothing to capture
            return self._evict_body(rotate_sinks)
        from . import graphs
        if graphs.replayed(self, ("evict", rotate_sinks, self._triton_move, self._in_order),
                           lambda cache, r=rotate_sinks: cache._evict_body(r)):
            self._ordered = self._in_order  # what _settle sets on the host (at the fixed width), for a replay
            self._bound = min(self._bound, self.keep)

    def _evict_body(self, rotate_sinks: bool) -> None:
        self._settle()
        if rotate_sinks:
            self._rotate(slice(0, self.sink), self._sink_positions())

    def begin(self, T, tree_parents=None, counts=None, query_index=None, query_valid=None):
        if self._bound > self.keep or (self._rolled and not self._ordered):
            self._evict(self._bound > self.keep and self.sink > 0)
        self._rolled = False
        if self._next_bound + T > self._pos_limit and self._next_bound > self._bound:
            self._rebase()
        self._next_bound += T
        if T <= self.max_step:
            step = super().begin(T, tree_parents, counts, query_index, query_valid)
            seq = self.lengths.long() + self.evicted  # the step's tokens: positions seq .. seq + T - 1
            self.slot_pos[step.batch_index, step.slots] = seq[:, None] + torch.arange(T, device=self.device)
        else:  # Large forward (prefill chunk): the cache holds <= keep tokens now; work in a temporary buffer.
            if any(self.windows) and not self._ordered:  # a chunk longer than a window counts its ranks over
                s, held = self._slot, self._slot < self.lengths.long()[:, None]  # the held tokens too: in
                self._sort_kept((s >= self.sink) & held)                          # position order first
                self.slot_pos.masked_fill_(~held, _FREE)
                self._ordered = True
            step = self._big_begin(T, tree_parents, counts, query_index, query_valid)
        self._leftpads(step)
        return step

    def _leftpads(self, step: Step) -> None:
        """``step.leftpad``: on the layers with a sliding window W, each row's first slot. The model's query at
        position p sees positions p - W + 1 .. p; this cache holds the sinks (positions 0 .. sink - 1) right
        before its recent tokens, which an eviction leaves any distance behind them, so the window, which
        counts ranks, would reach sinks the model's no longer does. A row starts at the first sink its first
        query still sees: ``p0 - W + 1`` clamped to ``[0, min(sink, lengths)]`` (``p0``: that query's position).
        A windowed layer then sees no key the model's window hides, but in the few steps in which the window
        passes over the sinks (a later query of the step may see up to ``T - 1`` sinks the model's no longer
        does). Device ops only."""
        if not self.sink or not any(self.windows):
            return
        p0 = self.lengths.long() + self.evicted
        hi = self.lengths.long().clamp(max=self.sink)
        step.leftpad = {W: torch.minimum((p0 - W + 1).clamp(min=0), hi).to(torch.int32)
                        for W in sorted(set(self.windows) - {0})}

    def _big_begin(self, T, tree_parents, counts, query_index, query_valid):
        bound, self._bound = self._bound, 0  # skip the capacity check: the temporary buffer has room
        cap, self.capacity = self.capacity, self.keep + T
        try:
            step = super().begin(T, tree_parents, counts, query_index, query_valid)
        finally:
            self._bound, self.capacity = bound, cap
        # After the step the cache keeps the sinks + the last `window` kept tokens of buffer + new ones;
        # which temporary slots those are (in sequence order) is the same for every layer.
        n, ar = self.lengths.long(), torch.arange(T, device=self.device)
        seq = n + self.evicted
        pos = torch.cat([self.slot_pos[:, : self.keep], self.slot_pos.new_full((self.batch_size, T), _FREE)], 1)
        pos[step.batch_index, step.slots] = seq[:, None] + ar  # [B, keep + T]: the temporary buffer's slots
        n2 = n + step.counts.long()
        L2 = n2.clamp(max=self.keep)
        total2 = n2 + self.evicted
        lo = total2 - (L2 - self.sink).clamp(min=0)
        rest = pos[:, self.sink:]
        key = torch.where((rest >= lo[:, None]) & (rest < total2[:, None]), rest, _FREE)
        order = key.sort(1)
        sinks = torch.arange(self.sink, device=self.device).expand(self.batch_size, self.sink)
        self._big = (torch.cat([sinks, self.sink + order.indices[:, : self.window]], 1),
                     order.values[:, : self.window], n2 - L2)
        return step

    def attend(self, layer, q, k, v, step, k_raw=None, sinks=None):
        if k_raw is None:
            raise ValueError("StreamingCache.attend needs the un-rotated keys (k_raw)")
        if step.T <= self.max_step:
            self.k_raw[layer][step.batch_index, step.slots] = k_raw
            return super().attend(layer, q, k, v, step, sinks=sinks)
        # temporary buffer: the kept tokens + the T new ones; evict into the cache right after.
        B, T = q.shape[0], step.T
        tmp = [torch.cat([buf[:, : self.keep], x.new_zeros((B, T) + x.shape[2:])], dim=1)
               for buf, x in ((self.k[layer], k), (self.v[layer], v), (self.k_raw[layer], k_raw))]
        for buf, x in zip(tmp, (k, v, k_raw)):
            buf[step.batch_index, step.slots] = x
        out = attention(q, tmp[0], tmp[1], step, self.windows[layer], self.scale, self.softcap, sinks, self.alibi)
        sel = self._big[0]
        for i, (mine, buf) in enumerate(zip((self.k[layer], self.v[layer], self.k_raw[layer]), tmp)):
            if not (self.values_are_keys and i == 1):  # (v is k there: written once, as k)
                mine[:, : self.keep] = buf[self._batch_index, sel]
        return out

    def _native_buffers(self, step):
        if self._changed(StreamingCache) or step.T > self.max_step:
            return None
        return self.k, self.v, self.k_raw, []

    def end(self, step):
        if step.T <= self.max_step:
            return super().end(step)
        _, kept_pos, dropped = self._big
        self.slot_pos[:, self.sink: self.keep] = kept_pos  # in sequence order; _FREE past the kept ones
        self.slot_pos[:, self.keep:] = _FREE
        self.evicted.add_(dropped)
        self.lengths.add_(step.counts).clamp_(max=self.keep)
        self._bound = self.keep
        self._conv_end(step)
        self._ordered = True
        self._big = None
        if self.sink:
            self._rotate(slice(0, self.sink), self._sink_positions())


class RetrievalCache(_KVCache):
    """TriForce's retrieval cache: a fixed budget of KV chunks picked from a :class:`FullCache`.

    Per layer ``k``, ``v`` ``[B, budget + tail, Hkv, D]``: slots ``[0, budget)`` hold
    ``budget // chunk_size`` chunks per KV head chosen by ``tk.build_retrieval_cache`` (chunk-mean key
    scores against the full cache's ``last_query``; sink and recent chunks always kept); slots from
    ``budget`` on hold the sequence's tokens from ``base_pos`` (the end of the last complete chunk at
    the last rebuild) up to the full cache's length, copied from the full cache by ``sync()``, followed
    by the tokens appended by this cache's own (speculative) forwards. RoPE positions are the true
    absolute positions (``base_pos + slot - budget``), so keys copied from the full cache stay valid.

    ``lengths`` counts slots (budget + tail tokens). ``tail = rebuild_stride + chunk_size + max_step``.

    A sliding-window layer of the model (``config.layer_windows``) sees only the last ``W`` positions, so
    chunks retrieved from further back would show its draft keys the model hides. With ``exact_windows``
    (the default) such a layer's slots ``[0, budget)`` hold instead the last ``budget // chunk_size``
    complete chunks, so that with the tail the cache holds a contiguous run of the sequence's most recent
    positions, and its attention applies the layer's window (the last ``W`` of those, in rank order: in
    position order here). Where ``budget >= W - 1`` that is every key the layer sees: the layer is exact
    at this level. Layers without a window retrieve as above.

    Args:
        config: the model's config.
        full_cache: a prefilled :class:`FullCache` built with ``chunk_size``.
        budget: retrieval tokens (a multiple of ``chunk_size``; at most every sequence's complete chunks).
        chunk_size: must equal ``full_cache.chunk_size``.
        max_step: most tokens appended by this cache's forwards between two ``sync()`` calls.
        sink_chunks: leading chunks always kept (default 1).
        recent_chunks: trailing complete chunks always kept (default: 1 when the budget allows, else 0).
        rebuild_stride: rebuild once a sequence grew by this many tokens since the last rebuild.
        min_acceptance: rebuild when the mean of the last ``acceptance_window`` rates given to
            ``record_acceptance`` drops below this (0 disables).
        acceptance_window: how many recorded rates the rolling mean covers.
        exact_windows: sliding-window layers hold the most recent chunks and attend within their window
            (above); ``False``: they retrieve chunks like any layer and attend to all they hold.
    """

    def __init__(self, config: LlamaConfig, full_cache: FullCache, budget: int, chunk_size: int, max_step: int,
                 sink_chunks: int = 1, recent_chunks: int | None = None, rebuild_stride: int = 256,
                 min_acceptance: float = 0.5, acceptance_window: int = 8, exact_windows: bool = True):
        if not isinstance(full_cache, FullCache):
            raise TypeError(f"full_cache must be a FullCache, got {type(full_cache).__name__}")
        if full_cache.chunk_size is None or full_cache.chunk_size != chunk_size:
            raise ValueError(f"full_cache must be built with chunk_size={chunk_size} (it has "
                             f"{full_cache.chunk_size}) so that it keeps chunk-mean keys")
        if full_cache.config.num_hidden_layers != config.num_hidden_layers or \
                full_cache.config.kv_heads_per_layer != config.kv_heads_per_layer:
            raise ValueError("full_cache was built for a different model config")
        for name, v, lo in (("budget", budget, 1), ("max_step", max_step, 1), ("sink_chunks", sink_chunks, 0),
                            ("rebuild_stride", rebuild_stride, 1), ("acceptance_window", acceptance_window, 1)):
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ValueError(f"{name} must be an int >= {lo}, got {v!r}")
        if budget % chunk_size:
            raise ValueError(f"budget ({budget}) must be a multiple of chunk_size ({chunk_size})")
        budget_chunks = budget // chunk_size
        if recent_chunks is None:
            recent_chunks = 1 if budget_chunks > sink_chunks + 1 else 0
        if isinstance(recent_chunks, bool) or not isinstance(recent_chunks, int) or recent_chunks < 0:
            raise ValueError(f"recent_chunks must be an int >= 0, got {recent_chunks!r}")
        if budget_chunks <= sink_chunks + recent_chunks:
            raise ValueError(f"budget // chunk_size = {budget_chunks} chunks must exceed sink_chunks + recent_chunks "
                             f"= {sink_chunks + recent_chunks}")
        self.tail = rebuild_stride + chunk_size + max_step
        super().__init__(config, full_cache.batch_size, budget + self.tail, full_cache.device, full_cache.dtype)
        self.full = full_cache
        self.budget, self.chunk_size, self.max_step = budget, chunk_size, max_step
        self.budget_chunks, self.sink_chunks, self.recent_chunks = budget_chunks, sink_chunks, recent_chunks
        self.rebuild_stride, self.min_acceptance = rebuild_stride, float(min_acceptance)
        if not isinstance(exact_windows, bool):
            raise TypeError(f"exact_windows must be a bool, got {exact_windows!r}")
        if exact_windows:  # the windowed layers hold a contiguous run of positions (rebuild): the window applies
            self.windows = config.layer_windows
        self.base_pos = torch.zeros(self.batch_size, dtype=torch.int64, device=self.device)
        self.synced = torch.zeros(self.batch_size, dtype=torch.int64, device=self.device)
        self.chunk_idx = [None] * self.num_layers
        # rolling window of recorded rates: a fixed device ring (memory stays constant), host count
        self._acc = torch.zeros(acceptance_window, dtype=torch.float64, device=self.device)
        self._acc_count = 0
        self._rebuild_at = torch.zeros(self.batch_size, dtype=torch.int64, device=self.device)  # lengths then
        self._known_bounds = None  # (min num_chunks, max lengths) of the full cache, when sync() just read them
        self.num_rebuilds = 0
        self.rebuild()

    def _position_offset(self):
        return self.base_pos - self.budget

    def _seq_offset(self):
        return self.base_pos - self.budget

    @property
    def rope_long(self) -> torch.Tensor | None:
        """Its full cache's (the keys it holds were rotated so)."""
        return self.full.rope_long

    def _select_rows(self, idx, moves) -> None:
        """Its full cache's rows must be selected with the same ``rows`` (the engines select every cache)."""
        super()._select_rows(idx, moves)
        self.base_pos, self.synced, self._rebuild_at = (t[idx] for t in (self.base_pos, self.synced,
                                                                        self._rebuild_at))
        self.chunk_idx = [None if t is None else t[idx] for t in self.chunk_idx]

    def rebuild(self) -> None:
        """Re-select the chunks from the full cache (``tk.build_retrieval_cache``, per layer) and refill the
        tail with the tokens after the last complete chunk. One device read (to validate the budget), none
        when :meth:`sync` calls it (its own read brought the values)."""
        full = self.full
        num_chunks = full.num_chunks
        known, self._known_bounds = self._known_bounds, None  # read by sync() just before, in its own read
        lo, hi = known or (int(x) for x in torch.stack([num_chunks.min(), full.lengths.max()]).tolist())
        if lo < self.budget_chunks:
            raise ValueError(f"budget {self.budget} exceeds a sequence's complete chunks ({lo} x {self.chunk_size} "
                             f"tokens): lower the budget to at most the shortest prompt")
        recent = {}  # (per KV head count)
        for layer in range(self.num_layers):
            if not self.k[layer].shape[2]:  # (a layer without keys: LFM2's convolutions, their inputs: _copy_tail)
                continue
            if self.windows[layer]:  # the last budget_chunks complete chunks (every row has that many)
                heads = self.k[layer].shape[2]
                if heads not in recent:
                    first = num_chunks[:, None, None] - self.budget_chunks
                    recent[heads] = (first + torch.arange(self.budget_chunks, device=self.device,
                                                          dtype=torch.int32)).expand(
                        self.batch_size, heads, self.budget_chunks).contiguous()
                tk.gather_chunks(full.k[layer], full.v[layer], recent[heads], self.chunk_size, self.k[layer],
                                 self.v[layer])
                self.chunk_idx[layer] = recent[heads]
                continue
            self.chunk_idx[layer] = tk.build_retrieval_cache(
                full.last_query[layer], full.k[layer], full.v[layer], full.chunk_keys[layer], num_chunks,
                self.chunk_size, self.budget_chunks, self.k[layer], self.v[layer],  # writes slots [0, budget)
                sink_chunks=self.sink_chunks, recent_chunks=self.recent_chunks)
        self.base_pos.copy_(num_chunks.long() * self.chunk_size)
        self.synced.copy_(self.base_pos)
        self._rebuild_at.copy_(full.lengths.long())
        self._acc_count = 0
        self.num_rebuilds += 1
        self._copy_tail(hi - lo * self.chunk_size)
        self._bound = self.budget + hi - lo * self.chunk_size  # >= every row's budget + tail length

    def _copy_tail(self, n: int) -> None:
        """Copy the full cache's tokens ``[synced, full.lengths)`` into slots ``budget + (p - base_pos)``;
        ``n`` (host) bounds ``full.lengths - synced`` over the rows."""
        full = self.full
        lo = self.synced - self.base_pos  # [B] first tail index to (re)write
        j = torch.arange(max(n, 0), device=self.device)
        p = self.synced[:, None] + j  # absolute positions
        ok = p < full.lengths.long()[:, None]
        src = p.clamp(max=full.capacity - 1)
        dst = (self.budget + lo[:, None] + j).clamp(max=self.capacity - 1)
        for layer in range(self.num_layers):
            for mine, theirs in ((self.k[layer], full.k[layer]),) + (
                    () if self.values_are_keys else ((self.v[layer], full.v[layer]),)):
                cur = mine[self._batch_index, dst]
                mine[self._batch_index, dst] = torch.where(ok[..., None, None], theirs[self._batch_index, src], cur)
        self.synced.copy_(full.lengths.long())
        self.lengths.copy_((self.budget + self.synced - self.base_pos).to(torch.int32))
        self._conv_copy(full, self.synced)  # (the convolution layers' last inputs; the recurrent layers' states)
        if self.recurrent is not None:
            self._ssm_take(full, self.synced)

    def sync(self) -> bool:
        """After a full-level verification: copy the tokens the full cache gained since the last sync into
        the tail (dropping this cache's own speculative tokens), rebuilding instead when the tail would
        overflow, a sequence grew by ``rebuild_stride`` tokens since the last rebuild, or the rolling
        acceptance fell below ``min_acceptance``. One device read. Returns whether it rebuilt."""
        full = self.full
        lengths = full.lengths.long()
        reads = [lengths.max(), (lengths - self.base_pos).max(), self.synced.min(), (lengths - self._rebuild_at).max(),
                 full.num_chunks.min()]  # the last one for a rebuild, in the same read
        if self.min_acceptance > 0 and self._acc_count >= self._acc.numel():  # rides in the same read
            reads.append(self._acc.mean())
        stats = torch.stack([r.to(torch.float64) for r in reads]).tolist()
        full_max, tail_need, synced_min, grown, chunks_min = (int(x) for x in stats[:5])
        low_acc = len(stats) > 5 and stats[5] < self.min_acceptance
        if tail_need > self.tail - self.max_step or grown >= self.rebuild_stride or low_acc:
            self._known_bounds = (chunks_min, full_max)
            self.rebuild()
            return True
        self._copy_tail(full_max - synced_min)
        self._bound = self.budget + tail_need
        return False

    def record_acceptance(self, rate) -> None:
        """Record a draft-level acceptance rate (float or 0-d tensor; a tensor is read at the next
        ``sync``, in the read it does anyway)."""
        self._acc[self._acc_count % self._acc.numel()] = rate  # a device copy, no sync
        self._acc_count += 1

    def _room(self):
        return self.capacity
