"""LongRoPE (Phi-3 128k, Phi-3.5: ``rope_scaling`` "longrope", also spelled "su" / "yarn" in Phi-3 configs): its
short and long factor sets read as transformers reads them, logits equal to transformers' on either side of
``original_max_position_embeddings``, the caches' per-row choice of factors (``rope_long``), the engines' rule
(a row whose prompt and new tokens pass the original context takes the long factors from its first token),
and transformers' own greedy generation where both compute the same thing. Partial RoPE (Phi-4-mini: RoPE on
the first 3/4 of each head) with it."""
import json
import math

import pytest
import torch

import triforce
from triforce.models import FullCache, Llama, LlamaConfig
from triforce.models.rope import rope_attention_scale, rope_inv_freq

from .test_families import randomize_
from .test_model import TOL

transformers = pytest.importorskip("transformers")

ORIGINAL = 64  # the tiny models' original_max_position_embeddings: past it, the long factors
SHORT = [1.0, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0, 6.0]  # head_dim 16: eight pairs
LONG = [1.5, 2.0, 3.0, 4.5, 6.0, 9.0, 14.0, 20.0]


def hf_phi3(short=SHORT, long=LONG, model_type="phi3", **kw):
    """A tiny transformers Phi-3 (or Llama) with LongRoPE over an original context of 64 (max 256: factor 4),
    the same weights whatever its factors (so a model with ``short == long`` is the original forced to one set)."""
    torch.manual_seed(0)
    rope = {"rope_type": "longrope", "short_factor": list(short), "long_factor": list(long), "rope_theta": 10000.0}
    common = dict(vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=256, original_max_position_embeddings=ORIGINAL,
                  rope_parameters=rope, pad_token_id=0, bos_token_id=1, eos_token_id=2, attn_implementation="eager")
    cls = ("Phi3Config", "Phi3ForCausalLM") if model_type == "phi3" else ("LlamaConfig", "LlamaForCausalLM")
    config = getattr(transformers, cls[0])(**{**common, **kw})
    return randomize_(getattr(transformers, cls[1])(config).eval())


def ours(hf) -> Llama:
    from triforce.models.loading import _build

    return _build(LlamaConfig.from_dict(hf.config.to_dict()), hf.state_dict(), None, None)


def phi35_config(**changes) -> dict:
    """A config.json shaped as Phi-3.5-mini-instruct's (its factor values made up: 48 per set, head_dim 96)."""
    return {"architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "vocab_size": 32064, "hidden_size": 3072,
            "intermediate_size": 8192, "num_hidden_layers": 32, "num_attention_heads": 32,
            "num_key_value_heads": 32, "max_position_embeddings": 131072, "original_max_position_embeddings": 4096,
            "rope_theta": 10000.0, "rms_norm_eps": 1e-5, "sliding_window": 262144, "tie_word_embeddings": False,
            "bos_token_id": 1, "eos_token_id": 32000, "pad_token_id": 32000, "attention_dropout": 0.0,
            "embd_pdrop": 0.0, "resid_pdrop": 0.0, "hidden_act": "silu", "initializer_range": 0.02,
            "torch_dtype": "bfloat16", "use_cache": True, "transformers_version": "4.43.3",
            "auto_map": {"AutoConfig": "configuration_phi3.Phi3Config",
                         "AutoModelForCausalLM": "modeling_phi3.Phi3ForCausalLM"},
            "rope_scaling": {"type": "longrope", "short_factor": [1.0 + 0.05 * i for i in range(48)],
                             "long_factor": [1.0 + 1.5 * i for i in range(48)]}, **changes}


