"""Robustness of the engines: every method over random batches (ragged and identical prompts), random
option values, greedy and sampled, with and without EOS, on tiny random models (some with LongRoPE): no exception, and
greedy output equal to autoregressive token for token. Plus end of sequence, option validation at
the boundary, the NaN argmax rule, the context limit and the retrieval cache's capacity invariant."""
import functools

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import triforce
from triforce.engines.tree import tree_parents
from triforce.models import Llama, LlamaConfig
from triforce.models.quant import int8_copy


@functools.lru_cache(maxsize=None)
def tiny(seed: int, vocab: int, layers: int = 2, ctx: int = 1024, longrope: int | None = None) -> Llama:
    """``longrope``: LongRoPE over that original context (head_dim 8: four pairs)."""
    torch.manual_seed(seed)
    rope = None if longrope is None else {"rope_type": "longrope", "short_factor": [1.0, 1.5, 2.0, 3.0],
                                          "long_factor": [2.0, 4.0, 8.0, 16.0],
                                          "original_max_position_embeddings": longrope}
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=ctx,
                      initializer_range=0.3, rope_scaling=rope)
    return Llama(cfg).eval()


@st.composite
def cases(draw):
    """(method, options, use a separate draft model) valid by construction for prompts >= min_len."""
    method = draw(st.sampled_from(["speculative", "magicdec", "triforce", "tree"]))
    chunk = draw(st.integers(1, 6))
    retrieval = {"chunk_size": chunk, "budget": draw(st.integers(3 * chunk, 8 * chunk)),
                 "rebuild_stride": draw(st.integers(1, 40)), "recent": draw(st.integers(0, 40))}
    sink = draw(st.integers(0, 4))
    separate = draw(st.booleans())
    if method == "speculative":
        opts, min_len = {"gamma": draw(st.integers(1, 6))}, 2
        if not separate:
            opts["draft_layers"] = 1
    elif method == "magicdec":
        gamma = draw(st.integers(1, 5))
        if draw(st.booleans()):
            # separate: the target's int8 copy drafts on its retrieval cache (the only draft it takes)
            opts, min_len = {"gamma": gamma, "draft_cache": "retrieval", **retrieval}, retrieval["budget"]
        else:
            opts = {"gamma": gamma, "sink": sink, "window": gamma + 2 + draw(st.integers(0, 10))}
            min_len = 2
    elif method == "triforce":
        g1, g2 = draw(st.integers(1, 4)), draw(st.integers(1, 8))
        opts = {"gamma1": g1, "gamma2": g2, "sink": sink, "window": g1 + g2 + max(3, g1) + draw(st.integers(0, 10)),
                **retrieval}
        min_len = max(3, retrieval["budget"])
    else:
        shape = tuple(draw(st.lists(st.integers(1, 3), min_size=1, max_size=3)))
        nodes = len(tree_parents(shape))
        opts = {"tree": shape, "sink": sink, "window": len(shape) + 2 + nodes + draw(st.integers(0, 8))}
        min_len, separate = len(shape) + 2, separate
    return method, opts, separate, min_len


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=cases(), data=st.data())
def test_every_method_random_batches_and_options(case, data):
    method, opts, separate, min_len = case
    vocab = data.draw(st.sampled_from([16, 64]), label="vocab")
    # LongRoPE over a short original context: rows of one batch on either factor set
    longrope = data.draw(st.sampled_from([None, None, 24, 48]), label="longrope")
    target = tiny(0, vocab, longrope=longrope)
    draft = None
    if separate:
        draft = int8_copy(target) if opts.get("draft_cache") == "retrieval" else tiny(1, vocab, layers=1,
                                                                                      longrope=longrope)
    B = data.draw(st.integers(1, 5), label="batch")
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2 ** 16), label="seed"))
    if data.draw(st.booleans(), label="identical"):
        n = data.draw(st.integers(min_len, min_len + 30), label="len")
        prompts = [torch.randint(0, vocab, (n,), generator=g)] * B
    else:
        lens = data.draw(st.lists(st.integers(min_len, min_len + 30), min_size=B, max_size=B), label="lens")
        prompts = [torch.randint(0, vocab, (n,), generator=g) for n in lens]
    generate_and_check(data, target, prompts, vocab, method=method, draft=draft, **opts)


