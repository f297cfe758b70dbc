"""Per-call state shared by every engine: prompts, sampling, caches' sizes, the output buffer, end of
sequence and the statistics (:class:`Decode`)."""
from __future__ import annotations

import os
import time

import torch

from .steps import Sampling, Stats, TokenBuffer, pad_prompts


class Decode:
    """Per-call state shared by the engines: prompts, sampling, output buffer, EOS, statistics.

    A row is *active* while it has fewer than ``max_new`` tokens and has not emitted an EOS id; an
    inactive row never advances again. With ``compact`` (the default on the CPU) it leaves the batch at the
    next step: every per-row state of the call (the caches, the drafters, the output) keeps the live rows
    only (:meth:`track`, :meth:`select_rows`). Otherwise it keeps riding in the batch, its forwards padding.
    ``batch`` is the live batch; ``rows[i]`` the caller's index of live row ``i``."""

    def __init__(self, target, prompts: list[torch.Tensor], max_new_tokens: int, sampling: Sampling,
                 progress=None, eos_token_ids: list[int] | None = None, pad_token_id: int | None = None):
        self.target, self.prompts, self.max_new, self.sampling = target, prompts, max_new_tokens, sampling
        self.device = prompts[0].device
        self.batch = len(prompts)
        self.max_prompt = max(len(p) for p in prompts)
        self.progress = progress
        self.prefill_s = 0.0
        self.eos = None if not eos_token_ids else torch.tensor(eos_token_ids, dtype=torch.int64, device=self.device)
        self.pad = pad_token_id if pad_token_id is not None else (eos_token_ids[0] if eos_token_ids else -1)
        self.finished = torch.zeros(self.batch, dtype=torch.bool, device=self.device)
        self.notes: list[str] = []  # how the run deviated from the requested configuration, if it did
        self.caches: list = []  # the full caches: their lengths ride in the loop's one read per step
        self.holders: list = []  # every per-row state of the call (track)
        self.rows = torch.arange(self.batch, device=self.device)
        self.compact = compact_rows(self.device)
        self.share = compact_share(self.device)

    def setup(self, width: int) -> None:
        """``width``: the most tokens one step appends to the full cache (sizes every buffer)."""
        self.width = width
        self.out = TokenBuffer(self.batch, self.max_new + width + 1, self.device)
        self.result = self.out.tokens.clone()  # each caller row's tokens (final for the rows that left the batch)
        self.stats = Stats(self.device, width, position=self.out.count, max_new=self.max_new)

    def track(self, *holders) -> None:
        """Register per-row state that lives across steps: objects with ``select_rows(rows)`` (``rows``: int64
        indices of the rows kept, in their new order), called when finished rows leave the batch. Each object
        once (a drafter's cache may be tracked by both the engine and :meth:`full_cache`); ``None`` is skipped."""
        for h in holders:
            if h is not None and all(h is not x for x in self.holders):
                self.holders.append(h)

    @property
    def cache_len(self) -> int:
        """Full-cache capacity: prompt + new tokens + one step of overshoot (a row may finish up to
        ``width - 1`` tokens past ``max_new``) + the next step's tokens, appended to finished rows too."""
        return self.max_prompt + self.max_new + 2 * self.width + 1

    def full_cache(self, model, chunk_size: int | None = None):
        from triforce.models.cache import FullCache

        # prompt + max_new fits the context (checked by generate); only never-emitted drafts go past it
        slack = max(0, self.cache_len - model.config.max_position_embeddings)
        cache = FullCache(model.config, self.batch, self.cache_len, device=self.device,
                          dtype=cache_dtype(model), chunk_size=chunk_size, speculative_slack=slack,
                          rope_long=self.rope_long(model.config))
        self.caches.append(cache)
        self.track(cache)
        return cache

    def rope_long(self, config) -> torch.Tensor | None:
        """LongRoPE: bool ``[B]``, the rows whose prompt and ``max_new_tokens`` together pass
        ``config.rope_long_from``: those take the long factors from their first token on, the others the short
        ones throughout (every cache of the call, so every method computes the same logits; docs/model.md,
        "LongRoPE"). None for every other RoPE."""
        start = config.rope_long_from
        if start is None:
            return None
        return torch.tensor([len(p) + self.max_new > start for p in self.prompts], device=self.device)

    @staticmethod
    def require_window(window: int, span: int, method: str) -> None:
        """A StreamingLLM drafter rolls back up to ``span`` tokens appended over several forwards (each of
        which may evict old tokens first, its own speculative ones included), so its window must hold them
        all."""
        if window < span:
            raise ValueError(f"window: {method!r} with these options needs a StreamingLLM window of at least "
                             f"{span} tokens, got {window}")

    def start(self, logits: torch.Tensor, hist_width: int) -> torch.Tensor:
        """Sample the first new token from the prefill logits ``[B, V]``; -> ``hist [B, hist_width]``:
        the last ``hist_width - 1`` tokens of each (padded) prompt, then the new token."""
        first, _ = self.sampling.sample(logits)
        self._append(first, torch.ones(self.batch, dtype=torch.int32, device=self.device))
        if hist_width == 1:
            return first
        tails = torch.stack([p[len(p) - hist_width + 1:] for p in pad_prompts(self.prompts, hist_width)])
        return torch.cat([tails, first], 1)

    def _append(self, tokens: torch.Tensor, num: torch.Tensor) -> None:
        """Append ``tokens[b, :num[b]]`` to row b's output; a row that emits an EOS id finishes."""
        if self.eos is not None:
            new = torch.arange(tokens.shape[1], device=self.device) < num[:, None]
            self.finished |= (torch.isin(tokens, self.eos) & new).any(1)
        self.out.append(tokens, num)

    def emit(self, tokens: torch.Tensor, adv: torch.Tensor, active: torch.Tensor) -> None:
        """One full-cache verification advanced each row by ``adv`` (0 for inactive rows): record the
        emitted ``tokens[b, :adv[b]]`` and count the pass."""
        self._append(tokens, adv)
        self.stats.verified(adv, active)

    def timed_prefill(self):
        return _Timer(self, "prefill_s")

    def active(self) -> torch.Tensor:
        return (self.out.count < self.max_new) & ~self.finished

    def loop(self, step):
        """Run ``step(active)`` until every row has ``max_new`` tokens or has finished (one host sync
        per step, to decide termination and whether rows leave the batch; it also reads the full caches'
        longest row, so that their capacity checks need no read of their own), then finish the statistics."""
        t0 = time.perf_counter()
        try:
            while True:
                active = self.active()
                if not self.compact or self.share < 1:  # else the rows that are done leave below at once
                    self._retire(active)
                reads = [active.sum().long(), self.out.count.min().long()]
                reads += [c.lengths.max().long() for c in self.caches]
                running, done, *longest = torch.stack(reads).tolist()
                for cache, n in zip(self.caches, longest):
                    cache.tighten_bound(n)
                if self.progress is not None:
                    self.progress(min(done, self.max_new))
                if not running:
                    break
                if self.compact and running < self.batch and running <= self.batch * self.share:
                    self.select_rows(active)
                    active = self.active()
                step(active)
        finally:
            # the engines' state holds this Decode (a drafter, TriForce's middle level): without that reference
            # cycle the caches are freed as the call returns (or raises), not at the next garbage collection
            self.holders.clear()
        if self.progress is not None and done < self.max_new:
            self.progress(self.max_new)  # every row stopped at EOS
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return self.finish(time.perf_counter() - t0)

    def _retire(self, active: torch.Tensor) -> None:
        """Empty the full caches' rows that are done (finished or at ``max_new``: a row never becomes active
        again), where they do not leave the batch (``compact`` off, or off the CPU until the batch halves). Such a
        row still rides in every forward as padding; with no keys it attends to its own new tokens only, which a
        pass writes at slots ``0..T-1`` and the verification rolls back (``adv`` 0), instead of reading its whole
        context: at batch x long context a finished row otherwise costs a pass as much as a live one. Not a cache
        that a retrieval cache reads (``chunk_size`` set: TriForce, MagicDec with ``draft_cache="retrieval"``),
        whose rebuilds need the rows' contexts. On the device, no sync."""
        for cache in self.caches:
            if cache.chunk_size is None:
                cache.rollback(torch.where(active, cache.lengths, 0))

    def select_rows(self, active: torch.Tensor) -> None:
        """The finished rows leave the batch: every tracked state keeps the ``active`` rows (in the order of
        :func:`~triforce.models.cache.rows_in_place`, which moves the fewest rows of a full cache's buffers).
        The output of every row so far goes to ``result`` first (the leaving rows' is final). One host read of
        ``active`` and one upload of the order (free on the CPU)."""
        from triforce.models.cache import rows_in_place

        live = [b for b, a in enumerate(active.tolist()) if a]
        rows = torch.tensor(rows_in_place(live), dtype=torch.int64, device=self.device)
        self._save_output()
        for h in self.holders:
            h.select_rows(rows)
        self.out.select_rows(rows)
        self.finished, self.rows = self.finished[rows], self.rows[rows]
        self.batch = len(live)
        self.stats.position = self.out.count

    def _save_output(self) -> None:
        self.result[self.rows] = self.out.tokens

    def lengths(self) -> torch.Tensor:
        """Real new tokens per row of the caller's batch: up to ``max_new``, cut after the first EOS id."""
        tokens = self.result
        n = torch.full((tokens.shape[0],), self.max_new, dtype=torch.int64, device=self.device)
        if self.eos is None:
            return n
        hit = torch.isin(tokens[:, : self.max_new], self.eos)
        first = torch.where(hit.any(1), hit.int().argmax(1) + 1, self.max_new)
        return torch.minimum(n, first)

    def finish(self, decode_s: float):
        self._save_output()
        lengths = self.lengths()
        cols = torch.arange(self.max_new, device=self.device)
        padded = torch.where(cols < lengths[:, None], self.result[:, : self.max_new], self.pad)
        tokens = [padded[b].clone() for b in range(len(self.prompts))]
        # the first token of every row is sampled from the prefill's logits: not a decode token
        new_tokens = int(lengths.sum())
        stats = self.stats.finish(self.prefill_s, decode_s, new_tokens, new_tokens - len(self.prompts))
        stats["lengths"] = lengths.tolist()
        stats["notes"] = list(self.notes)
        return tokens, stats


