"""Benchmark of the decoder layer's elementwise kernels for a GPU (triforce_kernels/triton/layer_ops.py)
against the PyTorch ops the model layer runs without them, at the rows of a decode step.

Per shape (rows = batch x tokens of a step, a model's widths):
* ``rms_norm`` with the residual add: reads x, delta and the weight, writes h and the normed row;
  baseline ``h = x + delta`` then ``RMSNorm.forward``'s expression (9 PyTorch ops);
* ``rope`` of the queries: reads x and cos, sin per token, writes x; baseline ``apply_rope`` (5 ops);
* ``silu_mul``: reads gate and up, writes one; baseline ``F.silu(gate) * up`` (2 ops).

Bytes are those reads and writes once; the fraction is of the copy bandwidth measured in the run. At a
decode step's few rows both sides are launch-bound: the row says what one call costs on the device.

On a CPU (no GPU, or ``--cpu``) the CPU's own gated activations (``triforce_C::silu_mul``, Gemma's
``gelu_tanh_mul`` and GPT-NeoX's exact ``gelu_mul``, csrc/include/triforce/glu.h: every element by the same
arithmetic, which ATen's SiLU and GELU are not) run as backend ``cpu`` against ``F.silu(gate) * up`` /
``F.gelu(gate, approximate="tanh") * up`` / ``F.gelu(gate) * up`` in float32 and bfloat16, in turns (the VM's
drift), median of 21; GPT-OSS's clamped SwiGLU
(``swiglu_clamped_mul``) against the model layer's PyTorch form of it at gpt-oss-20b's width.

``--rms-norm``: the CPU's ``triforce_C::rms_norm`` (RMSNorm's forward on its module path) against the module's
ATen composite, float32 and bfloat16, in turns.

    python -m bench.bench_layer_ops [--quick] [--cpu] [--rms-norm]
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from triforce.models.rope import apply_rope

from .harness import copy_bandwidth, measure, measure_alternating, record

# (name, hidden, query heads, head dim, intermediate)
MODELS = {"smollm2-135m": (576, 9, 64, 1536), "llama3-8b": (4096, 32, 128, 14336), "gemma-2b": (2048, 8, 256, 16384),
          "gpt-oss-20b": (2880, 64, 64, 2880), "pythia-1.4b": (2048, 16, 128, 8192)}
SWIGLU_CLAMP = (1.702, 7.0)  # GPT-OSS's (alpha, limit)


def _norm(x, delta, w, eps):
    h = x + delta
    hf = h.float()
    return h, w * (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps)).to(h.dtype)


def bench_shape(device, model: str, rows: int, dtype=torch.bfloat16, **measure_kw) -> None:
    from triforce_kernels.triton import layer_ops
    hidden, heads, D, inter = MODELS[model]
    g = torch.Generator().manual_seed(0)
    rnd = lambda *s: torch.randn(*s, generator=g).to(dtype).to(device)  # noqa: E731
    x, delta, w = rnd(rows, 1, hidden), rnd(rows, 1, hidden), rnd(hidden)
    q, cos, sin = rnd(rows, 1, heads, D), rnd(rows, 1, 1, D), rnd(rows, 1, 1, D)
    gate, up = rnd(rows, 1, inter), rnd(rows, 1, inter)
    es, bw, dt = x.element_size(), copy_bandwidth(device), str(dtype).replace("torch.", "")
    cases = [
        ("rms_norm", (4 * rows * hidden + hidden) * es, lambda: layer_ops.rms_norm(x, w, 1e-5, delta),
         lambda: _norm(x, delta, w, 1e-5)),
        ("rope", (2 * rows * heads * D + 2 * rows * D) * es, lambda: layer_ops.rope(q, cos, sin),
         lambda: apply_rope(q, cos, sin)),
        ("silu_mul", 3 * rows * inter * es, lambda: layer_ops.silu_mul(gate, up), lambda: F.silu(gate) * up),
    ]
    for op, nbytes, ours, theirs in cases:
        shape = f"model={model},rows={rows}"
        base = measure(theirs, device=device, **measure_kw)
        record(family="layer_ops", op=op, backend="torch", shape=shape, dtype=dt, bytes_moved=nbytes, timing=base,
               bandwidth=bw, device=device)
        t = measure(ours, device=device, **measure_kw)
        record(family="layer_ops", op=op, backend="triton", shape=shape, dtype=dt, bytes_moved=nbytes, timing=t,
               bandwidth=bw, device=device, baseline="torch", baseline_timing=base)


def bench_cpu_glu(model: str, rows: int, dtype=torch.float32, act: str = "silu", reps: int = 21) -> None:
    """``triforce_C::silu_mul`` / ``gelu_tanh_mul`` / ``gelu_mul`` (backend ``cpu``) against PyTorch's ``act(gate) *
    up`` on the CPU, in turns; ``act="swiglu_clamped"``: GPT-OSS's ``triforce_C::swiglu_clamped_mul`` against the model
    layer's PyTorch form of it (``_clamped_swiglu_ops``, 7 ops) at :data:`SWIGLU_CLAMP`."""
    from triforce.models.llama import ACTIVATIONS, _clamped_swiglu_ops, _rowwise_available
    if not _rowwise_available():
        print("bench_layer_ops: the C++ extension is not built; no CPU rows")
        return
    inter = MODELS[model][3]
    g = torch.Generator().manual_seed(0)
    gate, up = (torch.randn(rows, inter, generator=g).to(dtype) for _ in range(2))
    op = getattr(torch.ops.triforce_C, f"{act}_mul")
    if act == "swiglu_clamped":
        cases = {"torch": lambda: _clamped_swiglu_ops(gate, up, *SWIGLU_CLAMP),
                 "cpu": lambda: op(gate, up, *SWIGLU_CLAMP)}
    else:
        fn = ACTIVATIONS[act]
        cases = {"torch": lambda: fn(gate) * up, "cpu": lambda: op(gate, up)}
    t = measure_alternating(cases, reps=reps)
    nbytes, bw, dt = 3 * rows * inter * gate.element_size(), copy_bandwidth("cpu"), str(dtype).replace("torch.", "")
    shape = f"model={model},rows={rows}"
    record(family="layer_ops", op=f"{act}_mul", backend="torch", shape=shape, dtype=dt, bytes_moved=nbytes,
           timing=t["torch"], bandwidth=bw, device="cpu")
    record(family="layer_ops", op=f"{act}_mul", backend="cpu", shape=shape, dtype=dt, bytes_moved=nbytes,
           timing=t["cpu"], bandwidth=bw, device="cpu", baseline="torch", baseline_timing=t["torch"])