def generate_and_check(data, target, prompts, vocab, **method_args):
    """Draw the decoding settings (new tokens, temperature, top-p, EOS), generate with ``method_args``, check the
    output's shape and ids, and, greedy, that it equals autoregressive decoding's."""
    B = len(prompts)
    max_new = data.draw(st.integers(1, 40), label="max_new")
    temperature = data.draw(st.sampled_from([0.0, 0.0, 1.0, 0.7]), label="temperature")
    top_p = data.draw(st.sampled_from([None, 0.9]), label="top_p") if temperature else None
    eos = data.draw(st.sampled_from([None, 3, [5, 7]]), label="eos")
    kw = dict(max_new_tokens=max_new, temperature=temperature, top_p=top_p, seed=5, eos_token_id=eos)
    out = triforce.generate(target, prompts, **method_args, **kw)
    assert len(out.tokens) == B
    for b in range(B):
        t = out.tokens[b]
        assert t.shape == (max_new,) and t.dtype == torch.int64
        assert 1 <= out.lengths[b] <= max_new
        assert bool(((t >= 0) & (t < vocab)).all())
    if temperature == 0:
        ref = triforce.generate(target, prompts, method="autoregressive", **kw)
        assert out.lengths == ref.lengths
        for b in range(B):
            assert torch.equal(out.tokens[b], ref.tokens[b]), (b, out.tokens[b], ref.tokens[b])


@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_prompt_lookup_random_batches_and_options(data):
    """Prompt lookup (draft="lookup") for speculative and as TriForce's bottom level: random batches (ragged,
    identical, or repeating a phrase of their own so that lookups hit), options, EOS, sampling with top-p; greedy
    output equals autoregressive decoding's."""
    method = data.draw(st.sampled_from(["speculative", "triforce"]), label="method")
    vocab = data.draw(st.sampled_from([16, 64]), label="vocab")
    ngram = data.draw(st.integers(1, 4), label="ngram")
    if method == "speculative":
        opts, min_len = {"gamma": data.draw(st.integers(1, 6), label="gamma")}, 1
    else:
        chunk = data.draw(st.integers(1, 6), label="chunk")
        opts = {"gamma1": data.draw(st.integers(1, 4), label="gamma1"),
                "gamma2": data.draw(st.integers(1, 8), label="gamma2"), "chunk_size": chunk,
                "budget": data.draw(st.integers(3 * chunk, 8 * chunk), label="budget"),
                "rebuild_stride": data.draw(st.integers(1, 40), label="stride")}
        min_len = opts["budget"]
    target = tiny(0, vocab)
    prompts = lookup_prompts(data, vocab, min_len)
    length = data.draw(st.sampled_from(["match", "gamma"]), label="lookup_length")
    generate_and_check(data, target, prompts, vocab, method=method, draft="lookup", ngram=ngram, lookup_length=length,
                       **opts)


