"""FlashInfer as a baseline for the GPU benchmarks, where the ``flashinfer`` package imports.

- ``chain_sampler()``: FlashInfer's ``chain_speculative_sampling(draft_probs, draft_ids, target_probs)``
  (it draws its own uniforms from a generator; ours take the caller's).
- ``top_k()``: FlashInfer's radix top-k (``flashinfer.top_k``), the retrieval selection's baseline.
- ``append_attention(q, k, v, vis, causal)``: FlashInfer's batch prefill/append attention over a ragged
  KV cache (``BatchPrefillWithRaggedKVCacheWrapper``, its FA2 backend, the one that takes a custom mask):
  the T new queries of each sequence against all N keys, with either its causal mask (aligned to the end
  of the keys, as ours) or the visibility ``vis`` [B, T, N] given as a custom mask. Planned once; the
  returned callable only runs the kernel.

Each returns None, with the reason printed, where FlashInfer cannot serve (not installed, no GPU, an import
that needs a package this machine lacks). FlashInfer compiles its kernels on first use (nvcc, minutes);
``python -m bench.flashinfer_baselines`` compiles the ones the benchmarks use on tiny inputs, so a
benchmark run afterwards times kernels rather than compilers (MAX_JOBS bounds the compile's parallelism).
"""
from __future__ import annotations

import torch

_WORKSPACE_BYTES = 128 << 20  # FlashInfer's recommended split-k workspace


def _import(what: str):
    if not torch.cuda.is_available():
        return None
    try:
        import flashinfer
    except Exception as e:  # not installed, or its import needs a package this machine lacks
        print(f"flashinfer: not compared ({type(e).__name__}: {e})")
        return None
    fn = getattr(flashinfer, what, None)
    if fn is None:
        print(f"flashinfer {getattr(flashinfer, '__version__', '?')} has no {what}: not compared")
    return fn


def chain_sampler():
    """FlashInfer's ``chain_speculative_sampling`` or None."""
    return _import("chain_speculative_sampling")


def top_k():
    """FlashInfer's radix top-k, ``flashinfer.top_k(input [rows, n], k, sorted=False)`` -> (values, int64
    indices), or None. The retrieval benchmark times it as the selection's baseline: a plain top-k of the
    budget over every chunk, without our sink / recent / length rules."""
    return _import("top_k")


def append_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, vis: torch.Tensor | None,
                     causal: bool):
    """A callable running FlashInfer's append attention for q [B, T, Hq, D] against k, v [B, N, Hkv, D]
    (every sequence all N keys long): causal (``vis`` None) or with the custom mask ``vis`` [B, T, N]
    (True = visible). Output [B*T, Hq, D]. None where FlashInfer cannot serve."""
    wrapper_cls = _import("BatchPrefillWithRaggedKVCacheWrapper")
    if wrapper_cls is None:
        return None
    B, T, Hq, D = q.shape
    N, Hkv = k.shape[1], k.shape[2]
    dev = q.device
    workspace = torch.empty(_WORKSPACE_BYTES, dtype=torch.uint8, device=dev)
    wrapper = wrapper_cls(workspace, "NHD", backend="fa2")
    qo_indptr = torch.arange(B + 1, dtype=torch.int32, device=dev) * T
    kv_indptr = torch.arange(B + 1, dtype=torch.int32, device=dev) * N
    mask = None if causal else vis.reshape(-1).contiguous()  # each sequence's [T, N] rows, one after another
    wrapper.plan(qo_indptr, kv_indptr, Hq, Hkv, D, custom_mask=mask, causal=causal, q_data_type=q.dtype,
                 kv_data_type=k.dtype)
    q2, k2, v2 = q.reshape(B * T, Hq, D), k.reshape(B * N, Hkv, D), v.reshape(B * N, Hkv, D)
    return lambda: wrapper.run(q2, k2, v2)


def _warm() -> None:
    """Compile (JIT) and check the kernels the benchmarks use, on tiny inputs."""
    import time

    import triforce_kernels as tk
    from triforce_kernels.reference.verify_attention import visibility
    dev = torch.device("cuda")
    t0 = time.time()
    sampler = chain_sampler()
    if sampler is not None:
        p = torch.softmax(torch.randn(2, 5, 1000, device=dev), -1)
        q = torch.softmax(torch.randn(2, 4, 1000, device=dev), -1)
        d = torch.multinomial(q.view(-1, 1000), 1).view(2, 4).int()
        out = sampler(q, d, p)  # (output ids, accepted, emitted)
        torch.cuda.synchronize()
        print(f"chain_speculative_sampling: compiled and ran in {time.time() - t0:.0f} s, "
              f"output ids {tuple(out[0].shape)}")
    select = top_k()
    if select is not None:
        t0 = time.time()
        scores = torch.randn(16, 4096, device=dev)
        vals, idx = select(scores, 512)
        ref = torch.topk(scores, 512).values.sort(-1).values
        ok = torch.equal(vals.sort(-1).values, ref) and torch.equal(scores.gather(1, idx.long()), vals)
        print(f"top_k: compiled and ran in {time.time() - t0:.0f} s; same values as torch.topk: {ok}")
    B, N, Hq, Hkv, D, T = 2, 300, 4, 2, 128, 7
    q = torch.randn(B, T, Hq, D, device=dev, dtype=torch.bfloat16)
    k = torch.randn(B, N, Hkv, D, device=dev, dtype=torch.bfloat16)
    v = torch.randn(B, N, Hkv, D, device=dev, dtype=torch.bfloat16)
    lens = torch.full((B,), N, dtype=torch.int32, device=dev)
    tree = tk.tree_attention_mask(torch.tensor([-1] + [(t - 1) // 2 for t in range(1, T)]).expand(B, T)).to(dev)
    ours = {kind: tk.verify_attention(q, k, v, lens, mask).float() for kind, mask in (("causal", None), ("tree", tree))}
    for kind, mask in (("causal", None), ("tree", tree)):
        t0 = time.time()
        run = append_attention(q, k, v, visibility(lens, T, N, mask), causal=mask is None)
        if run is None:
            return
        out = run().view(B, T, Hq, D).float()
        errs = {other: f"{(out - o).abs().max().item():.3g}" for other, o in ours.items()}
        print(f"append attention, {kind}: compiled and ran in {time.time() - t0:.0f} s; max |FlashInfer - "
              f"verify_attention| = {errs[kind]} (against the other mask's output: {errs})")


if __name__ == "__main__":
    _warm()
