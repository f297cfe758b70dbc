"""Image (or audio) + text checkpoints whose text_config is any language model (LLaVA 1.5, LLaVA-NeXT,
LLaVA-NeXT-Video, LLaVA-OneVision, InternVL, Idefics3, SmolVLM, Aya Vision, Qwen2-Audio) load as that language model,
against transformers' wrappers on text; Llama 3.2 Vision as the Llama of its self-attention layers."""
import copy
import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from triforce.models import LlamaConfig  # noqa: E402

from .test_families import randomize_  # noqa: E402
from .test_qwen_vl import assert_loads_as_its_language_model  # noqa: E402

TEXT = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2)
CLIP = {"model_type": "clip_vision_model", "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
        "num_attention_heads": 2, "image_size": 28, "patch_size": 14, "projection_dim": 16}
SIGLIP = {"model_type": "siglip_vision_model", "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
          "num_attention_heads": 2, "image_size": 28, "patch_size": 14}
SMALL = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
         "image_size": 28, "patch_size": 14}
INTERNVL = {**SMALL, "image_size": [28, 28], "patch_size": [14, 14]}
# model_type -> (config class, model class, its kwargs, the text model's family); the language models drawn from
# several families (a window in Mistral's and Cohere 2's, past which assert_every_path_matches runs)
KINDS = {
    "llava": ("LlavaConfig", "LlavaForConditionalGeneration", dict(
        vision_config=CLIP, image_token_index=127,
        text_config={**TEXT, "model_type": "mistral", "sliding_window": 7}), "mistral"),
    "llava_next": ("LlavaNextConfig", "LlavaNextForConditionalGeneration", dict(
        vision_config=CLIP, image_token_index=127, image_grid_pinpoints=[[28, 28]],
        text_config={**TEXT, "model_type": "llama"}), "llama"),
    "llava_onevision": ("LlavaOnevisionConfig", "LlavaOnevisionForConditionalGeneration", dict(
        vision_config=SIGLIP, image_token_index=127, video_token_index=126, image_grid_pinpoints=[[28, 28]],
        text_config={**TEXT, "model_type": "qwen2"}), "qwen2"),
    "internvl": ("InternVLConfig", "InternVLForConditionalGeneration", dict(
        vision_config=INTERNVL, image_token_id=127, text_config={**TEXT, "model_type": "qwen3", "head_dim": 16}),
        "qwen3"),
    "idefics3": ("Idefics3Config", "Idefics3ForConditionalGeneration", dict(
        vision_config=SMALL, image_token_id=127, text_config={**TEXT, "model_type": "llama"}), "llama"),
    "smolvlm": ("SmolVLMConfig", "SmolVLMForConditionalGeneration", dict(
        vision_config=SMALL, image_token_id=127, text_config={**TEXT, "model_type": "llama", "rms_norm_eps": 1e-5}),
        "llama"),
    "aya_vision": ("AyaVisionConfig", "AyaVisionForConditionalGeneration", dict(
        vision_config=SIGLIP, image_token_index=127,
        text_config={**TEXT, "model_type": "cohere2", "sliding_window": 7, "logit_scale": 0.5}), "cohere2"),
    "llava_next_video": ("LlavaNextVideoConfig", "LlavaNextVideoForConditionalGeneration", dict(
        vision_config=CLIP, image_token_index=127, video_token_index=126, image_grid_pinpoints=[[28, 28]],
        text_config={**TEXT, "model_type": "llama"}), "llama"),
    "exaone4_5": ("Exaone4_5_Config", "Exaone4_5_ForConditionalGeneration", dict(
        vision_config={"depth": 1, "hidden_size": 16, "num_heads": 2, "out_hidden_size": 32, "intermediate_size": 32,
                       "fullatt_block_indexes": [0]},
        text_config={**TEXT, "model_type": "exaone4", "num_hidden_layers": 4, "sliding_window": 7,
                     "sliding_window_pattern": 4}), "exaone4"),
    "qwen2_audio": ("Qwen2AudioConfig", "Qwen2AudioForConditionalGeneration", dict(
        audio_config={"d_model": 16, "encoder_layers": 1, "encoder_attention_heads": 2, "encoder_ffn_dim": 32,
                      "num_mel_bins": 8, "max_source_positions": 16}, audio_token_index=127,
        text_config={**TEXT, "model_type": "qwen2"}), "qwen2"),
}


