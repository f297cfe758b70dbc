"""Reference accept / reject samplers (docs/design.md 3.3): the executable spec every backend must equal.

Numerics (shared by every backend, so that the same uniforms give the same tokens):

* probabilities are *cleaned* first: ``p > 0 ? min(p, 1) : 0`` (NaN and negatives weigh 0);
* uniforms are clamped into ``[0, 1 - 2**-24]`` (NaN -> 0), so any input gives ids in ``[0, V)``;
* the accept test ``u * q(x) < p(x)`` and all sums are evaluated in float64 (the product of two
  float32 values is exact there);
* inverse CDF: the smallest ``y`` whose inclusive cumulative weight exceeds ``u * total``; weights
  all zero -> sample the (cleaned) target instead; that all zero too -> ``min(floor(u * V), V - 1)``.

Backends sum in different orders (sequential, tiled, block-wide), so they agree exactly except when
``u * total`` falls within ~1e-16 (relative) of a cumulative boundary: never seen in practice.
"""
from __future__ import annotations

import torch

ONE_MINUS_EPS = 1.0 - 2.0**-24  # the largest float32 below 1


def clean_uniforms(u: torch.Tensor) -> torch.Tensor:
    return u.float().nan_to_num(0.0).clamp(0.0, ONE_MINUS_EPS)


def clean_probs(p: torch.Tensor) -> torch.Tensor:
    """float32 probabilities -> float64 weights: NaN / negative -> 0, above 1 -> 1."""
    p = p.float()
    return torch.where(p > 0, p.clamp(max=1.0), torch.zeros_like(p)).double()


