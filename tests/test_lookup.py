"""Prompt lookup (``draft="lookup"``, triforce/engines/lookup.py): the search against a plain-Python
reference, greedy output equal to autoregressive decoding (tiny random models with ragged batches and
repetitive prompts, the embedded SmolLM2-135M), a step without a match that verifies the pending token
alone, the statistics, and the validation of its options; its token trees (``method="tree"``) likewise. Its
sampled distribution:
tests/test_engines_sampling.py; its host syncs: tests/test_host_syncs.py."""
from __future__ import annotations

import contextlib

import pytest
import torch
from hypothesis import given, strategies as st

import triforce
from triforce.engines import lookup
from triforce.engines.lookup import LookupDrafter, lookup_drafts, lookup_match_drafts, lookup_tree, tree_size
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


def reference_tree(seq: list[int], shape: tuple[int, ...], ngram: int, candidates: int, cap: int) -> list[tuple]:
    """The rule of lookup_tree, one row in plain Python -> [(token, parent)] of nodes 1, 2, ... (the root is 0).
    The match rule's candidates (reference_match_drafts with gamma = depth), each with its min(depth, m) tokens,
    are inserted into a trie in that rule's order (longest match, one that its tokens follow, the latest): a
    candidate follows the existing nodes and adds one per token after them, and stops where a node would exceed
    its parent's limit shape[d] or its tokens end. Numbered by depth, then in the order added."""
    L, D = len(seq), len(shape)
    for n in range(ngram, 0, -1):
        if L <= n:
            continue
        ends = [e for e in range(n - 1, L - 1) if seq[e - n + 1:e + 1] == seq[L - n:]]
        if not ends:
            continue
        ranked = []
        for e in sorted(ends)[-candidates:]:
            m = 0
            while m < max(cap, ngram) and e - m >= 0 and seq[e - m] == seq[L - 1 - m]:
                m += 1
            take = min(D, m)
            ranked.append(((m, e + 1 + take <= L, e), seq[e + 1: e + 1 + take]))
        nodes, children = [], {0: []}  # nodes[i - 1] = (token, parent, depth) of the i-th node added
        for _, toks in sorted(ranked, reverse=True):
            at = 0
            for d, t in enumerate(toks):
                nxt = next((c for c in children[at] if nodes[c - 1][0] == t), None)
                if nxt is None:
                    if len(children[at]) == shape[d]:
                        break
                    nodes.append((t, at, d))
                    nxt = len(nodes)
                    children[at].append(nxt)
                    children[nxt] = []
                at = nxt
        order = sorted(range(1, len(nodes) + 1), key=lambda i: (nodes[i - 1][2], i))
        number = {0: 0, **{i: k + 1 for k, i in enumerate(order)}}
        return [(nodes[i - 1][0], number[nodes[i - 1][1]]) for i in order]
    return []


