"""Prompt lookup (``draft="lookup"``, triforce/engines/lookup.py): the search against a plain-Python
reference, greedy output equal to autoregressive decoding (tiny random models with ragged batches and
repetitive prompts, the embedded SmolLM2-135M), a step without a match that verifies the pending token
alone, the statistics, and the validation of its options. Its sampled distribution:
tests/test_engines_sampling.py; its host syncs: tests/test_host_syncs.py."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, strategies as st

import triforce
from triforce.engines import lookup
from triforce.engines.lookup import LookupDrafter, lookup_drafts, lookup_match_drafts
from tests.test_engines import load_smollm2, ragged_prompts, tiny


def reference_drafts(seq: list[int], gamma: int, ngram: int) -> list[int]:
    """The rule of lookup_drafts, one row in plain Python: the largest n <= ngram whose last-n pattern
    occurs earlier with a token after it; of those occurrences the latest that gamma tokens follow, else
    the latest; the tokens after it, -1 past the sequence."""
    L = len(seq)
    for n in range(ngram, 0, -1):
        if L <= n:
            continue
        pattern = seq[L - n:]
        starts = [s for s in range(L - n) if seq[s:s + n] == pattern]  # s + n < L: a token follows
        if not starts:
            continue
        full = [s for s in starts if s + n + gamma <= L]
        s = max(full) if full else max(starts)
        out = seq[s + n: s + n + gamma]
        return out + [-1] * (gamma - len(out))
    return [-1] * gamma


def reference_match_drafts(seq: list[int], gamma: int, ngram: int, candidates: int, cap: int) -> list[int]:
    """The rule of lookup_match_drafts, one row in plain Python: the largest n <= ngram whose last-n pattern
    occurs earlier with a token after it; of those occurrences the latest ``candidates``; each one's match
    length m: how many tokens, counted back from its end, equal the row's last ones (at most max(cap, ngram));
    the longest m wins, then one that min(gamma, m) tokens follow, then the latest; the min(gamma, m) tokens
    after it, -1 past the sequence and the match."""
    L = len(seq)
    for n in range(ngram, 0, -1):
        if L <= n:
            continue
        ends = [e for e in range(n - 1, L - 1) if seq[e - n + 1:e + 1] == seq[L - n:]]  # e + 1 < L: a token follows
        if not ends:
            continue
        best = None
        for e in sorted(ends)[-candidates:]:
            m = 0
            while m < max(cap, ngram) and e - m >= 0 and seq[e - m] == seq[L - 1 - m]:
                m += 1
            take = min(gamma, m)
            key = (m, e + 1 + take <= L, e)
            if best is None or key > best[0]:
                best = (key, e, take)
        _, e, take = best
        out = seq[e + 1: e + 1 + take]
        return out + [-1] * (gamma - len(out))
    return [-1] * gamma


@st.composite
def rows(draw):
    B = draw(st.integers(1, 4))
    vocab = draw(st.integers(1, 6))  # few tokens: matches of every length, and none for some rows
    seqs = [draw(st.lists(st.integers(0, vocab - 1), min_size=0, max_size=30)) for _ in range(B)]
    width = max(len(s) for s in seqs) + draw(st.integers(0, 5))
    return seqs, max(width, 1), draw(st.integers(1, 6)), draw(st.integers(1, 4))


@given(rows())
def test_lookup_drafts_match_the_reference(case):
    seqs, width, gamma, ngram = case
    buf = torch.full((len(seqs), width), -1, dtype=torch.int64)
    for b, s in enumerate(seqs):
        buf[b, : len(s)] = torch.tensor(s, dtype=torch.int64)
    length = torch.tensor([len(s) for s in seqs])
    got = lookup_drafts(buf, length, gamma, ngram)
    assert got.shape == (len(seqs), gamma) and got.dtype == torch.int64
    for b, s in enumerate(seqs):
        assert got[b].tolist() == reference_drafts(s, gamma, ngram), (b, s, gamma, ngram)


@given(rows(), st.sampled_from([(16, 32), (2, 3), (1, 1), (4, 2)]))
def test_lookup_match_drafts_match_the_reference(case, limits):
    """Also with fewer candidates and a shorter cap than the defaults (module constants), so that on these short
    rows both bind."""
    seqs, width, gamma, ngram = case
    candidates, cap = limits
    buf = torch.full((len(seqs), width), -1, dtype=torch.int64)
    for b, s in enumerate(seqs):
        buf[b, : len(s)] = torch.tensor(s, dtype=torch.int64)
    length = torch.tensor([len(s) for s in seqs])
    saved = lookup.MATCH_CANDIDATES, lookup.MATCH_CAP
    lookup.MATCH_CANDIDATES, lookup.MATCH_CAP = candidates, cap
    try:
        got = lookup_match_drafts(buf, length, gamma, ngram)
    finally:
        lookup.MATCH_CANDIDATES, lookup.MATCH_CAP = saved
    assert got.shape == (len(seqs), gamma) and got.dtype == torch.int64
    for b, s in enumerate(seqs):
        assert got[b].tolist() == reference_match_drafts(s, gamma, ngram, candidates, cap), (b, s, gamma, ngram)


def test_lookup_match_drafts_copy_the_longest_match_as_far_as_it_matched():
    #        0  1  2  3  4  5  6  7  8  9 10 11 12 13 14 15
    seq = [4, 5, 1, 2, 7, 8, 9, 3, 6, 1, 2, 6, 6, 5, 1, 2]
    buf = torch.tensor([seq])
    length = torch.tensor([len(seq)])
    # "1 2" occurred at 2-3 and 9-10; before 2-3 stands 5, as before the row's last "1 2": a match of 3 tokens
    # (the one at 9-10, the latest, matches 2), so it wins and 3 of the tokens after it are the draft
    assert lookup_match_drafts(buf, length, 8, 2).tolist() == [[7, 8, 9, -1, -1, -1, -1, -1]]
    assert lookup_match_drafts(buf, length, 2, 2).tolist() == [[7, 8]]  # at most gamma
    # the old rule: the latest occurrence that gamma tokens follow, gamma tokens
    assert lookup_drafts(buf, length, 4, 2).tolist() == [[6, 6, 5, 1]]
    # equal matches: the latest that min(gamma, m) tokens follow. "1 1" at 1-2 and at 6-7 (m = 2 each: 5 stands
    # before both, not before the row's last "1 1"); one token follows the latest
    seq = [5, 1, 1, 8, 9, 5, 1, 1, 1]
    buf, length = torch.tensor([seq]), torch.tensor([len(seq)])
    assert lookup_match_drafts(buf, length, 2, 2).tolist() == [[8, 9]]
    assert lookup_match_drafts(buf, length, 1, 2).tolist() == [[1]]  # both have a token after them: the latest
    # nothing: a sequence of distinct tokens, and one too short to have an earlier occurrence
    assert lookup_match_drafts(torch.tensor([[1, 2, 3, 4], [3, -1, -1, -1]]), torch.tensor([4, 1]), 2, 3).tolist() == \
        [[-1, -1], [-1, -1]]


def test_lookup_drafts_prefer_the_longest_match_and_a_full_continuation():
    #        0  1  2  3  4  5  6  7  8  9 10 11
    seq = [5, 1, 2, 7, 8, 9, 3, 2, 4, 1, 2, 6]
    seq = seq + [1, 2]  # the last two tokens, "1 2", occurred at 1 and 9; "2" alone at 2, 7 and 10
    buf = torch.tensor([seq])
    length = torch.tensor([len(seq)])
    # ngram 2: "1 2" at 9 is followed by "6 1 2" (3 tokens), at 1 by "7 8 9 3": the latest with 4 tokens is 1
    assert lookup_drafts(buf, length, 4, 2).tolist() == [[7, 8, 9, 3]]
    assert lookup_drafts(buf, length, 3, 2).tolist() == [[6, 1, 2]]  # the latest, 9, has 3 tokens after it
    # ngram 1: "2" at 10 (latest, 3 tokens follow), then at 7 (6 tokens follow: "4 1 2 6 1 2")
    assert lookup_drafts(buf, length, 5, 1).tolist() == [[4, 1, 2, 6, 1]]
    # nothing: a sequence of distinct tokens, and one too short to have an earlier occurrence
    assert lookup_drafts(torch.tensor([[1, 2, 3, 4], [3, -1, -1, -1]]), torch.tensor([4, 1]), 2, 3).tolist() == \
        [[-1, -1], [-1, -1]]


def repetitive_prompts(vocab=64):
    """Ragged prompts that repeat a phrase of their own (prompt lookup finds matches in them), and one
    of random tokens."""
    g = torch.Generator().manual_seed(5)
    out = []
    for n, period in ((17, 5), (30, 7), (23, None), (41, 3)):
        if period is None:
            out.append(torch.randint(0, vocab, (n,), generator=g))
        else:
            out.append(torch.randint(0, vocab, (period,), generator=g).repeat(n // period + 1)[:n])
    return out


def prompt_set(kind: str) -> list[torch.Tensor]:
    """``"repetitive"``: :func:`repetitive_prompts`; ``"random"``: the engine tests' ragged random prompts."""
    return repetitive_prompts() if kind == "repetitive" else ragged_prompts()


