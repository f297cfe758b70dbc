"""Benchmark of the model layer's CPU few-row linear kernel ``triforce_C::rowwise_linear``
(csrc/include/triforce/linear.h, docs/model.md) against its baseline ``F.linear`` (MKL for float32,
oneDNN for bfloat16 and float16), with bytes, GB/s and the fraction of measured copy bandwidth.

Shape: SmolLM2-135M's MLP projection (N=1536, K=576; float32, bfloat16 as the default draft
model's copy, and float16) for M = 1..32 rows. One call streams a set of such weight matrices (as a
decode step streams the model's weights), and consecutive calls take copies of the set in turn, at least
twice the last-level cache in all (``harness.streamed``: a 300 MB L3 holds 64 such matrices of any
format), so every call reads its weights from memory. Bytes = the weights read once + the
inputs + the outputs. FLOPs = 2 x M x N x K per matrix; the compute ceiling is a matmul in the same
dtype (float32 for int8 weights and float16, whose products are float32), measured in the same run. A
shape's variants (the kernel and its baselines) run in turns, median of 9 (``harness.measure_alternating``:
a drift of a shared VM's speed reaches each alike).

``--heads``: ``rowwise_linear_heads`` (each head's own matrix, all heads in one call: DeepSeek's latent attention's
``W_UK^T`` and ``W_UV``) at DeepSeek-V2-Lite's shapes (16 heads, 128 -> 512 and 512 -> 128, M = 1 and 5 rows a
head, float32 and bfloat16), against a ``rowwise_linear`` call per head (the same bits) and one ``torch.einsum``;
streamed as above; bytes = the heads' weights + x + out.

``--many-rows``: M = 64 .. 4096 over 4 such matrices (compute-bound), where the kernel serves
verification passes of any size (row-independent) and torch's GEMM a prefill's chunks of more than
``ROWWISE_MAX_ROWS`` rows (triforce/models/llama.py); the op runs x in chunks of 256 rows.

``--dtype fp8``: ``rowwise_linear_fp8`` (an FP8 checkpoint's layer on its own weights: float8_e4m3fn codes, packed,
rows padded to 64 codes, a float32 scale per row and 64 columns (blocks of 128); 1.18 bytes a weight at K = 576)
against the float32 kernel on the dequantised weight (``cpu_float32``: what the float32 model loaded from the
checkpoint runs, the same bits), the bfloat16 kernel on it rounded to bfloat16 (``cpu_bfloat16``: a bfloat16 model's,
2 bytes a weight; x rounded too) and ``F.linear``.

``--dtype int8`` / ``q4_1``: the weight formats of triforce/models/quant.py (the int8 draft copy, and a GGUF
model's Q4_1 layers), float32 x; q4_1 also against the float32 kernel on the dequantised weight (the same
bits: what the float32 model runs).

``--dtype q4_1_int8`` / ``q8_0_int8``: ``rowwise_linear_i8`` (csrc/include/triforce/linear_i8.h: x rounded to
int8 blocks, integer dot products; Q4_1 blocks at 0.625 bytes a weight, Q8_0 at 1.0625) against the float
kernel on the same blocks (``rowwise_linear_q4_1``, ``rowwise_linear_q8``: what ``--dtype gguf`` runs) and
the float32 kernel on the dequantised weight. FLOPs count the multiply-adds as for float32.

``--dtype q4_k_int8`` / ``q5_k_int8`` / ``q6_k_int8``: the same kernel on the packed forms that hold GGUF's
K-quants (Q4_K as Q4_1 codes, Q5_K as Q5_1: nibbles plus fifth-bit masks, Q6_K as Q6_16: nibbles plus fifth- and
sixth-bit masks, a scale per 16 weights) with super-block scales (float16 bases and int8 multipliers per 256
inputs: what the GGUF loaders pack; 0.578 / 0.703 / 0.82 bytes a weight), random blocks, against the same codes
with float32 scales (``cpu_f32_scales``: 0.75 / 0.875 / 1.0 bytes a weight), the float32 kernel on the dequantised weight
(``cpu_float32``: a K-quant model's layers before) and ``F.linear``. ``--dtype iq4_xs_int8``: GGUF IQ4_XS's form
(IQ4_NL: 4-bit indices into the IQ4_NL grid, 0.539 bytes a weight; 0.625 with float32 scales), the same way;
``--dtype q2_k_int8``: GGUF Q2_K's (Q2_16: its 2-bit codes, a scale and a minimum per 16 weights; 0.39 bytes
a weight, 0.75 with float32 scales); ``--dtype q3_k_int8``: GGUF Q3_K's (Q3_16: its 3-bit codes, a scale per 16
weights; 0.445 bytes a weight, 0.625 with float32 scales), also against the same codes at Q8_0_16's byte a weight
(``cpu_q8_0_16``: what Q3_K ran on before, 1.07 bytes a weight); ``--dtype mxfp4_int8``: MXFP4 (gpt-oss's experts:
4-bit indices into FP4's doubled values, an E8M0 exponent byte per 32 weights; 0.531 bytes a weight, as the GGUF file
and OpenAI's checkpoints hold them), against the float32 kernel on the dequantised weight and ``F.linear`` (no
float-scaled form holds its grid); ``--dtype iq2_xxs_int8`` / ``iq2_xs_int8``: the grid forms GRID / GRID_16 (GGUF
IQ2_XXS's / IQ2_XS's weights: the grid values 8, 25, 43 times a sign, float32 scales per 32 / 16 weights; 0.625 /
0.75 bytes a weight), against the same codes at a byte each (``cpu_q8_0`` / ``cpu_q8_0_16``: what they ran on
before, 1.125 / 1.25 bytes a weight), the float32 kernel on the dequantised weight and ``F.linear``.
These run at SmolLM2's ``down_proj`` shape (N=576, K=1536: the same weights as the MLP's other projections, K a
whole number of super-blocks).

``rowwise_linear_i8`` also runs at M = 64 and 256 (a prefill's rows). Where the process runs its many-row
products on the AMX tiles (``triforce_C.rowwise_linear_i8_tiles()``; from 32 rows on), those rows are measured
in turns with the VNNI path (the tiles forbidden, the same bits): backend ``cpu_vnni``, and ``cpu``'s baseline
is then ``cpu_vnni`` (extra ``AMX tiles``).

    python -m bench.bench_rowwise_linear [--quick] [--many-rows] [--threads N] [--dtype DTYPE]
    # DTYPE: float32|bfloat16|float16|fp8|int8|q4_1|q4_1_int8|q8_0_int8|q4_k_int8|q5_k_int8|q6_k_int8|iq4_xs_int8|
    #        q2_k_int8|q3_k_int8|mxfp4_int8|iq2_xxs_int8|iq2_xs_int8|both
    # (default both);
    # TRIFORCE_BENCH_CSV=/tmp/x.csv keeps the repo clean
"""
import argparse

