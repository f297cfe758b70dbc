"""CUDA-graph decode steps: a cached forward's layers captured once per (model, cache, shape) and replayed.

A decode step of a small model on a GPU is bound by the host: SmolLM2-135M's 30 layers launch some 450
kernels, a few microseconds of Python and dispatch each, for a few hundred microseconds of device work.
After the prefill every buffer a step touches has a fixed address (the caches are allocated once,
their ``lengths`` and positions live on the device), and a forward reads no device value
(docs/engines.md, "Host synchronisation"), so the step can be captured and replayed.

What is captured: the embedding, RoPE and every decoder layer (their writes into the cache and the
attention over it), for one model, one cache object and one step shape (batch, tokens, tree or chain,
last-query selection). What stays eager, around each replay: ``cache.begin`` (the cache's host-side
decisions, such as a StreamingLLM cache's eviction, and the step's index tensors, which are copied into
the graph's own), the final norm and the head, and ``cache.end``. A StreamingLLM cache's eviction, in
``begin``, is some 50 small ops of device work at a fixed width on a GPU: it is replayed from a graph of
its own, one per cache (``replayed``). The first forward of a key runs eagerly
(it compiles and loads every kernel; its result is the step's), then the capture records it without
running it; later forwards copy their inputs into the captured buffers and replay. A replay gives the
eager forward's bits: the same kernels on the same inputs.

On by default on CUDA (``Llama.cuda_graphs = True``); ``model.cuda_graphs = False`` or the environment
variable ``TRIFORCE_CUDA_GRAPHS=0`` turns it off. A capture that fails turns it off for that model, with a
``RuntimeWarning`` (the step that tried it keeps its eager result). Not captured: CPU forwards (their layers run in one
native call already), the prefill's chunks, steps of over ``MAX_TOKENS`` tokens a row, forwards with a
draft head's tap, under autograd or ``torch.compile``, a mixture of experts' (Mixtral, Qwen3-MoE, GraniteMoE:
which experts run is read on the host), DeepSeek-V3.2's sparse attention (its keys' count is the cache's host-side
bound), Llama 4's chunked layers (a step's chunks read on the host). The graphs of a cache go with it (weak
references), and ``model.to(...)`` drops the model's.
"""
from __future__ import annotations

import os
import warnings
import weakref

import torch

from .cache import Step

MAX_TOKENS = 64  # tokens per row of the largest step captured (verification passes and trees; not prefill)


def enabled(model, cache, input_ids: torch.Tensor, tap) -> bool:
    """Whether this cached forward of ``model`` is replayed from a graph."""
    if tap is not None or torch.is_grad_enabled() or not _switched_on(model):
        return False
    if input_ids.shape[1] > MAX_TOKENS or input_ids.shape[1] > getattr(cache, "max_step", MAX_TOKENS):
        return False
    # a mixture of experts reads its routing on the host (triforce.models.llama.SparseMoE), DeepSeek-V3.2's sparse
    # attention sizes its choice by the cache's host-side bound (cache.indexed_attention), Llama 4's chunked layers
    # read which chunks a step spans (cache.chunked_attention): none is capturable
    c = model.config
    return (input_ids.device.type == "cuda" or _EMULATE) and c.experts is None and c.dsa is None \
        and not any(c.layer_chunks)


def _switched_on(owner) -> bool:
    """The switches every graph here obeys: ``owner.cuda_graphs``, ``TRIFORCE_CUDA_GRAPHS`` not ``0``, and not
    while ``torch.compile`` traces."""
    return (getattr(owner, "cuda_graphs", False) and os.environ.get("TRIFORCE_CUDA_GRAPHS", "1") != "0"
            and not torch.compiler.is_compiling())


# Tests on a machine without a GPU set this: "capture" then keeps the function and "replay" calls it on the
# captured buffers, so everything but the CUDA graph itself (the buffers, the keys, the engines' use) runs.
_EMULATE = False


class _Emulated:
    """A stand-in for ``torch.cuda.CUDAGraph`` (see ``_EMULATE``)."""

    def __init__(self, fn, out):
        self.fn, self.out = fn, out

    def replay(self):
        self.out.copy_(self.fn())


def _static(t):
    return None if t is None else t.clone()


class _StepGraph:
    """One captured forward body: its input ids and step tensors are fixed buffers, its output too."""

    def __init__(self, body, input_ids: torch.Tensor, step: Step, out: torch.Tensor):
        self.ids = input_ids.clone()
        self.step = Step(step.T, step.batch_index, _static(step.slots), _static(step.positions),
                         _static(step.seqlens), _static(step.counts), _static(step.tree_mask),
                         _static(step.query_index), _static(step.query_valid),
                         {w: _static(t) for w, t in step.leftpad.items()} if step.leftpad else None)
        if self.ids.device.type == "cuda":
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.out = body(self.ids, self.step)
        else:
            self.out = torch.empty_like(out)
            self.graph = _Emulated(lambda: body(self.ids, self.step), self.out)

    def run(self, input_ids: torch.Tensor, step: Step) -> torch.Tensor:
        s = self.step
        self.ids.copy_(input_ids)
        for name in ("slots", "positions", "seqlens", "counts", "tree_mask", "query_index", "query_valid"):
            mine = getattr(s, name)
            if mine is not None:
                mine.copy_(getattr(step, name))
        for w, mine in (s.leftpad or {}).items():  # (the same windows: part of the key)
            mine.copy_(step.leftpad[w])
        self.graph.replay()
        return self.out