def hf_wrapper(kind, **kw):
    config_class, model_class, base, _ = KINDS[kind]
    config = getattr(transformers, config_class)(**{**base, **kw}, attn_implementation="eager")
    torch.manual_seed(0)
    return randomize_(getattr(transformers, model_class)(config).eval())


@pytest.mark.parametrize("kind", list(KINDS))
def test_the_checkpoint_transformers_5_saves_loads_with_its_logits(tmp_path, kind):
    """Every path (the plain forward, a chunked prefill, a verify pass, one-token steps, a tree) gives the wrapper's
    logits on text; the image side is not read; our save is the language model, which transformers reads back."""
    assert_loads_as_its_language_model(hf_wrapper(kind), tmp_path, kind, KINDS[kind][3])


def test_the_tied_head_as_transformers_5_ties_it():
    """LLaVA and LLaVA-OneVision: tied where the wrapper's or the text_config's key (or its family's default) says
    so; LLaVA-NeXT, Idefics3, SmolVLM: the wrapper's key alone (default untied); InternVL, Aya Vision: the wrapper's
    key alone, tied by default. Each against transformers' config class."""
    for kind in KINDS:
        config_class, model_class, base, _ = KINDS[kind]
        for wrapper in (None, True, False):
            for text in (None, True, False):
                d = {"model_type": kind, **base,
                     "text_config": {**base["text_config"], **({} if text is None else {"tie_word_embeddings": text})},
                     **({} if wrapper is None else {"tie_word_embeddings": wrapper})}
                config = getattr(transformers, config_class).from_dict(copy.deepcopy(d))
                if hasattr(config, "tie_word_embeddings"):
                    want = config.tie_word_embeddings
                else:  # (Qwen2-Audio's has no key: its model says)
                    model = getattr(transformers, model_class)(config)
                    want = model.get_output_embeddings().weight is model.get_input_embeddings().weight
                assert LlamaConfig.from_dict(d).tie_word_embeddings == want, (kind, wrapper, text)
    # a text model tied by its family's default (Gemma's), no key anywhere: LLaVA ties (transformers 5)
    d = {"model_type": "llava", "text_config": {**TEXT, "model_type": "gemma", "head_dim": 8}}
    assert transformers.LlavaConfig.from_dict(copy.deepcopy(d)).tie_word_embeddings
    assert LlamaConfig.from_dict(d).tie_word_embeddings


LLAVA_1_5_7B = {  # llava-hf/llava-1.5-7b-hf's config.json (transformers 4.36), the vision side cut short
    "architectures": ["LlavaForConditionalGeneration"], "ignore_index": -100, "image_token_index": 32000,
    "model_type": "llava", "pad_token_id": 32001, "projector_hidden_act": "gelu",
    "text_config": {"_name_or_path": "lmsys/vicuna-7b-v1.5", "architectures": ["LlamaForCausalLM"],
                    "max_position_embeddings": 4096, "model_type": "llama", "rms_norm_eps": 1e-05,
                    "torch_dtype": "float16", "vocab_size": 32064},
    "tie_word_embeddings": False, "torch_dtype": "float16", "transformers_version": "4.36.0.dev0",
    "vision_config": {"hidden_size": 1024, "image_size": 336, "intermediate_size": 4096,
                      "model_type": "clip_vision_model", "num_attention_heads": 16, "num_hidden_layers": 24,
                      "patch_size": 14, "projection_dim": 768, "vocab_size": 32000},
    "vision_feature_layer": -2, "vision_feature_select_strategy": "default", "vocab_size": 32064}


