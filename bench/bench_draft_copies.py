"""Speculative decoding at batch 1 with a cheaper copy of the target itself as the draft: the bfloat16
copy (the default draft) against the weight-only int8 copy (``triforce.models.int8_copy``), and, for the
Qwen2.5-Coder-1.5B target with ``--small-draft``, the family's 0.5B model (docs/pair.md; fetched if not
cached).
Greedy, a code prompt, every run checked token for token against autoregressive; the prefill is shared
and not timed. Rows in bench/results.csv (family ``draft``); docs/model.md ("Int8 draft copy").

    python -m bench.bench_draft_copies [--model smollm2|qwen2.5-coder-1.5b [--small-draft]] [--reps 3]
"""
from __future__ import annotations

import argparse
import json

import torch

import triforce
from triforce.demo import SharedPrefill
from triforce.engines.drafters import half_precision_copy
from triforce.models import hub
from triforce.models.quant import int8_copy

from .bench_pair import code_prompt
from .harness import record


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2", choices=["smollm2", "qwen2.5-coder-1.5b"])
    ap.add_argument("--context", type=int, default=300, help="prompt tokens (300)")
    ap.add_argument("--new", type=int, default=32, help="new tokens (32)")
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--reps", type=int, default=3, help="rounds of every method; the last round is recorded")
    ap.add_argument("--small-draft", action="store_true", help="qwen2.5-coder-1.5b: also its 0.5B model as draft")
    ap.add_argument("--threads", type=int, default=0)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    target, tok = hub.load_model(a.model)
    drafts = {"bfloat16 copy": half_precision_copy(target), "int8 copy": int8_copy(target)}
    if a.small_draft:
        if a.model != "qwen2.5-coder-1.5b":
            raise SystemExit("--small-draft: only with --model qwen2.5-coder-1.5b")
        drafts["qwen2.5-coder-0.5b"] = hub.load_draft("qwen2.5-coder-0.5b")
    prompt = torch.tensor([code_prompt(tok, a.context)])
    runs = [("autoregressive", None)] + [(f"speculative:{name}", d) for name, d in drafts.items()]
    with SharedPrefill(target):
        for rep in range(a.reps):
            rows, base = [], None
            for label, draft in runs:
                kw = {} if draft is None else {"draft": draft, "gamma": a.gamma}
                r = triforce.generate(target, prompt, method=label.partition(":")[0], max_new_tokens=a.new, **kw)
                t = sum(r.stats["time_s"].values())
                toks = torch.stack(r.tokens)
                base = toks if base is None else base
                rows.append((label, t, r.stats, torch.equal(toks, base)))
            print(f"round {rep + 1}: " + ", ".join(f"{lab} {a.new / t:.2f} tok/s (same {same})" for lab, t, _, same in rows))
    base_t = rows[0][1]
    for label, t, stats, same in rows:
        if not same:
            raise SystemExit(f"{label}: output differs from autoregressive")
        timing = {"median_s": t / a.new, "p10_s": t / a.new, "p90_s": t / a.new}
        record(family="draft", op=f"generate:{label}", backend="auto",
               shape=f"model={a.model},B=1,ctx={a.context},new={a.new},gamma={a.gamma}", dtype="float32",
               timing=timing, baseline="autoregressive",
               baseline_timing={"median_s": base_t / a.new, "p10_s": base_t / a.new, "p90_s": base_t / a.new},
               extra=json.dumps({"acceptance": stats["acceptance"], "mean_accepted": stats["mean_accepted"],
                                 "time_s": stats["time_s"], "identical": same}))


if __name__ == "__main__":
    main()