def as_buffer(seqs: list[list[int]], width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows' tokens as the drafter keeps them: ``[B, width]`` with -1 after each row's, and their lengths."""
    buf = torch.full((len(seqs), width), -1, dtype=torch.int64)
    for b, s in enumerate(seqs):
        buf[b, : len(s)] = torch.tensor(s, dtype=torch.int64)
    return buf, torch.tensor([len(s) for s in seqs])


@contextlib.contextmanager
def match_limits(candidates: int, cap: int):
    """The match rule's candidates and cap (module constants) set for the block."""
    saved = lookup.MATCH_CANDIDATES, lookup.MATCH_CAP
    lookup.MATCH_CANDIDATES, lookup.MATCH_CAP = candidates, cap
    try:
        yield
    finally:
        lookup.MATCH_CANDIDATES, lookup.MATCH_CAP = saved


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
    buf, length = as_buffer(seqs, width)
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
    buf, length = as_buffer(seqs, width)
    with match_limits(candidates, cap):
        got = lookup_match_drafts(buf, length, gamma, ngram)
    assert got.shape == (len(seqs), gamma) and got.dtype == torch.int64
    for b, s in enumerate(seqs):
        assert got[b].tolist() == reference_match_drafts(s, gamma, ngram, candidates, cap), (b, s, gamma, ngram)


@given(rows(), st.lists(st.integers(1, 3), min_size=1, max_size=5).map(tuple),
       st.sampled_from([(16, 32), (2, 3), (3, 1), (5, 2)]))
def test_lookup_tree_matches_the_reference(case, shape, limits):
    """The trie against its plain-Python statement (also with fewer candidates and a shorter cap, so that they
    bind on these short rows), each row's nodes first and -1 after them; and, from the tensors alone, the first
    child of every node leads along the match rule's chain proposal of the tree's depth (and on, where a later
    candidate continues it)."""
    seqs, width, _, ngram = case
    candidates, cap = limits
    buf, length = as_buffer(seqs, width)
    with match_limits(candidates, cap):
        tokens, parents = lookup_tree(buf, length, shape, ngram)
        chain = lookup_match_drafts(buf, length, len(shape), ngram)
        N = tree_size(shape, ngram)
    assert tokens.shape == parents.shape == (len(seqs), N) and tokens.dtype == parents.dtype == torch.int64
    for b, s in enumerate(seqs):
        ref = reference_tree(s, shape, ngram, candidates, cap)
        n = len(ref)
        assert list(zip(tokens[b, :n].tolist(), parents[b, :n].tolist())) == ref, (b, s, shape, ngram)
        assert tokens[b, n:].eq(-1).all() and parents[b, n:].eq(0).all()
        path, at = [], 0
        while True:
            kids = [i + 1 for i in range(n) if int(parents[b, i]) == at]
            if not kids:
                break
            at = kids[0]
            path.append(int(tokens[b, at - 1]))
        proposal = [t for t in chain[b].tolist() if t >= 0]
        assert path[:len(proposal)] == proposal, (b, s, shape)


def test_lookup_tree_branches_where_the_candidates_differ():
    #        0  1  2  3  4  5  6  7  8  9 10 11 12 13
    seq = [5, 1, 2, 7, 8, 9, 3, 2, 4, 1, 2, 6, 1, 2]
    buf, length = torch.tensor([seq]), torch.tensor([len(seq)])
    # "1 2" ends at 2 and 10, each a match of 2 (5 and 4 stand before them, 6 before the row's last "1 2"): the
    # latest first, "6 1", then "7 8"; each copies 2 tokens, its match's length
    tokens, parents = lookup_tree(buf, length, (2, 2, 1, 1), 2)
    assert tokens[0, :4].tolist() == [6, 7, 1, 8] and parents[0, :4].tolist() == [0, 0, 1, 2]
    assert tokens[0, 4:].eq(-1).all()
    # one child at the root: the latest's branch only
    tokens, parents = lookup_tree(buf, length, (1, 2), 2)
    assert tokens.tolist() == [[6, 1, -1]] and parents.tolist() == [[0, 1, 0]]
    # ngram 1: "2" ends at 1 (a match of 2: "3 2"), 4 and 6 (1 each): the order is 1, 6, 4, copying "9 9", "9"
    # and "4"; the second shares the first's node
    seq = [3, 2, 9, 9, 2, 4, 2, 9, 5, 3, 2]
    buf, length = torch.tensor([seq]), torch.tensor([len(seq)])
    tokens, parents = lookup_tree(buf, length, (2, 2), 1)
    assert tokens[0, :3].tolist() == [9, 4, 9] and parents[0, :3].tolist() == [0, 0, 1]
    assert tokens[0, 3:].eq(-1).all()
    assert tree_size((2, 2), 3) == 6 and tree_size((4, 4, 4), 3) == 4 + 16 + 16
    # no node deeper than the longest match counted (MATCH_CAP = 32; a longer n-gram counts that far)
    assert tree_size((1,) * 40, 3) == 32 and tree_size((1,) * 40, 35) == 35


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


@pytest.mark.parametrize("shape,ngram", [((2, 2, 1, 1), 3), ((4, 2, 2, 1, 1, 1, 1, 1), 3), ((3,), 1),
                                         ((16, 1, 1), 2)])
@pytest.mark.parametrize("prompts", ["repetitive", "random"])
def test_tree_greedy_equals_autoregressive_tiny_ragged(target, shape, ngram, prompts):
    """Prompt lookup's trees (method="tree", draft="lookup"): autoregressive decoding's tokens; the acceptance
    counts each row's tree depth as offered."""
    ps = prompt_set(prompts)
    ref = triforce.generate(target, ps, method="autoregressive", max_new_tokens=37)
    out = triforce.generate(target, ps, method="tree", draft="lookup", tree=shape, ngram=ngram, max_new_tokens=37)
    assert [t.tolist() for t in out.tokens] == [t.tolist() for t in ref.tokens]
    assert set(out.stats["acceptance"]) == {"lookup->full"} and out.stats["time_s"].keys() == {"draft", "full"}
    if prompts == "repetitive":
        assert out.stats["acceptance"]["lookup->full"] > 0 and out.stats["target_passes"] < 36


@pytest.mark.parametrize("depth", [1, 3, 6])
def test_a_chain_shaped_tree_is_the_chain(target, depth):
    """tree=(1,) * g drafts the match rule's proposal of gamma g, continued where a later candidate continues it
    past that rule's length: the same tokens as speculative decoding's chain with prompt lookup, and at depth 1
    (nothing to continue) the same passes and acceptance. (Sampled, the two draw their coins in different
    layouts; their distribution: tests/test_engines_sampling.py.)"""
    ps = repetitive_prompts()
    chain = triforce.generate(target, ps, method="speculative", draft="lookup", gamma=depth, max_new_tokens=37)
    tree = triforce.generate(target, ps, method="tree", draft="lookup", tree=(1,) * depth, max_new_tokens=37)
    assert [t.tolist() for t in tree.tokens] == [t.tolist() for t in chain.tokens]
    if depth == 1:
        assert tree.stats["target_passes"] == chain.stats["target_passes"]
        assert tree.stats["acceptance"] == chain.stats["acceptance"]


def test_tree_offers_more_where_the_occurrences_differ(target, monkeypatch):
    """Where a row's last tokens occurred before with different continuations, the tree verifies the others' too:
    wider passes, and at least as many tokens per pass as the chain over the same greedy output."""
    ps = repetitive_prompts()
    widths, forward = [], type(target).forward

    def recording_forward(self, ids, *args, **kwargs):
        widths.append(ids.shape[1])
        return forward(self, ids, *args, **kwargs)

    chain = triforce.generate(target, ps, method="speculative", draft="lookup", gamma=4, max_new_tokens=37)
    monkeypatch.setattr(type(target), "forward", recording_forward)
    tree = triforce.generate(target, ps, method="tree", draft="lookup", tree=(4, 2, 1, 1), max_new_tokens=37)
    assert max(widths) > 5  # some pass verified more than a chain of 4 drafts
    assert tree.stats["mean_accepted"] >= chain.stats["mean_accepted"]


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
    for method, opts in (("magicdec", {}), ("autoregressive", {})):
        with pytest.raises(ValueError, match="draft='lookup'"):
            triforce.generate(target, p, method=method, draft="lookup", max_new_tokens=2, **opts)
    for name in ("sink", "window"):  # a tree of lookups runs no draft model and no StreamingLLM cache
        with pytest.raises(ValueError, match=f"{name}: .*draft='lookup' runs no draft model"):
            triforce.generate(target, p, method="tree", draft="lookup", max_new_tokens=2, **{name: 8})
    with pytest.raises(ValueError, match="tree_nodes"):
        triforce.generate(target, p, method="tree", draft="lookup", tree_nodes=(2, 2), max_new_tokens=2)
    with pytest.raises(ValueError, match="draft_vocab"):
        triforce.generate(target, p, method="tree", draft="lookup", draft_vocab=8, max_new_tokens=2)
    with pytest.raises(ValueError, match="ngram"):
        triforce.generate(target, p, method="tree", ngram=2, max_new_tokens=2)
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
