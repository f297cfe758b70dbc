"""Benchmark of DeepSeek's multi-head latent attention (triforce.models.llama.LatentAttention) at a decode step and a
verification pass over a long context, against transformers' DeepseekV2Attention on the same weights and cache.

Both caches hold the compressed latent (kv_lora_rank 512 + a RoPE'd key of 64 per token, shared by the heads). Ours
attends over it absorbed: each head's query is ``[q_pe, W_UK^T q_nope]`` (576 wide), the values are the cached keys
themselves, and ``W_UV`` maps each head's weighted sum of latents back; so a step reads the cache once per layer
(``tk.verify_attention``, one KV head, the 16 heads a group). transformers expands the whole cache into per-head keys
and values at every step (``kv_b_proj`` over every cached latent: 512 x 4096 multiply-adds a token), then attends:
its step grows with the context in arithmetic, not only in bytes.

Shape: DeepSeek-V2-Lite's attention (hidden 2048, 16 heads, qk 128 + 64, v 128, kv_lora_rank 512, q_lora_rank none),
one layer (a 1-layer model with a tiny vocabulary and MLP, so the attention dominates), random weights; batch 1;
contexts 1K and 4K (``--quick``: 1K); T = 1 (a decode step) and 5 (verifying 4 drafts); float32 and bfloat16.
The outputs are checked against each other first (the same latents in both caches). Bytes: the latent cache (576
values a token, once: our cache's values are its keys) and the layer's weights. FLOPs: the
projections' and the attention's (4 x 576 per head and visible key): at T = 5 a 16-head layer's attention does ~40
FLOPs a cached byte, so the CPU's step is compute-bound there (the roof column: the binding ceiling of the two,
each measured in the same run).

    python -m bench.bench_mla [--quick]
"""
from __future__ import annotations

import argparse

import torch

from .harness import compute_peak, copy_bandwidth, measure_alternating, record

HIDDEN, HEADS, NOPE, ROPE, V, RANK = 2048, 16, 128, 64, 128, 512


def _pair(dtype: torch.dtype):
    """transformers' 1-layer DeepseekV2ForCausalLM of V2-Lite's attention shape (random weights, drawn in float32:
    the same in every dtype) and ours on its weights, in ``dtype``."""
    import transformers
    from triforce.models import LlamaConfig
    from triforce.models.loading import _build

    torch.manual_seed(0)
    config = transformers.DeepseekV2Config(
        vocab_size=256, hidden_size=HIDDEN, intermediate_size=64, num_hidden_layers=1, num_attention_heads=HEADS,
        num_key_value_heads=HEADS, kv_lora_rank=RANK, q_lora_rank=None, qk_nope_head_dim=NOPE, qk_rope_head_dim=ROPE,
        v_head_dim=V, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=64, first_k_dense_replace=1,
        max_position_embeddings=16384, attn_implementation="sdpa")
    hf = transformers.DeepseekV2ForCausalLM(config).eval()
    ours = _build(LlamaConfig.from_dict(hf.config.to_dict()), hf.state_dict(), None, None)
    return hf.to(dtype), ours.to(dtype)


def _caches(hf, ours, N: int, T: int, dtype: torch.dtype, values: torch.dtype):
    """transformers' DynamicCache and our FullCache in ``dtype`` holding the same ``N`` random latents, rounded to
    ``values`` (each RoPE'd key in the checkpoint's adjacent-pair order there, half-split here)."""
    from transformers import DynamicCache

    from triforce.models import FullCache

    g = torch.Generator().manual_seed(1)
    c = torch.randn(1, N, RANK, generator=g).to(values).to(dtype)
    pe = torch.randn(1, N, ROPE, generator=g).to(values).to(dtype)
    theirs = DynamicCache(config=hf.config)
    theirs.update(c[:, None], pe[:, None], 0)
    cache = FullCache(ours.config, 1, N + T, dtype=dtype)
    pairs = torch.tensor([*range(0, ROPE, 2), *range(1, ROPE, 2)])
    layout = ours.model.layers[0].self_attn.slots(torch.device("cpu"))[1]
    latent = torch.cat([pe[..., pairs], c], -1).index_select(-1, layout)[:, :, None]
    cache.k[0][:, :N] = latent
    cache.v[0][:, :N] = latent
    cache.lengths.fill_(N)
    cache._bound = N
    return theirs, cache


