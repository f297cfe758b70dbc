"""The test set-up's shortcut for Triton's interpreter (tests/conftest.py): a helper's repeated patch of
``triton.language`` is skipped inside a launch. A launch must still leave the language as it found it,
and a kernel whose helpers call Triton's own helpers (``tl.sum``, ``tl.max``) must compute what it
computes with every patch applied."""
import os

import pytest
import torch

from .helpers import GPU

pytestmark = pytest.mark.skipif(GPU or os.environ.get("TRITON_INTERPRET") != "1",
                                reason="the shortcut is for Triton's interpreter")

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")
interpreter = pytest.importorskip("triton.runtime.interpreter")


@triton.jit
def _row_stat(x_ptr, offs, n):
    x = tl.load(x_ptr + offs, mask=offs < n, other=float("-inf"))
    return tl.max(x, axis=0), tl.sum(tl.where(offs < n, x, 0.0), axis=0)


@triton.jit
def _twice(x_ptr, offs, n):
    m, s = _row_stat(x_ptr, offs, n)
    m2, s2 = _row_stat(x_ptr, offs, n)
    return m + m2, s + s2


@triton.jit
def _kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    m, s = _twice(x_ptr + row * n, offs, n)
    tl.store(out_ptr + 2 * row, m)
    tl.store(out_ptr + 2 * row + 1, s)


def _run(x):
    out = torch.empty(x.shape[0], 2)
    _kernel[(x.shape[0],)](x, out, x.shape[1], BLOCK=triton.next_power_of_2(x.shape[1]))
    return out


def _unpatched():
    """Whether ``triton.language``'s builtins and the tensor's operators are Triton's own (the interpreter
    replaces them with wrappers while a launch runs)."""
    names = ("where", "load", "store", "arange", "full", "exp", "program_id")
    ops = ("__add__", "__mul__", "__lt__", "to")
    return all(tl.core.is_builtin(getattr(tl, n)) for n in names) and all(
        tl.core.is_builtin(getattr(tl.tensor, n)) for n in ops)


def test_the_shortcut_is_installed():
    assert getattr(interpreter._patch_lang, "_triforce_once", False)


def test_a_launch_leaves_the_language_as_it_found_it():
    x = torch.randn(3, 5)
    _run(x)
    assert _unpatched()
    _run(x)
    assert _unpatched()


def test_nested_helpers_compute_as_with_every_patch_applied(monkeypatch):
    x = torch.randn(4, 37)
    got = _run(x)
    monkeypatch.setattr(interpreter, "_patch_lang", interpreter._patch_lang.__closure__[
        interpreter._patch_lang.__code__.co_freevars.index("original")].cell_contents)
    want = _run(x)
    assert torch.equal(got, want)
    assert torch.equal(got[:, 0], 2 * x.max(1).values)
    torch.testing.assert_close(got[:, 1], 2 * x.sum(1))
