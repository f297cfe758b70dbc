"""Falcon-H1 (``model_type="falcon_h1"``: FalconH1ForCausalLM): every layer an attention and a Mamba-2 mixer in
parallel on the same normed input, their outputs summed into the residual, then a SwiGLU MLP; its muP multipliers
(the embeddings' and the logits' applied, the others folded into the weights they scale) against transformers; the
caches holding a layer's keys and its state together, through steps, trees, rollbacks and the engines' drafts."""
import pytest
import torch

from triforce.models import LlamaConfig
from triforce.models.cache import FullCache
from triforce.models.llama import Attention, Mamba2Mixer

from .test_engines import TINY_CASES, assert_greedy_equals_autoregressive
from .llama_cpp_oracle import TOL
from .test_families import assert_save_loads, tiny_family
from .test_lfm2 import assert_parts_count, assert_rollbacks_restore_the_state, assert_rows_kept_apart, _steps
from .test_mamba2 import assert_a_deep_rollback_replays, drawn_pair
from .test_sliding_window import assert_every_path_matches, assert_pass_equals_steps

transformers = pytest.importorskip("transformers")

# every multiplier away from 1, none a power of two where it matters (the folds round)
MULTIPLIERS = dict(embedding_multiplier=2.0, lm_head_multiplier=0.5, key_multiplier=0.7, attention_in_multiplier=1.3,
                   attention_out_multiplier=0.9, ssm_in_multiplier=1.25, ssm_out_multiplier=0.6,
                   mlp_multipliers=[0.8, 1.5], ssm_multipliers=[0.5, 1.2, 0.7, 1.1, 0.9])
FALCON_H1 = dict(vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16, mamba_d_ssm=64, mamba_n_heads=8, mamba_d_state=8,
                 mamba_n_groups=2, mamba_d_conv=4, mamba_chunk_size=8, **MULTIPLIERS)
CASES = {"norm-before-gate": dict(mamba_rms_norm=True, mamba_norm_before_gate=True),
         "gate-before-norm-one-group": dict(mamba_rms_norm=True, mamba_norm_before_gate=False, mamba_n_groups=1),
         # (no gated norm: y silu(z); every bias, each under its multipliers; tied)
         "no-norm-biased-tied": dict(mamba_rms_norm=False, attention_bias=True, mlp_bias=True, projectors_bias=True,
                                     mamba_proj_bias=True, mamba_conv_bias=False, tie_word_embeddings=True)}
EXTRA = {"mamba_d_ssm": 32, "mamba_n_heads": 4, "mamba_d_state": 8, "mamba_n_groups": 2, "mamba_rms_norm": True,
         **MULTIPLIERS}


def pair(case="norm-before-gate"):
    return drawn_pair("FalconH1", "mamba", **{**FALCON_H1, **CASES[case]})


def tiny(seed, **extra):
    return tiny_family("falcon_h1", seed, extra={**EXTRA, **extra})


