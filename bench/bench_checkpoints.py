"""Benchmark of quantised checkpoints (compressed-tensors': llm-compressor's FP8, INT8, W4A16, NVFP4 presets) on the
CPU: their dequantisation on loading, and a model's decode step and verification pass on its own codes.

``load``: one 14336 x 4096 weight (Llama-3-8B's MLP width) of each scheme (FP8-dynamic, W8A8, W4A16, NVFP4), as
compressed-tensors' own compressor writes it (bfloat16 scales; NVFP4's FP8 ones), dequantised to bfloat16: ours
(``compressed.dequantize_compressed``: the packed codes decoded and scaled a few rows at a time) against
compressed-tensors' decompressor (what transformers' dequantising load calls), outputs checked equal first. Bytes:
the stored codes and scales read plus the bfloat16 weight written.

``step``: a 4-layer Qwen3-shaped model (hidden 2048, MLP 6144, 16 / 8 heads of 128, a tied float32 head of 32K; 512
tokens cached) written as each scheme's checkpoint, then run three ways on the same inputs, in turns (the VM's
drift): ``own`` (``load_model(directory, "compressed")``: FP8 on Fp8Linear, 8-bit integers and NVFP4 on Q8Linear,
4-bit integers on Q4Linear's blocks, every product bitwise the float32 model's), ``float32``
(``Llama.from_pretrained``: dequantised) and ``bfloat16`` (the same weights rounded to bfloat16: fewer bytes, other
bits), at 1 row (a decode step) and 5 rows (a verification pass of gamma 4). The own model's logits are checked
bitwise the float32 model's first. Bytes: the linear layers' weights as each holds them (codes and scales, or
float32 / bfloat16), the embedding row and the head.

    python -m bench.bench_checkpoints [--quick] [--only load|step] [--schemes fp8_dynamic,w8a8_int8,w4a16,nvfp4]
"""
from __future__ import annotations

import argparse
import pathlib
import tempfile

import torch

from .harness import copy_bandwidth, forward_step, measure_alternating, record

# name -> (format, weights args): llm-compressor's presets FP8_DYNAMIC, W8A8 (int8) and W4A16
SCHEMES = {"fp8_dynamic": ("float-quantized", {"num_bits": 8, "type": "float", "strategy": "channel"}),
           "w8a8_int8": ("int-quantized", {"num_bits": 8, "type": "int", "strategy": "channel"}),
           "w4a16": ("pack-quantized", {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128}),
           "nvfp4": ("nvfp4-pack-quantized", {"num_bits": 4, "type": "float", "strategy": "tensor_group",
                                              "group_size": 16})}


def _compress(w: torch.Tensor, name: str) -> tuple:
    """(scheme, the tensors compressed-tensors' compressor stores for weight ``w``: codes, scales, ...)."""
    from compressed_tensors.compressors import BaseCompressor
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

    from tests.test_compressed import scales_of

    fmt, args = SCHEMES[name]
    scheme = QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(**args), format=fmt)
    scale, _, glob = scales_of(w.float(), scheme.weights, torch.bfloat16)
    state = {"weight": w, "weight_scale": scale} | ({} if glob is None else {"weight_global_scale": glob})
    return scheme, BaseCompressor.get_value_from_registry(fmt).compress(state, scheme)


def bench_load(quick: bool, bw: float, schemes) -> None:
    from compressed_tensors.compressors import BaseCompressor

    from triforce.models.compressed import CompressedWeights

    N, K = (2048, 1024) if quick else (14336, 4096)
    w = torch.randn(N, K) * 0.02
    for name in schemes:
        scheme, stored = _compress(w, name)
        q = {"quant_method": "compressed-tensors", "format": scheme.format,
             "config_groups": {"group_0": scheme.model_dump(mode="json")}}
        ours = CompressedWeights(q, torch.bfloat16)
        mine = ours.dequantize({f"m.{k}": v for k, v in stored.items()})["m.weight"]
        theirs = BaseCompressor.get_value_from_registry(scheme.format).decompress(dict(stored), scheme)["weight"]
        assert torch.equal(mine, theirs.to(torch.bfloat16)), name
        t = measure_alternating({
            "ours": lambda: CompressedWeights(q, torch.bfloat16).dequantize({f"m.{k}": v for k, v in stored.items()}),
            "compressed_tensors": lambda: BaseCompressor.get_value_from_registry(scheme.format).decompress(
                dict(stored), scheme)["weight"].to(torch.bfloat16)}, warmup=1, reps=3 if quick else 7)
        nbytes = sum(v.numel() * v.element_size() for v in stored.values()) + N * K * 2
        record(family="model", op="dequantize_compressed", backend="cpu", shape=f"N={N},K={K}", dtype=name,
               timing=t["ours"], bytes_moved=nbytes, bandwidth=bw, baseline="compressed_tensors",
               baseline_timing=t["compressed_tensors"], extra="to bfloat16")


