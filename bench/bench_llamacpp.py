"""llama.cpp beside us on the same GGUF file: the peer baseline for a model run on its own blocks on a CPU.

Opt-in: it needs ``llama-cpp-python`` (``pip install llama-cpp-python``: llama.cpp built from source, ~15
minutes on two cores), which no requirements file names; never part of the README's commands or of CI.

Per model (``--models``: ``smollm2``, the embedded Q4_1 file; ``qwen2.5-coder-0.5b`` / ``-1.5b``, the pair's
Q4_K_M files, fetched as ``python -m triforce fetch-pair`` does), one prompt of ``--context`` tokens of
natural text (our tokenizer; the same ids go to both), prefilled, then ``--new`` greedy tokens one at a
time, each a forward pass of one token and an argmax:

* ``llama.cpp``: ``Llama(path, n_ctx, n_threads, n_batch=256)``, ``eval(prompt)``, then ``eval([token])``
  per step and the argmax of its logits (llama.cpp's own CPU kernels: its vec_dot on the file's blocks,
  f16 KV cache);
* ``triforce``: the model in ``--dtype`` (default ``gguf-int8``), ``prefill`` into a ``FullCache``, then
  one-token forwards.

The time per decode step (median over the tokens) goes to bench/results.csv (family ``model``, op
``decode:<model>``, backends ``llama.cpp`` and ``triforce``, the latter with llama.cpp as its baseline).
``--method`` adds our ``generate`` with a faster lossless method (``tree`` with the Hidden Transfer heads
for SmolLM2, ``speculative`` with the 0.5B for the 1.5B) as tokens/s against llama.cpp's autoregressive
decoding. The greedy tokens of the two implementations need not agree: their arithmetic differs (x rounded
to int8 blocks in both, by different rules; llama.cpp's KV cache is float16).

    python -m bench.bench_llamacpp [--models smollm2 qwen2.5-coder-1.5b] [--context 1000] [--new 48] [--method]
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from triforce.demo import natural_prompt
from triforce.generate import generate
from triforce.models import FullCache, hub

from .harness import record

# our fastest lossless method per model, as generate() options
FAST = {"smollm2": dict(method="tree", draft="hidden_transfer", tree=(1, 1)),  # the demo's batch-1 tree
        "qwen2.5-coder-1.5b": dict(method="speculative", draft="qwen2.5-coder-0.5b", gamma=3)}


def _timing(times: list[float]) -> dict:
    t = torch.tensor(times, dtype=torch.float64)
    return {"median_s": float(t.median()), "p10_s": float(t.quantile(0.1)), "p90_s": float(t.quantile(0.9))}


def _path(name: str) -> str:
    from triforce.models.smollm2 import smollm2_gguf_path

    return str(smollm2_gguf_path()) if name == "smollm2" else hub.model_path(name)


def llamacpp_steps(path: str, ids: list[int], new: int, threads: int) -> tuple[list[float], list[int]]:
    """llama.cpp's per-token decode times and greedy tokens after prefilling ``ids``."""
    import numpy as np
    from llama_cpp import Llama

    llm = Llama(model_path=path, n_ctx=len(ids) + new + 8, n_threads=threads, n_threads_batch=threads,
                n_batch=256, logits_all=False, verbose=False)
    vocab = llm.n_vocab()

    def last_token():  # the argmax of the last evaluated token's logits (llama.cpp's own buffer)
        return int(np.argmax(np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(vocab,))))

    llm.eval(ids)
    tok = last_token()
    times, out = [], [tok]
    for _ in range(new):
        t0 = time.perf_counter()
        llm.eval([tok])
        tok = last_token()
        times.append(time.perf_counter() - t0)
        out.append(tok)
    return times, out


def triforce_steps(model, ids: list[int], new: int) -> tuple[list[float], list[int]]:
    """Our per-token decode times and greedy tokens after prefilling ``ids`` (FullCache, one-token forwards)."""
    cache = FullCache(model.config, 1, len(ids) + new + 8)
    with torch.inference_mode():
        tok = model.prefill([torch.tensor(ids)], cache)[0].argmax()
        times, out = [], [int(tok)]
        for _ in range(new):
            t0 = time.perf_counter()
            tok = model(tok.view(1, 1), cache=cache)[0, -1].argmax()
            times.append(time.perf_counter() - t0)
            out.append(int(tok))
    return times, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["smollm2"], choices=["smollm2", *hub.PAIR_NAMES])
    ap.add_argument("--context", type=int, default=1000, help="prompt tokens (default 1000)")
    ap.add_argument("--new", type=int, default=48, help="decode steps (default 48)")
    ap.add_argument("--dtype", default="gguf-int8", choices=hub.GGUF_WEIGHTS + ("float32",))
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--method", action="store_true", help="also our fastest lossless method (FAST) as tokens/s")
    a = ap.parse_args()
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        raise SystemExit("llama-cpp-python is not installed (pip install llama-cpp-python); this baseline is "
                         "opt-in") from None
    torch.set_num_threads(a.threads)
    for name in a.models:
        model, tok = hub.load_model(name, a.dtype)
        ids = natural_prompt(tok, a.context)
        shape = f"B=1,ctx={len(ids)},new={a.new},threads={a.threads}"
        lt, ltoks = llamacpp_steps(_path(name), ids, a.new, a.threads)
        ot, otoks = triforce_steps(model, ids, a.new)
        agree = next((i for i, (x, y) in enumerate(zip(ltoks, otoks)) if x != y), len(otoks))
        base = _timing(lt)
        record(family="model", op=f"decode:{name}", backend="llama.cpp", shape=shape, dtype="gguf", timing=base)
        record(family="model", op=f"decode:{name}", backend="triforce", shape=shape, dtype=a.dtype, timing=_timing(ot),
               baseline="llama.cpp", baseline_timing=base,
               extra=json.dumps({"tokens_agree_first": agree, "of": len(otoks)}))
        print(f"{name}: llama.cpp {1 / base['median_s']:.1f} tok/s, triforce {a.dtype} "
              f"{1 / _timing(ot)['median_s']:.1f} tok/s a decode step; greedy tokens agree for the first {agree} "
              f"of {len(otoks)}", flush=True)
        if a.method and name in FAST:
            opts = dict(FAST[name])
            if opts["draft"] in hub.PAIR_NAMES:
                opts["draft"] = hub.load_draft(opts["draft"], a.dtype)
            generate(model, [torch.tensor(ids)], max_new_tokens=4, **opts)  # warm-up (heads, caches)
            out = generate(model, [torch.tensor(ids)], max_new_tokens=a.new, **opts)
            tps = out.stats["tokens_per_s"]
            label = f"{opts['method']}:{FAST[name]['draft']}"
            record(family="model", op=f"decode:{name}", backend=f"triforce:{label}", shape=shape, dtype=a.dtype,
                   timing={"median_s": 1 / tps, "p10_s": 1 / tps, "p90_s": 1 / tps}, baseline="llama.cpp",
                   baseline_timing=base)
            print(f"{name}: triforce {label} {tps:.1f} tok/s ({tps * base['median_s']:.2f}x llama.cpp's "
                  f"autoregressive decoding)", flush=True)
        del model


if __name__ == "__main__":
    main()