def test_a_config_shaped_as_llava_1_5s_reads_as_transformers_reads_it():
    c = LlamaConfig.from_dict(LLAVA_1_5_7B)
    want = transformers.LlavaConfig.from_dict(copy.deepcopy(LLAVA_1_5_7B)).text_config
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "head_dim", "max_position_embeddings", "rms_norm_eps"):
        assert getattr(c, name) == getattr(want, name), name
    assert c.model_type == "llama" and not c.tie_word_embeddings and c.pad_token_id == 32001


def test_exaone_4_5s_first_text_model_type_reads_as_exaone4():
    d = {"model_type": "exaone4_5", "text_config": {**TEXT, "model_type": "exaone4_5_text", "sliding_window": 7,
                                                    "num_hidden_layers": 4, "sliding_window_pattern": 4}}
    c, want = LlamaConfig.from_dict(d), transformers.Exaone4_5_Config.from_dict(copy.deepcopy(d)).text_config
    assert c.model_type == want.model_type == "exaone4"
    assert c.layer_windows == tuple(7 if t == "sliding_attention" else 0 for t in want.layer_types) == (7, 7, 7, 0)


def test_what_would_not_be_read_so_raises():
    with pytest.raises(ValueError, match="must be a language model's"):
        LlamaConfig.from_dict({**LLAVA_1_5_7B, "text_config": {"model_type": "llava"}})
    with pytest.raises(ValueError, match="'hidden_size' of model_type 'llava'"):
        LlamaConfig.from_dict({**LLAVA_1_5_7B, "hidden_size": 8})
    with pytest.raises(ValueError, match="not supported"):  # a language model no family here reads (RWKV; Mamba is
        LlamaConfig.from_dict({**LLAVA_1_5_7B, "text_config": {"model_type": "rwkv"}})  # read since 2026-12-05)


MLLAMA_TEXT = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=5, num_attention_heads=4,
                   num_key_value_heads=2, cross_attention_layers=[1, 3], bos_token_id=1, eos_token_id=2, pad_token_id=0,
                   rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                    "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                    "original_max_position_embeddings": 16})
MLLAMA_VISION = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2, "num_global_layers": 1,
                 "attention_heads": 2, "image_size": 28, "patch_size": 14, "vision_output_dim": 32,
                 "intermediate_layers_indices": [0]}


def test_llama_3_2_vision_loads_as_the_llama_of_its_self_attention_layers(tmp_path):
    """A text-only forward of Llama 3.2 Vision skips its cross-attention layers (transformers' MllamaTextModel): its
    language model is the Llama of the other layers, renumbered, its embeddings' 8 image-token rows past the
    vocabulary not read. Every path gives the wrapper's logits (Llama 3.1's RoPE, past its original context)."""
    torch.manual_seed(0)
    hf = randomize_(transformers.MllamaForConditionalGeneration(transformers.MllamaConfig(
        text_config=MLLAMA_TEXT, vision_config=MLLAMA_VISION, attn_implementation="eager")).eval())
    assert hf.model.language_model.embed_tokens.weight.shape[0] == 128 + 8
    ours = assert_loads_as_its_language_model(hf, tmp_path, "mllama", "llama")
    assert ours.config.num_hidden_layers == 3 and ours.config.rope_type == "llama3"
    layers = hf.model.language_model.layers
    for i, j in ((0, 0), (2, 1), (4, 2)):  # (the self-attention layers, in order)
        assert torch.equal(ours.model.layers[j].self_attn.q_proj.weight, layers[i].self_attn.q_proj.weight)


