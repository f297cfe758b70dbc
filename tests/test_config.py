"""Reading config.json and GGUF metadata: both transformers spellings of RoPE (4.x top-level
``rope_theta`` / ``rope_scaling``, 5.x ``rope_parameters``), parity with transformers on checkpoints it
saved itself, and a ValueError naming every key that would change the math but is not implemented."""
import json
import math
import shutil
import warnings

import numpy as np
import pytest
import torch

from triforce.models import Llama, LlamaConfig

from .test_model import TOL, tiny_model

transformers = pytest.importorskip("transformers")

TINY = dict(vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-5)
LLAMA3 = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
# YaRN: transformers' defaults; every optional key (an explicit attention factor, the betas, no truncation);
# DeepSeek's mscale / mscale_all_dim ratio for the attention factor
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 128}
YARN_ALL = {**YARN, "factor": 8.0, "original_max_position_embeddings": 64, "attention_factor": 1.3,
            "beta_fast": 16.0, "beta_slow": 2.0, "truncate": False}
YARN_MSCALE = {**YARN, "mscale": 0.7, "mscale_all_dim": 1.2}


def hf_checkpoint(directory, config_cls, model_cls, **kw):
    """A random tiny transformers model, saved by transformers itself (its own config.json spelling)."""
    torch.manual_seed(0)
    hf = model_cls(config_cls(**TINY, **kw, attn_implementation="eager")).eval()
    hf.save_pretrained(directory)
    return hf


def v4_spelling(cfg: dict) -> dict:
    """The same config as transformers 4.x wrote it: top-level rope_theta and rope_scaling."""
    cfg = dict(cfg)
    rope = dict(cfg.pop("rope_parameters"))
    cfg["rope_theta"] = rope.pop("rope_theta")
    cfg["rope_scaling"] = None if rope.get("rope_type") == "default" else rope
    return cfg


