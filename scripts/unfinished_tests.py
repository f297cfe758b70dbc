"""Print the ids of the tests that a cut-off pytest run did not finish, one per line.

    python scripts/unfinished_tests.py LOG... [-- PYTEST_COLLECT_ARGS...]

Collects the suite (``pytest --collect-only -q``, with the arguments after ``--``, default ``tests``) and
prints each collected id that no LOG reports an outcome for. The LOGs are pytest ``-v`` output, with or
without pytest-xdist (``[gw3] [ 12%] PASSED tests/a.py::t[x]`` or ``tests/a.py::t[x] PASSED [ 12%]``).
scripts/gpu_check.sh's ``rest`` stage runs these after a ``tests`` stage stopped by its time limit.
"""
import re
import subprocess
import sys

OUTCOME = r"(?:PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)"
# an id can hold spaces (parameter ids): xdist's form ends the line with it, the plain form ends it at the outcome
FINISHED = re.compile(rf"\] {OUTCOME} (tests/.*\S)\s*$|^(tests/.+?) {OUTCOME}(?: |$)")


def finished(paths):
    done = set()
    for path in paths:
        try:
            text = open(path, errors="replace").read()
        except FileNotFoundError:
            continue
        for line in text.splitlines():
            m = FINISHED.search(line)
            if m:
                done.add(m.group(1) or m.group(2))
    return done


def main(argv):
    logs, collect = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, ["tests"])
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *collect],
                         capture_output=True, text=True)
    ids = [line.strip() for line in out.stdout.splitlines() if "::" in line and not line.startswith(" ")]
    if out.returncode != 0 or not ids:
        sys.stderr.write(out.stdout[-3000:] + out.stderr[-3000:])
        return 1
    done = finished(logs)
    left = [i for i in ids if i not in done]
    for i in left:
        print(i)
    sys.stderr.write(f"{len(ids)} collected, {len(ids) - len(left)} finished in the logs, {len(left)} left\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
