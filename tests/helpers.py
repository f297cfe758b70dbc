"""Shared test helpers: backend parametrization, poisoning, measured tolerances."""
from __future__ import annotations

import os

import pytest
import torch

from triforce_kernels._backend import backend_status, op_backends

GPU = torch.cuda.is_available()
# indexed ("cuda:0", as tensors report their device), so that `t.device == DEVICE` holds for tensors made on it
DEVICE = torch.device("cuda", torch.cuda.current_device()) if GPU else torch.device("cpu")
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def backend_device(backend: str) -> torch.device:
    """The device a backend's tests run on: ``cpu`` always on CPU, the others on the best device."""
    return torch.device("cpu") if backend == "cpu" else DEVICE


def _required() -> set[str]:
    # CI sets TRIFORCE_REQUIRE_BACKENDS so that a backend that failed to build fails the run
    # instead of being skipped.
    return {b for b in os.environ.get("TRIFORCE_REQUIRE_BACKENDS", "").split(",") if b}


def backends(op: str, *, include_reference: bool = False) -> list:
    """``pytest.param`` per backend of ``op``; unavailable ones are skipped with the reason (or fail,
    when required by TRIFORCE_REQUIRE_BACKENDS)."""
    params = []
    for b in op_backends(op):
        if b == "reference" and not include_reference:
            continue
        ok, why = backend_status(b, backend_device(b))
        marks = ()
        if not ok:
            if b in _required():
                raise RuntimeError(f"backend {b!r} is required (TRIFORCE_REQUIRE_BACKENDS) but unavailable: {why}")
            marks = pytest.mark.skip(reason=f"{b}: {why}")
        params.append(pytest.param(b, id=b, marks=marks))
    return params


def poison_(t: torch.Tensor) -> torch.Tensor:
    """Fill an output buffer with a value no correct kernel leaves behind (NaN / -7777)."""
    return t.fill_(float("nan") if t.is_floating_point() else -7777)


def assert_close_measured(out: torch.Tensor, exact: torch.Tensor, same_precision: torch.Tensor,
                          *, factor: float = 2.0, floor: float = 0.0, name: str = "output") -> None:
    """flash-attn's rule: the kernel's max error against an exact (fp64) result may be at most
    ``factor`` x the error of the same computation done by PyTorch in the kernel's precision
    (plus ``floor``, for results where PyTorch happens to be exact)."""
    exact = exact.double()
    err = (out.double() - exact).abs().nan_to_num(float("inf")).max().item() if out.numel() else 0.0
    ref_err = (same_precision.double() - exact).abs().max().item() if out.numel() else 0.0
    assert err <= factor * ref_err + floor, (
        f"{name}: max error {err:.3e} > {factor} x PyTorch same-precision error {ref_err:.3e} + {floor:.1e}")
