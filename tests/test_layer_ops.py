"""The decoder layer's fused elementwise kernels for a GPU (triforce_kernels/triton/layer_ops.py) against
the PyTorch expressions the model layer runs elsewhere: RoPE and the residual add bitwise, RMSNorm
within the rounding of a different order of its sum of squares, SiLU(gate) * up within one rounding of
the result; every row independent of the others. In the Triton interpreter on a CPU."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

from tests.helpers import DEVICE, DTYPES
from triforce.models.rope import apply_rope, rope_cos_sin, rope_inv_freq
from triforce.models.config import LlamaConfig
from triforce_kernels._backend import backend_status

pytestmark = pytest.mark.skipif(not backend_status("triton", DEVICE)[0],
                                reason="needs Triton (a GPU or the interpreter)")


def ops():
    from triforce_kernels.triton import layer_ops
    return layer_ops


# Triton's interpreter casts float32 to bfloat16 by truncation, not to nearest (measured with triton 3.9:
# 492 of 1000 random values differ from torch's cast); a GPU rounds to nearest. So bfloat16 results are
# compared bitwise on a GPU, and within one unit in the last place in the interpreter.
TRUNCATING_BF16 = DEVICE.type != "cuda"


def cast(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """float32 ``x`` to ``dtype`` as the kernels' backend casts it: to nearest, or by truncation for
    bfloat16 in the interpreter."""
    if dtype == torch.bfloat16 and TRUNCATING_BF16:
        return (x.float().view(torch.int32) & -65536).view(torch.float32).to(dtype)  # exact: low bits are 0
    return x.float().to(dtype)


def ulp(t: torch.Tensor) -> torch.Tensor:
    """The spacing of t's dtype at each |value| (float32 arithmetic)."""
    bits = {torch.float32: 23, torch.float16: 10, torch.bfloat16: 7}[t.dtype]
    a = t.float().abs().clamp_min(torch.finfo(t.dtype).tiny)
    return torch.exp2(torch.floor(torch.log2(a)) - bits)


@given(seed=st.integers(0, 2**31 - 1), B=st.integers(1, 3), T=st.integers(1, 5), H=st.sampled_from([1, 3, 4]),
       D=st.sampled_from([8, 64, 24]), dtype=st.sampled_from(DTYPES))
@settings(deadline=None)
def test_rope_is_apply_rope_bitwise(seed, B, T, H, D, dtype):
    g = torch.Generator().manual_seed(seed)
    cfg = LlamaConfig(vocab_size=8, hidden_size=H * D, intermediate_size=8, num_hidden_layers=1,
                      num_attention_heads=H, num_key_value_heads=H, max_position_embeddings=4096)
    x = (torch.randn(B, T, H, D, generator=g) * 3).to(dtype).to(DEVICE)
    pos = torch.randint(0, 4000, (B, T), generator=g).to(DEVICE)
    cos, sin = rope_cos_sin(rope_inv_freq(cfg, DEVICE), pos, dtype)
    out = ops().rope(x, cos, sin)
    half = D // 2
    rot = torch.cat((-x[..., half:], x[..., :half]), -1)
    # PyTorch's roundings: each product, then the sum, in the dtype
    ref = cast(cast(x.float() * cos.float(), dtype).float() + cast(rot.float() * sin.float(), dtype).float(), dtype)
    assert torch.equal(out, ref)
    if not (dtype == torch.bfloat16 and TRUNCATING_BF16):
        assert torch.equal(out, apply_rope(x, cos, sin))  # the model layer's own expression


@given(seed=st.integers(0, 2**31 - 1), rows=st.integers(1, 6), N=st.sampled_from([8, 64, 576, 100]),
       dtype=st.sampled_from(DTYPES), residual=st.booleans())
