"""Tiny random Llamas: parity with transformers' LlamaForCausalLM, cache paths == plain forward,
ragged batches, trees, layer skipping, loading round trips and bad input."""
import copy
import json

import pytest
import torch

import triforce_kernels as tk
from triforce.models import FullCache, Llama, LlamaConfig, StreamingCache
from triforce.models.llama import ROWWISE_MAX_ROWS

transformers = pytest.importorskip("transformers")

# fp32 reordering bound for these tiny models (hidden 64, 2 layers, logits ~1): measured max |diff|
# between our forward and transformers' is ~1e-7..5e-7 (different matmul/attention orderings);
# 1e-5 leaves 20x margin and still catches any real bug (a wrong RoPE or mask moves logits by >1e-2).
TOL = 1e-5


def tiny_config(**kw):
    base = dict(vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=512, rope_theta=10000.0, rms_norm_eps=1e-5)
    base.update(kw)
    return LlamaConfig(**base)


def tiny_model(seed=0, **kw):
    torch.manual_seed(seed)
    return Llama(tiny_config(**kw)).eval()


def hf_twin(model):
    cfg = {k: v for k, v in model.config.to_dict().items() if k not in ("extra", "architectures", "model_type")}
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**cfg, attn_implementation="eager")).eval()
    missing, unexpected = hf.load_state_dict(model.state_dict(), strict=False)
    assert not unexpected and all("rotary" in k for k in missing), (missing, unexpected)
    return hf


@pytest.mark.parametrize("kw", [
    {},
    {"tie_word_embeddings": True},
    {"num_key_value_heads": 4},
    {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 64}, "rope_theta": 500000.0},
    {"rope_scaling": {"type": "linear", "factor": 2.0}},
])
def test_forward_matches_transformers(kw):
    model = tiny_model(**kw)
    hf = hf_twin(model)
    ids = torch.randint(0, 101, (2, 300))
    with torch.no_grad():
        ours, theirs = model(ids), hf(ids).logits
    assert ours.dtype == torch.float32 and ours.shape == (2, 300, 101)
    assert (ours - theirs).abs().max().item() <= TOL


def test_random_init_is_seeded():
    a, b, c = tiny_model(seed=1), tiny_model(seed=1), tiny_model(seed=2)
    for (n, p), q, r in zip(a.state_dict().items(), b.state_dict().values(), c.state_dict().values()):
        assert torch.equal(p, q), n
    assert not torch.equal(a.lm_head.weight, c.lm_head.weight)


@pytest.mark.parametrize("P,chunk", [(1, 4), (7, 3), (33, 8), (40, 256)])
def test_prefill_and_decode_equal_plain_forward(P, chunk):
    model = tiny_model()
    ids = torch.randint(0, 101, (2, P + 6))
    ref = model(ids)
    cache = FullCache(model.config, 2, 64, chunk_size=4)
    last = model.prefill(ids[:, :P], cache, chunk_size=chunk)
    assert (last - ref[:, P - 1]).abs().max() <= TOL
    assert cache.lengths.tolist() == [P, P]
    out = model(ids[:, P:P + 3], cache=cache)  # a 3-token verify step
    assert (out - ref[:, P:P + 3]).abs().max() <= TOL
    for t in range(P + 3, P + 6):  # token-by-token decode
        out = model(ids[:, t:t + 1], cache=cache)
        assert (out[:, 0] - ref[:, t]).abs().max() <= TOL
    assert cache.lengths.tolist() == [P + 6] * 2


def test_ragged_batch_equals_per_sequence_runs():
    model = tiny_model()
    lens = [5, 17, 1, 12]
    prompts = [torch.randint(0, 101, (n,)) for n in lens]
    cache = FullCache(model.config, 4, 40)
    last = model.prefill(prompts, cache, chunk_size=6)
    assert cache.lengths.tolist() == lens
    nxt = torch.randint(0, 101, (4, 3))
    step = model(nxt, cache=cache)  # rows append after different lengths
    for b, p in enumerate(prompts):
        c1 = FullCache(model.config, 1, 40)
        l1 = model.prefill(p[None], c1, chunk_size=6)
        s1 = model(nxt[b:b + 1], cache=c1)
        assert (last[b] - l1[0]).abs().max() <= TOL
        assert (step[b] - s1[0]).abs().max() <= TOL
        assert (step[b] - model(torch.cat([p, nxt[b]])[None])[0, -3:]).abs().max() <= TOL


