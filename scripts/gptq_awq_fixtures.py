"""Write tests/data/gptq_awq.safetensors: GPTQ and AWQ linear layers packed and dequantised by the libraries that
define the formats, for tests/test_gptq_awq.py to check our readers against (bit for bit).

The libraries are not requirements (they need CUDA builds to install); their pure-PyTorch parts run here from their
source distributions, loaded file by file (their packages' ``__init__`` import what this environment lacks):

    pip download --no-deps autoawq==0.2.9 auto-gptq==0.7.1 -d /tmp/src
    tar xzf /tmp/src/autoawq-0.2.9.tar.gz -C /tmp/src; unzip -q /tmp/src/auto_gptq-0.7.1-*.whl -d /tmp/src/gptq
    AUTOAWQ_SRC=/tmp/src/autoawq-0.2.9 AUTO_GPTQ_SRC=/tmp/src/gptq python scripts/gptq_awq_fixtures.py

AWQ: ``WQLinear_GEMM.from_linear`` packs (4 bits, its column order), ``awq.utils.packing_utils.dequantize_gemm``
dequantises. GPTQ: ``auto_gptq``'s ``qlinear_cuda.QuantLinear.pack`` packs (2, 4 and 8 bits; zeros stored minus 1,
the "gptq" v1 checkpoint format), its forward's PyTorch path (no CUDA extension) on an identity input dequantises.
Each case stores its inputs (``W`` float32 ``[out, in]``, ``scales``, ``zeros``, ``g_idx``), the packed tensors
(``qweight``, ``qzeros``, ``scales`` as stored) and the library's weight ``deq`` (``[in, out]``, float16)."""
import importlib.util
import os
import sys
import types
from pathlib import Path

import torch
from safetensors.torch import save_file

OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "gptq_awq.safetensors"


def _awq():
    root = Path(os.environ["AUTOAWQ_SRC"]) / "awq"
    for name, path in (("awq", root), ("awq.utils", root / "utils"), ("awq.modules", root / "modules"),
                       ("awq.modules.linear", root / "modules" / "linear")):
        package = types.ModuleType(name)
        package.__path__ = [str(path)]
        sys.modules[name] = package
    import awq.modules.linear.gemm as gemm
    import awq.utils.packing_utils as packing

    return gemm.WQLinear_GEMM, packing.dequantize_gemm


def _gptq():
    path = Path(os.environ["AUTO_GPTQ_SRC"]) / "auto_gptq" / "nn_modules" / "qlinear" / "qlinear_cuda.py"
    spec = importlib.util.spec_from_file_location("qlinear_cuda", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.QuantLinear


def _grid(w: torch.Tensor, groups: torch.Tensor, n_groups: int, bits: int, sym: bool, zero_at_0: bool = True):
    """Min-max scales (float16) and integer zeros per (row, group) of ``w`` ``[out, in]`` (``groups``: each column's
    group): ``[out, n_groups]`` each; ``w`` set to its values on that grid. The formats' edge zeros: row 1's last
    group made negative (a zero at the top) and, with ``zero_at_0``, row 0's first group positive (a zero at 0;
    GPTQ's v1 format stores a zero minus 1 and cannot hold it). The packers do not clamp: a code outside
    ``[0, 2^bits)`` would spill into its word's others."""
    if not sym:
        w[1, groups == n_groups - 1] = -w[1, groups == n_groups - 1].abs()
        if zero_at_0:
            w[0, groups == 0] = w[0, groups == 0].abs()
    top = 2 ** bits - 1
    scales = torch.empty(w.shape[0], n_groups)
    zeros = torch.empty(w.shape[0], n_groups, dtype=torch.int32)
    for g in range(n_groups):
        cols = w[:, groups == g]
        lo, hi = cols.min(1).values.clamp(max=0), cols.max(1).values.clamp(min=0)
        if sym:
            scales[:, g] = torch.maximum(-lo, hi) / ((top + 1) / 2 - 0.5) + 1e-4
            zeros[:, g] = (top + 1) // 2
        else:
            scales[:, g] = (hi - lo) / top + 1e-4
            zeros[:, g] = torch.round(-lo / scales[:, g]).to(torch.int32)
    scales = scales.half()
    # the weights on that grid, as the quantisers hand them to the packers (AutoGPTQ's and AutoAWQ's clamp each
    # code to [0, 2^bits); the packers round again and do not clamp)
    s, z = scales.float()[:, groups.long()], zeros.float()[:, groups.long()]
    w.copy_((torch.clamp(torch.round(w / s) + z, 0, top) - z) * s)
    return scales, zeros


def main() -> None:
    WQLinear_GEMM, dequantize_gemm = _awq()
    QuantLinear = _gptq()
    g = torch.Generator().manual_seed(0)
    out = {}
    # AWQ: 4 bits, groups of 64 (zero points, GEMM layout)
    w = torch.randn(64, 256, generator=g) * 0.05
    scales, zeros = _grid(w, torch.arange(256) // 64, 4, 4, sym=False)
    linear = torch.nn.Linear(256, 64, bias=False)
    linear.weight.data = w.clone()
    awq = WQLinear_GEMM.from_linear(linear, 4, 64, scales=scales.t().contiguous().float(),
                                    zeros=zeros.t().contiguous().float())
    deq = dequantize_gemm(awq.qweight, awq.qzeros, awq.scales, 4, 64)
    out.update({"awq.W": w, "awq.scales_in": scales, "awq.zeros_in": zeros, "awq.qweight": awq.qweight,
                "awq.qzeros": awq.qzeros, "awq.scales": awq.scales, "awq.deq": deq})
    # GPTQ: 2 / 4 / 8 bits, groups of 32 over act-order (a permuted g_idx) or in order, asymmetric or symmetric
    for name, bits, group, act_order, sym in (("gptq4", 4, 32, True, False), ("gptq4sym", 4, 32, False, True),
                                              ("gptq8", 8, 64, True, False), ("gptq2", 2, 32, False, False),
                                              ("gptq4col", 4, -1, False, False)):
        infeatures = 256
        size = infeatures if group == -1 else group
        n_groups = infeatures // size
        g_idx = torch.arange(infeatures, dtype=torch.int32) // size
        if act_order:
            g_idx = g_idx[torch.randperm(infeatures, generator=g)]
        w = torch.randn(64, infeatures, generator=g) * 0.05
        scales, zeros = _grid(w, g_idx, n_groups, bits, sym, zero_at_0=False)
        linear = torch.nn.Linear(infeatures, 64, bias=False).half()  # (quantised in float16: its scales so)
        linear.weight.data = w.half()
        q = QuantLinear(bits, group, infeatures, 64, bias=False)
        q.pack(linear, scales.float(), zeros.clone(), g_idx=g_idx)  # (pack subtracts 1 in place from a 1-group one)
        with torch.no_grad():
            deq = q(torch.eye(infeatures, dtype=torch.float16))
        out.update({f"{name}.W": w, f"{name}.scales_in": scales, f"{name}.zeros_in": zeros, f"{name}.g_idx": g_idx,
                    f"{name}.qweight": q.qweight, f"{name}.qzeros": q.qzeros, f"{name}.scales": q.scales,
                    f"{name}.deq": deq})
    save_file({k: v.contiguous() for k, v in out.items()}, OUT)
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes): {', '.join(sorted({k.split('.')[0] for k in out}))}")


if __name__ == "__main__":
    main()
