"""Does a failed argument check in the C++ extension raise, or crash the process? One subprocess per op.

    python scripts/cpp_error_paths.py [--backtrace]

Each case calls an op of ``torch.ops.triforce_C`` with arguments its C++ check refuses, in a fresh Python:
``raised`` (a RuntimeError, as it must) or ``FAILED`` (the process died, e.g. a segmentation fault, or\nnothing was raised).
With ``--backtrace``, a failed case is run again under ``cuda-gdb`` (or ``gdb``) in batch mode to print
the native stack. Exit status 1 if any case failed. Written after the GPU machine's torch 2.11 build
crashed in tests/test_decoder.py::test_op_checks (the decoder ops' checks) where torch 2.13 raises.
"""
from __future__ import annotations

import shutil
import subprocess
import sys

CASES = {
    # torch's own C++ check: if this one crashes too, the process's unwinder is at fault, not this build
    "torch.mm (ATen's check, no triforce code)":
        "torch.mm(torch.zeros(2, 3), torch.zeros(4, 5))",
    "rowwise_linear (Tensor args only)":
        "ops.rowwise_linear(torch.randn(2, 3), torch.randn(4, 5))",
    "decoder_attn_out_mlp (Tensor?[] args)":
        "ops.decoder_attn_out_mlp(torch.zeros(1, 1, 8), torch.zeros(1, 1, 2, 4), torch.ones(8), 1e-5,"
        " [torch.zeros(8, 8)], [None], [None])",
    "decoder_attn_in (Tensor?[] args, head_dim check)":
        "ops.decoder_attn_in(torch.zeros(1, 1, 8), torch.ones(8), 1e-5, [torch.zeros(8, 8)] * 3, [None] * 3,"
        " [None] * 3, None, None, 0.0, torch.zeros(1, 1, 1, 3), torch.zeros(1, 1, 1, 3), 3)",
    "mla_qk (layout check)":
        "ops.mla_qk(torch.zeros(1, 1, 2, 8), torch.zeros(1, 1, 2, 6), torch.zeros(1, 1, 10), torch.ones(6), 1e-6,"
        " torch.zeros(1, 1, 1, 10), torch.zeros(1, 1, 1, 10), torch.arange(9), False)",
    "index_scores (shape check)":
        "ops.index_scores(torch.zeros(2, 3, 8), torch.zeros(5, 4), torch.zeros(2, 3), 0.5)",
    "verify_attention (Tensor? arg)":
        "ops.verify_attention(torch.zeros(1, 2, 3, 4), torch.zeros(1, 3, 2, 4), torch.zeros(1, 3, 2, 4),"
        " torch.tensor([3], dtype=torch.int32), None, 1.0, 0)",
}

PROLOGUE = (
    "import torch\n"
    "from triforce_kernels._backend import _extension\n"
    "mod, why = _extension()\n"
    "assert mod is not None, why\n"
    "ops = torch.ops.triforce_C\n"
)


def script(call: str) -> str:
    return PROLOGUE + f"try:\n    {call}\nexcept RuntimeError as e:\n    print('raised:', str(e).splitlines()[0][:160])\n"


def main() -> int:
    backtrace = "--backtrace" in sys.argv[1:]
    crashed = 0
    for name, call in CASES.items():
        r = subprocess.run([sys.executable, "-c", script(call)], capture_output=True, text=True)
        ok = r.returncode == 0 and "raised:" in r.stdout
        print(f"{name:50s} {'raised' if ok else f'FAILED (rc {r.returncode}, no RuntimeError)'}  {r.stdout.strip()[-160:]}")
        if not ok:
            crashed += 1
            print(r.stderr[-2000:])
            gdb = shutil.which("cuda-gdb") or shutil.which("gdb")
            if backtrace and gdb:
                g = subprocess.run([gdb, "-batch", "-ex", "run", "-ex", "bt 40", "--args", sys.executable, "-c",
                                    script(call)], capture_output=True, text=True)
                print(g.stdout[-8000:], g.stderr[-2000:])
    return 1 if crashed else 0


if __name__ == "__main__":
    sys.exit(main())
