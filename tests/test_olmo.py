"""OLMo 2 and OLMo 3 (``model_type="olmo2"`` / ``"olmo3"``, GGUF ``olmo2``): Llama's layer with its norms after the
attention and the MLP instead of before, RMSNorms over each token's whole query and key projections and weights applied
in float32; OLMo 3's sliding layers with plain RoPE beside full layers with the model's. Against transformers'
Olmo2ForCausalLM / Olmo3ForCausalLM."""
import pytest
import torch

import triforce
from triforce.models import Llama, LlamaConfig

from .test_engines import TINY_CASES, assert_greedy_equals_autoregressive
from .test_families import TINY, randomize_, tiny_family, transformers_and_ours
from .test_model import TOL
from .test_sliding_window import assert_every_path_matches, assert_pass_equals_steps

transformers = pytest.importorskip("transformers")

OLMO2 = dict(TINY, num_hidden_layers=3, pad_token_id=None, rope_parameters={"rope_type": "default",
                                                                               "rope_theta": 50000.0})
# YaRN on the full layers (every 4th: layer 3), plain RoPE with another base on the sliding ones (0-2, 4), window 6
YARN = {"rope_type": "yarn", "rope_theta": 500000.0, "factor": 4.0, "original_max_position_embeddings": 16,
        "beta_fast": 32.0, "beta_slow": 1.0, "attention_factor": 1.3}
