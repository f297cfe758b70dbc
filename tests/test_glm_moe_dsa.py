"""GLM-5 (``model_type="glm_moe_dsa"``): DeepSeek-V3.2's layer (the latent attention, DeepSeek's sparse attention, V3's
router) under GLM's name, its indexer's RoPE on adjacent pairs of dims (reordered on loading), and layers that attend
to the keys the previous full layer chose (``indexer_types`` "shared": no indexer of their own); against
transformers' GlmMoeDsaForCausalLM on the same weights."""
import pytest
import torch

from triforce.models import FullCache, LlamaConfig
from triforce.models.llama import Indexer

from .test_deepseek import tiny_deepseek, transformers_pair
from .test_deepseek_v32 import BASE, V32
from .test_engines import TINY_CASES, assert_greedy_equals_autoregressive
from .test_model import TOL
from .test_moe import assert_checkpoint_directories_both_ways
from .test_sliding_window import assert_every_path_matches, assert_pass_equals_steps

transformers = pytest.importorskip("transformers")

# DeepSeek-V3.2's tiny model (tests/test_deepseek_v32.py) in 4 layers: the first and last choose their keys, the second
# and third attend to the first's choice
CASES = {
    "shared": dict(num_hidden_layers=4, indexer_types=["full", "shared", "shared", "full"]),
    # by index_topk_freq / index_skip_topk_offset (transformers' schedule: full, full, shared, full, shared), 24 keys
    "schedule": dict(num_hidden_layers=5, index_topk_freq=2, index_skip_topk_offset=2, index_topk=24,
                     index_head_dim=32),
}


def pair(case="shared", **kw):
    """transformers' GlmMoeDsaForCausalLM of ``case`` (random weights, decisive routers, random correction biases)
    and ours on its weights."""
    return transformers_pair("GlmMoeDsa", {**BASE, **CASES[case], **kw})


@pytest.mark.parametrize("case", list(CASES))
def test_logits_and_every_path_match_transformers(case):
    """The plain forward (through a full cache, which keeps the choice for the shared layers), a chunked prefill, a
    verify pass, steps and a tree give transformers' logits; the shared layers have no indexer; the config reads
    back in transformers as the same model."""
    hf, ours = pair(case)
    shared = [t == "shared" for t in hf.config.indexer_types]
    assert any(shared) and list(ours.config.dsa.shared) == shared and ours.config.dsa.rope_interleaved
    assert [getattr(layer.self_attn, "indexer", None) is None for layer in ours.model.layers] == shared
    assert all(type(layer.self_attn.indexer) is Indexer for layer, s in zip(ours.model.layers, shared) if not s)
    assert_every_path_matches(hf, ours)
    back = transformers.GlmMoeDsaConfig.from_dict(ours.config.to_dict())
    for key in ("indexer_types", "index_topk", "index_head_dim", "index_n_heads", "mlp_layer_types", "q_lora_rank"):
        assert getattr(back, key) == getattr(hf.config, key), key


