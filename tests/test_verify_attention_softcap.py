"""tk.verify_attention with soft-capped scores (``softcap=c``: every scaled score s becomes ``c * tanh(s / c)``,
Gemma 2's): every backend against the float64 reference, with and without a sliding window; a pass with the
bits of its one-token steps (cpu, triton); bad caps; the custom op's registration. And the model layer's
``triforce_C::softcap`` (Gemma 2's capped logits): every element the same bits wherever it lies."""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import triforce_kernels as tk
from triforce_kernels._backend import implementation

from .helpers import DTYPES, backend_device, backends
from .test_tree_mask import random_parents
from .test_verify_attention import assert_rows_are_their_steps, check_against_reference, make_inputs

CAPS = [0.5, 2.0, 20.0, 50.0]


@pytest.mark.parametrize("backend", backends("verify_attention"))
@settings(deadline=None)
@given(B=st.integers(1, 3), g=st.sampled_from([1, 3, 4]), D=st.sampled_from([16, 64]), data=st.data(),
       dtype=st.sampled_from(DTYPES), mask_kind=st.sampled_from(["causal", "tree", "random"]),
       cap=st.sampled_from(CAPS), window=st.sampled_from([None, None, 3, 40]),
       num_splits=st.sampled_from([None, 1, 3]), seed=st.integers(0, 2**31 - 1))
def test_matches_reference(backend, B, g, D, data, dtype, mask_kind, cap, window, num_splits, seed):
    interpreted = backend == "triton" and not torch.cuda.is_available()
    T = data.draw(st.integers(1, 10 if interpreted else 40), label="T")
    prefixes = data.draw(st.lists(st.sampled_from([0, 17, 33, 70] + ([] if interpreted else [600])),
                                  min_size=B, max_size=B), label="prefixes")
    dev = backend_device(backend)
    q, k, v, L, mask = make_inputs(B, T, 2 * g, 2, D, prefixes, 1, dtype, seed, dev, mask_kind)
    q = q * 4  # scores of several units: past a small cap's knee
    if num_splits is None:
        out, lse = tk.verify_attention(q, k, v, L, mask, return_lse=True, window=window, softcap=cap, backend=backend)
    else:
        impl = implementation("verify_attention", backend)
        out, lse = impl(q, k, v, L, mask, 1.0 / math.sqrt(D), num_splits=num_splits, window=window, softcap=cap)
    check_against_reference(out, lse, q, k, v, L, mask, window=window, softcap=cap)


