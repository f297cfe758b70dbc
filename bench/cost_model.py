"""The standard speculative-decoding cost model, with the tokens of a chain accepted independently.

A draft token is accepted with probability ``a`` (the per-token acceptance), independently of the others.
A chain of ``g`` drafts then yields ``expected_tokens(a, g) = 1 + a + ... + a^g`` tokens per verification
(the accepted drafts and the verifier's own token), and the engines' measured rate (accepted / offered
drafts, ``Stats.acceptance``) is ``chain_acceptance(a, g) = (a + ... + a^g) / g``; ``per_token_acceptance``
inverts that. The speed-ups are tokens per unit time over an autoregressive step's one token.
"""
from __future__ import annotations


def expected_tokens(a: float, g: int) -> float:
    """``1 + a + ... + a^g``: tokens one verification of ``g`` drafts yields."""
    return sum(a ** i for i in range(g + 1))


def chain_acceptance(a: float, g: int) -> float:
    """``(a + ... + a^g) / g``: the fraction of ``g`` offered drafts accepted, on average."""
    return (expected_tokens(a, g) - 1) / g


def per_token_acceptance(rate: float, g: int) -> float:
    """The ``a`` whose ``chain_acceptance(a, g)`` is ``rate`` (in [0, 1]; increasing in ``a``, so bisection)."""
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"rate must be in [0, 1], got {rate!r}")
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if chain_acceptance(mid, g) < rate else (lo, mid)
    return (lo + hi) / 2


def speculative_speedup(a: float, g: int, draft_step: float, verify: float, step: float) -> float:
    """One level: ``g`` draft steps and one verification of ``g + 1`` tokens (time ``verify``) per round."""
    return expected_tokens(a, g) * step / (g * draft_step + verify)


def triforce_speedup(a1: float, a2: float, g1: int, g2: int, draft_step: float, middle: float, full: float,
                     step: float, rebuild: float = 0.0) -> float:
    """TriForce's two levels. The middle level runs blocks of ``g1`` draft steps and one retrieval-cache
    verification of ``g1 + 1`` tokens (time ``middle``), each yielding ``expected_tokens(a1, g1)`` tokens,
    until it holds ``g2`` (``g2 / expected_tokens(a1, g1)`` blocks, the mean); the full cache then verifies
    them in one pass of ``g2 + 1`` tokens (time ``full``), which yields ``expected_tokens(a2, g2)``.
    ``rebuild``: the retrieval cache's re-selection, per emitted token (its time over the tokens between
    two rebuilds)."""
    blocks = g2 / expected_tokens(a1, g1)
    tokens = expected_tokens(a2, g2)
    return tokens * step / (blocks * (g1 * draft_step + middle) + full + tokens * rebuild)
