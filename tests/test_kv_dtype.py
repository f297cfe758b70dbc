"""A KV cache in another dtype than the model's (``Llama.kv_dtype``, ``--kv-dtype``): the cache holds the keys
and values rounded to its dtype, the attention runs in it (queries rounded, float32 sums) and returns to the
model's dtype; a pass still gives the bits of one-token steps, so every engine stays lossless; the engines,
the hub and the CLI make their caches in it."""
import copy
import os

import pytest
import torch

import triforce
from triforce.engines.decode import cache_dtype
from triforce.models import FullCache, Llama, LlamaConfig, StreamingCache
from triforce.models.hub import set_kv_dtype
from triforce.models.quant import int8_copy

from tests.test_model import assert_long_pass_gives_the_bits_of_steps

F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16


def model_of(dtype=F32, seed=0, **kw):
    """Heads of 64 (the AVX-512 attention paths), GQA 2:1."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(**{**dict(vocab_size=101, hidden_size=256, intermediate_size=128, num_hidden_layers=2,
                                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                                initializer_range=0.2), **kw})
    return Llama(cfg).eval().to(dtype)


def test_kv_dtype_defaults_to_the_model_and_is_validated():
    model = model_of()
    assert model.kv_dtype == F32 and cache_dtype(model) == F32
    model.kv_dtype = BF16
    assert model.kv_dtype == BF16 and cache_dtype(model) == BF16
    assert model.to(F16).kv_dtype == BF16  # a cast of the weights keeps the choice
    model.kv_dtype = None
    assert model.kv_dtype == F16
    for bad in (torch.int8, torch.float64, "bfloat16"):
        with pytest.raises(TypeError, match="kv_dtype"):
            model.kv_dtype = bad
    assert set_kv_dtype(model, "bfloat16").kv_dtype == BF16 and set_kv_dtype(model, None).kv_dtype == F16
    with pytest.raises(ValueError, match="kv_dtype: expected one of float32, bfloat16, float16"):
        set_kv_dtype(model, "int8")


def test_copies_keep_the_kv_dtype():
    model = model_of()
    model.kv_dtype = F16
    for copy_ in (int8_copy(model), model.layer_skip(1), copy.deepcopy(model)):
        assert copy_.kv_dtype == F16


def test_cache_rows_are_the_rounded_rows_and_attention_runs_in_the_cache_dtype():
    """Layer 0's keys and values (before any attention) are the float32 cache's rounded to the cache's dtype;
    the logits are close to the float32 cache's, and differ (the attention really ran on rounded operands)."""
    model = model_of()
    prompt = torch.randint(0, 101, (2, 40))
    with torch.no_grad():
        ref_cache = FullCache(model.config, 2, 48)
        ref = model.prefill(prompt, ref_cache)
        for kv in (BF16, F16):
            cache = FullCache(model.config, 2, 48, dtype=kv)
            out = model.prefill(prompt, cache)
            assert out.dtype == F32 and cache.k[0].dtype == kv
            assert torch.equal(cache.k[0][:, :40], ref_cache.k[0][:, :40].to(kv))
            assert torch.equal(cache.v[0][:, :40], ref_cache.v[0][:, :40].to(kv))
            err = (out - ref).abs().max().item()
            # bfloat16 keeps 8 significant bits, float16 11: measured 1.8e-2 and 2.8e-3 of the largest logit
            assert 0 < err <= {BF16: 4e-2, F16: 6e-3}[kv] * ref.abs().max().item(), (kv, err)
            assert cache.memory_bytes() < ref_cache.memory_bytes() * 0.51


@pytest.mark.parametrize("dtype,kv", [(F32, BF16), (F32, F16), (BF16, F32), (BF16, F16)],
                         ids=["f32-bf16", "f32-f16", "bf16-f32", "bf16-f16"])
def test_a_pass_gives_the_bits_of_one_token_steps(dtype, kv):
    """What makes the engines lossless holds with the cache in another dtype: the logits of a pass of T tokens
    (causal, and a tree) are bitwise those of one-token steps. The prompt crosses the attention's 512-key
    parts."""
    assert_long_pass_gives_the_bits_of_steps(model_of(dtype), kv)


CASES = [
    ("speculative", {"gamma": 3}),
    ("speculative", {"gamma": 2, "draft": "int8"}),
    ("magicdec", {"gamma": 4, "sink": 1, "window": 8}),
    ("magicdec", {"gamma": 2, "draft_cache": "retrieval", "budget": 12, "chunk_size": 4}),
    ("magicdec", {"gamma": 2, "draft_cache": "retrieval", "budget": 12, "chunk_size": 4, "draft": "int8"}),
    ("triforce", {"gamma1": 2, "gamma2": 5, "budget": 12, "chunk_size": 4, "sink": 1, "window": 12}),
    ("tree", {"tree": (2, 2, 1), "sink": 1, "window": 16}),
]


