"""Autoregressive decoding: one full-cache target forward per token. The baseline."""
from __future__ import annotations

import torch

from .decode import Decode
from .steps import RowState


def run(d: Decode, draft) -> tuple:
    d.setup(width=1)
    target, sampling, stats = d.target, d.sampling, d.stats
    cache = d.full_cache(target)
    with d.timed_prefill():
        last = RowState(token=d.start(target.prefill(d.prompts, cache), 1))
    d.track(last)

    def step(active):
        with stats.time("full"):
            last.token, _ = sampling.sample(target(last.token, cache=cache)[:, -1])
        d.emit(last.token, active.to(torch.int32), active)

    return d.loop(step)
