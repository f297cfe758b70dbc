"""CodeGen (``model_type="codegen"``: Salesforce's codegen-350M / 2B / 6B / 16B): GPT-J's layer and config with q, k
and v as one ``qkv_proj`` in its model-parallel layout (4 blocks of ``[q; v; k]``); against transformers'
CodeGenForCausalLM."""
import pytest
import torch

from triforce.models import LlamaConfig

from .test_engines import TINY_CASES, assert_greedy_equals_autoregressive
from .test_families import assert_our_save_reads_back, assert_saved_names_are_transformers, model_type_and_ours
from .test_model import TOL
from .test_sliding_window import assert_every_path_matches

transformers = pytest.importorskip("transformers")

BASE = dict(vocab_size=101, n_embd=64, n_layer=3, n_head=8, n_positions=512, rotary_dim=4, bos_token_id=1,
            eos_token_id=2, initializer_range=0.2)  # (8 heads: two per model-parallel block)
CASES = {"default": {}, "inner-tied-ctx": {"n_inner": 80, "tie_word_embeddings": True, "n_ctx": 256}}


def codegen(**kw):
    """A tiny random transformers CodeGenForCausalLM and ours."""
    return model_type_and_ours("codegen", **{**BASE, **kw})


@pytest.mark.parametrize("case", list(CASES))
def test_every_path_and_our_save_match_transformers(tmp_path, case):
    hf, ours = codegen(**CASES[case])
    assert_every_path_matches(hf, ours)
    back = assert_our_save_reads_back(tmp_path, hf, ours)
    for key in ("n_embd", "n_layer", "n_head", "n_inner", "rotary_dim", "n_ctx"):
        assert getattr(back, key) == getattr(hf.config, key), key


def test_its_fused_projection_splits_and_joins_back(tmp_path):
    """Its qkv_proj read as q, k and v (the blocks' rows in its order; q's and k's RoPE dims then reordered, as GPT-J's)
    and written back bitwise, under its names."""
    hf, ours = codegen()
    w = hf.state_dict()["transformer.h.1.attn.qkv_proj.weight"]
    blocks = w.reshape(4, 3, 16, 64)  # (4 blocks of [q; v; k], each 2 heads of 8 dims)
    assert torch.equal(ours.model.layers[1].self_attn.v_proj.weight, blocks[:, 1].reshape(64, 64))
    assert_saved_names_are_transformers(tmp_path, hf, ours, ["transformer.h.0.attn.qkv_proj.weight"])


def test_the_layout_matters():
    """q, v, k read in GPT-NeoX's or Phi-3's order (q, k, v) instead: the logits move past TOL."""
    from triforce.models.loading import _build

    hf, _ = codegen()
    sd = dict(hf.state_dict())
    for i in range(3):
        name = f"transformer.h.{i}.attn.qkv_proj.weight"
        q, v, k = sd[name].reshape(4, 3, 16, 64).unbind(1)
        sd[name] = torch.stack([q, k, v], 1).reshape(192, 64)  # (k and v swapped in every block)
    ids = torch.randint(0, 101, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        other = _build(LlamaConfig.from_dict(hf.config.to_dict()), sd, None, None)
        assert (other(ids) - hf(ids).logits).abs().max().item() > 100 * TOL


def test_defaults():
    """A config without the keys takes CodeGenConfig's (GPT-J's shape and rotary_dim 64)."""
    c, want = LlamaConfig.from_dict({"model_type": "codegen"}), transformers.AutoConfig.for_model("codegen")
    assert (c.vocab_size, c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.max_position_embeddings,
            c.rotary_dim, c.intermediate_size) == (want.vocab_size, want.n_embd, want.n_layer, want.n_head,
                                                   want.n_positions, want.rotary_dim, 4 * want.n_embd)


@pytest.mark.parametrize("method,opts", [TINY_CASES[i] for i in (0, 3, 4, 6)],
                         ids=[f"{TINY_CASES[i][0]}-{i}" for i in (0, 3, 4, 6)])
def test_greedy_equals_autoregressive(method, opts):
    """The engines over a CodeGen model give its greedy tokens (a layer-skip draft for the two-model methods)."""
    _, ours = codegen(**CASES["inner-tied-ctx"])
    assert_greedy_equals_autoregressive(ours, ours.layer_skip(2), method, opts)
