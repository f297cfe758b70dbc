"""Gemma 3's language model (``model_type="gemma3_text"``, transformers' Gemma3ForCausalLM): against transformers
on the same weights (sliding-window layers with their own RoPE base, a global layer with linear RoPE scaling,
q/k norms and sandwich norms in Gemma's 1 + w, the attention scaled by query_pre_attn_scalar), on every forward
path; both config.json spellings; a pass with the bits of steps; every method's greedy tokens; the StreamingLLM
cache's per-layer RoPE; the Hidden Transfer heads' training forward equal to their decoding."""
import json

import pytest
import torch

import triforce
from triforce.models import Llama, LlamaConfig, StreamingCache

from .test_engines import TINY_CASES, assert_greedy_equals_autoregressive, tiny_gemma
from .test_families import TINY, randomize_
from .test_model import TOL
from .test_sliding_window import assert_every_path_matches, assert_pass_equals_steps

transformers = pytest.importorskip("transformers")

GEMMA3 = dict(TINY, num_hidden_layers=4, head_dim=16, sliding_window=6, query_pre_attn_scalar=24,
              rope_theta=1e6, rope_local_base_freq=5000.0, sliding_window_pattern=3,
              rope_scaling={"rope_type": "linear", "factor": 2.0})  # layers: sliding, sliding, global, sliding


def hf_gemma3(**kw):
    torch.manual_seed(0)
    config = transformers.Gemma3TextConfig(**{**GEMMA3, **kw}, attn_implementation="eager")
    return randomize_(transformers.Gemma3ForCausalLM(config).eval())


def pair(**kw):
    from triforce.models.loading import _build

    hf = hf_gemma3(**kw)
    return hf, _build(LlamaConfig.from_dict(hf.config.to_dict()), hf.state_dict(), None, None)


def test_config():
    hf, ours = pair()
    c = ours.config
    assert c.model_type == "gemma3_text" and c.layer_windows == (6, 6, 0, 6)
    assert c.attention_scale == 24 ** -0.5 and c.local_rope_theta == 5000.0 and c.rope_type == "linear"
    assert (c.qk_norm, c.gemma_norm, c.sandwich_norms, c.embed_scale) == (True, True, True, True)
    assert [c.layer_rope_theta(i) for i in range(4)] == [5000.0, 5000.0, None, 5000.0]
    assert LlamaConfig.from_dict(c.to_dict()) == c
    # transformers 4.x's spelling (as Google's config.json files are written) reads the same
    old = {k: v for k, v in c.to_dict().items() if k not in ("layer_types", "_sliding_window_pattern")}
    old["sliding_window_pattern"] = 3
    assert LlamaConfig.from_dict(old).layer_windows == c.layer_windows
    # and transformers reads ours back as the same model
    back = transformers.Gemma3TextConfig.from_dict(c.to_dict())
    assert back.layer_types == hf.config.layer_types and back.rope_parameters == hf.config.rope_parameters


@pytest.mark.parametrize("bad, match", [
    ({"attn_logit_softcapping": 50.0}, "'attn_logit_softcapping'"),
    ({"final_logit_softcapping": 30.0}, "'final_logit_softcapping'"),
    ({"query_pre_attn_scalar": 0}, "'query_pre_attn_scalar'"),
    ({"sliding_window_pattern": 0}, "'sliding_window_pattern'"),
    ({"layer_types": ["sliding_attention"]}, "'layer_types'"),
    ({"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                          "sliding_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}}},
     "sliding layers take plain RoPE"),
])
def test_unsupported_values_raise(bad, match):
    d = {**LlamaConfig.from_dict(hf_gemma3().config.to_dict()).to_dict(), **bad}
    d.pop("rope_scaling", None) if "rope_parameters" in bad else None
    with pytest.raises(ValueError, match=match):
        LlamaConfig.from_dict(d)
    with pytest.raises(ValueError, match="rope_parameters per layer type"):  # another family's
        LlamaConfig.from_dict({"model_type": "llama", "rope_parameters": {"full_attention": {"rope_theta": 1e4}}})


