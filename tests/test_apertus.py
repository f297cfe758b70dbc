"""Apertus (``model_type="apertus"``: Swiss AI's Apertus-8B / 70B): Llama's layer with per-head q / k RMSNorms before
RoPE, its norms named ``attention_layernorm`` / ``feedforward_layernorm``, an ungated MLP of xIELU with learned numbers
per layer (``mlp.act_fn.alpha_p`` / ``alpha_n`` / ``beta`` / ``eps``), Llama 3.1's RoPE at base 1.2e7 by default.
Against transformers' ApertusForCausalLM and its XIELUActivation."""
import pytest
import torch

from triforce.models import LlamaConfig
from triforce.models.llama import XIELU, FeedForward

from .test_engines import TINY_CASES, assert_greedy_equals_autoregressive
from .test_families import TINY, assert_saved_reads_back, randomize_, tiny_family
from .test_sliding_window import assert_every_path_matches, assert_pass_equals_steps

transformers = pytest.importorskip("transformers")

CASES = {"default": {}, "bias-gqa-plain-rope": dict(attention_bias=True, num_key_value_heads=2, rope_parameters={
    "rope_type": "default", "rope_theta": 1e5}, tie_word_embeddings=True)}


def pair(case="default"):
    """transformers' ApertusForCausalLM of ``case`` (random weights, biases, norms and xIELU numbers) and ours."""
    from triforce.models.loading import _build

    torch.manual_seed(0)
    config = transformers.ApertusConfig(**{**TINY, "num_hidden_layers": 3, **CASES[case]}, attn_implementation="eager")
    hf = randomize_(transformers.ApertusForCausalLM(config).eval())
    g = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith(("act_fn.alpha_p", "act_fn.alpha_n")):
                p.copy_(torch.randn(p.shape, generator=g))
    return hf, _build(LlamaConfig.from_dict(hf.config.to_dict()), hf.state_dict(), None, None)


@pytest.mark.parametrize("case", list(CASES))
def test_every_path_and_our_save_match_transformers(tmp_path, case):
    hf, ours = pair(case)
    c = ours.config
    assert (c.activation, c.gated_mlp, c.qk_norm) == ("xielu", False, True)
    assert type(ours.model.layers[0].mlp) is FeedForward and isinstance(ours.model.layers[0].mlp.act_fn, XIELU)
    assert c.rope_scaling == ({k: v for k, v in hf.config.rope_parameters.items() if k != "rope_theta"}
                              if case == "default" else None)
    assert_every_path_matches(hf, ours)
    assert_saved_reads_back(tmp_path, hf, ours)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_xielu_gives_transformers_bits_and_each_row_its_own(dtype):
    """Our xIELU gives transformers' XIELUActivation's bits (its Python form, the same numbers), around 0 and eps
    too; a row's bits do not depend on the rows beside it (95 wide, not a whole vector: ATen's scalar tail would take
    some of its values; this machine's ATen gives its expm1 the vector loop's bits there too, so the test guards the
    wrapper's layout rather than catching a difference here)."""
    from transformers.activations import XIELUActivation

    theirs = XIELUActivation(dtype=dtype)
    ours = XIELU().to(dtype)
    with torch.no_grad():
        for p in (theirs.alpha_p, theirs.alpha_n):
            p.copy_(torch.randn(1) * 0.7)
        ours.load_state_dict(theirs.state_dict())
        x = torch.cat([torch.randn(4096) * 4, torch.tensor([0.0, -0.0, -1e-6, -2e-6, -5e-7, 1e-6, 30.0, -30.0])])
        x = torch.cat([x, torch.randn(-x.numel() % 64)]).to(dtype)
        assert torch.equal(ours(x), theirs._xielu_python(x))
        rows = torch.randn(37, 95).to(dtype) * 3
        alone = torch.stack([ours(r[None])[0] for r in rows])
        assert torch.equal(ours(rows), alone)


