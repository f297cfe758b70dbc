"""DBRX (``model_type="dbrx"``: dbrx-base, dbrx-instruct): its own config names (an ``attn_config`` and an
``ffn_config``), torch's LayerNorm without a bias, q / k / v as one ``Wqkv`` clamped by ``clip_qkv``, every layer a
mixture (the softmax's top ``moe_top_k``, normalised by their sum) of SwiGLU experts stacked in its checkpoints
(``w1``, ``v1``, ``w2``). Against transformers' DbrxForCausalLM."""
import pytest
import torch

from triforce.models import LlamaConfig
from triforce.models.llama import NoBiasLayerNorm, SparseMoE

from .test_engines import TINY_CASES, assert_greedy_equals_autoregressive
from .test_moe import assert_checkpoint_directories_both_ways
from .test_model import TOL
from .test_sliding_window import assert_every_path_matches, assert_pass_equals_steps

transformers = pytest.importorskip("transformers")

BASE = dict(d_model=64, n_heads=4, n_layers=2, vocab_size=101, max_seq_len=512)
CASES = {  # (transformers 5.23's DBRX needs a clip: it clamps with clip_qkv null and fails)
    "gqa-top2": dict(attn_config={"kv_n_heads": 2, "clip_qkv": 0.5, "rope_theta": 10000.0},
                     ffn_config={"ffn_hidden_size": 32, "moe_num_experts": 4, "moe_top_k": 2}),
    "mqa-top1-unnormalised": dict(attn_config={"kv_n_heads": 1, "clip_qkv": 8.0, "rope_theta": 10000.0},
                                  ffn_config={"ffn_hidden_size": 24, "moe_num_experts": 3, "moe_top_k": 1,
                                              "moe_normalize_expert_weights": None}),
}


