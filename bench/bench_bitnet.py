"""BitNet b1.58's decode and verification steps on the CPU: the packed model's products as integers on its 2-bit weights
(``triforce_C::ternary_linear``) against the same model's products in floats on its ternary weights unpacked to the
dtype (``TRIFORCE_TERNARY_LINEAR=0``: transformers' arithmetic, the same bits) and against its master weights' float
model (no quantization_config: float projections of the dtype), one forward of each in turns.

Shape: bitnet-b1.58-2B-4T's layer (2560 wide, 20 query and 5 KV heads of 128, an MLP of 6912), random ternary weights,
``--layers`` of them (12; the model has 30) and its 128256-token head, over a full cache of 1000 tokens; batch 1, T = 1
(a decode step) and T = 5 (a verification pass). Bytes = every weight read once (a packed projection's a quarter of a
byte a weight; the head's and the float projections' the dtype's) + the KV cache read; GB/s against the copy bandwidth
measured in the same run.

    python -m bench.bench_bitnet [--quick] [--layers N] [--dtype bfloat16|float32]
    # TRIFORCE_BENCH_CSV=/tmp/x.csv keeps the repo clean
"""
import argparse
import os

import torch

from triforce.models import Llama, LlamaConfig
from triforce.models.bitnet import BitLinear, pack_ternary

from .harness import copy_bandwidth, forward_step, measure_alternating, record

SHAPE = {"model_type": "bitnet", "vocab_size": 128256, "hidden_size": 2560, "intermediate_size": 6912,
         "num_attention_heads": 20, "num_key_value_heads": 5, "max_position_embeddings": 4096}
PACKED = {"quant_method": "bitnet", "linear_class": "bitlinear", "quantization_mode": "offline"}
CONTEXT = 1000


def models(layers: int, dtype: torch.dtype) -> tuple:
    """``(packed, master)``: the shape's model with random packed ternary projections, and its float twin."""
    torch.manual_seed(0)
    packed = Llama(LlamaConfig.from_dict({**SHAPE, "num_hidden_layers": layers, "quantization_config": PACKED}))
    g = torch.Generator().manual_seed(0)
    for m in packed.modules():
        if isinstance(m, BitLinear):
            m.weight.copy_(pack_ternary(torch.randint(-1, 2, (m.out_features, m.in_features), generator=g).float()))
            m.weight_scale.fill_(0.5)
    master = Llama(LlamaConfig.from_dict({**SHAPE, "num_hidden_layers": layers}))
    return packed.eval().to(dtype), master.eval().to(dtype)


def weight_bytes(model, dtype: torch.dtype, packed_bytes: bool) -> int:
    """Bytes of every weight a forward reads: a BitLinear's packed weight (or its unpacked copy in ``dtype``), the
    float weights, the head (the embeddings' row: negligible)."""
    total = 0
    for m in model.modules():
        if isinstance(m, BitLinear):
            total += m.weight.numel() if packed_bytes else m.out_features * m.in_features * dtype.itemsize
        elif isinstance(m, torch.nn.Linear):
            total += m.weight.numel() * m.weight.element_size()
    return total


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer repetitions")
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    a = p.parse_args()
    dtype = getattr(torch, a.dtype)
    bw = copy_bandwidth("cpu")
    packed, master = models(a.layers, dtype)
    cfg = packed.config
    kv = a.layers * 2 * cfg.num_key_value_heads * cfg.head_dim * CONTEXT * dtype.itemsize
    for T in (1, 5):
        steps = {name: forward_step(m, 1, CONTEXT, T) for name, m in (("packed", packed), ("master", master))}

        def on(switch, step):
            def f():
                os.environ["TRIFORCE_TERNARY_LINEAR"] = switch
                step()
            return f
        t = measure_alternating({"integer": on("1", steps["packed"]), "float": on("0", steps["packed"]),
                                 "master": steps["master"]}, reps=5 if a.quick else 15)
        os.environ.pop("TRIFORCE_TERNARY_LINEAR", None)
        shape = f"model=bitnet-2b-layer,layers={a.layers},B=1,ctx={CONTEXT},T={T}"
        for name, backend, nbytes in (
                ("integer", "cpu-ternary", weight_bytes(packed, dtype, True) + kv),
                ("float", "cpu-ternary-float", weight_bytes(packed, dtype, False) + kv)):
            record(family="model", op="bitnet_forward", backend=backend, shape=shape, dtype=a.dtype,
                   bytes_moved=nbytes, timing=t[name], bandwidth=bw, baseline="master-weights",
                   baseline_timing=t["master"],
                   extra=f"float_ternary_us={t['float']['median_s'] * 1e6:.0f}" if name == "integer" else "")


if __name__ == "__main__":
    main()