@pytest.mark.parametrize("kv", [BF16, F16], ids=["bf16", "f16"])
@pytest.mark.parametrize("method,opts", CASES, ids=[f"{m}-{i}" for i, (m, _) in enumerate(CASES)])
def test_greedy_equals_autoregressive(method, opts, kv, monkeypatch):
    """Every method's greedy tokens equal autoregressive decoding's with the same cache dtype, ragged prompts;
    every cache the engine makes (full, StreamingLLM, retrieval, the draft's) is in the model's ``kv_dtype``."""
    target = model_of(hidden_size=128, num_attention_heads=2, num_key_value_heads=1)
    target.kv_dtype = kv
    opts = dict(opts)
    if opts.get("draft") == "int8":
        opts["draft"] = int8_copy(target)
    made = []
    for cls in (FullCache, StreamingCache):
        real = cls.__init__

        def spy(self, *a, real=real, **k):
            real(self, *a, **k)
            made.append(self.dtype)
        monkeypatch.setattr(cls, "__init__", spy)
    g = torch.Generator().manual_seed(4)
    prompts = [torch.randint(0, 101, (n,), generator=g) for n in (17, 45, 23)]
    ref = triforce.generate(target, prompts, method="autoregressive", max_new_tokens=30)
    out = triforce.generate(target, prompts, method=method, max_new_tokens=30, **opts)
    for b in range(len(prompts)):
        assert torch.equal(out.tokens[b], ref.tokens[b]), (b, out.tokens[b], ref.tokens[b])
    assert out.stats["mean_accepted"] > 1.0
    assert len(made) >= 2 and set(made) == {kv}


def test_streaming_cache_in_another_dtype_equals_a_fresh_prefill():
    """A StreamingLLM cache in bfloat16 under a float32 model, loaded from a bfloat16 full cache (the drafts'
    fill_from) or prefilled itself: the same logits for the next tokens, as with the model's own dtype."""
    model = model_of()
    prompt = torch.randint(0, 101, (2, 60))
    toks = torch.randint(0, 101, (2, 3))
    with torch.no_grad():
        full = FullCache(model.config, 2, 80, dtype=BF16)
        model.prefill(prompt, full)
        loaded = StreamingCache(model.config, 2, sink=4, window=16, max_step=4, dtype=BF16)
        loaded.fill_from(full, full.lengths)
        fresh = StreamingCache(model.config, 2, sink=4, window=16, max_step=4, dtype=BF16)
        model.prefill(prompt, fresh)
        a, b = model(toks, cache=loaded), model(toks, cache=fresh)
    assert loaded.k[0].dtype == BF16 and a.dtype == F32
    # the two caches' re-rotated keys round alike up to bfloat16's last place
    assert (a - b).abs().max().item() <= 5e-2 * b.abs().max().item()


def _cpu_has(flag: str) -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            return any(flag in line.split() for line in f if line.startswith("flags"))
    except OSError:
        return False


@pytest.mark.skipif(not _cpu_has("amx_bf16") or os.environ.get("TRIFORCE_PORTABLE") == "1",
                    reason="needs a CPU with AMX-BF16 and a -march=native build (the tiles' path replaces the other)")
def test_the_vdpbf16ps_path_where_the_tiles_serve():
    """On a CPU with AMX the bf16 caches take the tiles (csrc/include/triforce/verify_attention.h,
    attend_range_amx); ``TRIFORCE_AMX=0`` keeps the vdpbf16ps path that CPUs without AMX take (AMD's
    AVX512_BF16 ones). That path too, in a process of its own: a pass gives the bits of one-token steps, every
    method stays lossless on bfloat16 caches; and the two paths' outputs differ in rounding only."""
    import subprocess
    import sys

    env = {**os.environ, "TRIFORCE_AMX": "0"}
    tests = ["tests/test_model.py::test_a_pass_gives_the_bits_of_one_token_steps[dtype1]",  # bfloat16
             "tests/test_kv_dtype.py::test_a_pass_gives_the_bits_of_one_token_steps[f32-bf16]",
             "tests/test_kv_dtype.py::test_greedy_equals_autoregressive"]
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "bf16 or dtype1", *tests],
                       env=env, capture_output=True, text=True, cwd=os.path.dirname(os.path.dirname(__file__)))
    assert r.returncode == 0 and "9 passed" in r.stdout, r.stdout[-3000:] + r.stderr[-3000:]
    script = ("import torch, triforce_kernels as tk, sys\n"
              "torch.manual_seed(0)\n"
              "q = torch.randn(2, 5, 8, 64).bfloat16(); k = torch.randn(2, 700, 2, 64).bfloat16()\n"
              "v = torch.randn(2, 700, 2, 64).bfloat16(); lens = torch.tensor([700, 650], dtype=torch.int32)\n"
              "o, lse = tk.verify_attention(q, k, v, lens, backend='cpu', return_lse=True)\n"
              "torch.save((o, lse), sys.argv[1])\n")
    outs = []
    for amx in ("1", "0"):
        path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"triforce-amx-{amx}-{os.getpid()}.pt")
        subprocess.run([sys.executable, "-c", script, path], env={**os.environ, "TRIFORCE_AMX": amx}, check=True)
        outs.append(torch.load(path))
        os.remove(path)
    (o1, l1), (o0, l0) = outs
    assert not torch.equal(l1, l0)  # the tiles really served the first process
    assert (o1.float() - o0.float()).abs().max() <= 8e-3 and (l1 - l0).abs().max() <= 1e-5
