"""Autoregressive decoding: one full-cache target forward per token. The baseline."""
from __future__ import annotations

import torch

from . import Decode

OPTIONS: dict = {}


def run(d: Decode, draft=None) -> tuple:
    d.setup(width=1)
    target, sampling, stats = d.target, d.sampling, d.stats
    cache = d.full_cache(target)
    with d.timed_prefill():
        tok = d.start(target.prefill(d.prompts, cache), 1)
    one = torch.ones(d.batch, dtype=torch.int32, device=d.device)

    def step(tok, active):
        with stats.time("full"):
            tok, _ = sampling.sample(target(tok, cache=cache)[:, -1])
        d.out.append(tok, one)
        stats.verified(one, active)
        return tok

    return d.loop(step, tok)