import torch
import torch.nn.functional as F

from triforce.models.llama import _rowwise_available

from .harness import compute_peak, copy_bandwidth, measure_alternating, record, streamed

N, K, MATRICES = 1536, 576, 64  # 64 x 3.5 MB = 226 MB of weights per call
FEW_ROWS, MANY_ROWS, MANY_ROWS_MATRICES = (1, 2, 4, 5, 8, 16, 32), (64, 128, 256, 512, 1024, 4096), 4
I8_MORE_ROWS = (64, 256)  # rowwise_linear_i8 also serves prefill: x in chunks of 256 rows


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="M = 1 and 8 only (--many-rows: 256 and 1024)")
    p.add_argument("--many-rows", action="store_true", help="M = 64 .. 4096 over 4 matrices")
    p.add_argument("--heads", action="store_true", help="rowwise_linear_heads at DeepSeek-V2-Lite's shapes")
    p.add_argument("--threads", type=int, default=0, help="CPU threads; 0 = default")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16", "fp8", "int8", "q4_1", "q4_1_int8",
                                       "q8_0_int8", "q4_k_int8", "q5_k_int8", "q6_k_int8", "iq4_xs_int8", "q2_k_int8",
                                       "q3_k_int8", "mxfp4_int8", "iq2_xxs_int8", "iq2_xs_int8", "both"],
                   default="both",
                   help="both = float32, bfloat16 and float16; fp8 = rowwise_linear_fp8 (float8 weights, block scales, "
                        "float32 x); int8 = rowwise_linear_q8 (weight-only int8, float32 x); "
                        "q4_1 = rowwise_linear_q4_1 (Q4_1 blocks, float32 x); q4_1_int8 / q8_0_int8 = rowwise_linear_i8 "
                        "(GGUF blocks, x rounded to int8 blocks); q4_k_int8 / q5_k_int8 / q6_k_int8 / iq4_xs_int8 / "
                        "q2_k_int8 / q3_k_int8: the same on the forms of the K-quants and IQ4_XS; mxfp4_int8: MXFP4; "
                        "iq2_xxs_int8 / iq2_xs_int8: the grid forms GRID / GRID_16")
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    if not _rowwise_available():
        raise SystemExit("the C++ extension (triforce_kernels._C with rowwise_linear) is not built")
    g = torch.Generator().manual_seed(0)
    bw = copy_bandwidth("cpu")
    kernel = torch.ops.triforce_C.rowwise_linear
    quantised = {"fp8": bench_fp8, "int8": bench_q8, "q4_1": bench_q4_1, "q4_1_int8": bench_i8, "q8_0_int8": bench_i8,
                 "q4_k_int8": bench_i8_k, "q5_k_int8": bench_i8_k, "q6_k_int8": bench_i8_k, "iq4_xs_int8": bench_i8_k,
                 "q2_k_int8": bench_i8_k, "q3_k_int8": bench_i8_k, "mxfp4_int8": bench_i8_k,
                 "iq2_xxs_int8": bench_i8_k, "iq2_xs_int8": bench_i8_k}
    if a.heads:
        return bench_heads(a, g, bw)
    if a.dtype in quantised:
        if a.many_rows:
            raise SystemExit("--many-rows: float32, bfloat16 and float16 only")
        return quantised[a.dtype](a, g, bw)
    for name in (["float32", "bfloat16", "float16"] if a.dtype == "both" else [a.dtype]):
        dtype = getattr(torch, name)
        matrices = MANY_ROWS_MATRICES if a.many_rows else MATRICES
        ws = [torch.randn(N, K, generator=g).to(dtype) for _ in range(matrices)]
        size = ws[0].element_size()
        wsets = streamed(ws, N * K * size, torch.clone)
        # float16 is multiplied in float32 (torch's float16 matmul on a CPU without AVX512-FP16 is far slower)
        peak = compute_peak("cpu", torch.float32 if dtype == torch.float16 else dtype)
        rows = MANY_ROWS if a.many_rows else FEW_ROWS
        for M in (((256, 1024) if a.many_rows else (1, 8)) if a.quick else rows):
            x = torch.randn(M, K, generator=g).to(dtype)
            nbytes = matrices * (N * K + M * K + M * N) * size
            flops = matrices * 2 * M * N * K
            shape = f"M={M},N={N},K={K},matrices={matrices}"
            t = measure_alternating({"torch": lambda: [F.linear(x, w) for w in wsets()],  # in turns (VM drift)
                                     "cpu": lambda: [kernel(x, w) for w in wsets()]}, reps=9)
            record(family="model", op="rowwise_linear", backend="torch", shape=shape, dtype=name,
                   bytes_moved=nbytes, timing=t["torch"], bandwidth=bw, flops=flops, peak=peak)
            record(family="model", op="rowwise_linear", backend="cpu", shape=shape, dtype=name,
                   bytes_moved=nbytes, timing=t["cpu"], bandwidth=bw, flops=flops, peak=peak, baseline="torch",
                   baseline_timing=t["torch"])


