"""CUDA-graph decode steps (triforce/models/graphs.py).

Without a GPU the graph is emulated (its "capture" keeps the forward's body, its "replay" calls it on the
captured buffers): everything but the CUDA graph itself runs here, the buffers a replay reads (input ids,
the step's slots, positions, lengths, tree mask), the keys, the switches, and the engines' use of them.
With a GPU the same tests run on real graphs, and one more checks that a replay gives the eager bits.
"""
from __future__ import annotations

import pytest
import torch

import triforce
from triforce.models import FullCache, StreamingCache
from triforce.models import graphs
from tests.test_engines import TINY_CASES, ragged_prompts, tiny

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.fixture(autouse=True)
def emulate_without_gpu(monkeypatch):
    monkeypatch.setattr(graphs, "_EMULATE", DEV.type == "cpu")
    monkeypatch.delenv("TRIFORCE_CUDA_GRAPHS", raising=False)


@pytest.fixture
def replays(monkeypatch):
    """-> a list that records every replay (the shape of its input ids)."""
    seen, run = [], graphs._StepGraph.run

    def counted(self, input_ids, step):
        seen.append(tuple(input_ids.shape))
        return run(self, input_ids, step)
    monkeypatch.setattr(graphs._StepGraph, "run", counted)
    return seen


@pytest.fixture(scope="module")
def models():
    return tiny(0).to(DEV), tiny(1).to(DEV)


def _replays(model) -> int:
    return graphs.count(model)


@pytest.mark.parametrize("method,opts", TINY_CASES, ids=[f"{m}-{i}" for i, (m, _) in enumerate(TINY_CASES)])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_generate_with_graphs_equals_without(models, method, opts, temperature, replays):
    target, draft = models
    kw = dict(method=method, max_new_tokens=29, temperature=temperature, seed=5,
              draft=draft if method in ("speculative", "triforce") else None, **opts)
    try:
        target.cuda_graphs = draft.cuda_graphs = False
        ref = triforce.generate(target, ragged_prompts(DEV), **kw)
        assert not replays
        target.cuda_graphs = draft.cuda_graphs = True
        out = triforce.generate(target, ragged_prompts(DEV), **kw)
    finally:
        target.cuda_graphs = draft.cuda_graphs = True
    assert len(replays) > 10  # the engine's steps went through graphs
    for a, b in zip(out.tokens, ref.tokens):
        assert torch.equal(a, b), (a, b)


def test_a_replay_reads_its_new_inputs(models):
    """Two steps of one shape from different states: the second is a replay, and it gives the eager
    forward's logits for its own ids, positions, lengths and tree."""
    target, _ = models
    parents = [torch.tensor([[-1, 0, 0, 1]] * 2, device=DEV), torch.tensor([[-1, 0, 1, 1]] * 2, device=DEV)]
    results = {}
    for on in (False, True):
        target.cuda_graphs = on
        cache = FullCache(target.config, 2, 64, device=DEV)
        target.prefill([torch.arange(9, device=DEV), torch.arange(5, 17, device=DEV)], cache)
        out = []
        for i, par in enumerate(parents):
            ids = torch.tensor([[3 + i, 4, 5, 6], [7, 8 + i, 9, 10]], device=DEV)
            out.append(target(ids, cache=cache, tree_parents=par))
            cache.rollback(cache.lengths - 4 + 1 + i)  # keep 1 or 2 tokens: the next step starts elsewhere
        out.append(target(ids[:, :1], cache=cache))
        results[on] = out
        if on:
            assert _replays(target) == 2  # one graph per shape: the tree step and the one-token step
    target.cuda_graphs = True
    for a, b in zip(results[True], results[False]):
        assert torch.equal(a, b)


def test_streaming_cache_evicts_around_the_replays(models):
    """A StreamingLLM cache's eviction runs in begin(), outside the step's graph (on a GPU from a graph of
    its own); the steps replayed after it see the compacted cache."""
    target, _ = models
    results = {}
    for on in (False, True):
        target.cuda_graphs = on
        cache = StreamingCache(target.config, 1, sink=2, window=6, max_step=3, device=DEV)
        target.prefill([torch.arange(20, device=DEV)], cache)
        results[on] = [target(torch.tensor([[i % 64, (i * 7) % 64]], device=DEV), cache=cache) for i in range(9)]
    target.cuda_graphs = True
    for a, b in zip(results[True], results[False]):
        assert torch.equal(a, b)


