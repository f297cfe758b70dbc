"""Backend registry (docs/design.md 3.4).

Every op has up to four backends:

* ``reference`` -- naive PyTorch (``triforce_kernels/reference``), always available;
* ``triton``    -- Triton kernels; on a GPU, or on CPU tensors in the Triton interpreter
                   (``TRITON_INTERPRET=1``, set on import when there is no GPU; slow: tests only);
* ``cpu``       -- the C++/OpenMP extension ``triforce_kernels._C``, CPU tensors;
* ``cuda``      -- the C++/CUDA part of the same extension, CUDA tensors.

Selection: an explicit ``backend=`` argument, else the ``TRIFORCE_BACKEND`` environment variable,
else the best backend available for the tensors' device (``_AUTO_ORDER``). An explicit argument
that cannot be honoured raises :class:`BackendUnavailableError`. The environment variable is a
global preference: an op that lacks that backend, or a device it cannot run on, falls back to the
automatic choice, unless ``TRIFORCE_BACKEND_STRICT=1``, which makes it raise as well.
"""
from __future__ import annotations

import functools
import importlib
import os
from typing import Callable

import sys

import torch

# Without a GPU, Triton can only run in its interpreter, and only if TRITON_INTERPRET=1 is set before
# Triton is imported: do that here (an explicit TRITON_INTERPRET=0 is respected), so `backend="triton"`
# works on CPU tensors. Automatic selection never picks the interpreter (it is slow).
if "TRITON_INTERPRET" not in os.environ and "triton" not in sys.modules and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

BACKENDS = ("reference", "triton", "cpu", "cuda")

# Automatic choice per device type, best first. Triton on CPU is the interpreter: never automatic.
_AUTO_ORDER = {"cuda": ("cuda", "triton", "reference"), "cpu": ("cpu", "reference")}

# op name -> backend -> implementation
_IMPLS: dict[str, dict[str, Callable]] = {}
# op name -> backend -> module that registers it when imported (lazy: triton is imported on use)
_LAZY: dict[str, dict[str, str]] = {}


class BackendUnavailableError(RuntimeError):
    """An explicitly requested backend cannot run this op on these tensors."""