@pytest.mark.parametrize("backend", backends("verify_attention"))
@settings(deadline=None)
@given(T=st.integers(1, 9), g=st.sampled_from([1, 3, 4]), D=st.sampled_from([16, 64]),
       prefix=st.sampled_from([5, 33, 130, 600]), cap=st.sampled_from(CAPS), window=st.sampled_from([None, 6]),
       dtype=st.sampled_from(DTYPES), tree=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_a_pass_gives_the_bits_of_one_token_steps(backend, T, g, D, prefix, cap, window, dtype, tree, seed):
    """Row t of a soft-capped pass is bitwise the one-token step at its position over the committed cache (the
    cap is elementwise, computed by the same instructions for every score)."""
    if backend == "triton" and not torch.cuda.is_available():
        prefix = min(prefix, 130)
    dev = backend_device(backend)
    B, Hkv = 2, 2
    q, k, v, L, _ = make_inputs(B, T, Hkv * g, Hkv, D, [prefix + 3 * b for b in range(B)], 2, dtype, seed,
                                torch.device("cpu"))
    q = q * 4
    parents = random_parents(B, T, seed) if tree else torch.arange(-1, T - 1).expand(B, T)
    mask = tk.tree_attention_mask(parents) if tree else None
    to = lambda x: None if x is None else x.to(dev)  # noqa: E731
    out, lse = tk.verify_attention(to(q), to(k), to(v), to(L), to(mask), return_lse=True, window=window, softcap=cap,
                                   backend=backend)
    assert_rows_are_their_steps(q, k, v, L, parents, out, lse, backend, to, window=window, softcap=cap)


@pytest.mark.parametrize("backend", backends("verify_attention", include_reference=True))
def test_the_cap_bends_the_scores_and_a_huge_one_changes_little(backend):
    dev = backend_device(backend)
    q, k, v, L, mask = make_inputs(2, 4, 4, 2, 16, [30, 9], 1, torch.float32, 1, dev, "tree")
    q = q * 4
    plain = tk.verify_attention(q, k, v, L, mask, backend=backend)
    assert (tk.verify_attention(q, k, v, L, mask, softcap=1.0, backend=backend) - plain).abs().max() > 0.05
    torch.testing.assert_close(tk.verify_attention(q, k, v, L, mask, softcap=1e6, backend=backend), plain,
                               atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", backends("verify_attention", include_reference=True))
def test_trusted_entry_and_opcheck(backend, monkeypatch):
    from triforce_kernels.verify_attention import _verify_attention_op, verify_attention_trusted

    monkeypatch.setenv("TRIFORCE_BACKEND", backend)
    dev = backend_device(backend)
    q, k, v, L, mask = make_inputs(2, 4, 6, 2, 16, [40, 9], 1, torch.float32, 5, dev, "tree")
    want = tk.verify_attention(q, k, v, L, mask, window=7, softcap=3.0, backend=backend)
    torch.testing.assert_close(verify_attention_trusted(q, k, v, L, mask, 7, None, 3.0), want, rtol=0, atol=0)
    torch.library.opcheck(_verify_attention_op, (q, k, v, L, mask, 0.25, backend, 7, 3.0),
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))


@pytest.mark.parametrize("cap, err", [(0.0, ValueError), (-1.0, ValueError), (float("inf"), ValueError),
                                      (float("nan"), ValueError), (True, TypeError), ("50", TypeError)])
def test_bad_caps(cap, err):
    q, k, v, L, _ = make_inputs(1, 2, 2, 1, 16, [4], 0, torch.float32, 0, torch.device("cpu"))
    with pytest.raises(err, match="softcap must be"):
        tk.verify_attention(q, k, v, L, softcap=cap)


def _ulps(got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    w = want.float()
    return ((got.double() - want) / (torch.nextafter(w.abs(), torch.tensor(math.inf)) - w.abs()).double()).abs()


@pytest.mark.skipif(not tk.backend_status("cpu", "cpu")[0], reason="needs the C++ extension")
def test_softcap_op_is_elementwise_and_accurate():
    """``triforce_C::softcap``: each element's bits are the same wherever it lies (alone, in a row of any
    length, at any offset, on any thread count), within 4 ulp of cap * tanh(x / cap) computed in float64 (for
    these x, x / cap is a normal float), and its specials: +-inf -> +-cap, NaN -> NaN, 0 -> 0."""
    from triforce.models.llama import _rowwise_available

    assert _rowwise_available()
    op = torch.ops.triforce_C.softcap
    g = torch.Generator().manual_seed(0)
    x = torch.cat([torch.randn(20000, generator=g) * s for s in (0.1, 1.0, 30.0, 300.0)])
    for cap in (1.0, 30.0, 50.0):
        full = op(x, cap)
        want = torch.tanh(x.double() / cap) * cap
        assert _ulps(full, want).max() <= 4
        for lo, n in ((0, 1), (3, 17), (1000, 33), (7, 40000)):
            assert torch.equal(op(x[lo:lo + n].clone(), cap), full[lo:lo + n])
        threads = torch.get_num_threads()
        try:
            torch.set_num_threads(1)
            assert torch.equal(op(x.view(8, -1), cap).flatten(), full)
        finally:
            torch.set_num_threads(threads)
    special = op(torch.tensor([math.inf, -math.inf, math.nan, 0.0, -0.0]), 30.0)
    assert special[:2].tolist() == [30.0, -30.0] and math.isnan(special[2]) and special[3:].tolist() == [0.0, 0.0]


@pytest.mark.skipif(not tk.backend_status("cpu", "cpu")[0], reason="needs the C++ extension")
@settings(deadline=None)
@given(cap=st.floats(2.0 ** -10, 2.0 ** 14, width=32),
       xs=st.lists(st.floats(width=32, allow_nan=False, allow_infinity=False), min_size=1, max_size=70),
       lo=st.integers(0, 20))
def test_softcap_op_any_value_any_place(cap, xs, lo):
    """``triforce_C::softcap`` for any finite float32 x and cap: within 4 ulp of cap * tanh(x / cap) in float64
    where x / cap is a normal float or 0 (a subnormal quotient has lost bits before any tanh), and each element
    the bits it has alone, at any offset in a row of any length."""
    from triforce.models.llama import _rowwise_available

    assert _rowwise_available()
    op = torch.ops.triforce_C.softcap
    x = torch.tensor(xs, dtype=torch.float32)
    row = torch.cat([torch.full((lo,), 7.0), x])
    got = op(row, cap)[lo:]
    for i in range(len(xs)):
        assert torch.equal(op(x[i:i + 1].clone(), cap), got[i:i + 1])
    q = x.double() / float(cap)
    normal = (q.abs() >= 2.0 ** -126) | (x == 0)
    want = torch.tanh(q) * float(cap)
    assert not normal.any() or _ulps(got[normal], want[normal]).max() <= 4


@pytest.mark.parametrize("backend", backends("verify_attention"))
@pytest.mark.parametrize("cap", [50.0, None])
def test_bfloat16_outputs_round_to_nearest(backend, cap):
    """The case the fuzz profile found (2026-12-04): Triton's interpreter cast the float32 output to bfloat16 by
    truncation (a GPU rounds to nearest even), one ulp off (-4.0576 stored as -4.03125, not -4.0625); the kernel now
    rounds to nearest there too (verify_attention._downcast), within the reference's error, as every backend."""
    q, k, v, L, mask = make_inputs(2, 2, 2, 2, 16, [0, 0], 1, torch.bfloat16, 428, backend_device(backend), "causal")
    q = q * 4
    out, lse = tk.verify_attention(q, k, v, L, mask, return_lse=True, softcap=cap, backend=backend)
    check_against_reference(out, lse, q, k, v, L, mask, softcap=cap)
