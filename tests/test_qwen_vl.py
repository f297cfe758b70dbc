"""Image + text checkpoints with M-RoPE (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3-VL-MoE, GLM-4.1V, GLM-4.5V) load as
their Qwen2 / Qwen3 / Qwen3-MoE / GLM-4 / GLM-4.5 language model, against transformers' ...ForConditionalGeneration on
text tokens; their GGUF files as llama.cpp runs them."""
import copy
import dataclasses
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
QWEN2_VISION = {"depth": 1, "embed_dim": 16, "num_heads": 2, "hidden_size": 32}
QWEN2_5_VISION = {"depth": 1, "hidden_size": 16, "num_heads": 2, "out_hidden_size": 32, "intermediate_size": 32,
                  "fullatt_block_indexes": [0]}
QWEN3_VISION = {"depth": 1, "hidden_size": 16, "num_heads": 2, "out_hidden_size": 32, "intermediate_size": 32,
                "deepstack_visual_indexes": [0]}
# (the sections: Qwen's shapes scaled to a head of 8 (Qwen2) or 16 (Qwen3) dims, one part off the even split)
QWEN2_ROPE = {"rope_type": "default", "mrope_section": [2, 1, 1], "rope_theta": 1e6}
QWEN3_ROPE = {"rope_type": "default", "mrope_section": [4, 2, 2], "mrope_interleaved": True, "rope_theta": 5e6}
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24, decoder_sparse_step=1)
GLM_ROPE = {"rope_type": "default", "mrope_section": [2, 1, 1], "partial_rotary_factor": 0.5, "rope_theta": 1e4}
GLM_VISION = {"depth": 1, "hidden_size": 16, "intermediate_size": 32, "num_heads": 2, "out_hidden_size": 64,
              "patch_size": 14, "image_size": 28}
KINDS = {  # model_type -> (config class, model class, text_config, vision_config, the family it reads as)
    "qwen2_vl": ("Qwen2VLConfig", "Qwen2VLForConditionalGeneration", {**TEXT, "rope_parameters": QWEN2_ROPE},
                 QWEN2_VISION, "qwen2"),
    "qwen2_5_vl": ("Qwen2_5_VLConfig", "Qwen2_5_VLForConditionalGeneration",
                   {**TEXT, "rope_parameters": QWEN2_ROPE}, QWEN2_5_VISION, "qwen2"),
    "qwen3_vl": ("Qwen3VLConfig", "Qwen3VLForConditionalGeneration",
                 {**TEXT, "head_dim": 16, "rope_parameters": QWEN3_ROPE}, QWEN3_VISION, "qwen3"),
    "qwen3_vl_moe": ("Qwen3VLMoeConfig", "Qwen3VLMoeForConditionalGeneration",
                     {**TEXT, **MOE, "head_dim": 16, "rope_parameters": QWEN3_ROPE}, QWEN3_VISION, "qwen3_moe"),
    # GLM-4.1V (GLM-4's layer: adjacent RoPE pairs over half of each head) and GLM-4.5V (GLM-4.5's mixture)
    "glm4v": ("Glm4vConfig", "Glm4vForConditionalGeneration", {**TEXT, "hidden_size": 64, "rope_parameters": GLM_ROPE},
              GLM_VISION, "glm4"),
    "glm4v_moe": ("Glm4vMoeConfig", "Glm4vMoeForConditionalGeneration", {
        **TEXT, "hidden_size": 64, "head_dim": 16, "moe_intermediate_size": 24, "n_routed_experts": 4,
        "num_experts_per_tok": 2, "rope_parameters": GLM_ROPE}, GLM_VISION, "glm4_moe"),
}


def hf_vl(kind, **text):
    config_class, model_class, base, vision, _ = KINDS[kind]
    config = getattr(transformers, config_class)(text_config={**base, **text}, vision_config=vision,
                                                 attn_implementation="eager")
    torch.manual_seed(0)
    return randomize_(getattr(transformers, model_class)(config).eval())


