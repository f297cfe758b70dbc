"""Fast start: loading builds the model without drawing random weights (and without importing
torch._dynamo), the GGUF conversion cache is keyed by content, shared, bounded and safe to write in any
order with the tokenizer; and the CPU thread settings applied by ``import triforce``."""
import json
import os
import shutil
import subprocess
import sys
import time

import pytest
import torch

from triforce import _threads
from triforce.models import Llama
from triforce.models.loading import evict_cache, gguf_cache_path, publish
from triforce.models.rope import rope_inv_freq

from .test_config import write_gguf
from .test_model import tiny_config, tiny_model


def test_empty_llama_draws_nothing_and_loading_sets_every_tensor(tmp_path):
    config = tiny_config(rope_scaling={"rope_type": "linear", "factor": 2.0})
    rng = torch.get_rng_state()
    empty = Llama(config, _empty=True)
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(t.is_meta for t in [*empty.parameters(), *empty.buffers()])

    model = tiny_model(rope_scaling={"rope_type": "linear", "factor": 2.0})
    model.save_pretrained(tmp_path)
    rng = torch.get_rng_state()
    loaded = Llama.from_pretrained(tmp_path)
    assert torch.equal(torch.get_rng_state(), rng)
    assert not any(t.is_meta for t in [*loaded.parameters(), *loaded.buffers()])
    assert torch.equal(loaded.inv_freq, rope_inv_freq(config))
    ids = torch.randint(0, 101, (2, 9))
    assert torch.equal(loaded(ids), model(ids))


def test_random_init_is_unchanged():
    # Llama(config) still draws from torch's RNG and skips nothing (the empty path is opt-in).
    torch.manual_seed(3)
    a = Llama(tiny_config())
    torch.manual_seed(3)
    b = Llama(tiny_config())
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert a.model.embed_tokens.weight.std().item() == pytest.approx(a.config.initializer_range, rel=0.1)