def test_the_xielu_numbers_and_the_norm_names_are_read():
    """Another layer's xIELU numbers move the logits; the checkpoint's norm names are read (none left over)."""
    from triforce.models.loading import _build

    hf, ours = pair()
    ids = torch.randint(0, 101, (2, 20), generator=torch.Generator().manual_seed(2))
    sd = dict(hf.state_dict())
    sd["model.layers.1.mlp.act_fn.alpha_n"] = sd["model.layers.1.mlp.act_fn.alpha_n"] + 1
    with torch.no_grad():
        assert (_build(ours.config, sd, None, None)(ids) - hf(ids).logits).abs().max().item() > 1e-3
    assert not any(k.endswith((".attention_layernorm.weight", ".feedforward_layernorm.weight")) and "post_" not in k
                   for k in ours.state_dict())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_pass_gives_the_bits_of_one_token_steps(dtype):
    assert_pass_equals_steps(pair("bias-gqa-plain-rope")[1], dtype)


def test_defaults_and_bad_configs():
    """A config without the keys takes ApertusConfig's (the 8B shape, Llama 3.1's RoPE at 1.2e7); a base without a RoPE
    dict raises (ApertusConfig would not read it); another activation raises."""
    c, want = LlamaConfig.from_dict({"model_type": "apertus"}), transformers.ApertusConfig()
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings",
                 "attention_bias"):
        assert getattr(c, name) == getattr(want, name), name
    assert {**c.rope_scaling, "rope_theta": c.rope_theta} == want.rope_parameters
    assert LlamaConfig.from_dict({"model_type": "apertus", "rope_theta": 1.2e7}).rope_scaling == c.rope_scaling
    with pytest.raises(ValueError, match="rope_theta"):
        LlamaConfig.from_dict({"model_type": "apertus", "rope_theta": 5e5})
    with pytest.raises(ValueError, match="hidden_act"):
        LlamaConfig.from_dict({"model_type": "apertus", "hidden_act": "relu2"})


@pytest.mark.parametrize("method,opts", [TINY_CASES[i] for i in (0, 3, 4, 6)],
                         ids=[f"{TINY_CASES[i][0]}-{i}" for i in (0, 3, 4, 6)])
def test_greedy_equals_autoregressive(method, opts):
    def tiny(seed):
        model = tiny_family("apertus", seed, head_dim=8)
        with torch.no_grad():
            for layer in model.model.layers:
                layer.mlp.act_fn.alpha_p.normal_(0, 0.5)
                layer.mlp.act_fn.alpha_n.normal_(0, 0.5)
        return model
    assert_greedy_equals_autoregressive(tiny(0), tiny(1), method, opts)


@pytest.mark.parametrize("case", list(CASES))
def test_gguf_as_llama_cpp_writes_it(tmp_path, case):
    """An apertus GGUF as llama.cpp's converter writes the checkpoint (its LlamaModel without the q / k permutation;
    Llama 3.1's RoPE as rope_freqs; each layer's xIELU numbers, as learned, in the metadata arrays xielu.alpha_p /
    alpha_n / beta / eps) gives transformers' logits; its blocks compute the loaded model bitwise."""
    from triforce.models.rope import rope_inv_freq

    from .test_families import assert_converted_gguf_is_the_checkpoint, converted_kv

    hf, ours = pair(case)
    sd = hf.state_dict()
    n = ours.config.num_hidden_layers
    raw = {f"xielu.{k}": [float(sd[f"model.layers.{i}.mlp.act_fn.{k}"].reshape(())) for i in range(n)]
           for k in ("alpha_p", "alpha_n", "beta", "eps")}
    tensors = {}
    if ours.config.rope_type == "llama3":  # (the converter's rope_freqs: each pair's factor on its frequency)
        plain = ours.config.replace(rope_scaling=None)
        tensors["rope_freqs.weight"] = (rope_inv_freq(plain) / rope_inv_freq(ours.config)).numpy()

    def convert(name, t):
        return None if ".act_fn." in name else t

    loaded = assert_converted_gguf_is_the_checkpoint(tmp_path, hf, "apertus", converted_kv(hf.config),
                                                     convert=convert, tensors=tensors, raw_kv=raw)
    assert loaded.config.model_type == "apertus" and loaded.config.activation == "xielu"
