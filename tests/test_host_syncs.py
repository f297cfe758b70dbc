"""Host synchronisations of the decoding engines and the model layer, counted on a CPU.

On a GPU every read of a device value, every upload of host data and every value-dependent op stalls
the host until the device has caught up, and a forward that does one cannot be captured in a CUDA
graph. On a CPU they cost nothing, so a regression would go unseen until a GPU run; ``HostSyncs``
(tests/host_sync.py) records them here. The budget (docs/engines.md, "Host synchronisation"):

* one read per step, in ``Decode.loop`` (whether any row is still active; it also brings the full
  caches' longest row, so their capacity checks read nothing);
* a retrieval cache: one read per full-level verification, in ``RetrievalCache.sync``;
* TriForce's middle level: one read per gamma1-block after the first ``ceil(gamma2 / (gamma1 + 1))``
  blocks (which every active row needs), the last one bringing the longest row's count along;
* a static tree: one upload per run (``TokenTree.static``), nothing per step;
* prompt lookup: one read per proposal, its pass's width (``LookupDrafter.propose``: per step; as TriForce's
  bottom level, per middle block);
* nothing else: no read in any forward, no upload, no value-dependent op, sampling and greedy.

Finished rows stay in the batch, as on a GPU (``TRIFORCE_COMPACT_ROWS=0``); when they leave it (the CPU's
default), the reads that takes come only as they leave (``test_host_syncs_when_rows_leave``). Ragged chains are
verified padded, as on a GPU (``TRIFORCE_RAGGED_PASSES=0``); a ragged step on a GPU adds no sync
(``test_host_syncs_of_ragged_passes``).
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import triforce
from triforce.engines import steps
from triforce.engines.decode import Decode
from triforce.models import FullCache, Llama, LlamaConfig, StreamingCache, TokenTree
from triforce.models import cache as cache_module
from tests.host_sync import HostSyncs
from tests.test_engines import TINY_CASES, tiny
from tests.test_heads import random_heads
from tests.test_heads import tiny as tiny4


@pytest.fixture
def gpu_paths(monkeypatch):
    """A StreamingCache reads its eviction width on a CPU only (reading is free there); on a GPU it moves
    a fixed width. The model layer's value checks (token ids in range, rollback and commit_path counts)
    run on a CPU only. Take the GPU's paths."""
    monkeypatch.setattr(cache_module, "check_values", lambda t: False)
    init = StreamingCache.__init__

    def gpu_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self._read_width = False

    monkeypatch.setattr(StreamingCache, "__init__", gpu_init)


@pytest.fixture
def audit(monkeypatch, gpu_paths):
    """Records the host syncs of the decode loop (every step; not the prefill, not the final statistics), with
    finished rows kept in the batch and ragged chains verified padded (a GPU's defaults)."""
    monkeypatch.setenv("TRIFORCE_COMPACT_ROWS", "0")
    monkeypatch.setenv("TRIFORCE_RAGGED_PASSES", "0")
    syncs = HostSyncs()
    loop, finish = Decode.loop, Decode.finish

    def audited_loop(self, step):
        with syncs:
            return loop(self, step)

    def unaudited_finish(self, *args):
        with syncs.paused():
            return finish(self, *args)

    monkeypatch.setattr(Decode, "loop", audited_loop)
    monkeypatch.setattr(Decode, "finish", unaudited_finish)
    return syncs