def hf_from(path):
    return transformers.AutoModelForImageTextToText.from_pretrained(path, attn_implementation="eager").eval()


def ids():
    return torch.randint(3, 128, (2, 24), generator=torch.Generator().manual_seed(3))  # text tokens only


@pytest.mark.parametrize("kind", list(KINDS))
def test_the_checkpoint_transformers_5_saves_loads_with_its_logits(tmp_path, kind):
    """Every path (the plain forward, a chunked prefill, a verify pass, one-token steps, a tree) gives the wrapper's
    logits on text; the image side is not read; our save is the language model, which transformers reads back with
    the same logits."""
    ours = assert_loads_as_its_language_model(hf_vl(kind), tmp_path, kind, KINDS[kind][4])
    assert not ours.config.tie_word_embeddings and not any("visual" in name for name in ours.state_dict())


def assert_loads_as_its_language_model(hf, tmp_path, kind: str, family: str) -> Llama:
    """An image + text model ``hf`` (transformers') saved by transformers loads as its ``family`` language model, its
    head tied as transformers ties it, with its logits on text on every path; our save of it, read back by
    transformers' CausalLM of that family, gives them too. -> ours."""
    hf.save_pretrained(tmp_path / "hf")
    saved = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert saved["model_type"] == kind and "text_config" in saved
    ours = Llama.from_pretrained(tmp_path / "hf")
    tied = hf.get_output_embeddings().weight.data_ptr() == hf.get_input_embeddings().weight.data_ptr()
    assert ours.config.model_type == family and ours.config.tie_word_embeddings == tied
    ids, ref = assert_every_path_matches(hf, ours)
    ours.save_pretrained(tmp_path / "ours")
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "ours", attn_implementation="eager").eval()
    assert type(back).__name__ == FAMILIES[family].architecture
    with torch.no_grad():
        assert (back(ids).logits - ref).abs().max().item() <= TOL
    return ours


def test_m_rope_sections_do_not_change_text():
    """On text M-RoPE is the family's RoPE whatever its sections: two wrappers that differ in them alone give the
    same logits, and ours reads both as one config."""
    a = hf_vl("qwen2_5_vl")
    b = hf_vl("qwen2_5_vl", rope_parameters={**QWEN2_ROPE, "mrope_section": [0, 2, 2]})
    with torch.no_grad():
        assert torch.equal(a(input_ids=ids()).logits, b(input_ids=ids()).logits)
    configs = [LlamaConfig.from_dict(json.loads(m.config.to_json_string())) for m in (a, b)]
    assert configs[0] == configs[1] and configs[0].rope_scaling is None


def flat(config: dict) -> dict:
    """A Qwen2(.5)-VL config.json as Qwen ships it: the language model's keys at the top level, the RoPE as
    transformers 4's ``rope_scaling`` ``{"type": "mrope", ...}``."""
    d = {k: v for k, v in config.items() if k != "text_config"}
    text = dict(config["text_config"])
    rope = text.pop("rope_parameters")
    text.pop("model_type")
    d.update(text, rope_theta=rope["rope_theta"],
             rope_scaling={"type": "mrope", "mrope_section": rope["mrope_section"]})
    return d


@pytest.mark.parametrize("kind", ["qwen2_vl", "qwen2_5_vl"])
def test_the_checkpoint_qwen_ships_loads_with_its_logits(tmp_path, kind):
    """Qwen2(.5)-VL's files (a flat config; the weights model.layers.*, visual.*, lm_head.*, which transformers 5's
    save_pretrained writes too) load with the logits of transformers reading the same directory; with a sliding
    window on the second layer (max_window_layers 1), past the window."""
    hf = hf_vl(kind, use_sliding_window=True, sliding_window=7, max_window_layers=1)
    hf.save_pretrained(tmp_path)
    d = flat(json.loads((tmp_path / "config.json").read_text()))
    assert "hidden_size" in d and d["use_sliding_window"] is True
    (tmp_path / "config.json").write_text(json.dumps(d))
    from safetensors import safe_open

    with safe_open(tmp_path / "model.safetensors", "pt") as f:
        names = list(f.keys())
    assert any(n.startswith("visual.") for n in names) and any(n.startswith("model.layers.") for n in names)
    ours = Llama.from_pretrained(tmp_path)
    assert ours.config.layer_windows == (0, 7)
    assert_every_path_matches(hf_from(tmp_path), ours)


