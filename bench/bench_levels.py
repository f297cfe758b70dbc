"""TriForce's levels at long context: the latency of each level's pass, and the speed-up they give.

    python -m bench.bench_levels                                   # Llama-3.1-8B shape, 32K and 128K, batch 1 and 8
    python -m bench.bench_levels --context 32768 --batch 1 --reps 5
    python -m bench.bench_levels --quick                          # a smoke run: tiny models, batch 1, 512 tokens
    python -m bench.bench_levels --target gemma3-4b --budget 4096  # a target with sliding-window layers
    python -m bench.bench_levels --target phi3.5-mini             # a LongRoPE target (MHA, 128K context)

The target has Llama-3.1-8B's shape and the draft the shape of TriForce's Llama-68M draft (2 layers of
768, 12 heads) with the target's vocabulary; both get random weights in ``--dtype`` (a pass's time
does not depend on the values, and neither does the attention's). The caches are filled with random
keys and values. Per batch x context, each pass is timed (CUDA events on a GPU, L2 flushed; each call
rolled back, so every call sees the same cache; on a GPU the passes replay from CUDA graphs, as the
engines' do: ``TRIFORCE_CUDA_GRAPHS=0`` times them eagerly):

* ``autoregressive``: the target on its full cache, 1 token per row: the baseline step;
* ``full``: the target on its full cache, ``gamma2 + 1`` tokens (TriForce's top verification);
* ``retrieval``: the target on a cache of ``budget + rebuild_stride / 2`` tokens, ``gamma1 + 1`` tokens (the
  middle level: a retrieval cache holds its ``budget`` selected tokens and a tail of up to
  ``rebuild_stride`` tokens since its last rebuild, ``rebuild_stride / 2`` on average);
* ``draft``: the draft on a cache of ``sink + window`` tokens, 1 token (its StreamingLLM cache; the
  eviction's own bookkeeping is ``bench/bench_streaming_cache.py``'s and not counted);
* ``rebuild``: ``RetrievalCache.rebuild()`` on the full cache (chunk scores, top-k, gather, every layer),
  charged once per ``rebuild_stride`` tokens of each row.

The bytes each pass must read (the weights and the KV it attends over) against the copy bandwidth
measured in the same run give each pass's fraction of the memory-bound floor. The speed-up over
autoregressive then follows from the cost model (``bench/cost_model.py``: tokens accepted independently)
at each acceptance case: the rates TriForce measured with the embedded model (``--acceptance-from``, the
engines' accepted / offered per level, converted to per-token rates) and a grid. Rows go to the CSV
(family ``levels``); ``--json`` keeps the whole result. A batch x context whose weights and caches do not
fit the device's free memory (on a CPU: the machine's available memory) is skipped, and the run says
so; the models are sized on the meta device first, so none is built where no shape fits.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from bench.cost_model import per_token_acceptance, triforce_speedup  # noqa: E402
from bench.harness import copy_bandwidth, forward_time, measure, record  # noqa: E402
from triforce.demo import kv_bytes_per_token, weight_bytes  # noqa: E402
from triforce.models import Llama, LlamaConfig  # noqa: E402
from triforce.models.cache import FullCache, RetrievalCache  # noqa: E402
import triforce_kernels as tk  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}
SHAPES = {  # name -> LlamaConfig fields (max_position_embeddings is set from --context)
    "llama3-8b": dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                      num_attention_heads=32, num_key_value_heads=8, rope_theta=500000.0, rope_scaling=LLAMA3_ROPE,
                      rms_norm_eps=1e-5),
    # TriForce's draft (JackFram/llama-68m) with the target's vocabulary, so that it can draft for it; its
    # head tied to the embedding (a 128256 x 768 table: 0.2 GB in bf16, read once per step)
    "llama-68m": dict(vocab_size=128256, hidden_size=768, intermediate_size=3072, num_hidden_layers=2,
                      num_attention_heads=12, num_key_value_heads=12, rms_norm_eps=1e-6, tie_word_embeddings=True),
    # the embedded model's shape (bench_streaming_cache, profile_step)
    "smollm2-135m": dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, rope_theta=1e5, rms_norm_eps=1e-5,
                         tie_word_embeddings=True),
    "tiny": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2),
    # sliding-window targets: Mistral-7B-v0.1 (every layer a 4096 window: at long context the full level reads
    # 4096 positions per layer, as the retrieval level does) and Gemma-3-4B (5 layers of 6 a 1024 window, the
    # global ones the whole context: the retrieval level cuts what those read)
    "mistral-7b": dict(model_type="mistral", vocab_size=32000, hidden_size=4096, intermediate_size=14336,
                       num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, rms_norm_eps=1e-5,
                       extra={"sliding_window": 4096}),
    "gemma3-4b": dict(model_type="gemma3_text", vocab_size=262208, hidden_size=2560, intermediate_size=10240,
                      num_hidden_layers=34, num_attention_heads=8, num_key_value_heads=4, head_dim=256,
                      rope_theta=1e6, rope_scaling={"rope_type": "linear", "factor": 8.0}, rms_norm_eps=1e-6,
                      tie_word_embeddings=True, extra={"sliding_window": 1024, "sliding_window_pattern": 6,
                                                       "query_pre_attn_scalar": 256, "rope_local_base_freq": 1e4}),
    # a LongRoPE target: Phi-3.5-mini (128K context, MHA: 32 KV heads of 96, so 3x Llama-3.1-8B's KV bytes per
    # token), its factor values made up (a pass's time does not depend on them); rows past 4096 tokens take the
    # long set, as the engines choose
    "phi3.5-mini": dict(model_type="phi3", vocab_size=32064, hidden_size=3072, intermediate_size=8192,
                        num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32, rms_norm_eps=1e-5,
                        rope_scaling={"rope_type": "longrope", "short_factor": [1.0 + 0.02 * i for i in range(48)],
                                      "long_factor": [1.0 + 1.5 * i for i in range(48)],
                                      "original_max_position_embeddings": 4096}),
}
# TriForce on the embedded model at long context (bench/bench_long.py): 2048-token prompt, 6144 new tokens
ACCEPTANCE_FILES = ("bench/long_results_recent.json", "bench/long_results.json")
GRID = ((0.9, 0.95), (0.8, 0.9), (0.7, 0.8), (0.6, 0.7))  # per-token (draft->retrieval, retrieval->full)


def build(shape: str, vocab: int | None, context: int, device, dtype) -> Llama:
    fields = dict(SHAPES[shape])
    if vocab is not None:
        fields["vocab_size"] = vocab
    cfg = LlamaConfig(**fields, max_position_embeddings=context)
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # the weights are drawn in their dtype: no float32 copy of an 8B model
    try:
        with torch.device(device):
            model = Llama(cfg)
    finally:
        torch.set_default_dtype(old)
    return model.eval()


def kv_read_bytes(model, tokens: int) -> int:
    """Bytes of K and V one row's pass reads from a cache of ``tokens`` tokens: a sliding-window layer reads
    only its last W (the retrieval level's windowed layers hold those: ``RetrievalCache``'s ``exact_windows``)."""
    per_layer = kv_bytes_per_token(model) // model.config.num_hidden_layers
    return per_layer * sum(min(tokens, w) if w else tokens for w in model.config.layer_windows)


def acceptance_cases(paths, g1: int, g2: int) -> dict:
    """label -> (a1, a2) per-token rates: each file's TriForce run (its engines' accepted / offered rates),
    then the grid."""
    cases = {}
    for path in paths:
        full = path if os.path.isabs(path) else os.path.join(ROOT, path)
        with open(full) as f:
            run = json.load(f)["runs"].get("triforce")
        if not run:
            continue
        acc, opts = run["acceptance"], run.get("options", {})
        r1, r2 = acc["draft->retrieval"], acc["retrieval->full"]
        a1 = per_token_acceptance(r1, opts.get("gamma1", g1))
        a2 = per_token_acceptance(r2, opts.get("gamma2", g2))
        cases[f"{os.path.basename(path)} (rates {r1:.2f} / {r2:.2f})"] = (a1, a2)
    for a1, a2 in GRID:
        cases[f"{a1:.2f} / {a2:.2f}"] = (a1, a2)
    return cases


def needed_bytes(target, draft, batch: int, context: int, budget: int, window: int) -> int:
    """Weights, the full cache with its chunk means (float32 means of 8-key chunks: 1/8 of the cache in
    bf16), the retrieval and the draft caches, and 1 GiB for activations and the logits. One full cache
    is held at a time."""
    kv = kv_bytes_per_token(target)
    full = batch * context * kv
    return (sum(p.numel() * p.element_size() for m in (target, draft) for p in m.parameters())
            + full * 9 // 8 + batch * (budget + 1024) * kv + batch * window * kv_bytes_per_token(draft) + 2**30)


def free_bytes(device) -> int | None:
    """Free device memory (CUDA), or the machine's available memory; None where the system does not say."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # no such sysconf name here (macOS): do not skip
        return None