def _check_budget(syncs: HostSyncs, stats: dict, *, retrieval: bool = False, middle: tuple | None = None,
                  static_trees: int = 0, lookup: bool = False, extra: dict | None = None) -> None:
    passes = stats["target_passes"]
    found = syncs.by_function()
    expected = {"Decode.loop": passes + 1, **(extra or {})}  # the last read finds no active row
    if lookup:  # one read per proposal: per step (speculative), per middle block (triforce: <= gamma2 a step)
        reads = found.pop("LookupDrafter.propose", 0) + found.pop("LookupDrafter.propose_tree", 0)
        most = middle[1] if middle is not None else 1
        assert passes <= reads <= passes * most, (reads, passes, syncs.report())
    if retrieval:
        expected["RetrievalCache.sync"] = passes
    if static_trees:
        expected["TokenTree.static"] = static_trees
    if middle is not None:
        gamma1, gamma2 = middle
        reads = found.pop("RetrievalLevel.propose", 0)
        most = gamma2 - math.ceil(gamma2 / (gamma1 + 1)) + 1  # per step: blocks <= gamma2
        assert passes <= reads <= passes * most, (reads, passes, most, syncs.report())
    assert dict(found) == expected, f"expected {expected}, found:\n{syncs.report()}"


PROMPT_LENGTHS = (17, 30, 23, 41)


def _prompts(vocab=64):
    g = torch.Generator().manual_seed(3)
    return [torch.randint(0, vocab, (n,), generator=g) for n in PROMPT_LENGTHS]


@pytest.fixture(scope="module")
def models():
    return tiny(0), tiny(1)


@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampling"])
@pytest.mark.parametrize("method,opts", [("autoregressive", {})] + TINY_CASES,
                         ids=["autoregressive"] + [f"{m}-{i}" for i, (m, _) in enumerate(TINY_CASES)])
def test_engine_host_syncs(audit, models, method, opts, temperature):
    target, draft = models
    out = triforce.generate(target, _prompts(), method=method, max_new_tokens=24, temperature=temperature, seed=1,
                            draft=draft if method in ("speculative", "triforce") else None, **opts)
    _check_budget(audit, out.stats,
                  retrieval=method == "triforce" or opts.get("draft_cache") == "retrieval",
                  middle=(opts["gamma1"], opts["gamma2"]) if method == "triforce" else None,
                  static_trees=int(method == "tree"))


@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampling"])
@pytest.mark.parametrize("method", ["speculative", "triforce", "tree"])
def test_lookup_host_syncs(audit, models, method, temperature):
    from tests.test_lookup import repetitive_prompts

    opts = {"speculative": {"gamma": 4}, "tree": {"tree": (3, 2, 1, 1)},
            "triforce": {"gamma1": 2, "gamma2": 5, "budget": 12, "chunk_size": 4}}[method]
    out = triforce.generate(models[0], repetitive_prompts(), method=method, draft="lookup", max_new_tokens=24,
                            temperature=temperature, seed=1, **opts)
    if temperature == 0:  # drafts were proposed (and some accepted)
        assert out.stats["acceptance"]["lookup->retrieval" if method == "triforce" else "lookup->full"] > 0
    triforce_ = method == "triforce"
    _check_budget(audit, out.stats, lookup=True, retrieval=triforce_, middle=(2, 5) if triforce_ else None)


@pytest.mark.parametrize("method,opts", [("autoregressive", {})] + TINY_CASES,
                         ids=["autoregressive"] + [f"{m}-{i}" for i, (m, _) in enumerate(TINY_CASES)])
