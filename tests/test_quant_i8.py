"""Integer dot products on GGUF blocks (csrc/include/triforce/linear_i8.h, triforce/models/quant.py):
x rounded to int8 blocks of 32, Q4_1 / Q5_1 / Q8_0 / Q8_0_16 / IQ4_NL / Q6_16 / Q4_1_16 / Q2_16 / Q3_16 / MXFP4
weights with float16, float32, super-block or E8M0 scales, int32 sums. GGUF's Q4_0, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K,
IQ4_NL, IQ4_XS and MXFP4 blocks map onto them bitwise (gguf_i8_blocks against gguf's own dequantisation).

The packing round-trips; triforce_C::rowwise_linear_i8 is bitwise its PyTorch reference
(rowwise_linear_i8_reference, which spells out the definition) at every row count, with rows bitwise
independent; the reference's error against the exact product stays within the bound the rounding of x
allows; Int8DotLinear computes one arithmetic on every path (the AMX tiles' too, where the CPU has them);
gguf_copy(..., activations="int8") keeps every engine lossless against its own autoregressive output. MXFP4
(gpt-oss's experts: doubled FP4 values, E8M0 exponents) likewise."""
import math

import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

import triforce
from triforce.models import FullCache, TokenTree, gguf_copy
from triforce.models import llama as llama_mod
from triforce.models.llama import _rowwise_available
from triforce.models.quant import (GGUF_I8_TYPES, IQ4_NL_VALUES, MXFP4_VALUES, Int8DotLinear, Q4Linear, Q8Linear,
                                   e8m0_half, gguf_i8_blocks, gguf_i8_pack, pack_i8, pack_mxfp4,
                                   quantize_activations_i8, rowwise_linear_i8_reference, unpack_i8)

from .test_quant import q4_1_gguf, small_llama

needs_kernel = pytest.mark.skipif(not _rowwise_available(), reason="the C++ extension is not built")


def i8(x, codes, scales):
    return torch.ops.triforce_C.rowwise_linear_i8(x, codes, scales)


FORMATS = ["Q4_1", "Q5_1", "Q8_0", "Q8_0_16", "IQ4_NL", "Q6_16", "Q4_1_16", "Q2_16", "Q3_16"]
HALVES = ("Q8_0_16", "Q6_16", "Q4_1_16", "Q2_16", "Q3_16")  # a scale (and minimum) per 16 weights
SCALES = [torch.float16, torch.float32]


def random_blocks(fmt, N, K, g, scales_dtype=torch.float16):
    """(q, d, m) of random blocks of a form of FORMATS: every code, some d = 0 and subnormal
    d (of float16, or of float32 for ``scales_dtype=torch.float32``, whose values are not float16 values)."""
    G = K // 32 * (2 if fmt in HALVES else 1)
    tiny = 1e-7 if scales_dtype == torch.float16 else 1e-40  # a subnormal of the scales' type
    r = lambda top: (torch.rand(N, G, generator=g) * top).to(scales_dtype).float()  # noqa: E731
    d = r(0.02)
    d.view(-1)[0] = 0.0
    if d.numel() > 1:
        d.view(-1)[1] = torch.tensor(tiny).to(scales_dtype).float()
    if fmt in ("Q4_1", "Q5_1", "Q4_1_16", "Q2_16"):
        top = {"Q5_1": 31, "Q2_16": 3}.get(fmt, 15)
        q = torch.randint(0, top + 1, (N, K), generator=g, dtype=torch.uint8)
        q.view(-1)[0] = top  # the widest code, so that the packing picks the form
        return q, d, -r(0.2)
    if fmt == "IQ4_NL":  # indices into the grid
        return torch.randint(0, 16, (N, K), generator=g, dtype=torch.uint8), d, None
    if fmt == "Q6_16":  # 6-bit codes, w = d * (q - 32)
        return torch.randint(0, 64, (N, K), generator=g, dtype=torch.uint8), d, None
    if fmt == "Q3_16":  # int8 codes in -4..3 (GGUF Q3_K's), which pack_i8 stores at 3 bits
        return torch.randint(-4, 4, (N, K), generator=g, dtype=torch.int8), d, None
    return torch.randint(-127, 128, (N, K), generator=g, dtype=torch.int8), d, None


