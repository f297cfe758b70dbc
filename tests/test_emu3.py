"""Emu3's language model (``model_type="emu3_text_model"``: Emu3ForCausalLM, and Emu3ForConditionalGeneration's
checkpoints, ``emu3``, read text-only): Llama's layer, read as Llama; against transformers."""
import pytest
import torch

from triforce.models import Llama, LlamaConfig

from .test_families import assert_common_defaults, assert_save_loads, randomize_
from .test_sliding_window import assert_every_path_matches

transformers = pytest.importorskip("transformers")

TEXT = dict(vocab_size=101, hidden_size=64, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=128, pad_token_id=0, bos_token_id=1, eos_token_id=2)
# (the smallest VQ-VAE transformers builds: its group norms take 32 channels)
VQ = dict(embed_dim=32, codebook_size=16, latent_channels=32, base_channels=32, channel_multiplier=[1],
          num_res_blocks=1, attn_resolutions=[], hidden_size=32, num_attention_heads=1, temporal_downsample_factor=1)


def test_text_model_matches_transformers():
    """Emu3ForCausalLM's logits on every path, read as Llama."""
    from triforce.models.loading import _build

    torch.manual_seed(0)
    hf = randomize_(transformers.Emu3ForCausalLM(transformers.Emu3TextConfig(**TEXT)).eval())
    ours = _build(LlamaConfig.from_dict(hf.config.to_dict()), hf.state_dict(), None, None)
    assert ours.config.model_type == "llama"
    assert_every_path_matches(hf, ours)


@pytest.mark.parametrize("tied", [False, True])
def test_wrapper_directory_loads(tmp_path, tied):
    """Emu3ForConditionalGeneration's save (its language model under text_model.*, its VQ-VAE not read) loads with its
    logits; the head tied by the wrapper's key."""
    config = transformers.Emu3Config(vq_config=VQ, text_config=TEXT, vocabulary_map={"<|extra_0|>": 5},
                                     tie_word_embeddings=tied)
    torch.manual_seed(0)
    hf = randomize_(transformers.Emu3ForConditionalGeneration(config).eval())
    assert_save_loads(hf, tmp_path, torch.randint(0, 101, (2, 20), generator=torch.Generator().manual_seed(5)))
    assert Llama.from_pretrained(tmp_path).config.tie_word_embeddings == tied


def test_config_keys_and_defaults():
    """Emu3TextConfig's defaults read; its dropout (training only) dropped, a bad one refused."""
    c = LlamaConfig.from_dict({"model_type": "emu3_text_model"})
    assert_common_defaults(c, transformers.Emu3TextConfig())
    assert c.pad_token_id == transformers.Emu3TextConfig().pad_token_id
    assert c.rope_theta == transformers.Emu3TextConfig().rope_parameters["rope_theta"]
    with pytest.raises(ValueError, match="attention_dropout"):
        LlamaConfig.from_dict({"model_type": "emu3_text_model", "attention_dropout": 2})
    with pytest.raises(ValueError, match="text_config"):
        LlamaConfig.from_dict({"model_type": "emu3", "text_config": {"model_type": "llama"}})
