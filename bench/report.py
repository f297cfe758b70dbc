"""Render benchmark tables (Markdown) and plots (PNG) from bench/results.csv.

    python -m bench.report [--csv bench/results.csv] [--out docs/benchmarks.md] [--plots docs/img]

Tables: the latest row per (device, op, backend, shape, dtype), grouped by device and op, with time,
GB/s, fraction of the measured copy bandwidth and speed-up over the baseline; for rows that record
their FLOPs (ops whose arithmetic can outweigh their bytes), also GFLOP/s, the fraction of the matmul
peak measured in the same run and the fraction of the roofline (the binding one of the two ceilings).
Plots (if matplotlib is installed): roofline fraction per op and shape, one PNG per device.
"""
from __future__ import annotations

import argparse
import csv
import os
import re
from collections import OrderedDict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load(path: str) -> list[dict]:
    with open(path, newline="") as f:
        rows = [{k: v or "" for k, v in r.items()} for r in csv.DictReader(f)]  # old rows: new columns empty
    latest: "OrderedDict[tuple, dict]" = OrderedDict()
    for r in rows:  # later rows replace earlier measurements of the same configuration
        latest[(r["device"], r["family"], r["op"], r["backend"], r["shape"], r["dtype"])] = r
    return list(latest.values())


def tables(rows: list[dict]) -> str:
    out = []
    for device in sorted({r["device"] for r in rows}):
        out.append(f"### {device}\n")
        dev_rows = [r for r in rows if r["device"] == device]
        meta = max(dev_rows, key=lambda r: r["date"])  # the newest row: a rerun keeps its key's place
        bws = sorted({r["copy_gbps"] for r in dev_rows if r["copy_gbps"]}, key=float)
        out.append(f"torch {meta['torch']}, triton {meta['triton'] or '-'}, latest commit {meta['commit']}, "
                   f"{meta['date'][:10]}; copy bandwidth measured per run: {', '.join(bws) or '-'} GB/s\n")
        for op in OrderedDict.fromkeys(r["op"] for r in dev_rows):
            op_rows = [r for r in dev_rows if r["op"] == op]
            compute = any(r.get("flops") for r in op_rows)  # the compute columns only where some row has them
            out.append(f"\n**{op}**\n")
            out.append("| backend | shape | dtype | median µs (p10–p90) | GB/s | of copy BW | "
                       + ("GFLOP/s | of matmul peak | of roofline | " if compute else "")
                       + "baseline | baseline µs | speed-up |")
            out.append("|---|---|---|---|---|---|" + ("---|---|---|" if compute else "") + "---|---|---|")
            for r in op_rows:
                comp = (f"{r.get('gflops') or '-'} | {_pct(r.get('compute_frac'))} | {_pct(r.get('bound_frac'))} | "
                        if compute else "")
                out.append(f"| {r['backend']} | {r['shape']} | {r['dtype']} | {r['median_us']} "
                           f"({r['p10_us']}–{r['p90_us']}) | {r['gbps'] or '-'} | {_pct(r['roofline_frac'])} | {comp}"
                           f"{r['baseline'] or '-'} | {r['baseline_us'] or '-'} | "
                           f"{('×' + r['speedup']) if r['speedup'] else '-'} |")
        out.append("")
    return "\n".join(out)


def _pct(frac: str | None) -> str:
    return f"{float(frac) * 100:.0f}%" if frac else "-"


def roof(r: dict) -> tuple[float, bool]:
    """(fraction of the roofline, compute-bound?) of a row: the binding ceiling's time (the larger of
    bytes / copy bandwidth and FLOPs / matmul peak) over the measured time, from ``bound_frac`` when the row records FLOPs, else the fraction of copy bandwidth."""
    if r.get("bound_frac"):
        compute = bool(r.get("compute_frac")) and (not r["roofline_frac"]
                                                   or float(r["compute_frac"]) > float(r["roofline_frac"]))
        return float(r["bound_frac"]), compute
    return float(r["roofline_frac"]), False


def plots(rows: list[dict], outdir: str) -> list[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    os.makedirs(outdir, exist_ok=True)
    written = []
    for device in sorted({r["device"] for r in rows}):
        pts = [r for r in rows if r["device"] == device and (r["roofline_frac"] or r.get("bound_frac"))]
        if not pts:
            continue
        labels = [f"{r['op']}[{r['backend']}] {r['shape']}" for r in pts]
        fig, ax = plt.subplots(figsize=(10, 0.28 * len(pts) + 1.5))
        fr = [roof(r) for r in pts]
        ax.barh(range(len(pts)), [f for f, _ in fr], color=["tab:orange" if c else "tab:blue" for _, c in fr])
        ax.set_yticks(range(len(pts)), labels, fontsize=7)
        ax.axvline(1.0, color="k", lw=0.8)
        ax.set_xlabel("fraction of the roofline: measured copy bandwidth (blue),\n"
                      "or the measured matmul peak where the op's FLOPs bind it (orange)", fontsize=8)
        ax.set_title(device, fontsize=9)
        ax.invert_yaxis()
        fig.tight_layout()
        name = os.path.join(outdir, "roofline_" + re.sub(r"[^A-Za-z0-9]+", "_", device).strip("_") + ".png")
        fig.savefig(name, dpi=110)
        plt.close(fig)
        written.append(name)
    return written


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--csv", default=os.path.join(ROOT, "bench", "results.csv"))
    p.add_argument("--out", default=os.path.join(ROOT, "docs", "benchmarks.md"))
    p.add_argument("--plots", default=os.path.join(ROOT, "docs", "img"))
    a = p.parse_args(argv)
    rows = load(a.csv)
    pngs = plots(rows, a.plots)
    head = ("# Benchmark results\n\nGenerated by `python -m bench.report` from `bench/results.csv` "
            "(do not edit by hand). Method: `bench/harness.py` (medians of repeated runs; on CUDA, CUDA "
            "events with L2 flushed; bytes are what the op must move; copy bandwidth measured in the same "
            "run; for ops whose arithmetic can outweigh their bytes, FLOPs are the useful multiply-adds x 2 "
            "and the compute ceiling is a matmul in the op's dtype measured in the same run, and \"of "
            "roofline\" is the larger of bytes / copy bandwidth and FLOPs / matmul peak over the measured time). Regenerate all: "
            "`python -m bench.run_all`.\n\n")
    imgs = "".join(f"![roofline]({os.path.relpath(p, os.path.dirname(a.out))})\n\n" for p in pngs)
    with open(a.out, "w") as f:
        f.write(head + imgs + tables(rows) + "\n")
    print(f"wrote {a.out} ({len(rows)} rows) and {len(pngs)} plot(s)")


if __name__ == "__main__":
    main()
