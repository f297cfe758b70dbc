"""The embedded SmolLM2-135M: logits parity with transformers' LlamaForCausalLM loaded from the same GGUF
(prefill at several prompt lengths and token-by-token decode), the GGUF tokenizer, and the load cache.

Both models are loaded once per session (transformers' GGUF load takes ~20 s; ours ~10 s the first time,
well under a second from the cache)."""
import os
import time

import pytest
import torch

from triforce.models import FullCache, smollm2_135m
from triforce.models.smollm2 import GGUF_NAME, smollm2_gguf_path

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.slow

# Measured on this GGUF in fp32 (CPU), logits up to |36|: our plain forward vs transformers' is bit-identical
# for T > 1 and differs by 1.7e-5 for T = 1; through the KV cache (chunked prefill, verify attention: sums
# in another order) the max |diff| was 3.8e-5 (prefill, 1..600 tokens) and 6.3e-5 (20 decode steps), i.e.
# ~2e-6 relative, what fp32 reordering over 30 layers explains. We allow 3e-4 (~5x the worst measured);
# a RoPE / Q-K permutation / norm / mask bug moves logits by > 1e-1.
TOL = 3e-4


@pytest.fixture(scope="session")
def ours():
    model, tok = smollm2_135m()
    return model, tok


@pytest.fixture(scope="session")
def hf():
    path = smollm2_gguf_path()
    model = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=GGUF_NAME,
                                                              dtype=torch.float32)
    return model.eval()


def _tokens(tok, n, seed=0):
    text = ("The quick brown fox jumps over the lazy dog while the committee reviews its annual report. ")
    ids = tok.encode(text * (n // 10 + 2))[:n]
    assert len(ids) == n
    return torch.tensor(ids)


def test_config(ours):
    model, tok = ours
    c = model.config
    assert (c.vocab_size, c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.num_key_value_heads,
            c.head_dim, c.rope_theta, c.tie_word_embeddings, c.max_position_embeddings) == \
        (49152, 30, 576, 9, 3, 64, 1e5, True, 8192)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert tok.eos_token_id == 2 and tok.vocab_size == 49152


def test_prefill_parity(ours, hf):
    model, tok = ours
    for n in (1, 17, 90):
        ids = _tokens(tok, n)[None]
        with torch.no_grad():
            ref = hf(ids).logits[0]
        plain = model(ids)[0]
        assert (plain - ref).abs().max().item() <= TOL, n
        cache = FullCache(model.config, 1, n + 1)
        last = model.prefill(ids, cache, chunk_size=32)
        assert (last[0] - ref[-1]).abs().max().item() <= TOL, n
        assert last[0].argmax() == ref[-1].argmax()


def test_decode_parity(ours, hf):
    model, tok = ours
    ids = _tokens(tok, 40)
    P = 30
    with torch.no_grad():
        ref = hf(ids[None]).logits[0]
    cache = FullCache(model.config, 1, 64)
    model.prefill(ids[None, :P], cache, chunk_size=16)
    worst = 0.0
    for t in range(P, 40):
        out = model(ids[None, t:t + 1], cache=cache)[0, 0]
        worst = max(worst, (out - ref[t]).abs().max().item())
    assert worst <= TOL


def test_ragged_batch_parity(ours, hf):
    model, tok = ours
    prompts = [_tokens(tok, n, seed=n) for n in (5, 23, 12)]
    cache = FullCache(model.config, 3, 64)
    last = model.prefill(prompts, cache, chunk_size=16)
    for b, p in enumerate(prompts):
        with torch.no_grad():
            ref = hf(p[None]).logits[0, -1]
        assert (last[b] - ref).abs().max().item() <= TOL


def test_tokenizer_matches_transformers_gguf_tokenizer(ours):
    _, tok = ours
    path = smollm2_gguf_path()
    ref = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=GGUF_NAME)
    texts = ["Hello, world!", "  leading spaces and\ttabs\nnew lines", "naïve café — déjà vu ✓ 日本語",
             "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n", "don't can't it's"]
    for t in texts:
        assert tok.encode(t) == ref.encode(t, add_special_tokens=False), t
        assert tok.decode(tok.encode(t)) == t
    # SmolLM2 (llama.cpp pre-tokenizer "smollm", and the original tokenizer.json) splits every digit.
    digits = tok.encode("year 2024")
    assert [tok.decode([i]) for i in digits[-4:]] == ["2", "0", "2", "4"]
    assert tok.encode("<|im_end|>") == [2]
    chat = tok.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert chat.startswith("<|im_start|>system\n") and chat.endswith("<|im_start|>assistant\n")


def test_second_load_is_fast(ours):
    t = time.perf_counter()
    model, tok = smollm2_135m()
    elapsed = time.perf_counter() - t
    assert elapsed < 5.0, f"cached load took {elapsed:.1f} s"
    assert model.config.num_hidden_layers == 30 and tok.vocab_size == 49152
    assert os.path.exists(os.path.expanduser(os.environ.get("TRIFORCE_CACHE_DIR", "~/.cache/triforce")))


def test_gguf_weights_give_the_float32_logits_bitwise(ours):
    """On its GGUF file's own Q4_1 / Q8_0 blocks (triforce.models.gguf_copy) the model computes the float32
    model's logits bitwise: a forward without a cache, a chunked prefill and one-token steps."""
    from triforce.models import Q4Linear, gguf_copy

    model, tok = ours
    packed = gguf_copy(model, smollm2_gguf_path())
    layers = [m for m in packed.modules() if isinstance(m, Q4Linear)]
    assert len(layers) == 7 * model.config.num_hidden_layers
    ids = _tokens(tok, 300)[None]
    with torch.no_grad():
        assert torch.equal(packed(ids[:, :90]), model(ids[:, :90]))
        caches = [FullCache(model.config, 1, 320) for _ in range(2)]
        assert torch.equal(packed.prefill([ids[0, :290]], caches[0]), model.prefill([ids[0, :290]], caches[1]))
        for t in range(290, 300):
            assert torch.equal(packed(ids[:, t:t + 1], cache=caches[0]), model(ids[:, t:t + 1], cache=caches[1]))