@pytest.fixture(scope="module")
def target():
    return tiny(0)


@pytest.mark.parametrize("gamma,ngram", [(1, 1), (3, 3), (6, 2)])
@pytest.mark.parametrize("prompts", ["repetitive", "random"])
@pytest.mark.parametrize("length", ["match", "gamma"])
def test_greedy_equals_autoregressive_tiny_ragged(target, gamma, ngram, prompts, length):
    ps = prompt_set(prompts)
    ref = triforce.generate(target, ps, method="autoregressive", max_new_tokens=37)
    out = triforce.generate(target, ps, method="speculative", draft="lookup", gamma=gamma, ngram=ngram,
                            lookup_length=length, max_new_tokens=37)
    for b in range(len(ps)):
        assert torch.equal(out.tokens[b], ref.tokens[b]), (b, out.tokens[b], ref.tokens[b])
    st_ = out.stats
    assert set(st_["acceptance"]) == {"lookup->full"}
    assert st_["time_s"].keys() == {"draft", "full"}
    if prompts == "repetitive":  # the copies pay: fewer passes than tokens
        assert st_["acceptance"]["lookup->full"] > 0 and st_["target_passes"] < 36


@pytest.mark.parametrize("opts", [
    {"gamma1": 2, "gamma2": 5, "budget": 12, "chunk_size": 4},
    {"gamma1": 4, "gamma2": 6, "budget": 16, "chunk_size": 4, "ngram": 2},
    {"gamma1": 1, "gamma2": 2, "budget": 8, "chunk_size": 2, "ngram": 1},
    {"gamma1": 3, "gamma2": 4, "budget": 4096, "chunk_size": 64},  # no retrieval cache fits: lookup -> full
    {"gamma1": 4, "gamma2": 6, "budget": 16, "chunk_size": 4, "lookup_length": "gamma"},
])
@pytest.mark.parametrize("prompts", ["repetitive", "random"])
def test_triforce_bottom_level_greedy_equals_autoregressive(target, opts, prompts):
    """Prompt lookup as TriForce's bottom level: the retrieval level verifies its (ragged) proposals, the full
    level rebases it onto what it kept."""
    ps = prompt_set(prompts)
    ref = triforce.generate(target, ps, method="autoregressive", max_new_tokens=37)
    out = triforce.generate(target, ps, method="triforce", draft="lookup", max_new_tokens=37, **opts)
    assert [t.tolist() for t in out.tokens] == [t.tolist() for t in ref.tokens]
    levels = {"lookup->full"} if opts["chunk_size"] == 64 else {"lookup->retrieval", "retrieval->full"}
    assert set(out.stats["acceptance"]) == levels
    if prompts == "repetitive":
        assert out.stats["acceptance"][min(levels)] > 0