@pytest.mark.parametrize("spelling", ["longrope", "su", "yarn"])
def test_phi35_config_reads_as_transformers(spelling):
    """Both factor sets' frequencies bitwise and the attention factor (sqrt(1 + ln 32 / ln 4096)) as transformers
    computes them from the same config.json; Phi-3's old names of LongRoPE read as it (Phi3Config renames them,
    though transformers 5.23 then misses the original context for "su" and raises: compared with "longrope")."""
    from transformers.modeling_rope_utils import _compute_longrope_parameters

    d = phi35_config()
    hf = transformers.Phi3Config(**{k: v for k, v in d.items() if k != "auto_map"})
    d["rope_scaling"] = {**d["rope_scaling"], "type": spelling}
    c = LlamaConfig.from_dict(d)
    assert c.rope_type == "longrope" and c.rope_long_from == 4096 and c.layer_windows == (0,) * 32
    for seq_len, long in ((None, False), (4097, True)):
        inv_freq, factor = _compute_longrope_parameters(hf, "cpu", seq_len=seq_len)
        assert torch.equal(rope_inv_freq(c, long=long), inv_freq)
        assert rope_attention_scale(c) == factor == pytest.approx(math.sqrt(1 + math.log(32) / math.log(4096)))
    assert c.to_dict()["original_max_position_embeddings"] == 4096  # Phi3Config reads the top-level key


@pytest.mark.parametrize("bad,match", [
    ({"rope_scaling": {"type": "longrope", "short_factor": [1.0] * 47, "long_factor": [2.0] * 48}},
     r"short_factor'\] must be a list of rotary_dim // 2 = 48"),
    ({"rope_scaling": {"type": "longrope", "short_factor": [1.0] * 48, "long_factor": [0.0] * 48}},
     r"long_factor'\] must be a list"),
    ({"rope_scaling": {"type": "longrope", "short_factor": [1.0] * 48}}, "needs long_factor"),
    ({"rope_scaling": {"type": "linear", "factor": 2.0}}, "reads plain RoPE and LongRoPE"),
    # Phi3Config takes the top-level key over the one inside: they must agree here
    ({"rope_scaling": {"type": "longrope", "short_factor": [1.0] * 48, "long_factor": [2.0] * 48,
                       "original_max_position_embeddings": 8192}}, "differs from the 8192 inside"),
    ({"rope_scaling": {"type": "longrope", "short_factor": [1.0] * 48, "long_factor": [2.0] * 48,
                       "mscale": 1.0}}, "'mscale' is not understood for rope_type 'longrope'"),
])
def test_longrope_config_errors(bad, match):
    with pytest.raises(ValueError, match=match):
        LlamaConfig.from_dict(phi35_config(**bad))


def test_original_context_defaults_as_transformers():
    """Without the top-level key Phi-3 takes 4096 (Phi3Config's default); a Llama takes the one inside the RoPE
    dict, else its max_position_embeddings (transformers 5's standardize_rope_params)."""
    d = phi35_config()
    del d["original_max_position_embeddings"]
    assert LlamaConfig.from_dict(d).rope_long_from == 4096
    rope = {"rope_type": "longrope", "short_factor": SHORT, "long_factor": LONG}
    llama = dict(model_type="llama", hidden_size=64, num_attention_heads=4, max_position_embeddings=256)
    assert LlamaConfig.from_dict({**llama, "rope_scaling": {**rope, "original_max_position_embeddings": 32}
                                  }).rope_long_from == 32
    assert LlamaConfig.from_dict({**llama, "rope_scaling": rope}).rope_long_from == 256


@pytest.mark.parametrize("model_type", ["phi3", "llama"])
def test_logits_equal_transformers_on_both_sides_of_the_original_context(model_type):
    """A forward of at most 64 tokens takes the short factors, a longer one the long factors (transformers' rule
    for one forward); each within TOL of transformers', and far from the other set's logits."""
    hf = hf_phi3(model_type=model_type)
    model = ours(hf)
    g = torch.Generator().manual_seed(1)
    for n in (40, ORIGINAL, ORIGINAL + 1, 100):
        ids = torch.randint(0, 101, (2, n), generator=g)
        with torch.no_grad():
            mine, theirs = model(ids), hf(ids).logits
        assert (mine - theirs).abs().max().item() <= TOL, n
    forced = hf_phi3(short=LONG, model_type=model_type)  # the long set at any length
    with torch.no_grad():
        short_ids = ids[:, :40]
        assert (model(short_ids) - forced(short_ids).logits).abs().max().item() > 100 * TOL


