"""The long-context demo, the shared method comparison (``triforce demo`` / ``triforce bench`` /
bench/bench_e2e.py) and the prompt builders.

Prompts are built from text that ships with Python itself (``pydoc_data.topics``: ~450 KB of the
language reference), so the demo needs nothing but the package and the embedded model:

* :func:`natural_prompt`: a window of that text (natural text);
* :func:`passkey_prompt`: needle in a haystack: a pass key hidden at a given depth of that text,
  asked for at the end (the retrieval task of the TriForce paper's Table 1).
"""
from __future__ import annotations

import random
import sys
import time

import torch

from .engines import METHODS
from .models.hub import decode, encode, load_model  # noqa: F401  (re-exported)

# Per-method options used by the demo and the benchmark (small CPU-friendly budgets).
DEMO_OPTIONS = {
    "autoregressive": {},
    "speculative": {"gamma": 4},
    "magicdec": {"gamma": 4, "sink": 16, "window": 240},
    "triforce": {"gamma1": 2, "gamma2": 6, "budget": 512, "chunk_size": 8, "sink": 16, "window": 240},
    "tree": {"tree": (2, 2, 1, 1), "sink": 16, "window": 240},
}

_HAYSTACK: str | None = None


def haystack_text() -> str:
    """~450 KB of English prose shipped with CPython (the pydoc topic pages), in a fixed order."""
    global _HAYSTACK
    if _HAYSTACK is None:
        from pydoc_data.topics import topics

        _HAYSTACK = "\n\n".join(topics[k].strip() for k in sorted(topics))
    return _HAYSTACK


def _haystack_ids(tokenizer, n: int, offset: int) -> list[int]:
    text = haystack_text()
    start = offset % max(1, len(text) - 8 * n)
    ids = encode(tokenizer, text[start: start + 6 * n + 1000])  # ~4 chars per token: plenty
    if len(ids) < n:
        raise ValueError(f"context: the haystack text is too short for {n} tokens")
    return ids[:n]


def natural_prompt(tokenizer, context_tokens: int, offset: int = 0) -> list[int]:
    """``context_tokens`` tokens of natural text starting at character ``offset`` of the haystack."""
    return _haystack_ids(tokenizer, context_tokens, offset)


PASSKEY_INTRO = ("There is an important piece of information hidden inside a lot of irrelevant text. "
                 "Find it and memorize it. I will quiz you about it.\n\n")
PASSKEY_NEEDLE = "\n\nThe pass key is {key}. Remember it. {key} is the pass key.\n\n"
PASSKEY_QUESTION = "\n\nWhat is the pass key? The pass key is"


def passkey_prompt(tokenizer, context_tokens: int, key: int | None = None, depth: float = 0.5,
                   offset: int = 0) -> tuple[list[int], int]:
    """Needle in a haystack: -> (prompt ids of ``context_tokens`` tokens, the 5-digit pass key).
    The needle sits at fraction ``depth`` of the haystack."""
    key = key if key is not None else random.Random(offset).randrange(10000, 100000)
    intro, needle, question = (encode(tokenizer, s) for s in
                               (PASSKEY_INTRO, PASSKEY_NEEDLE.format(key=key), PASSKEY_QUESTION))
    n = context_tokens - len(intro) - len(needle) - len(question)
    if n < 16:
        raise ValueError(f"context: {context_tokens} tokens is too short for the pass-key prompt")
    hay = _haystack_ids(tokenizer, n, offset)
    at = int(depth * n)
    return intro + hay[:at] + needle + hay[at:] + question, key


def half_precision_draft(model):
    """A bfloat16 copy of ``model``: half the weight bytes per draft token, and (on SmolLM2) ~0.85
    greedy acceptance, where a layer-skipped half of the model gets < 0.1. Used by the demo and the
    benchmark as the draft of ``speculative`` and ``triforce``."""
    import copy

    if next(model.parameters()).dtype == torch.bfloat16:
        return None
    return copy.deepcopy(model).to(torch.bfloat16)


def compare_methods(model, prompts, methods=METHODS, max_new_tokens: int = 64, temperature: float = 0.0,
                    options: dict | None = None, draft="bf16", seed: int | None = 0, log=None) -> list[dict]:
    """Run ``methods`` on the same prompts; -> one row per method: ``method``, ``stats``, ``tokens``,
    ``speedup`` (tokens/s over the autoregressive run, when it is in ``methods``) and ``identical``
    (greedy: tokens equal to the autoregressive ones)."""
    from .generate import generate

    options = {**DEMO_OPTIONS, **(options or {})}
    if draft == "bf16":
        draft = half_precision_draft(model)
    rows = []
    for method in methods:
        if log:
            log(f"running {method} ...")
        out = generate(model, prompts, method=method, max_new_tokens=max_new_tokens, temperature=temperature,
                       draft=draft if method in ("speculative", "triforce") else None, seed=seed,
                       **options.get(method, {}))
        rows.append({"method": method, "stats": out.stats, "tokens": out.tokens})
    base = next((r for r in rows if r["method"] == "autoregressive"), None)
    for r in rows:
        r["speedup"] = r["stats"]["tokens_per_s"] / base["stats"]["tokens_per_s"] if base else None
        r["identical"] = (all(torch.equal(a, b) for a, b in zip(r["tokens"], base["tokens"]))
                          if base is not None and temperature == 0 else None)
    return rows