def test_host_syncs_when_rows_leave(audit, monkeypatch, models, method, opts):
    """With finished rows leaving the batch (``TRIFORCE_COMPACT_ROWS=1``, the GPU's opt-in), each time some
    leave: one read of which (``Decode.select_rows``) and the upload of their order, one
    read of that order per cache (``_check_rows``: its moves are planned on the host), and a static tree
    built again for the smaller batch. Nothing in the steps between."""
    from tests.test_engines import ragged_prompts

    monkeypatch.setenv("TRIFORCE_COMPACT_ROWS", "1")
    target, draft = models
    prompts = ragged_prompts()
    draft = draft if method in ("speculative", "triforce") else None
    with audit.paused():
        free = triforce.generate(target, prompts, method="autoregressive", max_new_tokens=24)
        eos = int(free.tokens[0][1])  # row 0 stops at its second new token (or its first)
        ref = triforce.generate(target, prompts, method="autoregressive", max_new_tokens=24, eos_token_id=eos)
    events, caches, select = [], [], Decode.select_rows

    def counted(self, active):
        events.append(1)
        caches.append(sum(isinstance(h, cache_module._KVCache) for h in self.holders))
        return select(self, active)

    monkeypatch.setattr(Decode, "select_rows", counted)
    out = triforce.generate(target, prompts, method=method, max_new_tokens=24, eos_token_id=eos, draft=draft, **opts)
    assert [t.tolist() for t in out.tokens] == [t.tolist() for t in ref.tokens]
    assert events, "no row left the batch"
    _check_budget(audit, out.stats,
                  retrieval=method == "triforce" or opts.get("draft_cache") == "retrieval",
                  middle=(opts["gamma1"], opts["gamma2"]) if method == "triforce" else None,
                  static_trees=int(method == "tree") * (1 + len(events)),
                  extra={"Decode.select_rows": 2 * len(events), "_check_rows": sum(caches)})


@pytest.fixture(scope="module")
def heads_model():
    return tiny4()


@pytest.mark.parametrize("kind", ["medusa", "mlp", "hidden_transfer", "early_exit"])
@pytest.mark.parametrize("config", ["tree", "tree_nodes", "triforce"])
def test_heads_host_syncs(audit, heads_model, kind, config):
    heads = random_heads(heads_model, kind)
    opts = {"tree": {"method": "tree", "tree": (2, 2, 1)},
            "tree_nodes": {"method": "tree", "tree_nodes": (2, 2, 2)},
            "triforce": {"method": "triforce", "gamma1": 2, "gamma2": 4, "budget": 12, "chunk_size": 4}}[config]
    temperature = 1.0 if kind in ("mlp", "hidden_transfer") else 0.0  # both on the stage / tap paths
    out = triforce.generate(heads_model, _prompts(), max_new_tokens=24, draft=heads, temperature=temperature,
                            seed=2, **opts)
    # heads draft the root alone on the first step ([-1]), then the static shape
    _check_budget(audit, out.stats, retrieval=config == "triforce",
                  middle=(2, 4) if config == "triforce" else None,
                  static_trees={"tree": 2, "tree_nodes": 1, "triforce": 0}[config])


def test_the_audit_sees_each_kind_of_sync():
    """The detector itself: each kind of operation that syncs on a GPU is recorded (reads, uploads,
    value-dependent ops), and device-side work is not."""
    x = torch.arange(6.0)
    cases = {
        "read (item)": lambda: x.sum().item(),
        "read (tolist)": lambda: x.tolist(),
        "read (__bool__)": lambda: bool(x.any()),
        "read (__int__)": lambda: int(x.max()),
        "upload": lambda: torch.tensor([1, 2, 3]),
        "nonzero": lambda: x.nonzero(),
        "boolean-mask indexing": lambda: x[x > 2],
        "multinomial": lambda: torch.multinomial(x + 1, 1),
        "fill_ from a tensor": lambda: x.clone().fill_(x[0]),
    }
    for kind, fn in cases.items():
        with HostSyncs() as syncs:
            fn()
        assert [k for k, _ in syncs.events] == [kind], (kind, syncs.events)
    with HostSyncs() as syncs:  # device work only
        y = torch.where(x > 2, x, 0.0).cumsum(0)
        torch.searchsorted(y, y[:2].contiguous())
        x.clone()[1:3] = y[:2]
    assert syncs.events == [], syncs.report()


# ---- the sampler: draws without a host sync, exactly from the weights


