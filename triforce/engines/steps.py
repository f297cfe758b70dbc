"""Shared pieces of every decoding engine: the sampling transform, drafting, verification, the
committed-token window each drafter restarts from, the output buffer and the statistics.

Bookkeeping shared by all engines (no host sync inside a step):

* The verifier's cache holds the committed sequence ``s[0 .. L-1]``; the *pending* token ``s[L]``
  (sampled by the last verification, not yet in any cache) is ``hist[:, -1]``.
* ``hist`` ``[B, H]`` holds the last ``H`` committed tokens (pending included). A drafter's cache
  holds ``L + 1 - H`` tokens, so its first forward of a step feeds all of ``hist`` and catches up by
  however many tokens the last verification accepted (one fixed width for every row, so rows of a
  ragged batch never need different shapes).
* A verification that accepts ``n`` drafts advances a row by ``adv = n + 1`` (``0`` for rows that are
  finished or paused, whose state then stays as it was): verifier ``rollback(base + adv)``; the
  drafter keeps ``adv + H - H'`` of the tokens it appended this step, counted back from its current
  length (a StreamingLLM cache may compact between forwards, so absolute lengths are not comparable;
  a retrieval cache instead re-syncs from the full cache).
"""
from __future__ import annotations

import os
import time
from contextlib import contextmanager

import torch

import triforce_kernels as tk
from triforce.models.cache import TokenTree
from triforce_kernels.reference.sampling import argmax_lowest


class Sampling:
    """The one token transform every level of the hierarchy applies: greedy when temperature == 0,
    else ``tk.logits_to_probs(logits, temperature, top_k, top_p)``."""

    def __init__(self, temperature: float, top_k: int | None, top_p: float | None,
                 generator: torch.Generator | None):
        self.greedy = temperature == 0
        self.temperature, self.top_k, self.top_p, self.generator = temperature, top_k, top_p, generator

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        return tk.logits_to_probs(logits, self.temperature, self.top_k, self.top_p)

    def sample(self, logits: torch.Tensor, num: int = 1, distinct: bool = False):
        """``num`` tokens per row of ``logits [B, V]`` -> (tokens int64 [B, num], probs [B, V] or None).
        Greedy: the top-``num`` ids (:func:`top_ids`: argmax first, lowest index on ties). Sampling:
        ``num`` i.i.d. draws (with replacement, as the tree sampler assumes)."""
        if self.greedy:  # the verifiers' rule: lowest index on ties, NaN counts as -inf
            if num == 1:
                return argmax_lowest(logits)[:, None], None
            return top_ids(logits, num), None
        probs = self.probs(logits)
        return draw(_drawable(probs), num, self.generator), probs

    def verify_chain(self, draft_tokens, draft_probs, target_logits):
        """-> (tokens [B, n+1], num_accepted int32 [B], target probs [B, n+1, V] or None)."""
        if self.greedy:
            tokens, num = tk.chain_greedy_verify(draft_tokens, target_logits)
            return tokens, num, None
        probs = self.probs(target_logits)
        tokens, num = tk.chain_speculative_sample(draft_tokens, draft_probs, probs, generator=self.generator)
        return tokens, num, probs

    def verify_tree(self, tree_tokens, parents, draft_probs, target_logits):
        """-> (path int32 [B, D+1], tokens int64 [B, D+1], num_accepted int32 [B])."""
        if self.greedy:
            return tk.tree_greedy_verify(tree_tokens, parents, target_logits)
        probs = self.probs(target_logits)
        return tk.tree_speculative_sample(tree_tokens, parents, draft_probs, probs, generator=self.generator)


