"""Cohere 2 (``model_type="cohere2"``: Command R7B, Command A): one LayerNorm without a bias before the attention and
the MLP, which run in parallel on it; the logits times ``logit_scale``; sliding layers with RoPE on adjacent pairs of
dims beside full layers without RoPE. Against transformers' Cohere2ForCausalLM."""
import pytest
import torch

from triforce.models import Llama, LlamaConfig

from .test_engines import TINY_CASES, assert_greedy_equals_autoregressive
from .test_families import TINY, tiny_family, transformers_and_ours
from .test_model import TOL
from .test_sliding_window import assert_every_path_matches, assert_pass_equals_steps

transformers = pytest.importorskip("transformers")

COHERE2 = dict({k: v for k, v in TINY.items() if k != "rms_norm_eps"}, num_hidden_layers=5, pad_token_id=None,
               bos_token_id=1, eos_token_id=2, sliding_window=6, layer_norm_eps=1e-4, logit_scale=0.25)
ALTERNATE = ["sliding_attention", "full_attention"] * 2 + ["sliding_attention"]


def pair(**kw):
    return transformers_and_ours("Cohere2", **{**COHERE2, **kw})


@pytest.mark.parametrize("kw", [{}, {"layer_types": ALTERNATE, "tie_word_embeddings": False, "attention_bias": True},
                                {"sliding_window": 1000}, {"sliding_window_pattern": 2, "logit_scale": -3.0}],
                         ids=["pattern", "layer-types-untied-bias", "window-past-context", "pattern-2"])