@pytest.mark.parametrize("window", [3, 12], ids=["left-padding", "sorted"])
def test_a_windowed_streaming_step_replays_its_left_padding(window, monkeypatch, replays):
    """On a model whose every layer slides (W = 7), a StreamingLLM cache's steps from short prompts (3 and 5
    tokens) into the sinks' band and past it: each windowed layer's start (``step.leftpad``, 0 and then 2 as the
    window leaves the sinks behind) is a replay's input like the step's other tensors: replayed = eager,
    bitwise, with the shorter window (the sinks hidden) and the longer one (the sorted eviction)."""
    from triforce.models import Llama, LlamaConfig
    torch.manual_seed(0)
    cfg = LlamaConfig(model_type="mistral", vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      initializer_range=0.3, extra={"sliding_window": 7})
    model = Llama(cfg).eval().to(DEV)
    pads, leftpads = [], StreamingCache._leftpads

    def recorded(self, step):
        leftpads(self, step)
        if step.T == 2:
            pads.append(step.leftpad[7].tolist())
    monkeypatch.setattr(StreamingCache, "_leftpads", recorded)
    results = {}
    for on in (False, True):
        model.cuda_graphs = on
        cache = StreamingCache(cfg, 2, sink=2, window=window, max_step=2, device=DEV)
        model.prefill([torch.arange(3, device=DEV), torch.arange(4, 9, device=DEV)], cache)
        results[on] = [model(torch.tensor([[i % 64, (i * 7) % 64], [(i * 3) % 64, 5]], device=DEV), cache=cache)
                       for i in range(10)]
    assert pads[:10] == pads[10:] and pads[0] == [0, 0] and pads[9] == [2, 2] and len(set(map(tuple, pads))) >= 3, pads
    assert graphs.count(model) == 1 and len(replays) == 9  # the first step captures, the others replay
    for a, b in zip(results[True], results[False]):
        assert torch.equal(a, b)