def top_ids(logits: torch.Tensor, num: int) -> torch.Tensor:
    """The ``num`` highest logits' ids per row of ``logits [R, V]`` -> int64 ``[R, num]``, highest first;
    ties -> lowest index first (so column 0 is :func:`argmax_lowest`), NaN counts as ``-inf``. Columns
    past the row's ids above ``-inf`` (``num > V``, or logits restricted to a draft vocabulary of fewer
    than ``num`` tokens) repeat the argmax (greedy children are then duplicates, which a tree verifies like
    any other child), never a token the logits rule out.

    One ``topk`` over an int64 key that orders (value, -index) exactly: the float's bits mapped to a
    monotone int32, shifted up, with the reversed index below (``topk`` itself orders ties arbitrarily)."""
    x = logits.float()
    x = torch.where(x.isnan(), torch.full_like(x, float("-inf")), x)
    V = x.shape[-1]
    bits = x.view(torch.int32).long()
    # monotone in the float value; -0.0 and 0.0 both map to 0, so they tie as they compare
    order = torch.where(bits < 0, -(bits & 0x7FFFFFFF), bits)
    key = order * 2 ** 32 + (V - 1 - torch.arange(V, device=x.device))
    ids = key.topk(min(num, V), dim=-1).indices
    if num > V:
        ids = torch.cat([ids, ids[:, :1].expand(-1, num - V)], dim=-1)
    return torch.where(x.gather(-1, ids) == float("-inf"), ids[:, :1], ids)


def static_tree(memo: dict, parents_row: list[int], batch: int, device) -> TokenTree:
    """The :class:`~triforce.models.TokenTree` of a static tree shape, built once per drafter (in
    ``memo``): its mask, depths and per-level prefixes are then reused by every step, and no step
    uploads ``parents`` or checks it on the device (each a host sync on a GPU)."""
    key = tuple(parents_row)
    if key not in memo:
        memo[key] = TokenTree.static(parents_row, batch, device)
    return memo[key]


_DRAW_BLOCK = 1024  # tokens per block of draw()'s two-level search


