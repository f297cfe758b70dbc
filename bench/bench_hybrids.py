"""Hybrid models' decode and verification steps on the CPU, their recurrent layers' state in the caches: LFM2-350M's
shape (``--model lfm2``: 1024 wide, 16 layers of which 10 gated short convolutions and 6 attention layers of 16 query
and 8 KV heads, an MLP of 4608, its 65536-token tied head) and a Granite 4.0 H-shaped stack (``--model granite-h``:
1536 wide, 12 layers of which 10 Mamba-2 layers of 48 heads of 64 with a state of 128, one group, 4 taps, and 2
attention layers of 12 query and 4 KV heads, a dense MLP of 4096, a 100352-token head; not a published config) and a
Qwen3.5-0.8B-like stack (``--model qwen3.5``: 1024 wide, 12 layers of which 9 gated DeltaNet layers of 16 key and 16
value heads of 128, 4 taps, and 3 gated attention layers of 8 query and 2 KV heads of 256, RoPE on a quarter of each,
an MLP of 3584, a 248320-token tied head; half of Qwen3.5-0.8B's 24 layers, as we read its config) and a
Falcon-H1-0.5B-like stack (``--model falcon-h1``: 1024 wide, 12 layers each of an attention of 8 query and 2 KV heads
of 64 beside a Mamba-2 mixer 1536 wide, 24 heads of 64 with a state of 128, one group, 4 taps, no gated norm, an MLP of
2048, a 32784-token head; a third of its 36 layers, as we recall its config: not checked against a published file),
and Lfm3Config's defaults cut to 12 of its 24 layers (``--model lfm3``: 2048 wide, 7 convolutions of 7 taps, 3 full
layers of proportional RoPE and 2 sliding layers of a 256-token window, 16 query and 4 KV heads of 128, gated heads,
sandwich norms, an MLP of 7680, a 128000-token tied head), random weights, over a full cache of ``--context`` tokens;
batch 1, T = 1 (a decode step) and T = 5 (a verification pass).

Ours: the attention layers in the native layer stack between the recurrent layers (which run as modules, their
state in the cache), and every layer as modules (``TRIFORCE_DECODER_LAYERS=0``); the baseline: transformers' model
(eager attention) stepping its own cache (its convolution and state space model states and KV cache) from the same
context, T tokens a call (its cache grows by ~60 tokens over the run: noise beside the context). One call of each in
turns. Bytes = every weight read once (the head's included) + the KV cache read (+ the Mamba layers' states read and
written once, the DeltaNet layers' alike); GB/s against the copy bandwidth measured in the same run.

    python -m bench.bench_hybrids [--model lfm2|granite-h|qwen3.5|falcon-h1|lfm3] [--quick] [--context N]
                                  [--dtype bfloat16|float32]
    # TRIFORCE_BENCH_CSV=/tmp/x.csv keeps the repo clean
"""
import argparse
import math
import os
import tempfile

import torch

import triforce.models.llama as llama_module
from triforce.models import Llama, LlamaConfig

from .harness import copy_bandwidth, forward_step, measure_alternating, record

TYPES = ["conv", "conv", "full_attention", "conv", "conv", "full_attention", "conv", "conv", "full_attention", "conv",
         "full_attention", "conv", "full_attention", "conv", "full_attention", "conv"]