def test_cached_rows_take_their_own_factors():
    """A full cache's ``rope_long`` picks each row's factor set, whatever the length: prefill in chunks, decode
    and a verify step give, per row, transformers' logits with that set (forced by equal factor lists)."""
    hf = hf_phi3()
    model = ours(hf)
    forced = {True: hf_phi3(short=LONG), False: hf_phi3(long=SHORT)}
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, 101, (2, 90), generator=g)
    rows_long = torch.tensor([False, True])
    cache = FullCache(model.config, 2, 96, rope_long=rows_long)
    with torch.no_grad():
        got = torch.cat([model(ids[:, s:e], cache) for s, e in ((0, 50), (50, 70), (70, 71), (71, 75), (75, 90))], 1)
        for b, long in enumerate(rows_long.tolist()):
            want = forced[long](ids[b: b + 1]).logits[0]
            assert (got[b] - want).abs().max().item() <= TOL, b
            other = forced[not long](ids[b: b + 1]).logits[0]
            assert (got[b] - other).abs().max().item() > 100 * TOL, b
    assert torch.equal(FullCache(model.config, 2, 65).rope_long, torch.tensor([True, True]))  # default: by slots
    assert torch.equal(FullCache(model.config, 2, 64).rope_long, torch.tensor([False, False]))
    assert FullCache(triforce.models.LlamaConfig(), 1, 8).rope_long is None  # no LongRoPE: no choice
    with pytest.raises(ValueError, match="rope_long must be None, a bool or a bool tensor"):
        FullCache(model.config, 2, 64, rope_long=torch.tensor([1, 0]))


@pytest.mark.parametrize("method,opts", [("autoregressive", {}), ("magicdec", {"gamma": 3, "sink": 1, "window": 8}),
                                         ("triforce", {"gamma1": 2, "gamma2": 4, "budget": 16, "chunk_size": 4,
                                                       "sink": 1, "window": 12})])
def test_greedy_tokens_equal_transformers_generate(method, opts):
    """Greedy decoding of a prompt past the original context (long factors throughout, as transformers) and of
    one whose prompt and new tokens stay within it (short throughout), batched together, equal transformers'
    generate; a row that crosses the original context while it decodes takes the long factors from its first
    token (transformers re-prefills with them when it crosses): its tokens equal transformers' with the long
    set forced."""
    # weights large enough that the factor set changes the greedy tokens; no end of sequence (20 tokens each)
    strong = dict(initializer_range=0.3, eos_token_id=None)
    hf = hf_phi3(**strong)
    model = ours(hf)
    g = torch.Generator().manual_seed(4)
    prompts = [torch.randint(3, 101, (n,), generator=g) for n in (70, 30, 50)]
    new = 20  # 70 + 20: long; 30 + 20 = 50 <= 64: short; 50 + 20 = 70 > 64: long from its first token
    out = triforce.generate(model, prompts, method=method, max_new_tokens=new, **opts)
    forced = hf_phi3(short=LONG, **strong)
    for b, (p, ref) in enumerate(zip(prompts, (hf, hf, forced))):
        want = ref.generate(p[None], max_new_tokens=new, do_sample=False)[0, len(p):]
        assert torch.equal(out.tokens[b], want), (b, out.tokens[b], want)
    if method != "autoregressive":
        assert out.stats["mean_accepted"] > 1.0


