"""Ministral 3 (``model_type="ministral3"``, also as the text half of a ``mistral3`` checkpoint): Mistral's layer
with YaRN RoPE and Llama 4's query temperature, against transformers' Ministral3ForCausalLM."""
import pytest
import torch

from triforce.models import Llama, LlamaConfig

from .test_engines import TINY_CASES, assert_greedy_equals_autoregressive
from .test_families import TINY, randomize_, transformers_and_ours
from .test_model import TOL
from .test_sliding_window import assert_every_path_matches, assert_pass_equals_steps

transformers = pytest.importorskip("transformers")

# an original context of 8 positions: the temperature is 1 below 8, 1 + 0.3 ln 2 from 8, 1 + 0.3 ln 3 from 16, ...
ROPE = {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0, "original_max_position_embeddings": 8,
        "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0, "llama_4_scaling_beta": 0.3}
MINISTRAL3 = dict(TINY, num_hidden_layers=3, head_dim=16, rope_parameters=ROPE, bos_token_id=1, eos_token_id=2,
                  pad_token_id=None)


def pair(**kw):
    return transformers_and_ours("Ministral3", **{**MINISTRAL3, **kw})


@pytest.mark.parametrize("kw", [{}, {"sliding_window": 6}])
def test_logits_and_every_path_match_transformers(kw):
    """40 tokens (five temperature steps): the plain forward, a chunked prefill, a verify pass, steps and a tree
    over the cache give transformers' logits; our config reads back in transformers as the same model."""
    hf, ours = pair(**kw)
    assert ours.config.query_temperature == (0.3, 8)
    assert ours.config.layer_windows == (kw.get("sliding_window", 0),) * 3
    assert_every_path_matches(hf, ours)
    back = transformers.Ministral3Config.from_dict(ours.config.to_dict())
    assert back.rope_parameters["llama_4_scaling_beta"] == 0.3 and back.sliding_window == hf.config.sliding_window


def test_the_temperature_matters():
    """Without the temperature (beta 0) the logits past the original context move: the test above would see it."""
    hf, ours = pair()
    ids = torch.randint(0, 101, (1, 30), generator=torch.Generator().manual_seed(2))
    for layer in ours.model.layers:
        layer.self_attn.temperature = (0.0, 8)
    with torch.no_grad():
        d = (ours(ids) - hf(ids).logits).abs().amax(-1)[0]
    assert d[:8].max() <= TOL and d[8:].max() > 1e-3


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_pass_gives_the_bits_of_one_token_steps(dtype):
    assert_pass_equals_steps(pair()[1], dtype)


def test_defaults_and_bad_configs():
    """A config without RoPE settings takes Ministral3Config's (YaRN x16 over 16384, beta 0.1), as transformers;
    the temperature is Ministral 3's only, and it needs one."""
    c = LlamaConfig.from_dict({**TINY, "model_type": "ministral3"})
    want = transformers.Ministral3Config(**TINY)
    assert c.query_temperature == (0.1, 16384) and c.rope_theta == want.rope_parameters["rope_theta"]
    assert c.rope_scaling["factor"] == want.rope_parameters["factor"] == 16.0
    for bad, match in (
            ({"rope_parameters": {**ROPE, "llama_4_scaling_beta": None}}, "model_type 'ministral3' needs it"),
            ({"rope_parameters": {k: v for k, v in ROPE.items() if k != "llama_4_scaling_beta"}}, "needs it"),
            ({"model_type": "llama"}, "'llama' takes none"),
            ({"rope_parameters": {**ROPE, "max_position_embeddings": 1024}}, "max_position_embeddings")):
        with pytest.raises(ValueError, match=match):
            LlamaConfig.from_dict({**MINISTRAL3, "model_type": "ministral3", **bad})


def test_the_image_text_checkpoint_loads_its_language_model(tmp_path):
    """Ministral-3's checkpoints are Mistral3ForConditionalGeneration with a ``ministral3`` text_config: the
    language model loads with transformers' logits on text tokens."""
    config = transformers.Mistral3Config(
        text_config={**MINISTRAL3, "model_type": "ministral3", "vocab_size": 96, "tie_word_embeddings": True},
        vision_config=dict(model_type="pixtral", hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                           num_attention_heads=2, head_dim=16, image_size=28, patch_size=14),
        image_token_index=95, attn_implementation="eager")
    torch.manual_seed(0)
    hf = randomize_(transformers.Mistral3ForConditionalGeneration(config).eval())
    hf.save_pretrained(tmp_path)
    ours = Llama.from_pretrained(tmp_path)
    assert ours.config.model_type == "ministral3" and ours.config.query_temperature == (0.3, 8)
    ids = torch.randint(0, 95, (2, 30), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert (ours(ids) - hf(input_ids=ids).logits).abs().max().item() <= TOL


def tiny_ministral3(seed):
    torch.manual_seed(seed)
    return Llama(LlamaConfig(model_type="ministral3", vocab_size=64, hidden_size=32, intermediate_size=64,
                             num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                             max_position_embeddings=1024, initializer_range=0.3, rope_theta=1e6,
                             rope_scaling={**{k: v for k, v in ROPE.items() if k != "rope_theta"},
                                           "original_max_position_embeddings": 16})).eval()


@pytest.mark.parametrize("method,opts", TINY_CASES, ids=[f"{m}-{i}" for i, (m, _) in enumerate(TINY_CASES)])
def test_greedy_equals_autoregressive(method, opts):
    assert_greedy_equals_autoregressive(tiny_ministral3(0), tiny_ministral3(1), method, opts)


def test_pseudo_tokens_training_forward_equals_decoding():
    """The Hidden Transfer heads' training forward tempers its queries as decoding does."""
    from .test_heads import assert_perturbed_heads_train_as_they_decode

    m = tiny_ministral3(0)
    assert_perturbed_heads_train_as_they_decode(m)


@pytest.mark.parametrize("log_mul", [1.0, 0.5, None])
def test_gguf_as_llama_cpp_writes_it(tmp_path, log_mul):
    """A Ministral 3 GGUF as llama.cpp's converter writes it: architecture ``mistral3`` (llama's tensors, q / k
    permuted), YaRN's factor, original context and betas, ``mscale_all_dim`` as ``rope.scaling.yarn_log_multiplier``
    (absent: YaRN's default magnitude, as llama.cpp reads a 0) and the temperature's beta as
    ``attention.temperature_scale``: it loads with the logits of transformers' Ministral3ForCausalLM of those settings
    (mscale 1, which the converter does not write and llama.cpp assumes) over 40 tokens (five temperature steps)."""
    from .test_config import write_gguf

    rope = {k: v for k, v in ROPE.items() if log_mul is not None or k not in ("mscale", "mscale_all_dim")}
    hf, ours = pair(rope_parameters=rope if log_mul is None else {**rope, "mscale_all_dim": log_mul})
    meta = {"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0, "rope.scaling.original_context_length": 8,
            "rope.scaling.yarn_beta_fast": 32.0, "rope.scaling.yarn_beta_slow": 1.0, "attention.temperature_scale": 0.3,
            **({} if log_mul is None else {"rope.scaling.yarn_log_multiplier": log_mul})}
    loaded = Llama.from_pretrained(write_gguf(tmp_path / "m.gguf", ours, meta, arch="mistral3"), cache_dir=False)
    # (the file's beta is float32's 0.3, as llama.cpp computes with it)
    assert loaded.config.model_type == "ministral3" and loaded.config.query_temperature == (pytest.approx(0.3), 8)
    ids = torch.randint(0, 101, (2, 40), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        assert (loaded(ids) - hf(ids).logits).abs().max().item() <= TOL
    if log_mul == 0.5:  # the multiplier is read: the magnitude 1.28 instead of 1 moves the logits
        with torch.no_grad():
            assert (loaded(ids) - pair()[0](ids).logits).abs().max().item() > 1e-3
    with pytest.raises(ValueError, match="mistral3.attention.temperature_scale"):
        plain = {k: v for k, v in meta.items() if not k.startswith("rope.scaling")}
        Llama.from_pretrained(write_gguf(tmp_path / "t.gguf", ours, plain, arch="mistral3"), cache_dir=False)