def test_cache_key_is_the_content(tmp_path):
    cache = tmp_path / "cache"
    a = write_gguf(tmp_path / "a.gguf", tiny_model())
    (tmp_path / "venv2").mkdir()
    b = tmp_path / "venv2" / "renamed.gguf"
    shutil.copy(a, b)  # another virtualenv's copy of the same file: the same entry
    assert gguf_cache_path(a, cache) == gguf_cache_path(b, cache)
    assert gguf_cache_path(a, cache).name.startswith("gguf-")
    assert len(list((cache / "sha256").iterdir())) == 2  # one remembered hash per file
    # Same size, same mtime, other bytes: the ctime in the memo key catches the rewrite.
    st = b.stat()
    time.sleep(0.05)  # file timestamps tick every few ms: the rewrite gets a later ctime
    data = bytearray(b.read_bytes())
    data[-1] ^= 1
    b.write_bytes(bytes(data))
    os.utime(b, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert gguf_cache_path(b, cache) != gguf_cache_path(a, cache)
    assert gguf_cache_path(a, tmp_path / "other").name == gguf_cache_path(a, cache).name


def test_weights_and_tokenizer_share_the_entry_in_either_order(tmp_path):
    model = tiny_model()
    path = write_gguf(tmp_path / "m.gguf", model)
    ids = torch.randint(0, 101, (1, 7))

    def tokenizer_files(d):
        (d / "tokenizer.json").write_text("{}")
        (d / "tokenizer_meta.json").write_text(json.dumps({"eos_token_id": 2}))

    tok_first = tmp_path / "c1"
    entry = gguf_cache_path(path, tok_first)
    publish(entry, tokenizer_files, last="tokenizer_meta.json")
    assert torch.equal(Llama.from_pretrained(path, cache_dir=tok_first)(ids), model(ids))
    assert sorted(f.name for f in entry.iterdir()) == [
        "config.json", "model.safetensors", "tokenizer.json", "tokenizer_meta.json"]

    weights_first = tmp_path / "c2"
    Llama.from_pretrained(path, cache_dir=weights_first)
    entry = gguf_cache_path(path, weights_first)
    publish(entry, tokenizer_files, last="tokenizer_meta.json")
    assert (entry / "model.safetensors").exists() and (entry / "tokenizer.json").exists()
    assert torch.equal(Llama.from_pretrained(path, cache_dir=weights_first)(ids), model(ids))
    assert not [d for d in weights_first.iterdir() if ".tmp" in d.name]  # no temporary left behind


def test_cache_is_bounded_least_recently_used_first(tmp_path, monkeypatch):
    root = tmp_path / "cache"

    def entry(name, mb, age_s, files=("config.json", "model.safetensors")):
        d = root / name
        d.mkdir(parents=True)
        for f in files:
            (d / f).write_bytes(b"\0" * int(mb * 1e6 / len(files)))
        t = time.time() - age_s
        os.utime(d, (t, t))
        return d

    old = entry("SmolLM2-135M-Instruct.Q4_1-c752e8061d4b435f", 1, 400)  # the earlier path+mtime key
    a = entry("gguf-" + "a" * 32 + "-v2", 1, 300)
    b = entry("gguf-" + "b" * 32 + "-v2", 1, 200)
    keep = entry("gguf-" + "c" * 32 + "-v2", 3, 500)  # just written, oldest mtime on purpose: still kept
    stranger = entry("photos-0123456789abcdef", 5, 900, files=("cat.jpg",))  # not an entry: never touched
    stale_tmp = entry("gguf-" + "d" * 32 + "-v2.tmpx1", 1, 7200)
    fresh_tmp = entry("gguf-" + "e" * 32 + "-v2.tmpx2", 1, 10)  # another process is writing it
    monkeypatch.setenv("TRIFORCE_CACHE_MAX_GB", "0.0045")
    evict_cache(keep)
    assert [d.exists() for d in (old, a, b, keep, stranger, stale_tmp, fresh_tmp)] == [
        False, False, True, True, True, False, True]
    monkeypatch.setenv("TRIFORCE_CACHE_MAX_GB", "0")
    evict_cache(keep)
    assert keep.exists() and not b.exists() and stranger.exists()
    monkeypatch.setenv("TRIFORCE_CACHE_MAX_GB", "lots")
    with pytest.raises(ValueError, match="TRIFORCE_CACHE_MAX_GB"):
        evict_cache(keep)


def test_thread_count(monkeypatch):
    monkeypatch.delenv("TRIFORCE_NUM_THREADS", raising=False)
    cpus = _threads.available_cpus()
    assert _threads.num_threads(64 * cpus) == cpus and _threads.num_threads(1) == 1
    monkeypatch.setenv("TRIFORCE_NUM_THREADS", "3")
    assert _threads.num_threads(1) == 3
    for bad in ("0", "-1", "two"):
        monkeypatch.setenv("TRIFORCE_NUM_THREADS", bad)
        with pytest.raises(ValueError, match="TRIFORCE_NUM_THREADS"):
            _threads.num_threads(1)


def test_import_applies_threads_and_loading_imports_no_dynamo(tmp_path):
    tiny_model().save_pretrained(tmp_path)
    code = ("import os, sys, torch, triforce\n"
            "from triforce.models import Llama\n"
            f"Llama.from_pretrained({str(tmp_path)!r})\n"
            "print(torch.get_num_threads(), os.environ['OMP_WAIT_POLICY'], 'torch._dynamo' in sys.modules)\n")
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    out = subprocess.run([sys.executable, "-c", code], env={**env, "TRIFORCE_NUM_THREADS": "1"},
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == ["1", "PASSIVE", "False"]


def test_a_damaged_cache_entry_is_converted_again(tmp_path):
    model = tiny_model()
    path = write_gguf(tmp_path / "m.gguf", model)
    cache, ids = tmp_path / "c", torch.randint(0, 101, (1, 7))
    Llama.from_pretrained(path, cache_dir=cache)
    entry = gguf_cache_path(path, cache)
    damages = {
        "truncated weights": lambda: (entry / "model.safetensors").write_bytes(
            (entry / "model.safetensors").read_bytes()[:100]),
        "empty weights": lambda: (entry / "model.safetensors").write_bytes(b""),
        "no config": lambda: (entry / "config.json").unlink(),
        "bad config": lambda: (entry / "config.json").write_text("{"),
    }
    for name, damage in damages.items():
        damage()
        with pytest.warns(UserWarning, match="converting the GGUF again"):
            loaded = Llama.from_pretrained(path, cache_dir=cache)
        assert torch.equal(loaded(ids), model(ids)), name
        assert torch.equal(Llama.from_pretrained(path, cache_dir=cache)(ids), model(ids)), name  # mended


def test_cache_limit_is_checked_before_converting(tmp_path, monkeypatch):
    path = write_gguf(tmp_path / "m.gguf", tiny_model())
    for bad in ("abc", "-1", "nan"):
        monkeypatch.setenv("TRIFORCE_CACHE_MAX_GB", bad)
        with pytest.raises(ValueError, match="TRIFORCE_CACHE_MAX_GB"):
            Llama.from_pretrained(path, cache_dir=tmp_path / "c")
        assert not gguf_cache_path(path, tmp_path / "c").exists()  # nothing written, so no later "success"
    monkeypatch.setenv("TRIFORCE_CACHE_MAX_GB", "inf")  # no limit
    Llama.from_pretrained(path, cache_dir=tmp_path / "c")
    assert (gguf_cache_path(path, tmp_path / "c") / "model.safetensors").exists()
