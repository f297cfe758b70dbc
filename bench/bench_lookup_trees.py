"""Prompt lookup's trees (``method="tree", draft="lookup"``) against its chains (``speculative``, ``draft="lookup"``)
and autoregressive decoding: SmolLM2-135M on its GGUF weights (``gguf-int8``: the demo's CPU model), greedy, on
the demo's pass-key prompts, natural text (Python's documentation) and Python source. Every configuration runs
``--rounds`` times, the configurations in turn, each row its fastest round; every output is checked token for
token against autoregressive decoding's; the prefill is shared and not timed. Rows in bench/results.csv (family
``lookup``); docs/engines.md ("Trees of lookups").

    python -m bench.bench_lookup_trees [--scenes passkey-1x1000 code-1x2000 ...] [--rounds 2]
"""
from __future__ import annotations

import argparse
import json

import torch

import triforce
from triforce.demo import SharedPrefill, natural_prompt, passkey_prompt
from triforce.models import hub

from .bench_pair import code_prompt
from .harness import record

SCENES = {  # name -> (prompts(tokenizer), new tokens)
    "passkey-1x1000": (lambda tok: [passkey_prompt(tok, 1000)[0]], 48),
    "passkey-1x6000": (lambda tok: [passkey_prompt(tok, 6000, depth=0.75)[0]], 48),
    "passkey-4x3000": (lambda tok: [passkey_prompt(tok, 3000 - 7 * b, depth=0.25 + 0.5 * b / 3, offset=4000 * b)[0]
                                    for b in range(4)], 32),
    "natural-1x4096": (lambda tok: [natural_prompt(tok, 4096)], 48),
    "natural-8x1024": (lambda tok: [natural_prompt(tok, 1024 - 3 * b, offset=20000 * b) for b in range(8)], 48),
    "code-1x2000": (lambda tok: [code_prompt(tok, 2000)], 64),
}
CONFIGS = [("autoregressive", {}), ("speculative:lookup", {"gamma": 4}), ("speculative:lookup", {"gamma": 8}),
           ("tree:lookup", {"tree": (2, 2, 1, 1)}), ("tree:lookup", {"tree": (2, 1, 1, 1, 1, 1, 1, 1)}),
           ("tree:lookup", {"tree": (4, 2, 1, 1, 1, 1, 1, 1)})]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenes", nargs="+", choices=list(SCENES), default=list(SCENES))
    ap.add_argument("--rounds", type=int, default=2, help="runs of every configuration, in turn (2)")
    ap.add_argument("--dtype", default="gguf-int8", help="the model's weights (hub.load_model; default gguf-int8)")
    a = ap.parse_args()
    model, tok = hub.load_model("smollm2", a.dtype)
    for scene in a.scenes:
        make, new = SCENES[scene]
        prompts = [torch.tensor(p) for p in make(tok)]
        best, base = {}, None
        with SharedPrefill(model, half_copy=False):
            for _ in range(a.rounds):
                for i, (label, opts) in enumerate(CONFIGS):
                    method, _, draft = label.partition(":")
                    out = triforce.generate(model, prompts, method=method, draft=draft or None, max_new_tokens=new,
                                            **opts)
                    base = out.tokens if base is None else base
                    if not all(torch.equal(x, y) for x, y in zip(out.tokens, base)):
                        raise SystemExit(f"{scene} {label} {opts}: output differs from autoregressive decoding's")
                    if i not in best or out.stats["tokens_per_s"] > best[i]["tokens_per_s"]:
                        best[i] = out.stats
        ar = best[0]["tokens_per_s"]
        print(f"\n{scene}: {len(prompts)} prompt(s), {new} new tokens, best of {a.rounds} rounds")
        for i, (label, opts) in enumerate(CONFIGS):
            s = best[i]
            setting = ",".join(str(k) for k in opts.get("tree", ())) or str(opts.get("gamma", ""))
            print(f"  {label:20s} {setting:16s} {s['tokens_per_s']:7.1f} tok/s {s['tokens_per_s'] / ar:5.2f}x "
                  f"passes {s['target_passes']:3d} tokens/pass {s['mean_accepted']:.2f} "
                  f"acceptance {json.dumps({k: round(v, 3) for k, v in s['acceptance'].items()})}", flush=True)
            per = lambda tps: {"median_s": 1 / tps, "p10_s": 1 / tps, "p90_s": 1 / tps}  # noqa: E731 (s per token)
            record(family="lookup", op=f"generate:{label}", backend="auto",
                   shape=f"scene={scene},B={len(prompts)},new={new},{'tree' if 'tree' in opts else 'gamma'}="
                         f"{setting.replace(',', '-')}", dtype=a.dtype, timing=per(s["tokens_per_s"]),
                   baseline="autoregressive", baseline_timing=per(ar),
                   extra=json.dumps({"acceptance": s["acceptance"], "mean_accepted": s["mean_accepted"],
                                     "target_passes": s["target_passes"], "time_s": s["time_s"], "identical": True}))


if __name__ == "__main__":
    main()