def _steps(hf, ours, N: int, T: int, dtype: torch.dtype, values: torch.dtype | None = None):
    """One forward of ``T`` tokens after ``N`` cached ones (their latents rounded to ``values``), for each model (each
    leaving its cache as it was)."""
    theirs, cache = _caches(hf, ours, N, T, dtype, values or dtype)
    ids = torch.randint(0, 256, (1, T), generator=torch.Generator().manual_seed(2))
    pos = torch.arange(N, N + T)[None]
    mask = torch.ones(T, N + T, dtype=torch.bool).tril(N)[None, None]  # (T = 1: every key)

    def step_ours():
        with torch.no_grad():
            out = ours(ids, cache=cache)
        cache.rollback(torch.full((1,), N, dtype=torch.int32))
        return out

    def step_theirs():
        with torch.no_grad():
            out = hf(ids, past_key_values=theirs, position_ids=pos, attention_mask=None if T == 1 else mask).logits
        theirs.crop(-T)
        return out
    return step_ours, step_theirs


def bench(N: int, T: int, dtype: torch.dtype, models: dict, reps: int) -> None:
    """``models``: dtype -> (transformers', ours); float32's are the reference of a 16-bit check: ours is within
    twice transformers' own distance from it (the two round differently: transformers the expanded keys, ours the
    absorbed queries)."""
    hf, ours = models[dtype]
    step_ours, step_theirs = _steps(hf, ours, N, T, dtype)
    a, b = step_ours().float(), step_theirs().float()
    err, scale = (a - b).abs().max().item(), b.abs().max().item()
    if dtype == torch.float32:
        assert err <= 1e-4 * scale, (err, scale)
    else:
        ref = _steps(*models[torch.float32], N, T, torch.float32, dtype)[0]()  # (the same latents)
        mine, theirs = (a - ref).abs().max().item(), (b - ref).abs().max().item()
        assert mine <= 2 * theirs + 1e-3 * scale, (mine, theirs, scale)
    es = torch.finfo(dtype).bits // 8
    att = ours.model.layers[0].self_attn
    weights = sum(p.numel() for p in att.parameters()) * es
    latents = N * (RANK + ROPE) * es
    nbytes = latents + weights  # (the values are the keys: v[0] is k[0])
    # multiply-adds: the projections' (every weight once per token) and the attention's (each head's query against
    # every key it sees, and the weighted sum of those keys: 576 wide)
    keys = T * N + T * (T + 1) // 2
    flops = 2 * T * weights // es + 4 * HEADS * (RANK + ROPE) * keys
    t = measure_alternating({"transformers": step_theirs, "cpu": step_ours}, reps=reps, warmup=2)
    bw, peak, dt = copy_bandwidth("cpu"), compute_peak("cpu", dtype), str(dtype).replace("torch.", "")
    shape = f"model=deepseek-v2-lite-attention,B=1,N={N},T={T}"
    record(family="model", op="mla_step", backend="transformers", shape=shape, dtype=dt, bytes_moved=nbytes,
           timing=t["transformers"], bandwidth=bw, device="cpu", flops=flops, peak=peak)
    record(family="model", op="mla_step", backend="cpu", shape=shape, dtype=dt, bytes_moved=nbytes,
           timing=t["cpu"], bandwidth=bw, device="cpu", baseline="transformers", baseline_timing=t["transformers"],
           flops=flops, peak=peak, extra=f"max_err={err:.2e}")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="context 1K only, fewer repetitions")
    args = p.parse_args(argv)
    models = {dtype: _pair(dtype) for dtype in (torch.float32, torch.bfloat16)}
    for dtype in models:
        for N in (1024,) if args.quick else (1024, 4096):
            for T in (1, 5):
                bench(N, T, dtype, models, reps=5 if args.quick else 10)


if __name__ == "__main__":
    main()
