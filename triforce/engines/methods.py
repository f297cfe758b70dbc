"""The one table of decoding methods: each method's engine and its options, with the default, the
check and the help text of every option in one place (``generate``, the CLI and the docs read it).

An option value is validated here, at the boundary, with a message that names it; engines receive
only validated values (plus ``None`` for options whose default depends on the model or prompt).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from . import autoregressive, magicdec, speculative, tree, triforce
from .lookup import LENGTHS


def _int_at_least(lo: int) -> Callable[[Any], str | None]:
    def check(v):
        if isinstance(v, bool) or not isinstance(v, int):
            return f"expected an int >= {lo}, got {v!r}"
        return None if v >= lo else f"expected an int >= {lo}, got {v}"
    return check


def _optional(check):
    return lambda v: None if v is None else check(v)


def _choice(*values):
    return lambda v: None if v in values else f"expected one of {', '.join(map(repr, values))}, got {v!r}"


def _tree_shape(v):
    ok = isinstance(v, (tuple, list)) and len(v) > 0 and all(
        isinstance(k, int) and not isinstance(k, bool) and k >= 1 for k in v)
    return None if ok else f"expected a non-empty tuple of branching factors (ints >= 1), got {v!r}"


@dataclass(frozen=True)
class Option:
    default: Any
    check: Callable[[Any], str | None]
    help: str


_POS = _int_at_least(1)
_NONNEG = _int_at_least(0)

# Every option of every method, once. ``None`` defaults are resolved by the engine (documented here).
OPTIONS: dict[str, Option] = {
    "gamma": Option(4, _POS, "draft tokens per verification (speculative, magicdec)"),
    "gamma1": Option(2, _POS, "triforce: draft tokens per retrieval-level verification (paper: 2)"),
    "gamma2": Option(6, _POS, "triforce: tokens the retrieval level collects per full-level verification "
                              "(paper: 6)"),
    "budget": Option(4096, _POS, "retrieval-cache tokens, rounded down to whole chunks and capped by the "
                                 "shortest prompt (triforce; magicdec with draft_cache='retrieval', where the "
                                 "default is sink + window)"),
    "chunk_size": Option(8, _POS, "tokens per retrieval chunk"),
    "rebuild_stride": Option(256, _POS, "re-select the retrieval chunks after a sequence grew by this many "
                                        "tokens"),
    "recent": Option(256, _NONNEG, "retrieval cache: the most recent tokens it always keeps besides the chunks "
                                   "chosen by score (whole chunks, at most half the budget; triforce, magicdec "
                                   "with draft_cache='retrieval')"),
    "sink": Option(16, _NONNEG, "StreamingLLM attention-sink tokens"),
    "window": Option(240, _POS, "StreamingLLM recent-window tokens"),
    "tree": Option((2, 2, 1, 1), _tree_shape, "tree: branching factors per depth, e.g. (2, 2, 1, 1) (with "
                                              "draft='lookup': the most children of a node at each depth)"),
    "tree_nodes": Option(None, _optional(_tree_shape), "tree with trained heads: nodes per depth chosen by "
                                                       "cumulative probability, e.g. (4, 4, 2, 2), instead of "
                                                       "the static shape"),
    "draft_vocab": Option(None, _optional(_POS), "tree, triforce with trained heads: draft only from the N "
                                                 "tokens most frequent in the heads' training text (a "
                                                 "cheaper LM head while drafting; the verifier reads every "
                                                 "token, so the output is unchanged); default: every token"),
    "draft_layers": Option(None, _optional(_POS), "layers of the layer-skip draft (speculative: default half "
                                                  "the target's layers; triforce: default none, the whole "
                                                  "target on its StreamingLLM window)"),
    "ngram": Option(3, _POS, "speculative, tree, triforce with draft='lookup' (prompt lookup): the longest run of a "
                             "row's last tokens looked up in its earlier tokens (then shorter ones, down to 1)"),
    "lookup_length": Option("match", _choice(*LENGTHS),
                            "speculative, triforce with draft='lookup': how many tokens a proposal copies: "
                            "'match', as many as the row's last tokens matched where they were found (the "
                            "longest match of the latest occurrences), up to gamma (gamma1); 'gamma', up to "
                            "gamma (gamma1) after the latest occurrence, whatever the match"),
    "sliding_layers": Option("window", _choice("window", "retrieve"),
                             "retrieval cache, on a model with sliding-window layers: 'window', such a layer "
                             "holds the most recent chunks and attends within its window (exactly what the "
                             "model sees where the budget is at least the window); 'retrieve', it retrieves "
                             "chunks by score like the other layers (triforce, magicdec with "
                             "draft_cache='retrieval')"),
    "draft_cache": Option("streaming", _choice("streaming", "retrieval"),
                          "magicdec: the draft's cache, 'streaming' or 'retrieval' (a draft model on the "
                          "retrieval cache reads the target's keys and values: a copy of the target, e.g. "
                          "int8)"),
}


@dataclass(frozen=True)
class Method:
    name: str
    run: Callable          # run(decode, draft, **options) -> (tokens, stats)
    options: tuple[str, ...]
    summary: str
    overrides: tuple[tuple[str, Any], ...] = ()  # this method's own defaults, where they differ

    def defaults(self) -> dict:
        return {**{k: OPTIONS[k].default for k in self.options}, **dict(self.overrides)}


METHODS: dict[str, Method] = {m.name: m for m in (
    Method("autoregressive", autoregressive.run, (), "one target forward per token (the baseline)"),
    Method("speculative", speculative.run, ("gamma", "draft_layers", "ngram", "lookup_length"),
           "a draft model on its own full cache (or prompt lookup: draft='lookup') proposes gamma tokens, the "
           "target verifies them"),
    Method("magicdec", magicdec.run, ("gamma", "sink", "window", "draft_cache", "budget", "chunk_size",
                                    "rebuild_stride", "recent", "sliding_layers"),
           "the target on a StreamingLLM (or retrieval) cache drafts for the full-cache target",
           overrides=(("budget", None),)),
    Method("triforce", triforce.run, ("gamma1", "gamma2", "budget", "chunk_size", "rebuild_stride", "sink",
                                    "window", "draft_layers", "recent", "draft_vocab", "ngram",
                                    "lookup_length", "sliding_layers"),
           "draft on a StreamingLLM cache -> target on a retrieval cache -> target on the full cache"),
    Method("tree", tree.run, ("tree", "sink", "window", "tree_nodes", "draft_vocab", "ngram"),
           "a static token tree drafted by the self-draft (or trained heads; or prompt lookup's tree: "
           "draft='lookup'), verified in one tree-masked pass"),
)}


# the methods that draft with prompt lookup (draft="lookup"), as benchmark rows ("method:draft") beside the methods
LOOKUP_ROWS = ("speculative:lookup", "tree:lookup")


def resolve(method: str, options: dict) -> tuple[Method, dict]:
    """Validate ``options`` for ``method`` and fill in the defaults -> (method, options)."""
    if method not in METHODS:
        raise ValueError(f"method: expected one of {', '.join(METHODS)}, got {method!r}")
    m = METHODS[method]
    unknown = sorted(set(options) - set(m.options))
    if unknown:
        raise TypeError(f"method_options: {method!r} takes {list(m.options) or 'no options'}, got {unknown}")
    out = m.defaults()
    for k, v in options.items():
        if v is None:  # None: the method's default
            continue
        problem = OPTIONS[k].check(v)
        if problem:
            raise ValueError(f"{k}: {problem}")
        out[k] = tuple(v) if k in ("tree", "tree_nodes") else v
    if options.get("tree") is not None and options.get("tree_nodes") is not None:
        raise ValueError("tree, tree_nodes: give one (a static tree shape, or nodes per depth chosen by "
                         "probability), not both")
    return m, out