def test_tree_forward_equals_each_branch():
    model = tiny_model()
    prompt = torch.randint(0, 101, (1, 9))
    #        0
    #      /   \
    #     1     2
    #    / \     \
    #   3   4     5
    parents = torch.tensor([[-1, 0, 0, 1, 1, 2]])
    toks = torch.randint(0, 101, (1, 6))
    cache = FullCache(model.config, 1, 32)
    model.prefill(prompt, cache)
    out = model(toks, cache=cache, tree_parents=parents)
    assert cache.lengths.tolist() == [15]
    for leaf, path in ((3, [0, 1, 3]), (4, [0, 1, 4]), (5, [0, 2, 5])):
        seq = torch.cat([prompt[0], toks[0, path]])[None]
        ref = model(seq)[0, -3:]
        assert (out[0, path] - ref).abs().max() <= TOL, leaf


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_a_pass_gives_the_bits_of_one_token_steps(dtype):
    """On CPU in float32, bfloat16 and float16, the logits of a pass of T tokens (causal, and a tree) are bitwise
    those of one-token steps over the same tokens: the projections are row-independent (docs/model.md,
    "Linear layers on CPU") and so is the attention (docs/attention.md, "Independent of T"). Heads of 64
    take the AVX-512 paths; the prompt crosses the attention's 512-key parts."""
    model = tiny_model(hidden_size=256, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024).to(dtype)
    assert_long_pass_gives_the_bits_of_steps(model, dtype)