def draw(weights: torch.Tensor, num: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """``num`` i.i.d. draws per row of ``weights`` ``[B, V]`` (``>= 0``) -> int64 ``[B, num]``: token ``i``
    with probability ``weights[b, i] / sum(weights[b])`` (a row of zeros: uniformly). A zero-weight token
    is never drawn. No host sync: on a GPU ``torch.multinomial`` reads the values to check them (twice
    for one draw per row).

    Inverse CDF in float64, in two levels so that no ``[B, V]`` temporary is made (on a CPU a fresh
    buffer of that size costs more in page faults than the search): a uniform picks a block of
    ``_DRAW_BLOCK`` tokens by the blocks' sums, then a token inside the block by its weights."""
    B, V = weights.shape
    blk = _DRAW_BLOCK
    full = V - V % blk
    sums = [weights[:, :full].reshape(B, full // blk, blk).sum(-1, dtype=torch.float64)] if full else []
    if full < V:
        sums.append(weights[:, full:].sum(-1, keepdim=True, dtype=torch.float64))
    bcdf = torch.cat(sums, 1).cumsum(-1)  # [B, blocks]
    total = bcdf[:, -1:]
    u = torch.rand(B, num, dtype=torch.float64, device=weights.device, generator=generator)
    # x < total (rounding aside: clamped to the largest double below it), so a block whose cdf exceeds it
    # exists, and the first one has a positive sum (the cdf rises only there)
    x = torch.minimum(u * total, torch.nextafter(total, torch.zeros_like(total)))
    block = torch.searchsorted(bcdf, x, right=True)  # [B, num]
    below = torch.where(block > 0, bcdf.gather(1, (block - 1).clamp(min=0)), 0.0)
    cols = block[..., None] * blk + torch.arange(blk, device=weights.device)  # [B, num, blk]
    w = weights.gather(1, cols.clamp(max=V - 1).flatten(1)).view(B, num, blk)
    ccdf = torch.where(cols < V, w, 0).cumsum(-1, dtype=torch.float64)
    last = ccdf[..., -1:]
    r = torch.minimum((x - below)[..., None], torch.nextafter(last, torch.zeros_like(last)))
    drawn = block * blk + torch.searchsorted(ccdf, r, right=True)[..., 0]
    return torch.where(total > 0, drawn, (u * V).long().clamp(max=V - 1))


def _drawable(probs: torch.Tensor) -> torch.Tensor:
    """``probs`` cleaned as the samplers clean them: NaN and negative entries weigh 0 (a row with no
    weight left is drawn uniformly by :func:`draw`)."""
    return torch.where(probs > 0, probs, 0.0)


def ragged_passes(device) -> bool:
    """Whether a verification pass over a ragged chain (prompt lookup's proposals, TriForce's collected tokens) is
    a ragged step (``Llama.forward(..., widths=)``: each row's own tokens computed): on the CPU, unless
    ``TRIFORCE_RAGGED_PASSES=0``; elsewhere only with ``TRIFORCE_RAGGED_PASSES=1``. Why the CPU: there a pass
    costs its token-rows (the linear layers' multiply-adds, the attention's queries), while on a GPU it reads
    the weights once for all rows, and packing the real tokens would need a host sync."""
    flag = os.environ.get("TRIFORCE_RAGGED_PASSES")
    return flag != "0" if device.type == "cpu" else flag == "1"


def verify_chain(model, cache, pending: torch.Tensor, draft_tokens: torch.Tensor, draft_probs, active,
                 sampling: Sampling, accept_reject=None, forward=None, ragged: bool = False):
    """One verification pass of ``model`` on ``cache`` over ``[pending, draft_tokens]``; the cache keeps the
    pending token and the accepted drafts of each active row. ``accept_reject(sampling, x, q, logits)``
    replaces ``sampling.verify_chain`` (a test seam); ``forward(ids, cache)`` replaces ``model(ids,
    cache=cache)`` (trained heads keep the pass's hidden states). Draft ids of -1 (a ragged chain's
    padding) are fed as 0 and rejected unread. ``ragged``: the drafts are a ragged chain (each row's ``-1``
    after its own); where :func:`ragged_passes` (the CPU) the pass is then a ragged
    step (``model(ids, cache=cache, widths=...)``), which computes each row's own tokens only (their logits are
    the same; the padding's are 0 and never read).
    -> (tokens ``[B, n+1]``, num_accepted int32 ``[B]``, adv int32 ``[B]``, target probs or None)."""
    base = cache.lengths.clone()
    ids = torch.cat([pending, draft_tokens.clamp(min=0)], 1)
    if forward is not None:
        logits = forward(ids, cache)
    elif ragged and draft_tokens.shape[1] > 0 and ragged_passes(ids.device):
        logits = model(ids, cache=cache, widths=1 + (draft_tokens >= 0).sum(1))
    else:
        logits = model(ids, cache=cache)
    if accept_reject is None:
        tokens, num, probs = sampling.verify_chain(draft_tokens, draft_probs, logits)
    else:
        tokens, num, probs = accept_reject(sampling, draft_tokens, draft_probs, logits)
    adv = active_advance(num, active)
    cache.rollback(base + adv)
    return tokens, num, adv, probs


CHAIN_HIST = 2  # a chain drafter's catch-up window: a step advances by <= gamma + 1 = (gamma - 1) + 2 tokens


def chain_step(d, drafter, cache, active, gamma: int, level: str) -> None:
    """One step: the drafter proposes ``gamma`` tokens (prompt lookup: up to ``gamma``, ``-1`` past a row's
    own), the target on the full ``cache`` verifies them, the drafter commits what was emitted."""
    stats = d.stats
    with stats.time("draft"):
        x, q = drafter.propose(gamma)
    with stats.time("full"):
        tokens, num, adv, _ = verify_chain(d.target, cache, drafter.pending, x, q, active, d.sampling,
                                           forward=getattr(drafter, "chain_pass", None),
                                           ragged=getattr(drafter, "ragged", False))
    offered = (x >= 0).sum(1)  # gamma per row, or a ragged proposal's own length (-1 pads it: prompt lookup)
    drafter.commit(tokens, adv, acceptance=(num * active).sum() / (offered * active).sum().clamp(min=1))
    stats.accept(level, num, offered, active)
    d.emit(tokens, adv, active)


def advance(hist: torch.Tensor, emitted: torch.Tensor, adv: torch.Tensor, width: int) -> torch.Tensor:
    """New window of the last ``width`` committed tokens after appending ``emitted[b, :adv[b]]``."""
    ext = torch.cat([hist, emitted.clamp(min=0)], 1)
    idx = (hist.shape[1] + adv - width).long()[:, None] + torch.arange(width, device=hist.device)
    return ext.gather(1, idx)


def active_advance(num_accepted: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
    return torch.where(active, num_accepted.to(torch.int32) + 1, 0)


class TokenBuffer:
    """Fixed-size per-row token buffer (optionally with one probability row per token), appended to
    at each row's own count with one scatter; writes past the end go to a dump column."""

    def __init__(self, batch: int, capacity: int, device, vocab: int | None = None):
        self.tokens = torch.full((batch, capacity + 1), -1, dtype=torch.int64, device=device)
        self.probs = None if vocab is None else torch.zeros(batch, capacity + 1, vocab, device=device)
        self.count = torch.zeros(batch, dtype=torch.int32, device=device)
        self.capacity = capacity

    def append(self, tokens: torch.Tensor, num: torch.Tensor, probs: torch.Tensor | None = None) -> None:
        w = tokens.shape[1]
        ar = torch.arange(w, device=tokens.device)
        idx = torch.where(ar < num[:, None], self.count[:, None] + ar, self.capacity).clamp(max=self.capacity).long()
        self.tokens.scatter_(1, idx, tokens)
        if self.probs is not None and probs is not None:
            self.probs.scatter_(1, idx[:, :, None].expand(-1, -1, probs.shape[-1]), probs[:, :w])
        self.count += num.to(torch.int32)

    def reset(self) -> None:
        self.tokens.fill_(-1)
        self.count.zero_()
        if self.probs is not None:
            self.probs.zero_()

    def select_rows(self, rows: torch.Tensor) -> None:
        """Keep rows ``rows`` (int64 indices, in that order) and drop the others."""
        self.tokens, self.count = self.tokens[rows], self.count[rows]
        if self.probs is not None:
            self.probs = self.probs[rows]


class RowState:
    """Per-row tensors of an engine that live across steps (each ``[B, ...]``, as attributes), so that rows
    leaving the batch (:meth:`~triforce.engines.decode.Decode.track`) take them along."""

    def __init__(self, **tensors: torch.Tensor):
        vars(self).update(tensors)

    def select_rows(self, rows: torch.Tensor) -> None:
        for name, t in vars(self).items():
            setattr(self, name, t[rows])


class Stats:
    """Per-level wall time (CUDA events on GPU: no host sync until ``finish``), acceptance counters
    kept on the device, target passes and the accepted-length histogram."""

    WINDOW = 512  # tokens of output per bucket of ``acceptance_by_window``

    def __init__(self, device, max_accept: int, position: torch.Tensor | None = None, max_new: int = 0):
        """``position``: int32 ``[B]`` tokens each row has emitted so far (the output buffer's live
        count): acceptance is also binned by it into windows of ``WINDOW`` tokens."""
        self.device = torch.device(device)
        self.position, self.buckets = position, max(1, -(-max_new // self.WINDOW))
        self.accepted_w: dict[str, torch.Tensor] = {}
        self.offered_w: dict[str, torch.Tensor] = {}
        self.times: dict[str, float] = {}
        self._events: dict[str, list] = {}
        self.accepted: dict[str, torch.Tensor] = {}
        self.offered: dict[str, torch.Tensor] = {}
        self.emitted = torch.zeros((), dtype=torch.int64, device=device)
        self.verified_rows = torch.zeros((), dtype=torch.int64, device=device)
        self.hist = torch.zeros(max_accept + 2, dtype=torch.int64, device=device)
        self.target_passes = 0

    @contextmanager
    def time(self, level: str):
        if self.device.type == "cuda":
            # on the model's device's stream (a bare record() uses the current device's, which may differ)
            stream = torch.cuda.current_stream(self.device)
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record(stream)
            yield
            b.record(stream)
            self._events.setdefault(level, []).append((a, b))
        else:
            t0 = time.perf_counter()
            yield
            self.times[level] = self.times.get(level, 0.0) + time.perf_counter() - t0

    def accept(self, level: str, num_accepted, offered, active) -> None:
        """``num_accepted`` of ``offered`` drafts (int or per-row tensor) accepted by ``level``."""
        act = active.to(torch.int64)
        if level not in self.accepted:
            self.accepted[level] = torch.zeros((), dtype=torch.int64, device=self.device)
            self.offered[level] = torch.zeros((), dtype=torch.int64, device=self.device)
            self.accepted_w[level] = torch.zeros(self.buckets, dtype=torch.int64, device=self.device)
            self.offered_w[level] = torch.zeros(self.buckets, dtype=torch.int64, device=self.device)
        acc = num_accepted.to(torch.int64) * act
        # an int multiplies on the device (torch.as_tensor(int, device=cuda) would be an upload: a host sync)
        off = act * offered if isinstance(offered, int) else offered.to(torch.int64) * act
        self.accepted[level] += acc.sum()
        self.offered[level] += off.sum()
        if self.position is not None:
            bucket = torch.div(self.position.long(), self.WINDOW, rounding_mode="floor").clamp(max=self.buckets - 1)
            self.accepted_w[level].index_add_(0, bucket, acc)
            self.offered_w[level].index_add_(0, bucket, off)

    def verified(self, adv, active) -> None:
        """One verification by the full-cache target: rows advanced by ``adv``."""
        self.target_passes += 1
        self.emitted += adv.sum()
        self.verified_rows += active.sum()
        self.hist.index_add_(0, adv.long().clamp(max=self.hist.numel() - 1),
                             active.to(torch.int64))

    def finish(self, prefill_s: float, decode_s: float, new_tokens: int, decode_tokens: int) -> dict:
        """``new_tokens``: real new tokens of the whole batch; ``decode_tokens``: those produced after
        prefill (``tokens_per_s = decode_tokens / decode_s``)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            for level, evs in self._events.items():
                self.times[level] = sum(a.elapsed_time(b) for a, b in evs) * 1e-3
        acc = {k: (self.accepted[k].item() / max(self.offered[k].item(), 1)) for k in self.accepted}
        by_window = {k: [a / o if o else None for a, o in zip(self.accepted_w[k].tolist(), self.offered_w[k].tolist())]
                     for k in self.accepted_w} if self.position is not None else {}
        rows = self.verified_rows.item()
        return {
            "prefill_s": prefill_s, "decode_s": decode_s,
            "tokens_per_s": decode_tokens / decode_s if decode_s > 0 else 0.0,
            "new_tokens": new_tokens,
            "acceptance": acc,
            "mean_accepted": self.emitted.item() / rows if rows else 1.0,
            "target_passes": self.target_passes,
            # (row-verifications: the passes each row was active in, summed over the rows; over the batch size, the
            # passes a row needed on average, against target_passes, the batch's: its slowest row's)
            "row_passes": rows,
            "time_s": dict(self.times),
            "accepted_hist": self.hist.tolist(),
            "acceptance_by_window": by_window,  # per level: rate in output tokens [512 i, 512 (i + 1))
        }


def pad_prompts(prompts: list[torch.Tensor], width: int) -> list[torch.Tensor]:
    """Each prompt left-padded with its first token to at least ``width`` tokens: what a drafter with a
    ``width``-token history starts from. A drafter's context only sets how well it guesses, never what
    is emitted, so a prompt shorter than the history still decodes exactly."""
    return [torch.cat([p[:1].expand(width - len(p)), p]) if len(p) < width else p for p in prompts]


def recent_chunks(recent: int, budget: int, chunk_size: int) -> int:
    """The retrieval cache's always-kept trailing chunks for ``recent`` tokens of recent context: whole
    chunks, at most half the budget's chunks (the rest is chosen by score, the sink chunk kept)."""
    budget_chunks = budget // chunk_size
    return max(0, min(recent // chunk_size, budget_chunks // 2, budget_chunks - 2))


def retrieval_budget(budget: int, chunk_size: int, prompts: list[torch.Tensor]) -> int | None:
    """The retrieval budget in tokens, rounded down to whole chunks and capped by the shortest prompt's
    complete chunks; a retrieval cache needs more than its sink and recent chunk: >= 3 chunks. A
    budget below that raises; ``None`` when the budget is fine but the shortest prompt is too short
    for any retrieval cache (the engines then fall back, saying so in ``stats["notes"]``)."""
    if budget < 3 * chunk_size:
        raise ValueError(f"budget: a retrieval cache needs at least 3 chunks of chunk_size={chunk_size} tokens, "
                         f"got budget={budget} (raise the budget or lower chunk_size)")
    shortest = min(len(p) for p in prompts)
    b = (min(budget, shortest) // chunk_size) * chunk_size
    return b if b >= 3 * chunk_size else None
