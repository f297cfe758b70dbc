"""The backend registry (docs/design.md 3.4) and the custom-op registration."""
import os
import subprocess
import sys

import pytest
import torch

import triforce_kernels as tk
from triforce_kernels._backend import BackendUnavailableError, resolve

from .helpers import GPU, backends


def test_reference_always_available():
    assert tk.backend_status("reference")[0]


@pytest.mark.skipif(GPU, reason="checks the CPU-only behaviour")
def test_explicit_cuda_raises_clearly_without_gpu():
    k = torch.randn(1, 16, 1, 8)
    with pytest.raises(BackendUnavailableError, match="cuda"):
        tk.chunk_mean_keys(k, 8, backend="cuda")


def test_unknown_backend_is_a_value_error():
    with pytest.raises(ValueError, match="backend must be one of"):
        tk.chunk_mean_keys(torch.randn(1, 16, 1, 8), 8, backend="tpu")


def test_env_override_and_fallback(monkeypatch):
    dev = torch.device("cpu")
    monkeypatch.setenv("TRIFORCE_BACKEND", "reference")
    assert resolve("chunk_mean_keys", None, dev) == "reference"
    # explicit beats the environment
    if tk.backend_status("cpu", dev)[0]:
        assert resolve("chunk_mean_keys", "cpu", dev) == "cpu"
    # an environment preference that cannot run here (no such backend for the op, and not on CPU tensors
    # even with a GPU) falls back ...
    monkeypatch.setenv("TRIFORCE_BACKEND", "cuda")
    assert resolve("chunk_mean_keys", None, dev) in ("cpu", "reference")
    assert resolve("chain_speculative_sample", None, dev) in ("cpu", "reference")
    # ... unless strict
    monkeypatch.setenv("TRIFORCE_BACKEND_STRICT", "1")
    for op in ("chunk_mean_keys", "chain_speculative_sample"):
        with pytest.raises(BackendUnavailableError):
            resolve(op, None, dev)
    monkeypatch.delenv("TRIFORCE_BACKEND_STRICT")
    monkeypatch.setenv("TRIFORCE_BACKEND", "bogus")
    with pytest.raises(ValueError, match="TRIFORCE_BACKEND"):
        resolve("chunk_mean_keys", None, dev)


def test_automatic_choice_prefers_native_on_cpu(monkeypatch):
    monkeypatch.delenv("TRIFORCE_BACKEND", raising=False)
    want = "cpu" if tk.backend_status("cpu", "cpu")[0] else "reference"
    assert resolve("chunk_mean_keys", None, torch.device("cpu")) == want


@pytest.mark.skipif(not GPU, reason="CUDA tensors need a GPU")
def test_automatic_choice_on_cuda_tensors(monkeypatch):
    """CUDA tensors: the cuda backend where an op has one (the samplers), else Triton (docs/design.md 3.4)."""
    monkeypatch.delenv("TRIFORCE_BACKEND", raising=False)
    dev = torch.device("cuda")
    for op in ("chain_speculative_sample", "tree_speculative_sample", "chain_greedy_verify", "tree_greedy_verify"):
        assert resolve(op, None, dev) == "cuda", op
    for op in ("verify_attention", "chunk_mean_keys", "score_chunks", "select_chunks", "gather_chunks",
               "build_retrieval_cache"):
        assert resolve(op, None, dev) == "triton", op


def test_main_lists_backends():
    out = subprocess.run([sys.executable, "-m", "triforce_kernels"], capture_output=True, text=True,
                         check=True, env={**os.environ}).stdout
    for b in ("reference", "triton", "cpu", "cuda"):
        assert f"\n  {b} " in out
    if not GPU:
        assert "torch has no CUDA" in out or "no CUDA GPU" in out


@pytest.mark.parametrize("backend", backends("chunk_mean_keys", include_reference=True))
def test_opcheck_chunk_mean_keys(backend):
    from .helpers import backend_device

    k = torch.randn(2, 19, 3, 16, device=backend_device(backend))
    torch.library.opcheck(torch.ops.triforce.chunk_mean_keys.default, (k, 4, backend))


def test_torch_compile_chunk_mean_keys():
    k = torch.randn(1, 24, 2, 8)
    f = torch.compile(lambda x: tk.chunk_mean_keys(x, 8, backend="reference") * 2, backend="eager", fullgraph=True)
    torch.testing.assert_close(f(k), tk.chunk_mean_keys(k, 8, backend="reference") * 2)


def test_triton_launches_on_the_inputs_device(monkeypatch):
    """Triton launches on the current CUDA device, not on the tensors': every registered Triton launcher
    runs inside ``torch.cuda.device(<its inputs' device>)`` (tensors on cuda:1 while cuda:0 is current).
    Checked with CUDA tensors that FakeTensorMode creates without a GPU, and ``torch.cuda.device``
    replaced by a recorder; CPU inputs (the interpreter) take no guard."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from triforce_kernels import _backend

    entered = []

    class Recorder:
        def __init__(self, device):
            self.device = torch.device(device)

        def __enter__(self):
            entered.append(self.device)

        def __exit__(self, *exc):
            entered.append("exit")

    seen = []

    def launch(x, n):
        seen.append(list(entered))
        return n

    monkeypatch.setattr(torch.cuda, "device", Recorder)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    _backend.register("_device_guard_probe", "triton")(launch)
    try:
        impl = _backend.implementation("_device_guard_probe", "triton")
        # cuda:1 while cuda:0 is current; with a real GPU only where a fake tensor can be made there (torch
        # may allocate on the fake tensor's device, which must then exist)
        if not GPU or torch.cuda.device_count() > 1:
            with FakeTensorMode():
                assert impl(torch.empty(2, device="cuda:1"), 3) == 3
            assert seen == [[torch.device("cuda:1")]] and entered[-1] == "exit"
            with FakeTensorMode():  # inputs on the current device: no switch
                assert impl(torch.empty(2, device="cuda:0"), 5) == 5
            assert seen[-1] == entered
        impl(torch.empty(2), 4)
        assert seen[-1] == entered  # no guard entered for CPU tensors
    finally:
        _backend._IMPLS.pop("_device_guard_probe")
    # every real Triton launcher carries the guard
    for op in _backend._LAZY:
        if "triton" in tk.op_backends(op):
            assert hasattr(_backend.implementation(op, "triton"), "__wrapped__"), op