def test_draw_distribution_and_zero_weights():
    V, N = 12, 60000
    w = torch.tensor([0, 3, 0, 0, 1, 5, 0.5, 0, 0, 2, 0, 0], dtype=torch.float32)
    g = torch.Generator().manual_seed(0)
    with HostSyncs() as syncs:
        d = steps.draw(w.expand(N // 4, V), 4, g)
    assert syncs.events == [], syncs.report()
    assert d.shape == (N // 4, 4) and d.dtype == torch.int64
    counts = np.bincount(d.flatten().numpy(), minlength=V)
    assert counts[(w == 0).numpy()].sum() == 0  # never a zero-weight token
    from tests.test_engines_sampling import chi2_pvalue

    p = (w / w.sum()).double().numpy()
    assert chi2_pvalue(counts[p > 0], p[p > 0]) > 1e-3


def _uniforms(monkeypatch, u: torch.Tensor) -> None:
    monkeypatch.setattr(torch, "rand", lambda *a, **k: u)


@pytest.mark.parametrize("V", [7, 1024, 2 * 1024 + 300])
@pytest.mark.parametrize("scale", [1e-30, 1.0, 1e30])
def test_draw_at_the_edges_of_the_uniforms(monkeypatch, V, scale):
    """u = 0 draws the first token of positive weight, u -> 1 the last one (never past it, never a
    zero-weight token), whatever the weights' total, with zero weights (whole zero blocks) around them."""
    first, last = (2, 5) if V == 7 else (V // 2 - 3, V - 2)
    w = torch.zeros(1, V)
    w[0, first], w[0, last], w[0, (first + last) // 2] = 2.0 * scale, 3.0 * scale, 1.0 * scale
    for u, token in ((0.0, first), (1.0 - 2.0 ** -53, last), (1.0, last)):  # 1.0: out of rand's range, still safe
        _uniforms(monkeypatch, torch.full((1, 1), u, dtype=torch.float64))
        assert steps.draw(w, 1).item() == token, (u, scale)


@pytest.mark.parametrize("offset", [0, 1024])
def test_draw_when_a_block_sum_rounds_above_its_cumulative_sum(monkeypatch, offset):
    """Weights spanning 1e-30 .. 1e30: a block's float64 sum (pairwise) can exceed the last entry of its
    float64 cumulative sum (sequential) by an ulp, so a uniform near the block's top lands past the
    block's cdf; the draw must still be a token of that block with positive weight."""
    g = torch.Generator().manual_seed(0)
    for _ in range(1000):
        w = (torch.rand(32, generator=g, dtype=torch.float64)
             * 10.0 ** torch.randint(-30, 30, (32,), generator=g)).float()
        top = w.cumsum(0, dtype=torch.float64)[-1]
        # ... and the last weight is not negligible next to the total (it must count past the row's end)
        if w.sum(dtype=torch.float64) > top and top + w[-1].double() > top:
            break
    else:
        pytest.fail("no weights found whose sum rounds above their cumulative sum")
    row = torch.zeros(1, offset + 32)
    row[0, offset:] = w
    _uniforms(monkeypatch, torch.full((1, 1), 1.0 - 2.0 ** -53, dtype=torch.float64))
    token = steps.draw(row, 1).item()
    assert offset <= token < offset + 32 and row[0, token] > 0, token


@pytest.mark.parametrize("V", [1, 5, 1023, 1024, 1025, 3000, 49152])
def test_draw_equals_the_one_level_inverse_cdf(monkeypatch, V):
    """The two-level search picks, for every uniform, the token a single float64 inverse CDF over the
    whole row picks: the first whose cumulative weight exceeds u * total."""
    g = torch.Generator().manual_seed(V)
    B, num = 6, 5
    w = torch.rand(B, V, generator=g) ** 8  # mostly tiny weights
    w[w < 0.05] = 0.0                        # zero runs, whole zero blocks
    w[1, : V // 2] = 0.0
    w[2] *= 1e-20
    w[3] *= 1e20
    w[4, : max(V - 3, 1)] = 0.0               # weight in the last tokens only
    u = torch.rand(B, num, dtype=torch.float64, generator=g)
    _uniforms(monkeypatch, u)
    got = steps.draw(w, num)
    cdf = w.double().cumsum(-1)
    expected = torch.searchsorted(cdf, u * cdf[:, -1:], right=True)
    live = cdf[:, -1] > 0
    assert torch.equal(got[live], expected[live])
    assert (w[live].gather(1, got[live]) > 0).all()


def test_sampling_sample_uses_the_cleaned_weights():
    """NaN / negative probabilities weigh 0, and a row with no weight left is drawn uniformly."""
    from tests.test_engines_sampling import chi2_pvalue

    s = steps.Sampling(1.0, None, None, torch.Generator().manual_seed(1))
    logits = torch.tensor([[0.0, float("-inf"), 0.0, float("-inf")]] * 2000)
    tokens, probs = s.sample(logits, 2)
    assert set(tokens.unique().tolist()) == {0, 2}
    assert torch.equal(probs[0], torch.tensor([0.5, 0.0, 0.5, 0.0]))
    w = steps._drawable(torch.tensor([[float("nan"), -1.0, 0.0, 2.0]] + [[float("nan"), -1.0, 0.0, -0.0]] * 8000))
    assert torch.equal(w[0], torch.tensor([0.0, 0.0, 0.0, 2.0]))
    d = steps.draw(w, 3, torch.Generator().manual_seed(2))
    assert (d[0] == 3).all()
    assert chi2_pvalue(np.bincount(d[1:].flatten().numpy(), minlength=4), np.full(4, 0.25)) > 1e-3


# ---- TokenTree: mask and depths built once, no read per forward


def _random_parents(g, B, T):
    return torch.stack([torch.tensor([-1] + [int(torch.randint(0, t, (1,), generator=g)) for t in range(1, T)])
                        for _ in range(B)])


def test_token_tree_matches_the_checked_helpers():
    import triforce_kernels as tk

    g = torch.Generator().manual_seed(0)
    for T in (1, 2, 5, 9, 17):
        parents = _random_parents(g, 3, T)
        tree = TokenTree(parents)
        assert torch.equal(tree.mask, tk.tree_attention_mask(parents))
        assert torch.equal(tree.depths, tk.tree_depths(parents).long())
        for n in range(1, T + 1):
            assert torch.equal(tree.prefix(n).mask, tk.tree_attention_mask(parents[:, :n]))
            assert tree.prefix(n).mask.is_contiguous()
        row = parents[0].tolist()
        static = TokenTree.static(row, 4)
        assert torch.equal(static.mask, tk.tree_attention_mask(parents[:1].expand(4, T)))
        assert torch.equal(static.parents, parents[:1].expand(4, T))
        assert static.prefix(max(T - 1, 1)) is static.prefix(max(T - 1, 1))  # built once


@pytest.mark.parametrize("row", [[], [0], [-1, 1], [-1, 0, 3], [-1, -1], [-1, 0.0], [-1, True]])
def test_token_tree_static_rejects_a_non_tree(row):
    with pytest.raises(ValueError, match="parents_row"):
        TokenTree.static(row, 2)


def test_token_tree_checks_a_tensor():
    with pytest.raises(ValueError, match="topological"):
        TokenTree(torch.tensor([[-1, 0, 2]]))
    with pytest.raises(ValueError, match="prefix"):
        TokenTree.static([-1, 0], 1).prefix(3)


def _cfg():
    return LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)


@pytest.mark.parametrize("cache_kind", ["full", "streaming"])
def test_tree_forward_with_a_token_tree(gpu_paths, cache_kind):
    """A forward given a TokenTree equals one given the parents tensor (bit for bit), and reads nothing:
    the tensor costs one read per forward (its check)."""
    torch.manual_seed(0)
    model = Llama(_cfg()).eval()
    B, row = 3, [-1, 0, 0, 1, 1, 2, 4]
    T = len(row)

    def make():
        c = FullCache(model.config, B, 64) if cache_kind == "full" else StreamingCache(model.config, B, 2, 8, T)
        model.prefill([torch.arange(n) for n in (5, 11, 9)], c)
        return c

    ids = torch.randint(0, 64, (B, T), generator=torch.Generator().manual_seed(1))
    tree = TokenTree.static(row, B)
    out = {}
    for name, parents in (("tensor", torch.tensor(row).expand(B, T)), ("tree", tree)):
        cache = make()
        with torch.inference_mode(), HostSyncs() as syncs:
            out[name] = torch.cat([model(ids, cache=cache, tree_parents=parents) for _ in range(3)], 1)
        reads = [k for k, _ in syncs.events]
        assert reads == ([] if name == "tree" else ["read (item)"] * 3), syncs.report()
    assert torch.equal(out["tensor"], out["tree"])
    with pytest.raises(ValueError, match="TokenTree"):
        model(ids[:, :3], cache=make(), tree_parents=tree)


def test_forwards_on_meta_tensors_read_nothing():
    """Every forward an engine step makes -- chain and tree, on a full and a StreamingLLM cache, across
    evictions, rollbacks and a tree commit -- runs on meta tensors, which have no values: a read of one
    would raise. (The forward a CUDA graph would capture.)"""
    meta = torch.device("meta")
    model = Llama(_cfg(), _empty=True).eval()  # meta weights
    model.inv_freq = torch.empty(model.config.head_dim // 2, device=meta)
    B = 3
    tree = TokenTree.static([-1, 0, 0, 1, 2], B, meta)
    with torch.inference_mode(), HostSyncs() as syncs:
        for cache in (FullCache(model.config, B, 128, device=meta, chunk_size=4),
                      StreamingCache(model.config, B, 2, 8, 5, device=meta)):
            ids = torch.zeros(B, 5, dtype=torch.int64, device=meta)
            for _ in range(4):
                model(ids[:, :1], cache=cache)
                model(ids, cache=cache)
                model(ids, cache=cache, tree_parents=tree)
                model(ids[:, :3], cache=cache, tree_parents=tree.prefix(3))
                lengths = torch.zeros(B, dtype=torch.int32, device=meta)
                cache.commit_path(lengths, torch.zeros(B, 3, dtype=torch.int64, device=meta), lengths)
                cache.rollback(lengths)
    assert syncs.events == [], syncs.report()


@pytest.mark.parametrize("method", ["speculative", "triforce", "tree"])
def test_host_syncs_of_ragged_passes(audit, monkeypatch, models, method):
    """Ragged chains (and prompt lookup's trees) verified as ragged steps (``TRIFORCE_RAGGED_PASSES=1``, the GPU's
    opt-in) the way a GPU runs them (``_packs_rows`` false: the padding computed, its logits zeroed): no sync
    besides the check of the
    widths' range, which runs on CPU tensors only (one read per ragged pass here, none on a GPU). On the CPU
    the packing's ``nonzero`` adds one per pass (its index of the real tokens)."""
    from tests.test_lookup import repetitive_prompts
    from triforce.models import llama as llama_mod

    monkeypatch.setenv("TRIFORCE_RAGGED_PASSES", "1")
    monkeypatch.setattr(llama_mod, "_packs_rows", lambda device: False)
    calls, ragged = [], llama_mod.Llama._ragged

    def counted(self, *args):
        calls.append(1)
        return ragged(self, *args)

    monkeypatch.setattr(llama_mod.Llama, "_ragged", counted)
    opts = {"speculative": {"gamma": 4}, "tree": {"tree": (3, 2, 1, 1)},
            "triforce": {"gamma1": 2, "gamma2": 5, "budget": 12, "chunk_size": 4}}[method]
    out = triforce.generate(models[0], repetitive_prompts(), method=method, draft="lookup", max_new_tokens=24,
                            **opts)
    assert calls
    triforce_ = method == "triforce"
    _check_budget(audit, out.stats, lookup=True, retrieval=triforce_, middle=(2, 5) if triforce_ else None,
                  extra={"Llama._check_forward": len(calls)})
