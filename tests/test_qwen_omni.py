"""Qwen's omni models (Qwen2.5-Omni 3B / 7B: a Qwen2 language model; Qwen3-Omni-30B-A3B: a Qwen3-MoE one) load as
their thinker's language model, from the whole model's checkpoint (thinker, talker, speech decoder: only the thinker's
language model read) or the thinker's alone, against transformers' thinker on text tokens (M-RoPE: a text token's
three positions are one, so its RoPE is the family's)."""
import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from triforce.models import Llama, LlamaConfig  # noqa: E402
from triforce.models.config import FAMILIES  # noqa: E402

from .test_families import randomize_  # noqa: E402
from .test_model import TOL  # noqa: E402
from .test_sliding_window import assert_every_path_matches  # noqa: E402

TEXT = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=128, bos_token_id=1, eos_token_id=2)
VISION = {"depth": 1, "hidden_size": 16, "num_heads": 2, "intermediate_size": 32, "out_hidden_size": 32}
AUDIO = {"encoder_layers": 1, "d_model": 16, "encoder_attention_heads": 2, "encoder_ffn_dim": 32, "output_dim": 32,
         "num_mel_bins": 16}
KINDS = {  # thinker model_type -> (its text_config, the family it reads as)
    "qwen2_5_omni_thinker": ({**TEXT, "rope_parameters": {"rope_type": "default", "mrope_section": [2, 1, 1],
                                                          "rope_theta": 1e6}}, "qwen2"),
    "qwen3_omni_moe_thinker": ({**TEXT, "head_dim": 16, "num_experts": 4, "num_experts_per_tok": 2,
                                "moe_intermediate_size": 24, "rope_parameters": {
                                    "rope_type": "default", "mrope_section": [4, 2, 2], "mrope_interleaved": True,
                                    "rope_theta": 5e6}}, "qwen3_moe"),
}


class Thinker(torch.nn.Module):
    """A whole omni model's thinker as the tests' oracle: ``(ids).logits`` of the text tokens."""

    def __init__(self, thinker):
        super().__init__()
        self.thinker = thinker

    def forward(self, ids):
        return self.thinker(input_ids=ids)


def thinker(kind, **kw):
    text, _ = KINDS[kind]
    config = transformers.AutoConfig.for_model(kind, text_config=text, vision_config=VISION, audio_config=AUDIO,
                                               attn_implementation="eager", **kw)
    torch.manual_seed(0)
    model = getattr(transformers, type(config).__name__.replace("Config", "ForConditionalGeneration"))(config)
    return randomize_(model.eval())


@pytest.mark.parametrize("tie", [False, True])
@pytest.mark.parametrize("kind", list(KINDS))
def test_the_thinkers_checkpoint_loads_with_its_logits(tmp_path, kind, tie):
    """Every path gives the thinker's logits on text; its head tied by the thinker's key alone; our save is the
    language model, which transformers reads back with the same logits."""
    hf = thinker(kind, tie_word_embeddings=tie)
    hf.save_pretrained(tmp_path / "hf")
    ours = Llama.from_pretrained(tmp_path / "hf")
    family = KINDS[kind][1]
    assert ours.config.model_type == family and ours.config.tie_word_embeddings == tie
    assert not any("visual" in n or "audio" in n for n in ours.state_dict())
    ids, ref = assert_every_path_matches(hf, ours)
    ours.save_pretrained(tmp_path / "ours")
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "ours", attn_implementation="eager").eval()
    assert type(back).__name__ == FAMILIES[family].architecture
    with torch.no_grad():
        assert (back(ids).logits - ref).abs().max().item() <= TOL