def random_super(fmt, N, K, g):
    """(q, d, m, base) of random blocks with super-block scales (pack_i8's ``base=``): float16 bases, a zero and
    a subnormal among them, and int8 multipliers over their whole range."""
    q, _, m = random_blocks(fmt, N, K, g)
    G = K // 32 * (2 if fmt in HALVES else 1)
    base = ((torch.rand(N, K // 256, 1 if m is None else 2, generator=g) - 0.5) * 0.004).half().float()
    base.view(-1)[0] = 0.0
    base.view(-1)[1] = float(torch.tensor(1e-7).half())
    mult = lambda: torch.randint(-128, 128, (N, G), generator=g)  # noqa: E731
    return q, mult(), (None if m is None else mult()), base


def random_packed(fmt, N, K, g, scales):
    """(codes, scales) of random blocks: float16 or float32 scales (random_blocks), or ``scales="super"``
    (random_super; K a multiple of 256)."""
    if scales == "super":
        q, d, m, base = random_super(fmt, N, K, g)
        return pack_i8(q, d, m, base=base)
    q, d, m = random_blocks(fmt, N, K, g, scales)
    return pack_i8(q, d, m, scales)


def code_values(fmt, q):
    """The integer weights ``q`` stands for (int64): IQ4_NL's indices looked up in its grid, Q6_16's codes minus 32,
    else ``q``."""
    return torch.tensor(IQ4_NL_VALUES)[q.long()] if fmt == "IQ4_NL" else q.long() - 32 if fmt == "Q6_16" else q.long()


def dequantised(q, d, m):
    """float64 ``d * q (+ m)`` of blocks of 32 (or 16, when ``d`` has a scale per 16 weights)."""
    N, K = q.shape
    W = q.double().view(N, d.shape[1], -1) * d.double()[..., None]
    return (W if m is None else W + m.double()[..., None]).view(N, K)


def random_x(M, K, g, special):
    """x with, where ``special``, an all-zero block, a block with a value of exactly half a step (ties),
    blocks of huge and tiny magnitude and blocks of subnormal values."""
    x = torch.randn(M, K, generator=g)
    if special and M >= 1:
        x[0, :32] = 0.0
        if M >= 2:
            x[1, :32] = torch.arange(32) - 15.5  # amax 15.5: steps of 15.5 / 127, several values on ties
        if M >= 3:
            x[2] *= 1e30
        if M >= 4:
            x[3] *= 1e-30
        if M >= 5:  # subnormal inputs: dx subnormal (1 / dx would overflow), or rounded to 0
            x[4, :32] *= 1e-39
            x[4, 32:64] *= 1e-44
    return x


@given(fmt=st.sampled_from(FORMATS), scales_dtype=st.sampled_from(SCALES), NG=st.integers(1, 4), G=st.integers(1, 6),
       seed=st.integers(0, 2**31 - 1))
def test_packing_round_trips(fmt, scales_dtype, NG, G, seed):
    q, d, m = random_blocks(fmt, 16 * NG, 32 * G, torch.Generator().manual_seed(seed), scales_dtype)
    codes, scales = pack_i8(q, d, m, scales_dtype)
    assert codes.dtype == torch.uint8 and scales.dtype == scales_dtype
    assert codes.shape == (NG, G * {"Q4_1": 256, "Q5_1": 320, "IQ4_NL": 256, "Q6_16": 384, "Q4_1_16": 256,
                                    "Q2_16": 128, "Q3_16": 192}.get(fmt, 512))
    assert scales.shape == (NG, G * {"Q8_0": 16, "IQ4_NL": 16, "Q4_1_16": 64, "Q2_16": 64}.get(fmt, 32))
    got_fmt, q2, d2, m2 = unpack_i8(codes, scales, 32 * G)
    assert got_fmt == fmt and torch.equal(q2, code_values(fmt, q)) and torch.equal(d2, d)
    assert (m2 is None) if m is None else torch.equal(m2, m)


@needs_kernel
@given(fmt=st.sampled_from(FORMATS), NG=st.integers(1, 3), S=st.integers(1, 3), M=st.integers(1, 6),
       seed=st.integers(0, 2**31 - 1))
def test_super_block_scales_are_the_float32_scales_they_stand_for(fmt, NG, S, M, seed):
    """Super-block scales (float16 bases times int8 multipliers) unpack to the exact products, and the kernel on
    them gives bitwise what it gives on those products as float32 scales."""
    g = torch.Generator().manual_seed(seed)
    N, K = 16 * NG, 256 * S
    q, d, m, base = random_super(fmt, N, K, g)
    codes, scales = pack_i8(q, d, m, base=base)
    super_bytes = {"Q4_1": 320, "Q5_1": 320, "Q8_0_16": 288, "Q6_16": 288, "Q4_1_16": 576, "Q2_16": 576,
                   "Q3_16": 288}.get(fmt, 160)
    assert scales.dtype == torch.uint8 and scales.shape == (NG, S * super_bytes)
    per = d.shape[1] // S
    d32 = base[..., 0].repeat_interleave(per, 1) * d.float()
    m32 = None if m is None else base[..., 1].repeat_interleave(per, 1) * m.float()
    got_fmt, q2, d2, m2 = unpack_i8(codes, scales, K)
    assert got_fmt == fmt and torch.equal(q2, code_values(fmt, q)) and torch.equal(d2, d32)
    assert (m2 is None) if m is None else torch.equal(m2, m32)
    codes32, scales32 = pack_i8(q, d32, m32, torch.float32)
    assert torch.equal(codes32, codes)
    x = random_x(M, K, g, special=True)
    assert torch.equal(i8(x, codes, scales), i8(x, codes32, scales32))


@given(seed=st.integers(0, 2**31 - 1), NG=st.integers(1, 3), G=st.integers(1, 4))
def test_three_bit_codes_are_chosen_for_codes_in_minus_4_to_3(seed, NG, G):
    """int8 codes with a scale per 16 weights pack as Q3_16 (3 bits a weight: 192 code bytes a block of 16 rows
    instead of Q8_0_16's 512) exactly when all lie in -4..3, GGUF Q3_K's range; one code outside takes the grid
    form (at most 16 values: 4-bit indices, 256 bytes and the table's 16), and more than 16 values Q8_0_16, as
    does ``three_bits=False`` whatever the values. All unpack to the same codes and scales."""
    g = torch.Generator().manual_seed(seed)
    q, d, _ = random_blocks("Q3_16", 16 * NG, 32 * G, g)
    for lo, hi in ((-4, 3), (-5, 3), (-4, 4), (-100, 100)):
        qq = q.clone()
        at = int(torch.randint(0, q.numel(), (1,), generator=g))
        qq.view(-1)[at] = lo
        qq.view(-1)[(at + 1 + int(torch.randint(0, q.numel() - 1, (1,), generator=g))) % q.numel()] = hi  # another
        if lo == -100:  # 17 values and more
            qq.view(-1)[torch.randperm(q.numel(), generator=g)[:16]] = torch.arange(10, 26, dtype=torch.int8)
        for three_bits in (True, False):
            codes, scales = pack_i8(qq, d, three_bits=three_bits)
            fmt, q2, d2, _ = unpack_i8(codes, scales, 32 * G)
            want = "Q8_0_16" if lo == -100 or not three_bits else "Q3_16" if (lo, hi) == (-4, 3) else "GRID_16"
            assert fmt == want
            assert codes.shape[1] == {"Q3_16": G * 192, "GRID_16": G * 256 + 16, "Q8_0_16": G * 512}[fmt]
            assert torch.equal(q2, qq.long()) and torch.equal(d2, d)


@needs_kernel
@given(scales=st.sampled_from(SCALES + ["super"]), M=st.sampled_from([1, 2, 4, 5, 9, 33]),
       seed=st.integers(0, 2**31 - 1))
def test_three_bit_codes_give_the_bits_of_the_int8_codes(scales, M, seed):
    """Q3_16 (GGUF Q3_K's codes at their own 3 bits) gives bitwise what Q8_0_16 gives on the same int8 codes
    (``three_bits=False``), at 3/8 of its code bytes, on every path (1-4 rows, more register blocks, the AMX
    tiles from 32 rows where the CPU has them)."""
    g = torch.Generator().manual_seed(seed)
    K = 512
    if scales == "super":
        q, d, m, base = random_super("Q3_16", 32, K, g)
        three, eight = pack_i8(q, d, base=base), pack_i8(q, d, base=base, three_bits=False)
    else:
        q, d, m = random_blocks("Q3_16", 32, K, g, scales)
        three, eight = pack_i8(q, d, None, scales), pack_i8(q, d, None, scales, three_bits=False)
    assert unpack_i8(*three, K)[0] == "Q3_16" and unpack_i8(*eight, K)[0] == "Q8_0_16"
    assert three[0].numel() * 8 == eight[0].numel() * 3 and torch.equal(three[1], eight[1])
    x = random_x(M, K, g, special=True)
    assert torch.equal(i8(x, *three), i8(x, *eight))


@needs_kernel
@given(scales=st.sampled_from(SCALES + ["super"]), M=st.integers(1, 9), seed=st.integers(0, 2**31 - 1))
def test_six_bit_codes_are_the_int8_codes_they_stand_for(scales, M, seed):
    """Q6_16 (GGUF Q6_K's codes at their own 6 bits, 0.75 bytes a weight) gives bitwise what Q8_0_16 gives on the
    int8 codes q - 32 (1 byte a weight), and is 3/4 of its size."""
    g = torch.Generator().manual_seed(seed)
    K = 512
    if scales == "super":
        q, d, m, base = random_super("Q6_16", 32, K, g)
        six, eight = pack_i8(q, d, base=base), pack_i8((q.short() - 32).to(torch.int8), d, base=base)
    else:
        q, d, m = random_blocks("Q6_16", 32, K, g, scales)
        six, eight = pack_i8(q, d, None, scales), pack_i8((q.short() - 32).to(torch.int8), d, None, scales)
    assert unpack_i8(*six, K)[0] == "Q6_16" and unpack_i8(*eight, K)[0] == "Q8_0_16"
    assert six[0].numel() * 4 == eight[0].numel() * 3 and torch.equal(six[1], eight[1])
    x = random_x(M, K, g, special=True)
    assert torch.equal(i8(x, *six), i8(x, *eight))


def test_packing_refuses_bad_blocks():
    g = torch.Generator().manual_seed(0)
    q, d, m = random_blocks("Q4_1", 16, 64, g)
    with pytest.raises(ValueError, match="multiple of 16"):
        pack_i8(q[:8], d[:8], m[:8])
    with pytest.raises(ValueError, match="multiple of 32"):
        pack_i8(q[:, :48], d, m)
    with pytest.raises(ValueError, match="0..31"):
        pack_i8(q | 32, d, m)
    with pytest.raises(ValueError, match="float16 values"):
        pack_i8(q, d + 1e-9, m)
    pack_i8(q, d + 1e-9, m, torch.float32)  # float32 scales take any float32 value
    with pytest.raises(ValueError, match="scales_dtype"):
        pack_i8(q, d, m, torch.bfloat16)
    with pytest.raises(ValueError, match=r"\[16, 2\]"):
        pack_i8(q, d[:, :1], m)
    with pytest.raises(ValueError, match="0..15"):  # uint8 codes without m: IQ4_NL indices
        pack_i8(q | 16, d)
    with pytest.raises(ValueError, match="0..63"):  # ... or, with a scale per 16 weights, Q6_16 codes
        pack_i8(q | 64, torch.cat([d, d], 1))
    d16, m16 = torch.cat([d, d], 1), torch.cat([m, m], 1)  # a scale and a minimum per 16 weights: Q4_1_16 / Q2_16
    assert unpack_i8(*pack_i8(q, d16, m16), 64)[0] == "Q4_1_16"
    assert unpack_i8(*pack_i8(q & 3, d16, m16), 64)[0] == "Q2_16"
    with pytest.raises(ValueError, match="0..15"):
        pack_i8(q | 16, d16, m16)
    with pytest.raises(ValueError, match=r"m \[16, 2\]"):
        pack_i8(q, d16, m)
    with pytest.raises(ValueError, match="int8"):
        pack_i8(q.to(torch.int16), d)
    with pytest.raises(ValueError, match="not packed"):
        unpack_i8(*pack_i8(q, d, m), 96)
    q, d, m, base = random_super("Q4_1", 16, 256, g)
    with pytest.raises(ValueError, match="multiple of 256"):
        pack_i8(q[:, :224], d[:, :7], m[:, :7], base=base)
    with pytest.raises(ValueError, match="float16 values"):
        pack_i8(q, d, m, base=base + 1e-9)
    with pytest.raises(ValueError, match=r"\[16, 1, 2\]"):
        pack_i8(q, d, m, base=base[..., :1])
    with pytest.raises(ValueError, match="-128..127"):
        pack_i8(q, d * 2, m, base=base)
    with pytest.raises(ValueError, match="integer multipliers"):
        pack_i8(q, d + 0.5, m, base=base)


def test_activation_rounding_follows_the_definition():
    """dx = amax / 127, q = round half to even of x / dx, an all-zero block q = 0 and dx = 0, a block with
    inf or NaN dx = NaN and q = 0, sx the sum of q; subnormal inputs still round to the full range."""
    x = torch.zeros(5, 32)
    x[4] = (torch.arange(32) - 15.5) * 1e-40
    x[1] = torch.arange(32) - 15.5
    x[2, 0], x[3, 5] = float("inf"), float("nan")
    q, dx, sx = quantize_activations_i8(x)
    assert dx[0, 0] == 0 and not q[0].any()
    d = torch.tensor(15.5) / 127
    want = torch.round((torch.arange(32) - 15.5) / d).long()
    assert dx[1, 0] == d and torch.equal(q[1, 0], want) and sx[1, 0] == want.sum()
    assert want.abs().max() == 127
    assert torch.isnan(dx[2:4, 0]).all() and not q[2:4].any()
    assert 0 < dx[4, 0] < torch.finfo(torch.float32).tiny and q[4, 0].abs().max() == 127


@needs_kernel
@given(fmt=st.sampled_from(FORMATS), scales_dtype=st.sampled_from(SCALES + ["super"]),
       M=st.one_of(st.integers(0, 11), st.sampled_from([16, 32, 33, 35, 300])),  # 32 on: AMX tiles, if any
       G=st.integers(1, 6), NG=st.integers(1, 3), seed=st.integers(0, 2**31 - 1), special=st.booleans())
@example(fmt="Q4_1", scales_dtype=torch.float16, M=5, G=18, NG=96, seed=0, special=True)  # SmolLM2's gate / up, T = 5
@example(fmt="Q8_0", scales_dtype=torch.float16, M=3, G=18, NG=4, seed=1, special=True)
@example(fmt="Q8_0_16", scales_dtype=torch.float32, M=5, G=28, NG=8, seed=2, special=True)  # a Qwen2.5 down_proj
@example(fmt="Q4_1", scales_dtype=torch.float32, M=4, G=8, NG=3, seed=3, special=True)
@example(fmt="IQ4_NL", scales_dtype=torch.float32, M=5, G=18, NG=4, seed=4, special=True)  # IQ4_XS's scales
@example(fmt="Q4_1", scales_dtype="super", M=5, G=6, NG=4, seed=5, special=True)  # a Q4_K layer, K = 1536
@example(fmt="Q4_1", scales_dtype=torch.float16, M=40, G=18, NG=4, seed=6, special=True)  # a prefill's rows
@example(fmt="Q8_0_16", scales_dtype=torch.float32, M=17, G=4, NG=2, seed=7, special=True)
@example(fmt="Q2_16", scales_dtype="super", M=33, G=1, NG=2, seed=8, special=True)
def test_kernel_is_the_reference_bitwise(fmt, scales_dtype, M, G, NG, seed, special):
    g = torch.Generator().manual_seed(seed)
    K = 32 * G if scales_dtype != "super" else 256 * G  # super-block scales: whole super-blocks of 256
    codes, scales = random_packed(fmt, 16 * NG, K, g, scales_dtype)
    x = random_x(M, K, g, special)
    out = i8(x, codes, scales)
    assert out.shape == (M, 16 * NG) and out.dtype == torch.float32
    assert torch.equal(out, rowwise_linear_i8_reference(x, codes, scales))
    for m in range(M):  # bitwise row independence
        assert torch.equal(out[m], i8(x[m: m + 1], codes, scales)[0])


@needs_kernel
def test_the_tiles_and_the_other_path_give_the_same_bits():
    """``rowwise_linear_i8_tiles``: on a CPU with AMX the many-row products run on the tiles (linear_i8.h); with
    them forbidden, on VNNI: the same bits, every form, super-block scales too, whole and partial blocks of rows,
    across the op's 256-row chunks. Without the tiles the switch reports False and the paths are one."""
    tiles = torch.ops.triforce_C.rowwise_linear_i8_tiles
    on = tiles()
    g = torch.Generator().manual_seed(11)
    for fmt in FORMATS:
        for scales_dtype in (torch.float16, "super"):
            K = 512 if scales_dtype == "super" else 192
            codes, scales = random_packed(fmt, 48, K, g, scales_dtype)
            for M in (16, 32, 45, 300):
                x = random_x(M, K, g, True)
                a = i8(x, codes, scales)
                assert tiles(False) is False
                try:
                    b = i8(x, codes, scales)
                finally:
                    assert tiles(True) is on
                assert torch.equal(a, b), (fmt, scales_dtype, M)
                assert torch.equal(a, rowwise_linear_i8_reference(x, codes, scales)), (fmt, scales_dtype, M)


def random_mxfp4(N, K, g, low=118, high=131):
    """(q, e) of random MXFP4 blocks: every index, E8M0 exponents in [low, high) and the subnormal scales' 0 and 1."""
    q = torch.randint(0, 16, (N, K), generator=g, dtype=torch.uint8)
    e = torch.randint(low, high, (N, K // 32), generator=g, dtype=torch.uint8)
    e.view(-1)[:2] = torch.tensor([0, 1], dtype=torch.uint8)[:e.numel()]
    return q, e


def test_mxfp4_packs_and_unpacks_exactly():
    """MXFP4 (gpt-oss's experts): E8M0's scale 2^(e - 128) exact for every byte (ggml's e8m0_to_fp32_half, the
    subnormals e = 0, 1 included); the packed blocks unpack to the doubled FP4 values and those scales, so the weight
    is gguf's and OpenAI's value; pack_i8 takes the exponents as uint8 scales; bad blocks raise."""
    e = torch.arange(256).to(torch.uint8)
    assert [v.item() for v in e8m0_half(e)] == [math.ldexp(1.0, i - 128) for i in range(256)]
    g = torch.Generator().manual_seed(0)
    for N, K in ((16, 32), (32, 2880), (48, 96)):
        q, e = random_mxfp4(N, K, g, 0, 256)
        codes, scales = pack_mxfp4(q, e)
        assert codes.shape == (N // 16, K // 32 * 256) and scales.dtype == torch.uint8
        assert scales.shape == (N // 16, K // 32 * 16)
        fmt, w, d, m = unpack_i8(codes, scales, K)
        assert fmt == "MXFP4" and m is None and torch.equal(w, torch.tensor(MXFP4_VALUES)[q.long()])
        assert torch.equal(d, e8m0_half(e))
        assert all(torch.equal(a, b) for a, b in zip(pack_i8(q, e, None, torch.uint8), (codes, scales)))
        mod = Int8DotLinear(codes, scales, K)
        assert mod.format == "MXFP4"
        assert torch.equal(mod.weight, (w.float().view(N, -1, 32) * e8m0_half(e)[..., None]).view(N, K))
    for bad in ((q.to(torch.int8), e), (q | 16, e), (q, e[:, :-1]), (q, e.long())):
        with pytest.raises(ValueError, match="pack_mxfp4"):
            pack_mxfp4(*bad)


@needs_kernel
@given(M=st.one_of(st.integers(0, 11), st.sampled_from([16, 32, 33, 35, 300])), G=st.integers(1, 6),
       NG=st.integers(1, 3), seed=st.integers(0, 2**31 - 1), special=st.booleans())
@example(M=5, G=90, NG=4, seed=0, special=True)  # gpt-oss-20b's experts: 2880 inputs, not a multiple of 256
@example(M=40, G=90, NG=2, seed=1, special=False)
def test_mxfp4_kernel_is_the_reference_bitwise(M, G, NG, seed, special):
    """The kernel on MXFP4 blocks (any K a multiple of 32) is the reference bitwise, every row alone too, on the
    tiles and off them; and within float32's roundings of the exact product of the int8-rounded rows with the
    weight (the integer sums exact, one scale product per block)."""
    g = torch.Generator().manual_seed(seed)
    K = 32 * G
    codes, scales = pack_mxfp4(*random_mxfp4(16 * NG, K, g))
    x = random_x(M, K, g, special)
    out = _kernel_is_the_reference(x, codes, scales)
    assert out.shape == (M, 16 * NG)
    q, dx, _ = quantize_activations_i8(x)
    xq = (q.double() * dx.double()[..., None]).view(M, K)
    exact = xq @ Int8DotLinear(codes, scales, K).weight.double().T
    finite = torch.isfinite(exact).all(-1)
    scale = (xq.abs() @ Int8DotLinear(codes, scales, K).weight.double().abs().T)[finite]
    assert ((out[finite].double() - exact[finite]).abs() <= 1e-6 * scale + 1e-30).all()


@needs_kernel
@given(M=st.one_of(st.integers(0, 11), st.sampled_from([16, 32, 33, 35, 300])), G=st.integers(1, 6),
       NG=st.integers(1, 3), values=st.integers(1, 16), sixteen=st.booleans(), scales_dtype=st.sampled_from(SCALES),
       seed=st.integers(0, 2**31 - 1), special=st.booleans())
def test_grid_forms_are_the_reference_bitwise(M, G, NG, values, sixteen, scales_dtype, seed, special):
    """int8 codes of at most 16 values (any in -128..127) pack as GRID (a scale per 32) or GRID_16 (per 16):
    4-bit indices into the tensor's own table, the codes and scales unpacked as given; the kernel is the reference
    bitwise, every row alone too, on the tiles and off them."""
    g = torch.Generator().manual_seed(seed)
    N, K = 16 * NG, 32 * G
    grid = torch.randperm(256, generator=g)[:values].to(torch.int16) - 128
    q = grid[torch.randint(0, values, (N, K), generator=g)].to(torch.int8)
    if values > 1 and bool((q == q.view(-1)[0]).all()):
        q.view(-1)[1] = int(grid[1] if q.view(-1)[0] == grid[0] else grid[0])
    d = (torch.rand(N, K // (16 if sixteen else 32), generator=g) * 0.02).to(scales_dtype).float()
    d.view(-1)[0] = 0.0
    codes, scales = pack_i8(q, d, None, scales_dtype)
    fmt, q2, d2, _ = unpack_i8(codes, scales, K)
    if sixteen and int(q.min()) >= -4 and int(q.max()) <= 3:
        assert fmt == "Q3_16"  # (codes in -4..3: Q3_16's 3 bits)
    else:
        assert fmt == ("GRID_16" if sixteen else "GRID") and codes.shape == (NG, G * 256 + 16)
    assert torch.equal(q2, q.long()) and torch.equal(d2, d)
    x = random_x(M, K, g, special)
    assert _kernel_is_the_reference(x, codes, scales).shape == (M, N)


def _kernel_is_the_reference(x, codes, scales):
    """The kernel's product of ``x`` is the reference's bitwise, each of a few rows alone too, and the same off the
    AMX tiles; -> the product."""
    out = i8(x, codes, scales)
    assert torch.equal(out, rowwise_linear_i8_reference(x, codes, scales))
    for m in range(0, x.shape[0], max(1, x.shape[0] // 6)):
        assert torch.equal(out[m], i8(x[m: m + 1], codes, scales)[0])
    tiles = torch.ops.triforce_C.rowwise_linear_i8_tiles
    on = tiles(False)
    try:
        assert torch.equal(i8(x, codes, scales), out)
    finally:
        tiles(on)
    return out


@needs_kernel
def test_a_block_with_inf_or_nan_makes_its_rows_nan():
    g = torch.Generator().manual_seed(0)
    for fmt in FORMATS:
        q, d, m = random_blocks(fmt, 32, 96, g)
        d.fill_(float(torch.tensor(0.01).half()))
        codes, scales = pack_i8(q, d, m)
        x = torch.randn(4, 96, generator=g)
        x[1, 40], x[2, 3] = float("inf"), float("nan")
        out = i8(x, codes, scales)
        assert torch.isnan(out[1:3]).all() and torch.isfinite(out[[0, 3]]).all()
        torch.testing.assert_close(out, rowwise_linear_i8_reference(x, codes, scales), rtol=0, atol=0, equal_nan=True)


@given(fmt=st.sampled_from(FORMATS), M=st.integers(1, 6), G=st.integers(1, 8), seed=st.integers(0, 2**31 - 1))
def test_reference_error_is_bounded_by_the_rounding_of_x(fmt, M, G, seed):
    """|y - x W^T| <= sum over blocks of dx / 2 * sum |W| (each x moves by at most half a step), plus the
    float32 rounding of the block sums (a relative 1e-5 of |x| |W|^T)."""
    g = torch.Generator().manual_seed(seed)
    K = 32 * G
    q, d, m = random_blocks(fmt, 16, K, g)
    codes, scales = pack_i8(q, d, m)
    w = unpack_i8(codes, scales, K)
    W = dequantised(*w[1:])
    x = torch.randn(M, K, generator=g)
    _, dx, _ = quantize_activations_i8(x)
    bound = (dx.double()[:, None, :] / 2 * W.abs().view(16, G, 32).sum(-1)[None]).sum(-1)
    exact = x.double() @ W.T
    slack = 1e-5 * (x.double().abs() @ W.abs().T) + 1e-30
    err = (rowwise_linear_i8_reference(x, codes, scales).double() - exact).abs()
    assert (err <= bound + slack).all(), (err - bound).max()


@needs_kernel
def test_kernel_errors():
    g = torch.Generator().manual_seed(0)
    codes, scales = pack_i8(*random_blocks("Q4_1", 16, 64, g))
    x = torch.randn(2, 64)
    with pytest.raises(RuntimeError, match="multiple of the block"):
        i8(torch.randn(2, 48), codes, scales)
    with pytest.raises(RuntimeError, match="Q8_0"):
        i8(x, codes[:, :-1], scales)
    with pytest.raises(RuntimeError, match="float16, float32 or uint8"):
        i8(x, codes, scales.bfloat16())
    with pytest.raises(RuntimeError, match="multiple of 256"):  # super-block scales
        i8(x, codes, scales.view(torch.uint8))
    codes256, scales256 = random_packed("Q4_1", 16, 256, g, "super")
    with pytest.raises(RuntimeError, match="scale bytes"):
        i8(torch.randn(2, 256), codes256, scales256[:, :-1])
    with pytest.raises(RuntimeError, match="Q8_0_16"):
        i8(x, codes, scales[:, :48])
    with pytest.raises(RuntimeError, match="float32"):
        i8(x.double(), codes, scales)
    with pytest.raises(RuntimeError, match="groups"):
        i8(x, codes, torch.cat([scales, scales]))
    assert i8(torch.randn(0, 64), codes, scales).shape == (0, 16)


@pytest.mark.parametrize("fmt, scales_dtype", [("Q4_1", torch.float16), ("Q8_0", torch.float16),
                                               ("Q8_0_16", torch.float32), ("Q4_1", torch.float32),
                                               ("Q5_1", torch.float32), ("IQ4_NL", torch.float16),
                                               ("IQ4_NL", torch.float32)])
@pytest.mark.parametrize("bias", [False, True])
def test_module_is_one_arithmetic_on_every_path(fmt, scales_dtype, bias, monkeypatch):
    """The kernel and the reference (no kernel) give the same bits, the bias added after; other float
    inputs are computed in float32; a dtype cast keeps the scales' dtype; the weight dequantises as gguf."""
    from triforce.models import quant

    g = torch.Generator().manual_seed(0)
    q, d, m = random_blocks(fmt, 48, 96, g, scales_dtype)
    b = torch.randn(48, generator=g) if bias else None
    mod = Int8DotLinear(*pack_i8(q, d, m, scales_dtype), 96, b)
    assert mod.out_features == 48 and mod.format == fmt and mod.scales.dtype == scales_dtype
    W = code_values(fmt, q).float().view(48, d.shape[1], -1) * d[..., None] + (0 if m is None else m[..., None])
    assert torch.equal(mod.weight, W.view(48, 96))
    x = torch.randn(2, 7, 96, generator=g)
    want = rowwise_linear_i8_reference(x.view(-1, 96), mod.codes, mod.scales).view(2, 7, 48)
    if bias:
        want = want + b
    if _rowwise_available():
        assert torch.equal(mod(x), want)
    monkeypatch.setitem(quant._KERNELS, "rowwise_linear_i8", False)
    assert torch.equal(mod(x), want)
    assert mod(x.bfloat16()).dtype == torch.bfloat16
    assert mod.fused_projection(torch.float32) is None  # no kernel: not on the fused layer either
    for cast in (torch.bfloat16, torch.float16, torch.float32):
        mod.to(cast)
        assert mod.scales.dtype == scales_dtype


def random_gguf_rows(kind, N, K, g):
    """Random GGUF data of type ``kind`` for an [N, K] tensor (numpy uint8 [N, bytes per row]): every
    byte random but the float16 scales, which are finite (small for the K-quants' super-blocks)."""
    import numpy as np

    _, block, nbytes = GGUF_I8_TYPES[kind]
    raw = torch.randint(0, 256, (N, K // block, nbytes), generator=g, dtype=torch.uint8)
    fields = {"Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,), "Q3_K": (108,), "Q4_1": (0, 2),
              "Q5_1": (0, 2), "Q2_K": (80, 82), "TQ1_0": (52,), "TQ2_0": (64,), "IQ1_M": ()}.get(kind, (0,))
    if kind == "IQ1_M":  # d's float16 bits are the top nibbles of its four scale words (bytes 49, 51, 53, 55)
        h = ((torch.rand(N, K // block, generator=g) - 0.3) * 0.002).half().view(torch.int16).long() & 0xFFFF
        for i in range(4):
            raw[..., 49 + 2 * i] = (raw[..., 49 + 2 * i] & 15) | (((h >> (4 * i)) & 15) << 4).to(torch.uint8)
    if kind == "MXFP4":  # E8M0 exponents: scales 2^-10..2^2, and the subnormal 2^-128, 2^-127 (e = 0, 1)
        raw[..., 0] = torch.randint(118, 131, (N, K // block), generator=g, dtype=torch.uint8)
        raw[0, :2, 0] = torch.tensor([0, 1], dtype=torch.uint8)
        fields = ()
    for lo in fields:
        top = 0.002 if block == 256 else 0.05
        h = ((torch.rand(N, K // block, generator=g) - 0.3) * top).half()
        h.view(-1)[0] = 0.0
        raw[..., lo:lo + 2] = h.unsqueeze(-1).view(torch.uint8)
    return np.ascontiguousarray(raw.reshape(N, -1).numpy())


@pytest.mark.parametrize("kind", list(GGUF_I8_TYPES))
def test_gguf_blocks_map_exactly(kind):
    """Each GGUF type's blocks, packed, dequantise to gguf's own float32 weights bitwise, and the kernel on
    them is the reference; gguf_i8_pack's smaller form (super-block scales for the K-quants and IQ4_XS) is
    the same weights and gives the same bits."""
    import gguf

    g = torch.Generator().manual_seed(1)
    N, K = 32, 512
    raw = random_gguf_rows(kind, N, K, g)
    want = torch.from_numpy(gguf.quants.dequantize(raw, getattr(gguf.GGMLQuantizationType, kind)).copy()).float()
    q, d, m, scales_dtype = gguf_i8_blocks(kind, torch.from_numpy(raw), K)
    mod = Int8DotLinear(*pack_i8(q, d, m, scales_dtype), K)
    assert mod.format == GGUF_I8_TYPES[kind][0] and mod.scales.dtype == scales_dtype
    assert torch.equal(mod.weight, want.view(N, K))
    x = random_x(3, K, g, special=True)
    assert torch.equal(mod(x), rowwise_linear_i8_reference(x, mod.codes, mod.scales))
    small = Int8DotLinear(*gguf_i8_pack(kind, torch.from_numpy(raw), K), K)
    # super-block scales for the K-quants, IQ4_XS and TQ1_0 / TQ2_0; the IQ1-IQ3 grid types keep float32 scales
    superblock = GGUF_I8_TYPES[kind][1] == 256 and not kind.startswith(("IQ1", "IQ2", "IQ3"))
    assert small.scales.dtype == (torch.uint8 if superblock else scales_dtype)
    assert torch.equal(small.codes, mod.codes) and torch.equal(small.weight, want.view(N, K))
    if small.scales.dtype == torch.uint8:  # 0.04-0.08 bytes a weight instead of float32's 0.125-0.25
        assert small.scales.numel() * 3 < mod.scales.numel() * 4
    if _rowwise_available():
        assert torch.equal(small(x), mod(x))
    with pytest.raises(ValueError, match="uint8"):
        gguf_i8_blocks(kind, torch.from_numpy(raw)[:, :-1], K)
    with pytest.raises(ValueError, match="one of"):
        gguf_i8_blocks("BF16", torch.from_numpy(raw), K)


def test_an_offset_block_whose_minimum_overflows_keeps_int8_codes():
    """Q4_0 / Q5_0 go to the nibble forms with m = -8 d / -16 d; where that overflows float16 they keep int8
    codes (Q4_0's 16 values then take the grid form, Q5_0's 32 Q8_0's), gguf's weight either way."""
    import gguf

    g = torch.Generator().manual_seed(2)
    for kind, offset in (("Q4_0", 8), ("Q5_0", 16)):
        raw = random_gguf_rows(kind, 16, 64, g)
        raw[3, 0:2] = torch.tensor([60000.0]).half().view(torch.uint8).numpy()  # d * offset > float16's max
        q, d, m, _ = gguf_i8_blocks(kind, torch.from_numpy(raw), 64)
        assert m is None and q.dtype == torch.int8
        mod = Int8DotLinear(*pack_i8(q, d, m), 64)
        want = gguf.quants.dequantize(raw, getattr(gguf.GGMLQuantizationType, kind))
        # Q4_0's codes q - 8 take 16 values: the grid form, half Q8_0's bytes; Q5_0's 32: Q8_0
        assert torch.equal(mod.weight, torch.from_numpy(want.copy()).float().view(16, 64))
        assert mod.format == ("GRID" if kind == "Q4_0" else "Q8_0")
        raw[3, 0:2] = 0
        assert gguf_i8_blocks(kind, torch.from_numpy(raw), 64)[2] is not None, offset


@needs_kernel
def test_from_the_float_modules_keeps_the_blocks():
    g = torch.Generator().manual_seed(0)
    q, d, m = random_blocks("Q4_1", 32, 64, g)
    from triforce.models.quant import _q4_1_blocks
    q4 = Q4Linear(_q4_1_blocks(d.half(), m.half(), q.view(32, 2, 32)), 64)
    assert torch.equal(Int8DotLinear.from_q4(q4).weight, q4.weight)
    q8, d8, _ = random_blocks("Q8_0", 32, 64, g)
    lin = Q8Linear(q8, d8)
    assert torch.equal(Int8DotLinear.from_q8(lin).weight, lin.weight)


@needs_kernel
@pytest.mark.parametrize("bias", [False, True])
def test_gguf_copy_with_int8_activations(tmp_path, bias):
    """Every projection and the tied head become Int8DotLinear; a pass of T tokens gives the logits of T
    one-token steps bitwise (fused layer or modules alike), and every engine emits the copy's own
    autoregressive tokens."""
    path, model = q4_1_gguf(tmp_path, small_llama(bias=bias))
    fast = gguf_copy(model, path, activations="int8")
    assert isinstance(fast.lm_head, Int8DotLinear) and fast.lm_head.format == "Q8_0"
    assert all(isinstance(m, Int8DotLinear) and m.format == "Q4_1" for n, m in fast.named_modules()
               if n.endswith("_proj"))
    with pytest.raises(ValueError, match="activations"):
        gguf_copy(model, path, activations="int4")
    ids = torch.randint(64, (2, 30))
    with torch.no_grad():
        ref = fast(ids)
        assert (ref - model(ids)).abs().max() < 0.1 * model(ids).abs().max()  # close to the float model
        for fused in (True, False):
            llama_mod._FUSED = fused
            try:
                caches = [FullCache(model.config, 2, 64) for _ in range(2)]
                fast(ids[:, :20], cache=caches[0])
                fast(ids[:, :20], cache=caches[1])
                steps = torch.cat([fast(ids[:, 20 + t: 21 + t], cache=caches[0]) for t in range(5)], 1)
                assert torch.equal(fast(ids[:, 20:25], cache=caches[1]), steps)
                tree = TokenTree(torch.tensor([[-1, 0, 1, 2, 3]] * 2))  # a chain: the causal pass
                caches[1].rollback(caches[1].lengths - 5)
                assert torch.equal(fast(ids[:, 20:25], cache=caches[1], tree_parents=tree), steps)
            finally:
                llama_mod._FUSED = None
    prompts = [torch.randint(64, (n,)) for n in (20, 33)]
    want = triforce.generate(fast, prompts, method="autoregressive", max_new_tokens=10)
    for method, options in (("speculative", {"gamma": 3}), ("tree", {}),
                            ("magicdec", {"gamma": 2, "draft_cache": "retrieval", "budget": 12, "chunk_size": 4})):
        got = triforce.generate(fast, prompts, method=method, max_new_tokens=10, **options)
        assert all(torch.equal(a, b) for a, b in zip(want.tokens, got.tokens)), method


# A K-quant file like llama.cpp's mixes (Q4_K_M, Q5_K_M, Q3_K_M): a type per tensor (K-quants where rows are
# whole super-blocks of 256, Q5_0 / Q4_0 / Q8_0 elsewhere), random blocks; the second layer has two IQ4 tensors
# (the IQ4_XS mix's types) and a Q2_K one (the Q2_K mixes').
_KQUANT_MIX = {"attn_q": "Q4_K", "attn_k": "Q3_K", "attn_v": "Q6_K", "attn_output": "Q4_0", "ffn_gate": "Q5_K",
               "ffn_up": "Q5_0", "ffn_down": "Q6_K", "token_embd": "Q8_0"}
_KQUANT_MIX_LAYER1 = {**_KQUANT_MIX, "attn_q": "IQ4_XS", "ffn_up": "IQ4_NL", "ffn_gate": "Q2_K"}


# The low-bit mixes' types (llama.cpp's IQ1_S, IQ1_M, IQ2_XXS .. IQ3_M and TQ mixes), one per tensor, random blocks.
_IQ_MIX = {"attn_q": "IQ2_XXS", "attn_k": "IQ2_XS", "attn_v": "IQ3_S", "attn_output": "IQ3_XXS", "ffn_gate": "IQ1_S",
           "ffn_up": "IQ2_S", "ffn_down": "IQ1_M", "token_embd": "Q8_0"}
_IQ_MIX_LAYER1 = {**_IQ_MIX, "attn_q": "TQ1_0", "ffn_up": "TQ2_0"}
_IQ_FORMAT = {"IQ2_XXS": "GRID", "IQ2_XS": "GRID_16", "IQ3_S": "GRID", "IQ3_XXS": "GRID", "IQ1_S": "GRID",
              "IQ2_S": "GRID_16", "IQ1_M": "GRID_16", "TQ1_0": "Q2_16", "TQ2_0": "Q2_16"}


def _kquant_kind(layer, tensor, mixes=(_KQUANT_MIX, _KQUANT_MIX_LAYER1)):
    return mixes[1 if layer == 1 else 0][tensor]


def kquant_gguf(tmp_path, seed=0, mixes=(_KQUANT_MIX, _KQUANT_MIX_LAYER1)):
    import gguf

    from triforce.models import Llama, LlamaConfig

    from .test_config import write_gguf

    g = torch.Generator().manual_seed(seed)
    cfg = LlamaConfig(vocab_size=64, hidden_size=256, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      tie_word_embeddings=True)

    def quant(name, t):
        if t.ndim != 2:
            return t, None
        parts = name.split(".")
        kind = _kquant_kind(int(parts[1]) if parts[0] == "blk" else 0, parts[-2], mixes)
        return random_gguf_rows(kind, t.shape[0], t.shape[1], g), getattr(gguf.GGMLQuantizationType, kind)

    path = write_gguf(tmp_path / "kq.gguf", Llama(cfg).eval(), quant=quant)
    return path, Llama.from_pretrained(path, cache_dir=False)


@needs_kernel
def test_gguf_copy_of_a_k_quant_file(tmp_path):
    """Every layer of a K-quant file (Q4_K, Q5_K, Q3_K, Q6_K, Q2_K, Q4_0, Q5_0, Q8_0, IQ4_XS, IQ4_NL) runs on its own
    blocks with integer dot products (the tied head on the embedding's Q8_0); a pass of T tokens gives T one-token
    steps' logits bitwise; the engines emit the copy's autoregressive tokens. Without int8 activations the K-quant
    layers stay float32."""
    path, model = kquant_gguf(tmp_path)
    fast = gguf_copy(model, path, activations="int8")
    want_format = {"Q4_K": "Q4_1", "Q5_0": "Q5_1", "Q6_K": "Q6_16", "Q4_0": "Q4_1", "Q3_K": "Q3_16",
                   "Q5_K": "Q5_1", "IQ4_XS": "IQ4_NL", "IQ4_NL": "IQ4_NL", "Q2_K": "Q2_16"}
    names = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
             "gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down"}
    for name, mod in fast.named_modules():
        if name.endswith("_proj"):
            kind = _kquant_kind(int(name.split(".")[2]), names[name.rsplit(".", 1)[1]])
            assert isinstance(mod, Int8DotLinear) and mod.format == want_format[kind], name
            assert mod.scales.dtype == (torch.uint8 if kind.endswith(("_K", "_XS")) else torch.float16)
            assert torch.equal(mod.weight, model.get_submodule(name).weight)
    assert isinstance(fast.lm_head, Int8DotLinear) and fast.lm_head.format == "Q8_0"
    floats = gguf_copy(model, path)  # Q8_0 only: the head; the rest stays as loaded
    assert isinstance(floats.lm_head, Q8Linear)
    assert not any(isinstance(m, (Q4Linear, Int8DotLinear)) for m in floats.modules())
    _runs_like_its_steps(fast, model, ("speculative", {"gamma": 3}), ("tree", {}))


@needs_kernel
def test_gguf_copy_of_a_low_bit_file(tmp_path):
    """Every layer of a file of the IQ1-IQ3 and TQ types runs on integer dot products, its weight gguf's
    dequantised one bitwise (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS and IQ1_M on int8 codes, IQ3_S and IQ1_S on 4-bit ones,
    TQ1_0 and TQ2_0 on 2-bit ones); a pass of T tokens gives the one-token steps' logits bitwise; the engines emit
    the copy's autoregressive tokens."""
    path, model = kquant_gguf(tmp_path, mixes=(_IQ_MIX, _IQ_MIX_LAYER1))
    fast = gguf_copy(model, path, activations="int8")
    names = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
             "gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down"}
    seen = set()
    for name, mod in fast.named_modules():
        if name.endswith("_proj"):
            kind = _kquant_kind(int(name.split(".")[2]), names[name.rsplit(".", 1)[1]], (_IQ_MIX, _IQ_MIX_LAYER1))
            assert isinstance(mod, Int8DotLinear) and mod.format == _IQ_FORMAT[kind], name
            assert mod.scales.dtype == (torch.uint8 if kind.startswith("TQ") else torch.float32)
            assert torch.equal(mod.weight, model.get_submodule(name).weight)
            seen.add(kind)
    assert seen == set(_IQ_FORMAT)
    _runs_like_its_steps(fast, model, ("speculative", {"gamma": 3}), ("magicdec", {}))


def _runs_like_its_steps(fast, model, *methods):
    """``fast`` (a GGUF copy of ``model`` with int8 activations, vocabulary 64): near the float32 logits, a pass of 5
    tokens the one-token steps' logits bitwise, and each of ``methods`` ``(name, options)`` its autoregressive
    tokens."""
    ids = torch.randint(64, (2, 24))
    with torch.no_grad():
        ref, exact = fast(ids), model(ids)
        assert torch.isfinite(ref).all() and (ref - exact).abs().max() < 0.1 * exact.abs().max()
        caches = [FullCache(model.config, 2, 64) for _ in range(2)]
        fast(ids[:, :16], cache=caches[0])
        fast(ids[:, :16], cache=caches[1])
        steps = torch.cat([fast(ids[:, 16 + t: 17 + t], cache=caches[0]) for t in range(5)], 1)
        assert torch.equal(fast(ids[:, 16:21], cache=caches[1]), steps)
    prompts = [torch.randint(64, (n,)) for n in (20, 33)]
    want = triforce.generate(fast, prompts, method="autoregressive", max_new_tokens=8)
    for method, options in methods:
        got = triforce.generate(fast, prompts, method=method, max_new_tokens=8, **options)
        assert all(torch.equal(a, b) for a, b in zip(want.tokens, got.tokens)), method


@given(kind=st.sampled_from(["IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M", "TQ1_0", "TQ2_0"]),
       NG=st.integers(1, 3), S=st.integers(1, 2), M=st.integers(1, 5), seed=st.integers(0, 2**31 - 1),
       magnitude=st.sampled_from([1e-7, 2e-3, 1.0, 500.0]))
def test_grid_types_map_exactly_at_any_scale(kind, NG, S, M, seed, magnitude):
    """Random blocks of the low-bit types, their float16 scales of any magnitude (subnormal ones included): the
    packed weight is gguf's dequantised one bitwise in both packings, and the module is the reference."""
    import gguf

    g = torch.Generator().manual_seed(seed)
    N, K = 16 * NG, 256 * S
    raw = torch.from_numpy(random_gguf_rows(kind, N, K, g))
    lo = {"TQ1_0": 52, "TQ2_0": 64}.get(kind, 0)
    if kind != "IQ1_M":
        d = ((torch.rand(N, S, generator=g) - 0.5) * magnitude).half()
        raw.view(N, S, -1)[..., lo:lo + 2] = d.unsqueeze(-1).view(torch.uint8)
    want = torch.from_numpy(gguf.quants.dequantize(raw.numpy(), getattr(gguf.GGMLQuantizationType, kind))).float()
    mod = Int8DotLinear(*pack_i8(*gguf_i8_blocks(kind, raw, K)), K)
    small = Int8DotLinear(*gguf_i8_pack(kind, raw, K), K)
    assert torch.equal(mod.weight, want) and torch.equal(small.weight, want)
    x = random_x(M, K, g, special=False)
    assert torch.equal(mod(x), rowwise_linear_i8_reference(x, mod.codes, mod.scales))
    assert torch.equal(small(x), mod(x))


def test_a_grid_block_with_a_scale_that_is_not_finite_raises():
    """A grid type's codes come from gguf's weight and the block's scale; a NaN or infinite scale leaves none to
    recover: a clear error, not NaN codes. A zero scale takes codes the tensor has elsewhere."""
    g = torch.Generator().manual_seed(3)
    for kind, lo in (("IQ2_XXS", 0), ("IQ3_S", 0), ("IQ1_S", 0), ("TQ2_0", 64)):
        raw = random_gguf_rows(kind, 16, 256, g)
        raw[5, lo:lo + 2] = torch.tensor([float("nan")]).half().view(torch.uint8).numpy()
        with pytest.raises(ValueError, match=f"{kind} block's weights are not its scale times integer codes"):
            gguf_i8_blocks(kind, torch.from_numpy(raw), 256)
        raw[5, lo:lo + 2] = 0  # a zero scale: zero weights, and codes the tensor has elsewhere (no new grid value)
        q, d, m, scales_dtype = gguf_i8_blocks(kind, torch.from_numpy(raw), 256)
        assert not Int8DotLinear(*pack_i8(q, d, m, scales_dtype), 256).weight[5].any()
        assert set(q[5].tolist()) <= set(q[torch.arange(16) != 5].flatten().tolist())


@needs_kernel
@pytest.mark.parametrize("kind", ["kquant", "q4_1", "low_bit"])
def test_load_gguf_int8_is_gguf_copy_without_the_float32_layers(tmp_path, kind):
    """load_gguf_int8(path) computes bitwise what gguf_copy(from_pretrained(path), path, "int8") computes, and
    holds no float32 weight of a layer it packs."""
    from triforce.models.quant import load_gguf_int8

    path, model = (kquant_gguf(tmp_path) if kind == "kquant" else q4_1_gguf(tmp_path, small_llama(bias=True))
                   if kind == "q4_1" else kquant_gguf(tmp_path, mixes=(_IQ_MIX, _IQ_MIX_LAYER1)))
    want = gguf_copy(model, path, activations="int8")
    got = load_gguf_int8(path)
    assert [type(m) for m in got.modules()] == [type(m) for m in want.modules()]
    packed = {n for n, m in got.named_modules() if isinstance(m, Int8DotLinear)}
    assert packed and not any(n.rsplit(".", 1)[0] in packed for n, _ in got.named_parameters() if n.endswith("weight"))
    ids = torch.randint(64, (2, 20))
    with torch.no_grad():
        assert torch.equal(got(ids), want(ids))
    c1, c2 = FullCache(model.config, 2, 32), FullCache(model.config, 2, 32)
    with torch.no_grad():
        assert torch.equal(got(ids, cache=c1), want(ids, cache=c2))
        step = torch.randint(64, (2, 3))
        assert torch.equal(got(step, cache=c1), want(step, cache=c2))
