"""Falcon (``model_type="falcon"``: falcon-7b / 40b / 180b and their instruct models): torch's LayerNorm with a bias,
an ungated MLP of the exact GELU, one ``bias`` key for every projection, RoPE over the whole head, q / k / v as one
``query_key_value`` in one of three layouts (the new architecture's KV groups, multi-query, per head), the attention
and the MLP in parallel on one norm or two (or in sequence); Falcon-RW's ALiBi instead of RoPE (``alibi``). Against
transformers' FalconForCausalLM."""
import pytest
import torch

from triforce.models import LlamaConfig

from .test_engines import TINY_CASES, assert_greedy_equals_autoregressive
from .test_families import TINY, assert_saved_reads_back, tiny_family, transformers_and_ours
from .test_model import TOL
from .test_sliding_window import assert_every_path_matches, assert_pass_equals_steps

transformers = pytest.importorskip("transformers")

BASE = {k: v for k, v in TINY.items() if k not in ("intermediate_size", "num_key_value_heads", "rms_norm_eps")}
CASES = {  # name -> (config keys, KV heads, parallel block, two norms)
    "7b-multi-query": ({}, 1, True, False),
    "mha-biases": (dict(multi_query=False, bias=True), 4, True, False),
    "40b-grouped-two-norms": (dict(new_decoder_architecture=True, num_kv_heads=2, bias=True), 2, True, True),
    "grouped-one-norm": (dict(new_decoder_architecture=True, num_kv_heads=2, num_ln_in_parallel_attn=1), 2, True,
                         False),
    "sequential-untied": (dict(parallel_attn=False, ffn_hidden_size=96, tie_word_embeddings=False), 1, False, False),
}


# Falcon-RW (alibi: ALiBi instead of RoPE): falcon-rw-1b's layout (per head, sequential, biases), and ALiBi on the 7b's
# multi-query parallel block (6 heads: slopes whose products with the positions bfloat16 holds exactly, as
# transformers rounds them). Against transformers' SDPA path: its eager one adds the bias twice (in the attention and
# in the mask it builds), which the RW code and the SDPA path do not
RW_CASES = {"rw-1b": (dict(alibi=True, multi_query=False, parallel_attn=False, bias=True), 4, False, False),
            "rw-multi-query-parallel-6-heads": (dict(alibi=True, hidden_size=48, num_attention_heads=6), 1, True,
                                                False)}
CASES.update(RW_CASES)


def pair(case):
    sdpa = {"attn_implementation": "sdpa"} if case in RW_CASES else {}
    return transformers_and_ours("Falcon", **{**BASE, "layer_norm_epsilon": 1e-3, **CASES[case][0], **sdpa})


@pytest.mark.parametrize("case", list(CASES))
def test_every_path_and_our_save_match_transformers(tmp_path, case):
    hf, ours = pair(case)
    _, kv, parallel, norms = CASES[case]
    c = ours.config
    assert (c.num_key_value_heads, c.parallel_block, c.parallel_norms) == (kv, parallel, norms)
    assert c.activation == "gelu" and not c.gated_mlp and c.rms_norm_eps == 1e-3
    assert (c.alibi_slopes is not None) == (case in RW_CASES) and all(c.rope_layers) == (case not in RW_CASES)
    assert_every_path_matches(hf, ours)
    assert_saved_reads_back(tmp_path, hf, ours)


@pytest.mark.parametrize("case", ["7b-multi-query", "mha-biases", "40b-grouped-two-norms"])
def test_query_key_value_splits_and_joins_back(case):
    """Each layout's split of query_key_value (weight and bias) joins back bitwise (our save's rows are the
    checkpoint's)."""
    from triforce.models.loading import falcon_qkv_join, falcon_qkv_split

    hf, ours = pair(case)
    for name, t in hf.state_dict().items():
        if "query_key_value" in name:
            assert torch.equal(falcon_qkv_join(ours.config, falcon_qkv_split(ours.config, t)), t)


