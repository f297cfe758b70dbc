"""LFM3 (``model_type="lfm3"``: Lfm3ForCausalLM): LFM2's gated short convolutions beside full and sliding attention
layers (Qwen3's, each head's output times the sigmoid of its own gate), sandwich norms, the full layers' proportional
RoPE (``rope_type`` "proportional") and the sliding layers' own; against transformers, through the caches and the
engines."""
import pytest
import torch

from triforce.models import LlamaConfig
from triforce.models.llama import Attention, ShortConv

from .test_engines import TINY_CASES, assert_greedy_equals_autoregressive
from .test_families import randomize_, tiny_family
from .test_lfm2 import assert_parts_count, assert_rollbacks_restore_the_state, assert_rows_kept_apart
from .test_mamba2 import assert_matches_both_ways
from .test_sliding_window import assert_pass_equals_steps

transformers = pytest.importorskip("transformers")

BASE = dict(vocab_size=101, hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, sliding_window=8, pad_token_id=0, bos_token_id=1, eos_token_id=2, conv_L_cache=4)
CASES = {"default-pattern": dict(num_hidden_layers=5),
         # (no sandwich norms, no gate, biased convolutions of Lfm3Config's 7 taps, untied, attention first, a RoPE of
         # its own per layer type)
         "plain-biased-untied": dict(num_hidden_layers=5, use_sandwich_norm=False, use_attention_gate=False,
                                     conv_bias=True, conv_L_cache=7, tie_word_embeddings=False,
                                     layer_types=["full_attention", "conv", "sliding_attention", "sliding_attention",
                                                  "conv"],
                                     rope_parameters={"full_attention": {"rope_type": "proportional",
                                                                         "rope_theta": 5000.0,
                                                                         "partial_rotary_factor": 0.25},
                                                      "sliding_attention": {"rope_type": "default",
                                                                            "rope_theta": 300.0}})}


def pair(case="default-pattern"):
    """transformers' Lfm3ForCausalLM of ``case`` (random weights, the convolutions drawn larger than its initialisation
    so that they count; biases and norms randomised) and ours from its config and weights."""
    from triforce.models.loading import _build

    torch.manual_seed(0)
    config = transformers.Lfm3Config(**{**BASE, **CASES[case]}, attn_implementation="eager")
    hf = randomize_(transformers.Lfm3ForCausalLM(config).eval())
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if ".conv." in name and name.endswith("weight"):
                p.normal_(0, 0.3)
    return hf, _build(LlamaConfig.from_dict(hf.config.to_dict()), hf.state_dict(), None, None)


def tiny(seed, types=("conv", "full_attention", "sliding_attention"), **extra):
    """A tiny LFM3 (its full layers' proportional RoPE turning half of each head's pairs, the sliding layers' own base
    and window of 6)."""
    return tiny_family("lfm3", seed, layers=len(types), head_dim=8, rope_theta=1e4,
                       rope_scaling={"rope_type": "proportional"},
                       extra={"layer_types": list(types), "conv_bias": True, "sliding_window": 6,
                              "partial_rotary_factor": 0.5, "rope_local_base_freq": 300.0, **extra})


@pytest.mark.parametrize("case", list(CASES))
def test_every_path_and_saves_match_transformers(tmp_path, case):
    """Every path (a plain forward, a chunked prefill, a verify pass, one-token steps, a tree whose branches convolve
    over their own ancestors, windows past several) gives transformers' logits; saves both ways."""
    hf, ours = pair(case)
    types = hf.config.layer_types
    assert [type(layer.self_attn) for layer in ours.model.layers] == [
        ShortConv if t == "conv" else Attention for t in types]
    c = ours.config
    assert c.layer_windows == tuple(8 if t == "sliding_attention" else 0 for t in types)
    assert c.rope_layers == tuple(t == "full_attention" for t in types) and c.rope_type == "proportional"
    assert c.sandwich_norms == (case == "default-pattern") == c.sigmoid_head_gate
    assert_matches_both_ways(tmp_path, hf, ours)


