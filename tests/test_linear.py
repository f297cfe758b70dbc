"""triforce_C::rowwise_linear (csrc/include/triforce/linear.h) and the model's Linear that uses it, in
float32, bfloat16 and float16: against F.linear in float64 (flash-attn's measured-error rule), bitwise row
independence (row m of a many-row product equals the 1-row product of x[m]: a verification pass
computes an autoregressive step's projections exactly), the fallbacks, and the model's logits."""
import pytest
import torch
import torch.nn.functional as F
from hypothesis import example, given
from hypothesis import strategies as st

from triforce.models import FullCache, Llama, LlamaConfig
from triforce.models.llama import ROWWISE_MAX_ROWS, Linear, _bulk_linears, _rowwise_available

from .helpers import assert_close_measured

pytestmark = pytest.mark.skipif(not _rowwise_available(), reason="the C++ extension is not built")


def rowwise(x, w):
    return torch.ops.triforce_C.rowwise_linear(x, w)


@given(M=st.integers(0, ROWWISE_MAX_ROWS), K=st.integers(0, 300), N=st.integers(0, 70), seed=st.integers(0, 2**31 - 1))
@example(M=1, K=576, N=1536, seed=0)   # SmolLM2's MLP
@example(M=22, K=576, N=49152, seed=1)  # a 22-node tree through the LM head
@example(M=3, K=7, N=5, seed=2)        # N % 4 != 0: the partial block
@example(M=2, K=0, N=3, seed=3)        # empty reduction
def test_matches_float64(M, K, N, seed):
    g = torch.Generator().manual_seed(seed)
    x, w = torch.randn(M, K, generator=g), torch.randn(N, K, generator=g)
    out = rowwise(x, w)
    assert out.shape == (M, N) and out.dtype == torch.float32
    assert_close_measured(out, F.linear(x.double(), w.double()), F.linear(x, w), factor=2.0, floor=1e-5)


@given(M=st.integers(0, 40), K=st.integers(0, 300), N=st.integers(0, 70), seed=st.integers(0, 2**31 - 1))
@example(M=1, K=576, N=1536, seed=0)
@example(M=5, K=33, N=7, seed=2)  # K % 32 != 0 (masked tail), N % 6 != 0 (partial block)
def test_bfloat16_matches_float64(M, K, N, seed):
    """bfloat16 x and w: products accumulated in fp32, the result rounded once to bfloat16, as F.linear.
    The floor is one bfloat16 rounding of the largest output (where F.linear happens to round the
    other way at a tie-close value)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=g).bfloat16()
    w = torch.randn(N, K, generator=g).bfloat16()
    out = rowwise(x, w)
    assert out.shape == (M, N) and out.dtype == torch.bfloat16
    exact = F.linear(x.double(), w.double())
    floor = exact.abs().max().item() / 128 if exact.numel() else 0.0
    assert_close_measured(out, exact, F.linear(x, w), factor=2.0, floor=floor)


@given(M=st.integers(0, 40), K=st.integers(0, 300), N=st.integers(0, 70), seed=st.integers(0, 2**31 - 1))
@example(M=1, K=576, N=1536, seed=0)
@example(M=5, K=33, N=7, seed=2)  # K % 32 != 0 (masked tail), N % 6 != 0 (partial block)
def test_float16_matches_float64(M, K, N, seed):
    """float16 x and w: each product exact in fp32, accumulated in fp32, the result rounded once to
    float16. The floor is one float16 rounding of the largest output."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=g).half()
    w = (torch.randn(N, K, generator=g) / 8).half()
    out = rowwise(x, w)
    assert out.shape == (M, N) and out.dtype == torch.float16
    exact = F.linear(x.double(), w.double())
    floor = exact.abs().max().item() / 1024 if exact.numel() else 0.0
    assert_close_measured(out, exact, F.linear(x, w), factor=2.0, floor=floor)


@given(M=st.integers(2, 600), K=st.integers(1, 200), N=st.integers(1, 40), seed=st.integers(0, 2**31 - 1),
       dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]))