def test_logits_and_every_path_match_transformers(tmp_path, kw):
    """The plain forward, a chunked prefill, a verify pass, steps and a tree over the cache give transformers'
    logits: the parallel block, LayerNorm, the logit scale, windows and RoPE on the sliding layers only; the checkpoint
    we save reads back in transformers as the same model."""
    hf, ours = pair(**kw)
    c = ours.config
    sliding = [t == "sliding_attention" for t in hf.config.layer_types]
    assert c.layer_norm and c.parallel_block and c.rope_interleaved and c.rms_norm_eps == 1e-4
    assert c.logit_scale == kw.get("logit_scale", 0.25) and c.rope_layers == tuple(sliding)
    window = kw.get("sliding_window", 6)
    assert c.layer_windows == tuple(window if s and window < 512 else 0 for s in sliding)
    assert not hasattr(ours.model.layers[0], "post_attention_layernorm")
    assert_every_path_matches(hf, ours)
    ours.save_pretrained(tmp_path)
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    assert type(back).__name__ == "Cohere2ForCausalLM" and back.config.layer_types == hf.config.layer_types
    assert back.config.layer_norm_eps == 1e-4 and back.config.logit_scale == c.logit_scale
    ids = torch.randint(0, 101, (2, 30), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        assert torch.equal(back(ids).logits, hf(ids).logits)
        assert torch.equal(Llama.from_pretrained(tmp_path)(ids), ours(ids))


def test_each_part_matters():
    """Each part the tests above check moves the logits by far more than the tolerance when it is wrong: RMSNorm
    instead of LayerNorm, the MLP after the attention instead of beside it, no logit scale, RoPE on the full layers
    too, the checkpoint's q / k dims read as half-split pairs."""
    from triforce.models.llama import RMSNorm
    from triforce.models.loading import _build

    hf, ours = pair()
    ids = torch.randint(0, 101, (1, 30), generator=torch.Generator().manual_seed(2))

    def moved(model):
        with torch.no_grad():
            return (model(ids) - ref).abs().max().item() > 10 * TOL

    with torch.no_grad():
        ref = hf(ids).logits
        assert (ours(ids) - ref).abs().max().item() <= TOL
    layer = ours.model.layers[1]
    norm = layer.input_layernorm
    layer.input_layernorm = RMSNorm(norm.weight.numel(), norm.eps)
    layer.input_layernorm.weight = norm.weight
    assert moved(ours)
    layer.input_layernorm = norm
    layer.parallel = False
    layer.post_attention_layernorm = norm
    assert moved(ours)
    layer.parallel = True
    ours.config.extra["logit_scale"] = 1.0
    assert moved(ours)
    ours.config.extra["logit_scale"] = 0.25
    local = ours.inv_freq_local
    ours.inv_freq_local = ours.inv_freq.clone()
    assert moved(ours)
    ours.inv_freq_local = local
    flat = _build(ours.config, dict(hf.state_dict()), None, None)
    with torch.no_grad():
        for mine, theirs in zip(flat.model.layers, hf.model.layers):  # the dims as the checkpoint holds them
            for name in ("q_proj", "k_proj"):
                getattr(mine.self_attn, name).weight.copy_(getattr(theirs.self_attn, name).weight)
    assert moved(flat)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_pass_gives_the_bits_of_one_token_steps(dtype):
    assert_pass_equals_steps(pair()[1], dtype)


def test_defaults_and_bad_configs():
    """A config without the keys takes Cohere2Config's (a window of 4096 on three of every four layers, those with
    RoPE; logit scale 1/16; eps 1e-5; tied); rms_norm_eps is not its key (transformers leaves it unread); head_dim is
    hidden_size / heads whatever the config says (a different one raises), and keys Cohere 2 does not read raise."""
    base = {k: v for k, v in TINY.items() if k != "rms_norm_eps"}
    c = LlamaConfig.from_dict({**base, "model_type": "cohere2", "max_position_embeddings": 8192,
                               "num_hidden_layers": 8, "rms_norm_eps": 0.5, "rotary_pct": 1.0})
    assert c.layer_windows == (4096, 4096, 4096, 0) * 2 and c.rope_layers == (True, True, True, False) * 2
    assert (c.logit_scale, c.rms_norm_eps, c.tie_word_embeddings) == (0.0625, 1e-5, True)
    assert c.to_dict()["layer_norm_eps"] == 1e-5 and "rms_norm_eps" not in c.to_dict()
    for bad, match in (({"head_dim": 8}, "head_dim"), ({"logit_scale": 0.0}, "'logit_scale'"),
                       ({"rotary_pct": 0.5}, "'rotary_pct'"), ({"mlp_bias": True}, "'mlp_bias'"),
                       ({"sliding_window": None}, "'sliding_window'")):
        with pytest.raises(ValueError, match=match):
            LlamaConfig.from_dict({**base, "model_type": "cohere2", **bad})


def tiny_cohere2(seed):
    return tiny_family("cohere2", seed, layers=4, tie_word_embeddings=True,
                       extra={"sliding_window": 10, "sliding_window_pattern": 2, "logit_scale": 0.5})


@pytest.mark.parametrize("method,opts", TINY_CASES, ids=[f"{m}-{i}" for i, (m, _) in enumerate(TINY_CASES)])
def test_greedy_equals_autoregressive(method, opts):
    assert_greedy_equals_autoregressive(tiny_cohere2(0), tiny_cohere2(1), method, opts)


def test_heads_training_forward_equals_decoding():
    """The Hidden Transfer heads' training forward runs Cohere 2's layers (the parallel block, LayerNorm, NoPE
    layers) as decoding does."""
    from .test_heads import assert_perturbed_heads_train_as_they_decode

    assert_perturbed_heads_train_as_they_decode(tiny_cohere2(0))


def test_gguf_as_llama_cpp_writes_it(tmp_path):
    """A cohere2 GGUF as llama.cpp's converter writes a Cohere2ForCausalLM checkpoint (the gguf package's names: one
    attn_norm; q / k rows as the checkpoint holds them; logit_scale, attention.layer_norm_epsilon, the window, RoPE
    scaling none) gives transformers' logits on the checkpoint (llama.cpp's fixed pattern: three of every four layers
    sliding, Cohere2Config's default); in Q8_0 / Q5_0 blocks gguf_copy computes bitwise the loaded model, and
    load_gguf_int8 bitwise gguf_copy's int8 copy."""
    from .test_families import assert_converted_gguf_is_the_checkpoint, converted_kv

    hf, _ = pair()
    c = hf.config
    kv = {**converted_kv(c, eps_key="attention.layer_norm_epsilon"), "logit_scale": float(c.logit_scale),
          "attention.sliding_window": c.sliding_window}
    ours = assert_converted_gguf_is_the_checkpoint(tmp_path, hf, "cohere2", kv)
    assert ours.config.model_type == "cohere2" and ours.config.layer_windows == (6, 6, 6, 0, 6)
    assert ours.config.logit_scale == 0.25 and ours.config.rms_norm_eps == pytest.approx(1e-4)


def test_bfloat16_rope_rounds_once_as_transformers():
    """In bfloat16 the queries and keys are rotated in float32 and rounded once, bitwise transformers' Cohere 2
    rotation of the same projections (Llama's rotation in bfloat16 rounds each product: other bits)."""
    from transformers.models.cohere2.modeling_cohere2 import apply_rotary_pos_emb

    from triforce.models.loading import rotary_order
    from triforce.models.rope import apply_rope

    ours = pair()[1].to(torch.bfloat16)
    att = ours.model.layers[0].self_attn
    x = torch.randn(2, 7, 64, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    pos = torch.arange(7).expand(2, 7)
    cos, sin = ours.rope_tables(pos)[0]
    order = rotary_order(ours.config)  # our dim j is the checkpoint's dim order[j]
    with torch.no_grad():
        q, k, k_raw, _ = att.project(x, cos, sin)
        q_raw = att.q_proj(x).view(2, 7, 4, 16)
        # the same tables in transformers' layout (adjacent pairs; its own would be computed from a bfloat16 inv_freq
        # after .to(bfloat16), ours stay float32)
        hcos, hsin = (t[:, :, 0, :8].repeat_interleave(2, -1) for t in (cos, sin))
        qt, kt = apply_rotary_pos_emb(q_raw[..., torch.argsort(order)].transpose(1, 2),
                                      k_raw[..., torch.argsort(order)].transpose(1, 2), hcos, hsin)
    assert torch.equal(q, qt.transpose(1, 2)[..., order]) and torch.equal(k, kt.transpose(1, 2)[..., order])
    assert not torch.equal(q, apply_rope(q_raw, cos, sin))
