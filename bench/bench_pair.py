"""TriForce with a real small draft model: Qwen2.5-Coder-0.5B-Instruct drafting for
Qwen2.5-Coder-1.5B-Instruct (both Q4_K_M GGUF, dequantised to float32; ``python -m triforce fetch-pair``
downloads them, docs/pair.md). Opt-in: it needs the pair (1.6 GB download) and ~20 GB of memory at
the default sizes, and is never part of the README's commands.

    TRIFORCE_CACHE_MAX_GB=12 python bench/bench_pair.py                       # all parts, defaults
    TRIFORCE_CACHE_MAX_GB=12 python bench/bench_pair.py --parts table1 --context 4096
    python bench/bench_pair.py --quick                                         # smoke run, short prompts

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

The target's full-cache prefill of each prompt list runs once and is copied into every later run
(:class:`triforce.demo.SharedPrefill`). Rows go to ``bench/results.csv`` (family ``pair``), the whole
result to ``bench/pair_results.json`` (``--json``).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from bench.bench_e2e import table1_caches  # noqa: E402
from bench.harness import record  # noqa: E402
from triforce.demo import SharedPrefill, compare_methods, natural_prompt, passkey_prompt  # noqa: E402
from triforce.generate import generate  # noqa: E402
from triforce.models import hub  # noqa: E402

TARGET, DRAFT = "qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"
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
    record(family="pair", op=f"{part}:{method}", backend="auto", shape=shape, dtype="float32", timing=timing,
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


def part_table1(target, tok, args, out: dict) -> None:
    ctx, budget = args.context, args.budget
    caches = table1_caches(ctx, budget, args.new)
    table = {}
    for kind in ("natural", "pass key"):
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
    table = {name: table[name] for name in caches}
    out["table1"] = {"context": ctx, "batch": args.batch, "budget": budget, "new_tokens": args.new,
                     "sampling": SAMPLING, "acceptance": table}
    print(f"\nTable 1 shape, Qwen2.5-Coder-1.5B drafting for itself (gamma 1), verified on its full cache; "
          f"{args.batch} prompts of {ctx} tokens, {args.new} new tokens, temperature 0.6, top-p 0.9\n")
    print("| cache | natural text | pass key |\n|---|---|---|")
    for name in caches:
        print(f"| {name} | {table[name]['natural']:.3f} | {table[name]['pass key']:.3f} |", flush=True)


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", nargs="+", choices=("equality", "table1", "hierarchy"),
                    default=["equality", "table1", "hierarchy"])
    ap.add_argument("--context", type=int, default=4096, help="prompt tokens (default 4096)")
    ap.add_argument("--batch", type=int, default=2, help="prompts per kind in table1 / hierarchy (default 2)")
    ap.add_argument("--new", type=int, default=32, help="new tokens per sequence (default 32)")
    ap.add_argument("--budget", type=int, default=512, help="retrieval / StreamingLLM budget in tokens (512)")
    ap.add_argument("--window", type=int, default=240, help="the 0.5B draft's StreamingLLM window in triforce")
    ap.add_argument("--gamma", type=int, default=4, help="speculative: tokens the 0.5B drafts per step")
    ap.add_argument("--gamma1", type=int, default=3, help="triforce: tokens the 0.5B drafts per middle step")
    ap.add_argument("--gamma2", type=int, default=8, help="triforce: tokens the middle level collects")
    ap.add_argument("--json", default=None, help="write the results there (default bench/pair_results.json; "
                                                 "--quick: none)")
    ap.add_argument("--quick", action="store_true", help="smoke run: 512-token prompts, 8 new tokens, budget 128")
    args = ap.parse_args()
    if args.quick:
        args.context, args.new, args.budget, args.batch = 512, 8, 128, 1
    t0 = time.time()
    log(f"loading {TARGET} and {DRAFT} (float32) ...")
    target, tok = hub.load_model(TARGET)
    draft = hub.load_draft(DRAFT)
    log(f"loaded in {time.time() - t0:.0f} s; torch threads {torch.get_num_threads()}")
    out = {"target": TARGET, "draft": DRAFT, "threads": torch.get_num_threads()}
    with torch.inference_mode():
        if "equality" in args.parts:
            part_equality(target, draft, tok, args, out)
        if "table1" in args.parts:
            part_table1(target, tok, args, out)
        if "hierarchy" in args.parts:
            part_hierarchy(target, draft, tok, args, out)
    out["wall_s"] = time.time() - t0
    path = args.json or (None if args.quick else os.path.join(os.path.dirname(__file__), "pair_results.json"))
    if path:
        with open(path, "w") as f:
            json.dump(out, f, indent=1, default=str)
        log(f"wrote {path}")


if __name__ == "__main__":
    main()
