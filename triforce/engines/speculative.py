"""Speculative decoding (Leviathan et al. / Chen et al.): a draft model proposes ``gamma`` tokens, the
target on the full cache verifies them in one pass.

Default draft: a bfloat16 copy of a float32/float16 target on its own full cache; for a bfloat16
target (no cheaper copy exists) the target itself on a StreamingLLM window (sink 16 + 240 recent
tokens), as MagicDec drafts. ``draft_layers=k`` picks the target's first k layers instead
(``target.layer_skip(k)``: weights shared, but without early-exit training a poor draft).
``draft="lookup"``: prompt lookup, drafts copied from the sequence's own earlier tokens (no model;
:mod:`~triforce.engines.lookup`: ``ngram`` its n-gram, ``lookup_length`` its proposals' length)."""
from __future__ import annotations

from .decode import Decode, cache_dtype
from .drafters import Drafter, half_precision_copy
from .lookup import LookupDrafter, is_lookup
from .steps import CHAIN_HIST, chain_step

SELF_DRAFT_WINDOW = (16, 240)  # sink, window of the bfloat16 target's self-draft


def run(d: Decode, draft, *, gamma: int, draft_layers: int | None, ngram: int, lookup_length: str) -> tuple:
    from triforce.models.cache import StreamingCache

    d.setup(width=gamma + 1)
    target = d.target
    if is_lookup(draft):
        cache = d.full_cache(target)
        drafter = LookupDrafter(d, ngram, CHAIN_HIST, lookup_length)
        d.track(drafter)
        with d.timed_prefill():
            drafter.prefill(d.prompts, d.start(target.prefill(d.prompts, cache), CHAIN_HIST))
        return d.loop(lambda active: chain_step(d, drafter, cache, active, gamma, f"{drafter.level}->full"))
    if draft is None and draft_layers:
        draft = target.layer_skip(draft_layers)
    draft = draft if draft is not None else half_precision_copy(target)
    cache = d.full_cache(target)
    if draft is not None:
        dcache = d.full_cache(draft)
    else:
        draft, (sink, window) = target, SELF_DRAFT_WINDOW
        dcache = StreamingCache(target.config, d.batch, sink, max(window, gamma + CHAIN_HIST), max_step=CHAIN_HIST,
                                device=d.device, dtype=cache_dtype(target), rope_long=d.rope_long(target.config))
    drafter = Drafter(draft, dcache, d.sampling, CHAIN_HIST)
    d.track(drafter, dcache)
    with d.timed_prefill():
        drafter.prefill(d.prompts, d.start(target.prefill(d.prompts, cache), CHAIN_HIST),
                        full=cache if draft is target else None)
    return d.loop(lambda active: chain_step(d, drafter, cache, active, gamma, "draft->full"))
