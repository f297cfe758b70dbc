"""Autoregressive decoding: one full-cache target forward per token. The baseline."""
from __future__ import annotations

import torch

from .decode import Decode


def run(d: Decode, draft) -> tuple:
    d.setup(width=1)
    target, sampling, stats = d.target, d.sampling, d.stats
    cache = d.full_cache(target)
    with d.timed_prefill():
        tok = d.start(target.prefill(d.prompts, cache), 1)

    def step(tok, active):
        with stats.time("full"):
            tok, _ = sampling.sample(target(tok, cache=cache)[:, -1])
        d.emit(tok, active.to(torch.int32), active)
        return tok

    return d.loop(step, tok)

