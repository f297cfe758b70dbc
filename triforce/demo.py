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
from .engines.methods import LOOKUP_ROWS
from .models.hub import decode, device_of, encode, load_model, set_kv_dtype  # noqa: F401  (re-exported)

# Per-method options used by the demo and the benchmark (small CPU-friendly budgets).
DEMO_OPTIONS = {
    "autoregressive": {},
    "speculative": {"gamma": 4},
    "magicdec": {"gamma": 4, "sink": 16, "window": 240},
    "triforce": {"gamma1": 2, "gamma2": 6, "budget": 512, "chunk_size": 8, "sink": 16, "window": 240},
    "tree": {"tree": (2, 2, 1, 1), "sink": 16, "window": 240},
    "tree:lookup": {"tree": (2, 2, 1, 1)},  # (no draft model: no StreamingLLM window)
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


def _check_rounds(rounds) -> None:
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be an int >= 1, got {rounds!r}")


def compare_methods(model, prompts, methods=METHODS, max_new_tokens: int = 64, temperature: float = 0.0,
                    options: dict | None = None, draft="bf16", seed: int | None = 0, log=None,
                    rounds: int = 1) -> list[dict]:
    """Run ``methods`` on the same prompts; -> one row per method: ``method``, ``stats``, ``tokens``,
    ``speedup`` (tokens/s over the autoregressive run, when it is in ``methods``) and ``identical``
    (greedy: tokens equal to the autoregressive ones). A label ``method:kind`` drafts with the shipped
    heads of that kind (``tree:mlp``), with the int8 copy of the model (``speculative:int8``), or with prompt
    lookup (``speculative:lookup``, ``triforce:lookup``).

    ``rounds``: every method runs that many times, the methods in turn (a machine whose speed drifts slows
    them alike), and a row holds its method's fastest run (its ``prefill_s`` is the first run's: a
    ``SharedPrefill`` serves the later ones). Every run of a method must emit the same tokens (the seed
    fixes a sampling run's draws): a method whose runs differ is not ``identical``."""
    from .generate import generate

    _check_rounds(rounds)
    options = {**DEMO_OPTIONS, **(options or {})}
    if draft == "bf16":
        from .engines.drafters import half_precision_copy

        draft = half_precision_copy(model)
    rows, stable = {}, {}
    for rnd in range(rounds):
        for label in methods:
            method, _, variant = label.partition(":")
            if variant == "int8":
                from .models.quant import int8_copy

                label_draft = int8_copy(model)
            else:
                label_draft = variant or (draft if method in ("speculative", "triforce") else None)
            if log:
                log(f"running {label} ..." if rounds == 1 else f"running {label} (round {rnd + 1} of {rounds}) ...")
            out = generate(model, prompts, method=method, max_new_tokens=max_new_tokens, temperature=temperature,
                           draft=label_draft, seed=seed, **options.get(label, options.get(method, {})))
            first = rows.get(label)
            if first is None:
                rows[label] = {"method": label, "stats": out.stats, "tokens": out.tokens}
                stable[label] = True
                continue
            stable[label] &= all(torch.equal(a, b) for a, b in zip(out.tokens, first["tokens"]))
            if out.stats["tokens_per_s"] > first["stats"]["tokens_per_s"]:
                first["stats"] = {**out.stats, "prefill_s": first["stats"]["prefill_s"]}
    rows = list(rows.values())
    base = next((r for r in rows if r["method"] == "autoregressive"), None)
    for r in rows:
        # no speed-up when autoregressive decoded nothing after its prefill (max_new_tokens=1: every token
        # comes from the prefill, so there is no decode rate to compare with)
        ar = base["stats"]["tokens_per_s"] if base else 0.0
        r["speedup"] = r["stats"]["tokens_per_s"] / ar if ar > 0 else None
        r["identical"] = (stable[r["method"]] and all(torch.equal(a, b) for a, b in zip(r["tokens"], base["tokens"]))
                          if base is not None and temperature == 0 else None)
    return rows


def format_table(rows: list[dict]) -> str:
    w = max([15] + [len(r["method"]) for r in rows])
    head = (f"{'method':<{w}} {'tok/s':>8} {'speed-up':>8} {'tok/pass':>8} {'passes':>6} {'prefill s':>9} "
            f"{'same output':>11}  acceptance per level; time per level (s)")
    lines = [head, "-" * len(head)]
    for r in rows:
        s = r["stats"]
        acc = ", ".join(f"{k} {v:.2f}" for k, v in s["acceptance"].items()) or "-"
        tim = ", ".join(f"{k} {v:.2f}" for k, v in s["time_s"].items())
        same = {None: "-", True: "yes", False: "NO"}[r["identical"]]
        sp = f"{r['speedup']:.2f}x" if r["speedup"] is not None else "-"
        lines.append(f"{r['method']:<{w}} {s['tokens_per_s']:>8.1f} {sp:>8} {s['mean_accepted']:>8.2f} "
                     f"{s['target_passes']:>6} {s['prefill_s']:>9.1f} {same:>11}  {acc}; {tim}")
    return "\n".join(lines)


class SharedPrefill:
    """Within ``with SharedPrefill(model):``, the target's full-cache prefill of a given prompt list runs
    once and is copied into every later full cache of the same prompts (the demo compares methods on
    the same prompts; each would otherwise spend minutes re-reading the same long context). The copy
    is exact: the same keys, values, lengths, chunk-mean keys and last queries."""

    def __init__(self, model, half_copy: bool = True, int8_copy: bool = False):
        self.model, self.saved, self.half_copy, self.int8_copy = model, {}, half_copy, int8_copy

    def __enter__(self):
        from .engines.drafters import half_precision_copy
        from .models.cache import FullCache
        from .models.quant import int8_copy

        # any copy of the model must be made before the patch below (a copy would take the patched method)
        if self.half_copy:  # (False: no run will use the default bfloat16 draft)
            half_precision_copy(self.model)
        if self.int8_copy:  # a ``speculative:int8`` run will draft with it
            int8_copy(self.model)
        real = self.model.prefill

        def prefill(prompts, cache, chunk_size: int = 256):
            key = tuple((p.data_ptr(), len(p)) for p in prompts) if isinstance(cache, FullCache) else None
            snap = self.saved.get(key)
            if key is None or snap is None or (cache.chunk_size is not None and snap["cache"].chunk_size is None):
                logits = real(prompts, cache, chunk_size)
                if key is not None and (snap is None or cache.chunk_size is not None):
                    self.saved[key] = {"cache": cache, "logits": logits.clone(),
                                       "state": _cache_state(cache)}
                return logits
            _restore(cache, snap["state"])
            return snap["logits"].clone()

        self.model.prefill = prefill
        return self

    def __exit__(self, *exc):
        del self.model.prefill  # back to the class's method
        self.saved.clear()


def _cache_state(cache) -> dict:
    n = int(cache.lengths.max())
    state = {"n": n, "lengths": cache.lengths.clone(), "k": [t[:, :n].clone() for t in cache.k],
             "v": [t[:, :n].clone() for t in cache.v], "chunk_size": cache.chunk_size}
    if cache.chunk_size is not None:
        c = n // cache.chunk_size
        state["chunks"] = [t[:, :c].clone() for t in cache.chunk_keys]
        state["last_query"] = [t.clone() for t in cache.last_query]
    return state


def _restore(cache, state: dict) -> None:
    cache.reset()
    n = state["n"]
    for dst, src in zip(cache.k + cache.v, state["k"] + state["v"]):
        dst[:, :n] = src
    if cache.chunk_size is not None:
        for dst, src in zip(cache.chunk_keys, state["chunks"]):
            dst[:, : src.shape[1]] = src
        for dst, src in zip(cache.last_query, state["last_query"]):
            dst.copy_(src)
    cache.lengths.copy_(state["lengths"])
    cache._bound = n


def weight_bytes(model) -> int:
    """Bytes of parameters one forward pass reads: all but the embedding table, of which a pass reads only
    its tokens' rows (a tied table is read whole, as the LM head)."""
    emb = model.model.embed_tokens.weight
    n = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))  # buffers: quantised layers
    return n if model.lm_head.weight is emb else n - emb.numel() * emb.element_size()


