"""Trained draft heads on the embedded SmolLM2-135M (docs/heads.md):

1. accuracy: per depth, how often each kind's top-1 / top-5 holds the target's greedy token, on
   held-out text (Python documentation topics never trained on);
2. decoding: ``method="tree"`` with each kind against autoregressive on held-out prompts, at batch 1
   and 8 and context ~500 and ~6000, greedy and sampled: tokens/s (best of ``--rounds`` rounds that
   alternate the methods), speed-up, mean tokens per target pass, acceptance; greedy output must be
   identical to autoregressive (a difference stops the run);
3. ``--long``: acceptance against context length (500 -> 7000) per kind.

    python bench/bench_heads.py                      # shipped sets, every table
    python bench/bench_heads.py --heads DIR --kinds medusa --batch 1 --context 500
    python bench/bench_heads.py --skip-accuracy --batch 1 --draft-vocab 4096   # also with draft_vocab=4096

Rows go to bench/results.csv (family ``heads``; each names its set: ``shipped`` or the ``--heads`` directory);
every result to bench/heads_results.json (with ``--heads``: to ``bench_heads.json`` in that directory).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from bench.harness import ROOT, record  # noqa: E402
from triforce.generate import generate  # noqa: E402
from triforce.heads import KINDS, load_heads, shipped_heads_path  # noqa: E402
from triforce.heads.train import accuracy, features, python_docs, token_sequences  # noqa: E402


def heldout_prompts(tok, n_tokens: int, batch: int) -> list[torch.Tensor]:
    """``batch`` prompts of ``n_tokens`` held-out tokens (different offsets into the held-out topics,
    which repeat when they are shorter than needed)."""
    _, held = python_docs()
    ids = tok.encode("\n\n".join(held))
    while len(ids) < n_tokens + 997 * batch:
        ids = ids + ids
    return [torch.tensor(ids[997 * b: 997 * b + n_tokens]) for b in range(batch)]


def markdown(results: dict) -> str:
    """The tables of docs/heads.md, from bench/heads_results.json."""
    out = []
    acc = results.get("accuracy", {})
    if acc:
        k = max(len(a["top1"]) for a in acc.values())
        out += ["Held-out accuracy (Python documentation topics never trained on; 2048 positions): how often "
                "the target's greedy token at depth i is the heads' top-1 / in their top-5.", "",
                "| kind | " + " | ".join(f"depth {i + 1} top-1 / top-5" for i in range(k)) + " |",
                "|---|" + "---|" * k]
        for kind, a in acc.items():
            out.append(f"| {kind} | " + " | ".join(f"{t1:.3f} / {t5:.3f}" for t1, t5 in zip(a["top1"], a["top5"])) + " |")
        out.append("")
    dec = results.get("decode", {})
    if dec:
        out += ["| batch | context | temperature | draft | tree | tok/s | speed-up | tokens / target pass | same output |",
                "|---|---|---|---|---|---|---|---|---|"]
        def setting(item):  # (batch, context, temperature); rows of one setting keep their order
            return tuple(float(part.split("=")[1]) for part in item[0].split(",")[:3])

        for key, r in sorted(dec.items(), key=setting):
            b, c, t, kind = key.split(",")
            same = {None: "-", True: "yes", False: "NO"}[r["identical"]]
            out.append(f"| {b[2:]} | {c[4:]} | {t[2:]} | {kind} | {r['tree'] or '-'} | {r['tokens_per_s']:.2f} | "
                       f"{r['speedup']:.2f}x | {r['mean_accepted']:.2f} | {same} |")
        out.append("")
    lng = results.get("long", {})
    if lng:
        out += ["| context | method | draft | tokens / target pass | acceptance | tok/s |", "|---|---|---|---|---|---|"]
        for key, r in lng.items():
            c, method, kind = key.split(",")
            accs = ", ".join(f"{k} {v:.2f}" for k, v in r["acceptance"].items())
            out.append(f"| {c[4:]} | {method} | {kind} | {r['mean_accepted']:.2f} | {accs} | {r['tokens_per_s']:.2f} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--heads", default=None, help="directory of KIND.safetensors (default: the shipped sets)")
    ap.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS))
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--context", type=int, nargs="+", default=[500, 6000])
    ap.add_argument("--temperature", type=float, nargs="+", default=[0.0, 0.8])
    ap.add_argument("--new", type=int, default=64, help="new tokens per prompt")
    # On a CPU core a verification pass costs compute per token (a 3-token pass ~1.15x an autoregressive
    # step, a 5-token pass ~1.4x: docs/heads.md), so the smallest tree, a chain of two drafts, pays best.
    ap.add_argument("--tree", default="1,1",
                    help="tree shape (branching factors per depth) for every kind and table, e.g. 3,2,1,1 (1,1)")
    ap.add_argument("--draft-vocab", type=int, nargs="+", default=[],
                    help="also decode with each kind drafting from the N most frequent tokens only (draft_vocab)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="decoding rounds per setting, alternating the methods; the best tokens/s counts")
    ap.add_argument("--skip-accuracy", action="store_true")
    ap.add_argument("--skip-decode", action="store_true")
    ap.add_argument("--long", action="store_true", help="acceptance against context length (500 -> 7000)")
    ap.add_argument("--long-context", type=int, nargs="+", default=[500, 1000, 2000, 4000, 7000])
    ap.add_argument("--triforce-kinds", nargs="+", choices=KINDS, default=["mlp", "hidden_transfer"],
                    help="kinds run as TriForce's bottom level in --long")
    ap.add_argument("--markdown", action="store_true", help="print the tables of docs/heads.md from --json and exit")
    ap.add_argument("--json", default=None,
                    help="results file (default: bench/heads_results.json for the shipped sets, the tables of "
                         "docs/heads.md; HEADS/bench_heads.json with --heads, so another set never overwrites them)")
    ap.add_argument("--quick", action="store_true",
                    help="batch 1, context 500, greedy, 16 new tokens, no accuracy table, JSON to /tmp "
                         "(bench/run_all.py --quick)")
    args = ap.parse_args()
    try:
        tree = tuple(map(int, args.tree.split(",")))
    except ValueError:
        ap.error(f"--tree: branching factors separated by commas, e.g. 3,2,1,1; got {args.tree!r}")
    if args.rounds < 1:
        ap.error(f"--rounds must be at least 1, got {args.rounds}")
    if any(n < 1 for n in args.draft_vocab):
        ap.error(f"--draft-vocab: sizes must be at least 1, got {args.draft_vocab}")
    if args.json is None:
        args.json = (os.path.join(args.heads, "bench_heads.json") if args.heads
                     else os.path.join(ROOT, "bench", "heads_results.json"))
    if args.quick:
        import tempfile

        args.batch, args.context, args.temperature, args.new, args.skip_accuracy = [1], [500], [0.0], 16, True
        args.rounds = 1
        args.json = os.path.join(tempfile.gettempdir(), "triforce_heads_quick.json")
    if args.markdown:
        print(markdown(json.load(open(args.json))))
        return

    from triforce.demo import SharedPrefill, load_model

    model, tok = load_model("smollm2", None)
    sets = {k: load_heads(os.path.join(args.heads, f"{k}.safetensors") if args.heads
                          else shipped_heads_path(model, k), model) for k in args.kinds}
    results = json.load(open(args.json)) if os.path.exists(args.json) else {}

    if not args.skip_accuracy:
        _, held = python_docs()
        seqs = token_sequences(tok, held, 256, 32)
        acc = {}
        for kind, h in sets.items():
            f = features(model, seqs, h.layer, kind == "hidden_transfer")
            acc[kind] = accuracy(model, h, f, rows=2048)
            print(f"{kind:16s} top-1 " + " ".join(f"{a:.3f}" for a in acc[kind]["top1"])
                  + "   top-5 " + " ".join(f"{a:.3f}" for a in acc[kind]["top5"]), flush=True)
        results.setdefault("accuracy", {}).update(acc)  # the kinds not measured now keep their rows

    if not args.skip_decode:
        rows = results.setdefault("decode", {})
        for B in args.batch:
            for ctx in args.context:
                prompts = heldout_prompts(tok, ctx, B)
                with SharedPrefill(model):
                    for temp in args.temperature:
                        # (label, kind, draft vocabulary): each kind with the whole vocabulary, then cut
                        runs = [("autoregressive", "autoregressive", None)] + [(k, k, None) for k in sets] + [
                            (f"{k} v{n}", k, n) for n in args.draft_vocab for k in sets]
                        speeds: dict = {run: [] for run, _, _ in runs}  # tokens/s per round
                        last, base = {}, None
                        for _ in range(args.rounds):  # rounds alternate the methods: drift hits each alike
                            for run, kind, dv in runs:
                                opts = {} if kind == "autoregressive" else {"draft": sets[kind], "tree": tree,
                                                                            "draft_vocab": dv}
                                out = generate(model, prompts, method="autoregressive" if kind == "autoregressive"
                                               else "tree", max_new_tokens=args.new, temperature=temp, seed=0,
                                               **opts)
                                if base is None:
                                    base = out
                                same = all(torch.equal(a, b) for a, b in zip(out.tokens, base.tokens))
                                if temp == 0 and not same:
                                    raise SystemExit(f"B={B} ctx={ctx}: {run} changed greedy output")
                                speeds[run].append(out.stats["tokens_per_s"])
                                last[run] = out.stats
                        for run, kind, dv in runs:
                            s, best = last[run], max(speeds[run])
                            speed = best / max(speeds["autoregressive"])
                            label = kind if kind == "autoregressive" else f"{kind}@{'-'.join(map(str, tree))}"
                            label += f" vocab {dv}" if dv else ""
                            key = f"B={B},ctx={ctx},T={temp},{label}"
                            rows[key] = {"tokens_per_s": best, "speedup": speed, "rounds": args.rounds,
                                         "mean_accepted": s["mean_accepted"], "acceptance": s["acceptance"],
                                         "identical": True if temp == 0 else None,
                                         "tree": None if kind == "autoregressive" else tree,
                                         "heads": None if kind == "autoregressive" else args.heads or "shipped"}
                            print(f"B={B} ctx={ctx} T={temp} {run:16s} {best:7.2f} tok/s (best of {args.rounds})  "
                                  f"x{speed:.2f}  tokens/pass {s['mean_accepted']:.2f}", flush=True)
                            per, base_per = (sorted(1 / v for v in speeds[k]) for k in (run, "autoregressive"))
                            record(family="heads", op=f"generate:tree:{kind}" if kind != "autoregressive"
                                   else "generate:autoregressive", backend="auto",
                                   shape=f"B={B},ctx={ctx},new={args.new},T={temp}" + (
                                       "" if kind == "autoregressive" else f",tree={'-'.join(map(str, tree))}")
                                   + (f",draft_vocab={dv}" if dv else ""),
                                   dtype="float32",
                                   timing={"median_s": per[len(per) // 2], "p10_s": per[0], "p90_s": per[-1]},
                                   baseline="autoregressive",
                                   baseline_timing={"median_s": base_per[len(base_per) // 2]},
                                   extra=json.dumps({k: rows[key][k] for k in ("mean_accepted", "identical", "tree",
                                                                                "rounds", "heads")}))

    if args.long:  # acceptance against context; heads vs the StreamingLLM self-draft as TriForce's bottom level
        lng = results.setdefault("long", {})
        for ctx in args.long_context:
            prompts = heldout_prompts(tok, ctx, 1)
            with SharedPrefill(model):
                runs = [(kind, "tree", {"draft": h, "tree": tree}) for kind, h in sets.items()]
                runs += [("streaming self-draft", "triforce", {})]
                runs += [(kind, "triforce", {"draft": h}) for kind, h in sets.items() if kind in args.triforce_kinds]
                for kind, method, opts in runs:
                    out = generate(model, prompts, method=method, max_new_tokens=args.new, **opts)
                    s = out.stats
                    lng[f"ctx={ctx},{method},{kind}"] = {"mean_accepted": s["mean_accepted"],
                                                         "acceptance": s["acceptance"],
                                                         "tokens_per_s": s["tokens_per_s"]}
                    print(f"long ctx={ctx} {method:8s} {kind:20s} tokens/pass {s['mean_accepted']:.2f} "
                          f"acceptance {json.dumps({k: round(v, 3) for k, v in s['acceptance'].items()})} "
                          f"{s['tokens_per_s']:.2f} tok/s", flush=True)
    with open(args.json, "w") as fh:
        json.dump(results, fh, indent=1)


if __name__ == "__main__":
    main()
