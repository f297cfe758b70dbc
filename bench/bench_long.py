"""Long generations: every method generates until the model's context is full (default: a 2048-token
prompt + 6144 new tokens = SmolLM2's 8192), greedy, on the embedded model. Reports per method: greedy
output identical to autoregressive, tokens/s, acceptance per 512-token window of output (does the
retrieval cache's rebuild policy hold acceptance up?), live tensor bytes after 10% of the tokens and
at the end (memory constant), and that one token more than the context is a clear error.

    python bench/bench_long.py                                  # 2048 + 6144, every method
    python bench/bench_long.py --prompt 512 --new 1024 --methods autoregressive magicdec

Rows go to the CSV (family ``long``, op ``generate:<method>``); the plot of acceptance against
position goes to docs/img/long_acceptance.png; the JSON of every run to bench/long_results.json.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from bench.harness import ROOT, record  # noqa: E402
from triforce.demo import DEMO_OPTIONS, load_model, natural_prompt  # noqa: E402
from triforce.engines.methods import METHODS  # noqa: E402
from triforce.generate import generate  # noqa: E402


def live_tensor_bytes() -> int:
    gc.collect()
    seen, total = set(), 0
    for o in gc.get_objects():
        if type(o) in (torch.Tensor, torch.nn.Parameter):
            s = o.untyped_storage()
            if s.data_ptr() not in seen:
                seen.add(s.data_ptr())
                total += s.nbytes()
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompt", type=int, default=2048, help="prompt tokens")
    ap.add_argument("--new", type=int, default=None, help="new tokens (default: up to the context)")
    ap.add_argument("--methods", nargs="+", choices=list(METHODS), default=list(METHODS))
    ap.add_argument("--options", default=None, help="per-method options as JSON (default: the demo's)")
    ap.add_argument("--json", default=os.path.join(ROOT, "bench", "long_results.json"))
    ap.add_argument("--plot", default=os.path.join(ROOT, "docs", "img", "long_acceptance.png"))
    ap.add_argument("--quick", action="store_true",
                    help="a 512-token prompt + 512 new tokens, results to /tmp (bench/run_all.py --quick)")
    args = ap.parse_args()
    if args.quick:
        import tempfile

        args.prompt, args.new = 512, 512
        args.json = os.path.join(tempfile.gettempdir(), "triforce_long_quick.json")
        args.plot = os.path.join(tempfile.gettempdir(), "triforce_long_quick.png")
    model, tok = load_model("smollm2", None)
    ctx = model.config.max_position_embeddings
    new = args.new or ctx - args.prompt
    prompt = torch.tensor([natural_prompt(tok, args.prompt, offset=12345)])
    options = {k: dict(v) for k, v in DEMO_OPTIONS.items()}
    for k, v in (json.loads(args.options) if args.options else {}).items():
        options.setdefault(k, {}).update(v)

    try:  # one token past the context: a clear error, before any work
        generate(model, prompt, method="autoregressive", max_new_tokens=ctx - args.prompt + 1)
        limit = "no error (wrong)"
    except ValueError as e:
        limit = str(e)
    print(f"context limit: {limit}", flush=True)

    runs, ref = {}, None
    for method in args.methods:
        mem = {}

        def progress(done, mem=mem):
            if done >= new // 10 and "early" not in mem:
                mem["early"] = live_tensor_bytes()
            if done >= new:
                mem["late"] = live_tensor_bytes()

        t0 = time.perf_counter()
        out = generate(model, prompt, method=method, max_new_tokens=new, progress=progress, **options[method])
        wall = time.perf_counter() - t0
        if method == "autoregressive":
            ref = out
        same = None if ref is None else bool(torch.equal(out.tokens[0], ref.tokens[0]))
        s = out.stats
        runs[method] = {"tokens_per_s": s["tokens_per_s"], "wall_s": wall, "identical": same,
                        "acceptance": s["acceptance"], "acceptance_by_window": s["acceptance_by_window"],
                        "mean_accepted": s["mean_accepted"], "memory_early": mem.get("early"),
                        "memory_late": mem.get("late"), "options": options[method]}
        print(f"{method:15s} {s['tokens_per_s']:7.2f} tok/s  same output: {same}  memory constant: "
              f"{mem.get('early') == mem.get('late')}  acceptance {s['acceptance']}", flush=True)
        for level, rates in s["acceptance_by_window"].items():
            print(f"    {level:18s} per 512 tokens: " + " ".join("-" if r is None else f"{r:.2f}" for r in rates),
                  flush=True)
    base = runs.get("autoregressive")
    for method, r in runs.items():
        per_token = 1.0 / r["tokens_per_s"]
        record(family="long", op=f"generate:{method}", backend="auto", shape=f"B=1,prompt={args.prompt},new={new}",
               dtype="float32", timing={"median_s": per_token, "p10_s": per_token, "p90_s": per_token},
               baseline="autoregressive" if base else "",
               baseline_timing={"median_s": 1 / base["tokens_per_s"]} if base else None,
               extra=json.dumps({k: r[k] for k in ("identical", "acceptance", "acceptance_by_window",
                                                   "memory_early", "memory_late", "options")}))
    with open(args.json, "w") as f:
        json.dump({"prompt": args.prompt, "new": new, "context_limit_error": limit, "runs": runs}, f, indent=1)
    plot(runs, args.plot, args.prompt)


def plot(runs: dict, path: str, prompt: int) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for method, r in runs.items():
        for level, rates in r["acceptance_by_window"].items():
            xs = [prompt + 512 * i + 256 for i, v in enumerate(rates) if v is not None]
            ax.plot(xs, [v for v in rates if v is not None], marker="o", label=f"{method}: {level}")
    ax.set_xlabel("position in the sequence (tokens; window centre)")
    ax.set_ylabel("acceptance rate (per 512 generated tokens)")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("Acceptance against position, SmolLM2-135M, greedy, generating to the 8K context")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


if __name__ == "__main__":
    main()