def kv_bytes_per_token(model) -> int:
    """Bytes of K and V one token adds to a full cache in the dtype the engines make it in."""
    from .engines.decode import cache_dtype

    c = model.config
    return 2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * cache_dtype(model).itemsize


def _kv_bytes(model, prompts) -> int:
    return kv_bytes_per_token(model) * sum(len(p) for p in prompts)


def _ms_per_pass(stats: dict, part: str | None) -> float:
    """Milliseconds per target pass of one timed part (``None``: all but the full level: the drafting)."""
    t = stats["time_s"]
    total = t.get(part, 0.0) if part else sum(v for k, v in t.items() if k != "full")
    return 1e3 * total / max(1, stats["target_passes"])


def why_it_loses(row: dict, weight_bytes: int, kv_bytes: int, base: dict | None = None) -> str:
    """One line, from the run's own numbers, on why a method is slower than autoregressive here: the
    drafting's and the verification pass's cost per target pass (the pass against an autoregressive
    step of ``base``, the autoregressive row, when given) and the tokens a pass yields."""
    s = row["stats"]
    full_ms, side_ms = _ms_per_pass(s, "full"), _ms_per_pass(s, None)
    regime = ("the weights dominate what a target pass reads" if weight_bytes > kv_bytes
              else "the KV cache dominates what a target pass reads")
    step = ""
    if base is not None and base["stats"]["target_passes"]:
        ar_ms = _ms_per_pass(base["stats"], "full")
        step = f", {full_ms / ar_ms:.1f}x an autoregressive step ({ar_ms:.0f} ms)" if ar_ms > 0 else ""
    batch = ""
    if row["method"].endswith(":lookup") and len(s.get("lengths", ())) > 1:
        batch = ("; a batch runs passes until its row with the fewest accepted drafts is done, and a row that "
                 "does not repeat its context gets few")
    return (f"{row['method']} loses here: per target pass the drafting costs {side_ms:.0f} ms and the pass "
            f"itself {full_ms:.0f} ms{step}, and {s['mean_accepted']:.2f} tokens per pass do not pay for it "
            f"({regime}: weights {weight_bytes / 1e6:.0f} MB, KV {kv_bytes / 1e6:.0f} MB){batch}")