@pytest.mark.parametrize("family", ["llama", "gemma"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_a_pass_gives_the_bits_of_one_token_steps_at_any_mlp_width(dtype, family):
    """As above with an MLP 81 wide: with ATen's SiLU, a pass's [18, 81] rows and a step's [2, 81] put
    different elements of the last row in the vectorised loop's scalar tail, which rounds otherwise; the
    model layer's own SiLU and GELU (triforce_C::silu_mul, gelu_tanh_mul) compute every element alike.
    Gemma: GeGLU, RMSNorm's 1 + w and the scaled embeddings, on the modules' path."""
    model = tiny_model(hidden_size=256, intermediate_size=81, num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=1024, model_type=family).to(dtype)
    assert_long_pass_gives_the_bits_of_steps(model, dtype)


def assert_long_pass_gives_the_bits_of_steps(model, cache_dtype):
    """A causal pass of 9 tokens and a 9-node tree over a 530-token prompt (a cache in ``cache_dtype``): the
    logits are bitwise those of one-token steps over the same tokens."""
    prompt = torch.randint(0, 101, (2, 530))
    toks = torch.randint(0, 101, (2, 9))

    def primed():
        cache = FullCache(model.config, 2, 600, dtype=cache_dtype)
        model.prefill(prompt, cache)
        return cache

    with torch.no_grad():
        pass_logits = model(toks, cache=primed())
        c = primed()
        steps = torch.cat([model(toks[:, t:t + 1], cache=c) for t in range(9)], 1)
        assert torch.equal(pass_logits, steps)
        parents = torch.tensor([[-1, 0, 0, 1, 1, 2, 5, 6, 3]] * 2)
        tree_logits = model(toks, cache=primed(), tree_parents=parents)
        for leaf, path in ((4, [0, 1, 4]), (7, [0, 2, 5, 6, 7]), (8, [0, 1, 3, 8])):
            c = primed()
            branch = torch.cat([model(toks[:, s:s + 1], cache=c) for s in path], 1)
            assert torch.equal(tree_logits[:, path], branch), leaf


@pytest.mark.skipif(torch.cuda.is_available() or not tk.backend_status("triton", "cpu")[0],
                    reason="the GPU's module-by-module path in the interpreter, under the CPU's row-independent projections")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_the_elementwise_kernels_in_a_model(dtype, monkeypatch):
    """The model layer's GPU path (the modules one by one, the CPU's fused layer off) with its elementwise
    work in the Triton kernels (triforce_kernels/triton/layer_ops.py; interpreter) and the Triton
    attention: logits close to the same path in PyTorch ops (the norms' sums of squares are added in
    another order, SiLU's exp differs in its last places), and still a pass's logits bitwise those of
    one-token steps, causal and tree: each kernel computes a row alone."""
    from triforce.models import llama
    from triforce_kernels.triton import layer_ops
    monkeypatch.setattr(llama, "_fused_available", lambda: False)
    monkeypatch.setenv("TRIFORCE_BACKEND", "triton")
    model = tiny_model(hidden_size=128, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
                       max_position_embeddings=1024).to(dtype)
    prompt, toks = torch.randint(0, 101, (2, 45)), torch.randint(0, 101, (2, 6))
    with torch.no_grad():
        prefilled = FullCache(model.config, 2, 64, dtype=dtype)
        model.prefill(prompt, prefilled)
    primed = lambda: copy.deepcopy(prefilled)
    calls = []
    for name in ("rms_norm", "rope", "silu_mul"):
        real = getattr(layer_ops, name)
        monkeypatch.setattr(layer_ops, name, lambda *a, _f=real, _n=name, **k: calls.append(_n) or _f(*a, **k))
    with torch.no_grad():
        plain = model(toks, cache=primed())
        assert not calls
        monkeypatch.setattr(llama, "_ELEMENTWISE_ON_CPU", True)
        monkeypatch.setattr(llama, "_ELEMENTWISE", None)
        pass_logits = model(toks, cache=primed())
        # per layer: 2 norms (the second with the residual add), q and k RoPE, SiLU * up; the final norm
        assert sorted(set(calls)) == ["rms_norm", "rope", "silu_mul"] and calls.count("rms_norm") == 2 * 2 + 1
        err = (pass_logits - plain).abs().max().item()
        # measured: 1.2e-7 of 0.73 in float32, 0 in float16 (here a few float16 units would be allowed)
        assert err <= {torch.float32: 1e-6, torch.float16: 4e-3}[dtype] * plain.abs().max().item(), err
        _assert_pass_and_tree_give_the_bits_of_steps(model, toks, primed, pass_logits)


@pytest.mark.skipif(torch.cuda.is_available() or not tk.backend_status("triton", "cpu")[0],
                    reason="the Triton attention in the interpreter, under the CPU's row-independent projections")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_a_pass_gives_the_bits_of_one_token_steps_with_triton_attention(dtype, monkeypatch):
    """As above with the attention on the Triton kernel (TRIFORCE_BACKEND=triton, in the interpreter;
    the projections stay on the CPU's row-independent kernels): a model's logits of a causal pass and of
    a tree pass are bitwise those of one-token steps (docs/attention.md, "The Triton kernel"). The
    prompt crosses the interpreter plan's parts (32 keys, one tile, for this cache). On a GPU the
    projections go through cuBLAS, so this holds only for the attention there
    (tests/test_verify_attention.py)."""
    monkeypatch.setenv("TRIFORCE_BACKEND", "triton")
    model = tiny_model(hidden_size=128, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
                       max_position_embeddings=1024).to(dtype)
    prompt = torch.randint(0, 101, (2, 45))
    toks = torch.randint(0, 101, (2, 6))

    with torch.no_grad():
        prefilled = FullCache(model.config, 2, 64, dtype=dtype)
        model.prefill(prompt, prefilled)  # once: the interpreter takes seconds per prefill
    primed = lambda: copy.deepcopy(prefilled)

    with torch.no_grad():
        pass_logits = model(toks, cache=primed())
        _assert_pass_and_tree_give_the_bits_of_steps(model, toks, primed, pass_logits)


def _assert_pass_and_tree_give_the_bits_of_steps(model, toks, primed, pass_logits):
    """``pass_logits`` (a causal pass of ``toks`` [2, 6] over ``primed()``) are bitwise the one-token steps'
    logits, and a tree pass's logits are those of the steps along two of its branches."""
    c = primed()
    steps = torch.cat([model(toks[:, t:t + 1], cache=c) for t in range(6)], 1)
    assert torch.equal(pass_logits, steps)
    parents = torch.tensor([[-1, 0, 0, 1, 2, 4]] * 2)
    tree_logits = model(toks, cache=primed(), tree_parents=parents)
    for path in ([0, 1, 3], [0, 2, 4, 5]):
        c = primed()
        branch = torch.cat([model(toks[:, s:s + 1], cache=c) for s in path], 1)
        assert torch.equal(tree_logits[:, path], branch), path


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_a_pass_of_many_rows_gives_the_bits_of_one_token_steps(dtype):
    """As above for a pass of 30 x 9 = 270 rows: more than a fused layer takes (``ROWWISE_MAX_ROWS``),
    and more than one chunk of the linear kernel's rows (256). With torch's GEMM on such a pass (what a
    prefill's chunks take) some rows round differently from a one-token step, in each dtype."""
    model = tiny_model(hidden_size=256, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256).to(dtype)
    B, T = 30, 9
    prompt = torch.randint(0, 101, (B, 40))
    toks = torch.randint(0, 101, (B, T))
    assert B * T > ROWWISE_MAX_ROWS and B * 40 > ROWWISE_MAX_ROWS

    def primed():
        cache = FullCache(model.config, B, 60, dtype=dtype)
        model.prefill(prompt, cache, chunk_size=40)
        return cache

    with torch.no_grad():
        pass_logits = model(toks, cache=primed())
        c = primed()
        steps = torch.cat([model(toks[:, t:t + 1], cache=c) for t in range(T)], 1)
        assert torch.equal(pass_logits, steps)
        parents = torch.tensor([[-1, 0, 0, 1, 1, 2, 5, 6, 3]] * B)
        tree_logits = model(toks, cache=primed(), tree_parents=parents)
        path = [0, 2, 5, 6, 7]
        c = primed()
        branch = torch.cat([model(toks[:, s:s + 1], cache=c) for s in path], 1)
        assert torch.equal(tree_logits[:, path], branch)


def test_layer_skip_shares_weights():
    model = tiny_model(num_hidden_layers=3)
    draft = model.layer_skip(1)
    assert draft.config.num_hidden_layers == 1 and len(draft.model.layers) == 1
    assert draft.model.layers[0] is model.model.layers[0] and draft.lm_head.weight is model.lm_head.weight
    ids = torch.randint(0, 101, (1, 10))
    with torch.no_grad():
        h = model.model.embed_tokens(ids)
        ref = model.model.layers[0].mlp  # sanity: shared module
        assert ref is draft.model.layers[0].mlp
    cache = FullCache(draft.config, 1, 16)
    last = draft.prefill(ids, cache)
    assert (last - draft(ids)[:, -1]).abs().max() <= TOL
    with torch.no_grad():
        model.model.layers[0].mlp.down_proj.weight.mul_(2)  # a change in the target shows in the draft
    assert (draft(ids) - draft.layer_skip(1)(ids)).abs().max() == 0
    with pytest.raises(ValueError, match="k must be"):
        model.layer_skip(4)
    del h


def test_hf_directory_round_trip(tmp_path):
    for tied in (False, True):
        model = tiny_model(tie_word_embeddings=tied)
        model.save_pretrained(tmp_path / str(tied))
        cfg = json.loads((tmp_path / str(tied) / "config.json").read_text())
        assert cfg["num_key_value_heads"] == 2 and cfg["tie_word_embeddings"] is tied
        loaded = Llama.from_pretrained(tmp_path / str(tied))
        ids = torch.randint(0, 101, (1, 12))
        assert torch.equal(loaded(ids), model(ids))
        assert (loaded.lm_head.weight is loaded.model.embed_tokens.weight) is tied


def test_dtype_casts_keep_the_rope_frequencies_float32(tmp_path):
    """model.to(bfloat16) (the default draft copy) computes RoPE as from_pretrained(dtype=bfloat16) does:
    the cast used to round the frequencies to bfloat16 too (up to 0.4%: radians off at long positions)."""
    model = tiny_model()
    model.save_pretrained(tmp_path)
    loaded = Llama.from_pretrained(tmp_path, dtype=torch.bfloat16)
    for cast in (lambda m: m.to(torch.bfloat16), lambda m: m.half(), lambda m: m.to(torch.bfloat16).float()):
        m = cast(tiny_model())
        assert m.inv_freq.dtype == torch.float32 and torch.equal(m.inv_freq, model.inv_freq)
    ids = torch.randint(0, 101, (1, 60))
    assert torch.equal(tiny_model().to(torch.bfloat16)(ids), loaded(ids))

def test_loading_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no model"):
        Llama.from_pretrained(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="config.json"):
        Llama.from_pretrained(tmp_path)
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 40)
    with pytest.raises(ValueError, match="corrupt|cannot read"):
        Llama.from_pretrained(bad, cache_dir=False)
    model = tiny_model()
    model.save_pretrained(tmp_path / "m")
    (tmp_path / "m" / "model.safetensors").write_bytes(b"garbage garbage garbage")
    with pytest.raises(ValueError, match="corrupt"):
        Llama.from_pretrained(tmp_path / "m")
    other = tiny_model(hidden_size=32)
    other.save_pretrained(tmp_path / "o")
    (tmp_path / "o" / "config.json").write_text(json.dumps(model.config.to_dict()))
    with pytest.raises(ValueError, match="shape"):
        Llama.from_pretrained(tmp_path / "o")


def test_bad_input():
    model = tiny_model(max_position_embeddings=64)
    cache = FullCache(model.config, 2, 32)
    with pytest.raises(ValueError, match="empty"):
        model.prefill([torch.tensor([1, 2]), torch.tensor([], dtype=torch.long)], cache)
    with pytest.raises(ValueError, match="no sequences"):
        model.prefill([], cache)
    with pytest.raises(ValueError, match="context"):
        model.prefill(torch.zeros(2, 65, dtype=torch.long), cache)
    with pytest.raises(ValueError, match="max_len"):
        model.prefill(torch.zeros(2, 33, dtype=torch.long), cache)
    with pytest.raises(ValueError, match="max_len .* exceeds"):
        FullCache(model.config, 1, 65)
    with pytest.raises(ValueError, match="vocab_size"):
        model.prefill(torch.full((2, 3), 101), cache)
    with pytest.raises(ValueError, match="1-D"):
        model.prefill([torch.zeros(2, 2, dtype=torch.long)] * 2, cache)
    with pytest.raises(ValueError, match="batch_size"):
        model.prefill(torch.zeros(3, 4, dtype=torch.long), cache)
    with pytest.raises(TypeError, match="int64"):
        model(torch.zeros(1, 3))
    with pytest.raises(ValueError, match="shape"):
        model(torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="context"):
        model(torch.zeros(1, 65, dtype=torch.long))
    for bad in (101, -1):  # the embedding's bare IndexError before
        with pytest.raises(ValueError, match=f"input_ids holds token ids outside \\[0, vocab_size=101\\): \\[{bad}\\]"):
            model(torch.tensor([[5, bad]]))
    model.prefill(torch.zeros(2, 3, dtype=torch.long), cache)
    with pytest.raises(ValueError, match="vocab_size"):
        model(torch.tensor([[5], [500]]), cache=cache)
    assert cache.lengths.tolist() == [3, 3]
    # a cache in another dtype is served (Llama.kv_dtype, tests/test_kv_dtype.py); one on another device is not
    with pytest.raises(ValueError, match="cache is on meta, the model on cpu"):
        model(torch.zeros(2, 1, dtype=torch.long), cache=FullCache(model.config, 2, 8, device="meta"))
    model.prefill(torch.zeros(2, 30, dtype=torch.long), cache)
    with pytest.raises(ValueError, match="full"):
        model(torch.zeros(2, 3, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match="tree_parents"):
        model(torch.zeros(2, 2, dtype=torch.long), cache=cache, tree_parents=torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="num_attention_heads"):
        LlamaConfig(num_attention_heads=6, num_key_value_heads=4)
    with pytest.raises(ValueError, match="rope_scaling"):
        LlamaConfig(rope_scaling={"rope_type": "yarn", "factor": 2.0})
    with pytest.raises(ValueError, match="sink"):
        StreamingCache(model.config, 1, sink=-1, window=4, max_step=2)
