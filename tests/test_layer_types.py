"""The layer types, windows and RoPE of the families that mix sliding and full layers (OLMo 3, EXAONE 4, Cohere 2), read
from any config transformers builds and runs: random layer counts, windows (none, shorter than the tokens, longer
than the context), ``layer_types`` lists and patterns, each against transformers' own model on the same weights (the
logits of a plain forward, and a verify pass over the cache): every config transformers runs loads here with its
model."""
import pytest
import torch
from hypothesis import HealthCheck, event, given, settings, strategies as st

from triforce.models import FullCache

from .test_families import TINY, transformers_and_ours
from .test_model import TOL

transformers = pytest.importorskip("transformers")

BASE = {k: v for k, v in TINY.items() if k not in ("rms_norm_eps", "max_position_embeddings")}


@st.composite
def configs(draw):
    name = draw(st.sampled_from(["Olmo3", "Exaone4", "Cohere2"]))
    n = draw(st.integers(1, 6))
    kw = dict(BASE, num_hidden_layers=n, pad_token_id=None, max_position_embeddings=draw(st.sampled_from([32, 64])))
    window = draw(st.one_of(st.none(), st.integers(1, 12), st.just(100), st.just("absent")))
    if window != "absent":
        kw["sliding_window"] = window
    if draw(st.booleans()):
        kw["layer_types"] = draw(st.lists(st.sampled_from(["sliding_attention", "full_attention"]), min_size=n,
                                          max_size=n))
    elif name != "Olmo3" and draw(st.booleans()):
        kw["sliding_window_pattern"] = draw(st.integers(1, 4))
    return name, kw


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configs())
def test_windows_and_ropes_match_transformers(case):
    """Ours from the config and weights of a random transformers model that builds and runs: its logits over 20 tokens
    (several windows), and a 5-token verify pass after a 15-token prefill of our cache, within the tolerance of
    transformers'."""
    name, kw = case
    try:
        config = getattr(transformers, f"{name}Config")(**kw, attn_implementation="eager")
        hf = getattr(transformers, f"{name}ForCausalLM")(config).eval()
        ids = torch.randint(0, 101, (1, 20), generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            ref = hf(ids).logits
    except Exception:  # transformers cannot build or run it (a sliding layer without a window, ...): nothing to match
        event(f"{name}: transformers fails")
        return
    event(f"{name}: compared")
    hf, ours = transformers_and_ours(name, **kw)  # (raises where this library refuses a config transformers runs)
    with torch.no_grad():
        ref = hf(ids).logits
        assert (ours(ids) - ref).abs().max().item() <= TOL
        cache = FullCache(ours.config, 1, 32)
        ours.prefill(ids[:, :15], cache)
        assert (ours(ids[:, 15:], cache=cache) - ref[:, 15:]).abs().max().item() <= TOL