def test_proportional_rope_is_transformers():
    """rope_type "proportional": the whole head's pairs, the first partial_rotary_factor of them turning at
    base ** (-2i / head_dim), the others not (transformers' inverse frequencies, bitwise)."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from triforce.models.rope import rope_inv_freq

    hf, ours = pair("plain-biased-untied")
    want, _ = ROPE_INIT_FUNCTIONS["proportional"](hf.config, layer_type="full_attention")
    got = rope_inv_freq(ours.config)
    assert torch.equal(got, want) and ours.config.rotary_dim == 16 and int((got == 0).sum()) == 6


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_pass_gives_the_bits_of_one_token_steps(dtype):
    assert_pass_equals_steps(pair()[1], dtype)


def test_each_part_moves_the_logits():
    """The heads' gate, the sandwich norms (after the mixer and after the MLP), the q / k norms and the convolution
    count; so does the history a cached step reads."""
    hf, ours = pair()
    ids = torch.randint(0, 101, (2, 16), generator=torch.Generator().manual_seed(4))
    att, conv = ours.model.layers[2], ours.model.layers[1]
    assert type(att.self_attn) is Attention and type(conv.self_attn) is ShortConv
    assert_parts_count(hf, ours, ids, (att.self_attn.g_proj.weight, att.post_attention_layernorm.weight,
                                       att.post_feedforward_layernorm.weight, att.self_attn.k_norm.weight,
                                       conv.self_attn.conv.weight), lambda cache: cache.conv[1].zero_())


def test_rollbacks_and_rows_keep_the_convolutions_and_windows():
    model = tiny(0)
    assert_rollbacks_restore_the_state(model, length=30)
    assert_rows_kept_apart(model)


@pytest.mark.parametrize("method,opts", [TINY_CASES[i] for i in (0, 2, 3, 4, 6)],
                         ids=[f"{TINY_CASES[i][0]}-{i}" for i in (0, 2, 3, 4, 6)])
def test_greedy_equals_autoregressive(method, opts):
    assert_greedy_equals_autoregressive(tiny(0), tiny(1), method, opts)


def test_config_reads_as_transformers_reads_it():
    """Lfm3Config's defaults (its layer pattern, windows, RoPE per layer type, sandwich norms, gate, 7 taps); bad layer
    types and RoPE refused; to_dict writes its RoPE per layer type back."""
    want = transformers.Lfm3Config()
    c = LlamaConfig.from_dict(want.to_dict())
    assert c.conv_layers == tuple(t == "conv" for t in want.layer_types) and c.conv_kernel == 7
    assert c.layer_windows == tuple(256 if t == "sliding_attention" else 0 for t in want.layer_types)
    assert (c.rope_theta, c.local_rope_theta, c.rope_type, c.rms_norm_eps) == (1e6, 1e4, "proportional", want.norm_eps)
    assert c.sandwich_norms and c.sigmoid_head_gate and c.tie_word_embeddings
    back = c.to_dict()
    assert back["rope_parameters"] == want.rope_parameters and back["layer_types"] == want.layer_types
    for bad, match in (({"layer_types": ["conv", "chunked_attention"] * 12}, "layer_types"),
                       ({"use_attention_gate": 1}, "use_attention_gate"),
                       ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4}}, "rope_parameters")):
        with pytest.raises(ValueError, match=match):
            LlamaConfig.from_dict({"model_type": "lfm3", **bad})


@pytest.mark.parametrize("tied", [True, False])
def test_lfm3_vl_reads_its_language_model(tmp_path, tied):
    """LFM3-VL's image + text checkpoints (Lfm3VlForConditionalGeneration) read text-only: its LFM3 language model
    (model.language_model.*) gives the wrapper's logits on text, tied by the wrapper's key; its vision tower and
    projector not read."""
    from triforce.models import Llama

    from .test_families import TOL

    torch.manual_seed(0)
    text = dict(BASE, **CASES["default-pattern"])
    config = transformers.Lfm3VlConfig(text_config=text, projector_hidden_size=32, image_token_id=5,
                                       tie_word_embeddings=tied)
    config.vision_config.num_hidden_layers = 1
    hf = randomize_(transformers.Lfm3VlForConditionalGeneration(config).eval())
    hf.save_pretrained(tmp_path)
    ours = Llama.from_pretrained(tmp_path)
    assert ours.config.model_type == "lfm3" and ours.config.tie_word_embeddings == tied
    assert ours.config.conv_layers == tuple(t == "conv" for t in config.text_config.layer_types)
    ids = torch.randint(6, 101, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert (ours(ids) - hf(input_ids=ids).logits).abs().max().item() <= TOL


def test_rotary_dim_reads_a_rope_dict_of_the_old_spelling():
    """rotary_dim (which asks whether the RoPE is proportional) runs while the RoPE dict is being checked, before it is
    normalised: a transformers 4 ``type`` spelling reads, as it did before the proportional RoPE."""
    c = LlamaConfig.from_dict({"model_type": "llama", "rope_scaling": {"type": "linear", "factor": 2.0}})
    assert c.rope_type == "linear" and c.rotary_dim == c.head_dim
    c = LlamaConfig.from_dict({"model_type": "lfm3", "num_hidden_layers": 4, "head_dim": 64, "rope_parameters": {
        "full_attention": {"type": "proportional", "rope_theta": 1e6, "partial_rotary_factor": 0.25},
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}})
    assert c.rope_type == "proportional" and c.rotary_dim == 64
