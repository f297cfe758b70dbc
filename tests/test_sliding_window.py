"""Sliding-window attention in the model layer (Mistral's ``sliding_window``, Qwen's sliding layers): logits
equal to transformers' where the window hides keys, on every forward path (plain, chunked prefill, verify
passes, trees, the fused CPU layers), a pass with the bits of its one-token steps, and every method's greedy
tokens equal autoregressive decoding's."""
import pytest
import torch

import triforce
from triforce.models import FullCache, Llama, LlamaConfig, StreamingCache

from .test_engines import TINY_CASES, assert_greedy_equals_autoregressive
from .test_families import hf_model
from .test_model import TOL

transformers = pytest.importorskip("transformers")

WINDOWED = {  # name -> (family of test_families, transformers config kwargs)
    "mistral": ("mistral", dict(sliding_window=7)),
    "qwen2-sliding-layer-1": ("qwen2", dict(use_sliding_window=True, sliding_window=6, max_window_layers=1)),
    "qwen3-layer-types": ("qwen3", dict(use_sliding_window=True, sliding_window=5,
                                        layer_types=["sliding_attention", "full_attention"])),
    "ministral-layer-types": ("ministral", dict(sliding_window=7, layer_types=["full_attention", "sliding_attention"])),
    "ministral-every-layer": ("ministral", dict(sliding_window=6)),
}


def windowed_pair(name):
    """(transformers' model, ours on the same weights) for a tiny windowed model."""
    family, kw = WINDOWED[name]
    hf = hf_model(family, **kw)
    from triforce.models.loading import _build

    config = LlamaConfig.from_dict(hf.config.to_dict())
    assert any(config.layer_windows)
    return hf, _build(config, hf.state_dict(), None, None)