def bench_heads(a, g, bw) -> None:
    H, sets = 16, 64  # 64 sets of a layer's 16 heads (16 x 128 x 512: 4 MB in float32), streamed
    heads = torch.ops.triforce_C.rowwise_linear_heads
    for name in ("float32", "bfloat16"):
        dtype = getattr(torch, name)
        peak = compute_peak("cpu", dtype)
        for n, k in ((512, 128), (128, 512)):  # W_UK^T: 128 -> 512; W_UV: 512 -> 128
            ws = [torch.randn(H, n, k, generator=g).to(dtype) for _ in range(sets)]
            size = ws[0].element_size()
            wsets = streamed(ws, H * n * k * size, torch.clone)
            for M in (1,) if a.quick else (1, 5):
                x = torch.randn(H, M, k, generator=g).to(dtype)
                assert all(torch.equal(heads(x, ws[0])[h], torch.ops.triforce_C.rowwise_linear(x[h], ws[0][h]))
                           for h in range(H))
                nbytes = sets * (H * n * k + H * M * k + H * M * n) * size
                flops = sets * 2 * H * M * n * k
                shape = f"heads={H},M={M},N={n},K={k},sets={sets}"
                t = measure_alternating({
                    "torch": lambda: [torch.einsum("hmk,hnk->hmn", x, w) for w in wsets()],
                    "cpu_per_head": lambda: [[torch.ops.triforce_C.rowwise_linear(x[h], w[h]) for h in range(H)]
                                             for w in wsets()],
                    "cpu": lambda: [heads(x, w) for w in wsets()]}, reps=9)
                for backend in ("torch", "cpu_per_head", "cpu"):
                    base = {} if backend == "torch" else {"baseline": "cpu_per_head" if backend == "cpu" else "torch",
                                                          "baseline_timing": t["cpu_per_head" if backend == "cpu"
                                                                               else "torch"]}
                    record(family="model", op="rowwise_linear_heads", backend=backend, shape=shape, dtype=name,
                           bytes_moved=nbytes, timing=t[backend], bandwidth=bw, flops=flops, peak=peak, **base)


