"""Sampled output of every speculative method has exactly the target's distribution (chi-square on
a tiny random-weight model: vocabulary 16, thousands of independent rows in one batch), and
TriForce's middle level needs the residual (the same test fails if it samples from p)."""
import numpy as np
import pytest
import torch
from scipy import stats as st

import triforce
import triforce_kernels as tk
from triforce.engines import triforce as triforce_engine
from triforce.models import Llama, LlamaConfig
from triforce.models.quant import int8_copy

V, N, P = 16, 1500, 24
TEMP = 1.0


def tiny(seed, layers=2):
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      initializer_range=0.3)
    return Llama(cfg).eval()


@pytest.fixture(scope="module")
def models():
    target, draft = tiny(0), tiny(1)
    prompt = torch.randint(0, V, (P,), generator=torch.Generator().manual_seed(2))
    # exact target distribution of (t1, t2) and of t3, by plain forwards over every prefix
    with torch.no_grad():
        p1 = tk.logits_to_probs(target(prompt[None])[0, -1], TEMP)  # [V]
        ctx = torch.cat([prompt.expand(V, P), torch.arange(V)[:, None]], 1)
        p2 = tk.logits_to_probs(target(ctx)[:, -1], TEMP)  # [V(t1), V]
        ctx2 = torch.cat([ctx.repeat_interleave(V, 0), torch.arange(V).repeat(V)[:, None]], 1)
        p3 = tk.logits_to_probs(target(ctx2)[:, -1], TEMP).view(V, V, V)
    joint12 = (p1[:, None] * p2).double()
    marg3 = (joint12[:, :, None] * p3.double()).sum((0, 1))
    return target, draft, prompt, joint12.numpy(), marg3.numpy()


def chi2_pvalue(observed: np.ndarray, probs: np.ndarray) -> float:
    probs = probs.ravel() / probs.sum()
    observed, expected = observed.ravel().astype(float), probs * observed.sum()
    big = expected >= 5  # merge cells expected below 5 into one
    obs = np.append(observed[big], observed[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    keep = exp > 0
    assert obs[~keep].sum() == 0, "a token of zero target probability was emitted"
    return st.chisquare(obs[keep], exp[keep]).pvalue


def run(models, method, draft=None, **opts):
    """``draft="int8"``: the int8 copy of the target drafts; ``"lookup"``: prompt lookup; else the other tiny
    model, for the methods that take a draft model by default."""
    target, other, prompt, joint12, marg3 = models
    if draft == "int8":
        draft = int8_copy(target)
    elif draft is None and method in ("speculative", "triforce"):
        draft = other
    out = triforce.generate(target, prompt.expand(N, P), method=method, max_new_tokens=3, temperature=TEMP,
                            seed=123, draft=draft, **opts)
    t = torch.stack(out.tokens).numpy()
    c12 = np.zeros((V, V))
    np.add.at(c12, (t[:, 0], t[:, 1]), 1)
    return chi2_pvalue(c12, joint12), chi2_pvalue(np.bincount(t[:, 2], minlength=V), marg3), out.stats


CASES = {
    "speculative": {"gamma": 3},
    "speculative-lookup": {"gamma": 3, "draft": "lookup"},
    "magicdec": {"gamma": 3, "sink": 1, "window": 6},
    "magicdec-retrieval": {"gamma": 3, "draft_cache": "retrieval", "budget": 12, "chunk_size": 4},
    "magicdec-retrieval-int8": {"gamma": 3, "draft_cache": "retrieval", "budget": 12, "chunk_size": 4, "draft": "int8"},
    "triforce": {"gamma1": 2, "gamma2": 3, "budget": 12, "chunk_size": 4, "sink": 1, "window": 10},
    "triforce-lookup": {"gamma1": 2, "gamma2": 3, "budget": 12, "chunk_size": 4, "draft": "lookup"},
    "tree": {"tree": (2, 2, 1), "sink": 1, "window": 16},
    "tree-lookup": {"tree": (3, 2, 1), "draft": "lookup"},
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_sampled_distribution_equals_target(models, case):
    p12, p3, stats = run(models, case.split("-")[0], **CASES[case])
    assert p12 > 1e-3 and p3 > 1e-3, (p12, p3, stats["acceptance"])
    assert all(a > 0 for a in stats["acceptance"].values()), stats["acceptance"]  # the drafts were tested


def test_triforce_middle_level_needs_the_residual(models, monkeypatch):
    """Emulate the reference implementation's bug (on a middle rejection, sample p instead of the
    residual max(p - q, 0)): the emitted distribution must then be detectably wrong."""
    def buggy(sampling, draft_tokens, draft_probs, logits):
        tokens, num, probs = sampling.verify_chain(draft_tokens, draft_probs, logits)
        rejected = num < draft_tokens.shape[1]
        redraw = torch.multinomial(probs[torch.arange(len(num)), num.long()], 1, generator=sampling.generator)[:, 0]
        tokens = tokens.clone()
        rows = torch.arange(len(num))
        tokens[rows, num.long()] = torch.where(rejected, redraw, tokens[rows, num.long()])
        return tokens, num, probs

    # budget = the whole prompt: the retrieval level equals the full level, so the full level
    # accepts whatever the middle emits and cannot mask a wrong middle distribution
    opts = {**CASES["triforce"], "budget": P}
    p12, p3, _ = run(models, "triforce", **opts)
    assert p12 > 1e-3 and p3 > 1e-3, (p12, p3)
    monkeypatch.setattr(triforce_engine, "_verify_middle", buggy)
    p12, p3, _ = run(models, "triforce", **opts)
    assert min(p12, p3) < 1e-6, (p12, p3)