@settings(deadline=None)
def test_rms_norm_against_the_modules(seed, rows, N, dtype, residual):
    """``h`` (the residual sum) bitwise; the normalised row within what a different summation order of its
    mean can change (a few units in the last place of the result); each row's bits alone as in the batch."""
    from triforce.models.llama import RMSNorm
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(rows, N, generator=g) * 4).to(dtype).to(DEVICE)
    delta = (torch.randn(rows, N, generator=g)).to(dtype).to(DEVICE) if residual else None
    norm = RMSNorm(N, 1e-5).to(DEVICE)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(N, generator=g).to(DEVICE) * 0.5 + 1)
        norm = norm.to(dtype)
        h_ref = x if delta is None else x + delta
        hf = h_ref.float()  # RMSNorm.forward's PyTorch expression (the module itself takes the kernel on a GPU)
        y_ref = norm.weight * (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + norm.eps)).to(dtype)
    h, y = ops().rms_norm(x, norm.weight, norm.eps, delta)
    assert torch.equal(h, h_ref if delta is None else cast(x.float() + delta.float(), dtype))
    exact = norm.weight.double() * (h_ref.double() * torch.rsqrt(h_ref.double().pow(2).mean(-1, keepdim=True) + 1e-5))
    # PyTorch's own result and ours are each within a few roundings of the exact value
    slack = 4 + (dtype == torch.bfloat16 and TRUNCATING_BF16)  # the truncating cast: one more unit
    assert ((y.double() - exact).abs() <= slack * ulp(y_ref).double()).all()
    assert ((y.double() - y_ref.double()).abs() <= slack * ulp(y_ref).double()).all()
    for r in range(rows):  # row independence
        one_h, one_y = ops().rms_norm(x[r:r + 1].contiguous(), norm.weight, norm.eps,
                                      None if delta is None else delta[r:r + 1].contiguous())
        assert torch.equal(one_y, y[r:r + 1]) and torch.equal(one_h, h[r:r + 1])


@given(seed=st.integers(0, 2**31 - 1), n=st.integers(1, 3000), dtype=st.sampled_from(DTYPES))
@settings(deadline=None)
def test_silu_mul_against_the_modules(seed, n, dtype):
    g = torch.Generator().manual_seed(seed)
    gate = (torch.randn(n, generator=g) * 6).to(dtype).to(DEVICE)
    up = torch.randn(n, generator=g).to(dtype).to(DEVICE)
    out = ops().silu_mul(gate, up)
    ref = F.silu(gate) * up
    # 16-bit: SiLU's float32 value may round to the neighbouring 16-bit value (its exp and division differ
    # from PyTorch's in the last float32 places), then the product rounds: 2 units. float32: SiLU itself
    # is a few float32 roundings apart (exp, sum, division; PyTorch's CPU computes x * sigmoid(x)): 4.
    slack = (4 if dtype == torch.float32 else 2) + 2 * (dtype == torch.bfloat16 and TRUNCATING_BF16)
    assert ((out.double() - ref.double()).abs() <= slack * ulp(ref).double()).all()
    big = gate.float() > 20  # where SiLU(g) = g / (1 + e^-g) is g exactly: 1 + e^-g rounds to 1 in float32
    assert torch.equal(out[big], cast(cast(F.silu(gate.float()), dtype).float() * up.float(), dtype)[big])


def test_empty_inputs():
    x = torch.empty(0, 16, device=DEVICE)
    assert ops().rms_norm(x, torch.ones(16, device=DEVICE), 1e-6)[1].shape == (0, 16)
    assert ops().silu_mul(x, x).shape == (0, 16)
    q = torch.empty(0, 1, 2, 8, device=DEVICE)
    cs = torch.empty(0, 1, 1, 8, device=DEVICE)
    assert ops().rope(q, cs, cs).shape == q.shape


def test_benchmark_rows(tmp_path, monkeypatch):
    """bench/bench_layer_ops.py's body on a tiny shape (the interpreter here: the row's time means nothing,
    the code path does): a PyTorch row and a Triton row per op, with bytes and the baseline."""
    import csv

    from bench import bench_layer_ops
    path = tmp_path / "rows.csv"
    monkeypatch.setenv("TRIFORCE_BENCH_CSV", str(path))
    monkeypatch.setitem(bench_layer_ops.MODELS, "tiny", (32, 2, 8, 48))
    bench_layer_ops.bench_shape(DEVICE, "tiny", 3, warmup=1, reps=2, min_time_s=0.0, max_reps=2)
    rows = list(csv.DictReader(open(path)))
    assert [(r["op"], r["backend"]) for r in rows] == [(op, b) for op in ("rms_norm", "rope", "silu_mul")
                                                      for b in ("torch", "triton")]
    assert all(int(r["bytes"]) > 0 for r in rows) and all(r["baseline"] == "torch" for r in rows[1::2])