def assert_every_path_matches(hf, ours):
    """On 40 tokens (several windows): our plain forward, a chunked prefill (chunks longer than the windows), a
    verify pass and one-token steps give transformers' logits, a tree node (a branch deeper than the windows)
    those of its path. -> (ids, transformers' logits)."""
    ids = torch.randint(0, 101, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(ids).logits
        assert (ours(ids) - ref).abs().max().item() <= TOL
        cache = FullCache(ours.config, 2, 64, chunk_size=4)
        assert (ours.prefill(ids[:, :25], cache, chunk_size=9) - ref[:, 24]).abs().max() <= TOL
        assert (ours(ids[:, 25:31], cache=cache) - ref[:, 25:31]).abs().max() <= TOL
        for i in range(31, 34):
            assert (ours(ids[:, i:i + 1], cache=cache)[:, 0] - ref[:, i]).abs().max() <= TOL
        parents = torch.tensor([[-1, 0, 0, 1, 3, 4, 5, 6, 7]] * 2)
        toks = ids[:, 31:40]
        out = ours(toks, cache=cache, tree_parents=parents)
        for path in ([0, 1, 3, 4, 5, 6, 7, 8], [0, 2]):
            seq = torch.cat([ids[:, :34], toks[:, path]], 1)
            assert (out[:, path] - hf(seq).logits[:, -len(path):]).abs().max() <= TOL
    return ids, ref


@pytest.mark.parametrize("name", list(WINDOWED))
def test_logits_match_transformers(tmp_path, name):
    """Sequences several windows long: the plain forward, a chunked prefill, a verify pass and one-token
    steps give transformers' logits; a tree node's, those of its path."""
    hf, ours = windowed_pair(name)
    ids, ref = assert_every_path_matches(hf, ours)
    # the HF directory round trip keeps the windows, and transformers reads ours back the same
    ours.save_pretrained(tmp_path)
    assert Llama.from_pretrained(tmp_path).config.layer_windows == ours.config.layer_windows
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    with torch.no_grad():
        assert (back(ids).logits - ref).abs().max().item() <= TOL


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("native", ["1", "0"], ids=["layer-stack", "per-layer"])
def test_a_pass_gives_the_bits_of_one_token_steps(monkeypatch, dtype, native):
    """On the CPU (the fused layer stack, and the layers called one by one): a verify pass over a windowed
    model gives bitwise the logits of one-token steps, so speculative decoding keeps its tokens exactly."""
    monkeypatch.setenv("TRIFORCE_DECODER_LAYERS", native)
    monkeypatch.setattr(triforce.models.llama, "_STACK", None)
    assert_pass_equals_steps(windowed_pair("qwen2-sliding-layer-1")[1], dtype)
    assert_pass_equals_steps(windowed_pair("ministral-layer-types")[1], dtype)


def assert_pass_equals_steps(model, dtype, tokens=10):
    """A ``tokens``-token pass (of 2 rows) after a 20-token prefill gives bitwise the logits of as many one-token
    steps."""
    model = model.to(dtype)
    ids = torch.randint(0, 101, (2, 20 + tokens), generator=torch.Generator().manual_seed(3))
    caches = [FullCache(model.config, 2, 64, dtype=dtype) for _ in range(2)]
    with torch.no_grad():
        for c in caches:
            model.prefill(ids[:, :20], c)
        passed = model(ids[:, 20:], cache=caches[0])
        steps = torch.cat([model(ids[:, i:i + 1], cache=caches[1]) for i in range(20, 20 + tokens)], 1)
    assert torch.equal(passed, steps)


def test_the_fused_layers_apply_the_windows(monkeypatch):
    """The CPU's one-call layer stack gives the per-layer path's logits bitwise on a windowed model (so it
    passes each layer's window; without it the logits differ)."""
    _, model = windowed_pair("mistral")
    ids = torch.randint(0, 101, (1, 30), generator=torch.Generator().manual_seed(4))
    out = {}
    for native in ("1", "0"):
        monkeypatch.setenv("TRIFORCE_DECODER_LAYERS", native)
        monkeypatch.setattr(triforce.models.llama, "_STACK", None)
        cache = FullCache(model.config, 1, 64)
        with torch.no_grad():
            model.prefill(ids[:, :24], cache)
            out[native] = model(ids[:, 24:30], cache=cache)
    assert torch.equal(out["1"], out["0"])
    if triforce.models.llama._native_stack_available():
        no_window = FullCache(model.config, 1, 64)
        no_window.windows = (0,) * model.config.num_hidden_layers
        with torch.no_grad():
            model.prefill(ids[:, :24], no_window)
            assert not torch.allclose(model(ids[:, 24:30], cache=no_window), out["1"])


def tiny_windowed(seed, window=6, layers=("sliding_attention", "full_attention")):
    torch.manual_seed(seed)
    cfg = LlamaConfig(model_type="qwen3", vocab_size=64, hidden_size=32, intermediate_size=64,
                      num_hidden_layers=len(layers), num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                      max_position_embeddings=1024, initializer_range=0.3,
                      extra={"use_sliding_window": True, "sliding_window": window, "layer_types": list(layers)})
    return Llama(cfg).eval()


@pytest.mark.parametrize("method,opts", TINY_CASES, ids=[f"{m}-{i}" for i, (m, _) in enumerate(TINY_CASES)])
def test_greedy_equals_autoregressive(method, opts):
    """Every method's greedy tokens equal autoregressive decoding's on a model with a 6-token window (its
    drafts' caches attend to what they hold; the full cache hides what the window hides)."""
    assert_greedy_equals_autoregressive(tiny_windowed(0), tiny_windowed(1), method, opts)


def test_layer_skip_keeps_the_first_layers_windows():
    model = tiny_windowed(0, layers=("full_attention", "sliding_attention", "full_attention"))
    assert model.layer_skip(2).config.layer_windows == (0, 6)
    assert model.config.layer_windows == (0, 6, 0)


@pytest.mark.parametrize("native", ["1", "0"], ids=["layer-stack", "per-layer"])
@pytest.mark.parametrize("window,max_step,tree", [(3, 1, False), (6, 1, False), (8, 3, False), (12, 4, False),
                                                  (9, 4, True)],
                         ids=["shorter", "holds-the-window", "sorted", "sorted-longer", "sorted-tree"])
def test_a_streaming_cache_sees_the_models_window(monkeypatch, native, window, max_step, tree):
    """A StreamingLLM cache on a model whose every layer slides (W = 7), from a prompt long enough that no query
    reaches the sinks: its sliding layers see no sink (``cache_leftpad``) and, where the cache holds more than
    the window (``window + max_step > W``), count the window's last ranks over slots kept in position order.
    So with ``window >= W - 1`` (it holds every key the model's window shows) its forwards (steps, passes of up to
    ``max_step`` tokens, rollbacks, a tree, then an 8-token chunk) give the full cache's logits; with a shorter one
    (``shorter``: steps), those of the full cache with a window of ``window + 1`` from the prompt on (its recent
    tokens and the query).
    Without the left padding (``shorter``) or the order (``sorted*``) the logits differ."""
    monkeypatch.setenv("TRIFORCE_DECODER_LAYERS", native)
    monkeypatch.setattr(triforce.models.llama, "_STACK", None)
    _, model = windowed_pair("mistral")
    W = model.config.layer_windows[0]
    assert set(model.config.layer_windows) == {W} and (window >= W - 1 or max_step == 1)
    g = torch.Generator().manual_seed(window)
    ids = torch.randint(0, 101, (2, 80), generator=g)
    full = FullCache(model.config, 2, 96)
    stream = StreamingCache(model.config, 2, sink=2, window=window, max_step=max_step)
    assert stream._in_order == (window + max_step > W)
    with torch.no_grad():
        model.prefill(ids[:, :20], full)
        stream.fill_from(full)
        full.windows = (min(W, window + 1),) * model.config.num_hidden_layers
        n, worst = 20, 0.0
        while n < 70:
            T = int(torch.randint(1, max_step + 1, (1,), generator=g))
            parents = torch.tensor([[-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, T)]] * 2)
            kw = dict(tree_parents=parents) if tree and T > 1 else {}
            toks = ids[:, n:n + T]
            got, want = model(toks, cache=stream, **kw), model(toks, cache=full, **kw)
            worst = max(worst, (got - want).abs().max().item())
            keep = int(torch.randint(1, T + 1, (1,), generator=g)) if not kw else 1  # a tree keeps its root
            for c in (stream, full):
                c.rollback(c.lengths - T + keep)
            n += keep
        if window >= W - 1:  # a prefill-sized forward (a chunk longer than the window) after the steps
            toks = ids[:, n:n + 8]
            worst = max(worst, (model(toks, cache=stream) - model(toks, cache=full)).abs().max().item())
    assert worst <= TOL, worst
