"""Run every benchmark on this machine (CPU, and CUDA when present), append to bench/results.csv,
then render docs/benchmarks.md.

    python -m bench.run_all [--quick]
"""
import argparse
import glob
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="pass --quick to each benchmark (smaller shapes)")
    p.add_argument("--only", default="", help="comma-separated benchmark names, e.g. retrieval,verify_attention")
    a = p.parse_args()
    names = sorted(os.path.basename(f)[len("bench_"):-3] for f in glob.glob(os.path.join(ROOT, "bench", "bench_*.py")))
    if a.only:
        names = [n for n in names if n in a.only.split(",")]
    failed = []
    for n in names:
        print(f"== bench_{n}", flush=True)
        cmd = [sys.executable, "-m", f"bench.bench_{n}"] + (["--quick"] if a.quick else [])
        if subprocess.run(cmd, cwd=ROOT).returncode != 0:
            failed.append(n)
    subprocess.run([sys.executable, "-m", "bench.report"], cwd=ROOT, check=True)
    if failed:
        sys.exit(f"benchmarks failed: {failed}")


if __name__ == "__main__":
    main()
