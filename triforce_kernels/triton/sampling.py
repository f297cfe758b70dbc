"""Triton accept / reject samplers: one program per batch row walks the tree (a chain is the tree
whose node t has parent t - 1), every pass over the vocabulary tiled by BLOCK. Same float64
numerics as the reference (see reference/sampling.py), so the same uniforms give the same tokens.
On a GPU, Triton may contract ``p - c * q`` into an FMA (last-bit differences in the tree's
residual after two or more rejections at one node); the C++/CUDA backend does not."""
import torch
import triton
import triton.language as tl

from .._backend import register

BIG = tl.constexpr(2**62)  # a global read inside a kernel must be a constexpr (the interpreter does not check)


@triton.jit
def _clean(x):
    return tl.where(x > 0, tl.minimum(x, 1.0), 0.0).to(tl.float64)


@triton.jit
def _parent(par_b, ch, IS_CHAIN: tl.constexpr):
    if IS_CHAIN:
        res = ch - 1
    else:
        res = tl.load(par_b + ch).to(tl.int64)
    return res


@triton.jit
def _token(tok_b, ch, IS_CHAIN: tl.constexpr):
    if IS_CHAIN:
        res = tl.load(tok_b + ch - 1).to(tl.int64)  # chain: node ch is draft ch - 1
    else:
        res = tl.load(tok_b + ch).to(tl.int64)
    return res


@triton.jit
def _weights(p_row, q_row, offs, V, c, tok_b, par_b, cur, limit,
             HAS_Q: tl.constexpr, IS_CHAIN: tl.constexpr):
    """Residual weights at ``offs``: max(p - c q, 0), or p without the tokens of the children
    ``cur+1 .. limit-1`` of ``cur`` (all rejected) for deterministic drafts."""
    m = offs < V
    p = _clean(tl.load(p_row + offs, mask=m, other=0.0))
    if HAS_Q:
        # c == 0 (no rejection yet): the residual is p; q is not read (a chain has no q row after
        # its last draft)
        q = _clean(tl.load(q_row + offs, mask=tl.where(c != 0, offs, V) < V, other=0.0))
        w = p - c * q
        w = tl.where(w > 0, w, 0.0)
    else:
        w = p
        for c2 in range(cur + 1, limit):
            x2 = _token(tok_b, c2, IS_CHAIN)
            hit = (_parent(par_b, c2, IS_CHAIN) == cur) & (x2 >= 0) & (x2 < V)
            w = tl.where(hit & (offs == x2), 0.0, w)
    return tl.where(m, w, 0.0)


@triton.jit
def _total(p_row, q_row, V, c, tok_b, par_b, cur, limit,
           HAS_Q: tl.constexpr, IS_CHAIN: tl.constexpr, BLOCK: tl.constexpr):
    acc = tl.zeros((BLOCK,), dtype=tl.float64)
    for base in range(0, V, BLOCK):
        acc += _weights(p_row, q_row, base + tl.arange(0, BLOCK), V, c, tok_b, par_b, cur, limit, HAS_Q, IS_CHAIN)
    return tl.sum(acc, axis=0)


@triton.jit
def _inverse_cdf(p_row, q_row, V, c, u, tok_b, par_b, cur, limit,
                 HAS_Q: tl.constexpr, IS_CHAIN: tl.constexpr, BLOCK: tl.constexpr):
    """Smallest y with cum(y) > u * total, or -1 when total == 0."""
    total = _total(p_row, q_row, V, c, tok_b, par_b, cur, limit, HAS_Q, IS_CHAIN, BLOCK)
    thr = u.to(tl.float64) * total
    carry = total * 0.0
    result = (total * 0).to(tl.int64) - 1
    last = result
    base = 0
    while (base < V) & (result < 0) & (total > 0):
        offs = base + tl.arange(0, BLOCK)
        w = _weights(p_row, q_row, offs, V, c, tok_b, par_b, cur, limit, HAS_Q, IS_CHAIN)
        cum = carry + tl.cumsum(w, axis=0)
        first = tl.min(tl.where((w > 0) & (cum > thr), offs.to(tl.int64), BIG), axis=0)
        result = tl.where(first < BIG, first, result)
        last = tl.maximum(last, tl.max(tl.where(w > 0, offs.to(tl.int64), -1), axis=0))
        carry += tl.sum(w, axis=0)
        base += BLOCK
    return tl.where((result < 0) & (total > 0), last, result)