OLMO3 = dict(TINY, num_hidden_layers=5, pad_token_id=None, sliding_window=6, rope_parameters={
    "full_attention": YARN, "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}})


def pair(name="Olmo2", **kw):
    return transformers_and_ours(name, **{**(OLMO2 if name == "Olmo2" else OLMO3), **kw})


TYPES = ["full_attention", "sliding_attention"] * 2 + ["full_attention"]


@pytest.mark.parametrize("name,kw", [("Olmo2", {}), ("Olmo2", {"attention_bias": True, "tie_word_embeddings": True}),
                                     ("Olmo3", {}), ("Olmo3", {"layer_types": TYPES, "sliding_window": 1000})],
                         ids=["olmo2", "olmo2-bias-tied", "olmo3", "olmo3-types-window-past-context"])
def test_logits_and_every_path_match_transformers(tmp_path, name, kw):
    """The plain forward, a chunked prefill, a verify pass, steps and a tree over the cache give transformers'
    logits (OLMo 3: over 40 tokens, several windows, past YaRN's original context); the checkpoint we save reads back
    in transformers as the same model, and in ours."""
    hf, ours = pair(name, **kw)
    c = ours.config
    assert c.post_norms and c.qk_norm_full and c.float32_norm
    assert type(ours.model.layers[0].input_layernorm) is torch.nn.Identity
    if name == "Olmo3":
        sliding = [t == "sliding_attention" for t in hf.config.layer_types]
        assert c.rope_layers == tuple(not s for s in sliding) and c.local_rope_theta == 10000.0
        window = 6 if "sliding_window" not in kw else 0  # (a window past the context hides nothing)
        assert c.layer_windows == tuple(window if s else 0 for s in sliding)
        assert c.rope_type == "yarn" and c.rope_theta == 500000.0
    assert_every_path_matches(hf, ours)
    ours.save_pretrained(tmp_path)
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    assert type(back).__name__ == f"{name}ForCausalLM"
    for key in ("rope_parameters", "layer_types", "sliding_window", "attention_bias", "tie_word_embeddings",
                "rms_norm_eps", "num_key_value_heads"):
        assert getattr(back.config, key, None) == getattr(hf.config, key, None), key
    again = Llama.from_pretrained(tmp_path)
    for key in ("model_type", "rope_theta", "rope_scaling", "layer_windows", "rope_layers", "local_rope_theta",
                "attention_bias", "tie_word_embeddings"):
        assert getattr(again.config, key) == getattr(ours.config, key), key
    ids = torch.randint(0, 101, (2, 30), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        assert torch.equal(again(ids), ours(ids))
        assert (back(ids).logits - hf(ids).logits).abs().max().item() == 0


def test_the_norms_and_ropes_matter():
    """Each part the tests above check moves the results when it is wrong: OLMo 3's sliding layers taking the full
    layers' YaRN, a norm before the attention (which OLMo leaves out), per-head q/k norms instead of the whole
    projections' (the logits by far more than the tolerance); Llama's RMSNorm (the weight applied after rounding)
    instead of OLMo's float32 product (in bfloat16, where OLMo's norms give transformers' bits)."""
    from triforce.models.llama import Float32RMSNorm, RMSNorm

    ids = torch.randint(0, 101, (1, 40), generator=torch.Generator().manual_seed(2))
    hf, ours = pair("Olmo3")
    with torch.no_grad():
        ref = hf(ids).logits
        assert (ours(ids) - ref).abs().max().item() <= TOL
        local = ours.inv_freq_local
        ours.inv_freq_local = ours.inv_freq.clone()
        assert (ours(ids) - ref).abs().max().item() > 10 * TOL  # the full layers' RoPE everywhere
        ours.inv_freq_local = local
        layer = ours.model.layers[0]
        layer.input_layernorm = layer.post_attention_layernorm
        assert (ours(ids) - ref).abs().max().item() > 10 * TOL  # a pre-norm as well
    hf, ours = pair("Olmo2")
    x = torch.randn(64, 64, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    for name in ("post_attention_layernorm", "post_feedforward_layernorm", "self_attn.q_norm", "self_attn.k_norm"):
        theirs, mine = hf.model.layers[0].get_submodule(name), ours.model.layers[0].get_submodule(name)
        theirs, mine = theirs.to(torch.bfloat16), mine.to(torch.bfloat16)
        y = x[:, :mine.weight.numel()]
        assert type(mine) is Float32RMSNorm and torch.equal(mine(y), theirs(y)), name
        assert not torch.equal(RMSNorm.forward(mine, y), theirs(y)), name  # Llama's: the weight after rounding
    ours.model.layers[0].self_attn.full_qk_norm = False  # the per-head norm of Qwen3 instead of the whole row's
    ours.model.layers[0].self_attn.q_norm = RMSNorm(16, 1e-5)
    ours.model.layers[0].self_attn.k_norm = RMSNorm(16, 1e-5)
    with torch.no_grad():
        assert (ours(ids) - hf(ids).logits).abs().max().item() > 10 * TOL


@pytest.mark.parametrize("name", ["Olmo2", "Olmo3"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_pass_gives_the_bits_of_one_token_steps(name, dtype):
    assert_pass_equals_steps(pair(name)[1], dtype)


def test_defaults_and_bad_configs():
    """Configs without the keys take transformers' defaults (OLMo 3: three of four layers sliding over 4096 tokens,
    base 500000 on every layer); the keys OLMo's configs do not read raise."""
    for name in ("Olmo2", "Olmo3"):
        c = LlamaConfig.from_dict({**TINY, "model_type": name.lower()})
        want = getattr(transformers, f"{name}Config")(**TINY)
        assert c.rope_theta == want.to_dict().get("rope_theta", (want.rope_parameters.get("full_attention")
                                                                  or want.rope_parameters)["rope_theta"])
        assert (c.eos_token_id, c.pad_token_id, c.rms_norm_eps) == (50279, 1, 1e-5)
    c = LlamaConfig.from_dict({**TINY, "model_type": "olmo3", "max_position_embeddings": 8192, "num_hidden_layers": 8})
    assert c.layer_windows == (4096, 4096, 4096, 0) * 2 and c.rope_layers == (False, False, False, True) * 2
    assert c.local_rope_theta == c.rope_theta == 500000.0
    for bad, match in (({"model_type": "olmo2", "sliding_window": 4}, "'sliding_window'"),
                       ({"model_type": "olmo3", "sliding_window": None}, "'sliding_window'"),
                       ({"model_type": "olmo3", "rope_local_base_freq": 10.0}, "'rope_local_base_freq'"),
                       ({"model_type": "olmo3", "rope_parameters": {"full_attention": {"rope_type": "default"},
                                                                    "sliding_attention": YARN}}, "plain RoPE"),
                       ({"model_type": "olmo2", "head_dim": 8}, "head_dim \\* num_attention_heads"),
                       ({"model_type": "olmo2", "mlp_bias": True}, "'mlp_bias'")):
        with pytest.raises(ValueError, match=match):
            LlamaConfig.from_dict({**TINY, **bad})


def tiny_olmo(model_type, seed):
    extra = {"sliding_window": 10, "rope_local_base_freq": 1000.0} if model_type == "olmo3" else {}
    return tiny_family(model_type, seed, layers=4, rope_theta=50000.0, extra=extra)


@pytest.mark.parametrize("model_type", ["olmo2", "olmo3"])
@pytest.mark.parametrize("method,opts", TINY_CASES, ids=[f"{m}-{i}" for i, (m, _) in enumerate(TINY_CASES)])
def test_greedy_equals_autoregressive(model_type, method, opts):
    assert_greedy_equals_autoregressive(tiny_olmo(model_type, 0), tiny_olmo(model_type, 1), method, opts)


def test_heads_training_forward_equals_decoding():
    """The Hidden Transfer heads' training forward runs OLMo 3's layers (no norm before the attention, two RoPEs) as
    decoding does."""
    from .test_heads import assert_perturbed_heads_train_as_they_decode

    m = tiny_olmo("olmo3", 0)
    assert_perturbed_heads_train_as_they_decode(m)


def test_olmo3_gguf_with_yarn_as_newer_converters_write_it(tmp_path):
    """OLMo 3's long-context YaRN (on its full layers only) as llama-cpp-python 0.3.36's converter writes it: the
    rope.scaling keys with the checkpoint's attention_factor as rope.scaling.yarn_attn_factor, YaRN's own magnitude
    1 + 0.1 ln factor: the file loads as the model it was written from, bit for bit (and, opt-in, as llama.cpp runs
    it: tests/llama_cpp_oracle.py); with another attention factor it raises naming the key."""
    import math

    from .test_config import write_gguf

    config = LlamaConfig(model_type="olmo3", vocab_size=400, hidden_size=256, intermediate_size=512,
                         num_hidden_layers=5, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=512, rope_theta=500000.0, rms_norm_eps=1e-6,
                         rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16},
                         extra={"sliding_window": 8})
    torch.manual_seed(0)
    model = randomize_(Llama(config).eval())
    meta = {"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0, "rope.scaling.original_context_length": 16,
            "rope.scaling.yarn_beta_fast": 32.0, "rope.scaling.yarn_beta_slow": 1.0,
            "rope.scaling.yarn_attn_factor": 1 + 0.1 * math.log(4.0)}
    loaded = Llama.from_pretrained(write_gguf(tmp_path / "y.gguf", model, meta), cache_dir=False)
    assert loaded.config.rope_layers == config.rope_layers == (False, False, False, True, False)
    ids = torch.randint(0, 400, (2, 50), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert torch.equal(loaded(ids), model(ids))
    with pytest.raises(ValueError, match="olmo2.rope.scaling.yarn_attn_factor"):
        Llama.from_pretrained(write_gguf(tmp_path / "z.gguf", model, {**meta, "rope.scaling.yarn_attn_factor": 1.21}),
                              cache_dir=False)


@pytest.mark.parametrize("model_type", ["olmo2", "olmo3"])
def test_gguf_as_llama_cpp_writes_it(tmp_path, model_type):
    """An olmo2 GGUF as llama.cpp's converter writes OLMo 2 and OLMo 3 (NEOX RoPE, so q / k not permuted;
    post_attention_norm and post_ffw_norm after the blocks; OLMo 3: attention.sliding_window and its pattern, which
    llama.cpp fixes at three of every four layers sliding, those on plain RoPE at the file's base): in float32 it
    loads as the model it was written from, bit for bit; in K-quant and Q8_0 blocks its own blocks (gguf_copy) give
    the dequantised model's logits bitwise, and speculative decoding on them is lossless. A pattern other than
    llama.cpp's raises."""
    import numpy as np

    from .test_config import write_gguf
    from .test_families import QT, gguf_tokenizer, quantizer

    gguf = pytest.importorskip("gguf")
    olmo3 = model_type == "olmo3"
    config = LlamaConfig(model_type=model_type, vocab_size=400, hidden_size=256, intermediate_size=512,
                         num_hidden_layers=5, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=512, rope_theta=500000.0, rms_norm_eps=1e-6,
                         extra={"sliding_window": 8} if olmo3 else {})
    torch.manual_seed(0)
    model = randomize_(Llama(config).eval())
    ids = torch.randint(0, 400, (2, 50), generator=torch.Generator().manual_seed(3))
    tokenizer = gguf_tokenizer("dbrx", 400)
    exact = Llama.from_pretrained(write_gguf(tmp_path / "f.gguf", model, tokenizer=tokenizer), cache_dir=False)
    assert exact.config.model_type == model_type and exact.config.layer_windows == config.layer_windows
    assert exact.config.rope_layers == config.rope_layers and exact.config.local_rope_theta == config.local_rope_theta
    assert exact.state_dict().keys() == model.state_dict().keys()
    assert all(torch.equal(t, model.state_dict()[k]) for k, t in exact.state_dict().items())
    with torch.no_grad():
        assert torch.equal(exact(ids), model(ids))
    if olmo3:
        assert exact.config.layer_windows == (8, 8, 8, 0, 8)

    path = write_gguf(tmp_path / "m.gguf", model, quant=quantizer(np.random.default_rng(0)), tokenizer=tokenizer)
    reader = gguf.GGUFReader(str(path))
    assert {QT.Q4_K, QT.Q8_0} <= {t.tensor_type for t in reader.tensors}
    assert {t.name for t in reader.tensors if t.name.startswith("blk.0.")} == {
        f"blk.0.{n}.weight" for n in ("attn_q", "attn_k", "attn_v", "attn_output", "attn_q_norm", "attn_k_norm",
                                      "post_attention_norm", "post_ffw_norm", "ffn_gate", "ffn_up", "ffn_down")}
    ours = Llama.from_pretrained(path, cache_dir=False)
    with torch.no_grad():
        fast = triforce.models.gguf_copy(ours, path)
        assert torch.equal(fast(ids), ours(ids))
    prompts = [torch.randint(0, 400, (n,), generator=torch.Generator().manual_seed(n)) for n in (20, 33)]
    fast = triforce.models.gguf_copy(ours, path, activations="int8")
    ref = triforce.generate(fast, prompts, method="autoregressive", max_new_tokens=20)
    out = triforce.generate(fast, prompts, method="magicdec", max_new_tokens=20, gamma=3, sink=1, window=8)
    assert all(torch.equal(a, b) for a, b in zip(out.tokens, ref.tokens))
    if olmo3:
        other = write_gguf(tmp_path / "p.gguf", model, meta={"attention.sliding_window_pattern": [True, False] * 2
                                                                                                    + [True]})
        with pytest.raises(ValueError, match="sliding_window_pattern"):
            Llama.from_pretrained(other, cache_dir=False)


def test_configs_in_the_shape_allenai_ships_load():
    """OLMo 2 and OLMo 3 7B-shaped config.json dicts (transformers 4.x's spelling, the keys their checkpoints carry:
    OLMo 3's YaRN with an explicit attention_factor, its layer_types and window) read as transformers reads them."""
    common = {"attention_bias": False, "attention_dropout": 0.0, "eos_token_id": 100257, "hidden_act": "silu",
              "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 11008, "num_attention_heads": 32,
              "num_hidden_layers": 32, "num_key_value_heads": 32, "pad_token_id": 100277, "rms_norm_eps": 1e-06,
              "rope_theta": 500000, "tie_word_embeddings": False, "transformers_version": "4.57.0", "use_cache": True,
              "vocab_size": 100278}
    olmo2 = {**common, "architectures": ["Olmo2ForCausalLM"], "model_type": "olmo2", "max_position_embeddings": 4096,
             "rope_scaling": None, "torch_dtype": "float32"}
    yarn = {"attention_factor": 1.2079441541679836, "beta_fast": 32, "beta_slow": 1, "factor": 8.0,
            "original_max_position_embeddings": 8192, "rope_type": "yarn"}
    olmo3 = {**common, "architectures": ["Olmo3ForCausalLM"], "model_type": "olmo3", "max_position_embeddings": 65536,
             "layer_types": ["sliding_attention"] * 3 + ["full_attention"], "num_hidden_layers": 4,
             "rope_scaling": yarn, "sliding_window": 4096, "dtype": "bfloat16"}
    from triforce.models.rope import rope_attention_scale

    c = LlamaConfig.from_dict(olmo2)
    assert c.model_type == "olmo2" and c.rope_scaling is None and c.layer_windows == (0,) * 32
    c = LlamaConfig.from_dict(olmo3)
    theirs = transformers.Olmo3Config.from_dict(olmo3)
    assert theirs.rope_parameters["sliding_attention"] == {"rope_type": "default", "rope_theta": 500000}
    assert c.layer_windows == (4096, 4096, 4096, 0) and c.rope_layers == (False, False, False, True)
    assert c.local_rope_theta == 500000 and c.rope_type == "yarn"
    assert rope_attention_scale(c) == yarn["attention_factor"]