def register(op: str, backend: str) -> Callable[[Callable], Callable]:
    """Decorator: register ``fn`` as the ``backend`` implementation of ``op``."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; expected one of {BACKENDS}")

    def deco(fn: Callable) -> Callable:
        _IMPLS.setdefault(op, {})[backend] = _on_inputs_device(fn) if backend == "triton" else fn
        return fn

    return deco


def _on_inputs_device(launch: Callable) -> Callable:
    """Run a Triton launcher with its inputs' GPU as the current device. Triton launches on the *current*
    device (and its current stream), not on the tensors' device: tensors on cuda:1 while cuda:0 is current
    would run the kernel on cuda:0 with cuda:1's pointers (an illegal address, or wrong results over peer
    access). The C++/CUDA launchers hold a device guard for the same reason."""
    @functools.wraps(launch)
    def run(*args, **kwargs):
        dev = next((a.device for a in args if isinstance(a, torch.Tensor)), None)
        # the common case (inputs on the current GPU) costs one device query, not a switch and back
        if dev is None or dev.type != "cuda" or dev.index == torch.cuda.current_device():
            return launch(*args, **kwargs)
        with torch.cuda.device(dev):
            return launch(*args, **kwargs)
    return run


def custom_op(name: str) -> Callable[[Callable], Callable]:
    """``torch.library.custom_op(name, mutates_args=())`` that remembers its Python body, for
    :func:`eager_call`. For ops that write none of their arguments."""
    def wrap(fn: Callable):
        op = torch.library.custom_op(name, mutates_args=())(fn)
        op._triforce_body = fn
        return op
    return wrap


def _plain(args) -> bool:
    """Plain eager mode: not compiling, no dispatch / function mode or functorch transform active (the
    tests' host-sync recorder, FakeTensor, vmap), every tensor argument a plain CPU or CUDA tensor that needs
    no gradient."""
    if torch.compiler.is_compiling():
        return False
    try:
        if (torch._C._len_torch_dispatch_stack() or torch._C._is_torch_function_mode_enabled()
                or torch._C._are_functorch_transforms_active()):
            return False
    except AttributeError:  # a torch without these: always dispatch
        return False
    for a in args:
        if isinstance(a, torch.Tensor) and (type(a) is not torch.Tensor or a.requires_grad
                                            or not (a.is_cpu or a.is_cuda)):
            return False
    return True


def eager_call(op, *args):
    """``op(*args)`` for an op made by :func:`custom_op`. In plain eager mode (:func:`_plain`) its body runs
    directly: the same function on the same arguments, without the dispatcher's Python, which cost ~11 us
    a call on a CPU (a small sampler call: 15 us through the op, 3.6 us direct). Compiled graphs, modes and
    autograd still see the custom op."""
    body = getattr(op, "_triforce_body", None)
    return body(*args) if body is not None and _plain(args) else op(*args)


def register_lazy(op: str, backend: str, module: str) -> None:
    """Declare that importing ``module`` registers ``op``'s ``backend`` implementation."""
    _LAZY.setdefault(op, {})[backend] = module


def op_backends(op: str) -> tuple[str, ...]:
    """Backends that implement ``op`` (whether or not they can run here)."""
    names = set(_IMPLS.get(op, {})) | set(_LAZY.get(op, {}))
    return tuple(b for b in BACKENDS if b in names)


def implementation(op: str, backend: str) -> Callable:
    if backend in ("cpu", "cuda"):
        _extension()  # loading the library registers torch.ops.triforce_C.*
    impls = _IMPLS.get(op, {})
    if backend not in impls and backend in _LAZY.get(op, {}):
        importlib.import_module(_LAZY[op][backend])
    try:
        return _IMPLS[op][backend]
    except KeyError:
        raise BackendUnavailableError(f"op {op!r} has no {backend!r} backend") from None


# ----------------------------------------------------------------------------- environment


def _load_extension_file(path: str):
    """Load ``path`` as ``triforce_kernels._C`` (a build outside the package, e.g. the sanitized one
    of scripts/sanitize.sh)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("triforce_kernels._C", path)
    if spec is None or not os.path.isfile(path):
        raise ImportError(f"TRIFORCE_EXT_PATH={path!r} is not an extension module file")
    mod = importlib.util.module_from_spec(spec)  # dlopen + module init: registers torch.ops.triforce_C.*
    sys.modules["triforce_kernels._C"] = mod
    spec.loader.exec_module(mod)
    return mod


@functools.lru_cache(maxsize=None)
def _extension():
    """The compiled extension module, or the reason it cannot be loaded. ``TRIFORCE_EXT_PATH`` names
    a build to load instead of the package's own ``_C``."""
    path = os.environ.get("TRIFORCE_EXT_PATH", "")
    try:
        if path:
            return _load_extension_file(path), ""
        from triforce_kernels import _C  # (importing registers torch.ops.triforce_C.*)
    except ImportError as e:  # not built, or built against another torch
        if path:
            return None, f"C++ extension at TRIFORCE_EXT_PATH not loadable ({e})"
        return None, f"C++ extension not built or not loadable ({e}); run `pip install --no-build-isolation -e .`"
    return _C, ""


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@functools.lru_cache(maxsize=None)
def _triton_import() -> str:
    try:
        import triton  # noqa: F401
    except ImportError as e:
        return f"triton is not installed ({e})"
    return ""


def _constant_to_dynamo(fn):
    """What ``torch.compiler.assume_constant_result(fn)`` does (torch >= 2.0), without importing
    ``torch._dynamo`` when this package is imported (that import costs ~0.5 s and imports Triton;
    tests/test_compile.py checks that the two agree)."""
    fn._dynamo_marked_constant = True
    return fn


# torch.compile calls this while tracing and takes the answer as a constant (it depends on this machine,
# never on tensor values): it does not trace into the lru-cached import probes above.
@_constant_to_dynamo
def backend_status(backend: str, device: torch.device | str | None = None) -> tuple[bool, str]:
    """Whether ``backend`` can run on ``device`` here, and a human-readable reason.

    With ``device=None`` the question is "on the best device this machine has"."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; expected one of {BACKENDS}")
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device).type
    if backend == "reference":
        return True, "PyTorch reference implementations"
    if backend == "triton":
        why = _triton_import()
        if why:
            return False, why
        if dev == "cuda":
            return True, "Triton on the GPU"
        if dev == "cpu" and _interpreting():
            return True, "Triton interpreter on CPU (TRITON_INTERPRET=1; slow, for tests)"
        return False, f"no GPU for Triton on device {dev!r}; set TRITON_INTERPRET=1 to run it in the interpreter"
    mod, why = _extension()
    if backend == "cpu":
        if mod is None:
            return False, why
        if dev != "cpu":
            return False, f"the cpu backend runs on CPU tensors, got device {dev!r}"
        return True, "C++/OpenMP extension"
    # cuda
    if torch.version.cuda is None:
        return False, "torch has no CUDA (CPU-only build)"
    if not torch.cuda.is_available():
        return False, "no CUDA GPU visible"
    if mod is None:
        return False, why
    if not getattr(mod, "WITH_CUDA", False):
        return False, "the C++ extension was built without CUDA (nvcc not found at build time)"
    if dev != "cuda":
        return False, f"the cuda backend runs on CUDA tensors, got device {dev!r}"
    return True, "C++/CUDA extension"


def available_backends(op: str, device: torch.device | str | None = None) -> tuple[str, ...]:
    """Backends of ``op`` that can run on ``device`` here."""
    return tuple(b for b in op_backends(op) if backend_status(b, device)[0])


def resolve(op: str, backend: str | None, device: torch.device) -> str:
    """Pick the backend for one call (see the module docstring for the rules)."""
    if backend is not None:
        return _require(op, backend, device)
    env = os.environ.get("TRIFORCE_BACKEND", "").strip()
    if env:
        if env not in BACKENDS:
            raise ValueError(f"TRIFORCE_BACKEND={env!r} is not a backend; expected one of {BACKENDS}")
        if os.environ.get("TRIFORCE_BACKEND_STRICT", "0") == "1":
            return _require(op, env, device)
        if env in op_backends(op) and backend_status(env, device)[0]:
            return env
    for b in _AUTO_ORDER.get(device.type, ("reference",)):
        if b in op_backends(op) and backend_status(b, device)[0]:
            return b
    return "reference"


def _require(op: str, backend: str, device: torch.device) -> str:
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS} or None, got {backend!r}")
    if backend not in op_backends(op):
        raise BackendUnavailableError(
            f"op {op!r} has no {backend!r} backend; it has {op_backends(op)}"
        )
    ok, why = backend_status(backend, device)
    if not ok:
        raise BackendUnavailableError(f"backend {backend!r} is not available for {op!r}: {why}")
    return backend


def describe() -> str:
    """The text printed by ``python -m triforce_kernels``."""
    import triforce_kernels as tk  # ensure every op is registered

    lines = [f"triforce_kernels {tk.__version__}  (torch {torch.__version__}, "
             f"CUDA {torch.version.cuda or 'none'}, GPU: {torch.cuda.get_device_name() if torch.cuda.is_available() else 'none'})",
             "", "backends:"]
    for b in BACKENDS:
        ok, why = backend_status(b)
        lines.append(f"  {b:<10} {'available' if ok else 'unavailable':<12} {why}")
    lines += ["", "ops (backends implemented; * = runnable here on the default device):"]
    for op in sorted(set(_IMPLS) | set(_LAZY)):
        here = set(available_backends(op))
        lines.append(f"  {op:<26} " + " ".join(b + ("*" if b in here else "") for b in op_backends(op)))
    return "\n".join(lines)