def test_rebase_cuts_the_middle_levels_tokens(target):
    """rebase: the row's tokens become the verifier's, of the new length, ending with the given history."""
    from triforce.engines.decode import Decode
    from triforce.engines.steps import Sampling

    ps = [torch.arange(10), torch.arange(20, 26)]
    d = Decode(target, ps, 10, Sampling(0.0, None, None, None))
    d.setup(width=5)
    drafter = LookupDrafter(d, 3, 3)
    drafter.prefill(ps, torch.tensor([[8, 9, 50], [24, 25, 51]]))
    drafter.commit(torch.tensor([[52, 53, 54], [55, -1, -1]]), torch.tensor([3, 1], dtype=torch.int32))
    assert drafter.seq.count.tolist() == [14, 8]
    drafter.rebase(torch.tensor([[50, 52, 60], [25, 51, 61]]), torch.tensor([-1, 0]))
    assert drafter.seq.count.tolist() == [13, 8] and drafter.pending.tolist() == [[60], [61]]
    assert drafter.tokens[0, :14].tolist() == [*range(10), 50, 52, 60, -1]
    assert drafter.tokens[1, :9].tolist() == [*range(20, 26), 51, 61, -1]


def test_greedy_with_eos_and_one_prompt_shorter_than_the_ngram(target):
    ps = [torch.tensor([3]), repetitive_prompts()[3]]
    ref = triforce.generate(target, ps, method="autoregressive", max_new_tokens=30)
    eos = int(ref.tokens[1][12])  # row 1 stops at its 13th token (or earlier, where the id first occurs)
    ref = triforce.generate(target, ps, method="autoregressive", max_new_tokens=30, eos_token_id=eos)
    out = triforce.generate(target, ps, method="speculative", draft="lookup", gamma=4, max_new_tokens=30,
                            eos_token_id=eos)
    assert [t.tolist() for t in out.tokens] == [t.tolist() for t in ref.tokens]
    assert out.stats["lengths"] == ref.stats["lengths"]