def test_save_round_trip_reads_in_transformers(tmp_path):
    """Our save of a LongRoPE Phi-3 writes the top-level original_max_position_embeddings Phi3Config reads (it
    would take 4096 otherwise); transformers loads it with the same logits past the original context."""
    model = ours(hf_phi3())
    model.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["original_max_position_embeddings"] == ORIGINAL
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    ids = torch.randint(0, 101, (1, 90), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        assert (model(ids) - back(ids).logits).abs().max().item() <= TOL
    assert torch.equal(Llama.from_pretrained(tmp_path).inv_freq_long, model.inv_freq_long)


# ---- partial RoPE (Phi-4-mini: the first 3/4 of each head rotated, LongRoPE on those)
def phi4_mini_config(**changes) -> dict:
    """A config.json shaped as Phi-4-mini-instruct's (factor values made up: 48 per set for its 96 rotated dims)."""
    return phi35_config(**{"vocab_size": 200064, "num_attention_heads": 24, "num_key_value_heads": 8,
                           "partial_rotary_factor": 0.75, "tie_word_embeddings": True, "eos_token_id": 199999,
                           "pad_token_id": 199999, "bos_token_id": 199999, "rope_scaling": {
                               "type": "longrope", "short_factor": [1.0 + 0.05 * i for i in range(48)],
                               "long_factor": [1.0 + 1.5 * i for i in range(48)]}, **changes})


def test_phi4_mini_config_reads_as_transformers():
    """96 of 128 dims rotated: the 48 rotated pairs' frequencies bitwise transformers' (both sets), a frequency 0
    for the 16 others; LongRoPE's factor lists are one per rotated pair."""
    from transformers.modeling_rope_utils import _compute_longrope_parameters

    d = phi4_mini_config()
    c = LlamaConfig.from_dict(d)
    assert (c.head_dim, c.rotary_dim, c.rope_long_from) == (128, 96, 4096)
    hf = transformers.Phi3Config(**{k: v for k, v in d.items() if k != "auto_map"})
    for seq_len, long in ((None, False), (4097, True)):
        inv_freq, factor = _compute_longrope_parameters(hf, "cpu", seq_len=seq_len)
        mine = rope_inv_freq(c, long=long)
        assert torch.equal(mine[:48], inv_freq) and torch.equal(mine[48:], torch.zeros(16))
        assert rope_attention_scale(c) == factor
    with pytest.raises(ValueError, match="rotary_dim // 2 = 48"):
        LlamaConfig.from_dict(phi4_mini_config(rope_scaling={**d["rope_scaling"], "short_factor": [1.0] * 64}))


def test_partial_rope_model_round_trip_and_engines(tmp_path):
    """A tiny Phi-4-mini (12 of 16 dims rotated, LongRoPE): transformers reads our save back with the same
    logits (the q / k dims back in the checkpoint's order), and every method's greedy tokens equal transformers'
    generate, the StreamingLLM drafts re-rotating their keys with the unrotated dims left as they are."""
    from .test_families import hf_model

    hf = hf_model("phi4-mini-partial", initializer_range=0.3, eos_token_id=None)
    model = ours(hf)
    assert model.config.rotary_dim == 12
    model.save_pretrained(tmp_path)
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    for name, t in hf.state_dict().items():
        assert torch.equal(back.state_dict()[name], t), name
    prompts = [torch.randint(3, 101, (n,), generator=torch.Generator().manual_seed(n)) for n in (70, 30)]
    want = [hf.generate(p[None], max_new_tokens=16, do_sample=False)[0, len(p):] for p in prompts]
    for method, opts in (("autoregressive", {}), ("magicdec", {"gamma": 3, "sink": 1, "window": 8}),
                         ("triforce", {"gamma1": 2, "gamma2": 4, "budget": 16, "chunk_size": 4, "sink": 1,
                                       "window": 12}),
                         ("tree", {"tree": (2, 2, 1), "sink": 1, "window": 16})):
        out = triforce.generate(model, prompts, method=method, max_new_tokens=16, **opts)
        for b in range(2):
            assert torch.equal(out.tokens[b], want[b]), (method, b, out.tokens[b], want[b])