@example(M=ROWWISE_MAX_ROWS, K=64, N=13, seed=4, dtype=torch.float32)  # every row group of a fused layer's widest product
@example(M=9, K=33, N=7, seed=5, dtype=torch.float16)  # float16: masked tail, partial block
@example(M=2 * 256 + 5, K=40, N=9, seed=6, dtype=torch.bfloat16)  # three chunks of rows (kRowChunk = 256)
def test_rows_are_bitwise_independent(M, K, N, seed, dtype):
    g = torch.Generator().manual_seed(seed)
    x, w = torch.randn(M, K, generator=g).to(dtype), torch.randn(N, K, generator=g).to(dtype)
    out = rowwise(x, w)
    for m in range(M):
        assert torch.equal(out[m], rowwise(x[m: m + 1], w)[0])


def test_same_result_with_any_thread_count():
    # 7000 x 130 weights x 5 rows: above the 4 MiB below which a sleeping-worker policy runs inline
    # (triforce::parallel_min_bytes), so two threads really split it under any OMP_WAIT_POLICY
    x, w = torch.randn(5, 130), torch.randn(7000, 130)
    n = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = rowwise(x, w)
        torch.set_num_threads(max(2, n))
        assert torch.equal(one, rowwise(x, w))
    finally:
        torch.set_num_threads(n)


_THRESHOLD_PROBE = """
import sys, torch
import triforce_kernels as tk
from triforce.models.llama import _rowwise_available
from triforce.models.quant import quantize_q8
assert _rowwise_available()
torch.set_num_threads(2)
g = torch.Generator().manual_seed(0)
outs = {}
for M, N, K in ((1, 192, 576), (5, 1536, 576), (4, 7000, 130)):
    x, w = torch.randn(M, K, generator=g), torch.randn(N, K, generator=g)
    outs[f"linear{M}x{N}"] = torch.ops.triforce_C.rowwise_linear(x, w)
    q, s = quantize_q8(w)
    outs[f"linear_q8_{M}x{N}"] = torch.ops.triforce_C.rowwise_linear_q8(x, q, s)
for B, N, T in ((1, 300, 1), (3, 2000, 5)):
    q = torch.randn(B, T, 9, 64, generator=g)
    k, v = torch.randn(B, N, 3, 64, generator=g), torch.randn(B, N, 3, 64, generator=g)
    lens = torch.tensor([N - 7 * b for b in range(B)], dtype=torch.int32)
    outs[f"attention{B}x{N}"] = tk.verify_attention(q, k, v, lens, backend="cpu")
k = torch.randn(3, 512, 3, 64, generator=g)
v = torch.randn(3, 512, 3, 64, generator=g)
ck = tk.chunk_mean_keys(k, 8, backend="cpu")
outs["chunk_means"] = ck
out_k, out_v = torch.empty(3, 128, 3, 64), torch.empty(3, 128, 3, 64)
nc = torch.tensor([64, 50, 33], dtype=torch.int32)
outs["chunk_idx"] = tk.build_retrieval_cache(torch.randn(3, 9, 64, generator=g), k, v, ck, nc, 8, 16, out_k, out_v,
                                             backend="cpu")
outs["out_k"], outs["out_v"] = out_k, out_v
p = torch.softmax(torch.randn(4, 6, 1000, generator=g), -1)
q = torch.softmax(torch.randn(4, 5, 1000, generator=g), -1)
d = torch.randint(1000, (4, 5), generator=g)
outs["chain_tokens"], outs["chain_num"] = tk.chain_speculative_sample(d, q, p, torch.rand(4, 6, 2, generator=g),
                                                                      backend="cpu")
x, E = torch.randn(6, 96, generator=g), 5  # a mixture's experts (moe_experts): 6 rows, 2 of 5 experts each
index = torch.randint(E, (6, 2), generator=g)
gate_up = [torch.randn(2 * 700, 96, generator=g) for _ in range(E)]
down = [torch.randn(96, 700, generator=g) for _ in range(E)]
outs["moe_experts"] = torch.ops.triforce_C.moe_experts(x, index, torch.rand(6, 2, generator=g), gate_up, [None] * E,
                                                       down, [None] * E, "silu")
torch.save(outs, sys.argv[1])
"""


