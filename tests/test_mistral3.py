"""Mistral 3's image + text checkpoints (``model_type="mistral3"``: Mistral Small 3.1 / 3.2) load as their
Mistral language model, against transformers' Mistral3ForConditionalGeneration and MistralForCausalLM."""
import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from triforce.models import Llama, LlamaConfig  # noqa: E402

from .test_families import randomize_  # noqa: E402
from .test_model import TOL  # noqa: E402

TEXT = dict(model_type="mistral", vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
            sliding_window=None, rope_theta=1e9)
VISION = dict(model_type="pixtral", hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
              head_dim=16, image_size=28, patch_size=14)


def hf_mistral3(**text):
    config = transformers.Mistral3Config(text_config={**TEXT, **text}, vision_config=VISION, image_token_index=95,
                                         attn_implementation="eager")
    torch.manual_seed(0)
    return randomize_(transformers.Mistral3ForConditionalGeneration(config).eval())


def ids():
    return torch.randint(0, 95, (2, 30), generator=torch.Generator().manual_seed(3))  # text tokens only


def test_the_checkpoint_transformers_5_saves_loads_with_its_logits(tmp_path):
    """transformers 5 saves the wrapper's tie_word_embeddings (Mistral3Config's default: true) and no head: the
    model loads tied, with transformers' logits; the image side is not read."""
    hf = hf_mistral3()
    hf.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["tie_word_embeddings"] is True and saved["text_config"]["tie_word_embeddings"] is False
    ours = Llama.from_pretrained(tmp_path)
    assert ours.config.model_type == "mistral" and ours.config.tie_word_embeddings
    assert ours.config.layer_windows == (0, 0)
    with torch.no_grad():
        assert (ours(ids()) - hf(input_ids=ids()).logits).abs().max().item() <= TOL


def test_the_checkpoint_mistral_ships_loads_its_untied_head(tmp_path):
    """Mistral Small 3.1's checkpoint (transformers 4's layout: no top-level tie_word_embeddings, the head under
    ``language_model.lm_head``) loads with its own head: the logits of transformers' MistralForCausalLM on the
    same text weights (transformers 5's Mistral3 would tie the head and drop those weights). A wrapper without
    text_config, or whose text_config is another family, raises."""
    from safetensors.torch import load_file, save_file

    hf = hf_mistral3()
    hf.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    del config["tie_word_embeddings"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    saved = load_file(tmp_path / "model.safetensors")
    assert "language_model.lm_head.weight" not in saved and any(k.startswith("vision_tower.") for k in saved)
    head = torch.randn(96, 32, generator=torch.Generator().manual_seed(4))
    save_file({**saved, "language_model.lm_head.weight": head}, tmp_path / "model.safetensors")
    ours = Llama.from_pretrained(tmp_path)
    assert not ours.config.tie_word_embeddings

    text = transformers.MistralForCausalLM(transformers.MistralConfig(**TEXT, attn_implementation="eager")).eval()
    state = {k.replace("language_model.", "", 1): v for k, v in saved.items() if k.startswith("language_model.")}
    text.load_state_dict({**state, "lm_head.weight": head})
    with torch.no_grad():
        ref = text(input_ids=ids()).logits
        assert (ours(ids()) - ref).abs().max().item() <= TOL
        assert (ref - hf(input_ids=ids()).logits).abs().max().item() > 1e-2  # the tied head gives other logits
    for bad, match in (({}, "has no text_config"),
                       ({"text_config": {**TEXT, "model_type": "llama"}}, "must be 'mistral'"),
                       ({"text_config": TEXT, "hidden_size": 8}, "'hidden_size' of model_type 'mistral3'")):
        d = {k: v for k, v in config.items() if k != "text_config"}
        with pytest.raises(ValueError, match=match):
            LlamaConfig.from_dict({**d, **bad})


def test_the_config_mistral_ships_reads_as_transformers_reads_it():
    """A config.json shaped as Mistral-Small-3.1-24B-Instruct-2503's: the text model transformers builds from it."""
    d = {"architectures": ["Mistral3ForConditionalGeneration"], "image_token_index": 10, "model_type": "mistral3",
         "multimodal_projector_bias": False, "projector_hidden_act": "gelu", "spatial_merge_size": 2,
         "text_config": {"attention_dropout": 0.0, "head_dim": 128, "hidden_act": "silu", "hidden_size": 5120,
                         "initializer_range": 0.02, "intermediate_size": 32768, "max_position_embeddings": 131072,
                         "model_type": "mistral", "num_attention_heads": 32, "num_hidden_layers": 40,
                         "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 1000000000.0,
                         "sliding_window": None, "use_cache": True, "vocab_size": 131072},
         "torch_dtype": "bfloat16", "transformers_version": "4.50.0.dev0",
         "vision_config": {"head_dim": 64, "hidden_act": "silu", "hidden_size": 1024, "image_size": 1540,
                           "intermediate_size": 4096, "model_type": "pixtral", "num_attention_heads": 16,
                           "num_channels": 3, "num_hidden_layers": 24, "patch_size": 14, "rope_theta": 10000.0},
         "vision_feature_layer": -1}
    c = LlamaConfig.from_dict(d)
    want = transformers.Mistral3Config.from_dict(d).text_config
    assert c.model_type == "mistral" and c.layer_windows == (0,) * 40
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "head_dim", "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings"):
        assert getattr(c, name) == getattr(want, name), name
    assert c.rope_theta == want.rope_parameters["rope_theta"] == 1e9 and not c.tie_word_embeddings
    assert LlamaConfig.from_dict({**d, "tie_word_embeddings": True}).tie_word_embeddings


def test_a_mistral3_gguf_file_runs_as_llama(tmp_path):
    """llama.cpp's converter writes Mistral Small 3.1 / 3.2 as architecture ``mistral3``: llama's tensors, q / k
    permuted; it loads with the logits of the model it was written from. With attention.temperature_scale it is
    Ministral 3 (tests/test_ministral3.py), which needs YaRN: without it the file raises naming the key."""
    from .test_config import write_gguf
    from .test_families import TINY

    torch.manual_seed(0)
    model = randomize_(Llama(LlamaConfig(**{**TINY, "tie_word_embeddings": False})).eval())
    loaded = Llama.from_pretrained(write_gguf(tmp_path / "m.gguf", model, arch="mistral3"), cache_dir=False)
    ids = torch.randint(0, 101, (2, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert (loaded(ids) - model(ids)).abs().max().item() <= TOL
    with pytest.raises(ValueError, match="mistral3.attention.temperature_scale"):
        Llama.from_pretrained(write_gguf(tmp_path / "t.gguf", model, {"attention.temperature_scale": 0.1},
                                         arch="mistral3"), cache_dir=False)