def test_the_second_norm_matters():
    """The new architecture's two norms are read apart: with the MLP's norm (ln_mlp) in the attention's place too, the
    logits move."""
    from triforce.models.loading import _build

    hf, ours = pair("40b-grouped-two-norms")
    ids = torch.randint(0, 101, (2, 30), generator=torch.Generator().manual_seed(2))
    theirs = hf.state_dict()
    sd = {k: theirs[k.replace(".ln_attn.", ".ln_mlp.")] for k in theirs}  # (the attention's norm: the MLP's)
    with torch.no_grad():
        ref = hf(ids).logits
        assert (_build(ours.config, sd, None, None)(ids) - ref).abs().max().item() > 10 * TOL


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", ["7b-multi-query", "40b-grouped-two-norms", "rw-1b"])
def test_a_pass_gives_the_bits_of_one_token_steps(case, dtype):
    assert_pass_equals_steps(pair(case)[1], dtype)


@pytest.mark.parametrize("heads", [1, 2, 3, 4, 5, 6, 12, 16, 32, 64, 71])
def test_falcon_rws_slopes_are_transformers(heads):
    """Falcon-RW's slope per head, bitwise what transformers' SDPA path adds per position (its build_alibi_tensor, the
    slopes rounded to bfloat16, at position 1, divided by sqrt(head_dim)): its bias is added before its scores' scale
    multiplies both."""
    import math

    from transformers.models.falcon.modeling_falcon import build_alibi_tensor

    c = LlamaConfig.from_dict({**FALCON_7B, "alibi": True, "hidden_size": 8 * heads, "num_attention_heads": heads})
    want = build_alibi_tensor(torch.ones(1, 2, dtype=torch.long), heads, torch.float32)[:, 0, 1] / math.sqrt(8)
    assert torch.equal(torch.tensor(c.alibi_slopes), want)


