"""``python -m triforce_kernels``: which backends run here, and why not.

``python -m triforce_kernels compile-check [--gpu h100|h200|b200] [--quick] [--match REGEX] [--dump DIR]
[--triton VERSION]``:
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
    p.add_argument("--gpu", default="h100", choices=["h100", "h200", "b200"])
    p.add_argument("--quick", action="store_true", help="fewer shapes and dtypes (the CI subset)")
    p.add_argument("--match", default="", help="only the cases whose name matches this regular expression")
    p.add_argument("--dump", default=None, help="copy the compiled PTX/cubin/TTGIR into this directory")
    p.add_argument("--json", default=None, help="write the launches and errors as JSON to this file")
    p.add_argument("--verbose", action="store_true", help="print each case as it compiles")
    p.add_argument("--triton", default=None, metavar="VERSION",
                   help="compile with this Triton release instead of the installed one (e.g. 3.6.0, what "
                        "torch 2.11 pins); installed once with pip into the triforce cache, never into this "
                        "environment")
    a = p.parse_args(argv)
    if a.triton:
        return _with_triton(a.triton, [x for i, x in enumerate(argv) if not _is_triton_arg(argv, i)])
    if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET", "0") == "1":
        raise SystemExit("compile-check: Triton was imported in interpreter mode; run with TRITON_INTERPRET=0")
    os.environ["TRITON_INTERPRET"] = "0"  # Triton is not imported yet: its kernels will compile
    import dataclasses
    import json

    import triton

    from triforce_kernels.triton import aot

    want = os.environ.get("TRIFORCE_EXPECT_TRITON")
    if want and triton.__version__ != want:
        raise SystemExit(f"compile-check: asked for triton {want}, but {triton.__file__} is {triton.__version__}")
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


def _is_triton_arg(argv, i):
    return argv[i].startswith("--triton") or (i > 0 and argv[i - 1] == "--triton")


def _with_triton(version, argv):
    """Re-run compile-check in a child whose ``import triton`` finds ``version`` (a pip --target folder
    under ``$TRIFORCE_CACHE_DIR``, else ``$XDG_CACHE_HOME/triforce``, else ``~/.cache/triforce``)."""
    import shutil
    import subprocess
    import tempfile
    from pathlib import Path

    root = Path(os.environ.get("TRIFORCE_CACHE_DIR") or
                Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "triforce")
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    target = root / "triton" / f"{version}-{tag}"
    if not (target / "triton" / "__init__.py").exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".install-"))
        print(f"compile-check: installing triton=={version} into {target}", file=sys.stderr, flush=True)
        r = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(tmp),
                            f"triton=={version}"])
        if r.returncode != 0:
            shutil.rmtree(tmp, ignore_errors=True)
            raise SystemExit(f"compile-check: could not install triton=={version} (pip exit status {r.returncode})")
        try:
            tmp.rename(target)
        except OSError:  # another process installed it meanwhile
            shutil.rmtree(tmp, ignore_errors=True)
    env = dict(os.environ, TRITON_INTERPRET="0", TRIFORCE_EXPECT_TRITON=version,
               PYTHONPATH=os.pathsep.join([str(target)] + [x for x in [os.environ.get("PYTHONPATH")] if x]))
    return subprocess.run([sys.executable, "-m", "triforce_kernels", "compile-check", *argv], env=env).returncode


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
