"""The real draft/target pair (opt-in: ``TRIFORCE_PAIR=1``; it downloads 1.6 GB on first use and takes a
few minutes): Qwen2.5-Coder-0.5B-Instruct and -1.5B-Instruct, Q4_K_M GGUF (docs/pair.md).

* logits equal transformers' GGUF loader on the same file (the K-quants, Q5_0, the qwen2 layout);
* the tokenizer rebuilt from the GGUF metadata (pre-tokenizer ``qwen2``) equals transformers' conversion;
* greedy ``speculative`` and ``triforce`` with the 0.5B drafting for the 1.5B give the autoregressive
  tokens on a ragged batch;
* the same on the files' own blocks with integer dot products (``gguf_copy(..., activations="int8")``).

Run: ``TRIFORCE_PAIR=1 TRIFORCE_CACHE_MAX_GB=12 python -m pytest tests/test_pair_models.py``.
"""
import os

import pytest
import torch

pytestmark = pytest.mark.skipif(os.environ.get("TRIFORCE_PAIR") != "1",
                                reason="opt-in: set TRIFORCE_PAIR=1 to fetch and test the Qwen2.5-Coder pair")

TEXTS = ["def quicksort(xs):\n    if len(xs) <= 1:\n        return xs  # 12345 it's\r\n",
         "I'LL  DON'T  café naïve 日本語 😀 １２３\n\n\tindent   ", "<|im_start|>user\nhi<|im_end|>\n"]


@pytest.fixture(scope="module")
def pair():
    from triforce.models import hub

    target, tok = hub.load_model("qwen2.5-coder-1.5b")
    return target, hub.load_draft("qwen2.5-coder-0.5b"), tok


@pytest.mark.parametrize("which", ["draft", "target"])
def test_logits_and_tokenizer_match_transformers(which):
    transformers = pytest.importorskip("transformers")
    from triforce.models import Llama
    from triforce.models.hub import load_tokenizer
    from triforce.models.pair import fetch

    path = fetch(which, quiet=True)
    tok = load_tokenizer(path)
    theirs_tok = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    for text in TEXTS:
        assert tok.encode(text) == theirs_tok.encode(text, add_special_tokens=False), text
    ours = Llama.from_pretrained(path)
    hf = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                          dtype=torch.float32).eval()
    ids = torch.tensor([tok.encode(TEXTS[0])])
    with torch.no_grad():
        got, ref = ours(ids), hf(ids).logits
    # float32 reordering over 24-28 layers of width 896-1536, logits up to ~30: measured ~2e-5
    assert (got - ref).abs().max().item() <= 2e-4
    assert torch.equal(got.argmax(-1), ref.argmax(-1))


def test_greedy_speculative_and_triforce_equal_autoregressive(pair):
    from triforce.demo import natural_prompt
    from triforce.generate import generate

    target, draft, tok = pair
    prompts = [torch.tensor(natural_prompt(tok, n, offset=9000 * i)) for i, n in enumerate((300, 211))]
    ref = generate(target, prompts, method="autoregressive", max_new_tokens=16)
    spec = generate(target, prompts, method="speculative", draft=draft, max_new_tokens=16, gamma=3)
    tri = generate(target, prompts, method="triforce", draft=draft, max_new_tokens=16, gamma1=2, gamma2=5,
                   budget=64, chunk_size=8, sink=8, window=56)
    assert "draft->retrieval" in tri.stats["acceptance"]  # the full hierarchy ran
    for out in (spec, tri):
        for a, b in zip(out.tokens, ref.tokens):
            assert torch.equal(a, b)


def test_the_pair_on_its_own_blocks_with_int8_activations(pair):
    """Every layer of both Q4_K_M files (Q4_K, Q6_K, Q5_0, Q8_0) runs on its own blocks with integer dot
    products, the dequantised weights the float32 models' bitwise; the int8 target stays close to the
    float32 one, and the 0.5B drafting for it keeps greedy speculative and triforce lossless."""
    from triforce.demo import natural_prompt
    from triforce.generate import generate
    from triforce.models import gguf_copy
    from triforce.models.pair import fetch
    from triforce.models.quant import Int8DotLinear

    target, draft, tok = pair
    fast = gguf_copy(target, fetch("target", quiet=True), activations="int8")
    small = gguf_copy(draft, fetch("draft", quiet=True), activations="int8")
    for model in (fast, small):
        layers = [m for n, m in model.named_modules() if n.endswith("_proj")]
        assert layers and all(isinstance(m, Int8DotLinear) for m in layers)
        assert isinstance(model.lm_head, Int8DotLinear)
    formats = {m.format for m in fast.modules() if isinstance(m, Int8DotLinear)}
    assert {"Q4_1", "Q6_16"} <= formats  # Q4_K and Q6_K
    ids = torch.tensor([tok.encode(TEXTS[0])])
    with torch.no_grad():
        got, ref = fast(ids), target(ids)
    assert (got.argmax(-1) == ref.argmax(-1)).float().mean() >= 0.8
    prompts = [torch.tensor(natural_prompt(tok, n, offset=9000 * i)) for i, n in enumerate((300, 211))]
    want = generate(fast, prompts, method="autoregressive", max_new_tokens=16)
    spec = generate(fast, prompts, method="speculative", draft=small, max_new_tokens=16, gamma=3)
    tri = generate(fast, prompts, method="triforce", draft=small, max_new_tokens=16, gamma1=2, gamma2=5,
                   budget=64, chunk_size=8, sink=8, window=56)
    for out in (spec, tri):
        for a, b in zip(out.tokens, want.tokens):
            assert torch.equal(a, b)
