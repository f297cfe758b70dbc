"""IQuest-Coder-V1 (``model_type="iquestcoder"``: IQuest-Coder-V1-40B Base / Instruct): Llama's layer under its own
config (IQuestCoderConfig's defaults), which transformers runs as LlamaForCausalLM; its original code's ``clip_qkv``
and sliding window refused as transformers refuses them."""
import pytest
import torch

from triforce.models import Llama, LlamaConfig

from .test_families import TINY, randomize_
from .test_model import TOL
from .test_sliding_window import assert_every_path_matches

transformers = pytest.importorskip("transformers")


def iquestcoder(**kw):
    """A tiny random transformers model of an IQuestCoderConfig (eager attention) and ours from its config and
    weights."""
    from triforce.models.loading import _build

    torch.manual_seed(0)
    config = transformers.AutoConfig.for_model("iquestcoder", **{**TINY, "head_dim": 16, **kw},
                                               attn_implementation="eager")
    hf = randomize_(transformers.AutoModelForCausalLM.from_config(config).eval())
    return hf, _build(LlamaConfig.from_dict(hf.config.to_dict()), hf.state_dict(), None, None)


@pytest.mark.parametrize("kw", [{}, {"attention_bias": True, "mlp_bias": True, "tie_word_embeddings": True}],
                         ids=["default", "biases-tied"])
def test_every_path_and_our_save_match_transformers(tmp_path, kw):
    hf, ours = iquestcoder(**kw)
    assert type(hf).__name__ == "LlamaForCausalLM" and ours.config.model_type == "iquestcoder"
    assert_every_path_matches(hf, ours)
    ours.save_pretrained(tmp_path)
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    assert type(back.config).__name__ == "IQuestCoderConfig" and type(back).__name__ == "LlamaForCausalLM"
    assert all(torch.equal(t, hf.state_dict()[k]) for k, t in back.state_dict().items())
    ids = torch.randint(0, 101, (2, 30), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        assert torch.equal(Llama.from_pretrained(tmp_path)(ids), ours(ids))


def test_defaults():
    """A config without the keys takes IQuestCoderConfig's (the 40B shape, head_dim 128, RoPE base 1e4)."""
    c, want = LlamaConfig.from_dict({"model_type": "iquestcoder"}), transformers.AutoConfig.for_model("iquestcoder")
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "head_dim", "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings",
                 "attention_bias", "mlp_bias"):
        assert getattr(c, name) == getattr(want, name), name
    assert c.rope_theta == want.rope_parameters["rope_theta"]


@pytest.mark.parametrize("extra,reads", [({"use_sliding_window": False, "sliding_window": 4096,
                                           "max_window_layers": 3}, True),
                                         ({"sliding_window": 8}, True),
                                         ({"use_sliding_window": True, "sliding_window": 8}, False),
                                         ({"clip_qkv": 8.0}, False), ({"clip_qkv": None}, True)])
def test_the_original_codes_window_and_clamp(extra, reads):
    """With its window off its window keys are not read (transformers' LlamaForCausalLM has none: the logits are the
    same); the window on or a clamp raises in both, as no released checkpoint sets them."""
    if not reads:
        with pytest.raises(Exception, match="IQuestCoder does not support"):
            transformers.AutoConfig.for_model("iquestcoder", **extra)
        with pytest.raises(ValueError, match=next(iter(extra))):
            LlamaConfig.from_dict({"model_type": "iquestcoder", **extra})
        return
    hf, ours = iquestcoder(**extra)
    assert not any(ours.config.layer_windows) and ours.config.clip_qkv is None
    ids = torch.randint(0, 101, (2, 40), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        assert (ours(ids) - hf(ids).logits).abs().max().item() <= TOL


def test_its_own_code_named_in_auto_map_reads_as_transformers_runs_it():
    """IQuest-Coder's config.json names its remote code (IQuestCoderConfig, IQuestCoderForCausalLM): transformers runs
    it as LlamaForCausalLM, so the key reads; another class there raises."""
    own = {"AutoConfig": "configuration_iquestcoder.IQuestCoderConfig",
           "AutoModelForCausalLM": "modeling_iquestcoder.IQuestCoderForCausalLM"}
    c = LlamaConfig.from_dict({"model_type": "iquestcoder", "architectures": ["IQuestCoderForCausalLM"], "auto_map": own})
    assert c.extra["auto_map"] == own
    with pytest.raises(ValueError, match="auto_map"):
        LlamaConfig.from_dict({"model_type": "iquestcoder", "auto_map": {
            **own, "AutoModelForCausalLM": "modeling_iquestcoder.IQuestLoopCoderForCausalLM"}})