def rebuild_time(target, batch: int, context: int, budget: int, chunk: int, stride: int, **kw) -> dict:
    """``RetrievalCache.rebuild()`` over a full cache of ``context`` random tokens (chunk means computed)."""
    dev = target.device
    full = FullCache(target.config, batch, context, device=dev, dtype=target.dtype, chunk_size=chunk)
    for layer in range(full.num_layers):
        full.k[layer].normal_()
        full.v[layer].normal_()
        C = context // chunk
        full.chunk_keys[layer].copy_(tk.chunk_mean_keys(full.k[layer][:, :C * chunk], chunk))
        full.last_query[layer].normal_()
    full.lengths.fill_(context)
    full.tighten_bound(context)
    rcache = RetrievalCache(target.config, full, budget, chunk, max_step=64, rebuild_stride=stride)
    t = measure(rcache.rebuild, device=dev, **kw)
    del rcache, full
    return t


def run(args) -> dict:
    dev = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    context_max = max(args.context) + args.gamma2 + 2
    # sized on the meta device first: an 8B model is not built where no shape fits
    sized = (build(args.target, None, context_max, "meta", dtype),
             build(args.draft, SHAPES[args.target]["vocab_size"], context_max, "meta", dtype))
    free = free_bytes(dev)
    fits = {(B, N): (needed_bytes(*sized, B, N, args.budget, args.sink + args.window), free)
            for B in args.batch for N in args.context}
    skipped = {k: f"needs ~{need / 2**30:.0f} GiB, {free / 2**30:.0f} GiB free" for k, (need, free) in fits.items()
               if free is not None and need > free}
    for (B, N), why in skipped.items():
        print(f"batch {B} x {N}: skipped, {why}", flush=True)
    if len(skipped) == len(fits):
        return {"device": str(dev), "shapes": [{"batch": B, "context": N, "skipped": why}
                                               for (B, N), why in skipped.items()]}
    target = build(args.target, None, context_max, dev, dtype)
    draft = build(args.draft, target.config.vocab_size, context_max, dev, dtype)
    bw = copy_bandwidth(dev)
    wt, wd = weight_bytes(target), weight_bytes(draft)
    kt, kd = kv_bytes_per_token(target), kv_bytes_per_token(draft)
    window = args.sink + args.window
    mid_len = args.budget + args.rebuild_stride // 2
    kw = dict(warmup=args.warmup, reps=args.reps, min_time_s=0.0, max_reps=args.reps)
    cases = acceptance_cases(args.acceptance_from, args.gamma1, args.gamma2)
    out = {"device": str(dev), "dtype": args.dtype, "copy_gbps": bw / 1e9, "target": args.target, "draft": args.draft,
           "weights_bytes": {"target": wt, "draft": wd}, "kv_bytes_per_token": {"target": kt, "draft": kd},
           "options": {k: getattr(args, k) for k in ("budget", "chunk_size", "rebuild_stride", "sink", "window",
                                                      "gamma1", "gamma2")},
           "acceptance": {k: list(v) for k, v in cases.items()}, "shapes": []}
    print(f"target {args.target} ({wt / 1e9:.2f} GB of weights read per pass, {kt} B of KV per token), draft "
          f"{args.draft} ({wd / 1e9:.3f} GB), {args.dtype}, {dev}; copy bandwidth {bw / 1e9:.0f} GB/s", flush=True)
    for B in args.batch:
        for N in args.context:
            if (B, N) in skipped:
                out["shapes"].append({"batch": B, "context": N, "skipped": skipped[B, N]})
                continue
            passes = {  # name -> (model, cache tokens, tokens per row, weight bytes)
                "autoregressive": (target, N, 1, wt),
                "full": (target, N, args.gamma2 + 1, wt),
                "retrieval": (target, mid_len, args.gamma1 + 1, wt),
                "draft": (draft, window, 1, wd),
            }
            times, rows = {}, {}
            for name, (model, length, T, w) in passes.items():
                t = forward_time(model, B, length, T, **kw)
                nbytes = w + B * kv_read_bytes(model, length)
                times[name] = t["median_s"]
                rows[name] = {"ms": t["median_s"] * 1e3, "cache_tokens": length, "tokens": T, "bytes": nbytes,
                              "of_floor": nbytes / bw / t["median_s"]}
                record(family="levels", op=f"pass:{name}", backend="auto",
                       shape=f"B={B},N={N},cache={length},T={T},model={args.target if model is target else args.draft}",
                       dtype=args.dtype, timing=t, bytes_moved=nbytes, bandwidth=bw, device=dev)
            t = rebuild_time(target, B, N, args.budget, args.chunk_size, args.rebuild_stride, **kw)
            times["rebuild"] = t["median_s"]
            rows["rebuild"] = {"ms": t["median_s"] * 1e3, "per_token_ms": t["median_s"] * 1e3 / args.rebuild_stride}
            record(family="levels", op="pass:rebuild", backend="auto",
                   shape=f"B={B},N={N},budget={args.budget},chunk={args.chunk_size},model={args.target}",
                   dtype=args.dtype, timing=t, device=dev)
            pred = {label: triforce_speedup(a1, a2, args.gamma1, args.gamma2, times["draft"], times["retrieval"],
                                            times["full"], times["autoregressive"],
                                            times["rebuild"] / args.rebuild_stride)
                    for label, (a1, a2) in cases.items()}
            out["shapes"].append({"batch": B, "context": N, "passes": rows, "predicted_speedup": pred})
            ar = rows["autoregressive"]["ms"]
            print(f"\nbatch {B} x {N} tokens:\n\n| pass | cache tokens | tokens per row | ms | x autoregressive "
                  f"step | of the memory-bound floor |\n|---|---|---|---|---|---|")
            for name, r in rows.items():
                if name == "rebuild":
                    print(f"| rebuild (once per {args.rebuild_stride} tokens) | {N} | - | {r['ms']:.3f} | "
                          f"{r['ms'] / ar:.2f} | - |")
                else:
                    print(f"| {name} | {r['cache_tokens']} | {r['tokens']} | {r['ms']:.3f} | {r['ms'] / ar:.2f} | "
                          f"{r['of_floor']:.2f} |")
            print(f"\n| per-token acceptance (draft->retrieval / retrieval->full) | a1 | a2 | predicted speed-up, "
                  f"gamma1 {args.gamma1}, gamma2 {args.gamma2} |\n|---|---|---|---|")
            for label, (a1, a2) in cases.items():
                print(f"| {label} | {a1:.3f} | {a2:.3f} | {pred[label]:.2f}x |")
            print(flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", choices=sorted(SHAPES), default="llama3-8b")
    ap.add_argument("--draft", choices=sorted(SHAPES), default="llama-68m")
    ap.add_argument("--context", type=int, nargs="+", default=[32768, 131072])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16")
    ap.add_argument("--budget", type=int, default=4096, help="retrieval-cache tokens (TriForce: 4096)")
    ap.add_argument("--chunk-size", type=int, default=8)
    ap.add_argument("--rebuild-stride", type=int, default=256)
    ap.add_argument("--sink", type=int, default=16)
    ap.add_argument("--window", type=int, default=240)
    ap.add_argument("--gamma1", type=int, default=2)
    ap.add_argument("--gamma2", type=int, default=6)
    ap.add_argument("--acceptance-from", nargs="*", default=list(ACCEPTANCE_FILES),
                    help="bench_long JSON files whose triforce run gives measured acceptance rates")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--json", default=None, help="write the whole result here")
    ap.add_argument("--quick", action="store_true", help="a smoke run: tiny models, batch 1, 512 tokens")
    args = ap.parse_args(argv)
    if args.quick:
        args.target = args.draft = "tiny"
        args.context, args.batch, args.budget, args.reps = [512], [1], 128, 3
    if args.budget % args.chunk_size or args.budget + args.rebuild_stride > min(args.context):
        ap.error("--budget must be a multiple of --chunk-size, and budget + rebuild stride at most the context")
    return run(args)


if __name__ == "__main__":
    main()