def bench_cpu_rms_norm(model: str, rows: int, dtype=torch.float32, reps: int = 21) -> None:
    """``triforce_C::rms_norm`` (RMSNorm's forward on the CPU, backend ``cpu``) against the module's ATen composite it
    replaced (7 ops), on ``[rows, hidden]``, in turns."""
    from triforce.models.llama import _rowwise_available
    if not _rowwise_available():
        print("bench_layer_ops: the C++ extension is not built; no CPU rows")
        return
    hidden = MODELS[model][0]
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(rows, hidden, generator=g).to(dtype), torch.randn(hidden, generator=g).to(dtype)

    def aten():
        xf = x.float()
        return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(dtype)

    op = torch.ops.triforce_C.rms_norm
    t = measure_alternating({"torch": aten, "cpu": lambda: op(x, w, 1e-6)}, reps=reps)
    nbytes, bw, dt = (2 * rows + 1) * hidden * x.element_size(), copy_bandwidth("cpu"), str(dtype).replace("torch.", "")
    shape = f"model={model},rows={rows}"
    record(family="layer_ops", op="rms_norm", backend="torch", shape=shape, dtype=dt, bytes_moved=nbytes,
           timing=t["torch"], bandwidth=bw, device="cpu")
    record(family="layer_ops", op="rms_norm", backend="cpu", shape=shape, dtype=dt, bytes_moved=nbytes,
           timing=t["cpu"], bandwidth=bw, device="cpu", baseline="torch", baseline_timing=t["torch"])