def bench_q8(a, g, bw) -> None:
    """``rowwise_linear_q8`` (triforce.models.quant: int8 weights, a float32 scale per 32) against its
    reference, ``F.linear`` on the dequantised float32 weight (what ``Q8Linear`` does off the kernel's
    path); bytes = int8 weights + scales + x + out, read once."""
    from triforce.models.quant import dequantize_q8, quantize_q8

    qs = [quantize_q8(torch.randn(N, K, generator=g)) for _ in range(MATRICES)]
    kernel = torch.ops.triforce_C.rowwise_linear_q8
    weight_bytes = N * K + qs[0][1].numel() * 4
    qsets = streamed(qs, weight_bytes, _clone_all)
    dense = streamed([dequantize_q8(q, s) for q, s in qs], N * K * 4, torch.clone)
    _bench_quantised(a, g, bw, "rowwise_linear_q8", "int8", weight_bytes,
                     lambda x: [kernel(x, q, s) for q, s in qsets()], dense, {})


def bench_fp8(a, g, bw) -> None:
    """``rowwise_linear_fp8`` (an FP8 checkpoint's weights: float8_e4m3fn, a float32 scale per row and 128 columns)
    against the float32 kernel on the dequantised weight (``cpu_float32``: the same bits), the bfloat16 kernel on it
    rounded (``cpu_bfloat16``) and ``F.linear`` on the float32 one; bytes = the codes + scales (or the float
    weights) + x + out, read once."""
    from triforce.models.loading import dequantize_fp8
    from triforce.models.quant import fp8_chunk_scales, pack_fp8

    bc = 128
    raw = [((torch.randn(N, K, generator=g) * 64).to(torch.float8_e4m3fn),
            torch.rand(N, -(-K // bc), generator=g) / 64) for _ in range(MATRICES)]
    # (as the kernel reads them: the codes packed, K = 576 padded to 640; a scale per row and 64 columns)
    qs = [(pack_fp8(q), fp8_chunk_scales(s, bc, K)) for q, s in raw]
    kernel, fp32 = torch.ops.triforce_C.rowwise_linear_fp8, torch.ops.triforce_C.rowwise_linear
    weight_bytes = qs[0][0].numel() + qs[0][1].numel() * 4
    qsets = streamed(qs, weight_bytes, _clone_all)
    dequantised = [dequantize_fp8(q, s, (1, bc)) for q, s in raw]
    dense = streamed(dequantised, N * K * 4, torch.clone)
    half = streamed([w.bfloat16() for w in dequantised], N * K * 2, torch.clone)
    x0 = torch.randn(1, K, generator=g)
    assert torch.equal(kernel(x0, *qs[0]), fp32(x0, dequantised[0]))  # (the same bits)
    _bench_quantised(a, g, bw, "rowwise_linear_fp8", "fp8", weight_bytes,
                     lambda x: [kernel(x, q, s) for q, s in qsets()], dense,
                     {"cpu_float32": (lambda x: [fp32(x, w) for w in dense()], N * K * 4),
                      "cpu_bfloat16": (lambda x: [fp32(x.bfloat16(), w) for w in half()], N * K * 2)})


def bench_q4_1(a, g, bw) -> None:
    """``rowwise_linear_q4_1`` (Q4_1 blocks: 0.75 bytes a weight) against the float32 kernel on the
    dequantised weight (``cpu_float32``: what the float32 model runs, the same bits) and ``F.linear`` on it
    (``torch``); bytes = the blocks + x + out, read once."""
    from triforce.models.quant import dequantize_q4_1, quantize_q4_1

    blocks = [quantize_q4_1(torch.randn(N, K, generator=g)) for _ in range(MATRICES)]
    kernel = torch.ops.triforce_C.rowwise_linear_q4_1
    dense = streamed([dequantize_q4_1(b, K) for b in blocks], N * K * 4, torch.clone)
    bsets = streamed(blocks, blocks[0].numel(), torch.clone)
    fp32 = torch.ops.triforce_C.rowwise_linear
    _bench_quantised(a, g, bw, "rowwise_linear_q4_1", "q4_1", blocks[0].numel(),
                     lambda x: [kernel(x, b) for b in bsets()], dense,
                     {"cpu_float32": (lambda x: [fp32(x, w) for w in dense()], N * K * 4)})


def bench_i8(a, g, bw) -> None:
    """``rowwise_linear_i8`` on Q4_1 or Q8_0 blocks against the float kernel on the same blocks (``cpu_float``:
    ``rowwise_linear_q4_1`` / ``rowwise_linear_q8``, what a model on its GGUF weights runs by default), the
    float32 kernel on the dequantised weight (``cpu_float32``) and ``F.linear`` on it (``torch``); bytes =
    codes + float16 scales + x + out, read once."""
    from triforce.models.quant import Int8DotLinear, Q4Linear, Q8Linear, quantize_q8

    q4 = a.dtype == "q4_1_int8"
    mods = []
    for _ in range(MATRICES):
        w = torch.randn(N, K, generator=g)
        if q4:
            mods.append(Q4Linear.from_linear(_linear(w)))
        else:
            q, s = quantize_q8(w)
            mods.append(Q8Linear(q, s.half().float()))
    ints = [Int8DotLinear.from_q4(m) if q4 else Int8DotLinear.from_q8(m) for m in mods]
    dense = streamed([m.weight for m in mods], N * K * 4, torch.clone)
    isets = streamed([(m.codes, m.scales) for m in ints], _packed_bytes(ints[0]), _clone_all)
    kernel, fp32 = torch.ops.triforce_C.rowwise_linear_i8, torch.ops.triforce_C.rowwise_linear
    if q4:
        fbytes = N * K * 3 // 4
        fsets = streamed([m.blocks for m in mods], fbytes, torch.clone)
        floatk = lambda x: [torch.ops.triforce_C.rowwise_linear_q4_1(x, b) for b in fsets()]  # noqa: E731
    else:
        fbytes = N * K + mods[0].scales.numel() * 4
        fsets = streamed([(m.qweight, m.scales) for m in mods], fbytes, _clone_all)
        floatk = lambda x: [torch.ops.triforce_C.rowwise_linear_q8(x, q, s) for q, s in fsets()]  # noqa: E731
    _bench_quantised(a, g, bw, "rowwise_linear_i8", a.dtype, _packed_bytes(ints[0]),
                     lambda x: [kernel(x, c, s) for c, s in isets()], dense,
                     {"cpu_float": (floatk, fbytes),
                      "cpu_float32": (lambda x: [fp32(x, w) for w in dense()], N * K * 4)})


def bench_i8_k(a, g, bw) -> None:
    """``rowwise_linear_i8`` on the forms of GGUF's K-quants and IQ4_XS with super-block scales (random codes,
    float16 bases and int8 multipliers: Q4_K's and Q5_K's ``d``, ``-dmin`` and 6-bit ``sc``, ``mn`` per 32
    weights, Q6_K's ``d`` and int8 ``sc`` per 16 (its 6-bit codes), IQ4_XS's ``d`` and ``ls - 32`` per 32, Q2_K's
    ``d``, ``-dmin`` and 4-bit ``sc``, ``mn`` per 16 (its 2-bit codes)) against
    the same blocks with float32 scales (``cpu_f32_scales``), the float32 kernel on the dequantised weight
    (``cpu_float32``: where such layers ran before) and ``F.linear`` (``torch``). MXFP4 (indices into FP4's grid,
    E8M0 exponents 2^-10..2^2): against the last two only."""
    from triforce.models.quant import Int8DotLinear, pack_i8, pack_mxfp4, unpack_i8

    n, k = K, N  # SmolLM2's down_proj: [576, 1536]
    supers, plains, bytewise = [], [], []
    for _ in range(MATRICES):
        mult = lambda lo, hi, per: torch.randint(lo, hi, (n, k // per), generator=g)  # noqa: E731
        if a.dtype == "mxfp4_int8":
            q = torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8)
            supers.append(Int8DotLinear(*pack_mxfp4(q, mult(118, 131, 32).to(torch.uint8)), k))
            continue
        if a.dtype in ("iq2_xxs_int8", "iq2_xs_int8"):  # the IQ2 grid's values times a sign: a grid form
            q = torch.tensor([8, 25, 43, -8, -25, -43], dtype=torch.int8)[torch.randint(0, 6, (n, k), generator=g)]
            d = torch.rand(n, k // (32 if a.dtype == "iq2_xxs_int8" else 16), generator=g) * 1e-3
            supers.append(Int8DotLinear(*pack_i8(q, d, None, torch.float32), k))
            bytewise.append(Int8DotLinear(*pack_i8(q, d, None, torch.float32, three_bits=False), k))
            continue
        if a.dtype in ("q4_k_int8", "q5_k_int8"):
            q = torch.randint(0, 16 if a.dtype == "q4_k_int8" else 32, (n, k), generator=g, dtype=torch.uint8)
            d, m, nb = mult(0, 64, 32), mult(0, 64, 32), 2
        elif a.dtype == "q2_k_int8":  # Q2_K's 2-bit codes (Q2_16)
            q = torch.randint(0, 4, (n, k), generator=g, dtype=torch.uint8)
            d, m, nb = mult(0, 16, 16), mult(0, 16, 16), 2
        elif a.dtype == "q3_k_int8":  # Q3_K's codes in -4..3 (Q3_16) and 6-bit sc - 32 per 16
            q = torch.randint(-4, 4, (n, k), generator=g, dtype=torch.int8)
            d, m, nb = mult(-32, 32, 16), None, 1
        elif a.dtype == "iq4_xs_int8":  # indices into the IQ4_NL grid
            q = torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8)
            d, m, nb = mult(-32, 32, 32), None, 1
        else:  # Q6_K's 6-bit codes (Q6_16)
            q = torch.randint(0, 64, (n, k), generator=g, dtype=torch.uint8)
            d, m, nb = mult(-128, 128, 16), None, 1
        base = (torch.rand(n, k // 256, nb, generator=g) * 1e-3).half().float() * torch.tensor([1.0, -1.0][:nb])
        supers.append(Int8DotLinear(*pack_i8(q, d, m, base=base), k))
        _, _, d32, m32 = unpack_i8(supers[-1].codes, supers[-1].scales, k)
        plains.append(Int8DotLinear(*pack_i8(q, d32, m32, torch.float32), k))
        if a.dtype == "q3_k_int8":
            bytewise.append(Int8DotLinear(*pack_i8(q, d, m, base=base, three_bits=False), k))
    # each call reads its matrices from memory, whatever the last-level cache (streamed: copies, in turn)
    sup = streamed([(m.codes, m.scales) for m in supers], _packed_bytes(supers[0]), _clone_all)
    dense_sets = streamed([m.weight for m in supers], n * k * 4, torch.clone)
    kernel, fp32 = torch.ops.triforce_C.rowwise_linear_i8, torch.ops.triforce_C.rowwise_linear
    others = {"cpu_float32": (lambda x: [fp32(x, w) for w in dense_sets()], n * k * 4)}
    if plains:
        plain = streamed([(m.codes, m.scales) for m in plains], _packed_bytes(plains[0]), _clone_all)
        others = {"cpu_f32_scales": (lambda x: [kernel(x, c, s) for c, s in plain()], _packed_bytes(plains[0])),
                  **others}
    if bytewise:  # Q3_K's codes (the grid forms') at a byte each, the form they ran on before: the baseline
        wide = streamed([(m.codes, m.scales) for m in bytewise], _packed_bytes(bytewise[0]), _clone_all)
        others = {f"cpu_{bytewise[0].format.lower()}": (lambda x: [kernel(x, c, s) for c, s in wide()],
                                                        _packed_bytes(bytewise[0])), **others}
    _bench_quantised(a, g, bw, "rowwise_linear_i8", a.dtype, _packed_bytes(supers[0]),
                     lambda x: [kernel(x, c, s) for c, s in sup()], dense_sets, others, n=n, k=k)


def _clone_all(tensors: tuple) -> tuple:
    return tuple(t.clone() for t in tensors)


def _packed_bytes(mod) -> int:
    """Bytes of an Int8DotLinear's packed weight: its codes and scales."""
    return mod.codes.numel() + mod.scales.numel() * mod.scales.element_size()


def _linear(w):
    lin = torch.nn.Linear(w.shape[1], w.shape[0], bias=False)
    lin.weight = torch.nn.Parameter(w, requires_grad=False)
    return lin


def _bench_quantised(a, g, bw, op, dtype, weight_bytes, run, dense, others, n=N, k=K) -> None:
    """Rows of ``op`` (``run(x)``: the kernel over the MATRICES matrices of ``weight_bytes`` each) against
    ``F.linear`` on the ``dense`` dequantised weights (a list, or a function giving one: ``streamed``; backend
    ``torch``) and ``others`` (backend -> (run, its weight bytes)), all in turns (``measure_alternating``: a
    drift of the VM's speed reaches every variant alike); the kernel's baseline is the first of ``others``
    (else ``torch``). Where ``op`` runs these rows on the AMX tiles, its VNNI path (the tiles forbidden, the
    same bits) is one more variant, ``cpu_vnni``, and the kernel's baseline. ``n``, ``k``: the matrices' shape."""
    peak = compute_peak("cpu", torch.float32)
    rows = FEW_ROWS + (I8_MORE_ROWS if op == "rowwise_linear_i8" else ())
    for M in ((1, 8) if a.quick else rows):
        x = torch.randn(M, k, generator=g)
        act = (M * k + M * n) * 4
        shape = f"M={M},N={n},K={k},matrices={MATRICES}"
        variants = {"torch": (lambda: [F.linear(x, w) for w in (dense() if callable(dense) else dense)], weight_bytes)}
        variants.update({name: (lambda f=f: f(x), wb) for name, (f, wb) in others.items()})
        tiles = op == "rowwise_linear_i8" and M >= TILE_ROWS and _tiles()
        if tiles:  # these rows run on the AMX tiles: the other path too
            variants["cpu_vnni"] = (lambda: _without_tiles(run, x), weight_bytes)
        variants["cpu"] = (lambda: run(x), weight_bytes)
        t = measure_alternating({name: f for name, (f, _) in variants.items()}, reps=9)
        first = next(iter(others), "torch")  # the kernel's baseline (cpu_vnni's too)
        baselines = {name: "torch" for name in others} | {"cpu_vnni": first, "cpu": "cpu_vnni" if tiles else first}
        for name, (_, wb) in variants.items():
            b = baselines.get(name)
            base = {"baseline": b, "baseline_timing": t[b]} if b else {}
            record(family="model", op=op, backend=name, shape=shape, dtype=dtype, bytes_moved=MATRICES * (wb + act),
                   timing=t[name], bandwidth=bw, flops=MATRICES * 2 * M * n * k, peak=peak,
                   extra="AMX tiles" if name == "cpu" and tiles else "", **base)


# rowwise_linear_i8 runs this many rows or more on the AMX tiles where the CPU has them (linear_i8.h's
# kAmxMinRows)
TILE_ROWS = 32


def _tiles() -> bool:
    """Whether this process runs rowwise_linear_i8's many-row products on the AMX tiles."""
    return bool(torch.ops.triforce_C.rowwise_linear_i8_tiles())


def _without_tiles(run, x):
    """``run(x)`` with the tiles forbidden (rowwise_linear_i8's VNNI path: the same bits)."""
    torch.ops.triforce_C.rowwise_linear_i8_tiles(False)
    try:
        return run(x)
    finally:
        torch.ops.triforce_C.rowwise_linear_i8_tiles(True)


if __name__ == "__main__":
    main()