def test_parallel_threshold_never_changes_results(tmp_path):
    """triforce::parallel_min_bytes decides whether a CPU kernel opens a parallel region (the linear,
    mixture-of-experts, attention, chunk-mean, retrieval and sampling kernels); the arithmetic of each output must not depend on it: the same inputs with every region opened (0) and none (10**15),
    on 2 threads, in fresh processes (the threshold is read once per process)."""
    import os
    import subprocess
    import sys

    out = {}
    for threshold in ("0", str(10**15)):
        path = tmp_path / f"{threshold}.pt"
        env = {**os.environ, "TRIFORCE_PARALLEL_MIN_BYTES": threshold, "OMP_NUM_THREADS": "2"}
        subprocess.run([sys.executable, "-c", _THRESHOLD_PROBE, str(path)], env=env, check=True)
        out[threshold] = torch.load(path)
    a, b = out.values()
    assert a.keys() == b.keys() and len(a) == 15
    for name in a:
        assert torch.equal(a[name], b[name]), name


def test_non_contiguous_inputs_and_errors():
    x, w = torch.randn(8, 6)[::2], torch.randn(6, 10).t()
    torch.testing.assert_close(rowwise(x, w), F.linear(x, w), rtol=1e-5, atol=1e-5)
    with pytest.raises(RuntimeError, match="float32, bfloat16 or float16 only"):
        rowwise(x.double(), w.double())
    with pytest.raises(RuntimeError, match="x and w alike"):
        rowwise(x.bfloat16(), w)
    with pytest.raises(RuntimeError, match="columns"):
        rowwise(torch.randn(2, 3), torch.randn(4, 5))
    with pytest.raises(RuntimeError, match="2-D"):
        rowwise(torch.randn(2, 3, 4), torch.randn(4, 4))


def test_linear_module_paths(monkeypatch):
    lin = Linear(16, 12, bias=False)
    calls = []
    real = torch.ops.triforce_C.rowwise_linear

    class Spy:
        def __call__(self, *a):
            calls.append(a[0].shape)
            return real(*a)

    monkeypatch.setattr(torch.ops.triforce_C, "rowwise_linear", Spy(), raising=False)
    with torch.no_grad():
        x = torch.randn(2, 3, 16)
        torch.testing.assert_close(lin(x), F.linear(x, lin.weight), rtol=1e-5, atol=1e-5)
        assert calls == [(6, 16)]
        lin(torch.randn(ROWWISE_MAX_ROWS + 1, 16))  # many rows: the kernel too
        assert calls == [(6, 16), (ROWWISE_MAX_ROWS + 1, 16)]
        with _bulk_linears():  # a prefill's many rows: torch's GEMM; its few rows: the kernel
            xp = torch.randn(ROWWISE_MAX_ROWS + 1, 16)
            torch.testing.assert_close(lin(xp), F.linear(xp, lin.weight), rtol=0, atol=0)
            lin(torch.randn(ROWWISE_MAX_ROWS, 16))
        assert calls == [(6, 16), (ROWWISE_MAX_ROWS + 1, 16), (ROWWISE_MAX_ROWS, 16)]
        lin(torch.randn(ROWWISE_MAX_ROWS + 1, 16))  # the prefill's rule ends with the block
        assert len(calls) == 4 and calls[3] == (ROWWISE_MAX_ROWS + 1, 16)
        lin.to(torch.float64)(torch.randn(2, 16, dtype=torch.float64))  # not float32 / bfloat16 / float16
        assert len(calls) == 4
        xb = torch.randn(2, 16, dtype=torch.bfloat16)
        torch.testing.assert_close(lin.to(torch.bfloat16)(xb), F.linear(xb, lin.weight))  # the kernel
        xh = torch.randn(2, 16, dtype=torch.float16)
        torch.testing.assert_close(lin.to(torch.float16)(xh), F.linear(xh, lin.weight))  # the kernel
        assert calls[4:] == [(2, 16), (2, 16)]
    lin.float()
    y = lin(torch.randn(2, 16, requires_grad=True))  # autograd: torch's linear, gradients flow
    y.sum().backward()
    assert len(calls) == 6 and lin.weight.grad is not None


