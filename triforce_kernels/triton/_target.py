"""What the Triton launchers plan for: the device they launch on, or a GPU they are compiled for.

The launchers size their blocks and splits from two facts: whether Triton runs in its interpreter,
and how many SMs the GPU has. Both come from here, so that ``triforce_kernels.triton.aot`` can make
the launchers plan for a GPU that this machine does not have (compile only, nothing runs)."""
from __future__ import annotations

import contextlib
import functools

import torch

from .. import _backend

_FORCED_SM_COUNT: int | None = None  # set while compiling for an absent GPU


def interpreting() -> bool:
    """Whether the launchers plan for the Triton interpreter (never inside :func:`plan_for`)."""
    return _FORCED_SM_COUNT is None and _backend._interpreting()


@functools.lru_cache(maxsize=None)
def _cuda_sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def sm_count(device: torch.device) -> int | None:
    """SMs of the GPU the launch is planned for; None in the interpreter."""
    if _FORCED_SM_COUNT is not None:
        return _FORCED_SM_COUNT
    if device.type == "cuda":
        return _cuda_sm_count(device.index if device.index is not None else torch.cuda.current_device())
    return None


@contextlib.contextmanager
def plan_for(sms: int):
    """Launchers plan as for a GPU with ``sms`` SMs (and never as for the interpreter) inside this
    block, whatever runs the kernels: the compile-only driver, or the interpreter (a test of the GPU
    plan's semantics; its bf16 path needs a GPU, since the interpreter's bf16 dot is wrong)."""
    global _FORCED_SM_COUNT
    previous, _FORCED_SM_COUNT = _FORCED_SM_COUNT, sms
    try:
        yield
    finally:
        _FORCED_SM_COUNT = previous
