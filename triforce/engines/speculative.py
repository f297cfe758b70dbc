"""Speculative decoding (Leviathan et al. / Chen et al.): a draft model on its own full cache
proposes ``gamma`` tokens, the target on the full cache verifies them in one pass."""
from __future__ import annotations

from .decode import Decode
from .drafters import Drafter
from .steps import CHAIN_HIST, chain_step


def default_draft(target, draft_layers: int | None):
    """The embedded default draft: the target's first half of layers + its head (weights shared)."""
    n = target.config.num_hidden_layers
    return target.layer_skip(draft_layers or max(1, n // 2))


def run(d: Decode, draft, *, gamma: int, draft_layers: int | None) -> tuple:
    d.setup(width=gamma + 1)
    draft = draft if draft is not None else default_draft(d.target, draft_layers)
    d.require_prompt_len(CHAIN_HIST, "speculative")
    cache = d.full_cache(d.target)
    drafter = Drafter(draft, d.full_cache(draft), d.sampling, CHAIN_HIST)
    with d.timed_prefill():
        drafter.prefill(d.prompts, d.start(d.target.prefill(d.prompts, cache), CHAIN_HIST))
    return d.loop(lambda active: chain_step(d, drafter, cache, active, gamma, "draft->full"))