@pytest.mark.parametrize("family,kw,theta,scaling", [
    ("llama", {"rope_parameters": LLAMA3}, 500000.0,
     {"rope_type": "llama3", **{k: v for k, v in LLAMA3.items() if k not in ("rope_type", "rope_theta")}}),
    ("llama", {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}}, 10000.0,
     {"rope_type": "linear", "factor": 2.0}),
    ("llama", {"rope_parameters": {"rope_type": "default", "rope_theta": 1234.5}}, 1234.5, None),
    ("llama", {"rope_parameters": YARN}, 10000.0, {k: v for k, v in YARN.items() if k != "rope_theta"}),
    ("llama", {"rope_parameters": YARN_ALL}, 10000.0, {k: v for k, v in YARN_ALL.items() if k != "rope_theta"}),
    ("llama", {"rope_parameters": YARN_MSCALE}, 10000.0,
     {k: v for k, v in YARN_MSCALE.items() if k != "rope_theta"}),
    ("mistral", {"sliding_window": None, "rope_parameters": {"rope_type": "default", "rope_theta": 40000.0}},
     40000.0, None),
    ("mistral", {"sliding_window": 512}, 10000.0, None),  # a window as long as the context masks nothing
])
def test_transformers_checkpoint_matches_transformers(tmp_path, family, kw, theta, scaling):
    if family == "llama":
        hf = hf_checkpoint(tmp_path / "v5", transformers.LlamaConfig, transformers.LlamaForCausalLM, **kw)
    else:
        hf = hf_checkpoint(tmp_path / "v5", transformers.MistralConfig, transformers.MistralForCausalLM, **kw)
    saved = json.loads((tmp_path / "v5" / "config.json").read_text())
    assert "rope_parameters" in saved and "rope_theta" not in saved  # transformers 5 spelling on disk
    ours = Llama.from_pretrained(tmp_path / "v5")
    assert ours.config.rope_theta == theta and ours.config.rope_scaling == scaling
    ids = torch.randint(0, 101, (2, 80), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        got, ref = ours(ids), hf(ids).logits
    assert (got - ref).abs().max().item() <= TOL

    # the same checkpoint in the transformers 4.x spelling: transformers reads the same RoPE, and so do we
    (tmp_path / "v4").mkdir()
    shutil.copy(tmp_path / "v5" / "model.safetensors", tmp_path / "v4")
    (tmp_path / "v4" / "config.json").write_text(json.dumps(v4_spelling(saved)))
    assert transformers.AutoConfig.from_pretrained(tmp_path / "v4").rope_parameters == hf.config.rope_parameters
    old = Llama.from_pretrained(tmp_path / "v4")
    assert old.config == ours.config
    assert torch.equal(old(ids), got)


def test_llama3_rope_without_its_original_context_reads_as_transformers(tmp_path):
    # transformers 5 takes max_position_embeddings for a llama3 rope_parameters that leaves it out
    hf_checkpoint(tmp_path, transformers.LlamaConfig, transformers.LlamaForCausalLM, rope_parameters=LLAMA3)
    cfg = json.loads((tmp_path / "config.json").read_text())
    del cfg["rope_parameters"]["original_max_position_embeddings"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    ours = Llama.from_pretrained(tmp_path)
    assert ours.config.rope_scaling["original_max_position_embeddings"] == TINY["max_position_embeddings"]
    ids = torch.randint(0, 101, (1, 300), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert (ours(ids) - hf(ids).logits).abs().max().item() <= TOL


@pytest.fixture(scope="module")
def saved_config(tmp_path_factory):
    """config.json as transformers 5 writes it for a tiny Llama-3-style model (llama3 RoPE)."""
    d = tmp_path_factory.mktemp("cfg")
    transformers.LlamaConfig(**TINY, rope_parameters=dict(LLAMA3)).save_pretrained(d)
    cfg = json.loads((d / "config.json").read_text())
    assert LlamaConfig.from_dict(cfg).rope_scaling["factor"] == 8.0  # the unmodified config loads
    return cfg


def without(d, *keys):
    return {k: v for k, v in d.items() if k not in keys}


def rope(cfg, **changes):
    return {**cfg, "rope_parameters": {**cfg["rope_parameters"], **changes}}


@pytest.mark.parametrize("mutate,key", [
    (lambda c: rope(c, rope_type="yarn"), "not understood for rope_type 'yarn'"),  # llama3's keys left in
    (lambda c: {**c, "rope_parameters": {"rope_type": "dynamic"}}, "rope_type 'dynamic' needs factor"),
    (lambda c: {**without(v4_spelling(c), "rope_scaling"), "rope_scaling": {"type": "longrope", "factor": 4.0}},
     "rope_type 'longrope' needs short_factor"),
    (lambda c: {**c, "logits_scaling": 2.0}, "'logits_scaling'"),
    # biases are Llama / Qwen3 switches; Mistral's and Qwen2's transformers configs have no such key
    (lambda c: {**c, "model_type": "mistral", "attention_bias": True, "sliding_window": None},
     "'attention_bias' = True is not supported for model_type 'mistral'"),
    (lambda c: {**c, "model_type": "qwen3", "mlp_bias": True}, "'mlp_bias' = True is not supported"),
    (lambda c: {**c, "attention_bias": "yes"}, "attention_bias must be true or false"),
    (lambda c: {**c, "attention_dropout": 0.1}, "'attention_dropout'"),
    (lambda c: {**c, "hidden_act": "gelu"}, "'hidden_act'"),
    (lambda c: {**c, "partial_rotary_factor": 0.5}, "partial_rotary_factor"),
    (lambda c: rope(c, attention_factor=2.0), "'attention_factor'"),
    (lambda c: {**c, "rope_parameters": without(c["rope_parameters"], "low_freq_factor")}, "low_freq_factor"),
    (lambda c: {**c, "rope_theta": 10000.0}, "rope_theta"),  # disagrees with rope_parameters' 500000
    (lambda c: {**c, "rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "rope_parameters"),
    (lambda c: {**c, "original_max_position_embeddings": 128}, "original_max_position_embeddings"),
    # a sliding window that masks: Mistral's and Qwen's (test_layer_windows); Llama's config has none
    (lambda c: {**c, "sliding_window": 16}, "'sliding_window' = 16"),
    (lambda c: {**c, "model_type": "gemma", "hidden_act": "gelu", "sliding_window": 16}, "'sliding_window' = 16"),
    (lambda c: {**c, "model_type": "mistral", "sliding_window": 0}, "'sliding_window' = 0"),
    (lambda c: {**c, "model_type": "mistral", "sliding_window": 64.5}, "'sliding_window' = 64.5"),
    (lambda c: {**c, "quantization_config": {"quant_method": "bitsandbytes"}}, "'quantization_config'"),
    (lambda c: {**c, "model_type": "gemma3"}, "model_type 'gemma3'"),  # Gemma 3's vision + text wrapper
    # Gemma's activation is GELU's tanh form; another one would change the logits
    (lambda c: {**c, "model_type": "gemma", "hidden_act": "silu"}, "'hidden_act' = 'silu' is not supported"),
    (lambda c: {**c, "model_type": "gemma", "hidden_act": "gelu_pytorch_tanh", "hidden_activation": "gelu"},
     "'hidden_activation' = 'gelu'"),
    (lambda c: {**c, "hidden_activation": "gelu_pytorch_tanh"}, "'hidden_activation'"),  # Gemma's key only
    (lambda c: {**c, "model_type": "gemma", "hidden_act": "gelu", "use_bidirectional_attention": True},
     "'use_bidirectional_attention'"),
    # Qwen's sliding-window keys with values transformers would not read as a window
    (lambda c: {**c, "model_type": "qwen2", "use_sliding_window": "yes", "sliding_window": 64}, "sliding_window'"),
    (lambda c: {**c, "model_type": "qwen2", "use_sliding_window": True, "sliding_window": 64,
                "layer_types": ["sliding_attention"]}, "'layer_types'"),  # one per layer
    (lambda c: {**c, "model_type": "qwen2", "use_sliding_window": True, "sliding_window": 64,
                "layer_types": ["full_attention", "chunked_attention"]}, "'layer_types'"),
    (lambda c: {**c, "model_type": "qwen3", "use_sliding_window": True, "max_window_layers": "1"},
     "'max_window_layers'"),
    (lambda c: {**c, "use_sliding_window": False}, "'use_sliding_window'"),  # not a Llama key
    (lambda c: {**c, "rope_theta": None, "rope_parameters": None}, "rope_theta"),
])
def test_unsupported_config_keys_raise_naming_the_key(tmp_path, saved_config, mutate, key):
    (tmp_path / "config.json").write_text(json.dumps(mutate(saved_config)))
    with pytest.raises(ValueError, match=key):
        Llama.from_pretrained(tmp_path)


class _RunsCode:
    """An object whose unpickling would run a command (what a checkpoint must not be able to do)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        import os
        return os.system, (f"touch {self.marker}",)


def test_pytorch_bin_checkpoints_load_as_transformers(tmp_path):
    """Older checkpoints hold PyTorch pickles: ``pytorch_model.bin``, or shards named by
    ``pytorch_model.bin.index.json`` (JackFram/llama-68m, the TriForce paper's draft, is one). They load with
    transformers' logits, also in the legacy (pre-zip) format; safetensors win where both are present, as in
    transformers; a pickle that would build any object but tensors raises without running anything."""
    hf = hf_checkpoint(tmp_path / "st", transformers.LlamaConfig, transformers.LlamaForCausalLM)
    sd = {k: v.clone() for k, v in hf.state_dict().items()}
    ids = torch.randint(0, 101, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(ids).logits

    def folder(name):
        d = tmp_path / name
        d.mkdir()
        shutil.copy(tmp_path / "st" / "config.json", d)
        return d

    single, legacy, sharded = folder("single"), folder("legacy"), folder("sharded")
    torch.save(sd, single / "pytorch_model.bin")
    torch.save(sd, legacy / "pytorch_model.bin", _use_new_zipfile_serialization=False)
    names = sorted(sd)
    weight_map = {}
    for i, part in enumerate((names[:5], names[5:11], names[11:])):
        shard = f"pytorch_model-0000{i + 1}-of-00003.bin"
        torch.save({k: sd[k] for k in part}, sharded / shard)
        weight_map.update({k: shard for k in part})
    (sharded / "pytorch_model.bin.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    with torch.no_grad():
        got = Llama.from_pretrained(single)(ids)
        assert (got - ref).abs().max().item() <= TOL
        assert torch.equal(Llama.from_pretrained(legacy)(ids), got)
        assert torch.equal(Llama.from_pretrained(sharded)(ids), got)
        # beside model.safetensors a pytorch_model.bin is not read
        torch.save({k: torch.zeros_like(v) for k, v in sd.items()}, tmp_path / "st" / "pytorch_model.bin")
        assert torch.equal(Llama.from_pretrained(tmp_path / "st")(ids), got)
    marker = tmp_path / "ran"
    evil = folder("evil")
    torch.save({**sd, "model.norm.weight": _RunsCode(marker)}, evil / "pytorch_model.bin")
    with pytest.raises(ValueError, match="tensors only"):
        Llama.from_pretrained(evil)
    assert not marker.exists()
    notdict = folder("list")
    torch.save(list(sd.values()), notdict / "pytorch_model.bin")
    with pytest.raises(ValueError, match="not a state dict"):
        Llama.from_pretrained(notdict)
    missing = folder("missing")
    (missing / "pytorch_model.bin.index.json").write_text(json.dumps({"weight_map": {"a": "gone.bin"}}))
    with pytest.raises(FileNotFoundError, match="gone.bin"):
        Llama.from_pretrained(missing)


def test_a_tied_config_over_a_head_of_its_own_loads_as_transformers_5(tmp_path):
    """A config that ties the head, over a checkpoint holding a head of other values, is wrong about the checkpoint:
    transformers 5 keeps that head, untied, and warns; so here. A head equal to the embeddings (a PyTorch ``.bin``
    holds both, one storage) loads tied."""
    hf = hf_checkpoint(tmp_path / "own", transformers.LlamaConfig, transformers.LlamaForCausalLM)
    cfg = json.loads((tmp_path / "own" / "config.json").read_text())
    assert cfg["tie_word_embeddings"] is False
    (tmp_path / "own" / "config.json").write_text(json.dumps({**cfg, "tie_word_embeddings": True}))
    ids = torch.randint(0, 101, (2, 20), generator=torch.Generator().manual_seed(1))
    back = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "own", attn_implementation="eager").eval()
    assert back.lm_head.weight.data_ptr() != back.model.embed_tokens.weight.data_ptr()
    with pytest.warns(UserWarning, match="loaded untied"):
        ours = Llama.from_pretrained(tmp_path / "own")
    assert not ours.config.tie_word_embeddings
    with torch.no_grad():
        assert (ours(ids) - back(ids).logits).abs().max().item() <= TOL
        assert (ours(ids) - hf(ids).logits).abs().max().item() <= TOL
    tied = hf_checkpoint(tmp_path / "tied", transformers.LlamaConfig, transformers.LlamaForCausalLM,
                         tie_word_embeddings=True)
    (tmp_path / "tied" / "model.safetensors").unlink()
    torch.save(tied.state_dict(), tmp_path / "tied" / "pytorch_model.bin")  # (both keys, one storage)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ours = Llama.from_pretrained(tmp_path / "tied")
    assert ours.config.tie_word_embeddings and ours.lm_head.weight is ours.model.embed_tokens.weight
    with torch.no_grad():
        assert (ours(ids) - tied(ids).logits).abs().max().item() <= TOL


def test_transformers_saved_yarn_config_reads_as_transformers(tmp_path):
    """Without original_max_position_embeddings, yarn starts from max_position_embeddings (transformers 5); a
    top-level one (the 4.x spelling of Yarn-Llama-2's config) goes into the RoPE settings."""
    transformers.LlamaConfig(**TINY, rope_parameters={"rope_type": "yarn", "factor": 4.0}).save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert LlamaConfig.from_dict(saved).rope_scaling == {"rope_type": "yarn", "factor": 4.0,
                                                         "original_max_position_embeddings": 512}
    old = {**without(v4_spelling(saved), "rope_scaling"), "original_max_position_embeddings": 128,
           "rope_scaling": {"type": "yarn", "factor": 32.0, "finetuned": True}}
    assert LlamaConfig.from_dict(old).rope_scaling == {"rope_type": "yarn", "factor": 32.0, "finetuned": True,
                                                       "original_max_position_embeddings": 128}


def test_metadata_and_harmless_values_load(saved_config):
    # a transformers 4.x-era Llama config (generation defaults, torch_dtype, pretraining_tp) and
    # SmolLM2's extras: all leave the logits unchanged
    cfg = {**v4_spelling(saved_config), "torch_dtype": "bfloat16", "pretraining_tp": 1, "max_length": 20,
           "temperature": 0.7, "rope_interleaved": False, "is_llama_config": True,
           "transformers.js_config": {"kv_cache_dtype": {"q4f16": "float16"}}, "sliding_window": None,
           "original_max_position_embeddings": 64, "architectures": ["LlamaForCausalLM"]}
    config = LlamaConfig.from_dict(cfg)
    assert config.rope_theta == 500000.0 and config.rope_type == "llama3" and config.extra["torch_dtype"] == "bfloat16"
    assert LlamaConfig.from_dict(config.to_dict()) == config  # round trip
    mistral = LlamaConfig.from_dict({**cfg, "model_type": "mistral", "sliding_window": 512})
    assert mistral.extra["sliding_window"] == 512
    # every key of transformers' full (non-diff) to_dict(), as some tools write it
    full = LlamaConfig.from_dict(transformers.LlamaConfig(**TINY, rope_theta=3e4).to_dict())
    assert full.rope_theta == 3e4 and full.num_key_value_heads == 2
    full = LlamaConfig.from_dict(transformers.MistralConfig(**TINY, sliding_window=None).to_dict())
    assert full.max_position_embeddings == 512
    # MistralConfig's default window, 4096, on every layer
    assert LlamaConfig.from_dict(transformers.MistralConfig().to_dict()).layer_windows == (4096,) * 32
    # Qwen's default window (4096) masks nothing in a context of at most 4096; an explicit null is no window
    qwen = {**cfg, "model_type": "qwen2", "use_sliding_window": True, "max_window_layers": 0}
    del qwen["sliding_window"]
    assert LlamaConfig.from_dict({**qwen, "max_position_embeddings": 4096}).extra["use_sliding_window"]
    assert LlamaConfig.from_dict({**qwen, "max_position_embeddings": 8192, "sliding_window": None})


@pytest.mark.parametrize("family, keys, windows", [
    ("llama", {}, (0, 0, 0)),
    ("llama", {"sliding_window": None}, (0, 0, 0)),
    ("llama", {"sliding_window": 512}, (0, 0, 0)),  # at least the context: masks nothing
    ("mistral", {"sliding_window": 64}, (64, 64, 64)),
    ("mistral", {}, (0, 0, 0)),  # none given (config.json's missing key: test_a_missing_mistral_window_is_4096)
    ("mistral", {"sliding_window": None}, (0, 0, 0)),
    ("mistral", {"sliding_window": 8192}, (0, 0, 0)),
    ("qwen2", {"sliding_window": 64}, (0, 0, 0)),  # only with use_sliding_window
    ("qwen2", {"use_sliding_window": True, "sliding_window": 64}, (0, 0, 0)),  # max_window_layers 28
    ("qwen2", {"use_sliding_window": True, "sliding_window": 64, "max_window_layers": 1}, (0, 64, 64)),
    ("qwen2", {"use_sliding_window": True, "max_window_layers": 0}, (4096,) * 3),  # the default window
    ("qwen2", {"use_sliding_window": True, "max_window_layers": 0, "sliding_window": None}, (0, 0, 0)),
    ("qwen3", {"use_sliding_window": True, "sliding_window": 64,
               "layer_types": ["sliding_attention", "full_attention", "sliding_attention"]}, (64, 0, 64)),
    ("qwen3", {"use_sliding_window": False, "sliding_window": 64,
               "layer_types": ["sliding_attention", "full_attention", "sliding_attention"]}, (0, 0, 0)),
])
def test_layer_windows(family, keys, windows):
    """Each layer's sliding window as transformers 5 reads the keys (0: none; a window at least the context
    long is none)."""
    config = LlamaConfig(**{**TINY, "num_hidden_layers": 3, "max_position_embeddings": 512 if family == "llama"
                            else 8192}, model_type=family, extra=keys)
    assert config.layer_windows == windows
    assert LlamaConfig.from_dict(config.to_dict()).layer_windows == windows  # round trip


def test_a_missing_mistral_window_is_4096():
    """MistralConfig's default window applies to a config.json without the key, as transformers reads it."""
    d = LlamaConfig(**{**TINY, "max_position_embeddings": 8192}, model_type="mistral").to_dict()
    assert d["sliding_window"] is None
    del d["sliding_window"]
    assert LlamaConfig.from_dict(d).layer_windows == (4096, 4096)


def test_llama_config_checks_rope_scaling_and_extra():
    base = dict(TINY, rope_theta=500000.0)
    with_theta = LlamaConfig(**base, rope_scaling=dict(LLAMA3))  # transformers 5's rope_parameters as is
    assert with_theta.rope_scaling == {k: v for k, v in LLAMA3.items() if k != "rope_theta"}
    assert LlamaConfig(**base, rope_scaling={"rope_type": "default"}).rope_scaling is None
    with pytest.raises(ValueError, match="rope_theta"):
        LlamaConfig(**dict(TINY), rope_scaling=dict(LLAMA3))  # 500000 inside, 10000 outside
    with pytest.raises(ValueError, match="rope_type 'linear' and type 'llama3'"):
        LlamaConfig(**base, rope_scaling={**LLAMA3, "rope_type": "linear", "type": "llama3"})
    with pytest.raises(ValueError, match="'beta_fast'"):
        LlamaConfig(**base, rope_scaling={"rope_type": "linear", "factor": 2.0, "beta_fast": 32})
    with pytest.raises(ValueError, match="factor"):
        LlamaConfig(**base, rope_scaling={"rope_type": "linear", "factor": 0})
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}
    assert LlamaConfig(**base, rope_scaling={**yarn, "finetuned": True, "beta_fast": None}).rope_type == "yarn"
    with pytest.raises(ValueError, match="needs original_max_position_embeddings"):
        LlamaConfig(**base, rope_scaling={"rope_type": "yarn", "factor": 4.0})
    with pytest.raises(ValueError, match="attention_factor"):
        LlamaConfig(**base, rope_scaling={**yarn, "attention_factor": -1.0})
    with pytest.raises(ValueError, match="truncate.*true or false"):
        LlamaConfig(**base, rope_scaling={**yarn, "truncate": 1})
    with pytest.raises(ValueError, match="'low_freq_factor'"):
        LlamaConfig(**base, rope_scaling={**yarn, "low_freq_factor": 1.0})
    with pytest.raises(ValueError, match="'hidden_act'"):
        LlamaConfig(**base, extra={"hidden_act": "gelu"})
    with pytest.raises(ValueError, match="'mlp_bias' = True is not supported for model_type 'qwen2'"):
        LlamaConfig(**base, model_type="qwen2", mlp_bias=True)
    with pytest.raises(ValueError, match="model_type 'gemma3'"):  # Gemma 3's vision + text wrapper
        LlamaConfig(**base, model_type="gemma3")
    with pytest.raises(ValueError, match="'foo'"):
        LlamaConfig(**base, extra={"foo": 1})


# ---- GGUF metadata
def llama_cpp_permute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """llama.cpp's converter: half-split RoPE pairs -> interleaved pairs (what _unpermute inverts)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


_GGUF_ARCH = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma": "gemma",
              "gemma2": "gemma2", "gemma3_text": "gemma3", "smollm3": "smollm3", "granite": "granite",
              "mixtral": "llama", "qwen3_moe": "qwen3moe", "granitemoe": "granitemoe", "qwen2_moe": "qwen2moe",
              "olmoe": "olmoe", "granitemoeshared": "granitemoe", "gpt_oss": "gpt-oss", "olmo2": "olmo2",
              "olmo3": "olmo2"}
# the architectures whose q / k rows llama.cpp's converter permutes for interleaved RoPE pairs (its LlamaModel's)
_GGUF_PERMUTED = ("llama", "smollm3", "mistral3", "granite", "granitemoe", "arcee", "internlm2", "xverse",
                  "minicpm")
# gemma3's sandwich norms, as llama.cpp names them
_GGUF_SANDWICH_OUT = {"post_attention_layernorm": "post_attention_norm", "pre_feedforward_layernorm": "ffn_norm",
                      "post_feedforward_layernorm": "post_ffw_norm"}
_GGUF_OUT = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
             "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
             "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm", "mlp.gate": "ffn_gate_inp",
             "mlp.shared_expert_gate": "ffn_gate_inp_shexp", "mlp.shared_expert.gate_proj": "ffn_gate_shexp",
             "mlp.shared_expert.up_proj": "ffn_up_shexp", "mlp.shared_expert.down_proj": "ffn_down_shexp"}


def write_gguf(path, model, meta=None, drop=(), tensors=None, quant=None, tokenizer=None, arch=None):
    """A GGUF of ``model`` as llama.cpp's converter writes it (architecture from the config's model_type;
    llama's q/k rows permuted to interleaved RoPE pairs). ``meta`` adds/overrides <arch>.* keys, ``drop``
    removes some, ``tensors`` adds raw ones; ``quant(gguf_name, float32 array) -> (array, raw_dtype)``
    stores a tensor quantised (default float32); ``tokenizer``: tokenizer.ggml.* keys; ``arch``: another
    architecture name for the same tensors."""
    import gguf

    c = model.config
    arch = arch or _GGUF_ARCH[c.model_type]
    kv = {"block_count": c.num_hidden_layers, "context_length": c.max_position_embeddings,
          "embedding_length": c.hidden_size, "feed_forward_length": c.intermediate_size,
          "attention.head_count": c.num_attention_heads, "attention.head_count_kv": c.num_key_value_heads,
          "rope.freq_base": float(c.rope_theta), "attention.layer_norm_rms_epsilon": float(c.rms_norm_eps),
          "vocab_size": c.vocab_size, "rope.dimension_count": c.head_dim, "attention.key_length": c.head_dim,
          "attention.value_length": c.head_dim,
          **({} if c.experts is None else {"expert_count": c.experts.count, "expert_used_count": c.experts.top_k}),
          **({"expert_feed_forward_length": c.experts.intermediate_size}
             if c.model_type in ("qwen3_moe", "qwen2_moe") else {}),
          **({"expert_shared_feed_forward_length": c.experts.shared_intermediate_size}
             if c.model_type in ("qwen2_moe", "granitemoeshared") else {}),
          **({"expert_feed_forward_length": c.experts.intermediate_size,
              "attention.sliding_window": c.extra.get("sliding_window") or 0} if c.model_type == "gpt_oss" else {}),
          # OLMo 3: its window and its sliding layers (the converter's list; llama.cpp's pattern: every 4th full)
          **({"attention.sliding_window": c.extra["sliding_window"],
              "attention.sliding_window_pattern": [not r for r in c.rope_layers]} if c.model_type == "olmo3" else {}),
          **(meta or {})}
    w = gguf.GGUFWriter(str(path), arch)
    add = {str: w.add_string, bool: w.add_bool, float: w.add_float32, int: w.add_uint32}
    for k, v in kv.items():
        if k not in drop:
            (w.add_array if isinstance(v, list) else add[type(v)])(f"{arch}.{k}", v)
    for k, v in (tokenizer or {}).items():
        if isinstance(v, list):
            w.add_array(f"tokenizer.ggml.{k}", v)
        else:
            add[type(v)](f"tokenizer.ggml.{k}", v)
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    experts = {}  # a mixture of experts' projections: llama.cpp stacks each layer's as ffn_{gate,up,down}_exps
    for name, t in model.state_dict().items():
        t = t.detach().float()
        if ".mlp.experts." in name:
            _, _, i, _, _, e, proj, suffix = name.split(".")  # (suffix: weight, or gpt-oss's bias)
            halves = t.chunk(2) if proj == "gate_up_proj" else (t,)
            for kind, half in zip(("gate", "up") if len(halves) == 2 else ("down",), halves):
                experts.setdefault(f"blk.{i}.ffn_{kind}_exps.{suffix}", {})[int(e)] = half
            continue
        if name in names:
            out = names[name]
            if arch in ("gemma", "gemma2", "gemma3") and name == "model.norm.weight":
                t = t + 1
        else:
            _, _, i, rest = name.split(".", 3)
            module, kind = rest.rsplit(".", 1)
            own = _GGUF_SANDWICH_OUT.get(module) if arch in ("gemma2", "gemma3", "olmo2") else None
            if arch == "gpt-oss":  # its sinks, and the norm before the MLP as post_attention_norm
                own = {"post_attention_layernorm": "post_attention_norm"}.get(module)
                module, kind = (f"{module}.sinks", "weight") if kind == "sinks" else (module, kind)
                own = "attn_sinks" if module == "self_attn.sinks" else own
            out = f"blk.{i}.{own or _GGUF_OUT[module]}.{kind}"
            if module == "mlp.shared_expert_gate":
                t = t.reshape(-1)  # llama.cpp's {n_embd}
            if arch in ("gemma", "gemma2", "gemma3") and kind == "weight" and module.endswith("norm"):
                t = t + 1  # llama.cpp stores Gemma's norms as the factor they apply (gemma3: q/k norms too)
            if arch in _GGUF_PERMUTED and module == "self_attn.q_proj":
                t = llama_cpp_permute(t, c.num_attention_heads)
            elif arch in _GGUF_PERMUTED and module == "self_attn.k_proj":
                t = llama_cpp_permute(t, c.num_key_value_heads)
        if name == "lm_head.weight" and c.tie_word_embeddings:
            continue
        data, raw = quant(out, t.numpy()) if quant else (t.numpy(), None)
        w.add_tensor(out, data, raw_dtype=raw)
    for out, parts in experts.items():
        t = torch.stack([parts[e] for e in range(len(parts))])
        data, raw = quant(out, t.numpy()) if quant else (t.numpy(), None)
        w.add_tensor(out, data, raw_dtype=raw)
    for name, t in (tensors or {}).items():
        w.add_tensor(name, t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_gguf_round_trip_and_rope_scaling(tmp_path):
    model = tiny_model(rope_theta=20000.0)
    ids = torch.randint(0, 101, (1, 40))
    loaded = Llama.from_pretrained(write_gguf(tmp_path / "m.gguf", model), cache_dir=False)
    assert loaded.config.rope_theta == 20000.0 and loaded.config.rope_scaling is None
    assert torch.equal(loaded(ids), model(ids))
    # llama.cpp: a factor without a scaling type is linear scaling; "none" switches it off
    scaled = Llama.from_pretrained(write_gguf(tmp_path / "s.gguf", model, {"rope.scaling.factor": 4.0}),
                                   cache_dir=False)
    assert scaled.config.rope_scaling == {"rope_type": "linear", "factor": 4.0}
    ref = Llama(scaled.config).eval()
    ref.load_state_dict(model.state_dict())
    assert torch.equal(scaled(ids), ref(ids))
    assert (scaled(ids) - model(ids)).abs().max() > 1e-3  # the factor reached the RoPE
    plain = write_gguf(tmp_path / "n.gguf", model, {"rope.scaling.type": "none", "rope.scaling.finetuned": False})
    assert Llama.from_pretrained(plain, cache_dir=False).config.rope_scaling is None
    # yarn, as llama.cpp's converter writes it (Yarn-Llama-2, Qwen2.5 with YaRN): the factor over the original
    # context; its betas when given; the original context defaults to the file's context length
    meta = {"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0, "rope.scaling.original_context_length": 128,
            "rope.scaling.finetuned": True, "rope.scaling.yarn_ext_factor": 1.0}
    yarn = Llama.from_pretrained(write_gguf(tmp_path / "y.gguf", model, meta), cache_dir=False)
    assert yarn.config.rope_scaling == {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128}
    ref = Llama(yarn.config).eval()
    ref.load_state_dict(model.state_dict())
    assert torch.equal(yarn(ids), ref(ids)) and (yarn(ids) - model(ids)).abs().max() > 1e-3
    betas = {"rope.scaling.type": "yarn", "rope.scaling.factor": 8.0, "rope.scaling.yarn_beta_fast": 16.0,
             "rope.scaling.yarn_beta_slow": 2.0}
    assert Llama.from_pretrained(write_gguf(tmp_path / "b.gguf", model, betas), cache_dir=False).config.rope_scaling \
        == {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 512, "beta_fast": 16.0,
            "beta_slow": 2.0}
    # the converter's copy of the checkpoint's attention_factor, where it is YaRN's own magnitude (llama.cpp's)
    own = write_gguf(tmp_path / "a.gguf", model, {**meta, "rope.scaling.yarn_attn_factor": 1 + 0.1 * math.log(4.0)})
    assert torch.equal(Llama.from_pretrained(own, cache_dir=False)(ids), yarn(ids))


@pytest.mark.parametrize("meta,drop,tensors,key", [
    ({"rope.scaling.type": "longrope", "rope.scaling.factor": 4.0}, (), None, "llama.rope.scaling.type"),
    ({"rope.scaling.type": "yarn", "rope.scaling.factor": 1.0}, (), None, "llama.rope.scaling.factor"),
    ({"rope.scaling.yarn_ext_factor": 1.0}, (), None, "llama.rope.scaling.yarn_ext_factor"),  # without yarn
    ({"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0, "rope.scaling.yarn_log_multiplier": 0.1}, (), None,
     "llama.rope.scaling.yarn_log_multiplier"),
    ({"rope.scaling.type": "none", "rope.scaling.factor": 4.0}, (), None, "llama.rope.scaling.factor"),
    ({"attention.clamp_kqv": 8.0}, (), None, "llama.attention.clamp_kqv"),
    ({"rope.dimension_count": 8}, (), None, "llama.rope.dimension_count"),
    ({"rope.scaling.attn_factor": 2.0}, (), None, "llama.rope.scaling.attn_factor"),
    ({"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0, "rope.scaling.yarn_attn_factor": 1.2}, (), None,
     "llama.rope.scaling.yarn_attn_factor"),  # (1 + 0.1 ln 4 = 1.1386: llama.cpp would run that, not 1.2)
    ({"rope.scaling.yarn_attn_factor": 1.0}, (), None, "llama.rope.scaling.yarn_attn_factor"),  # without yarn
    ({"attention.sliding_window": 64}, (), None, "llama.attention.sliding_window"),
    ({"expert_count": 4}, (), None, "llama.expert_count"),
    ({}, ("context_length",), None, "llama.context_length"),
    ({}, ("attention.layer_norm_rms_epsilon",), None, "llama.attention.layer_norm_rms_epsilon"),
    ({}, (), {"blk.0.attn_qkv.weight": np.zeros((192, 64), np.float32)}, "blk.0.attn_qkv.weight"),
    ({}, (), {"blk.0.attn_q.bias": np.zeros(64, np.float32)}, "self_attn.k_proj.bias"),  # a q bias alone: k/v/o missing
])
def test_gguf_unsupported_metadata_raises_naming_the_key(tmp_path, meta, drop, tensors, key):
    path = write_gguf(tmp_path / "m.gguf", tiny_model(), meta, drop, tensors)
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        Llama.from_pretrained(path, cache_dir=False)


def test_no_dict_literal_in_the_config_module_names_a_key_twice():
    """A dict literal naming a key twice keeps the last entry only: DBRX's resid_pdrop once replaced Phi-2's and
    Phi-3's in ``_HARMLESS_ONLY_AT`` (their configs then raised). Every dict literal of triforce/models/config.py,
    its ``**{key: ... for key in KEYS}`` expansions included, names each key once."""
    import ast
    import collections

    import triforce.models.config as module

    tree = ast.parse(open(module.__file__).read())
    checked = 0
    for node in ast.walk(tree):
        if not isinstance(node, ast.Dict):
            continue
        keys = []
        for k, v in zip(node.keys, node.values):
            if k is None and isinstance(v, ast.DictComp) and len(v.generators) == 1:
                try:  # (a module-level expansion: its keys; one inside a function is not a table)
                    keys += list(eval(ast.unparse(v.generators[0].iter), vars(module)))
                except NameError:
                    pass
            elif isinstance(k, ast.Constant):
                keys.append(k.value)
        checked += len(keys)
        assert not [k for k, n in collections.Counter(keys).items() if n > 1], node.lineno
    assert checked > 500


@pytest.mark.parametrize("model_type,key,value,reads", [
    ("phi3", "resid_pdrop", 0.0, True), ("phi3", "resid_pdrop", 0.1, False), ("phi", "resid_pdrop", 0.1, True),
    ("dbrx", "resid_pdrop", 0.1, True), ("phi3", "embd_pdrop", 0.0, True), ("dbrx", "emb_pdrop", 0.1, True),
    ("llama", "resid_pdrop", 0.0, False)])
def test_the_dropouts_each_family_reads(model_type, key, value, reads):
    """Training-only dropouts read where the family has them (Phi-3's at 0 only: its configs say 0.0)."""
    from .test_dbrx import DBRX_INSTRUCT

    d = {**(DBRX_INSTRUCT if model_type == "dbrx" else {"model_type": model_type}), key: value}
    if reads:
        assert LlamaConfig.from_dict(d).extra[key] == value
    else:
        with pytest.raises(ValueError, match=key):
            LlamaConfig.from_dict(d)


def test_a_familys_key_check_never_replaces_anothers():
    """A key's check is added once (config._add_checks raises for a key it has: the bug that refused StarCoder 2's
    embedding_dropout when ModernBERT decoder's replaced it); a second family's values go through _also, and both
    families' values pass."""
    from triforce.models import config as config_mod

    with pytest.raises(RuntimeError, match="exist already"):
        config_mod._add_checks({"embedding_dropout": (lambda v, c: True, "anything")})
    for model_type in ("starcoder2", "modernbert-decoder"):
        assert LlamaConfig.from_dict({"model_type": model_type, "embedding_dropout": 0.1}).extra["embedding_dropout"] \
            == 0.1
