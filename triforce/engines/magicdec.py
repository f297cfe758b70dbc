"""MagicDec (self-speculation): the target itself on a fixed StreamingLLM window (sink + recent
tokens) drafts ``gamma`` tokens for the target on the full cache. Drafting reads the weights plus a
small fixed KV window instead of the whole context, so it pays off when batch x context makes KV
bytes dominate weight bytes. ``draft_cache="retrieval"`` drafts from a retrieval cache of the same
budget instead (the TriForce middle level used as a two-level method); with a prompt too short for
a retrieval cache (fewer than 3 complete chunks) it drafts from the StreamingLLM window, and says so
in ``stats["notes"]``.

``draft=``: a model drafting instead of the target. On the StreamingLLM window it keeps a window of
its own (prefilled with the prompts). On the retrieval cache it reads the target's own keys and
values (the chunks the cache selected, and the verified tokens it copies from the full cache), so it
must be a copy of the target with cheaper weights: the same layers, KV heads, head size, positions and
vocabulary, computing in the target's dtype (``triforce.models.int8_copy(target)``;
:func:`check_retrieval_draft`). Then a draft step reads the cheaper weights and the small cache only;
its acceptance is the level ``draft->full`` (``self->full`` when the target drafts)."""
from __future__ import annotations

from .decode import Decode, cache_dtype, model_dtype
from .drafters import Drafter, RetrievalDrafter
from .steps import CHAIN_HIST, chain_step, recent_chunks, retrieval_budget


def run(d: Decode, draft, *, gamma: int, sink: int, window: int, draft_cache: str, budget: int | None,
        chunk_size: int, rebuild_stride: int, recent: int, sliding_layers: str) -> tuple:
    from triforce.models.cache import RetrievalCache, StreamingCache

    d.setup(width=gamma + 1)
    target = d.target
    if draft_cache == "retrieval":
        if draft is not None:
            check_retrieval_draft(draft, target)
        budget = retrieval_budget(budget or sink + window, chunk_size, d.prompts)
        if budget is None:
            d.notes.append(f"magicdec: the shortest prompt has fewer than 3 chunks of {chunk_size} tokens, too "
                           f"short for a retrieval cache: drafted from the StreamingLLM window instead")
            draft_cache = "streaming"
    if draft_cache == "streaming":
        model = draft if draft is not None else target
        d.require_window(window, gamma + CHAIN_HIST, "magicdec")
        cache = d.full_cache(target)
        drafter = Drafter(model, StreamingCache(model.config, d.batch, sink, window, max_step=CHAIN_HIST,
                                                device=d.device, dtype=cache_dtype(model),
                                                rope_long=d.rope_long(model.config)), d.sampling, CHAIN_HIST)
        with d.timed_prefill():
            drafter.prefill(d.prompts, d.start(target.prefill(d.prompts, cache), CHAIN_HIST),
                            full=cache if model is target else None)
    else:
        cache = d.full_cache(target, chunk_size=chunk_size)
        with d.timed_prefill():
            first = d.start(target.prefill(d.prompts, cache), 1)
            rcache = RetrievalCache(target.config, cache, budget, chunk_size,
                                    max_step=gamma,  # appended between syncs: the pending token and gamma - 1 drafts
                                    rebuild_stride=rebuild_stride,
                                    recent_chunks=recent_chunks(recent, budget, chunk_size),
                                    exact_windows=sliding_layers == "window")
            drafter = RetrievalDrafter(draft if draft is not None else target, rcache, d.sampling)
            drafter.prefill(d.prompts, first)
    d.track(drafter, drafter.cache)
    level = "self->full" if draft is None else "draft->full"
    return d.loop(lambda active: chain_step(d, drafter, cache, active, gamma, level))


def check_retrieval_draft(draft, target) -> None:
    """Raise ``ValueError`` unless ``draft`` can draft on ``target``'s retrieval cache: that cache holds the
    target's keys and values (RoPE applied at the target's positions), so the draft needs the target's
    layers, KV heads, head size, vocabulary and RoPE, and the target's dtype (the cache's)."""
    a, b = draft.config, target.config
    names = ("num_hidden_layers", "kv_heads_per_layer", "head_dim", "vocab_size", "max_position_embeddings",
             "rope_theta", "rope_scaling")
    diff = [n for n in names if getattr(a, n) != getattr(b, n)]
    if diff:
        raise ValueError(f"draft: with draft_cache='retrieval' the draft reads the target's own keys and values, so "
                         f"it must share the target's {', '.join(diff)}: use a copy of the target with cheaper "
                         f"weights (triforce.models.int8_copy(target)), or draft=None (the target itself)")
    if model_dtype(draft) != model_dtype(target):
        raise ValueError(f"draft: with draft_cache='retrieval' the draft computes on the target's "
                         f"{model_dtype(target)} cache, but it is {model_dtype(draft)}: use "
                         f"triforce.models.int8_copy(target) (float32 activations), or draft=None (the target itself)")
