"""Command line: ``triforce generate | bench | demo`` (also ``python -m triforce``).

    triforce demo                        # long needle-in-a-haystack prompt, every method, table
    triforce demo --quick                # short prompt, seconds
    echo "Once upon a time" | triforce generate --method magicdec --max-new-tokens 64
    triforce generate --prompt-file doc.txt --method triforce --budget 512 --temperature 0.7 --top-p 0.9
    triforce bench --context 4096 --batch 1 8
"""
from __future__ import annotations

import argparse
import json
import sys

from .engines import METHODS


def _tree(s: str) -> tuple[int, ...]:
    try:
        t = tuple(int(x) for x in s.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--tree: expected comma-separated branching factors like 2,2,1, got {s!r}")
    if not t or min(t) < 1:
        raise argparse.ArgumentTypeError(f"--tree: branching factors must be >= 1, got {s!r}")
    return t


OPTION_FLAGS = {  # flag -> (type, help); passed as method options when given
    "gamma": (int, "draft tokens per verification (speculative, magicdec)"),
    "gamma1": (int, "triforce: draft tokens per retrieval-level verification"),
    "gamma2": (int, "triforce: tokens per full-level verification"),
    "budget": (int, "retrieval-cache tokens (triforce; magicdec --draft-cache retrieval)"),
    "chunk_size": (int, "retrieval chunk size"),
    "sink": (int, "StreamingLLM sink tokens"),
    "window": (int, "StreamingLLM window tokens"),
    "tree": (_tree, "tree: branching factors per depth, e.g. 2,2,1,1"),
    "draft_layers": (int, "layers of the default layer-skip draft (speculative, triforce)"),
    "draft_cache": (str, "magicdec: streaming or retrieval"),
}


def _add_model_args(p):
    p.add_argument("--model", default="smollm2",
                   help="'smollm2' (embedded SmolLM2-135M-Instruct) or a Hugging Face directory / GGUF file")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=None)


def _add_options(p):
    for name, (typ, help_) in OPTION_FLAGS.items():
        p.add_argument("--" + name.replace("_", "-"), dest=name, type=typ, default=None, help=help_)


def _options(args) -> dict:
    return {k: getattr(args, k) for k in OPTION_FLAGS if getattr(args, k, None) is not None}


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="triforce", description="Lossless long-context speculative decoding.")
    sub = ap.add_subparsers(dest="command", required=True)

    g = sub.add_parser("generate", help="generate text from a prompt (file or stdin)")
    g.add_argument("--prompt-file", default="-", help="prompt text file ('-': stdin)")
    g.add_argument("--method", choices=METHODS, default="autoregressive")
    g.add_argument("--max-new-tokens", type=int, default=64)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--top-k", type=int, default=None)
    g.add_argument("--top-p", type=float, default=None)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--stats", action="store_true", help="print the statistics as JSON on stderr")
    g.add_argument("--no-progress", action="store_true")
    _add_model_args(g)
    _add_options(g)

    b = sub.add_parser("bench", help="tokens/s of every method vs autoregressive on natural text")
    b.add_argument("--context", type=int, default=4096)
    b.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    b.add_argument("--max-new-tokens", type=int, default=32)
    b.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    b.add_argument("--temperature", type=float, default=0.0)
    b.add_argument("--json", action="store_true", help="also print the rows as JSON lines")
    _add_model_args(b)

    d = sub.add_parser("demo", help="long-context demo on the embedded model: same output, speed-up table")
    d.add_argument("--quick", action="store_true", help="short prompt (seconds, not minutes)")
    d.add_argument("--context", type=int, default=None, help="prompt tokens (default 3000; --quick: 160)")
    d.add_argument("--max-new-tokens", type=int, default=None)
    d.add_argument("--batch", type=int, default=1)
    d.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    d.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=None)
    return ap


class Progress:
    """A one-line progress bar on stderr."""

    def __init__(self, total: int, label: str, stream=None, enabled: bool = True):
        self.total, self.label, self.stream, self.enabled = total, label, stream or sys.stderr, enabled

    def __call__(self, done: int) -> None:
        if not self.enabled:
            return
        n = 30 * done // max(1, self.total)
        self.stream.write(f"\r{self.label} [{'#' * n}{'.' * (30 - n)}] {done}/{self.total} tokens")
        if done >= self.total:
            self.stream.write("\n")
        self.stream.flush()


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def cmd_generate(args) -> int:
    import torch

    from .demo import decode, encode, load_model
    from .generate import generate

    text = sys.stdin.read() if args.prompt_file == "-" else open(args.prompt_file, encoding="utf-8").read()
    model, tok = load_model(args.model, args.dtype)
    if tok is None:
        raise SystemExit("triforce generate: this model has no tokenizer here; use --model smollm2")
    ids = torch.tensor([encode(tok, text)])
    out = generate(model, ids, method=args.method, max_new_tokens=args.max_new_tokens,
                   temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed,
                   progress=Progress(args.max_new_tokens, args.method, enabled=not args.no_progress),
                   **_options(args))
    sys.stdout.write(decode(tok, out.tokens[0].tolist()) + "\n")
    if args.stats:
        print(json.dumps(out.stats), file=sys.stderr)
    return 0


def cmd_bench(args) -> int:
    from .demo import bench_rows

    for row in bench_rows(args.model, args.dtype, args.context, args.batch, args.max_new_tokens, args.methods,
                          args.temperature, log=_log):
        if args.json:
            print(json.dumps(row))
    return 0


def cmd_demo(args) -> int:
    from .demo import run_demo

    context = args.context or (160 if args.quick else 3000)
    max_new = args.max_new_tokens or (16 if args.quick else 48)
    ok = run_demo(context, max_new, args.batch, args.methods, args.dtype, log=_log)
    return 0 if ok else 1


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return {"generate": cmd_generate, "bench": cmd_bench, "demo": cmd_demo}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
