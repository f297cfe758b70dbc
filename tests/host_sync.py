"""Find, on a CPU, the operations that would synchronise the host with a GPU.

On CUDA tensors these block the host until the device has caught up (and cannot be captured in a CUDA
graph): a read of a value (``.item()``, ``.tolist()``, ``bool(t)``, ``int(t)``, ...), an upload of
host data (``torch.tensor(list, device=cuda)``, ``torch.as_tensor(3, device=cuda)``: a pageable copy
followed by a stream sync), and the ops whose output size or checks depend on the values
(``nonzero``, boolean-mask indexing, ``torch.multinomial``'s input checks, ``fill_`` from a tensor,
...). On a CPU none of them costs anything, so they go unnoticed there; :class:`HostSyncs` records
each of them, with the innermost project frame that caused it, while running CPU code."""
from __future__ import annotations

import collections
import os
import sys

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_PROJECT = tuple(os.path.join(_ROOT, d) + os.sep for d in ("triforce", "triforce_kernels"))

# Python-level reads of a tensor's values (a device-to-host copy on a GPU).
_READS = {"item", "tolist", "__bool__", "__int__", "__float__", "__index__", "__complex__", "numpy", "cpu"}

_aten = torch.ops.aten
# Aten ops that synchronise on CUDA whatever their arguments.
_SYNC_OPS = {
    _aten.lift_fresh.default: "upload", _aten.lift_fresh_copy.default: "upload",
    _aten.nonzero.default: "nonzero", _aten.masked_select.default: "masked_select",
    _aten.repeat_interleave.Tensor: "repeat_interleave", _aten.bincount.default: "bincount",
    _aten._unique2.default: "unique", _aten.unique_consecutive.default: "unique", _aten.unique_dim.default: "unique",
    _aten.multinomial.default: "multinomial", _aten.equal.default: "equal", _aten.allclose.default: "allclose",
    _aten.fill_.Tensor: "fill_ from a tensor", _aten.masked_fill_.Tensor: "masked_fill from a tensor",
    _aten.masked_fill.Tensor: "masked_fill from a tensor", _aten.index_fill_.int_Tensor: "index_fill from a tensor",
    _aten._local_scalar_dense.default: "read", _aten.is_nonzero.default: "read", _aten.item.default: "read",
}
_INDEX_OPS = {_aten.index.Tensor, _aten.index_put_.default, _aten.index_put.default, _aten._index_put_impl_.default}


def _site() -> str:
    """``path:line (qualified function name)`` of the innermost frame in the project's packages."""
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code.co_filename.startswith(_PROJECT):
            name = getattr(code, "co_qualname", code.co_name)  # Python >= 3.11: Class.method
            return f"{os.path.relpath(code.co_filename, _ROOT)}:{frame.f_lineno} ({name})"
        frame = frame.f_back
    return "<outside the project> (-)"


class HostSyncs:
    """Context manager recording every would-be host synchronisation: ``events`` is a list of
    ``(kind, site)``; :meth:`by_function` counts them per project function. Recording can be paused
    (``paused()``) around code whose syncs are not under test."""

    def __init__(self):
        self.events: list[tuple[str, str]] = []
        self._on = True
        syncs = self

        class _Functions(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                name = getattr(func, "__name__", "")
                if name in _READS and syncs._on:
                    syncs._record(f"read ({name})")
                    syncs._on = False  # the same read seen again at the aten level is not a second one
                    try:
                        return func(*args, **(kwargs or {}))
                    finally:
                        syncs._on = True
                return func(*args, **(kwargs or {}))

        class _Ops(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                if syncs._on:
                    kind = _SYNC_OPS.get(func)
                    if kind is None and func in _INDEX_OPS:
                        indices = args[1]
                        if any(i is not None and i.dtype in (torch.bool, torch.uint8) for i in indices):
                            kind = "boolean-mask indexing"
                    if kind is not None:
                        syncs._record(kind)
                return func(*args, **(kwargs or {}))

        self._modes = (_Functions(), _Ops())

    def _record(self, kind: str) -> None:
        self.events.append((kind, _site()))

    def __enter__(self):
        for m in self._modes:
            m.__enter__()
        return self

    def __exit__(self, *exc):
        for m in reversed(self._modes):
            m.__exit__(*exc)

    def paused(self):
        syncs = self

        class _Pause:
            def __enter__(self):
                self.was, syncs._on = syncs._on, False

            def __exit__(self, *exc):
                syncs._on = self.was

        return _Pause()

    def by_function(self) -> collections.Counter:
        """Events per ``function`` name of their site."""
        return collections.Counter(site.rsplit("(", 1)[-1].rstrip(")") for _, site in self.events)

    def report(self) -> str:
        return "\n".join(f"{n:5d}  {kind:24s} {site}"
                         for (kind, site), n in collections.Counter(self.events).most_common())