def test_qwen3_vl_moe_experts_in_qwens_layout(tmp_path):
    """Qwen's Qwen3-VL-MoE files hold each layer's experts as the transpose of transformers 5's modules
    (gate_up_proj [E, H, 2I], down_proj [E, I, H]); transformers 5 saves the modules' layout. Both load with
    transformers' logits."""
    from safetensors.torch import load_file, save_file

    hf = hf_vl("qwen3_vl_moe")
    hf.save_pretrained(tmp_path)
    sd = load_file(tmp_path / "model.safetensors")
    stacked = [k for k in sd if k.endswith(("experts.gate_up_proj", "experts.down_proj"))]
    assert len(stacked) == 4 and sd[stacked[0]].shape[1:] in ((48, 32), (32, 24))
    save_file({k: v.transpose(1, 2).contiguous() if k in stacked else v for k, v in sd.items()},
              tmp_path / "model.safetensors")
    ours = Llama.from_pretrained(tmp_path)
    with torch.no_grad():
        ref = hf_from(tmp_path)(input_ids=ids()).logits
        assert (ref - hf(input_ids=ids()).logits).abs().max().item() <= TOL
        assert (ours(ids()) - ref).abs().max().item() <= TOL


def test_the_tied_head_as_transformers_5_ties_it(tmp_path):
    """Qwen2(.5)-VL: tied where the wrapper's or the text_config's tie_word_embeddings says so (transformers 5
    forwards a text_config's true to the wrapper); Qwen3-VL: the wrapper's alone (default false), its text_config's
    not read."""
    for kind, wrapper, text, tied in (("qwen2_5_vl", False, True, True), ("qwen2_5_vl", True, None, True),
                                      ("qwen2_vl", None, None, False), ("qwen3_vl", None, True, False),
                                      ("qwen3_vl", True, False, True), ("qwen3_vl_moe", None, None, False),
                                      ("glm4v", False, True, True), ("glm4v_moe", None, None, False)):
        config_class, _, base, vision, _ = KINDS[kind]
        d = {"model_type": kind, "text_config": {**base, **({} if text is None else {"tie_word_embeddings": text})},
             **({} if wrapper is None else {"tie_word_embeddings": wrapper})}
        want = getattr(transformers, config_class).from_dict(d).tie_word_embeddings
        assert want == tied and LlamaConfig.from_dict(d).tie_word_embeddings == tied, (kind, wrapper, text)
    hf = hf_vl("qwen2_5_vl")  # a head of its own under a config that ties it: kept, untied (transformers 5 warns)
    hf.save_pretrained(tmp_path / "own")
    d = json.loads((tmp_path / "own" / "config.json").read_text())
    d["text_config"]["tie_word_embeddings"] = True
    (tmp_path / "own" / "config.json").write_text(json.dumps(d))
    assert LlamaConfig.from_dict(d).tie_word_embeddings
    with pytest.warns(UserWarning, match="loaded untied"):
        ours = Llama.from_pretrained(tmp_path / "own")
    assert not ours.config.tie_word_embeddings
    with torch.no_grad():
        assert (ours(ids()) - hf_from(tmp_path / "own")(input_ids=ids()).logits).abs().max().item() <= TOL
    hf = hf_vl("qwen2_5_vl", tie_word_embeddings=True)  # tied by its text_config (Qwen2.5-VL-3B's): no head saved
    assert hf.lm_head.weight is hf.model.language_model.embed_tokens.weight
    hf.save_pretrained(tmp_path)
    d = flat(json.loads((tmp_path / "config.json").read_text()))
    assert d["tie_word_embeddings"] is True
    (tmp_path / "config.json").write_text(json.dumps(d))
    ours = Llama.from_pretrained(tmp_path)
    assert ours.config.tie_word_embeddings
    with torch.no_grad():
        assert (ours(ids()) - hf(input_ids=ids()).logits).abs().max().item() <= TOL