DEMO_HEADS = ("hidden_transfer", (1, 1))  # the shipped head set and tree of the batch-1 scene (docs/heads.md)
# prompt lookup (speculative:lookup) in every scene; a proposal is as long as its match (lookup_length="match"),
# up to gamma: 8 at batch 1, where a pass of 9 tokens costs ~1.8 decode steps on a CPU, the method's default 4
# in a batch, where every row pays for the longest proposal (docs/engines.md, "Prompt lookup")
LOOKUP_ONE, LOOKUP = {"gamma": 8}, {"gamma": 4}
# prompt lookup's trees: on a GPU only, where a pass's width costs little at batch 1 (on a CPU each token a pass
# verifies costs about a tenth of a step, and the trees lose to the chain there: docs/engines.md, "Trees of lookups")
LOOKUP_TREE = {"tree": (4, 2, 2, 1, 1, 1, 1, 1)}


def demo_scenes(quick: bool, device_type: str, context: int | None = None, batch: int | None = None,
                max_new_tokens: int | None = None) -> list[dict]:
    """The regimes where each method pays, on this hardware. CPU: batch 1 (the weights dominate: a
    cheap draft model or a token tree), batch 1 at a long context (every step also reads the KV cache, at
    6000 tokens half the weights' bytes on SmolLM2: a draft with cheap weights on a small cache, MagicDec
    with the int8 copy on the retrieval cache, and TriForce), and batch x context large enough that the KV
    cache dominates (self-drafting from a small cache: MagicDec, TriForce). GPU: the large-batch regime.
    Prompt lookup (``speculative:lookup``, drafts copied from the sequence itself) runs in every scene, and as
    TriForce's bottom level (``triforce:lookup``) in the batch-1 long-context scene."""
    if device_type == "cuda":
        long = {"batch": batch or 32, "context": context or 4000, "new": max_new_tokens or 64}
    elif quick:
        long = {"batch": batch or 2, "context": context or 600, "new": max_new_tokens or 8}
    else:
        long = {"batch": batch or 4, "context": context or 3000, "new": max_new_tokens or 32}
    short = {"batch": 1, "context": 200 if quick else 1000, "new": max_new_tokens or (8 if quick else 48)}
    budget = max(64, min(256, long["context"] // 4) // 8 * 8)
    deep = {"batch": 1, "context": 600 if quick else 6000, "new": max_new_tokens or (8 if quick else 48)}
    deep_budget = max(64, min(512, deep["context"] // 8) // 8 * 8)
    deep_scene = [
        {"title": f"batch 1 x {deep['context']} tokens: a long context adds its KV cache to what every step reads "
                  f"(a draft with cheap weights on a small cache pays)",
         # the needle at 3/4 of the haystack: at 6000 tokens SmolLM2-135M answers the pass key from there
         # (measured: 0.75 and 0.9 yes; 0.25 and 0.5 it continues the text instead)
         **deep, "depth": 0.75, "methods": ["autoregressive", "magicdec", "magicdec:int8", "triforce",
                                            "triforce:lookup", "speculative:lookup"],
         "options": {"speculative:lookup": LOOKUP_ONE,
                     "triforce:lookup": {"gamma1": 2, "gamma2": 6, "budget": deep_budget, "chunk_size": 8},
                     "magicdec": {"draft_cache": "retrieval", "budget": deep_budget, "gamma": 2},
                     "magicdec:int8": {"draft_cache": "retrieval", "budget": deep_budget, "gamma": 2},
                     "triforce": {"gamma1": 2, "gamma2": 6, "budget": deep_budget, "chunk_size": 8, "sink": 16,
                                  "window": 240}}},
    ] if device_type == "cpu" else []  # (the int8 copy is a CPU draft; a GPU's long scene is the batched one)
    return [
        {"title": "batch 1: the weights dominate each step (a cheaper draft or a token tree pays)",
         **short, "methods": ["autoregressive", "speculative", *(["speculative:int8"] if device_type == "cpu" else []),
                              "tree", f"tree:{DEMO_HEADS[0]}", "speculative:lookup",
                              *(["tree:lookup"] if device_type == "cuda" else [])],
         "options": {"speculative": {"gamma": 3}, "speculative:int8": {"gamma": 3},
                     "speculative:lookup": LOOKUP_ONE, "tree:lookup": LOOKUP_TREE,
                     "tree": {"tree": (2, 2, 1, 1), "sink": 16, "window": 240},
                     f"tree:{DEMO_HEADS[0]}": {"tree": DEMO_HEADS[1]}}},
        *deep_scene,
        {"title": f"batch {long['batch']} x {long['context']} tokens: the KV cache dominates what a step reads "
                  f"(drafting from a small cache saves those bytes)",
         **long, "methods": ["autoregressive", "magicdec", "triforce", "speculative:lookup"],
         "options": {"speculative:lookup": LOOKUP,
                     "magicdec": {"draft_cache": "retrieval", "budget": budget, "gamma": 2},
                     "triforce": {"gamma1": 2, "gamma2": 6, "budget": budget, "chunk_size": 8, "sink": 16,
                                  "window": 240}}},
    ]


def run_demo(quick: bool = False, context: int | None = None, max_new_tokens: int | None = None,
             batch: int | None = None, methods=METHODS, dtype: str | None = None, out=None, log=None,
             device=None, rounds: int | None = None, kv_dtype: str | None = None) -> bool:
    """The README demo on the embedded SmolLM2-135M: pass-key prompts, greedy, every method in the
    regime where it pays on this hardware (:func:`demo_scenes`); per method tokens/s, speed-up, mean
    accepted tokens per target pass, acceptance per level and "same output"; one line on why a method
    that loses here loses. ``rounds`` (default 3, ``quick`` 1): runs of every method per scene, in turn, each
    row its fastest (:func:`compare_methods`). -> True when every method's tokens equal the autoregressive
    ones. ``kv_dtype``: the KV caches' dtype (:func:`~triforce.models.hub.set_kv_dtype`)."""
    out = out or sys.stdout
    t0 = time.perf_counter()
    rounds = (1 if quick else 3) if rounds is None else rounds
    _check_rounds(rounds)  # before the model loads
    if dtype is None and device_of(None if device is None else str(device)).type == "cpu":
        # on the CPU the model runs on its file's own Q4_1 / Q8_0 weights with integer dot products, as
        # llama.cpp runs such a file (--dtype gguf: the same weights, bitwise the float32 model, slower)
        dtype = "gguf-int8"
    model, tok = load_model("smollm2", dtype, device)
    set_kv_dtype(model, kv_dtype)
    device = next(model.parameters()).device
    from .models.quant import Int8DotLinear, Q4Linear

    packed = any(isinstance(m, (Q4Linear, Int8DotLinear)) for m in model.modules())
    integer = any(isinstance(m, Int8DotLinear) for m in model.modules())
    weights = ("its GGUF file's Q4_1 / Q8_0 weights, int8 activation blocks" if integer
               else "float32 on its GGUF file's Q4_1 / Q8_0 weights" if packed
               else str(next(model.parameters()).dtype).replace("torch.", ""))
    if model.kv_dtype != next(model.parameters()).dtype:
        weights += f", {str(model.kv_dtype).replace('torch.', '')} KV cache"
    runs = (f" Each method ran {rounds} times per scene, the methods in turn; a row is its fastest run."
            if rounds > 1 else "")
    print(f"SmolLM2-135M ({weights}, {device.type}, {torch.get_num_threads()} threads), "
          f"greedy; model load {time.perf_counter() - t0:.1f} s. Prefill is shared by the methods of a scene "
          f"and not counted in tokens/s.{runs}", file=out)
    ok, compared = True, False
    # the int8 copy quantises a float32 model only, and is cheaper than the target only where the target's
    # layers are float32 (a model on its GGUF weights reads fewer bytes than its int8 copy)
    int8 = next(model.parameters()).dtype == torch.float32 and not packed
    runs = []  # every scene's prompts first: a context too short for one fails before any scene runs
    for scene in demo_scenes(quick, device.type, context, batch, max_new_tokens):
        wanted = [m for m in scene["methods"] if m.partition(":")[0] in methods and (int8 or not m.endswith(":int8"))]
        if all(m == "autoregressive" for m in wanted):  # nothing of this scene's to run, or to compare
            continue
        prompts, keys = [], []
        for b in range(scene["batch"]):
            depth = scene.get("depth", 0.25 + 0.5 * b / max(1, scene["batch"] - 1))
            ids, key = passkey_prompt(tok, scene["context"] - 7 * b, depth=depth, offset=4000 * b)
            prompts.append(torch.tensor(ids, device=device))
            keys.append(key)
        runs.append((scene, wanted, prompts, keys))
    for scene, wanted, prompts, keys in runs:
        print(f"\n== {scene['title']}: {scene['batch']} pass-key prompt(s) of ~{scene['context']} tokens, "
              f"{scene['new']} new tokens each", file=out)
        with SharedPrefill(model, int8_copy=any(m.endswith(":int8") for m in wanted)):
            rows = compare_methods(model, prompts, wanted, scene["new"], options=scene["options"], log=log,
                                   rounds=rounds)
        base = next((r for r in rows if r["method"] == "autoregressive"), None)
        text = decode(tok, rows[0]["tokens"][0].tolist()).replace("\n", " ")
        print(f"[0] pass key {keys[0]} -> {text[:80]!r}", file=out)
        print(format_table(rows), file=out)
        weights, kv = weight_bytes(model), _kv_bytes(model, prompts)
        for r in rows:
            if r["speedup"] is not None and r["speedup"] < 1 and r["method"] != "autoregressive":
                print("  " + why_it_loses(r, weights, kv, base), file=out)
            for note in r["stats"].get("notes", []):
                print(f"  note: {note}", file=out)
        ok &= all(r["identical"] is not False for r in rows)
        compared |= any(r["identical"] is not None and r["method"] != "autoregressive" for r in rows)
    verdict = ("yes" if ok else "NO") if compared else "not compared (autoregressive is not among the methods)"
    print("\ngreedy outputs identical to autoregressive: " + verdict, file=out)
    return ok


def _cap_budget(context: int) -> dict:
    """Demo options with the retrieval budget below the context (else it is the full cache)."""
    opts = {k: dict(v) for k, v in DEMO_OPTIONS.items()}
    opts["triforce"]["budget"] = min(opts["triforce"]["budget"], max(64, (context // 4) // 8 * 8))
    return opts


def bench_rows(model_name: str = "smollm2", dtype: str | None = None, context: int = 4096, batches=(1, 8),
               max_new_tokens: int = 32, methods=(*METHODS, *LOOKUP_ROWS), temperature: float = 0.0,
               options: dict | None = None,
               out=None, log=None, device=None, rounds: int = 1, kv_dtype: str | None = None):
    """``triforce bench``: for each batch size, natural-text prompts of ~``context`` tokens (different
    passages per row, lengths differing by a few tokens), every method and prompt lookup (``speculative:lookup``,
    ``tree:lookup``)
    (``rounds`` runs each, in turn, the fastest kept: :func:`compare_methods`), one table per batch size, on
    ``device`` (default: the CPU).
    Yields one flat dict per (batch, method). ``kv_dtype``: the KV caches' dtype (:func:`set_kv_dtype`)."""
    out = out or sys.stdout
    model, tok = load_model(model_name, dtype, device)
    set_kv_dtype(model, kv_dtype)
    if tok is None:
        raise ValueError("model: benchmarking needs a tokenizer (use the embedded smollm2)")
    limit = model.config.max_position_embeddings
    if context + max_new_tokens > limit:  # before any method runs, not after the first
        raise ValueError(f"context: {context} prompt tokens + {max_new_tokens} new tokens exceed the model's context "
                         f"of {limit} tokens; use at most {max(limit - max_new_tokens, 1)}")
    opts = _cap_budget(context)
    for k, v in (options or {}).items():
        opts.setdefault(k, {}).update(v)
    for batch in batches:
        prompts = [torch.tensor(natural_prompt(tok, context - 3 * b, offset=20000 * b), device=model.device)
                   for b in range(batch)]
        rows = compare_methods(model, prompts, methods, max_new_tokens, temperature, options=opts, log=log,
                               rounds=rounds)
        print(f"\nbatch {batch}, context ~{context} tokens, {max_new_tokens} new tokens, "
              f"temperature {temperature}:", file=out)
        print(format_table(rows), file=out, flush=True)
        for r in rows:
            s = r["stats"]
            yield {"batch": batch, "context": context, "method": r["method"], "tokens_per_s": s["tokens_per_s"],
                   "speedup": r["speedup"], "acceptance": s["acceptance"], "mean_accepted": s["mean_accepted"],
                   "target_passes": s["target_passes"], "row_passes": s["row_passes"], "decode_s": s["decode_s"],
                   "prefill_s": s["prefill_s"],
                   "time_s": s["time_s"], "identical": r["identical"], "new_tokens": s["new_tokens"]}