def _inverse_cdf(w: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of weights ``w`` [R, V] (float64, >= 0), coins ``u`` [R] -> (index int64 [R], total [R])."""
    V = w.shape[-1]
    total = w.sum(-1)
    thr = u.double() * total
    idx = (w.cumsum(-1) <= thr[:, None]).sum(-1)  # cum is non-decreasing: = first y with cum > thr
    last_positive = (V - 1) - (w > 0).flip(-1).int().argmax(-1)  # only if rounding left none above
    return torch.where(idx < V, idx, last_positive), total


def sample_weights(w: torch.Tensor, p: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF sample of residual weights ``w``; falls back to ``p``, then to ``floor(u * V)``."""
    V = w.shape[-1]
    x_w, total_w = _inverse_cdf(w, u)
    x_p, total_p = _inverse_cdf(p, u)
    x_u = (u.double() * V).long().clamp(max=V - 1)
    return torch.where(total_w > 0, x_w, torch.where(total_p > 0, x_p, x_u))


def argmax_lowest(logits: torch.Tensor) -> torch.Tensor:
    """argmax over the last dim, ties -> lowest index, NaN counts as -inf (all NaN/-inf -> 0)."""
    x = logits.float()
    return torch.where(x.isnan(), torch.full_like(x, float("-inf")), x).argmax(-1)


def logits_to_probs(logits, temperature=1.0, top_k=None, top_p=None):
    """See :func:`triforce_kernels.logits_to_probs` for the semantics."""
    x = logits.float()
    if temperature == 0:
        return torch.nn.functional.one_hot(argmax_lowest(x), x.shape[-1]).float()
    # A copy (also of a float32 input) in which NaN counts as -inf, as in the argmax.
    x = torch.nan_to_num(x, nan=float("-inf"), posinf=float("inf"), neginf=float("-inf"))
    # top-k on the logits: dividing by a positive temperature keeps their order
    if top_k is not None and top_k < x.shape[-1]:
        kth = x.topk(top_k, dim=-1).values[..., -1:]
        x.masked_fill_(x < kth, float("-inf"))  # ties with the k-th value are kept
    # Shift by the row max m before dividing, so that no finite logit overflows (x / temperature
    # would for large logits or a tiny temperature), in place. m = +inf: the +inf logits become
    # inf - inf = NaN, then 0, and every other logit -inf: they share the mass equally, the
    # softmax's limit. m = -inf (nothing above -inf): the row becomes NaN (no distribution),
    # by dividing it by NaN after the NaN -> 0 step.
    m = x.amax(-1, keepdim=True)
    x.sub_(m).nan_to_num_(nan=0.0, posinf=float("inf"), neginf=float("-inf"))
    x.div_(torch.where(m == float("-inf"), float("nan"), temperature))
    probs = torch.softmax(x, dim=-1)
    if top_p is not None and top_p < 1.0:
        s = probs.sort(dim=-1, descending=True).values
        before = s.cumsum(-1) - s  # mass strictly before each sorted position
        # number of kept sorted positions m >= 1: positions whose preceding mass is < top_p
        m = (before < top_p).sum(-1, keepdim=True).clamp(min=1)
        cutoff = s.gather(-1, m - 1)
        probs = probs.masked_fill(probs < cutoff, 0.0)  # ties with the cut-off value are kept
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def chain_speculative_sample(draft_tokens, draft_probs, target_probs, uniforms):
    """Batched over rows, sequential over the n draft positions."""
    B, n = draft_tokens.shape
    V = target_probs.shape[-1]
    dev = target_probs.device
    u = clean_uniforms(uniforms)
    tokens = torch.full((B, n + 1), -1, dtype=torch.int64, device=dev)
    num = torch.zeros(B, dtype=torch.int64, device=dev)
    active = torch.ones(B, dtype=torch.bool, device=dev)
    for i in range(n):
        p = clean_probs(target_probs[:, i])
        x = draft_tokens[:, i].long()
        in_range = (x >= 0) & (x < V)
        xs = x.clamp(0, V - 1)[:, None]
        px = p.gather(1, xs)[:, 0]
        if draft_probs is None:  # one-hot draft: q(x) = 1, residual = p without x
            qx = torch.ones_like(px)
            w = torch.where(in_range[:, None], p.scatter(1, xs, 0.0), p)
        else:
            q = clean_probs(draft_probs[:, i])
            qx = q.gather(1, xs)[:, 0]
            w = (p - q).clamp(min=0.0)
        accept = in_range & (u[:, i, 0].double() * qx < px)
        y = sample_weights(w, p, u[:, i, 1])
        tokens[:, i] = torch.where(active, torch.where(accept, x, y), tokens[:, i])
        num += (active & accept).long()
        active &= accept
    p = clean_probs(target_probs[:, n])
    tokens[:, n] = torch.where(active, sample_weights(p, p, u[:, n, 1]), tokens[:, n])
    return tokens, num.int()


def chain_greedy_verify(draft_tokens, target_logits):
    B, n = draft_tokens.shape
    g = argmax_lowest(target_logits)  # [B, n+1]
    match = draft_tokens.long() == g[:, :n]
    num = match.int().cumprod(-1).sum(-1)  # leading matches
    pos = torch.arange(n + 1, device=g.device)
    tokens = torch.where(pos[None] < num[:, None], g, torch.full_like(g, -1))
    tokens.scatter_(1, num[:, None].long(), g.gather(1, num[:, None].long()))
    return tokens, num.int()


def tree_speculative_sample(tree_tokens, parents, draft_probs, target_probs, uniforms):
    """Row by row, node by node: SpecInfer's multi-draft recursive rejection sampling.

    At node ``cur`` with target ``p`` and draft ``q`` the residual after rejecting k i.i.d. children
    is ``max(p - c_k q, 0)`` (unnormalised) with ``c_0 = 0``, ``c_{k+1} = c_k + W_k`` and
    ``W_k`` its normalising sum (``W_0 = 1``: ``p`` is a distribution), which equals SpecInfer's
    ``normalize(max(r_k - q, 0))`` recursion. A child with token x is accepted iff
    ``u * q(x) * W_k < max(p(x) - c_k q(x), 0)``, i.e. ``u < r_k(x) / q(x)``. Deterministic children
    (``draft_probs`` None, one-hot ``q``): the residual is ``p`` without the rejected tokens,
    ``W <- max(W - w(x), 0)``.
    """
    B, T = tree_tokens.shape
    V = target_probs.shape[-1]
    dev = target_probs.device
    u = clean_uniforms(uniforms).cpu().double()
    toks, par = tree_tokens.long().cpu(), parents.long().cpu()
    path = torch.full((B, T), -1, dtype=torch.int32)
    tokens = torch.full((B, T), -1, dtype=torch.int64)
    num = torch.zeros(B, dtype=torch.int32)
    for b in range(B):
        cur, depth = 0, 0
        path[b, 0] = 0
        while True:
            p = clean_probs(target_probs[b, cur]).cpu()
            q = None if draft_probs is None else clean_probs(draft_probs[b, cur]).cpu()
            c, W = 0.0, 1.0
            removed = torch.zeros(V, dtype=torch.bool)
            accepted = None
            for ch in range(cur + 1, T):
                if par[b, ch] != cur:
                    continue
                x = int(toks[b, ch])
                in_range = 0 <= x < V
                w = (p - c * q).clamp(min=0.0) if q is not None else p.masked_fill(removed, 0.0)
                qx = float(q[x]) if (q is not None and in_range) else 1.0
                if in_range and float(u[b, ch, 0]) * qx * W < float(w[x]):
                    accepted = (ch, x)
                    break
                if q is not None:
                    c = c + W
                    W = float((p - c * q).clamp(min=0.0).sum())
                elif in_range:
                    W = max(W - float(w[x]), 0.0)
                    removed[x] = True
            if accepted is None:
                w = (p - c * q).clamp(min=0.0) if q is not None else p.masked_fill(removed, 0.0)
                tokens[b, depth] = int(sample_weights(w[None], p[None], u[b, cur, 1:2].float())[0])
                break
            cur, x = accepted
            tokens[b, depth] = x
            depth += 1
            path[b, depth] = cur
        num[b] = depth
    return path.to(dev), tokens.to(dev), num.to(dev)


def tree_greedy_verify(tree_tokens, parents, target_logits):
    B, T = tree_tokens.shape
    dev = target_logits.device
    g = argmax_lowest(target_logits).cpu()  # [B, T]
    toks, par = tree_tokens.long().cpu(), parents.long().cpu()
    path = torch.full((B, T), -1, dtype=torch.int32)
    tokens = torch.full((B, T), -1, dtype=torch.int64)
    num = torch.zeros(B, dtype=torch.int32)
    for b in range(B):
        cur, depth = 0, 0
        path[b, 0] = 0
        while True:
            nxt = next((ch for ch in range(cur + 1, T) if par[b, ch] == cur and toks[b, ch] == g[b, cur]), None)
            tokens[b, depth] = g[b, cur]
            if nxt is None:
                break
            depth += 1
            cur = nxt
            path[b, depth] = cur
        num[b] = depth
    return path.to(dev), tokens.to(dev), num.to(dev)