def _checkpoint(directory: pathlib.Path, name: str, quick: bool) -> None:
    """A random 4-layer Qwen3-shaped model written to ``directory`` as scheme ``name``'s checkpoint."""
    import transformers

    from tests.test_compressed import scheme as make_scheme, write_compressed

    H, inter, layers, vocab = (512, 1536, 2, 4096) if quick else (2048, 6144, 4, 32000)
    c = transformers.Qwen3Config(vocab_size=vocab, hidden_size=H, intermediate_size=inter, num_hidden_layers=layers,
                                 num_attention_heads=16, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True)
    torch.manual_seed(0)
    transformers.Qwen3ForCausalLM(c).save_pretrained(directory)
    fmt, args = SCHEMES[name]
    write_compressed(directory, {"group_0": (make_scheme(fmt, args), None)}, fmt, torch.bfloat16)


def _weight_bytes(model) -> int:
    """Bytes a forward reads of ``model``'s linear layers (codes and scales, or float weights) and head."""
    from triforce.models.quant import Fp8Linear, Q4Linear, Q8Linear

    n = 0
    for m in model.modules():
        if isinstance(m, (Fp8Linear, Q8Linear, Q4Linear)):
            n += sum(b.numel() * b.element_size() for b in m.buffers())
        elif isinstance(m, torch.nn.Linear):
            n += m.weight.numel() * m.weight.element_size()
    return n


def bench_step(quick: bool, bw: float, schemes) -> None:
    from triforce.models import Llama
    from triforce.models.hub import load_model

    length = 128 if quick else 512
    for name in schemes:
        with tempfile.TemporaryDirectory() as d:
            _checkpoint(pathlib.Path(d), name, quick)
            models = {"own": load_model(d, "compressed")[0], "float32": Llama.from_pretrained(d),
                      "bfloat16": Llama.from_pretrained(d, dtype=torch.bfloat16)}
        ids = torch.randint(0, models["own"].config.vocab_size, (1, 12))
        with torch.no_grad():
            assert torch.equal(models["own"](ids), models["float32"](ids)), name
        for T in (1, 5):
            with torch.no_grad():
                steps = {k: forward_step(m, 1, length, T) for k, m in models.items()}
                t = measure_alternating(steps, warmup=2, reps=5 if quick else 12)
            for k, m in models.items():
                record(family="model", op="checkpoint_step", backend=k, shape=f"T={T},N={length},"
                       f"H={m.config.hidden_size},L={m.config.num_hidden_layers}", dtype=name, timing=t[k],
                       bytes_moved=_weight_bytes(m), bandwidth=bw,
                       baseline="" if k == "float32" else "float32",
                       baseline_timing=None if k == "float32" else t["float32"],
                       extra="own: bitwise float32" if k == "own" else "")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="smaller shapes, fewer repetitions")
    p.add_argument("--only", choices=["load", "step"], default=None)
    p.add_argument("--schemes", default=",".join(SCHEMES), help=f"comma-separated, of {', '.join(SCHEMES)}")
    a = p.parse_args()
    schemes = a.schemes.split(",")
    if not set(schemes) <= set(SCHEMES):
        p.error(f"--schemes: expected names of {', '.join(SCHEMES)}, got {a.schemes!r}")
    bw = copy_bandwidth("cpu")
    if a.only in (None, "load"):
        bench_load(a.quick, bw, schemes)
    if a.only in (None, "step"):
        bench_step(a.quick, bw, schemes)


if __name__ == "__main__":
    main()