def pair(case="gqa-top2"):
    """transformers' DbrxForCausalLM of ``case`` (its norms' weights random around 1, decisive routers: std 0.5) and
    ours on its weights."""
    from triforce.models.loading import _build

    torch.manual_seed(0)
    config = transformers.DbrxConfig(**BASE, **CASES[case], attn_implementation="eager")
    hf = transformers.DbrxForCausalLM(config).eval()
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith(("norm_1.weight", "norm_2.weight", "norm_f.weight")):
                p.copy_(1 + torch.randn(p.shape, generator=g) * 0.3)
            elif name.endswith("router.layer.weight"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    return hf, _build(LlamaConfig.from_dict(hf.config.to_dict()), hf.state_dict(), None, None)


@pytest.mark.parametrize("case", list(CASES))
def test_every_path_and_both_checkpoint_directions_match_transformers(tmp_path, case):
    hf, ours = pair(case)
    c = ours.config
    assert type(ours.model.layers[0].input_layernorm) is NoBiasLayerNorm
    assert all(type(layer.mlp) is SparseMoE for layer in ours.model.layers)
    assert (c.num_key_value_heads, c.clip_qkv) == (CASES[case]["attn_config"]["kv_n_heads"],
                                                   CASES[case]["attn_config"]["clip_qkv"])
    assert c.experts.renormalize == (CASES[case]["ffn_config"].get("moe_normalize_expert_weights", 1) is not None)
    assert_every_path_matches(hf, ours)
    assert_checkpoint_directories_both_ways(tmp_path, hf)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_pass_gives_the_bits_of_one_token_steps(dtype):
    assert_pass_equals_steps(pair()[1], dtype)


def test_the_clamp_and_the_normalisation_matter():
    """Without the clamp, or with the weights not normalised, the logits move past the tests' tolerance."""
    from triforce.models.loading import _build

    hf, ours = pair()
    ids = torch.randint(0, 101, (2, 30), generator=torch.Generator().manual_seed(2))
    x = ours.config
    with torch.no_grad():
        ref = hf(ids).logits
        for other in (x.replace(extra={**x.extra, "clip_qkv": 100.0}),
                      x.replace(extra={**x.extra, "moe_normalize_expert_weights": None})):
            assert (_build(other, hf.state_dict(), None, None)(ids) - ref).abs().max().item() > 10 * TOL


# dbrx-instruct's config.json as Databricks ships it (its RoPE base in attn_config, as DBRX's own code reads it)
DBRX_INSTRUCT = {
    "architectures": ["DbrxForCausalLM"], "attn_config": {"clip_qkv": 8, "kv_n_heads": 8, "model_type": "",
                                                          "rope_theta": 500000},
    "d_model": 6144, "emb_pdrop": 0.0, "ffn_config": {
        "ffn_hidden_size": 10752, "model_type": "", "moe_jitter_eps": 0.01, "moe_loss_weight": 0.05,
        "moe_num_experts": 16, "moe_top_k": 4},
    "initializer_range": 0.02, "max_seq_len": 32768, "model_type": "dbrx", "n_heads": 48, "n_layers": 40,
    "output_router_logits": False, "resid_pdrop": 0.0, "router_aux_loss_coef": 0.05, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "transformers_version": "4.38.2", "use_cache": True, "vocab_size": 100352}


def test_dbrx_instructs_config_reads():
    """dbrx-instruct's config.json: 40 layers of 6144, 8 KV heads, clip 8, 4 of 16 experts of 10752, RoPE base 5e5 (its
    attn_config's: transformers 5.23 keeps that key unread and would run 1e4); a base given twice, differently, raises,
    as do another activation or normalisation."""
    c = LlamaConfig.from_dict(DBRX_INSTRUCT)
    assert (c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads, c.head_dim) == (
        6144, 40, 48, 8, 128)
    assert (c.clip_qkv, c.rope_theta, c.max_position_embeddings) == (8.0, 500000, 32768)
    e = c.experts
    assert (e.count, e.top_k, e.intermediate_size, e.renormalize) == (16, 4, 10752, True)
    back = LlamaConfig.from_dict(c.to_dict())
    assert back == c
    for bad, match in (({"rope_theta": 1e4}, "differ"), ({"ffn_config": {**DBRX_INSTRUCT["ffn_config"],
                                                                          "ffn_act_fn": {"name": "gelu"}}}, "SiLU"),
                       ({"ffn_config": {**DBRX_INSTRUCT["ffn_config"], "moe_normalize_expert_weights": 2.0}},
                        "normalise"), ({"hidden_size": 6144}, "hidden_size")):
        with pytest.raises(ValueError, match=match):
            LlamaConfig.from_dict({**DBRX_INSTRUCT, **bad})


@pytest.mark.parametrize("method,opts", [TINY_CASES[i] for i in (0, 2, 4, 6)],
                         ids=[f"{TINY_CASES[i][0]}-{i}" for i in (0, 2, 4, 6)])
def test_greedy_equals_autoregressive(method, opts):
    from triforce.models import Llama

    from .test_families import randomize_

    def tiny(seed):
        torch.manual_seed(seed)
        config = LlamaConfig.from_dict({"model_type": "dbrx", "d_model": 32, "n_heads": 4, "n_layers": 3,
                                        "vocab_size": 64, "max_seq_len": 1024, "attn_config": {
                                            "kv_n_heads": 2, "clip_qkv": 2.0, "rope_theta": 10000.0},
                                        "ffn_config": {"ffn_hidden_size": 24, "moe_num_experts": 4, "moe_top_k": 2}})
        return randomize_(Llama(config.replace(initializer_range=0.3)), seed).eval()
    assert_greedy_equals_autoregressive(tiny(0), tiny(1), method, opts)


def test_gguf_as_llama_cpp_writes_it(tmp_path):
    """A dbrx GGUF as llama.cpp's converter writes the checkpoint (Wqkv as attn_qkv as it is, norm_2 as
    attn_output_norm, the experts as [experts, width, hidden] stacks, w2's transposed; clip_qkv as
    attention.clamp_kqv, the RoPE base from attn_config, eps 1e-5) gives transformers' logits; its blocks compute the
    loaded model bitwise."""
    from .test_families import assert_converted_gguf_is_the_checkpoint

    hf, ours = pair()
    c, E = ours.config, ours.config.experts.count
    kv = {"context_length": c.max_position_embeddings, "embedding_length": c.hidden_size,
          "feed_forward_length": c.intermediate_size, "block_count": c.num_hidden_layers,
          "attention.head_count": c.num_attention_heads, "attention.head_count_kv": c.num_key_value_heads,
          "rope.freq_base": float(c.rope_theta), "attention.clamp_kqv": float(c.clip_qkv), "expert_count": E,
          "expert_used_count": c.experts.top_k, "attention.layer_norm_epsilon": 1e-5, "vocab_size": c.vocab_size}
    tensors = {}
    for name, t in hf.state_dict().items():
        if ".ffn.experts.mlp." in name:
            i, w = int(name.split(".")[2]), name.rsplit(".", 1)[1]
            t = t.float().reshape(E, -1, c.hidden_size)
            kind = {"w1": "gate", "v1": "up", "w2": "down"}[w]
            tensors[f"blk.{i}.ffn_{kind}_exps.weight"] = (t.transpose(1, 2) if w == "w2" else t).contiguous().numpy()

    def convert(name, t):
        return None if ".ffn.experts.mlp." in name else t

    loaded = assert_converted_gguf_is_the_checkpoint(tmp_path, hf, "dbrx", kv, convert=convert, tensors=tensors)
    assert loaded.config.model_type == "dbrx" and loaded.config.clip_qkv == c.clip_qkv
