"""Print the requirements of a requirements file whose package is not installed, one per line.

    python scripts/missing_requirements.py requirements-test.txt

Used by scripts/_env.sh with TRIFORCE_VENV=- (the environment as it is): a package that is installed
counts as present whatever its version, so nothing installed is upgraded or downgraded. `-r` includes
are followed; comments and blank lines are skipped.
"""
import importlib.metadata as md
import os
import re
import sys


def requirements(path):
    with open(path) as f:
        for line in f:
            line = line.split("#")[0].strip()
            if line.startswith("-r"):
                yield from requirements(os.path.join(os.path.dirname(path), line[2:].strip()))
            elif line:
                yield line


def missing(path):
    out = []
    for req in requirements(path):
        name = re.split(r"[<>=!~;\[ ]", req, maxsplit=1)[0]
        try:
            md.version(name)
        except md.PackageNotFoundError:
            out.append(req)
    return out


if __name__ == "__main__":
    print("\n".join(missing(sys.argv[1])))