def test_each_part_matters():
    """The shared layers' choice (their dense attention instead) and the indexer's RoPE order (the checkpoint's
    adjacent pairs taken as half-split) each move the logits far past the tests' tolerance."""
    hf, _ = pair()
    ids = torch.randint(0, 101, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(ids).logits
        _, dense = pair()
        for layer in dense.model.layers:
            layer.self_attn.dsa = not layer.self_attn.shares_choice
        assert (dense(ids) - ref).abs().max().item() > 100 * TOL
        _, unordered = pair()
        r, D = unordered.config.mla.qk_rope_head_dim, unordered.config.dsa.head_dim
        back = torch.cat([torch.argsort(torch.tensor([*range(0, r, 2), *range(1, r, 2)])), torch.arange(r, D)])
        for layer in unordered.model.layers:
            indexer = getattr(layer.self_attn, "indexer", None)
            if indexer is not None:
                w = indexer.wq_b.weight
                w.copy_(w.view(-1, D, w.shape[-1])[:, back].reshape(w.shape))
                for t in (indexer.wk.weight, indexer.k_norm.weight, indexer.k_norm.bias):
                    t.copy_(t[back])
        assert (unordered(ids) - ref).abs().max().item() > 100 * TOL


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_pass_gives_the_bits_of_one_token_steps(dtype):
    assert_pass_equals_steps(pair("schedule")[1], dtype)


def test_checkpoint_directories_both_ways(tmp_path):
    """A checkpoint transformers saved (no indexer on the shared layers, the indexer's RoPE rows in adjacent pairs)
    loads with its logits; ours saves the same names in the checkpoint's order, which transformers reads back
    bitwise as the same model."""
    assert_checkpoint_directories_both_ways(tmp_path, pair()[0])


def test_the_full_cache_holds_index_keys_for_the_full_layers_only():
    _, ours = pair()
    cache = FullCache(ours.config, 2, 16)
    assert [t is None for t in cache.index_k] == list(ours.config.dsa.shared)


@pytest.mark.parametrize("method,opts", TINY_CASES, ids=[f"{m}-{i}" for i, (m, _) in enumerate(TINY_CASES)])
def test_greedy_equals_autoregressive(method, opts):
    """Every method emits autoregressive decoding's tokens (a shared last layer; trees, passes and steps)."""
    assert_greedy_equals_autoregressive(tiny_deepseek("glm_moe_dsa", 0), tiny_deepseek("glm_moe_dsa", 1), method,
                                        opts)


# GLM-5's config.json keys as GlmMoeDsaConfig's defaults have them (zai-org/GLM-5: 78 layers, an indexer of 32 heads)
GLM5 = {**{k: v for k, v in V32.items() if k not in ("quantization_config", "num_nextn_predict_layers")},
        "architectures": ["GlmMoeDsaForCausalLM"], "model_type": "glm_moe_dsa", "vocab_size": 154880,
        "hidden_size": 6144, "intermediate_size": 12288, "moe_intermediate_size": 2048, "num_hidden_layers": 78,
        "num_attention_heads": 64, "num_key_value_heads": 64, "q_lora_rank": 2048, "qk_nope_head_dim": 192,
        "v_head_dim": 256, "n_group": 1, "topk_group": 1, "max_position_embeddings": 202752, "rms_norm_eps": 1e-5,
        "index_n_heads": 32, "rope_scaling": None, "rope_theta": 1000000}


def test_the_published_shape_loads():
    """GLM-5's shape reads as transformers reads it: every layer full by default, the first three dense."""
    c = LlamaConfig.from_dict(GLM5)
    assert c.dsa.shared == (False,) * 78 and c.dsa.n_heads == 32 and c.dsa.rope_interleaved
    assert c.experts.layers == (False,) * 3 + (True,) * 75 and c.head_dim == 576
    theirs = transformers.GlmMoeDsaConfig.from_dict({**GLM5, "num_hidden_layers": 1})
    assert theirs.index_n_heads == 32
    saved = c.to_dict()
    assert LlamaConfig.from_dict(saved).to_dict() == saved


@pytest.mark.parametrize("change", [
    dict(indexer_types=["shared"] + ["full"] * 77),
    dict(indexer_types=["full"] * 77),
    dict(indexer_types=["full", "other"] + ["full"] * 76),
    dict(index_topk_pattern="FX" + "F" * 76),
])
def test_bad_indexer_types_raise(change):
    """One 'full' or 'shared' per layer, the first full (a shared layer needs a choice before it)."""
    with pytest.raises(ValueError, match="indexer_types"):
        LlamaConfig.from_dict({**GLM5, **change})


@pytest.mark.parametrize("case", list(CASES))
def test_gguf_glm_dsa_as_llama_cpp_writes_it(tmp_path, case):
    """A glm-dsa GGUF (llama.cpp's converter: deepseek2's tensors, the indexer's, its layers' kinds as
    attention.indexer.types) loads as its checkpoint's model (the indexer's RoPE rows in the file's adjacent pairs,
    reordered on loading): transformers' logits, the conversion cache read back, the blocks bitwise."""
    from .test_deepseek import _GGUF_WIDTHS, assert_grouped_gguf_loads

    # (index_head_dim a multiple of 64: llama.cpp's Hadamard rotation of the indexer's; rms_norm_eps 1e-6: llama.cpp
    # takes the file's eps for the latent norms too, the checkpoint's model DeepSeek's 1e-6, docs/model.md, as for
    # GLM-4.7-Flash's deepseek2 files: at GLM-5's 1e-5 llama.cpp's logits differ by ~1e-4, every key or a choice)
    hf, ours = pair(case, **_GGUF_WIDTHS, index_head_dim=64, rms_norm_eps=1e-6)
    loaded = assert_grouped_gguf_loads(tmp_path, hf, ours, "glm-dsa")
    assert loaded.config.dsa == ours.config.dsa


def test_gguf_glm_dsa_without_its_indexer_types_reads_llama_cpps(tmp_path):
    """A glm-dsa file without attention.indexer.types: every layer full below a 1M context (GLM-5, 5.1), GLM-5.2's
    published pattern from 1M on (its first two layers and every fourth from the third), as llama.cpp reads them."""
    from triforce.models.loading import read_gguf

    from .test_deepseek import _GGUF_WIDTHS, write_grouped_gguf

    hf, _ = pair(num_hidden_layers=7, indexer_types=None, **_GGUF_WIDTHS)
    config, _ = read_gguf(write_grouped_gguf(tmp_path / "a.gguf", hf, "glm-dsa", drop=("attention.indexer.types",)))
    assert config.dsa.shared == (False,) * 7
    config, _ = read_gguf(write_grouped_gguf(tmp_path / "b.gguf", hf, "glm-dsa", drop=("attention.indexer.types",),
                                             meta={"context_length": 1 << 20}))
    assert config.dsa.shared == (False, False, False, True, True, True, False)