def test_llama_3_2_vision_configs_and_what_raises(tmp_path):
    d = {"model_type": "mllama", "image_token_index": 128256, "architectures": ["MllamaForConditionalGeneration"],
         "text_config": {"model_type": "mllama_text_model", "cross_attention_layers": [3, 8, 13, 18, 23, 28, 33, 38],
                         "num_hidden_layers": 40, "rope_scaling": {"factor": 8.0, "high_freq_factor": 4.0,
                                                                   "low_freq_factor": 1.0,
                                                                   "original_max_position_embeddings": 8192,
                                                                   "rope_type": "llama3"},
                         "rope_theta": 500000.0, "tie_word_embeddings": False, "dropout": 0}}
    c = LlamaConfig.from_dict(d)  # (shaped as Llama-3.2-11B-Vision-Instruct's)
    want = transformers.MllamaConfig.from_dict(copy.deepcopy(d)).text_config
    assert c.num_hidden_layers == want.num_hidden_layers - len(want.cross_attention_layers) == 32
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
                 "max_position_embeddings", "rms_norm_eps"):
        assert getattr(c, name) == getattr(want, name), name
    assert c.rope_scaling["factor"] == 8.0 and not c.tie_word_embeddings
    for cross in ([3, 3], [40], "3"):
        with pytest.raises(ValueError, match="cross_attention_layers"):
            LlamaConfig.from_dict({**d, "text_config": {**d["text_config"], "cross_attention_layers": cross}})


@pytest.mark.parametrize("tied", [False, True])
def test_internvls_own_checkpoints_load_as_their_language_model(tmp_path, tied):
    """InternVL's checkpoints in its own layout (``internvl_chat``: its modeling code's InternVLChatModel, no class in
    transformers): the language model is ``AutoModelForCausalLM`` of ``llm_config``, under ``language_model.*``, tied
    by ``llm_config``'s key alone (InternVL3-1B's Qwen2.5-0.5B: tied, beside a top-level ``tie_word_embeddings`` false);
    it loads bitwise as that model, the image side (``vision_model.*``, ``mlp1.*``) not read."""
    from safetensors.torch import load_file, save_file

    from triforce.models import Llama

    from .test_families import tiny_family

    model = tiny_family("qwen2", 0, tie_word_embeddings=tied)
    model.save_pretrained(tmp_path / "llm")
    llm_config = json.loads((tmp_path / "llm" / "config.json").read_text())
    sd = {f"language_model.{k}": v for k, v in load_file(tmp_path / "llm" / "model.safetensors").items()}
    sd.update({"vision_model.embeddings.patch_embedding.weight": torch.zeros(8, 3, 2, 2),
               "mlp1.1.weight": torch.zeros(32, 8)})
    d = tmp_path / "internvl"
    d.mkdir()
    save_file(sd, d / "model.safetensors")
    (d / "config.json").write_text(json.dumps({
        "architectures": ["InternVLChatModel"], "model_type": "internvl_chat", "llm_config": llm_config,
        "auto_map": {"AutoConfig": "configuration_internvl_chat.InternVLChatConfig",
                     "AutoModel": "modeling_internvl_chat.InternVLChatModel"},
        "downsample_ratio": 0.5, "dynamic_image_size": True, "force_image_size": 448, "hidden_size": 32,
        "max_dynamic_patch": 12, "min_dynamic_patch": 1, "pad2square": False, "ps_version": "v2", "select_layer": -1,
        "template": "internvl2_5", "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_backbone_lora": 0,
        "use_llm_lora": 0, "use_thumbnail": True, "vision_config": {"model_type": "intern_vit_6b", "hidden_size": 8}}))
    ours = Llama.from_pretrained(d)
    assert ours.config.model_type == "qwen2" and ours.config.tie_word_embeddings == tied
    ids = torch.randint(0, 64, (2, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(ours(ids), model(ids))
    with pytest.raises(ValueError, match="both llm_config and text_config"):
        LlamaConfig.from_dict({**json.loads((d / "config.json").read_text()), "text_config": llm_config})
