"""The public ops' eager fast path (triforce_kernels/_backend.py: custom_op, eager_call): in plain eager mode
an op's Python body runs directly, without the dispatcher; under a dispatch mode, with autograd or while
compiling the custom op runs, and both paths give the same results."""
from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import triforce_kernels as tk
from triforce_kernels.chain_sample import _chain_sample_op
from triforce_kernels.select_chunks import _select_chunks_op
from triforce_kernels.verify_attention import _verify_attention_op


class _Seen(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def _inputs():
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(2, 4, 50, generator=g), -1)
    q = torch.softmax(torch.randn(2, 3, 50, generator=g), -1)
    d = torch.randint(0, 50, (2, 3), generator=g)
    u = torch.rand(2, 4, 2, generator=g)
    return d, q, p, u


@pytest.fixture
def direct(monkeypatch):
    """-> a list of the ops whose body ran directly (a spy in place of each body)."""
    calls = []
    for op in (_chain_sample_op, _select_chunks_op, _verify_attention_op):
        body = op._triforce_body

        def spy(*args, _body=body, _name=op._name):
            calls.append(_name)
            return _body(*args)
        monkeypatch.setattr(op, "_triforce_body", spy)
    return calls


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_plain_eager_calls_the_body_and_modes_get_the_op(direct, backend):
    d, q, p, u = _inputs()
    plain = tk.chain_speculative_sample(d, q, p, u, backend=backend)
    assert direct == ["chain_speculative_sample"]
    with _Seen() as mode:
        seen = tk.chain_speculative_sample(d, q, p, u, backend=backend)
    assert direct == ["chain_speculative_sample"]  # not the body this time
    assert any("triforce.chain_speculative_sample" in o for o in mode.ops), mode.ops
    for a, b in zip(plain, seen):
        assert torch.equal(a, b)


def test_autograd_and_other_devices_take_the_op(direct):
    qq = torch.randn(1, 2, 4, 16, requires_grad=True)
    k = torch.randn(1, 32, 2, 16)
    L = torch.tensor([20], dtype=torch.int32)
    out = tk.verify_attention(qq, k, k, L, backend="reference")
    assert direct == [] and out.shape == (1, 2, 4, 16)
    ref = tk.verify_attention(qq.detach(), k, k, L, backend="reference")
    assert direct == ["verify_attention"] and torch.equal(out.detach(), ref)
    s = torch.rand(1, 2, 40, device="meta")
    n = torch.full((1,), 40, dtype=torch.int32, device="meta")
    assert tk.select_chunks(s, n, 8, backend="reference").shape == (1, 2, 8)  # the op's fake kernel
    assert direct == ["verify_attention"]


def test_compile_traces_the_op(direct):
    s = torch.rand(1, 2, 40)
    n = torch.full((1,), 40, dtype=torch.int32)
    f = torch.compile(lambda s, n: tk.select_chunks(s, n, 8, backend="reference"), fullgraph=True, backend="eager")
    assert torch.equal(f(s, n), tk.select_chunks(s, n, 8, backend="reference"))
    assert direct == ["select_chunks"]  # only the eager call ran the body