def test_falcon_rws_alibi_matters():
    """Without ALiBi, or with BLOOM's slopes (not divided by sqrt(head_dim)), Falcon-RW's logits move past TOL."""
    hf, ours = pair("rw-1b")
    ids = torch.randint(0, 101, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(ids).logits
        assert (ours(ids) - ref).abs().max().item() <= TOL
        for slopes in (None, LlamaConfig.from_dict({"model_type": "bloom", "n_head": 4}).alibi_slopes):
            for layer in ours.model.layers:
                layer.self_attn.alibi = slopes
            assert (ours(ids) - ref).abs().max().item() > 10 * TOL


# falcon-7b's config.json as TII ships it (its own code named in auto_map; the RW code's residual switch, false)
FALCON_7B = {
    "alibi": False, "apply_residual_connection_post_layernorm": False, "architectures": ["FalconForCausalLM"],
    "attention_dropout": 0.0, "auto_map": {"AutoConfig": "configuration_falcon.FalconConfig",
                                           "AutoModel": "modeling_falcon.FalconModel",
                                           "AutoModelForCausalLM": "modeling_falcon.FalconForCausalLM"},
    "bias": False, "bos_token_id": 11, "eos_token_id": 11, "hidden_dropout": 0.0, "hidden_size": 4544,
    "initializer_range": 0.02, "layer_norm_epsilon": 1e-05, "model_type": "falcon", "multi_query": True,
    "new_decoder_architecture": False, "num_attention_heads": 71, "num_hidden_layers": 32, "parallel_attn": True,
    "torch_dtype": "bfloat16", "transformers_version": "4.27.4", "use_cache": True, "vocab_size": 65024}


@pytest.mark.parametrize("d", [FALCON_7B, {**FALCON_7B, "new_decoder_architecture": True, "num_kv_heads": 8,
                                           "hidden_size": 8192, "num_attention_heads": 128, "num_hidden_layers": 60}],
                         ids=["falcon-7b", "40b-shaped"])
def test_falcons_configs_read_as_transformers_reads_them(d):
    c = LlamaConfig.from_dict(d)
    want = transformers.FalconConfig.from_dict({k: v for k, v in d.items() if k != "auto_map"})
    kv = want.num_kv_heads if want.new_decoder_architecture else 1
    assert (c.num_key_value_heads, c.head_dim, c.intermediate_size) == (kv, want.head_dim, want.ffn_hidden_size)
    assert (c.tie_word_embeddings, c.rms_norm_eps, c.attention_bias) == (True, want.layer_norm_epsilon, want.bias)
    assert c.parallel_norms == bool(want.new_decoder_architecture)


@pytest.mark.parametrize("bad,match", [({"alibi": 1}, "alibi"), ({"activation": "relu"}, "activation"),
                                       ({"num_key_value_heads": 8}, "num_key_value_heads"),
                                       ({"new_decoder_architecture": True, "parallel_attn": False}, "parallel"),
                                       ({"apply_residual_connection_post_layernorm": True}, "apply_residual")])
def test_what_it_does_not_read_raises(bad, match):
    with pytest.raises(ValueError, match=match):
        LlamaConfig.from_dict({**FALCON_7B, **bad})


@pytest.mark.parametrize("method,opts", [TINY_CASES[i] for i in (0, 2, 4, 6)],
                         ids=[f"{TINY_CASES[i][0]}-{i}" for i in (0, 2, 4, 6)])
def test_greedy_equals_autoregressive(method, opts):
    def tiny(seed):
        return tiny_family("falcon", seed, num_key_value_heads=2, attention_bias=True, mlp_bias=True, extra=dict(
            new_decoder_architecture=True, num_kv_heads=2))
    assert_greedy_equals_autoregressive(tiny(0), tiny(1), method, opts)


@pytest.mark.parametrize("method,opts", [TINY_CASES[i] for i in (0, 2, 3, 4, 6)],
                         ids=[f"{TINY_CASES[i][0]}-{i}" for i in (0, 2, 3, 4, 6)])
def test_falcon_rw_greedy_equals_autoregressive(method, opts):
    """The engines over a Falcon-RW model (ALiBi) give its greedy tokens (a layer-skip draft for the two-model
    methods)."""
    target = tiny_family("falcon", 0, num_key_value_heads=4, attention_bias=True, mlp_bias=True, extra=dict(
        alibi=True, multi_query=False, parallel_attn=False))
    assert_greedy_equals_autoregressive(target, target.layer_skip(2), method, opts)


def falcon_kv(c) -> dict:
    """The ``falcon.*`` metadata llama.cpp's converter writes for transformers' FalconConfig ``c``: its KV heads (the
    new architecture's groups, else 1: multi-query), the LayerNorms' eps as attention.layer_norm_epsilon."""
    kv = c.num_kv_heads if c.new_decoder_architecture else 1
    return {"context_length": c.max_position_embeddings, "embedding_length": c.hidden_size,
            "feed_forward_length": c.ffn_hidden_size, "block_count": c.num_hidden_layers,
            "attention.head_count": c.num_attention_heads, "attention.head_count_kv": kv,
            "attention.layer_norm_epsilon": float(c.layer_norm_epsilon), "vocab_size": c.vocab_size}


@pytest.mark.parametrize("keys,kv,norms", [({}, 1, False),
                                            (dict(new_decoder_architecture=True, num_kv_heads=2), 2, True)],
                         ids=["7b", "40b"])
def test_gguf_as_llama_cpp_writes_it(tmp_path, keys, kv, norms):
    """A falcon GGUF as llama.cpp's converter writes the checkpoint (query_key_value regrouped as every query, then
    every key, then every value; the 40b layers' ln_attn as attn_norm_2 and ln_mlp as attn_norm; no biases: llama.cpp's
    falcon has none) gives transformers' logits; its blocks compute the loaded model bitwise."""
    from triforce.models.loading import falcon_qkv_split

    from .test_families import assert_converted_gguf_is_the_checkpoint

    hf, ours = transformers_and_ours("Falcon", **{**BASE, "layer_norm_epsilon": 1e-3, **keys})

    def convert(name, t):
        return torch.cat(falcon_qkv_split(ours.config, t)) if "query_key_value" in name else t

    loaded = assert_converted_gguf_is_the_checkpoint(tmp_path, hf, "falcon", falcon_kv(hf.config), convert=convert)
    assert loaded.config.model_type == "falcon" and loaded.config.parallel_norms == norms
    assert loaded.config.num_key_value_heads == kv