def compact_rows(device) -> bool:
    """Whether finished rows leave the batch (:meth:`Decode.select_rows`): on the CPU, unless
    ``TRIFORCE_COMPACT_ROWS=0``; elsewhere only with ``TRIFORCE_COMPACT_ROWS=1``. Why the CPU: there a pass
    computes its linear layers for every row it carries (SmolLM2 at 4 x 5 tokens with one live row took
    1.8x the time of that row alone), while on a GPU the pass reads the weights once for all rows and a
    retired row reads no context (``_retire``)."""
    flag = os.environ.get("TRIFORCE_COMPACT_ROWS")
    return flag != "0" if device.type == "cpu" else flag == "1"


def compact_share(device) -> float:
    """With ``compact``, the largest share of the batch still running at which the finished rows leave: 1 on the
    CPU (a row leaves at the step after it finished), 1/2 elsewhere. On a GPU each new batch size captures its
    CUDA graphs again (GPU run 5: rows leaving at every finish made MagicDec 0.12x of autoregressive decoding at
    batch 32-128), so there the batch shrinks by half or more at a time: at most log2(B) sizes a call. Until
    then the finished rows ride along retired (they read no context: ``_retire``)."""
    return 1.0 if device.type == "cpu" else 0.5


def model_dtype(model) -> torch.dtype:
    return next(model.parameters()).dtype


def cache_dtype(model) -> torch.dtype:
    """The dtype of the KV caches made for ``model``: its ``kv_dtype`` (``Llama.kv_dtype``), else its own."""
    kv = getattr(model, "kv_dtype", None)
    return kv if kv is not None else model_dtype(model)


class _Timer:
    def __init__(self, decode: Decode, attr: str):
        self.decode, self.attr = decode, attr

    def __enter__(self):
        self.t0 = time.perf_counter()

    def __exit__(self, *exc):
        if self.decode.device.type == "cuda":
            torch.cuda.synchronize(self.decode.device)
        setattr(self.decode, self.attr, getattr(self.decode, self.attr) + time.perf_counter() - self.t0)