@pytest.mark.parametrize("case", list(CASES))
def test_every_path_and_saves_match_transformers(tmp_path, case):
    """Every path (a plain forward, a chunked prefill, a verify pass, one-token steps, a tree) gives transformers'
    logits; our save (the multipliers divided back out of the weights) reads back in transformers, its save in ours."""
    hf, ours = pair(case)
    layer = ours.model.layers[0]
    assert type(layer.self_attn) is Attention and type(layer.mamba) is Mamba2Mixer
    assert ours.config.kv_heads_per_layer == (2, 2) and ours.config.conv_layers == (True, True)
    assert hasattr(layer.mamba, "norm") == CASES[case]["mamba_rms_norm"]
    assert_every_path_matches(hf, ours)
    # our save: the checkpoint's weights again, within a rounding of each (x m / m) where a multiplier is not 1
    ours.save_pretrained(tmp_path / "ours")
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "ours", attn_implementation="eager").eval()
    assert type(back) is type(hf) and back.config.key_multiplier == hf.config.key_multiplier
    theirs = hf.state_dict()
    for name, t in back.state_dict().items():
        assert torch.allclose(t, theirs[name], rtol=2 ** -23, atol=0), name
    ids = torch.randint(0, 101, (2, 24), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        assert (back(input_ids=ids).logits - hf(input_ids=ids).logits).abs().max() <= TOL
    assert_save_loads(hf, tmp_path / "theirs", ids, ours)  # (its save in ours: bitwise the model built from it)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_pass_gives_the_bits_of_one_token_steps(dtype):
    assert_pass_equals_steps(pair()[1], dtype)


def test_each_part_moves_the_logits():
    """The Mamba mixer's A_log, D, convolution and gated norm, the attention's values, the MLP's gate: each counts; so
    does the state a cached step starts from."""
    hf, ours = pair()
    ids = torch.randint(0, 101, (2, 16), generator=torch.Generator().manual_seed(4))
    layer = ours.model.layers[1]
    m = layer.mamba
    assert_parts_count(hf, ours, ids, (m.A_log, m.D, m.conv1d.weight, m.norm.weight, layer.self_attn.v_proj.weight,
                                       layer.mlp.gate_proj.weight), lambda cache: cache.ssm[1].zero_())


def test_multipliers_fold_into_the_weights_and_back():
    """Loaded, each multiplier is in the weight it scales (the keys' in k_proj's rows and bias, ssm_multipliers' five
    parts in in_proj's rows); saved, the checkpoint's weights come back within a rounding."""
    from triforce.models.loading import _norm_names

    hf, _ = pair("no-norm-biased-tied")  # (biases)
    config = LlamaConfig.from_dict(hf.config.to_dict())
    theirs = {k: t.clone() for k, t in hf.state_dict().items()}
    sd = _norm_names(config, dict(theirs))
    k = "model.layers.0.self_attn.k_proj."
    assert torch.allclose(sd[k + "weight"], theirs[k + "weight"] * 1.3 * 0.7, rtol=1e-6)
    assert torch.allclose(sd[k + "bias"], theirs[k + "bias"] * 0.7, rtol=1e-6)
    in_proj = sd["model.layers.0.mamba.in_proj.weight"] / theirs["model.layers.0.mamba.in_proj.weight"]
    want = torch.tensor([0.5] * 64 + [1.2] * 64 + [0.7] * 16 + [1.1] * 16 + [0.9] * 8) * 1.25
    assert torch.allclose(in_proj.mean(1), want, rtol=1e-6)
    assert torch.allclose(sd["model.layers.1.mlp.gate_proj.weight"],
                          theirs["model.layers.1.feed_forward.gate_proj.weight"] * 0.8, rtol=1e-6)
    back = _norm_names(config, sd, inverse=True)
    assert back.keys() == theirs.keys()
    for name, t in theirs.items():
        assert torch.allclose(back[name], t, rtol=1e-6, atol=0), name


def test_a_quantised_weight_under_a_multiplier_is_refused():
    from triforce.models.loading import _norm_names

    hf, _ = pair()
    config = LlamaConfig.from_dict(hf.config.to_dict())
    sd = dict(hf.state_dict())
    k = "model.layers.0.self_attn.k_proj."
    sd[k + "weight"] = sd[k + "weight"].to(torch.int8)
    with pytest.raises(ValueError, match="float weights only"):
        _norm_names(config, sd)
    sd.pop(k + "weight")
    sd[k + "qweight"] = torch.zeros(4, 32, dtype=torch.int32)
    with pytest.raises(ValueError, match="quantised form"):
        _norm_names(config, sd)


def test_rollbacks_trees_and_rows_keep_keys_and_state_together():
    """Rolled back to any accepted length (and past the checkpoints: the state replayed), a tree's commit_path, ragged
    rows and row selection: the next logits bitwise those of a cache that saw only the kept tokens, with both the
    layers' keys and their states rolled back."""
    model = tiny(0)
    ids, want = assert_rollbacks_restore_the_state(model, length=42)
    assert_a_deep_rollback_replays(model, ids, want)
    assert_rows_kept_apart(model)
    with torch.no_grad():  # (and the attention counts: the same steps with the keys zeroed move the logits)
        cache = FullCache(model.config, 2, 96)
        model(ids[:, :12], cache=cache)
        cache.k[0].zero_()
        assert not torch.equal(_steps(model, cache, ids[:, 12:], [1]), want[:, 12:13])


@pytest.mark.parametrize("method,opts", [TINY_CASES[i] for i in (0, 2, 3, 4, 6)],
                         ids=[f"{TINY_CASES[i][0]}-{i}" for i in (0, 2, 3, 4, 6)])
def test_greedy_equals_autoregressive(method, opts):
    """Speculative decoding, MagicDec (StreamingLLM and retrieval drafts: each layer's keys dropped or selected, its
    state exact), TriForce and trees on tiny Falcon-H1 models: greedy lossless."""
    assert_greedy_equals_autoregressive(tiny(0), tiny(1), method, opts)


def test_config_reads_as_transformers_reads_it():
    """FalconH1Config's defaults: the mixer's width mamba_d_ssm (its heads' width from it), every layer both mixers,
    no gated norm; a width its heads do not divide refused; the multipliers' shapes checked."""
    want = transformers.FalconH1Config()
    c = LlamaConfig.from_dict({"model_type": "falcon_h1"})
    m = c.mamba
    assert (m.inner, m.heads, m.head_dim, m.state, m.groups, m.norm) == (
        want.mamba_d_ssm, want.mamba_n_heads, want.mamba_d_head, want.mamba_d_state, want.mamba_n_groups, "none")
    assert m.layers == (True,) * want.num_hidden_layers and c.parallel_mamba
    assert c.kv_heads_per_layer == (want.num_key_value_heads,) * want.num_hidden_layers
    assert (c.embedding_multiplier, c.logit_scale) == (1.0, 1.0)
    c = LlamaConfig.from_dict({"model_type": "falcon_h1", "mamba_d_ssm": None, "hidden_size": 256,
                               "mamba_n_heads": 8, "embedding_multiplier": 3.0, "lm_head_multiplier": 0.25})
    assert (c.mamba.inner, c.mamba.head_dim, c.embedding_multiplier, c.logit_scale) == (512, 64, 3.0, 0.25)
    for bad, match in (({"mamba_d_ssm": 1000}, "mamba_n_heads"), ({"mlp_multipliers": [1.0]}, "mlp_multipliers"),
                       ({"ssm_multipliers": [1.0] * 4}, "ssm_multipliers"), ({"key_multiplier": "x"}, "key_multiplier"),
                       ({"time_step_limit": [0.0, 1.0]}, "time_step_limit")):
        with pytest.raises(ValueError, match=match):
            LlamaConfig.from_dict({"model_type": "falcon_h1", **bad})


def falcon_h1_gguf_tensors(hf) -> tuple:
    """``(tensors, convert)`` of transformers' Falcon-H1 ``hf`` as llama.cpp's converter (FalconH1Model) writes it:
    each multiplier folded into the tensor it scales (in the tensor's float32, as the converter multiplies), the
    embeddings' into token_embd and the logits' into output; dt_bias as ssm_dt.bias, pre_ff_layernorm as ffn_norm; A
    as -exp(A_log) [H, 1], D [H, 1], the norm [groups, inner / groups], the convolution squeezed."""
    from .test_mamba2 import mamba_gguf_tensor

    c = hf.config
    gs = c.mamba_n_groups * c.mamba_d_state
    z, xs, B, C, dt = c.ssm_multipliers
    mup = torch.cat([torch.full((n,), float(f)) for n, f in ((c.mamba_d_ssm, z), (c.mamba_d_ssm, xs), (gs, B),
                                                             (gs, C), (c.mamba_n_heads, dt))])
    scale = {"embed_tokens.weight": c.embedding_multiplier, "lm_head.weight": c.lm_head_multiplier,
             "q_proj.weight": c.attention_in_multiplier, "v_proj.weight": c.attention_in_multiplier,
             "k_proj.weight": c.attention_in_multiplier * c.key_multiplier, "o_proj.weight": c.attention_out_multiplier,
             "out_proj.weight": c.ssm_out_multiplier, "gate_proj.weight": c.mlp_multipliers[0],
             "down_proj.weight": c.mlp_multipliers[1]}
    tensors = {}
    for i, layer in enumerate(hf.model.layers):
        tensors[f"blk.{i}.ssm_dt.bias"] = layer.mamba.dt_bias.detach().numpy()
        tensors[f"blk.{i}.ffn_norm.weight"] = layer.pre_ff_layernorm.weight.detach().numpy()

    def convert(name, t):
        if name.endswith(("mamba.dt_bias", "pre_ff_layernorm.weight")):
            return None
        if name.endswith("mamba.in_proj.weight"):
            return t * c.ssm_in_multiplier * mup[:, None]
        own = mamba_gguf_tensor(name, t, c.mamba_n_groups, c.mamba_d_ssm)
        if own is not None:
            return own
        key = next((k for k in scale if name.endswith(k)), None)
        return t if key is None else t * scale[key]
    return tensors, convert


@pytest.mark.parametrize("case", ["gate-before-norm-one-group", "no-norm-untied", "tied"])
def test_gguf_falcon_h1_as_llama_cpp_writes_it(tmp_path, case):
    """A falcon-h1 GGUF (llama.cpp's converter: the multipliers folded into the tensors, none in the metadata; the gated
    norm where ssm_norm is, normalising after the gate) loads with transformers' logits; Q8_0 / Q5_0 blocks bitwise.
    A tied file's head is token_embd, the embeddings' multiplier in it, as llama.cpp runs it: transformers' logits
    where the two multipliers agree."""
    from .test_families import assert_gguf_file_loads, write_converted_gguf

    kw = {"gate-before-norm-one-group": CASES["gate-before-norm-one-group"],
          "no-norm-untied": dict(mamba_rms_norm=False),
          "tied": dict(mamba_rms_norm=True, mamba_norm_before_gate=False, tie_word_embeddings=True,
                       lm_head_multiplier=MULTIPLIERS["embedding_multiplier"])}[case]
    hf, ours = drawn_pair("FalconH1", "mamba", **{**FALCON_H1, "vocab_size": 112, **kw})
    c = hf.config
    kv = {"context_length": c.max_position_embeddings, "embedding_length": c.hidden_size,
          "feed_forward_length": c.intermediate_size, "attention.head_count": c.num_attention_heads,
          "attention.head_count_kv": c.num_key_value_heads, "attention.key_length": c.head_dim,
          "attention.value_length": c.head_dim, "block_count": c.num_hidden_layers,
          "rope.freq_base": float(c.rope_parameters["rope_theta"]), "attention.layer_norm_rms_epsilon": c.rms_norm_eps,
          "ssm.conv_kernel": c.mamba_d_conv, "ssm.inner_size": c.mamba_d_ssm, "ssm.state_size": c.mamba_d_state,
          "ssm.time_step_rank": c.mamba_n_heads, "ssm.group_count": c.mamba_n_groups, "vocab_size": c.vocab_size}
    tensors, convert = falcon_h1_gguf_tensors(hf)
    loaded = assert_gguf_file_loads(hf, lambda path, quant: write_converted_gguf(
        path, hf, "falcon-h1", kv, tensors=tensors, convert=convert, quant=quant), tmp_path, 112)
    m = loaded.config.mamba
    assert loaded.config.model_type == "falcon_h1" and m.norm == ("none" if case == "no-norm-untied" else "gate_first")
    assert (m.inner, m.heads, m.groups, m.state) == (ours.config.mamba.inner, c.mamba_n_heads, c.mamba_n_groups,
                                                     c.mamba_d_state)
    assert loaded.config.embedding_multiplier == 1.0 and loaded.config.logit_scale == 1.0  # (folded)


def test_hidden_transfer_training_refuses_a_layer_with_a_state():
    """Hidden Transfer's training runs the layers past its tap as attention over cached keys: a layer with a Mamba
    mixer beside its attention (or a recurrent mixer in its place) is refused by name, not run without its state."""
    from triforce.heads.modules import HiddenTransfer

    from .test_lfm2 import tiny as tiny_lfm2

    for model in (tiny(0), tiny_lfm2(0)):
        heads = HiddenTransfer(model.config, depth=2, layer=1)
        h = torch.zeros(6, model.config.hidden_size)
        with pytest.raises(ValueError, match="hidden_transfer heads train through the attention"):
            heads.upper_forward(model, h, torch.tensor([2]), [], [])


def test_int8_copy_takes_the_mamba_mixers_projections():
    """MagicDec's int8 draft of a Falcon-H1 model quantises the Mamba mixer's projections beside the attention's and
    the MLP's (the layer's ``mamba`` module), and drafts for it losslessly."""
    from triforce.models.quant import Q8Linear, int8_copy

    model = tiny(0)
    draft = int8_copy(model)
    layer = draft.model.layers[0]
    for proj in (layer.mamba.in_proj, layer.mamba.out_proj, layer.self_attn.q_proj, layer.mlp.down_proj):
        assert type(proj) is Q8Linear
    assert type(model.model.layers[0].mamba.in_proj) is not Q8Linear  # (the target's untouched)
    assert_greedy_equals_autoregressive(model, draft, "speculative", {"gamma": 3})