def _key(input_ids: torch.Tensor, step: Step) -> tuple:
    return (tuple(input_ids.shape), input_ids.dtype, step.tree_mask is not None, step.query_index is not None,
            step.batch_index.data_ptr(), tuple(step.leftpad or ()))


def run(model, cache, input_ids: torch.Tensor, step: Step, body) -> torch.Tensor:
    """``body(input_ids, step)`` (the forward's layers, -> the residual stream), from the graph of this
    (model, cache, shape): captured after the first eager call, replayed from then on. The returned tensor
    is the graph's output buffer, overwritten by its next replay: use it before the next forward."""
    per_cache = _GRAPHS.setdefault(model, weakref.WeakKeyDictionary()).setdefault(cache, {})
    key = _key(input_ids, step)
    g = per_cache.get(key)
    if g is not None:
        return g.run(input_ids, step)
    out = body(input_ids, step)  # the eager first call: compiles and loads every kernel, and is this step
    try:
        per_cache[key] = _StepGraph(body, input_ids, step, out)
    except Exception as e:  # a capture this torch or driver refuses: eager from now on, and said once
        model.cuda_graphs = False
        warnings.warn(f"triforce: CUDA graphs turned off for this model, a capture failed "
                      f"({type(e).__name__}: {e}); its forwards run eagerly", RuntimeWarning, stacklevel=2)
    return out


def replayed(owner, key, fn) -> bool:
    """``fn(owner)``, device work on the owner's buffers of fixed address that reads no device value on the
    host (a StreamingLLM cache's eviction), from a CUDA graph of ``owner`` per ``key``: the first call runs it
    eagerly, then captures it (without running it again); later calls replay. -> whether this call was a
    replay: then ``fn``'s Python side did not run (it ran at the capture), and the caller redoes what it
    sets on the host. ``fn`` should not hold the owner (the graphs are kept per owner, weakly).

    Eager, with no graph, where the owner is not on a GPU (unless the tests' ``_EMULATE``), where
    ``owner.cuda_graphs`` is false or ``TRIFORCE_CUDA_GRAPHS=0``, under ``torch.compile`` and inside another
    capture (which records it). A capture that fails turns the owner's graphs off, with a ``RuntimeWarning``."""
    on_gpu = owner.device.type == "cuda"
    if not (on_gpu or _EMULATE) or not _switched_on(owner) or (on_gpu and torch.cuda.is_current_stream_capturing()):
        fn(owner)
        return False
    g = _OWNED.get(owner, {}).get(key)
    if g is not None:
        g.replay()
        return True
    fn(owner)
    try:
        if on_gpu:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                fn(owner)
        else:
            g = _EmulatedWork(owner, fn)
        _OWNED.setdefault(owner, {})[key] = g
    except Exception as e:
        owner.cuda_graphs = False
        warnings.warn(f"triforce: CUDA graphs turned off for this {type(owner).__name__}, a capture failed "
                      f"({type(e).__name__}: {e}); it runs eagerly", RuntimeWarning, stacklevel=2)
    return False


class _EmulatedWork:
    """A stand-in for the graph of ``replayed`` (see ``_EMULATE``): a replay runs ``fn``'s device work and
    undoes what it set on the owner's plain Python attributes (numbers, booleans), as a replayed graph
    would not run them."""

    def __init__(self, owner, fn):
        self.owner, self.fn = weakref.ref(owner), fn

    def replay(self):
        owner = self.owner()
        host = {k: v for k, v in vars(owner).items() if isinstance(v, (bool, int, float))}
        self.fn(owner)
        vars(owner).update(host)


def drop(model) -> None:
    """Forget every graph of ``model`` (its weights moved or were replaced)."""
    _GRAPHS.pop(model, None)


def forget(cache) -> None:
    """Forget every graph captured on ``cache``'s buffers: every model's step graphs and the cache's own
    (its rows left the batch: ``select_rows`` replaced or narrowed its buffers)."""
    for per_model in _GRAPHS.values():
        per_model.pop(cache, None)
    _OWNED.pop(cache, None)


def count(model) -> int:
    """Graphs ``model`` holds now (over every live cache)."""
    return sum(len(per_cache) for per_cache in _GRAPHS.get(model, {}).values())


# model -> cache -> shape key -> graph. Outside the model's __dict__, so that a copy of a model (copy.copy,
# deepcopy: the drafts made from a target) starts with no graphs instead of sharing or copying the target's.
_GRAPHS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
# owner (a cache) -> key -> graph of replayed(); outside the owner for the same reason (a deepcopy of a cache
# must not replay work on the original's buffers)
_OWNED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
