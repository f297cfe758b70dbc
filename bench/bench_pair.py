"""TriForce with a real small draft model: Qwen2.5-Coder-0.5B-Instruct drafting for
Qwen2.5-Coder-1.5B-Instruct (both Q4_K_M GGUF; ``python -m triforce fetch-pair`` downloads them,
docs/pair.md), dequantised to float32 or, with ``--dtype gguf-int8``, on the files' own blocks with
integer dot products (triforce.models.gguf_copy; results then go to bench/pair_results_gguf-int8.json).
Opt-in: it needs the pair (1.6 GB download) and ~20 GB of memory at the default sizes, and is never part
of the README's commands.

    TRIFORCE_CACHE_MAX_GB=12 python bench/bench_pair.py                       # all parts, defaults
    TRIFORCE_CACHE_MAX_GB=12 python bench/bench_pair.py --parts table1 --context 4096
    python bench/bench_pair.py --quick                                         # smoke run, short prompts
    python bench/bench_pair.py --dtype gguf-int8 --parts batch1 costs          # on the GGUF blocks

Parts (``--parts``):

* ``equality``: greedy, a ragged batch (two prompts of different lengths): ``autoregressive``,
  ``speculative`` (the 0.5B on its full cache) and ``triforce`` (the 0.5B on a StreamingLLM cache ->
  the 1.5B on a retrieval cache -> the 1.5B on its full cache) must give the same tokens; tokens/s and
  acceptance per level.
* ``table1``: the shape of the TriForce paper's Table 1 for the 1.5B: its acceptance drafting for
  itself with a StreamingLLM cache vs a retrieval cache of the same budget (vs the full cache, 1.0 by
  construction), verified on its full cache (``magicdec`` with gamma 1), on natural text and on a
  pass-key prompt, sampled (temperature 0.6, top-p 0.9).
* ``hierarchy``: ``triforce`` with the pair, sampled as in ``table1``: the two levels' acceptances
  (``draft->retrieval``, ``retrieval->full``) and tokens/s next to ``autoregressive``.
* ``costs``: why the speed-ups are what they are. The latency of one forward pass of each level at
  the sizes the engines use (``--context``, ``--batch``; caches filled with random keys/values, since
  a pass's time does not depend on them), the bytes it must read (weights + KV cache) against this
  machine's copy bandwidth, and the speed-up the standard cost model predicts from these latencies
  and an acceptance rate; plus the context at which the target's KV cache outweighs its weights.
* ``batch1``: batch 1, where a CPU verifies cheapest: greedy ``autoregressive``, ``speculative`` at gamma
  2/3/4 and ``triforce`` on a Python-source and a natural-text prompt (``--b1-context`` tokens), identical
  output required.
* ``agreement``: teacher-forced top-1 agreement of the 0.5B with the 1.5B on natural text and on
  Python source (one forward pass of each over the same tokens), and the greedy chain acceptance
  ``(a + a^2 + ... + a^g) / g`` it implies (tokens independent), to check the engines' measured rate.

The target's full-cache prefill of each prompt list runs once and is copied into every later run
(:class:`triforce.demo.SharedPrefill`). Rows go to ``bench/results.csv`` (family ``pair``), the whole
result to ``bench/pair_results.json`` (``--json``; the parts a run does not redo are kept from the file).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from bench.bench_e2e import table1_caches  # noqa: E402
from bench.cost_model import chain_acceptance, speculative_speedup  # noqa: E402
from bench.harness import copy_bandwidth, forward_time, record  # noqa: E402
from triforce.demo import (SharedPrefill, compare_methods, encode, kv_bytes_per_token, natural_prompt,  # noqa: E402
                           passkey_prompt, weight_bytes)
from triforce.generate import generate  # noqa: E402
from triforce.models import hub  # noqa: E402
from triforce.models.cache import FullCache  # noqa: E402

TARGET, DRAFT = "qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"
DTYPE = "float32"  # the weights both models run on (--dtype)
SAMPLING = {"temperature": 0.6, "top_p": 0.9}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def options(args) -> dict:
    """Per-method options: the 0.5B drafts gamma tokens for speculative; for triforce it drafts gamma1
    tokens on a StreamingLLM window (sink + window) for the 1.5B on a retrieval cache of ``budget``
    tokens, which collects gamma2 tokens for the full level."""
    return {
        "speculative": {"gamma": args.gamma},
        "triforce": {"gamma1": args.gamma1, "gamma2": args.gamma2, "budget": args.budget, "chunk_size": 8,
                     "sink": 16, "window": args.window},
    }


def prompts_for(tok, kind: str, context: int, batch: int, ragged: int = 0) -> list[torch.Tensor]:
    """``batch`` prompts of ~``context`` tokens (row b shorter by ``ragged * b``)."""
    if kind == "natural":
        return [torch.tensor(natural_prompt(tok, context - ragged * b, offset=37000 * b)) for b in range(batch)]
    return [torch.tensor(passkey_prompt(tok, context - ragged * b, depth=0.25 + 0.5 * b / max(1, batch - 1),
                                        offset=5000 * b)[0]) for b in range(batch)]


def row_record(part: str, method: str, shape: str, stats: dict, base_stats: dict | None, extra: dict) -> None:
    per = 1.0 / stats["tokens_per_s"]
    timing = {"median_s": per, "p10_s": per, "p90_s": per}
    base = None
    if base_stats is not None:
        b = 1.0 / base_stats["tokens_per_s"]
        base = {"median_s": b, "p10_s": b, "p90_s": b}
    record(family="pair", op=f"{part}:{method}", backend="auto", shape=shape, dtype=DTYPE, timing=timing,
           baseline="autoregressive" if base else "", baseline_timing=base, extra=json.dumps(extra, default=str))


def part_equality(target, draft, tok, args, out: dict) -> None:
    prompts = prompts_for(tok, "natural", args.context, 2, ragged=args.context // 5)
    lens = [len(p) for p in prompts]
    log(f"equality: greedy, ragged batch of {lens} tokens, {args.new} new tokens")
    with SharedPrefill(target, half_copy=False):
        rows = compare_methods(target, prompts, ["autoregressive", "speculative", "triforce"], args.new, 0.0,
                               options(args), draft=draft, log=log)
    shape = f"B=2,ctx={lens},new={args.new},greedy"
    res = []
    for r in rows:
        s = r["stats"]
        item = {"method": r["method"], "identical": r["identical"], "tokens_per_s": s["tokens_per_s"],
                "speedup": r["speedup"], "acceptance": s.get("acceptance"), "mean_accepted": s.get("mean_accepted"),
                "time_s": s.get("time_s"), "prefill_s": s.get("prefill_s")}
        res.append(item)
        row_record("equality", r["method"], shape, s, rows[0]["stats"] if r["method"] != "autoregressive" else None,
                   {k: item[k] for k in ("identical", "acceptance", "mean_accepted", "time_s", "tokens_per_s")})
    out["equality"] = {"prompt_lengths": lens, "new_tokens": args.new, "options": options(args), "rows": res}
    print("\n| method | identical to autoregressive | tok/s | speed-up | acceptance | tokens per full pass |")
    print("|---|---|---|---|---|---|")
    for item in res:
        acc = ", ".join(f"{k} {v:.2f}" for k, v in (item["acceptance"] or {}).items()) or "-"
        print(f"| {item['method']} | {'yes' if item['identical'] else 'NO'} | {item['tokens_per_s']:.2f} | "
              f"{item['speedup']:.2f}x | {acc} | {item['mean_accepted'] or 1:.2f} |", flush=True)
    if not all(item["identical"] for item in res):
        raise SystemExit("equality: a method's greedy output differs from autoregressive")


def part_table1(target, draft, tok, args, out: dict) -> None:
    ctx, budget = args.context, args.budget
    caches = table1_caches(ctx, budget, args.new)
    if args.table1_no_full:  # 1.0 by construction; at long contexts its own prefill costs the most
        caches.pop("full cache")
    runs = out.setdefault("table1", {})  # one entry per context length; cells of other runs are kept
    earlier = runs.get(str(ctx), {})
    same = all(earlier.get(k) == v for k, v in (("batch", args.batch), ("budget", budget), ("new_tokens", args.new)))
    table = {name: dict(cells) for name, cells in earlier.get("acceptance", {}).items()} if same else {}
    for kind in args.table1_kinds:
        prompts = prompts_for(tok, "natural" if kind == "natural" else "passkey", ctx, args.batch)
        with SharedPrefill(target, half_copy=False):
            # retrieval rows first: their full-cache prefill keeps chunk-mean keys, which every later
            # run can reuse (the other way round, the first retrieval run would prefill again)
            for name, opts in sorted(caches.items(), key=lambda kv: kv[1].get("draft_cache") != "retrieval"):
                log(f"table1: {kind}, {name}")
                res = generate(target, prompts, method="magicdec", max_new_tokens=args.new, gamma=1, seed=0,
                               **SAMPLING, **opts)
                acc = res.stats["acceptance"]["self->full"]
                table.setdefault(name, {})[kind] = acc
                row_record("table1", "magicdec", f"B={args.batch},ctx={ctx},new={args.new},cache={name}", res.stats,
                           None, {"kind": kind, "acceptance": acc, "sampling": SAMPLING})
    runs[str(ctx)] = {"context": ctx, "batch": args.batch, "budget": budget, "new_tokens": args.new,
                      "sampling": SAMPLING, "acceptance": table}
    print(f"\nTable 1 shape, Qwen2.5-Coder-1.5B drafting for itself (gamma 1), verified on its full cache; "
          f"{args.batch} prompts of {ctx} tokens, {args.new} new tokens, temperature 0.6, top-p 0.9\n")
    print("| cache | natural text | pass key |\n|---|---|---|")
    cell = lambda x: "-" if x is None else f"{x:.3f}"
    for name, cells in table.items():
        print(f"| {name} | {cell(cells.get('natural'))} | {cell(cells.get('pass key'))} |", flush=True)


def part_hierarchy(target, draft, tok, args, out: dict) -> None:
    prompts = prompts_for(tok, "natural", args.context, args.batch)
    log(f"hierarchy: sampled, {args.batch} prompts of {args.context} tokens")
    opts = options(args)
    res = []
    with SharedPrefill(target, half_copy=False):
        for method in ("autoregressive", "speculative", "triforce"):
            log(f"hierarchy: {method}")
            r = generate(target, prompts, method=method, max_new_tokens=args.new, seed=0, **SAMPLING,
                         draft=None if method == "autoregressive" else draft, **opts.get(method, {}))
            s = r.stats
            res.append({"method": method, "tokens_per_s": s["tokens_per_s"],
                        "speedup": s["tokens_per_s"] / res[0]["tokens_per_s"] if res else 1.0,
                        "acceptance": s.get("acceptance"), "mean_accepted": s.get("mean_accepted"),
                        "time_s": s.get("time_s")})
            row_record("hierarchy", method, f"B={args.batch},ctx={args.context},new={args.new},T=0.6,top_p=0.9", s,
                       {"tokens_per_s": res[0]["tokens_per_s"]} if method != "autoregressive" else None, res[-1])
    out["hierarchy"] = {"context": args.context, "batch": args.batch, "new_tokens": args.new,
                        "sampling": SAMPLING, "options": opts, "rows": res}
    print("\n| method | tok/s | speed-up | acceptance per level | tokens per full pass | time per level (s) |")
    print("|---|---|---|---|---|---|")
    for item in res:
        acc = ", ".join(f"{k} {v:.2f}" for k, v in (item["acceptance"] or {}).items()) or "-"
        times = ", ".join(f"{k} {v:.1f}" for k, v in (item["time_s"] or {}).items()) or "-"
        print(f"| {item['method']} | {item['tokens_per_s']:.2f} | {item['speedup']:.2f}x | {acc} | "
              f"{item['mean_accepted'] or 1:.2f} | {times} |", flush=True)


def part_costs(target, draft, tok, args, out: dict) -> None:
    """Per-pass latencies of every level; the cost model's speed-ups from them."""
    B, N = args.batch, args.context
    bw = copy_bandwidth("cpu")
    wt, wd = weight_bytes(target), weight_bytes(draft)
    kt, kd = kv_bytes_per_token(target), kv_bytes_per_token(draft)
    sink_window = 16 + args.window
    gmax = max(args.gamma, args.gamma2, 8) + 1
    rows = [(f"target, full cache, {T} token{'s' if T > 1 else ''}", "target", N, T) for T in range(1, gmax + 1)]
    rows += [(f"target, {args.budget}-token cache, {args.gamma1 + 1} tokens (triforce middle level)", "target",
              args.budget, args.gamma1 + 1),
             ("draft, full cache, 1 token (speculative draft step)", "draft", N, 1),
             (f"draft, {sink_window}-token StreamingLLM cache, 1 token (triforce draft step)", "draft", sink_window, 1)]
    res = []
    for name, which, length, T in rows:
        log(f"costs: {name}")
        model, w, kv = (target, wt, kt) if which == "target" else (draft, wd, kd)
        t = forward_time(model, B, length, T, warmup=1, reps=5, min_time_s=0.0, max_reps=5)
        nbytes = w + B * length * kv
        res.append({"pass": name, "model": which, "batch": B, "cache_tokens": length, "tokens": T,
                    "ms": t["median_s"] * 1e3, "p10_ms": t["p10_s"] * 1e3, "p90_ms": t["p90_s"] * 1e3,
                    "bytes": nbytes, "floor_ms": nbytes / bw * 1e3})
        record(family="pair", op="costs:forward", backend="auto", shape=f"B={B},cache={length},T={T},model={which}",
               dtype=DTYPE, timing=t, bytes_moved=nbytes, bandwidth=bw, extra=json.dumps({"pass": name}))
    full = {r["tokens"]: r["ms"] for r in res[:gmax]}
    mid, dstep, dstream = (r["ms"] for r in res[gmax:])
    ar = full[1]
    out["costs"] = {"batch": B, "context": N, "threads": torch.get_num_threads(), "copy_gbps": bw / 1e9,
                    "weights_bytes": {"target": wt, "draft": wd}, "kv_bytes_per_token": {"target": kt, "draft": kd},
                    "kv_equals_weights_at_tokens_per_row": wt // kt, "rows": res}
    print(f"\nOne forward pass per level, batch {B}, context {N}, {DTYPE}, {torch.get_num_threads()} threads; "
          f"copy bandwidth {bw / 1e9:.1f} GB/s. Weights read per pass: target {wt / 1e9:.2f} GB, draft "
          f"{wd / 1e9:.2f} GB; KV cache: target {kt} B/token, draft {kd} B/token (the target's KV cache outweighs "
          f"its weights from {wt // kt:,} tokens per row / batch).\n")
    print("| pass | ms | x autoregressive step | bytes read (GB) | bytes / copy bandwidth (ms) | fraction |")
    print("|---|---|---|---|---|---|")
    for r in res:
        print(f"| {r['pass']} | {r['ms']:.1f} | {r['ms'] / ar:.2f} | {r['bytes'] / 1e9:.2f} | {r['floor_ms']:.1f} | "
              f"{r['floor_ms'] / r['ms']:.2f} |")

    def spec(a: float, g: int, verify_ms: float) -> float:  # speed-up over autoregressive, tokens independent
        return speculative_speedup(a, g, dstep, verify_ms, ar)
    agree = {k: v["top1_agreement"] for k, v in out.get("agreement", {}).items()}
    cases = {**{f"{k} ({v:.2f})": v for k, v in agree.items()}, "0.80": 0.8, "0.90": 0.9}
    pred = {}
    print(f"\nspeculative with the 0.5B, predicted from these latencies (per-token acceptance a, gamma 1..{gmax - 1}):"
          f"\n\n| a | at gamma {args.gamma} | best gamma | if verifying gamma+1 tokens cost one step |\n|---|---|---|---|")
    for label, a in cases.items():
        gs = range(1, gmax)
        best = max(gs, key=lambda g: spec(a, g, full[g + 1]))
        free = max(gs, key=lambda g: spec(a, g, ar))
        pred[label] = {"a": a, f"gamma{args.gamma}": spec(a, args.gamma, full[args.gamma + 1]),
                       "best": [best, spec(a, best, full[best + 1])], "free_verify_best": [free, spec(a, free, ar)]}
        print(f"| {label} | {spec(a, args.gamma, full[args.gamma + 1]):.2f}x | {spec(a, best, full[best + 1]):.2f}x "
              f"(gamma {best}) | {spec(a, free, ar):.2f}x (gamma {free}) |")
    out["costs"]["speculative_predicted"] = pred


def code_prompt(tok, n: int) -> list[int]:
    """``n`` tokens of Python source from the standard library (the same text wherever this Python runs)."""
    import inspect
    return encode(tok, (inspect.getsource(argparse) + inspect.getsource(json.decoder))[:8 * n])[:n]


def part_agreement(target, draft, tok, args, out: dict) -> None:
    """Teacher-forced top-1 agreement of the draft with the target."""
    n = min(args.context, 2048)
    texts = {"natural text": natural_prompt(tok, n), "Python source": code_prompt(tok, n)}
    res = {}
    for kind, ids in texts.items():
        log(f"agreement: {kind}, {len(ids)} tokens")
        x = torch.tensor([ids])
        top = []
        for model in (target, draft):
            cache = FullCache(model.config, 1, len(ids), dtype=model.dtype)
            logits = torch.cat([model(x[:, i:i + 256], cache=cache) for i in range(0, x.shape[1], 256)], 1)
            top.append(logits.argmax(-1)[0])
        a = (top[0] == top[1]).double().mean().item()
        res[kind] = {"tokens": len(ids), "top1_agreement": a,
                     "implied_chain_acceptance": {g: chain_acceptance(a, g) for g in (1, 3, 4, 8)}}
    out["agreement"] = res
    print("\n| text | tokens | top-1 agreement 0.5B vs 1.5B | implied greedy acceptance, gamma 3 / 4 / 8 |")
    print("|---|---|---|---|")
    for kind, r in res.items():
        imp = r["implied_chain_acceptance"]
        print(f"| {kind} | {r['tokens']} | {r['top1_agreement']:.3f} | {imp[3]:.3f} / {imp[4]:.3f} / {imp[8]:.3f} |")


def part_batch1(target, draft, tok, args, out: dict) -> None:
    """Batch 1, where verification is cheapest on a CPU: greedy autoregressive, speculative at gamma
    2/3/4 and triforce on one prompt of Python source and one of natural text (``--b1-context`` tokens)."""
    n = args.b1_context
    prompts = {"Python source": code_prompt(tok, n), "natural text": natural_prompt(tok, n)}
    runs = [("autoregressive", "autoregressive", {})] + [
        (f"speculative, gamma {g}", "speculative", {"gamma": g}) for g in (2, 3, 4)] + [
        ("triforce", "triforce", {**options(args)["triforce"], "budget": min(args.budget, n // 2)})]
    res = {}
    for kind, ids in prompts.items():
        log(f"batch1: {kind}, {len(ids)} tokens, {args.new} new tokens, greedy")
        rows, ref = [], None
        with SharedPrefill(target, half_copy=False):
            for label, method, opts in runs:
                r = generate(target, [torch.tensor(ids)], method=method, max_new_tokens=args.new,
                             draft=None if method == "autoregressive" else draft, **opts)
                s = r.stats
                ref = ref or (r.tokens, s)
                item = {"run": label, "identical": bool(torch.equal(r.tokens[0], ref[0][0])),
                        "tokens_per_s": s["tokens_per_s"], "speedup": s["tokens_per_s"] / ref[1]["tokens_per_s"],
                        "acceptance": s["acceptance"], "mean_accepted": s["mean_accepted"], "time_s": s["time_s"]}
                rows.append(item)
                row_record("batch1", label.replace(", ", ":").replace(" ", ""),
                           f"B=1,ctx={len(ids)},new={args.new},greedy,{kind}", s,
                           ref[1] if method != "autoregressive" else None, item)
        res[kind] = rows
        if not all(x["identical"] for x in rows):
            raise SystemExit(f"batch1: a method's greedy output differs from autoregressive ({kind})")
    out["batch1"] = {"context": n, "new_tokens": args.new, "rows": res}
    print(f"\nBatch 1, {n}-token prompt, {args.new} new tokens, greedy (all outputs identical to autoregressive)\n")
    print("| prompt | run | tok/s | speed-up | acceptance | tokens per full-cache pass |\n|---|---|---|---|---|---|")
    for kind, rows in res.items():
        for x in rows:
            acc = ", ".join(f"{k} {v:.2f}" for k, v in x["acceptance"].items()) or "-"
            print(f"| {kind} | {x['run']} | {x['tokens_per_s']:.2f} | {x['speedup']:.2f}x | {acc} | "
                  f"{x['mean_accepted']:.2f} |")


# --parts, in the order they run (costs reads agreement's rates when both run)
PARTS = {"equality": part_equality, "table1": part_table1, "hierarchy": part_hierarchy,
         "agreement": part_agreement, "costs": part_costs, "batch1": part_batch1}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", nargs="+", choices=tuple(PARTS), default=list(PARTS))
    ap.add_argument("--b1-context", type=int, default=1024, help="batch1: prompt tokens (default 1024)")
    ap.add_argument("--context", type=int, default=4096, help="prompt tokens (default 4096)")
    ap.add_argument("--table1-kinds", nargs="+", choices=("natural", "pass key"), default=["natural", "pass key"],
                    help="table1: the prompt kinds to run (cells of an earlier run at the same context, batch, "
                         "budget and new tokens are kept in the JSON)")
    ap.add_argument("--table1-no-full", action="store_true",
                    help="table1: skip the full-cache row (1.0 by construction; its draft cache needs its own prefill)")
    ap.add_argument("--batch", type=int, default=2, help="prompts per kind in table1 / hierarchy (default 2)")
    ap.add_argument("--new", type=int, default=32, help="new tokens per sequence (default 32)")
    ap.add_argument("--budget", type=int, default=512, help="retrieval / StreamingLLM budget in tokens (512)")
    ap.add_argument("--window", type=int, default=240, help="the 0.5B draft's StreamingLLM window in triforce")
    ap.add_argument("--gamma", type=int, default=4, help="speculative: tokens the 0.5B drafts per step")
    ap.add_argument("--gamma1", type=int, default=3, help="triforce: tokens the 0.5B drafts per middle step")
    ap.add_argument("--gamma2", type=int, default=8, help="triforce: tokens the middle level collects")
    ap.add_argument("--json", default=None, help="write the results there (default bench/pair_results.json; "
                                                 "--quick: none)")
    ap.add_argument("--quick", action="store_true", help="smoke run: 512-token prompts, 8 new tokens, budget 128; "
                                                         "rows to a scratch CSV in the temp folder, no JSON")
    ap.add_argument("--dtype", choices=("float32", "gguf-int8"), default="float32",
                    help="float32 (the files dequantised) or gguf-int8 (their own blocks, integer dot products)")
    args = ap.parse_args()
    global DTYPE
    DTYPE = args.dtype
    if args.quick:  # a smoke run: its rows go to a scratch CSV unless TRIFORCE_BENCH_CSV names one
        args.context, args.new, args.budget, args.batch = 512, 8, 128, 1
        os.environ.setdefault("TRIFORCE_BENCH_CSV", os.path.join(tempfile.gettempdir(), "triforce_pair_quick.csv"))
    t0 = time.time()
    log(f"loading {TARGET} and {DRAFT} ({DTYPE}) ...")
    target, tok = hub.load_model(TARGET, DTYPE)
    draft = hub.load_draft(DRAFT, DTYPE)
    log(f"loaded in {time.time() - t0:.0f} s; torch threads {torch.get_num_threads()}")
    stem = "pair_results" + ("" if DTYPE == "float32" else f"_{DTYPE}")
    path = args.json or (None if args.quick else os.path.join(os.path.dirname(__file__), f"{stem}.json"))
    out = {}
    if path and os.path.exists(path):  # keep the parts this run does not redo
        with open(path) as f:
            out = {k: v for k, v in json.load(f).items() if k in PARTS}
    out.update({"target": TARGET, "draft": DRAFT, "dtype": DTYPE, "threads": torch.get_num_threads()})
    with torch.inference_mode():
        for name, part in PARTS.items():
            if name in args.parts:
                part(target, draft, tok, args, out)
    out["wall_s"] = time.time() - t0
    if path:
        with open(path, "w") as f:
            json.dump(out, f, indent=1, default=str)
        log(f"wrote {path}")


if __name__ == "__main__":
    main()