def test_a_step_without_a_match_verifies_the_pending_token_alone(target, monkeypatch):
    """A one-token prompt whose first new token differs from it: nothing occurred earlier, so the first
    step's pass is one token wide (an autoregressive step) and nothing counts as offered."""
    first = triforce.generate(target, [torch.arange(64)[:, None][i] for i in range(64)], method="autoregressive",
                              max_new_tokens=1)
    p0 = next(i for i in range(64) if int(first.tokens[i][0]) != i)
    widths, proposals = [], []
    forward, propose = type(target).forward, LookupDrafter.propose

    def recording_forward(self, ids, *args, **kwargs):
        widths.append(ids.shape[1])
        return forward(self, ids, *args, **kwargs)

    def recording_propose(self, gamma):
        x, q = propose(self, gamma)
        proposals.append(x.shape[1])
        return x, q

    monkeypatch.setattr(type(target), "forward", recording_forward)
    monkeypatch.setattr(LookupDrafter, "propose", recording_propose)
    ps = [torch.tensor([p0])]
    out = triforce.generate(target, ps, method="speculative", draft="lookup", gamma=5, max_new_tokens=2)
    assert proposals == [0] and widths == [1]  # the step (the prompt goes through Llama.prefill)
    assert out.stats["acceptance"] == {"lookup->full": 0.0}
    monkeypatch.undo()
    ref = triforce.generate(target, ps, method="autoregressive", max_new_tokens=2)
    assert torch.equal(out.tokens[0], ref.tokens[0])


@pytest.mark.parametrize("length", ["match", "gamma"])
def test_sampled_drafts_are_deterministic(target, length):
    """Sampling: the drafts come without probabilities (None: the samplers' one-hot draft), the same drafts as
    greedy; the distribution this gives: tests/test_engines_sampling.py. The pending token repeats each
    prompt's last one, which never occurred twice in a row before (the third prompt's tokens are random): with
    ``lookup_length="match"`` the proposals are one token long, a match's length; with ``"gamma"``, gamma."""
    from triforce.engines.decode import Decode
    from triforce.engines.steps import Sampling

    ps = repetitive_prompts()
    hist = torch.stack([p[-2:] for p in ps])
    drafts = []
    for sampling in (Sampling(1.0, None, None, torch.Generator().manual_seed(0)), Sampling(0.0, None, None, None)):
        d = Decode(target, ps, 10, sampling)
        d.setup(width=5)
        drafter = LookupDrafter(d, 3, 2, length)
        drafter.prefill(ps, hist)
        x, q = drafter.propose(4)
        assert q is None and x.shape[1] == (1 if length == "match" else 4)
        drafts.append(x)
    assert torch.equal(*drafts)


def test_smollm2_greedy_equals_autoregressive():
    model, tok = load_smollm2()
    text = "def add(a, b):\n    return a + b\n\n\ndef add3(a, b, c):\n    return"
    ids = torch.tensor([tok.encode(text)])
    ref = triforce.generate(model, ids, method="autoregressive", max_new_tokens=24)
    out = triforce.generate(model, ids, method="speculative", draft="lookup", gamma=4, max_new_tokens=24)
    assert torch.equal(out.tokens[0], ref.tokens[0])
    assert out.stats["acceptance"]["lookup->full"] > 0


def test_bad_options(target):
    p = [torch.arange(10)]
    for method, opts in (("tree", {}), ("magicdec", {}), ("autoregressive", {})):
        with pytest.raises(ValueError, match="draft='lookup'"):
            triforce.generate(target, p, method=method, draft="lookup", max_new_tokens=2, **opts)
    with pytest.raises(ValueError, match="ngram"):
        triforce.generate(target, p, method="speculative", ngram=2, max_new_tokens=2)
    with pytest.raises(ValueError, match="ngram"):
        triforce.generate(target, p, method="speculative", draft="lookup", ngram=0, max_new_tokens=2)
    with pytest.raises(ValueError, match="draft_layers"):
        triforce.generate(target, p, method="speculative", draft="lookup", draft_layers=1, max_new_tokens=2)
    with pytest.raises(ValueError, match="lookup_length: expected one of 'match', 'gamma', got 'longest'"):
        triforce.generate(target, p, method="speculative", draft="lookup", lookup_length="longest", max_new_tokens=2)
    with pytest.raises(ValueError, match="lookup_length: the length rule of prompt lookup"):
        triforce.generate(target, p, method="triforce", lookup_length="gamma", max_new_tokens=2)
    with pytest.raises(TypeError, match="lookup_length"):
        triforce.generate(target, p, method="tree", lookup_length="gamma", max_new_tokens=2)
    with pytest.raises(ValueError, match="lookup_length"):
        LookupDrafter(None, 3, 2, "longest")
    with pytest.raises(TypeError, match="ngram"):
        triforce.generate(target, p, method="magicdec", ngram=2, max_new_tokens=2)
    with pytest.raises(ValueError, match="draft_vocab"):
        triforce.generate(target, p, method="triforce", draft="lookup", draft_vocab=8, max_new_tokens=2)
