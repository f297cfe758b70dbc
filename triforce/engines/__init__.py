"""Decoding engines behind :func:`triforce.generate`: one module per method, sharing the step helpers
of :mod:`triforce.engines.steps` and the per-call state :class:`Decode`.

    autoregressive  one target forward per token (the baseline every method must reproduce)
    speculative     a draft model on its own full cache proposes ``gamma`` tokens, the target verifies
    magicdec        the target on a StreamingLLM (or retrieval) cache drafts for the full-cache target
    triforce        draft on a StreamingLLM cache -> target on a retrieval cache -> target, full cache
    tree            a static token tree drafted by the self-draft, verified in one tree-masked pass
"""
from __future__ import annotations

import time

import torch

from .steps import Sampling, Stats, TokenBuffer

METHODS = ("autoregressive", "speculative", "triforce", "magicdec", "tree")


class Decode:
    """Per-call state shared by the engines: prompts, sampling, output buffer, statistics."""

    def __init__(self, target, prompts: list[torch.Tensor], max_new_tokens: int, sampling: Sampling,
                 progress=None):
        self.target, self.prompts, self.max_new, self.sampling = target, prompts, max_new_tokens, sampling
        self.device = prompts[0].device
        self.batch = len(prompts)
        self.prompt_lens = torch.tensor([len(p) for p in prompts], dtype=torch.int32, device=self.device)
        self.max_prompt = max(len(p) for p in prompts)
        self.progress = progress
        self.prefill_s = 0.0

    def setup(self, width: int) -> None:
        """``width``: the most tokens one step appends to the full cache (sizes every buffer)."""
        self.width = width
        self.out = TokenBuffer(self.batch, self.max_new + width + 1, self.device)
        self.stats = Stats(self.device, width)

    @property
    def cache_len(self) -> int:
        """Full-cache capacity: prompt + new tokens + one step of overshoot (a row may finish up to
        ``width - 1`` tokens past ``max_new``) + the next step's tokens, appended to finished rows too."""
        return self.max_prompt + self.max_new + 2 * self.width + 1

    def full_cache(self, model, chunk_size: int | None = None):
        from triforce.models.cache import FullCache

        return FullCache(model.config, self.batch, self.cache_len, device=self.device,
                         dtype=model_dtype(model), chunk_size=chunk_size)

    def require_prompt_len(self, n: int, method: str) -> None:
        if min(len(p) for p in self.prompts) < n:
            raise ValueError(f"prompt_ids: method {method!r} with these options needs prompts of at least "
                             f"{n} tokens")

    @staticmethod
    def require_window(window: int, span: int, method: str) -> None:
        """A StreamingLLM drafter rolls back up to ``span`` tokens appended over several forwards
        (each of which may evict old tokens first), so its window must hold them all."""
        if window < span:
            raise ValueError(f"window: {method!r} with these options needs a StreamingLLM window of at least "
                             f"{span} tokens, got {window}")

    def truncated(self, hist_width: int) -> list[torch.Tensor]:
        """Prompts without their last ``hist_width - 1`` tokens: what a drafter cache holds at the
        start (it then catches up from ``hist``)."""
        return [p[: len(p) + 1 - hist_width] for p in self.prompts]

    def start(self, logits: torch.Tensor, hist_width: int) -> torch.Tensor:
        """Sample the first new token from the prefill logits ``[B, V]``; -> ``hist [B, hist_width]``."""
        first, _ = self.sampling.sample(logits)
        self.out.append(first, torch.ones(self.batch, dtype=torch.int32, device=self.device))
        if hist_width == 1:
            return first
        tails = torch.stack([p[len(p) - hist_width + 1:] for p in self.prompts])
        return torch.cat([tails, first], 1)

    def timed_prefill(self):
        return _Timer(self, "prefill_s")

    def active(self) -> torch.Tensor:
        return self.out.count < self.max_new

    def loop(self, step, state):
        """Run ``state = step(state, active)`` until every row has ``max_new`` tokens (one host sync per
        step, to decide termination), then finish the statistics."""
        t0 = time.perf_counter()
        while True:
            active = self.active()
            done = self.out.count.min().item()  # the one host sync per step
            if self.progress is not None:
                self.progress(min(done, self.max_new))
            if done >= self.max_new:
                break
            state = step(state, active)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return self.finish(time.perf_counter() - t0)

    def finish(self, decode_s: float):
        tokens = [self.out.tokens[b, : self.max_new].clone() for b in range(self.batch)]
        return tokens, self.stats.finish(self.prefill_s, decode_s, self.batch * self.max_new)


def model_dtype(model) -> torch.dtype:
    return next(model.parameters()).dtype


class _Timer:
    def __init__(self, decode: Decode, attr: str):
        self.decode, self.attr = decode, attr

    def __enter__(self):
        self.t0 = time.perf_counter()

    def __exit__(self, *exc):
        if self.decode.device.type == "cuda":
            torch.cuda.synchronize(self.decode.device)
        setattr(self.decode, self.attr, getattr(self.decode, self.attr) + time.perf_counter() - self.t0)
