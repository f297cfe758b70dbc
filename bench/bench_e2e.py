"""End-to-end generation benchmark: tokens/s of every method against autoregressive, in one run, for
batch 1 and batch 8 at several thousand tokens of context (embedded SmolLM2-135M, natural text).

    TRIFORCE_BENCH_CSV=/tmp/bench.csv python bench/bench_e2e.py                    # batch 1 and 8, 3000 tokens
    python bench/bench_e2e.py --context 4096 --batch 8 --max-new-tokens 64
    python bench/bench_e2e.py --table1                                             # acceptance experiment
    python -m bench.bench_e2e --device cuda --dtype bfloat16 --batch 32 64 128 256 --context 4000 \
        --max-new-tokens 64 --methods autoregressive magicdec              # MagicDec's regime on a GPU
    python bench/bench_e2e.py --context 6000 --batch 8 --max-new-tokens 128 --methods autoregressive magicdec \
        --options '{"magicdec": {"draft_cache": "retrieval", "budget": 512, "gamma": 2}}'   # engines.md: batch x context on CPU
    python bench/bench_e2e.py --context 6000 --batch 1 --max-new-tokens 64 --methods autoregressive magicdec magicdec:int8 \
        --options '{"magicdec": {"draft_cache": "retrieval", "budget": 512, "gamma": 2},
                    "magicdec:int8": {"draft_cache": "retrieval", "budget": 512, "gamma": 2}}'  # the int8 copy on the retrieval cache

Rows go to the CSV (family ``e2e``, op ``generate:<method>``): median_us = decode seconds per new
token of the batch, baseline = autoregressive, speedup = tokens/s over autoregressive, extra = the
acceptance per level, mean accepted tokens and time split (JSON).

``--table1`` reproduces the shape of the TriForce paper's Table 1: the acceptance rate of the target
drafting with a StreamingLLM cache vs a retrieval cache of the same budget (vs the full cache, 1.0 by
construction), verified by the target on its full cache, on natural text and on a needle prompt.
``--sliding-window W`` runs it on the embedded model made a sliding-window model (a Mistral-architecture
model: every layer sees only its last W positions, so its outputs are not SmolLM2's), with each retrieval
row twice: its windowed layers holding the most recent chunks (``sliding_layers="window"``, the default)
and retrieving them by score (``"retrieve"``)::

    python bench/bench_e2e.py --table1 --sliding-window 1024 --budget 1024 --context 4000
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from bench.harness import record  # noqa: E402
from triforce.demo import bench_rows, load_model, natural_prompt, passkey_prompt  # noqa: E402
from triforce.engines import METHODS  # noqa: E402
from triforce.generate import generate  # noqa: E402
from triforce.models.hub import device_of  # noqa: E402


def e2e(args) -> None:
    base, dev = {}, device_of(args.device)
    for row in bench_rows("smollm2", args.dtype, args.context, args.batch, args.max_new_tokens, args.methods,
                          args.temperature, options=json.loads(args.options) if args.options else None,
                          log=lambda m: print(m, file=sys.stderr, flush=True), device=dev):
        per_token = 1.0 / row["tokens_per_s"]
        timing = {"median_s": per_token, "p10_s": per_token, "p90_s": per_token}
        if row["method"] == "autoregressive":
            base[row["batch"]] = timing
        extra = {k: row[k] for k in ("acceptance", "mean_accepted", "target_passes", "row_passes", "time_s",
                                     "prefill_s", "identical")}
        extra["tokens_per_s"] = row["tokens_per_s"]
        record(family="e2e", op=f"generate:{row['method']}", backend="auto",
               shape=f"B={row['batch']},ctx={row['context']},new={args.max_new_tokens}"
                     + (f",options={args.options}" if args.options else ""),
               dtype=args.dtype or "float32", timing=timing, baseline="autoregressive",
               baseline_timing=base.get(row["batch"]), extra=json.dumps(extra, default=str), device=dev)


def table1_caches(ctx: int, budget: int, new_tokens: int, sink: int = 16, windowed: bool = False) -> dict:
    """Table 1's rows: name -> ``magicdec`` options of a draft cache of ``budget`` tokens (StreamingLLM,
    retrieval by score only, retrieval with the default recent window) and the full cache. ``windowed``:
    each retrieval row with ``sliding_layers`` ``"window"`` and ``"retrieve"``."""
    retrieval = {
        f"retrieval ({budget} tokens, chunks of 8, recent=0: chunks by score only)": {
            "draft_cache": "retrieval", "budget": budget, "chunk_size": 8, "recent": 0},
        f"retrieval ({budget} tokens, chunks of 8, default recent: {min(256, budget // 2)} recent tokens)": {
            "draft_cache": "retrieval", "budget": budget, "chunk_size": 8},
    }
    if windowed:
        retrieval = {f"{name}, sliding_layers={mode}": {**opts, "sliding_layers": mode}
                     for name, opts in retrieval.items() for mode in ("retrieve", "window")}
    return {
        f"StreamingLLM ({sink} sink + {budget - sink} recent)": {"sink": sink, "window": budget - sink},
        **retrieval,
        "full cache" + (" (a StreamingLLM cache holding every token, its window over them)"
                        if windowed else ""): {"sink": sink, "window": ctx + new_tokens + 8},
    }


def with_sliding_window(model, window: int):
    """``model`` (a Llama-family model) made a Mistral-architecture model with a ``window``-position sliding window
    on every layer, in place (the same weights; other outputs)."""
    model.config = model.config.replace(model_type="mistral", extra={**model.config.extra, "sliding_window": window})
    if model.config.layer_windows != (window,) * model.config.num_hidden_layers:
        raise ValueError(f"--sliding-window: {window} must be below the context "
                         f"({model.config.max_position_embeddings})")
    for layer in model.model.layers:
        layer.self_attn.window = window  # (the cache-free forward's; the caches read the config)
    return model


def table1(args) -> None:
    model, tok = load_model("smollm2", args.dtype)
    if args.sliding_window:
        with_sliding_window(model, args.sliding_window)
    ctx, budget, B = args.context, args.budget, args.table1_batch
    sink = 16
    kinds = {
        "natural text": [torch.tensor(natural_prompt(tok, ctx - 5 * b, offset=37000 * b)) for b in range(B)],
        "needle (pass key)": [torch.tensor(passkey_prompt(tok, ctx - 5 * b, depth=0.2 + 0.2 * b, offset=5000 * b)[0])
                              for b in range(B)],
    }
    caches = table1_caches(ctx, budget, args.max_new_tokens, sink, bool(args.sliding_window))
    print(f"\nacceptance of the target drafting with a partial cache, verified by the target on its full cache "
          f"(gamma=1, temperature {args.temperature} top-p 0.9, {B} prompts of ~{ctx} tokens, "
          f"{args.max_new_tokens} new tokens each"
          + (f"; every layer a {args.sliding_window}-position sliding window" if args.sliding_window else "")
          + ")\n")
    print(f"| cache | {' | '.join(kinds)} |\n|---|" + "---|" * len(kinds))
    for name, opts in caches.items():
        cells = []
        for prompts in kinds.values():
            out = generate(model, prompts, method="magicdec", max_new_tokens=args.max_new_tokens, gamma=1,
                           temperature=args.temperature, top_p=0.9, seed=0, **opts)
            cells.append(f"{out.stats['acceptance']['self->full']:.3f}")
        print(f"| {name} | {' | '.join(cells)} |", flush=True)


def _label(s: str) -> str:
    """A method name, or ``method:int8`` (triforce.demo.compare_methods drafts such a row with the int8 copy)."""
    method, _, variant = s.partition(":")
    if method not in METHODS or variant not in ("", "int8") or s == "autoregressive:int8":
        raise argparse.ArgumentTypeError(f"{s!r}: expected one of {', '.join(METHODS)}, or one of them but "
                                         f"autoregressive with ':int8'")
    return s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--context", type=int, default=3000)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--methods", nargs="+", type=_label, default=list(METHODS),
                    help="methods, or METHOD:int8 to draft with the int8 copy of the model (a float32 model); "
                         "--options takes the label as its key")
    ap.add_argument("--temperature", type=float, default=None)
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default=None)
    ap.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:N or auto (the GPU when there is one)")
    ap.add_argument("--table1", action="store_true", help="run the acceptance experiment instead")
    ap.add_argument("--options", default=None,
                    help='per-method options as JSON, e.g. \'{"magicdec": {"draft_cache": "retrieval", "budget": 512, "gamma": 2}}\'')
    ap.add_argument("--quick", action="store_true", help="smoke run: batch 1, 1024 tokens of context, 16 new tokens")
    ap.add_argument("--budget", type=int, default=256, help="--table1: cache budget (tokens)")
    ap.add_argument("--table1-batch", type=int, default=4)
    ap.add_argument("--sliding-window", type=int, default=0,
                    help="--table1: give every layer of the model this sliding window (a Mistral-architecture "
                         "model; 0: none)")
    args = ap.parse_args()
    if args.quick:
        args.context, args.batch, args.max_new_tokens = 1024, [1], 16
    if not args.table1 and args.max_new_tokens < 2:
        ap.error("--max-new-tokens: at least 2 (the first new token comes from the prefill; tokens/s is the "
                 "rate of the tokens after it)")
    if args.table1:
        args.temperature = 0.6 if args.temperature is None else args.temperature
        table1(args)
    else:
        args.temperature = 0.0 if args.temperature is None else args.temperature
        e2e(args)


if __name__ == "__main__":
    main()
