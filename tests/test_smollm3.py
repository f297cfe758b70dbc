"""SmolLM3 (``model_type="smollm3"``): Llama's layer with no RoPE on every fourth layer (NoPE), against
transformers' SmolLM3ForCausalLM; its GGUF files as llama.cpp writes and runs them."""
import dataclasses

import pytest
import torch

import triforce
from triforce.models import Llama, LlamaConfig, StreamingCache

from .test_config import write_gguf
from .test_engines import TINY_CASES, assert_greedy_equals_autoregressive
from .test_families import TINY, randomize_, transformers_and_ours
from .test_model import TOL
from .test_sliding_window import assert_every_path_matches, assert_pass_equals_steps

transformers = pytest.importorskip("transformers")

# 4 layers: the 4th without RoPE (SmolLM3Config's default interval 4), YaRN on the others
SMOLLM3 = dict(TINY, num_hidden_layers=4, rope_theta=5e6, tie_word_embeddings=True,
               rope_scaling={"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 256},
               bos_token_id=1, eos_token_id=2, pad_token_id=None)


def pair(**kw):
    return transformers_and_ours("SmolLM3", **{**SMOLLM3, **kw})


@pytest.mark.parametrize("kw, rope_layers, windows", [
    ({}, (True, True, True, False), (0, 0, 0, 0)),
    ({"no_rope_layers": [0, 1, 0, 1]}, (False, True, False, True), (0, 0, 0, 0)),
    ({"no_rope_layer_interval": 2, "use_sliding_window": True, "sliding_window": 5},
     (True, False, True, False), (0, 5, 0, 5)),  # windows on the NoPE layers, as SmolLM3Config puts them
])
def test_logits_and_every_path_match_transformers(kw, rope_layers, windows):
    """Plain forward, chunked prefill, verify pass, steps and a tree over the cache give transformers' logits;
    the NoPE layers take neither RoPE nor YaRN's factor on it."""
    hf, ours = pair(**kw)
    assert ours.config.rope_layers == rope_layers and ours.config.layer_windows == windows
    assert_every_path_matches(hf, ours)
    # our config reads back in transformers as the same model
    back = transformers.SmolLM3Config.from_dict(ours.config.to_dict())
    assert back.no_rope_layers == hf.config.no_rope_layers and back.layer_types == hf.config.layer_types


def test_the_nope_layers_matter():
    """Rotating every layer (a Llama of the same weights) moves the logits: the test above would see it."""
    hf, ours = pair()
    llama = Llama(dataclasses.replace(ours.config, model_type="llama", extra={})).eval()
    llama.load_state_dict(ours.state_dict())
    ids = torch.randint(0, 101, (1, 30), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert (llama(ids) - hf(ids).logits).abs().max().item() > 1e-3


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_pass_gives_the_bits_of_one_token_steps(dtype):
    assert_pass_equals_steps(pair()[1], dtype)


def test_save_pretrained_round_trip(tmp_path):
    hf, ours = pair(no_rope_layers=[1, 0, 1, 0])
    ours.save_pretrained(tmp_path)
    back = transformers.SmolLM3ForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    ids = torch.randint(0, 101, (2, 20), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        assert (back(ids).logits - hf(ids).logits).abs().max().item() <= TOL
    assert Llama.from_pretrained(tmp_path).config.rope_layers == (True, False, True, False)


@pytest.mark.parametrize("bad, match", [
    ({"no_rope_layers": [1, 1, 1]}, "'no_rope_layers'"),  # one per layer
    ({"no_rope_layers": [1, 2, 1, 1]}, "'no_rope_layers'"),
    ({"no_rope_layer_interval": 0}, "'no_rope_layer_interval'"),
    ({"max_window_layers": 2, "use_sliding_window": True, "sliding_window": 5}, "'max_window_layers'"),
    ({"model_type": "llama", "no_rope_layers": [1, 1, 1, 0]}, "'no_rope_layers'"),  # SmolLM3's key only
])
def test_bad_configs_raise(bad, match):
    with pytest.raises(ValueError, match=match):
        LlamaConfig.from_dict({**SMOLLM3, "model_type": "smollm3", **bad})


def tiny_smollm3(seed):
    torch.manual_seed(seed)
    cfg = LlamaConfig(model_type="smollm3", vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024, rope_theta=1e4,
                      extra={"no_rope_layer_interval": 2}, initializer_range=0.3)
    return Llama(cfg).eval()


@pytest.mark.parametrize("method,opts", TINY_CASES, ids=[f"{m}-{i}" for i, (m, _) in enumerate(TINY_CASES)])
def test_greedy_equals_autoregressive(method, opts):
    assert_greedy_equals_autoregressive(tiny_smollm3(0), tiny_smollm3(1), method, opts)


def test_streaming_cache_leaves_the_nope_layers_keys_unrotated():
    """A StreamingLLM cache re-rotates its keys to their StreamingLLM positions on the RoPE layers; on the NoPE
    layers every key stays as the projection gave it."""
    model = tiny_smollm3(0)
    ids = torch.randint(0, 64, (1, 40), generator=torch.Generator().manual_seed(5))
    cache = StreamingCache(model.config, 1, sink=2, window=9, max_step=4)
    with torch.no_grad():
        for i in range(0, 40, 3):
            model(ids[:, i:i + 3], cache=cache)
    assert int(cache.evicted[0]) > 0
    n = int(cache.lengths[0])
    for layer, rope in enumerate(model.config.rope_layers):
        same = torch.equal(cache.k[layer][:, :n], cache.k_raw[layer][:, :n])
        assert same != rope, layer


def test_gguf_file_loads_as_llama_cpp_runs_it(tmp_path):
    """A smollm3 GGUF (llama's tensor names, q / k permuted as for llama): every 4th layer without RoPE, as
    llama.cpp's fixed n_no_rope_layer_step has it; the logits of the model it was written from."""
    model = tiny_smollm3(0)
    model.config.extra.clear()  # the default interval, 4, which is llama.cpp's
    model = Llama(LlamaConfig.from_dict(model.config.to_dict())).eval()
    torch.manual_seed(1)
    randomize_(model)
    loaded = Llama.from_pretrained(write_gguf(tmp_path / "s.gguf", model), cache_dir=False)
    assert loaded.config.model_type == "smollm3" and loaded.config.rope_layers == (True, True, True, False)
    ids = torch.randint(0, 64, (2, 24), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        assert (loaded(ids) - model(ids)).abs().max().item() <= TOL
        out = triforce.generate(loaded, [ids[0]], method="magicdec", max_new_tokens=12, gamma=3, sink=1, window=8)
        ref = triforce.generate(loaded, [ids[0]], method="autoregressive", max_new_tokens=12)
    assert torch.equal(out.tokens[0], ref.tokens[0]) and out.stats["acceptance"]


@pytest.mark.parametrize("family", ["smollm3", "gemma3_text"])
def test_rope_parameters_base_wins_over_the_family_default(family):
    """transformers 5 writes the RoPE base inside rope_parameters only: a family's default base (SmolLM3's 2e6,
    Gemma 3's 1e6) fills a config without one, and must not then disagree with the one it has (which raised)."""
    d = {**TINY, "model_type": family, "rope_parameters": {"rope_type": "default", "rope_theta": 12345.0}}
    assert LlamaConfig.from_dict(d).rope_theta == 12345.0
    assert LlamaConfig.from_dict({**TINY, "model_type": family}).rope_theta == \
        {"smollm3": 2e6, "gemma3_text": 1e6}[family]


def test_a_layer_skip_draft_keeps_its_layers_rope():
    """A draft of the target's first layers (``layer_skip``, the engines' ``draft_layers``) of a config that lists
    its NoPE layers keeps those layers' choice; its greedy speculative output is the target's."""
    model = tiny_smollm3(0)
    model.config.extra.clear()
    cfg = LlamaConfig.from_dict({**model.config.to_dict(), "no_rope_layers": [1, 0, 1, 0]})
    target = Llama(cfg).eval()
    target.load_state_dict(model.state_dict())
    draft = target.layer_skip(2)
    assert draft.config.rope_layers == (True, False)
    prompts = [torch.randint(0, 64, (n,), generator=torch.Generator().manual_seed(n)) for n in (20, 33)]
    ref = triforce.generate(target, prompts, method="autoregressive", max_new_tokens=16)
    out = triforce.generate(target, prompts, method="speculative", draft_layers=2, gamma=3, max_new_tokens=16)
    assert all(torch.equal(a, b) for a, b in zip(out.tokens, ref.tokens))