@pytest.mark.parametrize("sink,window,max_step", [(2, 5, 3), (0, 3, 2), (3, 9, 4), (1, 1, 3)])
def test_a_streaming_eviction_replayed_from_its_graph_equals_eager(sink, window, max_step, monkeypatch):
    """A StreamingLLM cache's eviction (settle and the sinks' rotation, GPU path: a fixed width) replayed
    from its graph leaves the cache as the eager eviction does, bitwise, with the same host-side state,
    over random forwards, trees and rollbacks across evictions; a twin with graphs off is the reference."""
    from tests.test_cache import _random_streaming_twins
    from triforce.models import LlamaConfig
    from triforce.models.rope import rope_inv_freq
    cfg = LlamaConfig(vocab_size=11, hidden_size=24, intermediate_size=8, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    caches = [StreamingCache(cfg, 3, sink=sink, window=window, max_step=max_step, device=DEV) for _ in range(2)]
    for c in caches:
        c._read_width = False  # the GPU's path (on a GPU it is anyway)
    caches[0].cuda_graphs = False
    calls, real = [], graphs.replayed
    monkeypatch.setattr(graphs, "replayed", lambda owner, *a: calls.append((owner, real(owner, *a))) or calls[-1][1])
    _random_streaming_twins(caches, torch.Generator().manual_seed(sink * 7 + window), 3, 4, 2, 6, max_step,
                            rope_inv_freq(cfg, DEV), DEV)
    assert any(replay for owner, replay in calls if owner is caches[1])  # evictions were replayed
    assert not any(replay for owner, replay in calls if owner is caches[0])
    assert caches[0] not in graphs._OWNED and len(graphs._OWNED[caches[1]]) >= 1


def test_a_streaming_eviction_graph_switches_and_a_failed_capture(monkeypatch):
    target = tiny(0).to(DEV)
    target.cuda_graphs = False  # the model's steps eager: only the cache's eviction graph here

    def run(cache):
        target.prefill([torch.arange(20, device=DEV)], cache)
        return [target(torch.tensor([[i % 64]], device=DEV), cache=cache) for i in range(4)]

    def cache():
        c = StreamingCache(target.config, 1, sink=2, window=6, max_step=3, device=DEV)
        c._read_width = False
        return c
    ref = run(cache())
    monkeypatch.setenv("TRIFORCE_CUDA_GRAPHS", "0")
    off = cache()
    assert all(torch.equal(a, b) for a, b in zip(run(off), ref)) and off not in graphs._OWNED
    monkeypatch.delenv("TRIFORCE_CUDA_GRAPHS")
    on = cache()
    assert all(torch.equal(a, b) for a, b in zip(run(on), ref)) and len(graphs._OWNED[on]) == 1
    if DEV.type == "cuda":
        monkeypatch.setattr(torch.cuda, "CUDAGraph", lambda: (_ for _ in ()).throw(RuntimeError("refused")))
    else:
        monkeypatch.setattr(graphs, "_EmulatedWork", lambda *a: (_ for _ in ()).throw(RuntimeError("refused")))
    refused = cache()
    with pytest.warns(RuntimeWarning, match="CUDA graphs turned off for this StreamingCache.*refused"):
        out = run(refused)
    assert refused.cuda_graphs is False and refused not in graphs._OWNED and StreamingCache.cuda_graphs is True
    assert all(torch.equal(a, b) for a, b in zip(out, ref))


def test_switches_and_what_is_not_captured(models, monkeypatch):
    target, _ = models
    cache = FullCache(target.config, 1, 200, device=DEV)
    target.prefill([torch.arange(10, device=DEV)], cache)
    graphs.drop(target)
    monkeypatch.setenv("TRIFORCE_CUDA_GRAPHS", "0")
    target(torch.tensor([[1]], device=DEV), cache=cache)
    assert _replays(target) == 0
    monkeypatch.delenv("TRIFORCE_CUDA_GRAPHS")
    target(torch.tensor([[1] * (graphs.MAX_TOKENS + 1)], device=DEV), cache=cache)  # prefill-sized
    target.prefill([torch.arange(30, device=DEV)], cache)  # the prefill's chunks
    assert _replays(target) == 0
    target(torch.tensor([[1]], device=DEV), cache=cache)
    assert _replays(target) == 1
    target.to(DEV)  # moving the model drops its graphs (their weights' addresses)
    assert _replays(target) == 0


def test_a_failed_capture_turns_graphs_off_and_says_so(models, monkeypatch, replays):
    target, draft = models
    kw = dict(method="speculative", max_new_tokens=9, draft=draft, gamma=2)
    ref_model = tiny(0).to(DEV)
    ref_model.cuda_graphs = draft.cuda_graphs = False
    ref = triforce.generate(ref_model, ragged_prompts(DEV), **kw)
    draft.cuda_graphs = True

    class Refused(graphs._StepGraph):
        def __init__(self, *a):
            raise RuntimeError("operation not permitted when stream is capturing")
    monkeypatch.setattr(graphs, "_StepGraph", Refused)
    try:
        with pytest.warns(RuntimeWarning, match="CUDA graphs turned off for this model.*stream is capturing"):
            out = triforce.generate(target, ragged_prompts(DEV), **kw)
        assert target.cuda_graphs is False and draft.cuda_graphs is False and not replays
    finally:
        target.cuda_graphs = draft.cuda_graphs = True
    for a, b in zip(out.tokens, ref.tokens):
        assert torch.equal(a, b)


def test_a_copy_of_a_model_has_its_own_graphs(models):
    """A draft made by copying the target (copy.copy: the int8 copy; deepcopy: the bfloat16 copy) and run on
    the target's cache with the same shape replays its own graph, never the target's."""
    import copy

    target, _ = models
    graphs.drop(target)
    cache = FullCache(target.config, 1, 64, device=DEV)
    target.prefill([torch.arange(10, device=DEV)], cache)
    base = cache.lengths.clone()
    ids = torch.tensor([[3]], device=DEV)
    for _ in range(2):
        target(ids, cache=cache)
        cache.rollback(base)
    assert graphs.count(target) == 1
    for clone in (copy.copy(target), copy.deepcopy(target)):
        assert graphs.count(clone) == 0
        clone._modules = dict(clone._modules)  # as int8_copy does: the clone's own module dicts
        clone.model = copy.copy(target.model)
        clone.model._modules = dict(target.model._modules)
        clone.model.layers = torch.nn.ModuleList(list(target.model.layers)[:1])  # other layers than the target's
        clone.cuda_graphs = False
        eager = clone(ids, cache=cache)
        cache.rollback(base)
        clone.cuda_graphs = True
        for _ in range(2):
            assert torch.equal(clone(ids, cache=cache), eager)
            cache.rollback(base)
        assert graphs.count(clone) == 1 and graphs.count(target) == 1
        assert len(target.model.layers) == 2 and not torch.equal(target(ids, cache=cache), eager)
        cache.rollback(base)


def test_a_model_with_graphs_is_collected():
    import gc
    import weakref

    model = tiny(2).to(DEV)
    cache = FullCache(model.config, 1, 64, device=DEV)
    model.prefill([torch.arange(10, device=DEV)], cache)
    model(torch.tensor([[1]], device=DEV), cache=cache)
    assert graphs.count(model) == 1
    ref = weakref.ref(model)
    del model
    gc.collect()
    assert ref() is None


def test_a_cache_takes_its_graphs_along(models):
    import gc

    target, _ = models
    graphs.drop(target)
    cache = FullCache(target.config, 1, 64, device=DEV)
    target.prefill([torch.arange(10, device=DEV)], cache)
    target(torch.tensor([[1]], device=DEV), cache=cache)
    assert _replays(target) == 1
    del cache
    gc.collect()
    assert _replays(target) == 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_real_cuda_graph_replays_the_eager_bits(models):
    target, _ = models
    graphs.drop(target)
    cache = FullCache(target.config, 2, 64, device=DEV)
    target.prefill([torch.arange(9, device=DEV), torch.arange(3, 20, device=DEV)], cache)
    base = cache.lengths.clone()
    ids = torch.tensor([[5, 6, 7], [8, 9, 10]], device=DEV)
    target.cuda_graphs = False
    eager = target(ids, cache=cache)
    cache.rollback(base)
    target.cuda_graphs = True
    first = target(ids, cache=cache)  # eager, then captured
    cache.rollback(base)
    replayed = target(ids, cache=cache)
    (g,) = next(iter(graphs._GRAPHS[target].values())).values()
    assert isinstance(g.graph, torch.cuda.CUDAGraph)
    assert torch.equal(first, eager) and torch.equal(replayed, eager)
