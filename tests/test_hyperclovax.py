"""HyperCLOVA X SEED (``model_type="hyperclovax"``): Granite's layer and multipliers with Peri-LN (a norm after each
block's output, before its residual multiplier: ``use_post_norm``), the logits times ``logits_scaling``, the attention
scaled by ``attention_multiplier`` or ``head_dim ** -0.5``. Against transformers' HyperCLOVAXForCausalLM."""
import pytest
import torch

from triforce.models import Llama, LlamaConfig

from .test_engines import TINY_CASES, assert_greedy_equals_autoregressive
from .test_families import TINY, tiny_family, transformers_and_ours
from .test_model import TOL
from .test_sliding_window import assert_every_path_matches, assert_pass_equals_steps

transformers = pytest.importorskip("transformers")

CASES = {
    "multipliers": dict(embedding_multiplier=1.7, residual_multiplier=0.6, logits_scaling=0.3,
                        attention_multiplier=0.2),
    "no-post-norm": dict(use_post_norm=False, residual_multiplier=0.6, logits_scaling=2.0),
    "defaults": {},
}


@pytest.mark.parametrize("case", list(CASES))
def test_every_path_and_our_save_match_transformers(tmp_path, case):
    hf, ours = transformers_and_ours("HyperCLOVAX", **TINY, **CASES[case])
    c = ours.config
    assert c.sandwich_norms == CASES[case].get("use_post_norm", True)
    assert c.logit_scale == CASES[case].get("logits_scaling", 1.0) and c.logits_scaling == 1.0
    assert c.attention_scale == CASES[case].get("attention_multiplier", c.head_dim ** -0.5)
    ids, ref = assert_every_path_matches(hf, ours)
    ours.save_pretrained(tmp_path)
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    assert type(back).__name__ == "HyperCLOVAXForCausalLM"
    assert all(torch.equal(t, hf.state_dict()[k]) for k, t in back.state_dict().items())
    with torch.no_grad():
        assert (back(ids).logits - ref).abs().max().item() <= TOL
        assert torch.equal(Llama.from_pretrained(tmp_path)(ids), ours(ids))


def test_peri_ln_and_the_logits_factor_matter():
    """Read as Granite (no Peri-LN, the logits divided by logits_scaling), the logits move far past the tolerance."""
    hf, ours = transformers_and_ours("HyperCLOVAX", **TINY, **CASES["multipliers"])
    ids = torch.randint(0, 101, (2, 30), generator=torch.Generator().manual_seed(2))
    d = {k: v for k, v in hf.config.to_dict().items() if k not in ("use_post_norm", "model_type", "architectures")}
    granite = transformers.GraniteForCausalLM(transformers.GraniteConfig(**d)).eval()
    granite.load_state_dict({k: v for k, v in hf.state_dict().items() if "post_norm" not in k})
    with torch.no_grad():
        ref = hf(ids).logits
        assert (ours(ids) - ref).abs().max().item() <= TOL
        assert (granite(ids).logits - ref).abs().max().item() > 100 * TOL


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_pass_gives_the_bits_of_one_token_steps(dtype):
    assert_pass_equals_steps(transformers_and_ours("HyperCLOVAX", **TINY, **CASES["multipliers"])[1], dtype)


def test_defaults_and_bad_values():
    c = LlamaConfig.from_dict({"model_type": "hyperclovax", "hidden_size": 64, "num_attention_heads": 4})
    assert c.sandwich_norms and c.attention_scale == 16 ** -0.5 and c.logit_scale == 1.0
    for key, value in (("use_post_norm", "yes"), ("logits_scaling", 0), ("attention_multiplier", "x")):
        with pytest.raises(ValueError, match=key):
            LlamaConfig.from_dict({"model_type": "hyperclovax", key: value})


@pytest.mark.parametrize("method,opts", [TINY_CASES[i] for i in (0, 4, 6)],
                         ids=[f"{TINY_CASES[i][0]}-{i}" for i in (0, 4, 6)])
def test_greedy_equals_autoregressive(method, opts):
    extra = {"residual_multiplier": 0.6, "logits_scaling": 2.0, "embedding_multiplier": 1.5}
    assert_greedy_equals_autoregressive(tiny_family("hyperclovax", 0, extra=extra),
                                        tiny_family("hyperclovax", 1, extra=extra), method, opts)