# config.json files shaped as Qwen's (Qwen2.5-VL-7B-Instruct: flat; Qwen3-VL-8B-Instruct and Qwen3-VL-30B-A3B-Instruct:
# nested), the vision side cut to what the configs need
QWEN2_5_VL_7B = {
    "architectures": ["Qwen2_5_VLForConditionalGeneration"], "attention_dropout": 0.0, "bos_token_id": 151643,
    "eos_token_id": 151645, "vision_start_token_id": 151652, "vision_end_token_id": 151653, "vision_token_id": 151654,
    "image_token_id": 151655, "video_token_id": 151656, "hidden_act": "silu", "hidden_size": 3584,
    "initializer_range": 0.02, "intermediate_size": 18944, "max_position_embeddings": 128000, "max_window_layers": 28,
    "model_type": "qwen2_5_vl", "num_attention_heads": 28, "num_hidden_layers": 28, "num_key_value_heads": 4,
    "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "transformers_version": "4.41.2", "use_cache": True, "use_sliding_window": False,
    "vision_config": {"depth": 32, "hidden_act": "silu", "hidden_size": 1280, "intermediate_size": 3420,
                      "num_heads": 16, "in_chans": 3, "out_hidden_size": 3584, "patch_size": 14,
                      "spatial_merge_size": 2, "spatial_patch_size": 14, "window_size": 112,
                      "fullatt_block_indexes": [7, 15, 23, 31], "tokens_per_second": 2, "temporal_patch_size": 2},
    "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}, "vocab_size": 152064}
QWEN3_TEXT = {"attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 151643, "dtype": "bfloat16",
              "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096,
              "initializer_range": 0.02, "intermediate_size": 12288, "max_position_embeddings": 262144,
              "model_type": "qwen3_vl_text", "num_attention_heads": 32, "num_hidden_layers": 36,
              "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
              "rope_scaling": {"mrope_interleaved": True, "mrope_section": [24, 20, 20], "rope_type": "default"},
              "rope_theta": 5000000, "tie_word_embeddings": False, "use_cache": True, "vocab_size": 151936}
QWEN3_VL_8B = {"architectures": ["Qwen3VLForConditionalGeneration"], "image_token_id": 151655,
               "model_type": "qwen3_vl", "text_config": QWEN3_TEXT, "tie_word_embeddings": False,
               "transformers_version": "4.57.0.dev0", "video_token_id": 151656,
               "vision_config": {"deepstack_visual_indexes": [8, 16, 24], "depth": 27,
                                 "hidden_act": "gelu_pytorch_tanh", "hidden_size": 1152, "in_channels": 3,
                                 "initializer_range": 0.02, "intermediate_size": 4304, "model_type": "qwen3_vl",
                                 "num_heads": 16, "num_position_embeddings": 2304, "out_hidden_size": 4096,
                                 "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2},
               "vision_end_token_id": 151653, "vision_start_token_id": 151652}
QWEN3_VL_30B = {**QWEN3_VL_8B, "architectures": ["Qwen3VLMoeForConditionalGeneration"], "model_type": "qwen3_vl_moe",
                "text_config": {**QWEN3_TEXT, "model_type": "qwen3_vl_moe_text", "hidden_size": 2048,
                                "intermediate_size": 6144, "num_hidden_layers": 48, "num_attention_heads": 32,
                                "num_key_value_heads": 4, "decoder_sparse_step": 1, "moe_intermediate_size": 768,
                                "num_experts": 128, "num_experts_per_tok": 8, "mlp_only_layers": [],
                                "vocab_size": 151936},
                "vision_config": {**QWEN3_VL_8B["vision_config"], "model_type": "qwen3_vl_moe",
                                  "out_hidden_size": 2048}}


GLM_4_1V_9B = {  # shaped as zai-org/GLM-4.1V-9B-Thinking's (transformers 4.53), the vision side cut short
    "architectures": ["Glm4vForConditionalGeneration"], "model_type": "glm4v", "image_token_id": 151343,
    "video_token_id": 151344, "image_start_token_id": 151339, "image_end_token_id": 151340,
    "video_start_token_id": 151341, "video_end_token_id": 151342, "torch_dtype": "bfloat16",
    "transformers_version": "4.53.0.dev0",
    "text_config": {"model_type": "glm4v_text", "vocab_size": 151552, "hidden_size": 4096, "intermediate_size": 13696,
                    "num_hidden_layers": 40, "num_attention_heads": 32, "num_key_value_heads": 2,
                    "max_position_embeddings": 65536, "rms_norm_eps": 1e-05, "rope_theta": 10000,
                    "partial_rotary_factor": 0.5, "attention_bias": True, "attention_dropout": 0.0,
                    "hidden_act": "silu", "initializer_range": 0.02, "pad_token_id": 151329,
                    "eos_token_id": [151329, 151336, 151338], "rope_scaling": {"type": "default",
                                                                                "mrope_section": [8, 12, 12]},
                    "torch_dtype": "bfloat16", "use_cache": True, "tie_word_embeddings": False},
    "vision_config": {"depth": 24, "hidden_size": 1536, "model_type": "glm4v", "out_hidden_size": 4096}}


GLM_WHOLE_HEAD = {**GLM_4_1V_9B, "text_config": {  # (no partial_rotary_factor: RoPE on the whole head, not GLM-4's half)
    **{k: v for k, v in GLM_4_1V_9B["text_config"].items() if k != "partial_rotary_factor"},
    "rope_scaling": {"type": "default", "mrope_section": [16, 24, 24]}}}


@pytest.mark.parametrize("d", [QWEN2_5_VL_7B, QWEN3_VL_8B, QWEN3_VL_30B, GLM_4_1V_9B, GLM_WHOLE_HEAD],
                         ids=["2.5-7B", "3-8B", "3-30B-A3B", "GLM-4.1V-9B", "GLM-4.1V-whole-head"])
def test_the_configs_qwen_ships_read_as_transformers_reads_them(d):
    c = LlamaConfig.from_dict(d)
    want = transformers.AutoConfig.for_model(**copy.deepcopy(d)).text_config  # (it changes the dicts it reads)
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "max_position_embeddings", "rms_norm_eps"):
        assert getattr(c, name) == getattr(want, name), name
    assert c.head_dim == getattr(want, "head_dim", want.hidden_size // want.num_attention_heads)
    assert c.rope_theta == want.rope_parameters["rope_theta"] and c.rope_scaling is None
    assert c.rotary_dim == int(c.head_dim * want.rope_parameters.get("partial_rotary_factor", 1.0))
    assert c.layer_windows == (0,) * c.num_hidden_layers and not c.tie_word_embeddings
    if c.experts is not None:
        assert (c.experts.count, c.experts.top_k, c.experts.intermediate_size) == (128, 8, 768)
        assert c.experts.renormalize and all(c.experts.layers)


def test_the_windows_from_qwen2_vl_text_configs_defaults():
    """With use_sliding_window and no max_window_layers, Qwen2(.5)-VL's text config slides from its default 80th
    layer on (Qwen2's: 28th), as transformers builds its layer_types."""
    for layers in (28, 81):
        d = {k: v for k, v in QWEN2_5_VL_7B.items() if k != "max_window_layers"}
        d.update(use_sliding_window=True, num_hidden_layers=layers)
        types = transformers.AutoConfig.for_model(**copy.deepcopy(d)).text_config.layer_types
        want = tuple(32768 if t == "sliding_attention" else 0 for t in types)
        assert LlamaConfig.from_dict(d).layer_windows == want and any(want) == (layers > 80)


def test_what_transformers_would_not_read_so_raises():
    read = json.loads(transformers.AutoConfig.for_model(**copy.deepcopy(QWEN2_5_VL_7B)).to_json_string())
    assert read["text_config"]["rope_parameters"]["type"] == "mrope"  # (as transformers 5 saves it: both keys)
    a, b = LlamaConfig.from_dict(read), LlamaConfig.from_dict(QWEN2_5_VL_7B)  # (extra: the keys each spells out)
    assert dataclasses.replace(a, extra={}) == dataclasses.replace(b, extra={}) and a.layer_windows == b.layer_windows
    with pytest.raises(ValueError, match="mrope_section"):
        LlamaConfig.from_dict({**QWEN2_5_VL_7B, "rope_scaling": {"type": "mrope", "mrope_section": [16, 24]}})
    with pytest.raises(ValueError, match="no sliding window"):
        LlamaConfig.from_dict({**QWEN3_VL_8B, "text_config": {**QWEN3_TEXT, "use_sliding_window": True}})
    with pytest.raises(ValueError, match="norm_topk_prob"):
        LlamaConfig.from_dict({**QWEN3_VL_30B, "text_config": {**QWEN3_VL_30B["text_config"],
                                                               "norm_topk_prob": False}})
    with pytest.raises(ValueError, match="must be 'qwen3_vl_text'"):
        LlamaConfig.from_dict({**QWEN3_VL_8B, "text_config": {**QWEN3_TEXT, "model_type": "qwen3"}})
    with pytest.raises(ValueError, match="has no text_config"):
        LlamaConfig.from_dict({k: v for k, v in QWEN3_VL_8B.items() if k != "text_config"})
    with pytest.raises(ValueError, match="must sum to the 64 RoPE frequencies"):  # (transformers splits by them)
        LlamaConfig.from_dict({**QWEN2_5_VL_7B, "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 16]}})
    glm = GLM_4_1V_9B["text_config"]
    with pytest.raises(ValueError, match="must sum to the 64 RoPE frequencies"):  # (over the whole head)
        LlamaConfig.from_dict({**GLM_4_1V_9B, "text_config": {**glm, "partial_rotary_factor": 1.0}})
    with pytest.raises(ValueError, match="'attention_bias' = False"):
        LlamaConfig.from_dict({**GLM_4_1V_9B, "text_config": {**glm, "attention_bias": False}})
    with pytest.raises(ValueError, match="'not_a_key' is not understood"):  # a flat config's: its language model's
        LlamaConfig.from_dict({**QWEN2_5_VL_7B, "not_a_key": 1})


# ---- GGUF: llama.cpp's qwen2vl (Qwen2-VL, Qwen2.5-VL), qwen3vl (Qwen3-VL) and qwen3vlmoe (Qwen3-VL-MoE)
def _gguf(tmp_path, arch, sections, model_type, head_dim=16, **kw):
    from .test_config import write_gguf
    from .test_families import tiny_family

    # (llama.cpp's qwen2vl takes head_dim as hidden / heads: 64 / 4)
    model = tiny_family(model_type, 0, layers=2, head_dim=head_dim, rope_theta=100.0,
                        **({"hidden_size": 64} if arch == "qwen2vl" else {}), **kw)
    meta = {} if sections is None else {"rope.dimension_sections": sections}
    if arch != "qwen2vl":
        meta["n_deepstack_layers"] = 3
    return model, write_gguf(tmp_path / f"{arch}.gguf", model, meta, arch=arch)


@pytest.mark.parametrize("arch, model_type, kw", [
    ("qwen2vl", "qwen2", {}), ("qwen3vl", "qwen3", {}),
    ("qwen3vlmoe", "qwen3_moe", {"extra": {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 24,
                                           "norm_topk_prob": True}})])
def test_gguf_whose_sections_cover_every_pair_runs_plain_rope(tmp_path, arch, model_type, kw):
    """Sections that give every RoPE pair one of the first three streams (Qwen2.5-VL's [16, 24, 24, 0] over 64 pairs,
    here [2, 3, 3, 0] over 8; interleaved, [3, 3, 2, 0]): on text, M-RoPE is the family's RoPE, and the file loads
    with the logits of the model it was written from (and, under TRIFORCE_LLAMA_CPP=1, llama.cpp's)."""
    sections = [2, 3, 3, 0] if arch == "qwen2vl" else [3, 3, 2, 0]
    model, path = _gguf(tmp_path, arch, sections, model_type, **kw)
    loaded = Llama.from_pretrained(path, cache_dir=False)
    assert loaded.config.model_type == model_type and "rope_still_pairs" not in loaded.config.extra
    ids = torch.randint(0, 64, (2, 30), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert (loaded(ids) - model(ids)).abs().max().item() <= TOL


def test_gguf_m_rope_pairs_on_the_fourth_stream_stay_still(tmp_path):
    """llama.cpp gives a text token's fourth M-RoPE position 0: the pairs its sections put on that stream are never
    turned. Qwen3-VL's interleaved [24, 20, 20, 0] over 64 pairs leaves pairs 61 and 62 so (3 * 20 = 60 covers the
    height and width streams' pairs to 59); here [4, 2, 2, 0] over 8 pairs leaves pair 7 (7 mod 3 = 1, past 3 * 2),
    and qwen2vl's [2, 2, 2, 2] the last two pairs. The loaded model turns those pairs by frequency 0 (its other
    pairs as before); under TRIFORCE_LLAMA_CPP=1 its logits are llama.cpp's."""
    from triforce.models.loading import _gguf_mrope

    class Reader:
        def __init__(self, **fields):
            self.fields = fields

    from unittest import mock

    with mock.patch("triforce.models.loading.gguf_field", lambda r, k, d=None: r.fields.get(k.split(".", 1)[1], d)):
        assert _gguf_mrope(Reader(**{"rope.dimension_sections": [24, 20, 20, 0]}), "qwen3vl", "f", 128) == {
            "rope_still_pairs": [61, 62]}
        assert _gguf_mrope(Reader(**{"rope.dimension_sections": [16, 24, 24, 0]}), "qwen2vl", "f", 128) == {}
    for arch, model_type, sections, still in (("qwen3vl", "qwen3", [4, 2, 2, 0], [7]),
                                              ("qwen2vl", "qwen2", [2, 2, 2, 2], [6, 7])):
        model, path = _gguf(tmp_path, arch, sections, model_type)
        loaded = Llama.from_pretrained(path, cache_dir=False)
        assert loaded.config.extra["rope_still_pairs"] == still
        keep = [i for i in range(8) if i not in still]
        assert torch.equal(loaded.inv_freq[keep], model.inv_freq[keep]) and not loaded.inv_freq[still].any()
        ids = torch.randint(0, 64, (2, 30), generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            assert (loaded(ids) - model(ids)).abs().max().item() > 1e-3  # (those pairs turned would differ)
        cached = Llama.from_pretrained(path, cache_dir=tmp_path / "cache")  # (through the converted directory)
        assert cached.config.extra["rope_still_pairs"] == still and torch.equal(cached.inv_freq, loaded.inv_freq)


def test_gguf_m_rope_sections_llama_cpp_would_not_read_raise(tmp_path):
    for sections, match in ((None, "lacks metadata qwen3vl.rope.dimension_sections"),
                            ([4, 2, 2], "must be four ints"), ([0, 0, 0, 0], "must be four ints")):
        _, path = _gguf(tmp_path, "qwen3vl", sections, "qwen3")
        with pytest.raises(ValueError, match=match):
            Llama.from_pretrained(path, cache_dir=False)
