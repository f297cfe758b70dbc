"""``python -m triforce_kernels``: which backends run here, and why not.

``python -m triforce_kernels compile-check [--gpu h100] [--quick] [--match REGEX] [--dump DIR]``:
compile every Triton kernel for a GPU this machine need not have, at the launch plans of the op
shapes the GPU benchmarks use and at their boundaries, and report registers, spills, shared memory,
occupancy and tensor-core use per kernel; exit status 1 if anything would fail on that GPU
(``triforce_kernels.triton.aot``)."""
import argparse
import os
import sys


def _compile_check(argv):
    p = argparse.ArgumentParser(prog="python -m triforce_kernels compile-check",
                                description="Compile every Triton kernel for a GPU (no GPU needed; nothing runs).")
    p.add_argument("--gpu", default="h100", choices=["h100", "h200"])
    p.add_argument("--quick", action="store_true", help="fewer shapes and dtypes (the CI subset)")
    p.add_argument("--match", default="", help="only the cases whose name matches this regular expression")
    p.add_argument("--dump", default=None, help="copy the compiled PTX/cubin/TTGIR into this directory")
    p.add_argument("--json", default=None, help="write the launches and errors as JSON to this file")
    p.add_argument("--verbose", action="store_true", help="print each case as it compiles")
    a = p.parse_args(argv)
    if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET", "0") == "1":
        raise SystemExit("compile-check: Triton was imported in interpreter mode; run with TRITON_INTERPRET=0")
    os.environ["TRITON_INTERPRET"] = "0"  # Triton is not imported yet: its kernels will compile
    import dataclasses
    import json

    from triforce_kernels.triton import aot

    gpu = aot.GPUS[a.gpu]
    launches, errors = aot.check(gpu, quick=a.quick, match=a.match, dump=a.dump,
                                 progress=(lambda n: print(n, file=sys.stderr, flush=True)) if a.verbose else None)
    text, problems = aot.report(gpu, launches, errors)
    print(text)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"gpu": dataclasses.asdict(gpu), "launches": [dataclasses.asdict(x) for x in launches],
                       "errors": [dataclasses.asdict(e) for e in errors],
                       "kernels": aot.kernel_table(gpu, launches)}, f, indent=1)
    return 1 if problems else 0


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["compile-check"]:
        return _compile_check(argv[1:])
    if argv:
        raise SystemExit(f"unknown command {argv[0]!r}; expected nothing or 'compile-check'")
    from triforce_kernels._backend import describe

    print(describe())
    return 0


if __name__ == "__main__":
    sys.exit(main())
