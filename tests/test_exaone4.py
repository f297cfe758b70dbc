"""EXAONE 4 (``model_type="exaone4"``): OLMo 2's norms after the blocks (Llama's RMSNorm) with Qwen3's q/k norms per
head; with a sliding window, its sliding layers slide and take RoPE while the others take none (NoPE). Against
transformers' Exaone4ForCausalLM."""
import pytest
import torch

from triforce.models import Llama, LlamaConfig

from .test_engines import TINY_CASES, assert_greedy_equals_autoregressive
from .test_families import TINY, tiny_family, transformers_and_ours
from .test_model import TOL
from .test_sliding_window import assert_every_path_matches, assert_pass_equals_steps

transformers = pytest.importorskip("transformers")

EXAONE4 = dict(TINY, num_hidden_layers=5, pad_token_id=None, sliding_window=6)
ALTERNATE = ["sliding_attention", "full_attention", "sliding_attention", "full_attention", "full_attention"]


def pair(**kw):
    return transformers_and_ours("Exaone4", **{**EXAONE4, **kw})


@pytest.mark.parametrize("kw", [{}, {"layer_types": ALTERNATE, "tie_word_embeddings": True},
                                {"sliding_window": 1000},
                                {"sliding_window": None, "layer_types": ["full_attention"] * 5},
                                {"rope_parameters": {"rope_type": "llama3", "rope_theta": 1e6, "factor": 8.0,
                                                     "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                     "original_max_position_embeddings": 16}}],
                         ids=["pattern", "layer-types-tied", "window-past-context", "no-window", "llama3"])
def test_logits_and_every_path_match_transformers(tmp_path, kw):
    """The plain forward, a chunked prefill, a verify pass, steps and a tree over the cache give transformers'
    logits: windows and RoPE on the sliding layers only (a window past the context still leaves the others without
    RoPE; no window at all gives every layer RoPE); the checkpoint we save reads back in transformers as the same
    model."""
    hf, ours = pair(**kw)
    c = ours.config
    sliding = [t == "sliding_attention" for t in hf.config.layer_types]
    window = kw.get("sliding_window", 6)
    assert c.post_norms and c.qk_norm and not c.qk_norm_full and not c.float32_norm
    assert c.rope_layers == (tuple(sliding) if window is not None else (True,) * 5)
    assert c.layer_windows == tuple(window if s and window and window < 512 else 0 for s in sliding)
    assert_every_path_matches(hf, ours)
    ours.save_pretrained(tmp_path)
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    assert type(back).__name__ == "Exaone4ForCausalLM" and back.config.layer_types == hf.config.layer_types
    ids = torch.randint(0, 101, (2, 30), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        assert torch.equal(back(ids).logits, hf(ids).logits)
        assert torch.equal(Llama.from_pretrained(tmp_path)(ids), ours(ids))


def test_the_nope_layers_matter():
    """RoPE on the full layers too (the model's frequencies instead of zeros) moves the logits by far more than the
    tolerance: the tests above would see the NoPE layers missing."""
    hf, ours = pair()
    ids = torch.randint(0, 101, (1, 30), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = hf(ids).logits
        assert (ours(ids) - ref).abs().max().item() <= TOL
        ours.inv_freq_local = ours.inv_freq.clone()
        assert (ours(ids) - ref).abs().max().item() > 10 * TOL


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_pass_gives_the_bits_of_one_token_steps(dtype):
    assert_pass_equals_steps(pair()[1], dtype)


def test_defaults_and_bad_configs():
    """A config without the keys takes Exaone4Config's (a window of 4096 on three of every four layers, those with
    RoPE); a window of null without layer_types means every layer full with RoPE (where transformers' config divides
    by a pattern of 0); keys EXAONE 4 does not read raise."""
    c = LlamaConfig.from_dict({**TINY, "model_type": "exaone4", "max_position_embeddings": 8192,
                               "num_hidden_layers": 8})
    assert c.layer_windows == (4096, 4096, 4096, 0) * 2 and c.rope_layers == (True, True, True, False) * 2
    assert (c.bos_token_id, c.eos_token_id, c.rms_norm_eps) == (0, 2, 1e-5)
    c = LlamaConfig.from_dict({**TINY, "model_type": "exaone4", "sliding_window": None})
    assert c.layer_windows == (0, 0) and c.rope_layers == (True, True)
    for bad, match in (({"attention_bias": True}, "attention_bias"),
                       ({"sliding_window_pattern": "LLLG"}, "'sliding_window_pattern'"),
                       ({"sliding_window": None, "layer_types": ["sliding_attention", "full_attention"]},
                        "'sliding_window'")):
        with pytest.raises(ValueError, match=match):
            LlamaConfig.from_dict({**TINY, "model_type": "exaone4", **bad})
    ok = LlamaConfig.from_dict({**TINY, "model_type": "exaone4", "sliding_window": 6, "sliding_window_pattern": "LG",
                                "layer_types": ["sliding_attention", "full_attention"]})
    assert ok.layer_windows == (6, 0) and ok.rope_layers == (True, False)


def tiny_exaone4(seed):
    return tiny_family("exaone4", seed, layers=4, extra={"sliding_window": 10, "sliding_window_pattern": 2})


@pytest.mark.parametrize("method,opts", TINY_CASES, ids=[f"{m}-{i}" for i, (m, _) in enumerate(TINY_CASES)])
def test_greedy_equals_autoregressive(method, opts):
    assert_greedy_equals_autoregressive(tiny_exaone4(0), tiny_exaone4(1), method, opts)


def test_heads_training_forward_equals_decoding():
    """The Hidden Transfer heads' training forward runs EXAONE 4's layers (no norm before the attention, NoPE layers)
    as decoding does."""
    from .test_heads import assert_perturbed_heads_train_as_they_decode

    assert_perturbed_heads_train_as_they_decode(tiny_exaone4(0))


@pytest.mark.parametrize("layers", [64, 5])
def test_gguf_as_llama_cpp_runs_it(tmp_path, layers):
    """An exaone4 GGUF as llama.cpp's converter writes it (OLMo 2's tensor names, q / k rows as the checkpoint holds
    them, the window and its pattern) runs as llama.cpp runs it, which is transformers' model where the two agree: a
    64-layer file (EXAONE-4.0-32B's count) slides three of every four layers with RoPE and leaves the others without;
    in any other file llama.cpp has no window and RoPE on every layer (here transformers' config with the window
    null). Its blocks compute the loaded model bitwise; a pattern other than llama.cpp's raises."""
    from .test_families import assert_converted_gguf_is_the_checkpoint, converted_kv, write_converted_gguf

    windowed = layers == 64
    kw = dict(num_hidden_layers=layers) if windowed else dict(num_hidden_layers=layers, sliding_window=None,
                                                              layer_types=["full_attention"] * layers)
    hf, _ = pair(**kw)
    kv = converted_kv(hf.config)
    if windowed:
        kv.update({"attention.sliding_window": 6,
                   "attention.sliding_window_pattern": [t == "sliding_attention" for t in hf.config.layer_types]})
    c = assert_converted_gguf_is_the_checkpoint(tmp_path, hf, "exaone4", kv).config
    assert c.model_type == "exaone4" and c.layer_windows == tuple(6 if (i % 4 < 3 and windowed) else 0
                                                                  for i in range(layers))
    assert c.rope_layers == (tuple(i % 4 < 3 for i in range(layers)) if windowed else (True,) * layers)
    if windowed:
        other = write_converted_gguf(tmp_path / "p.gguf", hf, "exaone4", {
            **kv, "attention.sliding_window_pattern": [True, False] * (layers // 2)})
        with pytest.raises(ValueError, match="sliding_window_pattern"):
            Llama.from_pretrained(other, cache_dir=False)
