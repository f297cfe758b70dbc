"""ModernBERT decoder (``model_type="modernbert-decoder"``: the Ettin decoders): torch's LayerNorms (a bias by
``norm_bias``) on the embeddings and before each block but the first layer's attention; multi-head attention, every
``global_attn_every_n_layers``-th layer global (RoPE base 160000), the others sliding over ``local_attention // 2``
tokens (base 10000); a gated MLP of the exact GELU (``Wi``: rows [input; gate]); a prediction head
``norm(gelu(dense(h)))`` before the tied ``decoder`` (biased by ``decoder_bias``); against transformers'
ModernBertDecoderForCausalLM."""
import pytest
import torch

from triforce.models import Llama, LlamaConfig
from triforce.models import llama as llama_mod
from triforce.models.llama import BiasLayerNorm, NoBiasLayerNorm

from .test_engines import TINY_CASES, assert_greedy_equals_autoregressive
from .test_families import TINY, TOL, assert_saved_reads_back, tiny_family, transformers_and_ours
from .test_sliding_window import assert_every_path_matches, assert_pass_equals_steps

transformers = pytest.importorskip("transformers")

BASE = {k: v for k, v in TINY.items() if k not in ("rms_norm_eps", "num_key_value_heads")} | {
    "num_hidden_layers": 4, "intermediate_size": 48, "local_attention": 8, "max_position_embeddings": 256,
    "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, "cls_token_id": 1, "sep_token_id": 2}
CASES = {"default": {},
         "biases-every-other-untied": dict(norm_bias=True, attention_bias=True, mlp_bias=True, classifier_bias=True,
                                           decoder_bias=False, global_attn_every_n_layers=2, local_attention=6,
                                           tie_word_embeddings=False, global_rope_theta=5000.0,
                                           local_rope_theta=300.0, norm_eps=1e-6)}


def pair(case="default", **kw):
    """transformers' ModernBertDecoderForCausalLM of ``case`` (random weights, biases and norms randomised) and ours."""
    return transformers_and_ours("ModernBertDecoder", **{**BASE, **CASES[case], **kw})


@pytest.mark.parametrize("case", list(CASES))
def test_logits_and_every_path_match_transformers(tmp_path, case):
    """Every path gives transformers' logits (the embeddings' norm, the first layer's attention without a norm, the
    windows and two RoPE bases by layer type, the gated exact GELU from Wi, the prediction head, the decoder's
    bias); the checkpoint we save (its names, Wi joined again) reads back in transformers as the same model."""
    hf, ours = pair(case)
    c, layers = ours.config, ours.model.layers
    norm = BiasLayerNorm if hf.config.norm_bias else NoBiasLayerNorm
    assert type(layers[0].input_layernorm) is torch.nn.Identity and type(layers[1].input_layernorm) is norm
    assert type(ours.model.embed_layernorm) is norm and type(ours.model.head_norm) is norm
    sliding = tuple(t == "sliding_attention" for t in hf.config.layer_types)
    assert c.layer_windows == tuple(hf.config.sliding_window if s else 0 for s in sliding)
    assert c.rope_layers == tuple(not s for s in sliding) and c.activation == "gelu" and c.gated_mlp
    assert (ours.lm_head.bias is not None) == hf.config.decoder_bias
    assert c.tie_word_embeddings == hf.config.tie_word_embeddings
    assert_every_path_matches(hf, ours)
    assert_saved_reads_back(tmp_path, hf, ours)


def test_each_part_matters():
    """The prediction head, the embeddings' norm, the local layers' RoPE base and their window each move the logits
    past the tests' tolerance (so the tests above would see one left out)."""
    def sharp():  # (queries and keys scaled up: scores of random weights far from uniform, so positions show)
        model = pair()[1]
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(20)
            layer.self_attn.k_proj.weight.mul_(20)
        return model

    ids = torch.randint(0, 101, (2, 30), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = sharp()(ids)
        for change in ("head", "embed_norm", "theta", "window"):
            other = sharp()
            if change == "head":
                other.model.head_dense.weight.mul_(1.5)
            elif change == "embed_norm":
                other.model.embed_layernorm.weight.mul_(1.5)
            elif change == "theta":
                other.inv_freq_local.copy_(other.inv_freq)
            else:
                for layer in other.model.layers:
                    layer.self_attn.window = 0
            assert (other(ids) - ref).abs().max().item() > 10 * TOL, change


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_pass_gives_the_bits_of_one_token_steps(dtype):
    assert_pass_equals_steps(pair()[1], dtype)


def test_transformers_directory_loads(tmp_path):
    """transformers' own save of the model (its names, Wi, the decoder's bias) loads with its logits."""
    hf, _ = pair("biases-every-other-untied")
    hf.save_pretrained(tmp_path)
    ids = torch.randint(0, 101, (2, 24), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        assert (Llama.from_pretrained(tmp_path)(ids) - hf(ids).logits).abs().max().item() <= TOL


def test_config_keys_and_defaults():
    """ModernBertDecoderConfig's defaults (Ettin's 150M shape) and keys read as transformers reads them; keys it does
    not read that the model would, or values it would not compute so, refuse."""
    c, want = LlamaConfig.from_dict({"model_type": "modernbert-decoder"}), transformers.ModernBertDecoderConfig()
    assert (c.vocab_size, c.hidden_size, c.intermediate_size, c.num_hidden_layers, c.num_attention_heads) == (
        want.vocab_size, want.hidden_size, want.intermediate_size, want.num_hidden_layers, want.num_attention_heads)
    assert (c.max_position_embeddings, c.rms_norm_eps, c.bos_token_id, c.eos_token_id, c.pad_token_id) == (
        want.max_position_embeddings, want.norm_eps, want.bos_token_id, want.eos_token_id, want.pad_token_id)
    assert c.layer_windows == tuple(want.sliding_window if t == "sliding_attention" else 0 for t in want.layer_types)
    assert (c.rope_theta, c.local_rope_theta) == (want.rope_parameters["full_attention"]["rope_theta"],
                                                  want.rope_parameters["sliding_attention"]["rope_theta"])
    assert c.tie_word_embeddings and c.head_bias and not c.head_transform_bias and c.torch_layer_norm == "nobias"
    assert LlamaConfig.from_dict(c.to_dict()).to_dict() == c.to_dict()
    assert LlamaConfig.from_dict(transformers.ModernBertDecoderConfig(**BASE).to_dict()).layer_windows == (0, 4, 4, 0)
    for extra, match in (({"num_key_value_heads": 4}, "multi-head"), ({"hidden_activation": "silu"}, "hidden_act"),
                         ({"local_attention": 1}, "local_attention"), ({"classifier_activation": "relu"},
                                                                        "classifier_activation"),
                         ({"global_rope_theta": 1.0, "rope_scaling": {"rope_type": "linear", "factor": 2.0}},
                          "give one")):
        with pytest.raises(ValueError, match=match):
            LlamaConfig.from_dict({"model_type": "modernbert-decoder", **extra})


def test_native_stack_runs_the_layers_after_the_first(monkeypatch):
    """On the CPU the native stack runs every layer but the first (no norm before its attention: the modules), in
    one call, bitwise the modules."""
    from .test_decoder import LayerSpy, assert_bitwise, run

    model = tiny_family("modernbert-decoder", 0, layers=4, num_key_value_heads=4, extra={"local_attention": 6})
    modules = run(model, False, monkeypatch)
    spy = LayerSpy(torch.ops.triforce_C.decoder_layers)
    monkeypatch.setattr(torch.ops.triforce_C, "decoder_layers", spy, raising=False)
    monkeypatch.setattr(llama_mod, "_STACK", None)
    stacked = run(model, True, monkeypatch)
    assert_bitwise(modules, stacked)
    assert spy.calls == 5 * 3  # (the prefill and four steps, layers 1-3 each)


@pytest.mark.parametrize("method,opts", [TINY_CASES[i] for i in (0, 3, 4, 6)],
                         ids=[f"{TINY_CASES[i][0]}-{i}" for i in (0, 3, 4, 6)])
def test_greedy_equals_autoregressive(method, opts):
    target, draft = (tiny_family("modernbert-decoder", seed, num_key_value_heads=4, extra={"local_attention": 6})
                     for seed in (0, 1))
    assert_greedy_equals_autoregressive(target, draft, method, opts)