SHAPES = {
    "lfm2": ("lfm2-350m-shape", "lfm2_forward", "Lfm2ForCausalLM", {
        "model_type": "lfm2", "vocab_size": 65536, "hidden_size": 1024, "intermediate_size": 6656,
        "num_hidden_layers": 16, "num_attention_heads": 16, "num_key_value_heads": 8, "layer_types": TYPES,
        "max_position_embeddings": 128000}),
    "granite-h": ("granite-4.0-h-shape-12-layers", "mamba2_forward", "GraniteMoeHybridForCausalLM", {
        "model_type": "granitemoehybrid", "vocab_size": 100352, "hidden_size": 1536, "intermediate_size": 512,
        "shared_intermediate_size": 4096, "num_local_experts": 0, "num_experts_per_tok": 0, "num_hidden_layers": 12,
        "num_attention_heads": 12, "num_key_value_heads": 4, "position_embedding_type": "rope",
        "layer_types": ["mamba"] * 5 + ["attention"] + ["mamba"] * 5 + ["attention"], "mamba_n_heads": 48,
        "mamba_d_head": 64, "mamba_d_state": 128, "mamba_n_groups": 1, "mamba_d_conv": 4, "mamba_expand": 2,
        "max_position_embeddings": 131072}),
    "qwen3.5": ("qwen3.5-0.8b-shape-12-layers", "delta_net_forward", "Qwen3_5ForCausalLM", {
        "model_type": "qwen3_5_text", "vocab_size": 248320, "hidden_size": 1024, "intermediate_size": 3584,
        "num_hidden_layers": 12, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 256,
        "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 3, "linear_num_key_heads": 16,
        "linear_num_value_heads": 16, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
        "linear_conv_kernel_dim": 4, "tie_word_embeddings": True, "max_position_embeddings": 262144,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25}}),
    "falcon-h1": ("falcon-h1-0.5b-like-12-layers", "parallel_hybrid_forward", "FalconH1ForCausalLM", {
        "model_type": "falcon_h1", "vocab_size": 32784, "hidden_size": 1024, "intermediate_size": 2048,
        "num_hidden_layers": 12, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 64,
        "mamba_d_ssm": 1536, "mamba_n_heads": 24, "mamba_d_head": 64, "mamba_d_state": 128, "mamba_n_groups": 1,
        "mamba_d_conv": 4, "mamba_rms_norm": False, "max_position_embeddings": 16384, "rope_theta": 100000000000.0,
        "embedding_multiplier": 5.66, "lm_head_multiplier": 0.039, "key_multiplier": 0.39,
        "mlp_multipliers": [0.88, 0.59], "ssm_multipliers": [0.35, 0.25, 0.35, 0.5, 0.35]}),
    "lfm3": ("lfm3-default-12-layers", "lfm3_forward", "Lfm3ForCausalLM", {
        "model_type": "lfm3", "num_hidden_layers": 12}),
}


def transformers_step(config: LlamaConfig, model: Llama, context: int, T: int, cls: str):
    """transformers' ``cls`` with ``model``'s weights, prefilled with ``context`` tokens; -> a call that runs ``T`` more
    through its cache."""
    import transformers

    with tempfile.TemporaryDirectory() as d:
        model.save_pretrained(d)
        hf = getattr(transformers, cls).from_pretrained(d, attn_implementation="eager", dtype=model.dtype).eval()
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
    p.add_argument("--model", choices=list(SHAPES), default="lfm2")
    p.add_argument("--quick", action="store_true", help="fewer repetitions")
    p.add_argument("--context", type=int, default=1000)
    p.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    a = p.parse_args()
    dtype = getattr(torch, a.dtype)
    bw = copy_bandwidth("cpu")
    name, op, cls, shape = SHAPES[a.model]
    torch.manual_seed(0)
    model = Llama(LlamaConfig.from_dict(shape)).eval().to(dtype)
    cfg = model.config
    weights = sum(m.weight.numel() * m.weight.element_size() for m in model.modules()
                  if isinstance(m, torch.nn.Linear))
    kv = sum(2 * h * cfg.head_dim * a.context * dtype.itemsize for h in cfg.kv_heads_per_layer)
    r = cfg.recurrent
    if r is not None:  # (each Mamba or DeltaNet layer's float32 state, read and written once a step)
        kv += sum(r.layers) * 2 * 4 * math.prod(r.state_shape)
    for T in (1, 5):
        ours = forward_step(model, 1, a.context, T)
        theirs = transformers_step(cfg, model, a.context, T, cls)

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
        for variant, backend in (("stack", "cpu-native-stack"), ("modules", "cpu-modules")):
            record(family="model", op=op, backend=backend, shape=f"model={name},B=1,ctx={a.context},T={T}",
                   dtype=a.dtype, bytes_moved=weights + kv, timing=t[variant], bandwidth=bw,
                   baseline="transformers-eager", baseline_timing=t["transformers"])


if __name__ == "__main__":
    main()