def test_logits_match_transformers(tmp_path):
    """Past the windows: the plain forward, a chunked prefill, a verify pass, steps and a tree against
    transformers' eager attention; our save read back by transformers and by us."""
    hf, ours = pair()
    ids, ref = assert_every_path_matches(hf, ours)
    hf.save_pretrained(tmp_path / "hf")
    saved = Llama.from_pretrained(tmp_path / "hf").config
    for name in ("layer_windows", "attention_scale", "local_rope_theta", "rope_scaling", "rope_theta", "head_dim"):
        assert getattr(saved, name) == getattr(ours.config, name), name
    ours.save_pretrained(tmp_path / "ours")
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "ours", attn_implementation="eager").eval()
    assert type(back).__name__ == "Gemma3ForCausalLM"
    with torch.no_grad():
        assert (back(ids).logits - ref).abs().max().item() <= TOL
    cfg = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert cfg["model_type"] == "gemma3_text" and cfg["rope_local_base_freq"] == 5000.0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_pass_gives_the_bits_of_one_token_steps(dtype):
    assert_pass_equals_steps(pair()[1], dtype)


def tiny_gemma3(seed):
    return tiny_gemma("gemma3_text", seed, rope_theta=1e5, extra={
        "sliding_window": 7, "sliding_window_pattern": 2, "query_pre_attn_scalar": 12, "rope_local_base_freq": 1000.0})


@pytest.mark.parametrize("method,opts", TINY_CASES, ids=[f"{m}-{i}" for i, (m, _) in enumerate(TINY_CASES)])
def test_greedy_equals_autoregressive(method, opts):
    assert_greedy_equals_autoregressive(tiny_gemma3(0), tiny_gemma3(1), method, opts)


def test_streaming_cache_rotates_each_layer_with_its_rope():
    """A StreamingLLM cache keeps each key as its un-rotated copy rotated at the token's StreamingLLM position;
    when evictions re-rotate the sinks (and a re-base the window), each layer takes its own RoPE: Gemma 3's
    sliding layers their local base, its global ones the scaled one."""
    from triforce.models.rope import apply_rope, rope_cos_sin, rope_inv_freq, rope_local_inv_freq

    model = tiny_gemma3(0)
    cfg = model.config
    cache, n, pos = streaming_after_evictions(model)
    for layer in range(cfg.num_hidden_layers):
        local = cfg.layer_rope_theta(layer) is not None
        inv_freq = rope_local_inv_freq(cfg) if local else rope_inv_freq(cfg)
        cos, sin = rope_cos_sin(inv_freq, pos[None], torch.float32)
        want = apply_rope(cache.k_raw[layer][:, :n], cos, sin)
        assert (cache.k[layer][:, :n] - want).abs().max() <= TOL, layer


def streaming_after_evictions(model) -> tuple:
    """``(cache, n, positions)``: a StreamingLLM cache (2 sinks, a window of 9, steps of 3) after 40 tokens of
    ``model`` (evictions, re-rotated sinks), the tokens it holds and each one's StreamingLLM position ``[n]``."""
    ids = torch.randint(0, 64, (1, 40), generator=torch.Generator().manual_seed(5))
    cache = StreamingCache(model.config, 1, sink=2, window=9, max_step=4)
    with torch.no_grad():
        for i in range(0, 40, 3):
            model(ids[:, i:i + 3], cache=cache)
    assert int(cache.evicted[0]) > 0
    n = int(cache.lengths[0])
    s = torch.arange(n)
    pos = torch.where(s < cache.sink, s + cache.evicted[0] - cache.frame[0], cache.slot_pos[0, :n] - cache.frame[0])
    return cache, n, pos


@pytest.mark.parametrize("family", ["gemma3_text", "qwen3"])
def test_pseudo_tokens_training_forward_equals_decoding(family):
    """The Hidden Transfer heads' training forward runs the upper layers as decoding runs them: Gemma 3's
    sandwich norms, RoPE per layer, windows and scale, and the q/k norms (Qwen3's too)."""
    from .test_heads import assert_perturbed_heads_train_as_they_decode

    m = tiny_gemma3(0) if family == "gemma3_text" else Llama(LlamaConfig(
        model_type="qwen3", vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=1024,
        initializer_range=0.3)).eval()
    if family == "qwen3":
        with torch.no_grad():
            for name, p in m.named_parameters():
                if "norm" in name:
                    p.normal_(1, 0.3)
    assert_perturbed_heads_train_as_they_decode(m)