def format_table(rows: list[dict]) -> str:
    head = (f"{'method':<15} {'tok/s':>8} {'speed-up':>8} {'mean acc':>8} {'passes':>6} {'prefill s':>9} "
            f"{'same':>5}  acceptance per level; time per level (s)")
    lines = [head, "-" * len(head)]
    for r in rows:
        s = r["stats"]
        acc = ", ".join(f"{k} {v:.2f}" for k, v in s["acceptance"].items()) or "-"
        tim = ", ".join(f"{k} {v:.2f}" for k, v in s["time_s"].items())
        same = {None: "-", True: "yes", False: "NO"}[r["identical"]]
        sp = f"{r['speedup']:.2f}x" if r["speedup"] is not None else "-"
        lines.append(f"{r['method']:<15} {s['tokens_per_s']:>8.1f} {sp:>8} {s['mean_accepted']:>8.2f} "
                     f"{s['target_passes']:>6} {s['prefill_s']:>9.1f} {same:>5}  {acc}; {tim}")
    return "\n".join(lines)


def run_demo(context: int = 3000, max_new_tokens: int = 48, batch: int = 1, methods=METHODS,
             dtype: str | None = None, out=None, log=None) -> bool:
    """The README demo: a needle-in-a-haystack prompt on the embedded SmolLM2-135M, every method,
    greedy; prints the continuation and the comparison table. -> True when every method's tokens
    equal the autoregressive ones."""
    out = out or sys.stdout
    t0 = time.perf_counter()
    model, tok = load_model("smollm2", dtype)
    prompts, keys = [], []
    for b in range(batch):
        ids, key = passkey_prompt(tok, context - 7 * b, depth=0.3 + 0.4 * b / max(1, batch - 1), offset=4000 * b)
        prompts.append(torch.tensor(ids))
        keys.append(key)
    print(f"SmolLM2-135M ({next(model.parameters()).dtype}), {batch} pass-key prompt(s) of ~{context} tokens, "
          f"{max_new_tokens} new tokens each, greedy. Model load {time.perf_counter() - t0:.1f} s.", file=out)
    rows = compare_methods(model, prompts, methods, max_new_tokens, options=_cap_budget(context), log=log)
    base = rows[0]
    for b in range(batch):
        text = decode(tok, base["tokens"][b].tolist()).replace("\n", " ")
        print(f"[{b}] pass key {keys[b]} -> {text[:100]!r}", file=out)
    print(format_table(rows), file=out)
    ok = all(r["identical"] is not False for r in rows)
    print("greedy outputs identical to autoregressive: " + ("yes" if ok else "NO"), file=out)
    return ok


def _cap_budget(context: int) -> dict:
    """Demo options with the retrieval budget below the context (else it is the full cache)."""
    opts = {k: dict(v) for k, v in DEMO_OPTIONS.items()}
    opts["triforce"]["budget"] = min(opts["triforce"]["budget"], max(64, (context // 4) // 8 * 8))
    return opts


def bench_rows(model_name: str = "smollm2", dtype: str | None = None, context: int = 4096, batches=(1, 8),
               max_new_tokens: int = 32, methods=METHODS, temperature: float = 0.0, options: dict | None = None,
               out=None, log=None):
    """``triforce bench``: for each batch size, natural-text prompts of ~``context`` tokens (different
    passages per row, lengths differing by a few tokens), every method, one table per batch size.
    Yields one flat dict per (batch, method)."""
    out = out or sys.stdout
    model, tok = load_model(model_name, dtype)
    if tok is None:
        raise ValueError("model: benchmarking needs a tokenizer (use the embedded smollm2)")
    opts = _cap_budget(context)
    for k, v in (options or {}).items():
        opts.setdefault(k, {}).update(v)
    for batch in batches:
        prompts = [torch.tensor(natural_prompt(tok, context - 3 * b, offset=20000 * b)) for b in range(batch)]
        rows = compare_methods(model, prompts, methods, max_new_tokens, temperature, options=opts, log=log)
        print(f"\nbatch {batch}, context ~{context} tokens, {max_new_tokens} new tokens, "
              f"temperature {temperature}:", file=out)
        print(format_table(rows), file=out, flush=True)
        for r in rows:
            s = r["stats"]
            yield {"batch": batch, "context": context, "method": r["method"], "tokens_per_s": s["tokens_per_s"],
                   "speedup": r["speedup"], "acceptance": s["acceptance"], "mean_accepted": s["mean_accepted"],
                   "target_passes": s["target_passes"], "decode_s": s["decode_s"], "prefill_s": s["prefill_s"],
                   "time_s": s["time_s"], "identical": r["identical"], "new_tokens": s["new_tokens"]}