def test_only_cached_forwards_take_the_kernel_above_max_rows(monkeypatch):
    """A prefill's chunks and a forward without a cache hand products of more than ROWWISE_MAX_ROWS rows
    to torch's GEMM (their rows are never compared with a step's); a forward that extends a cache runs
    the kernel at any row count (a verification pass, bitwise a step's rows)."""
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=100, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    m = Llama(cfg).eval()
    rows = []
    real = torch.ops.triforce_C.rowwise_linear
    monkeypatch.setattr(torch.ops.triforce_C, "rowwise_linear", lambda x, w: rows.append(x.shape[0]) or real(x, w),
                        raising=False)
    many = ROWWISE_MAX_ROWS + 72
    with torch.no_grad():
        m(torch.randint(0, 100, (1, many)))
        assert rows == []
        cache = FullCache(cfg, 2, 2 * many)
        m.prefill(torch.randint(0, 100, (2, many)), cache, chunk_size=many)
        assert rows == [2]  # the chunk's projections: the GEMM; the logits of the 2 last tokens: the kernel
        rows.clear()
        m(torch.randint(0, 100, (2, many)), cache=cache)
        assert len(rows) == 7 * 2 + 1 and set(rows) == {2 * many}


def test_model_logits_match_torch_linear(monkeypatch):
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=100, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    m = Llama(cfg).eval()
    ids = torch.randint(0, 100, (2, 5))
    with torch.no_grad():
        fast = m(ids)
        monkeypatch.setattr("triforce.models.llama._ROWWISE", False)  # torch's linear everywhere
        monkeypatch.setattr("triforce.models.llama._FUSED", False)
        slow = m(ids)
    torch.testing.assert_close(fast, slow, rtol=1e-4, atol=1e-4)


@given(H=st.integers(1, 6), M=st.integers(0, 300), K=st.integers(0, 90), N=st.integers(0, 40),
       dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]), seed=st.integers(0, 2**31 - 1))
@example(H=16, M=1, K=128, N=512, dtype=torch.bfloat16, seed=0)  # DeepSeek-V2-Lite's W_UK^T
@example(H=16, M=5, K=512, N=128, dtype=torch.float32, seed=1)   # and its W_UV, a 5-token pass
@example(H=3, M=260, K=7, N=5, dtype=torch.float32, seed=2)      # rows past a chunk, N % NR != 0
def test_rowwise_linear_heads_is_each_heads_rowwise_linear(H, M, K, N, dtype, seed):
    """triforce_C::rowwise_linear_heads (DeepSeek's per-head products): out[h] is bitwise rowwise_linear(x[h], w[h])
    for every head, whatever the heads' count and the rows (the blocks of all heads shared among the threads); the
    model's per_head_linear gives the same bits through it or head by head."""
    from triforce.models.llama import per_head_linear

    g = torch.Generator().manual_seed(seed)
    x, w = torch.randn(H, M, K, generator=g).to(dtype), torch.randn(H, N, K, generator=g).to(dtype)
    out = torch.ops.triforce_C.rowwise_linear_heads(x, w)
    assert out.shape == (H, M, N) and out.dtype == dtype and out.is_contiguous()
    for h in range(H):
        assert torch.equal(out[h], rowwise(x[h], w[h]))
    if M <= ROWWISE_MAX_ROWS:
        assert torch.equal(per_head_linear(x.transpose(0, 1), w), out.transpose(0, 1))


def test_rowwise_linear_heads_checks_its_arguments():
    x, w = torch.randn(2, 3, 4), torch.randn(2, 5, 4)
    for bad, match in (((x[0], w), "3-D"), ((x, w.double()), "float32, bfloat16 or float16"),
                       ((x, torch.randn(3, 5, 4)), "same heads and columns"),
                       ((x, torch.randn(2, 5, 3)), "same heads and columns")):
        with pytest.raises(RuntimeError, match=match):
            torch.ops.triforce_C.rowwise_linear_heads(*bad)
    # strided inputs are made contiguous first: the same bits
    xs = torch.randn(3, 2, 4).transpose(0, 1)
    assert torch.equal(torch.ops.triforce_C.rowwise_linear_heads(xs, w),
                       torch.ops.triforce_C.rowwise_linear_heads(xs.contiguous(), w))