def gguf_read_as_transformers_reads_it(tmp_path, model, meta: dict, architecture: str, settings: tuple):
    """Write ``model`` as llama.cpp's converter writes it (K-quant and Q8_0 blocks), read it with us and with
    transformers: the same weights bit for bit, the same ``settings`` (config properties), and so our forward
    from the file bitwise our forward from transformers' reading. -> (ours from the file, its path, ids)."""
    import numpy as np

    gguf = pytest.importorskip("gguf")
    from triforce.models.loading import _build

    from .test_config import write_gguf
    from .test_families import QT, gguf_tokenizer, quantizer

    path = write_gguf(tmp_path / "m.gguf", model, meta=meta, quant=quantizer(np.random.default_rng(0)),
                      tokenizer=gguf_tokenizer("llama-bpe", model.config.vocab_size))
    assert {QT.Q4_K, QT.Q8_0} <= {t.tensor_type for t in gguf.GGUFReader(str(path)).tensors}
    ours = Llama.from_pretrained(path, cache_dir=False)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file="m.gguf",
                                                          attn_implementation="eager").eval()
    assert type(hf).__name__ == architecture
    theirs, mine = hf.state_dict(), ours.state_dict()
    assert set(mine) == set(theirs)
    for name, t in theirs.items():
        assert torch.equal(mine[name], t), name
    read = {k: v for k, v in hf.config.to_dict().items() if k != "quantization_config"}  # (the file it came from)
    twin = _build(LlamaConfig.from_dict(read), theirs, None, None)
    for name in settings + ("rope_theta", "rms_norm_eps"):
        assert getattr(twin.config, name) == getattr(ours.config, name), name
    ids = torch.randint(0, model.config.vocab_size, (2, 50), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert torch.equal(ours(ids), twin(ids))
    assert not torch.allclose(ours.model.layers[0].mlp.up_proj.weight, model.model.layers[0].mlp.up_proj.weight)
    return ours, path, ids


def test_gguf_as_llama_cpp_writes_it_reads_as_transformers_reads_it(tmp_path):
    """A gemma3 GGUF (llama.cpp's names: post_attention_norm, ffn_norm before the MLP, post_ffw_norm; every norm
    stored as 1 + w; K-quant and Q8_0 blocks) reads as transformers reads the same file: the same weights bit
    for bit and the same settings (llama.cpp's fixed ones: 5 of 6 layers sliding, local base 10000, scale
    head_dim ** -0.5), so our model from the file computes bitwise what it computes from transformers' reading
    (which test_logits_match_transformers compares with transformers' own forward)."""
    config = LlamaConfig(model_type="gemma3_text", vocab_size=400, hidden_size=256, intermediate_size=512,
                         num_hidden_layers=7, num_attention_heads=1, num_key_value_heads=1, head_dim=256,
                         max_position_embeddings=512, rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=True,
                         extra={"sliding_window": 8, "query_pre_attn_scalar": 256, "rope_local_base_freq": 10000.0})
    torch.manual_seed(0)
    model = randomize_(Llama(config).eval())
    ours, path, ids = gguf_read_as_transformers_reads_it(
        tmp_path, model, {"attention.sliding_window": 8}, "Gemma3ForCausalLM",
        ("layer_windows", "attention_scale", "local_rope_theta", "rope_scaling"))
    assert ours.config.layer_windows == (8, 8, 8, 8, 8, 0, 8) and ours.config.attention_scale == 256 ** -0.5
    # on the file's own blocks (gguf_copy): the float32 model's logits bitwise; with int8 activation blocks its
    # own arithmetic, under which speculative decoding emits its autoregressive tokens
    fast = triforce.models.gguf_copy(ours, path)
    with torch.no_grad():
        assert torch.equal(fast(ids), ours(ids))
    fast = triforce.models.gguf_copy(ours, path, activations="int8")
    prompts = [torch.randint(0, 400, (n,), generator=torch.Generator().manual_seed(n)) for n in (20, 33)]
    ref = triforce.generate(fast, prompts, method="autoregressive", max_new_tokens=20)
    for method, opts in (("speculative", {"draft": "lookup"}), ("magicdec", {"gamma": 3, "sink": 1, "window": 8})):
        out = triforce.generate(fast, prompts, method=method, max_new_tokens=20, **opts)
        assert all(torch.equal(a, b) for a, b in zip(out.tokens, ref.tokens)), method


def assert_random_heads_trees_lossless(model, kind):
    """Random draft heads of ``kind`` on ``model``: their trees give autoregressive decoding's tokens."""
    from .test_heads import random_heads

    prompts = [torch.randint(0, 64, (n,), generator=torch.Generator().manual_seed(n)) for n in (9, 17, 5)]
    ref = triforce.generate(model, prompts, method="autoregressive", max_new_tokens=16)
    out = triforce.generate(model, prompts, method="tree", draft=random_heads(model, kind), tree=(2, 1),
                            max_new_tokens=16)
    assert all(torch.equal(a, b) for a, b in zip(out.tokens, ref.tokens))


@pytest.mark.parametrize("kind", ["medusa", "mlp", "early_exit", "hidden_transfer"])
def test_random_heads_trees_are_lossless(kind):
    """Draft heads on a Gemma 3 target (two RoPEs, sliding layers; Hidden Transfer's pseudo tokens ride in the
    target's pass)."""
    assert_random_heads_trees_lossless(tiny_gemma3(0), kind)


def test_the_config_google_ships_loads():
    """gemma-3-1b-it's config.json as Google ships it (transformers 4.50's spelling, with generate()'s
    ``cache_implementation``): 26 layers, every 6th global, a window of 512, local base 10000."""
    d = {"architectures": ["Gemma3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
         "attn_logit_softcapping": None, "bos_token_id": 2, "cache_implementation": "hybrid", "eos_token_id": [1, 106],
         "final_logit_softcapping": None, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
         "hidden_size": 1152, "initializer_range": 0.02, "intermediate_size": 6912, "max_position_embeddings": 32768,
         "model_type": "gemma3_text", "num_attention_heads": 4, "num_hidden_layers": 26, "num_key_value_heads": 1,
         "pad_token_id": 0, "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000,
         "rope_scaling": None, "rope_theta": 1000000, "sliding_window": 512, "sliding_window_pattern": 6,
         "torch_dtype": "bfloat16", "transformers_version": "4.50.0.dev0", "use_cache": True, "vocab_size": 262144}
    c = LlamaConfig.from_dict(d)
    assert c.layer_windows == tuple(0 if (i + 1) % 6 == 0 else 512 for i in range(26))
    assert (c.attention_scale, c.local_rope_theta, c.rope_theta, c.rope_scaling) == (1 / 16, 10000.0, 1e6, None)
    assert transformers.Gemma3TextConfig.from_dict(c.to_dict()).layer_types == \
        transformers.Gemma3TextConfig.from_dict(d).layer_types


def hf_gemma3_image_text():
    """A tiny Gemma3ForConditionalGeneration (an image + text checkpoint: gemma-3-4b / 12b / 27b), its language
    model ``GEMMA3``'s."""
    torch.manual_seed(0)
    config = transformers.Gemma3Config(
        text_config={**GEMMA3, "attn_implementation": "eager"}, mm_tokens_per_image=4, image_token_index=95,
        boi_token_index=93, eoi_token_index=94, attn_implementation="eager",
        vision_config=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                           image_size=28, patch_size=14))
    return randomize_(transformers.Gemma3ForConditionalGeneration(config).eval())


def test_the_image_text_checkpoint_loads_its_language_model(tmp_path):
    """A Gemma3ForConditionalGeneration directory (``model_type="gemma3"``, the language model's keys in
    ``text_config``, its weights under ``language_model.model.*``) loads as its language model, with
    transformers' logits for text; the image side is not read. The names transformers 5 gives the weights in
    memory (``model.language_model.*``) load the same model; keys of neither side raise."""
    from safetensors.torch import load_file, save_file

    hf = hf_gemma3_image_text()
    hf.save_pretrained(tmp_path / "hf")
    saved = load_file(tmp_path / "hf" / "model.safetensors")
    assert any(k.startswith("language_model.model.") for k in saved) and any("vision_tower" in k for k in saved)
    ours = Llama.from_pretrained(tmp_path / "hf")
    assert ours.config.model_type == "gemma3_text" and ours.config.layer_windows == (6, 6, 0, 6)
    ids = torch.randint(0, 93, (2, 30), generator=torch.Generator().manual_seed(2))  # text tokens only
    with torch.no_grad():
        ref = hf(input_ids=ids).logits
        assert (ours(ids) - ref).abs().max().item() <= TOL
    v5 = tmp_path / "v5"
    v5.mkdir()
    (v5 / "config.json").write_text((tmp_path / "hf" / "config.json").read_text())
    v5_names = {k: k.replace("language_model.model.", "model.language_model.", 1) if k.startswith("language_model.")
                else "model." + k for k in saved}
    assert all(v.startswith(("model.language_model.", "model.vision_tower.", "model.multi_modal_projector."))
               for v in v5_names.values())
    save_file({**{v5_names[k]: v for k, v in saved.items()},
               "lm_head.weight": saved["language_model.model.embed_tokens.weight"].clone()}, v5 / "model.safetensors")
    with torch.no_grad():
        assert torch.equal(Llama.from_pretrained(v5)(ids), ours(ids))
    save_file({**saved, "language_model.model.extra.weight": torch.zeros(2)}, v5 / "model.safetensors")
    with pytest.raises(ValueError, match=r"unexpected \['model.extra.weight'\]"):
        Llama.from_pretrained(v5)


def test_the_image_text_config_google_ships_loads():
    """A config.json shaped as Google's gemma-3-4b-it (transformers 4.50's spelling): the language model's few
    keys in ``text_config``, the rest Gemma3TextConfig's defaults, the wrapper's EOS ids; bad wrappers raise."""
    d = {"architectures": ["Gemma3ForConditionalGeneration"], "boi_token_index": 255999, "eoi_token_index": 256000,
         "eos_token_id": [1, 106], "image_token_index": 262144, "initializer_range": 0.02, "mm_tokens_per_image": 256,
         "model_type": "gemma3", "text_config": {"hidden_size": 2560, "intermediate_size": 10240,
                                                 "model_type": "gemma3_text", "num_hidden_layers": 34,
                                                 "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                                                 "sliding_window": 1024},
         "torch_dtype": "bfloat16", "transformers_version": "4.50.0.dev0",
         "vision_config": {"hidden_size": 1152, "image_size": 896, "intermediate_size": 4304,
                           "model_type": "siglip_vision_model", "num_attention_heads": 16, "num_hidden_layers": 27,
                           "patch_size": 14, "vision_use_head": False}}
    c = LlamaConfig.from_dict(d)
    want = transformers.Gemma3Config.from_dict(d).text_config
    assert c.model_type == "gemma3_text" and c.eos_token_id == [1, 106]
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "head_dim", "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings"):
        assert getattr(c, name) == getattr(want, name), name
    assert c.layer_windows == tuple(0 if t == "full_attention" else 1024 for t in want.layer_types)
    assert (c.attention_scale, c.local_rope_theta, c.rope_theta, c.rope_scaling["factor"]) == (1 / 16, 1e4, 1e6, 8.0)
    for bad, match in (({"hidden_size": 8}, "'hidden_size' of model_type 'gemma3'"),
                       ({"text_config": {"model_type": "gemma2"}}, "text_config's model_type must be 'gemma3_text'"),
                       ({"tie_word_embeddings": False}, "tie_word_embeddings = False .* disagrees"),
                       ({"text_config": {**d["text_config"], "tie_word_embeddings": False}},  # the wrapper ties
                        r"tie_word_embeddings = True .* disagrees with its text_config's \(False\)"),
                       ({"text_config": [1]}, "text_config must be a JSON object")):
        with pytest.raises(ValueError, match=match):
            LlamaConfig.from_dict({**d, **bad})
