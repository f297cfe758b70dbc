"""LFM2's decode and verification steps on the CPU: LFM2-350M's shape (1024 wide, 16 layers of which 10 gated short
convolutions and 6 attention layers of 16 query and 8 KV heads, an MLP of 4608, its 65536-token tied head), random
weights, over a full cache of ``--context`` tokens; batch 1, T = 1 (a decode step) and T = 5 (a verification pass).

Ours: the attention layers in the native layer stack between the convolution layers (which run as modules, their last
inputs in the cache's rings), and every layer as modules (``TRIFORCE_DECODER_LAYERS=0``); the baseline: transformers'
Lfm2ForCausalLM (eager attention) stepping its own cache (its convolution states and KV cache) from the same context,
T tokens a call (its cache grows by ~60 tokens over the run: noise beside the context). One call of each in turns.
Bytes = every weight read once (the head's included) + the KV cache read (+ the rings' few inputs); GB/s against the
copy bandwidth measured in the same run.

    python -m bench.bench_lfm2 [--quick] [--context N] [--dtype bfloat16|float32]
    # TRIFORCE_BENCH_CSV=/tmp/x.csv keeps the repo clean
"""
import argparse
import os
import tempfile

import torch

import triforce.models.llama as llama_module
from triforce.models import Llama, LlamaConfig

from .harness import copy_bandwidth, forward_step, measure_alternating, record

TYPES = ["conv", "conv", "full_attention", "conv", "conv", "full_attention", "conv", "conv", "full_attention", "conv",
         "full_attention", "conv", "full_attention", "conv", "full_attention", "conv"]
SHAPE = {"model_type": "lfm2", "vocab_size": 65536, "hidden_size": 1024, "intermediate_size": 6656,
         "num_hidden_layers": 16, "num_attention_heads": 16, "num_key_value_heads": 8, "layer_types": TYPES,
         "max_position_embeddings": 128000}


def transformers_step(config: LlamaConfig, model: Llama, context: int, T: int):
    """transformers' Lfm2ForCausalLM with ``model``'s weights, prefilled with ``context`` tokens; -> a call that runs
    ``T`` more through its cache."""
    import transformers

    with tempfile.TemporaryDirectory() as d:
        model.save_pretrained(d)
        hf = transformers.Lfm2ForCausalLM.from_pretrained(d, attn_implementation="eager", dtype=model.dtype).eval()
    ids = torch.randint(0, config.vocab_size, (1, context))
    with torch.no_grad():
        out = hf(ids, use_cache=True)
    state = {"cache": out.past_key_values}
    step_ids = torch.randint(0, config.vocab_size, (1, T))

    def step():
        with torch.no_grad():
            state["cache"] = hf(step_ids, past_key_values=state["cache"], use_cache=True).past_key_values
    return step


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer repetitions")
    p.add_argument("--context", type=int, default=1000)
    p.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    a = p.parse_args()
    dtype = getattr(torch, a.dtype)
    bw = copy_bandwidth("cpu")
    torch.manual_seed(0)
    model = Llama(LlamaConfig.from_dict(SHAPE)).eval().to(dtype)
    cfg = model.config
    weights = sum(m.weight.numel() * m.weight.element_size() for m in model.modules()
                  if isinstance(m, torch.nn.Linear))
    kv = sum(2 * h * cfg.head_dim * a.context * dtype.itemsize for h in cfg.kv_heads_per_layer)
    for T in (1, 5):
        ours = forward_step(model, 1, a.context, T)
        theirs = transformers_step(cfg, model, a.context, T)

        def stack(switch):
            def f():
                os.environ["TRIFORCE_DECODER_LAYERS"] = switch
                llama_module._STACK = None
                ours()
            return f
        t = measure_alternating({"stack": stack("1"), "modules": stack("0"), "transformers": theirs},
                                reps=5 if a.quick else 15)
        os.environ.pop("TRIFORCE_DECODER_LAYERS", None)
        llama_module._STACK = None
        shape = f"model=lfm2-350m-shape,B=1,ctx={a.context},T={T}"
        for name, backend in (("stack", "cpu-native-stack"), ("modules", "cpu-modules")):
            record(family="model", op="lfm2_forward", backend=backend, shape=shape, dtype=a.dtype,
                   bytes_moved=weights + kv, timing=t[name], bandwidth=bw, baseline="transformers-eager",
                   baseline_timing=t["transformers"])


if __name__ == "__main__":
    main()