@triton.jit
def _sample(p_row, q_row, V, c, u, tok_b, par_b, cur, limit,
            HAS_Q: tl.constexpr, IS_CHAIN: tl.constexpr, BLOCK: tl.constexpr):
    y = _inverse_cdf(p_row, q_row, V, c, u, tok_b, par_b, cur, limit, HAS_Q, IS_CHAIN, BLOCK)
    if y < 0:  # all-zero residual: the target itself (c = 0, nothing removed)
        y = _inverse_cdf(p_row, q_row, V, c * 0.0, u, tok_b, par_b, cur, cur + 1, HAS_Q, IS_CHAIN, BLOCK)
    if y < 0:  # all-zero / NaN target: still a valid id
        y = tl.minimum((u.to(tl.float64) * V).to(tl.int64), V - 1)
    return y


@triton.jit
def _clean_u(u):
    return tl.where(u >= 0, tl.minimum(u, 0.99999994), 0.0)  # 1 - 2^-24: the largest float below 1


# T is never specialised to a constant: with T == 1 (a chain of n = 0 drafts) Triton 3.6's LLVM lowering
# of this kernel fails an assertion (found by `python -m triforce_kernels compile-check`; 3.9 compiles it).
@triton.jit(do_not_specialize=["T"])
def _tree_sample_kernel(tok_ptr, par_ptr, q_ptr, p_ptr, u_ptr, path_ptr, out_ptr, num_ptr, T, V,
                        stride_tok, stride_par, stride_qb, stride_qt, stride_pb, stride_pt, stride_ub, stride_ut,
                        HAS_Q: tl.constexpr, IS_CHAIN: tl.constexpr, BLOCK: tl.constexpr, TBLOCK: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    tok_b = tok_ptr + b * stride_tok
    par_b = par_ptr + b * stride_par
    u_b = u_ptr + b * stride_ub
    offs_t = tl.arange(0, TBLOCK)
    tl.store(out_ptr + b * T + offs_t, tl.full((TBLOCK,), -1, tl.int64), mask=offs_t < T)
    if not IS_CHAIN:
        tl.store(path_ptr + b * T + offs_t, tl.where(offs_t == 0, 0, -1).to(tl.int32), mask=offs_t < T)
    cur = b * 0
    depth = b * 0
    walking = cur == 0
    while walking:
        p_row = p_ptr + b * stride_pb + cur * stride_pt
        q_row = q_ptr + b * stride_qb + cur * stride_qt
        c = tl.zeros((), dtype=tl.float64)
        W = tl.zeros((), dtype=tl.float64) + 1.0
        nxt = cur * 0 - 1
        for ch in range(cur + 1, T):
            if nxt < 0:
                if _parent(par_b, ch, IS_CHAIN) == cur:
                    x = _token(tok_b, ch, IS_CHAIN)
                    ok = (x >= 0) & (x < V)
                    xs = tl.where(ok, x, 0)
                    wx = tl.sum(_weights(p_row, q_row, xs + tl.arange(0, 1), V, c, tok_b, par_b, cur, ch,
                                         HAS_Q, IS_CHAIN), axis=0)
                    if HAS_Q:
                        qx = _clean(tl.load(q_row + xs))
                    else:
                        qx = tl.zeros((), dtype=tl.float64) + 1.0
                    if IS_CHAIN:
                        uc = _clean_u(tl.load(u_b + (ch - 1) * stride_ut))
                    else:
                        uc = _clean_u(tl.load(u_b + ch * stride_ut))
                    if ok & (uc.to(tl.float64) * qx * W < wx):
                        nxt = ch
                    else:
                        if HAS_Q:
                            c = c + W
                            W = _total(p_row, q_row, V, c, tok_b, par_b, cur, ch + 1, HAS_Q, IS_CHAIN, BLOCK)
                        else:
                            if ok:
                                W = tl.where(W - wx > 0, W - wx, 0.0)
        if nxt < 0:
            ur = _clean_u(tl.load(u_b + cur * stride_ut + 1))
            y = _sample(p_row, q_row, V, c, ur, tok_b, par_b, cur, T, HAS_Q, IS_CHAIN, BLOCK)
            tl.store(out_ptr + b * T + depth, y)
            tl.store(num_ptr + b, depth.to(tl.int32))
            walking = cur < 0
        else:
            tl.store(out_ptr + b * T + depth, _token(tok_b, nxt, IS_CHAIN))
            cur = nxt
            depth += 1
            if not IS_CHAIN:
                tl.store(path_ptr + b * T + depth, cur.to(tl.int32))


@triton.jit
def _tree_greedy_kernel(tok_ptr, par_ptr, x_ptr, path_ptr, out_ptr, num_ptr, T, V,
                        stride_tok, stride_par, stride_xb, stride_xt,
                        IS_CHAIN: tl.constexpr, BLOCK: tl.constexpr, TBLOCK: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    tok_b = tok_ptr + b * stride_tok
    par_b = par_ptr + b * stride_par
    offs_t = tl.arange(0, TBLOCK)
    tl.store(out_ptr + b * T + offs_t, tl.full((TBLOCK,), -1, tl.int64), mask=offs_t < T)
    if not IS_CHAIN:
        tl.store(path_ptr + b * T + offs_t, tl.where(offs_t == 0, 0, -1).to(tl.int32), mask=offs_t < T)
    cur = b * 0
    depth = b * 0
    walking = cur == 0
    while walking:
        row = x_ptr + b * stride_xb + cur * stride_xt
        best = tl.zeros((), dtype=tl.float32) - float("inf")
        g = cur * 0
        for base in range(0, V, BLOCK):  # argmax, ties -> lowest index, NaN as -inf
            offs = base + tl.arange(0, BLOCK)
            v = tl.load(row + offs, mask=offs < V, other=float("-inf")).to(tl.float32)
            v = tl.where(v == v, v, float("-inf"))
            tmax = tl.max(v, axis=0)
            targ = tl.min(tl.where(v == tmax, offs.to(tl.int64), BIG), axis=0)
            upd = tmax > best
            g = tl.where(upd, targ, g)
            best = tl.where(upd, tmax, best)
        tl.store(out_ptr + b * T + depth, g)
        nxt = cur * 0 - 1
        for ch in range(cur + 1, T):
            if nxt < 0:
                if (_parent(par_b, ch, IS_CHAIN) == cur) & (_token(tok_b, ch, IS_CHAIN) == g):
                    nxt = ch
        if nxt < 0:
            tl.store(num_ptr + b, depth.to(tl.int32))
            walking = cur < 0
        else:
            cur = nxt
            depth += 1
            if not IS_CHAIN:
                tl.store(path_ptr + b * T + depth, cur.to(tl.int32))


def _block(V):
    return min(1024, triton.next_power_of_2(V))


def _launch_sample(tokens, parents, draft_probs, target_probs, uniforms, is_chain):
    B = tokens.shape[0]
    T, V = target_probs.shape[1], target_probs.shape[2]
    dev = target_probs.device
    p, u = target_probs.contiguous(), uniforms.contiguous()
    q = p if draft_probs is None else draft_probs.contiguous()
    par = tokens if parents is None else parents
    path = torch.empty((B, T), dtype=torch.int32, device=dev)
    out = torch.empty((B, T), dtype=torch.int64, device=dev)
    num = torch.empty((B,), dtype=torch.int32, device=dev)
    if B:
        _tree_sample_kernel[(B,)](
            tokens, par, q, p, u, path, out, num, T, V, tokens.stride(0), par.stride(0), q.stride(0), q.stride(1),
            p.stride(0), p.stride(1), u.stride(0), u.stride(1),
            HAS_Q=draft_probs is not None, IS_CHAIN=is_chain, BLOCK=_block(V), TBLOCK=triton.next_power_of_2(T))
    return path, out, num


def _launch_greedy(tokens, parents, logits, is_chain):
    B = tokens.shape[0]
    T, V = logits.shape[1], logits.shape[2]
    dev = logits.device
    par = tokens if parents is None else parents
    path = torch.empty((B, T), dtype=torch.int32, device=dev)
    out = torch.empty((B, T), dtype=torch.int64, device=dev)
    num = torch.empty((B,), dtype=torch.int32, device=dev)
    if B:
        _tree_greedy_kernel[(B,)](tokens, par, logits, path, out, num, T, V, tokens.stride(0), par.stride(0),
                                  logits.stride(0), logits.stride(1), IS_CHAIN=is_chain, BLOCK=_block(V),
                                  TBLOCK=triton.next_power_of_2(T))
    return path, out, num


@register("chain_speculative_sample", "triton")
def chain_speculative_sample(draft_tokens, draft_probs, target_probs, uniforms):
    _, out, num = _launch_sample(draft_tokens.contiguous(), None, draft_probs, target_probs, uniforms, True)
    return out, num


@register("tree_speculative_sample", "triton")
def tree_speculative_sample(tree_tokens, parents, draft_probs, target_probs, uniforms):
    return _launch_sample(tree_tokens.contiguous(), parents.contiguous(), draft_probs, target_probs, uniforms, False)


@register("chain_greedy_verify", "triton")
def chain_greedy_verify(draft_tokens, target_logits):
    _, out, num = _launch_greedy(draft_tokens.contiguous(), None, target_logits.contiguous(), True)
    return out, num


@register("tree_greedy_verify", "triton")
def tree_greedy_verify(tree_tokens, parents, target_logits):
    return _launch_greedy(tree_tokens.contiguous(), parents.contiguous(), target_logits.contiguous(), False)