def lookup_prompts(data, vocab: int, min_len: int) -> list[torch.Tensor]:
    """1-5 prompts of ``min_len`` to ``min_len + 30`` tokens: ragged, identical, or repeating a phrase of their
    own (so that prompt lookup finds matches)."""
    B = data.draw(st.integers(1, 5), label="batch")
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2 ** 16), label="seed"))
    kind = data.draw(st.sampled_from(["ragged", "identical", "repeating"]), label="prompts")
    lens = data.draw(st.lists(st.integers(min_len, min_len + 30), min_size=B, max_size=B), label="lens")
    if kind == "identical":
        return [torch.randint(0, vocab, (lens[0],), generator=g)] * B
    if kind == "repeating":
        period = data.draw(st.integers(1, 8), label="period")
        return [torch.randint(0, vocab, (period,), generator=g).repeat(n // period + 1)[:n] for n in lens]
    return [torch.randint(0, vocab, (n,), generator=g) for n in lens]


@settings(max_examples=15, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_prompt_lookup_trees_random_batches_and_options(data):
    """Prompt lookup's trees (method="tree", draft="lookup"): random batches, tree shapes and n-grams, EOS,
    sampling with top-p; greedy output equals autoregressive decoding's."""
    vocab = data.draw(st.sampled_from([16, 64]), label="vocab")
    shape = tuple(data.draw(st.lists(st.integers(1, 5), min_size=1, max_size=6), label="tree"))
    ngram = data.draw(st.integers(1, 4), label="ngram")
    generate_and_check(data, tiny(0, vocab), lookup_prompts(data, vocab, 1), vocab, method="tree", draft="lookup",
                       tree=shape, ngram=ngram)


def record_retrieval_peak(monkeypatch) -> dict:
    """Record, after every forward into a retrieval cache, the most tokens any row holds past the ones
    ``sync()`` copied (its ``appended``) and the ``max_step`` the cache was sized for."""
    from triforce.models import cache as cache_mod

    peak = {"appended": 0, "max_step": None}
    orig_end = cache_mod.RetrievalCache.end

    def end(self, step):
        orig_end(self, step)
        appended = self.lengths.long() - (self.budget + self.synced - self.base_pos)
        peak["appended"] = max(peak["appended"], int(appended.max()))
        peak["max_step"] = self.max_step

    monkeypatch.setattr(cache_mod.RetrievalCache, "end", end)
    return peak


def test_triforce_retrieval_cache_capacity_many_identical_rows(monkeypatch):
    """A row that already holds gamma2 middle tokens still gets gamma1 + 1 written at every further
    middle pass while other rows continue: the tokens appended to the retrieval cache between two syncs
    must never exceed the ``max_step`` it was sized for (it did, and the cache overflowed)."""
    peak = record_retrieval_peak(monkeypatch)
    target, draft = tiny(0, 16), tiny(1, 16)
    p = torch.randint(0, 16, (40,), generator=torch.Generator().manual_seed(2))
    out = triforce.generate(target, p.expand(300, 40).clone(), method="triforce", max_new_tokens=64,
                            temperature=1.0, draft=draft, gamma1=2, gamma2=3, budget=12, chunk_size=4, sink=1,
                            window=12, rebuild_stride=4, seed=0)
    assert all(int(n) == 64 for n in out.lengths)
    # finished rows rode along in further middle passes: gamma2 + 2 * gamma1 + 1 = 8 > gamma1 + gamma2 + 1
    assert peak["appended"] == 8 and peak["appended"] <= peak["max_step"], peak


@pytest.mark.parametrize("method,draft,opts", [
    # the middle level with trained heads: each pass also writes the pseudo tokens of hidden_transfer
    # (one per position at depth 2), (gamma1 + 1) * 2 = 4 a pass: gamma2 + gamma1 + 4 = 8
    ("triforce", "hidden_transfer", {"gamma1": 1, "gamma2": 3}),
    ("triforce", "medusa", {"gamma1": 2, "gamma2": 4}),  # gamma2 + gamma1 + gamma1 + 1 = 9
    # MagicDec's retrieval draft writes the pending token and gamma - 1 drafts (the last is never fed)
    ("magicdec", None, {"gamma": 3, "draft_cache": "retrieval"}),
    ("magicdec", "int8", {"gamma": 1, "draft_cache": "retrieval"}),
])
def test_retrieval_cache_max_step_is_reached(monkeypatch, method, draft, opts):
    """Each level sizes its retrieval cache for exactly the most tokens it writes between two syncs: over
    a wide sampled batch some row reaches ``max_step`` (a smaller bound would overflow the cache on
    valid input once its tail is full; a larger one is slack)."""
    from tests.test_heads import random_heads

    peak = record_retrieval_peak(monkeypatch)
    target = tiny(0, 16)
    if draft == "int8":
        draft = int8_copy(target)
    elif draft is not None:
        draft = random_heads(target, draft, depth=2, std=0.5)
    p = torch.randint(0, 16, (40,), generator=torch.Generator().manual_seed(2))
    triforce.generate(target, p.expand(96, 40).clone(), method=method, draft=draft, max_new_tokens=24,
                      temperature=1.0, budget=12, chunk_size=4, rebuild_stride=4, seed=0, **opts)
    assert peak["appended"] == peak["max_step"], peak


# ---- end of sequence
@pytest.mark.parametrize("method,opts", [
    ("autoregressive", {}),
    ("speculative", {"gamma": 3}),
    ("magicdec", {"gamma": 3, "sink": 1, "window": 8}),
    ("magicdec", {"gamma": 2, "draft_cache": "retrieval", "budget": 12, "chunk_size": 4}),
    ("triforce", {"gamma1": 2, "gamma2": 4, "budget": 12, "chunk_size": 4, "sink": 1, "window": 12}),
    ("tree", {"tree": (2, 1), "sink": 1, "window": 12}),
])
def test_eos_stops_each_row_and_pads(method, opts):
    target = tiny(0, 16)
    g = torch.Generator().manual_seed(4)
    prompts = [torch.randint(0, 16, (n,), generator=g) for n in (17, 30, 23, 41)]
    free = triforce.generate(target, prompts, method="autoregressive", max_new_tokens=30)
    # the EOS id: a token that some rows emit early and others late (ragged finishing steps)
    first_seen = {}
    for b, t in enumerate(free.tokens):
        for i, x in enumerate(t.tolist()):
            first_seen.setdefault(x, {}).setdefault(b, i)
    eos = max(first_seen, key=lambda x: (len(first_seen[x]), -sum(first_seen[x].values())))
    out = triforce.generate(target, prompts, method=method, max_new_tokens=30, eos_token_id=eos, pad_token_id=0,
                            draft=tiny(1, 16, layers=1) if method == "speculative" else None, **opts)
    real = 0
    for b, t in enumerate(free.tokens):
        n = first_seen[eos].get(b, 29) + 1
        assert out.lengths[b] == n
        assert torch.equal(out.tokens[b][:n], t[:n])
        assert bool((out.tokens[b][n:] == 0).all())
        real += n
    assert out.stats["new_tokens"] == real
    assert out.stats["tokens_per_s"] == pytest.approx((real - len(prompts)) / out.stats["decode_s"])


def test_eos_on_the_first_token_stops_without_decoding():
    target = tiny(0, 16)
    p = torch.randint(0, 16, (1, 12), generator=torch.Generator().manual_seed(1))
    first = int(triforce.generate(target, p, method="autoregressive", max_new_tokens=1).tokens[0][0])
    out = triforce.generate(target, p, method="magicdec", max_new_tokens=20, eos_token_id=first, sink=1, window=8)
    assert out.lengths == [1] and out.stats["target_passes"] == 0
    assert out.tokens[0].tolist() == [first] * 20  # padded with the EOS id by default


# ---- options and inputs at the boundary
@pytest.mark.parametrize("method,opts,name", [
    ("speculative", {"gamma": 0}, "gamma"),
    ("speculative", {"gamma": 2.5}, "gamma"),
    ("speculative", {"gamma": True}, "gamma"),
    ("speculative", {"draft_layers": 0}, "draft_layers"),
    ("triforce", {"gamma1": 0}, "gamma1"),
    ("triforce", {"gamma2": 0}, "gamma2"),
    ("triforce", {"budget": 0}, "budget"),
    ("triforce", {"budget": -8}, "budget"),
    ("triforce", {"chunk_size": 0}, "chunk_size"),
    ("triforce", {"rebuild_stride": 0}, "rebuild_stride"),
    ("triforce", {"recent": -1}, "recent"),
    ("magicdec", {"recent": 2.5}, "recent"),
    ("magicdec", {"sink": -1}, "sink"),
    ("magicdec", {"window": 0}, "window"),
    ("magicdec", {"draft_cache": "paged"}, "draft_cache"),
    ("tree", {"tree": ()}, "tree"),
    ("tree", {"tree": (2, 0)}, "tree"),
    ("tree", {"tree": (2.0, 1)}, "tree"),
])
def test_bad_option_values_name_the_option(method, opts, name):
    target = tiny(0, 64)
    p = torch.randint(0, 64, (1, 40))
    with pytest.raises(ValueError, match=rf"^{name}: "):
        triforce.generate(target, p, method=method, max_new_tokens=4, **opts)


def test_every_default_passes_its_own_check():
    """The option table's defaults are values its own checks accept (a default of ``tree`` with a zero
    branching factor, say, would reach the engine unchecked: defaults are not validated per call)."""
    from triforce.engines.methods import OPTIONS

    assert {name: opt.check(opt.default) for name, opt in OPTIONS.items()} == {name: None for name in OPTIONS}


def test_budget_too_small_blames_the_budget_not_the_prompt():
    target = tiny(0, 64)
    with pytest.raises(ValueError, match=r"^budget: .*got budget=8"):
        triforce.generate(target, torch.randint(0, 64, (1, 60)), method="triforce", max_new_tokens=4, budget=8,
                          chunk_size=4)


def test_bad_eos_and_pad_ids():
    target = tiny(0, 64)
    p = torch.randint(0, 64, (1, 10))
    for kw in ({"eos_token_id": 64}, {"eos_token_id": [1, -1]}, {"eos_token_id": "a"}, {"pad_token_id": 99}):
        with pytest.raises(ValueError, match=next(iter(kw))):
            triforce.generate(target, p, method="autoregressive", max_new_tokens=2, **kw)


def test_context_limit_is_a_clear_error_and_the_last_token_fits():
    target = tiny(0, 16, ctx=64)
    p = torch.randint(0, 16, (1, 40), generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match=r"max_new_tokens: .* at most 24"):
        triforce.generate(target, p, method="autoregressive", max_new_tokens=25)
    for n in (64, 70):  # a prompt that fills the context names the prompt, not max_new_tokens
        long = torch.zeros(1, n, dtype=torch.int64)
        with pytest.raises(ValueError, match=r"prompt_ids: a prompt of %d tokens .* at most 63 tokens" % n):
            triforce.generate(target, long, method="autoregressive", max_new_tokens=1)
    ref = triforce.generate(target, p, method="autoregressive", max_new_tokens=24)
    for method, opts in (("magicdec", {"gamma": 5, "sink": 1, "window": 8}),
                         ("triforce", {"budget": 12, "chunk_size": 4, "sink": 1, "window": 12}),
                         ("tree", {"tree": (2, 2), "sink": 1, "window": 12})):
        out = triforce.generate(target, p, method=method, max_new_tokens=24, **opts)
        assert torch.equal(out.tokens[0], ref.tokens[0]), method


# ---- one greedy rule everywhere
def test_greedy_sampling_rule_matches_the_verifiers_on_nan_and_ties():
    import triforce_kernels as tk
    from triforce.engines.steps import Sampling

    s = Sampling(0.0, None, None, None)
    logits = torch.tensor([[0.0, float("nan"), 1.0, 1.0], [float("nan")] * 4, [2.0, 2.0, -1.0, 0.0]])
    tok, _ = s.sample(logits)
    draft = torch.zeros(3, 0, dtype=torch.int64)
    emitted, _ = tk.chain_greedy_verify(draft, logits[:, None])
    assert tok[:, 0].tolist() == emitted[:, 0].tolist() == [2, 0, 0]


@given(V=st.integers(1, 40), num=st.integers(2, 50), seed=st.integers(0, 2 ** 16))
def test_greedy_children_rank_by_value_then_lowest_index(V, num, seed):
    """Greedy tree children: highest logit first, ties by lowest index (column 0 is the verifiers'
    argmax), NaN as -inf, -0.0 equal to 0.0; past V, and past the ids above -inf (tokens the logits rule
    out, as a draft vocabulary does), the argmax repeats (torch.topk orders ties arbitrarily and cannot
    take num > V)."""
    from triforce.engines.steps import Sampling
    from triforce_kernels.reference.sampling import argmax_lowest

    g = torch.Generator().manual_seed(seed)
    x = torch.randn(4, V, generator=g).round()  # ties
    specials = torch.tensor([float("nan"), float("inf"), float("-inf"), -0.0, 0.0, 3.4e38, -3.4e38])
    pick = torch.rand(4, V, generator=g) < 0.3
    x[pick] = specials[torch.randint(0, len(specials), (int(pick.sum()),), generator=g)]
    ids, probs = Sampling(0.0, None, None, None).sample(x, num)
    assert probs is None and ids.shape == (4, num) and ids.dtype == torch.int64
    for r in range(4):
        c = [float("-inf") if v != v else v for v in x[r].tolist()]
        want = sorted(range(V), key=lambda i: (-c[i], i))[:num]
        want = [want[0]] + [i if c[i] > float("-inf") else want[0] for i in want[1:]]
        want += [want[0]] * (num - len(want))
        assert ids[r].tolist() == want, (x[r], ids[r], want)
    assert torch.equal(ids[:, 0], argmax_lowest(x))


def test_greedy_tree_wider_than_the_vocabulary():
    """A branching factor above the vocabulary: greedy children repeat (this crashed in topk);
    output equal to autoregressive, and sampling works too."""
    m = tiny(0, 4)
    prompts = torch.randint(0, 4, (2, 10), generator=torch.Generator().manual_seed(0))
    ref = triforce.generate(m, prompts, method="autoregressive", max_new_tokens=12)
    out = triforce.generate(m, prompts, method="tree", tree=(6, 2), max_new_tokens=12)
    assert all(torch.equal(a, b) for a, b in zip(out.tokens, ref.tokens))
    out = triforce.generate(m, prompts, method="tree", tree=(6, 2), max_new_tokens=12, temperature=1.0, seed=3)
    assert all(bool(((t >= 0) & (t < 4)).all()) for t in out.tokens)


def test_sampled_draws_never_fail_on_nan_logits():
    from triforce.engines.steps import Sampling

    s = Sampling(1.0, None, None, torch.Generator().manual_seed(0))
    logits = torch.tensor([[0.0, float("nan"), 1.0], [float("nan")] * 3])
    tok, _ = s.sample(logits, 4)
    assert tok.shape == (2, 4) and bool(((tok >= 0) & (tok < 3)).all())


def test_magicdec_retrieval_records_acceptance_and_rebuilds_when_it_drops(monkeypatch):
    from triforce.models import cache as cache_mod

    seen = []
    orig = cache_mod.RetrievalCache.rebuild

    def spy(self):
        seen.append(self._acc_count)
        return orig(self)

    monkeypatch.setattr(cache_mod.RetrievalCache, "rebuild", spy)
    target = tiny(0, 64)
    p = torch.randint(0, 64, (2, 40), generator=torch.Generator().manual_seed(3))
    triforce.generate(target, p, method="magicdec", max_new_tokens=60, draft_cache="retrieval", budget=12,
                      chunk_size=4, gamma=4, rebuild_stride=10_000)
    # rebuilds beyond the first are triggered by the recorded acceptance window (8 rates) alone
    assert len(seen) >= 2 and all(n >= 8 for n in seen[1:]), seen


# ---- short prompts with every method's defaults
@pytest.mark.parametrize("n", [1, 2, 6])
def test_short_prompts_work_with_every_default(n):
    """The README's 'The capital of France is' is 6 tokens: every method runs on its defaults (a
    drafter's history is padded; no retrieval cache can exist, so triforce and magicdec-retrieval fall
    back to drafting straight for the full level and say so) and equals autoregressive."""
    target = tiny(0, 64)
    p = torch.randint(0, 64, (2, n), generator=torch.Generator().manual_seed(n))
    ref = triforce.generate(target, p, method="autoregressive", max_new_tokens=12)
    for method, opts in (("speculative", {}), ("magicdec", {}), ("magicdec", {"draft_cache": "retrieval"}),
                         ("triforce", {}), ("tree", {})):
        out = triforce.generate(target, p, method=method, max_new_tokens=12, **opts)
        assert all(torch.equal(a, b) for a, b in zip(out.tokens, ref.tokens)), (method, opts)
        falls_back = method == "triforce" or opts.get("draft_cache") == "retrieval"
        assert bool(out.stats["notes"]) == falls_back, (method, out.stats["notes"])
        if falls_back:
            assert "too short for a retrieval cache" in out.stats["notes"][0]


def test_default_speculative_draft_is_a_half_precision_copy_that_accepts():
    from triforce.engines.drafters import half_precision_copy

    target = tiny(0, 64)
    draft = half_precision_copy(target)
    assert next(draft.parameters()).dtype == torch.bfloat16 and half_precision_copy(target) is draft
    p = torch.randint(0, 64, (2, 30), generator=torch.Generator().manual_seed(9))
    out = triforce.generate(target, p, method="speculative", max_new_tokens=20)
    assert out.stats["acceptance"]["draft->full"] > 0.5
    bf = tiny.__wrapped__(0, 64).to(torch.bfloat16)  # a fresh model: the cached one stays float32
    assert half_precision_copy(bf) is None  # a bfloat16 target drafts for itself on a StreamingLLM window
    ref = triforce.generate(bf, p, method="autoregressive", max_new_tokens=10)
    out = triforce.generate(bf, p, method="speculative", max_new_tokens=10)
    assert all(torch.equal(a, b) for a, b in zip(out.tokens, ref.tokens))


def test_retrieval_cache_keeps_the_recent_window():
    """`recent` tokens of recent context stay in the retrieval cache through every rebuild (the chunks
    before the tail): the engines pass recent // chunk_size trailing chunks, capped at half the budget."""
    from triforce.engines.steps import recent_chunks
    from triforce.models import cache as C

    assert recent_chunks(256, 512, 8) == 32 and recent_chunks(256, 96, 8) == 6
    assert recent_chunks(0, 512, 8) == 0 and recent_chunks(5, 12, 4) == 1
    seen = []
    orig = C.RetrievalCache.__init__

    def spy(self, *a, **k):
        seen.append(k.get("recent_chunks"))
        orig(self, *a, **k)

    target = tiny(0, 64)
    p = torch.randint(0, 64, (1, 200), generator=torch.Generator().manual_seed(0))
    ref = triforce.generate(target, p, method="autoregressive", max_new_tokens=30)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(C.RetrievalCache, "__init__", spy)
        for method, opts in (("triforce", {}), ("magicdec", {"draft_cache": "retrieval"})):
            out = triforce.generate(target, p, method=method, max_new_tokens=30, budget=64, chunk_size=8,
                                    recent=32, rebuild_stride=8, **opts)
            assert torch.equal(out.tokens[0], ref.tokens[0])
    assert seen == [4, 4]