def bench_cpu_softcap(rows: int, vocab: int = 256000, cap: float = 30.0, reps: int = 21) -> None:
    """``triforce_C::softcap`` (Gemma 2's capped logits, backend ``cpu``) against PyTorch's
    ``tanh(x / cap) * cap`` on float32 logits ``[rows, vocab]``, in turns."""
    from triforce.models.llama import _rowwise_available
    if not _rowwise_available():
        print("bench_layer_ops: the C++ extension is not built; no CPU rows")
        return
    x = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(0)) * 20
    op = torch.ops.triforce_C.softcap
    t = measure_alternating({"torch": lambda: torch.tanh(x / cap) * cap, "cpu": lambda: op(x, cap)}, reps=reps)
    nbytes, bw, shape = 2 * x.numel() * 4, copy_bandwidth("cpu"), f"rows={rows},vocab={vocab}"
    record(family="layer_ops", op="softcap", backend="torch", shape=shape, dtype="float32", bytes_moved=nbytes,
           timing=t["torch"], bandwidth=bw, device="cpu")
    record(family="layer_ops", op="softcap", backend="cpu", shape=shape, dtype="float32", bytes_moved=nbytes,
           timing=t["cpu"], bandwidth=bw, device="cpu", baseline="torch", baseline_timing=t["torch"])


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="SmolLM2's widths at 32 rows only")
    p.add_argument("--softcap", action="store_true", help="only the CPU's softcap rows (Gemma 2's capped logits)")
    p.add_argument("--cpu", action="store_true", help="the CPU's silu_mul rows even where a GPU is present")
    p.add_argument("--rms-norm", action="store_true", help="only the CPU's rms_norm rows (RMSNorm's module path)")
    a = p.parse_args()
    if a.softcap:
        for rows in (1, 8, 64):
            bench_cpu_softcap(rows)
        return
    if a.rms_norm:
        for model, rows in (("gemma-2b", 1), ("llama3-8b", 1), ("llama3-8b", 5), ("llama3-8b", 64)):
            for dtype in (torch.float32, torch.bfloat16):
                bench_cpu_rms_norm(model, rows, dtype)
        return
    if a.cpu or not torch.cuda.is_available():
        shapes = [("silu", "smollm2-135m", 32)] if a.quick else [
            ("silu", "smollm2-135m", 1), ("silu", "smollm2-135m", 8), ("silu", "smollm2-135m", 32),
            ("silu", "smollm2-135m", 128), ("silu", "smollm2-135m", 2048), ("silu", "llama3-8b", 1),
            ("silu", "llama3-8b", 8), ("gelu_tanh", "gemma-2b", 1), ("gelu_tanh", "gemma-2b", 8),
            ("gelu_tanh", "gemma-2b", 128), ("gelu", "pythia-1.4b", 1), ("gelu", "pythia-1.4b", 8),
            ("gelu", "pythia-1.4b", 128), ("swiglu_clamped", "gpt-oss-20b", 1), ("swiglu_clamped", "gpt-oss-20b", 8),
            ("swiglu_clamped", "gpt-oss-20b", 128)]
        for act, model, rows in shapes:
            for dtype in (torch.float32, torch.bfloat16):
                bench_cpu_glu(model, rows, dtype, act)
        return
    dev = torch.device("cuda")
    shapes = [("smollm2-135m", 32)] if a.quick else [
        ("smollm2-135m", 32), ("smollm2-135m", 256), ("smollm2-135m", 4096), ("llama3-8b", 1), ("llama3-8b", 8),
        ("llama3-8b", 56)]
    for model, rows in shapes:
        bench_shape(dev, model, rows)


if __name__ == "__main__":
    main()