@pytest.mark.parametrize("kind", ["qwen2_5_omni", "qwen3_omni_moe"])
def test_the_whole_models_checkpoint_loads_as_its_thinkers_language_model(tmp_path, kind):
    """The whole model's checkpoint (its config's thinker_config; the thinker's weights under thinker.*, the talker's
    and the speech decoder's beside them, not read) gives its thinker's logits on every path."""
    text, family = KINDS[f"{kind}_thinker"]
    config = transformers.AutoConfig.for_model(kind, thinker_config={
        "text_config": text, "vision_config": VISION, "audio_config": AUDIO}, enable_audio_output=False)
    torch.manual_seed(0)
    whole = getattr(transformers, type(config).__name__.replace("Config", "ForConditionalGeneration"))(config)
    randomize_(whole.eval())
    whole.save_pretrained(tmp_path / "hf")
    saved = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert saved["model_type"] == kind and "thinker_config" in saved
    ours = Llama.from_pretrained(tmp_path / "hf")
    assert ours.config.model_type == family
    whole.thinker.config._attn_implementation = "eager"
    assert_every_path_matches(Thinker(whole.thinker).eval(), ours)


def test_configs_read_as_transformers_reads_them():
    """The thinkers' text configs' defaults (Qwen2.5-Omni-7B's shape; Qwen3-Omni's, its head_dim hidden / heads where
    absent: 32 heads here, as its default 28 does not divide its hidden 2048); keys the wrappers do not read raise, as
    does a text_config at the top of the whole model's."""
    for kind, text in (("qwen2_5_omni_thinker", {}), ("qwen3_omni_moe_thinker", {"num_attention_heads": 32})):
        want = transformers.AutoConfig.for_model(kind, text_config=text).text_config
        c = LlamaConfig.from_dict({"model_type": kind, "text_config": text})
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "max_position_embeddings", "rms_norm_eps"):
            assert getattr(c, name) == getattr(want, name), (kind, name)
        assert c.head_dim == getattr(want, "head_dim", want.hidden_size // want.num_attention_heads)
        assert not c.tie_word_embeddings
    with pytest.raises(ValueError, match="thinker_config"):
        LlamaConfig.from_dict({"model_type": "qwen3_omni_moe", "text_config": {}})
    with pytest.raises(ValueError, match="'speaker_id'"):
        LlamaConfig.from_dict({"model_type": "qwen2_5_omni_thinker", "text_config": {}, "speaker_id": 3})


# a config in Qwen3-Omni-30B-A3B-Instruct's shape (its thinker's text_config's keys as Qwen ships them; the talker's
# and the speech decoder's configs are not read, so left out)
QWEN3_OMNI = {"model_type": "qwen3_omni_moe", "architectures": ["Qwen3OmniMoeForConditionalGeneration"],
              "enable_audio_output": True, "thinker_config": {
                  "model_type": "qwen3_omni_moe_thinker", "audio_token_id": 151675, "image_token_id": 151655,
                  "video_token_id": 151656, "position_id_per_seconds": 13, "user_token_id": 872,
                  "tie_word_embeddings": False, "text_config": {
                      "model_type": "qwen3_omni_moe_text", "hidden_size": 2048, "intermediate_size": 768,
                      "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
                      "moe_intermediate_size": 768, "num_experts": 128, "num_experts_per_tok": 8,
                      "vocab_size": 151936, "max_position_embeddings": 65536, "rms_norm_eps": 1e-6,
                      "rope_scaling": {"interleaved": True, "mrope_interleaved": True, "mrope_section": [24, 20, 20],
                                       "rope_type": "default"}, "rope_theta": 1000000, "sliding_window": None,
                      "use_sliding_window": False, "decoder_sparse_step": 1, "mlp_only_layers": [],
                      "norm_topk_prob": True, "attention_bias": False, "hidden_act": "silu"}}}


def test_a_qwen3_omni_shaped_config_reads_as_its_language_model():
    c = LlamaConfig.from_dict(QWEN3_OMNI)
    e = c.experts
    assert (c.model_type, c.num_hidden_layers, c.head_dim, c.num_key_value_heads, c.rope_theta) == (
        "qwen3_moe", 48, 128, 4, 1e6)
    assert (e.count, e.top_k, e.intermediate_size, e.renormalize) == (128, 8, 768, True)
    assert c.rope_scaling is None and not any(c.layer_windows) and not c.tie_word_embeddings
