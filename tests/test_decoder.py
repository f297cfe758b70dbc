"""The fused CPU decoder layer (csrc/cpu/decoder.cpp: ``triforce_C::decoder_attn_in`` and
``decoder_attn_out_mlp``, taken by ``DecoderLayer`` for forwards of at most ``ROWWISE_MAX_ROWS`` rows)
against the modules run one by one: logits and caches bitwise equal for every family switch (biases,
Qwen3's q/k norms, head_dim), float32, bfloat16 and the int8 draft copy, chain and tree forwards, and
every cache kind; the path is taken exactly where it should be."""
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from triforce.models import FullCache, Llama, LlamaConfig, RetrievalCache, StreamingCache, TokenTree
from triforce.models import llama as llama_mod
from triforce.models.llama import ROWWISE_MAX_ROWS, _fused_available
from triforce.models.quant import int8_copy

pytestmark = pytest.mark.skipif(not _fused_available(), reason="the C++ extension is not built")

BASE = dict(vocab_size=97, hidden_size=64, intermediate_size=80, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256)
FAMILIES = {
    "llama": {},
    "llama-biases": dict(attention_bias=True, mlp_bias=True),
    "qwen2": dict(model_type="qwen2"),  # q/k/v biases
    "qwen3": dict(model_type="qwen3", head_dim=8),  # q/k RMSNorm, head_dim != hidden / heads
    "qwen3-bias": dict(model_type="qwen3", head_dim=32, attention_bias=True),
}


# the families whose layers only the native stack fuses (decoder_layers' norm_bias and mlp): torch's LayerNorm (with
# a bias, or DBRX's without) and ungated MLPs; their per-layer calls are the modules
STACK_FAMILIES = {
    "starcoder2": dict(model_type="starcoder2", attention_bias=True, mlp_bias=True),  # LayerNorm, GELU (tanh form)
    "stablelm": dict(model_type="stablelm"),  # LayerNorm, SwiGLU, partial RoPE
    "gpt2": dict(model_type="gpt2", attention_bias=True, mlp_bias=True, num_key_value_heads=4),  # NoPE, learned
    "opt": dict(model_type="opt", attention_bias=True, mlp_bias=True, num_key_value_heads=4),  # ReLU, positions
    "gpt_neox-sequential": dict(model_type="gpt_neox", num_key_value_heads=4, attention_bias=True, mlp_bias=True,
                                extra={"use_parallel_residual": False}),  # the exact GELU, partial RoPE
    "gpt_neox_japanese": dict(model_type="gpt_neox_japanese", num_key_value_heads=4),  # the last layer's o bias only
    "arcee": dict(model_type="arcee"),  # RMSNorm, ReLU squared
    "jais2": dict(model_type="jais2", attention_bias=True, mlp_bias=True),  # LayerNorm, ReLU squared
    # parallel blocks (the stack's parallel): the MLP's own norm (GPT-NeoX's default), the attention's (Phi-2's),
    # Falcon 40b's grouped keys and two norms
    "gpt_neox-parallel": dict(model_type="gpt_neox", num_key_value_heads=4, attention_bias=True, mlp_bias=True),
    "phi": dict(model_type="phi", num_key_value_heads=4),
    "falcon-40b": dict(model_type="falcon", extra={"new_decoder_architecture": True, "num_kv_heads": 2,
                                                   "bias": False}),
    # unscaled scores (the stack's attention_scale) and a window on its local layers
    "gpt_neo": dict(model_type="gpt_neo", mlp_bias=True, num_key_value_heads=4,
                    extra={"attention_types": [[["global", "local"], 1]], "window_size": 5}),
    # each norm after its block's residual add (the stack's norm_after): opt-350m's (and its projected embeddings,
    # outside the stack), GPT-1's
    "opt-350m": dict(model_type="opt", attention_bias=True, mlp_bias=True, num_key_value_heads=4,
                     extra={"do_layer_norm_before": False, "word_embed_proj_dim": 48}),
    "openai-gpt": dict(model_type="openai-gpt", attention_bias=True, mlp_bias=True, num_key_value_heads=4),
    # Nemotron's LayerNorm1P (its weight applied as 1 + w), ReLU squared, RoPE on half of each head
    "nemotron": dict(model_type="nemotron", attention_bias=True),
    # OLMo 1's weightless LayerNorm (in float32, rounded), SwiGLU
    "olmo": dict(model_type="olmo"),
    # ALiBi (the stack's alibi_slopes), no RoPE: BLOOM's (its embeddings' LayerNorm outside the stack, GELU's tanh
    # form), MPT's (LayerNorms without biases, the exact GELU), Falcon-RW's (its slopes over sqrt(head_dim))
    "bloom": dict(model_type="bloom", attention_bias=True, mlp_bias=True, num_key_value_heads=4),
    "mpt": dict(model_type="mpt", num_key_value_heads=4),
    "falcon-rw": dict(model_type="falcon", num_key_value_heads=4,
                      extra={"alibi": True, "multi_query": False, "parallel_attn": False, "bias": True}),
    # the clamp of q, k and v (the stack's clip_qkv): OLMo 1's (OLMo-7B-0424's), MPT's
    "olmo-clip": dict(model_type="olmo", extra={"clip_qkv": 0.4}),
    "mpt-clip": dict(model_type="mpt", num_key_value_heads=4, extra={"clip_qkv": 0.4}),
    # Gemma's norms (the weight applied as 1 + w in float32) and GeGLU (the stack's norm_kind "gemma", mlp
    # "gelu_tanh_glu"); Gemma 2's sandwich norms, windows on every other layer and soft-capped scores (sandwich,
    # softcap); Gemma 3's q/k norms (Gemma's) and its local layers' own RoPE (the stack's ropes, rope_of); VaultGemma's
    # two norms; GLM-4's sandwich of RMSNorms
    "gemma": dict(model_type="gemma", head_dim=16),
    "gemma2": dict(model_type="gemma2", head_dim=16, extra={"sliding_window": 5, "attn_logit_softcapping": 2.0}),
    "gemma3": dict(model_type="gemma3_text", head_dim=16, extra={
        "sliding_window": 5, "rope_local_base_freq": 100.0, "layer_types": ["sliding_attention", "full_attention"]}),
    "vaultgemma": dict(model_type="vaultgemma", head_dim=16),
    "glm4": dict(model_type="glm4"),
    # norms after the blocks, none before (the stack's post_norms): OLMo 2's (its RMSNorm's weight in float32, q/k
    # norms over whole projections: norm_kind "float32", qk_norm_full), OLMo 3's windows, EXAONE 4's (Llama's RMSNorm,
    # q/k norms per head; RoPE and a window on its sliding layers, NoPE on the others); Granite's multipliers (the
    # stack's residual_multiplier; its attention multiplier the scale), HyperCLOVA X's with sandwich norms
    "olmo2": dict(model_type="olmo2"),
    "olmo3": dict(model_type="olmo3", extra={"sliding_window": 5, "layer_types": ["sliding_attention",
                                                                                   "full_attention"]}),
    "exaone4": dict(model_type="exaone4", extra={"sliding_window": 5, "layer_types": ["sliding_attention",
                                                                                     "full_attention"]}),
    "granite": dict(model_type="granite", extra={"residual_multiplier": 0.22, "attention_multiplier": 0.3,
                                                 "embedding_multiplier": 12.0, "logits_scaling": 8.0}),
    "hyperclovax": dict(model_type="hyperclovax", extra={"residual_multiplier": 0.7, "attention_multiplier": 0.3}),
    # Cohere's LayerNorm without a bias (the stack's norm_kind "cohere"; Command R+'s per-head q/k LayerNorms) in a
    # parallel block, and RoPE in float32 (rope_float32): Cohere's, Cohere 2's (RoPE on its sliding layer only),
    # GPT-J's and CodeGen's (on half of each head; torch's LayerNorm, GELU), ERNIE 4.5's (its tables in float32);
    # Ministral 3's query temperature (the stack's query_scale; an original context of 8 positions, so that it bites)
    "cohere": dict(model_type="cohere"),
    "cohere-qk": dict(model_type="cohere", extra={"use_qk_norm": True}),
    "cohere2": dict(model_type="cohere2", extra={"sliding_window": 5, "layer_types": ["sliding_attention",
                                                                                     "full_attention"]}),
    "gptj": dict(model_type="gptj", num_key_value_heads=4, mlp_bias=True, extra={"partial_rotary_factor": 0.5}),
    "codegen": dict(model_type="codegen", num_key_value_heads=4, mlp_bias=True, extra={"partial_rotary_factor": 0.5}),
    "ernie4_5": dict(model_type="ernie4_5"),
    "ministral3": dict(model_type="ministral3", head_dim=16, rope_theta=1e6, rope_scaling={
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8, "beta_fast": 32.0, "beta_slow": 1.0,
        "mscale": 1.0, "mscale_all_dim": 1.0, "llama_4_scaling_beta": 0.3}),
    # the q/k norms after RoPE (the stack's qk_norm_after_rope): Hunyuan's (dense), NanoChat's (weightless norms,
    # RoPE by -angle, ReLU squared)
    "hunyuan": dict(model_type="hunyuan_v1_dense"),
    "nanochat": dict(model_type="nanochat", num_key_value_heads=4),
    # Apertus's xIELU (the stack's mlp "xielu" with each layer's numbers); attention sinks (the stack's sinks): Granite
    # SWA's (in the model's dtype), Flint's (float32, its norms' weights in float32, NoPE on its full layers)
    "apertus": dict(model_type="apertus"),
    "granite_swa": dict(model_type="granite_swa"),
    "flint": dict(model_type="flint"),
    # q/k norms of another kind than the layers' (the stack's qk_norm_kind): StableLM 2 12B's per-head LayerNorms
    # without biases (Cohere's, weights [heads, head_dim]) under torch's LayerNorms, Persimmon's torch LayerNorms with
    # biases (qk_norm_bias; ReLU squared, RoPE on half of each head)
    "stablelm-qk": dict(model_type="stablelm", extra={"qk_layernorm": True}),
    "persimmon": dict(model_type="persimmon", num_key_value_heads=4, extra={"qk_layernorm": True}),
}


def make_model(family="llama", dtype=torch.float32, seed=0, **sizes):
    torch.manual_seed(seed)
    m = Llama(LlamaConfig(**{**BASE, **{**FAMILIES, **STACK_FAMILIES}[family], **sizes})).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # random biases and norm weights: a skipped bias or norm must show
        for name, p in m.named_parameters():
            if name.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
            elif "norm" in name:
                p.copy_(1 + torch.randn(p.shape, generator=g) * 0.3)
    return m.to(dtype)


def run(model, fused, monkeypatch, cache_kind="full", B=3, steps=((1, None), (4, None), (5, "tree"), (1, None)),
        kv=None):
    """Prefill ragged prompts, then the given forwards (T tokens; chain or a static tree), the caches in ``kv``
    (default: the model's dtype); -> every output and the cache's buffers."""
    monkeypatch.setattr(llama_mod, "_FUSED", fused)
    torch.manual_seed(1)
    cfg, dtype = model.config, kv or model.dtype
    prompts = [torch.randint(0, cfg.vocab_size, (n,)) for n in (19, 30, 17)[:B]]
    full = FullCache(cfg, B, 80, dtype=dtype, chunk_size=4 if cache_kind == "retrieval" else None)
    outs = [model.prefill(prompts, full)]
    cache = full
    if cache_kind == "streaming":
        cache = StreamingCache(cfg, B, sink=4, window=12, max_step=8, dtype=dtype)
        outs.append(model.prefill(prompts, cache))
    elif cache_kind == "retrieval":
        cache = RetrievalCache(cfg, full, budget=16, chunk_size=4, max_step=8)
    for T, kind in steps:
        ids = torch.randint(0, cfg.vocab_size, (B, T))
        tree = TokenTree.static([-1] + [max(0, (i - 1) // 2) for i in range(1, T)], B) if kind else None
        outs.append(model(ids, cache=cache, tree_parents=tree))
    with torch.no_grad():
        outs.append(model(torch.randint(0, cfg.vocab_size, (B, 6))))  # no cache: SDPA between the calls
    return outs + list(cache.k) + list(cache.v) + list(getattr(cache, "k_raw", None) or [])


def assert_bitwise(a, b):
    assert len(a) == len(b)
    for i, (x, y) in enumerate(zip(a, b)):
        assert x.dtype == y.dtype and torch.equal(x, y), f"output {i} differs"


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bitwise_equal_to_the_modules(family, dtype, monkeypatch):
    model = make_model(family, dtype)
    assert_bitwise(run(model, False, monkeypatch), run(model, True, monkeypatch))


@given(B=st.integers(1, 3), T=st.integers(1, 6), n_kv=st.integers(1, 3), group=st.integers(1, 3),
       head_dim=st.sampled_from([2, 4, 8, 16]), family=st.sampled_from(list(FAMILIES)),
       bf16=st.booleans(), seed=st.integers(0, 2**16))
def test_property_one_forward_bitwise_equal_to_the_modules(B, T, n_kv, group, head_dim, family, bf16, seed):
    """Random shapes (batch, tokens, KV heads, GQA group, head_dim), family switches and dtypes: one cached
    forward after a prefill gives bitwise the logits and cache of the modules run one by one."""
    torch.manual_seed(seed)
    kw = {**BASE, **FAMILIES[family], "num_attention_heads": n_kv * group, "num_key_value_heads": n_kv,
          "head_dim": head_dim, "hidden_size": 8 * n_kv * group, "num_hidden_layers": 1}
    model = Llama(LlamaConfig(**kw)).eval().to(torch.bfloat16 if bf16 else torch.float32)
    prompt = torch.randint(0, 97, (B, 5))
    ids = torch.randint(0, 97, (B, T))
    outs = []
    for fused in (False, True):
        llama_mod._FUSED = fused
        try:
            cache = FullCache(model.config, B, 16, dtype=model.dtype)
            model.prefill(prompt, cache)
            outs.append([model(ids, cache=cache), cache.k[0], cache.v[0]])
        finally:
            llama_mod._FUSED = None
    assert_bitwise(*outs)


@pytest.mark.parametrize("cache_kind", ["streaming", "retrieval"])
def test_other_caches(cache_kind, monkeypatch):
    """The StreamingLLM cache keeps the un-RoPE'd keys (k_raw), the retrieval cache the chunk means and
    last queries of its full cache: both come out of the fused call unchanged."""
    model = make_model("qwen3")
    assert_bitwise(run(model, False, monkeypatch, cache_kind), run(model, True, monkeypatch, cache_kind))


def test_int8_copy(monkeypatch):
    model = int8_copy(make_model("llama-biases"))
    with torch.no_grad():
        assert model.model.layers[0].fused_arguments(torch.zeros(1, 1, 64)) is not None
    assert_bitwise(run(model, False, monkeypatch), run(model, True, monkeypatch))


@pytest.mark.parametrize("bias", [False, True])
def test_integer_dot_products(tmp_path, bias, monkeypatch):
    """A model on integer dot products (gguf_copy(..., activations="int8"): every projection an Int8DotLinear),
    with biases or without: the fused layer, which rounds the input of q/k/v (and of gate/up) to int8 blocks
    once for the three (two) projections, gives bitwise what the modules give, each rounding its own input."""
    from triforce.models import gguf_copy

    from .test_quant import q4_1_gguf, small_llama

    path, model = q4_1_gguf(tmp_path, small_llama(bias=bias))
    fast = gguf_copy(model, path, activations="int8")
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in fast.named_parameters():  # random biases (a skipped one must show)
            if name.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
        assert fast.model.layers[0].fused_arguments(torch.zeros(1, 1, fast.config.hidden_size)) is not None
    assert_bitwise(run(fast, False, monkeypatch), run(fast, True, monkeypatch))


WIDE = {  # SmolLM2-135M's layer widths, and odd ones (a width that is not a power of two: the norm's mean)
    "smollm2": dict(hidden_size=576, intermediate_size=1536, num_attention_heads=9, num_key_value_heads=3),
    "odd": dict(hidden_size=100, intermediate_size=33, num_attention_heads=5, num_key_value_heads=1),
}


@pytest.mark.parametrize("width", list(WIDE))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, "int8"])
@pytest.mark.parametrize("scale", [1e-3, 40.0])
def test_widths_and_magnitudes(width, dtype, scale, monkeypatch):
    """The fused calls' elementwise loops (csrc/cpu/decoder.cpp) round as ATen's ops at real widths and at
    small and large hidden states: a norm's mean over 576 or 100 values, 1 / sqrt, the residual adds and
    SiLU(gate) * up give the modules' bits (hidden 64, a power of two, would hide a division done as a
    multiplication by 1 / 64)."""
    kw = {**BASE, **WIDE[width], "num_hidden_layers": 1}
    torch.manual_seed(3)
    model = Llama(LlamaConfig(**kw)).eval()
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(scale)
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + torch.randn(p.shape) * 0.3)
    model = int8_copy(model) if dtype == "int8" else model.to(dtype)
    steps = ((1, None), (3, None), (4, "tree"))
    assert_bitwise(run(model, False, monkeypatch, B=2, steps=steps), run(model, True, monkeypatch, B=2, steps=steps))


class Spy:
    def __init__(self, real):
        self.real, self.calls = real, 0

    def __call__(self, *args):
        self.calls += 1
        return self.real(*args)


class LayerSpy(Spy):
    """Counts the layers a ``decoder_layers`` call runs (one per KV cache buffer it is given)."""

    def __call__(self, *args, **kwargs):  # (kwargs: norm_after, by name)
        self.calls += len(args[11])
        return self.real(*args, **kwargs)


def count_fused_calls(model, monkeypatch, ids, **kw):
    """Layers that ran on the fused path: one ``decoder_attn_in`` call each, or one native stack call
    (``decoder_layers``) for several."""
    spies = [Spy(torch.ops.triforce_C.decoder_attn_in), LayerSpy(torch.ops.triforce_C.decoder_layers)]
    monkeypatch.setattr(torch.ops.triforce_C, "decoder_attn_in", spies[0], raising=False)
    monkeypatch.setattr(torch.ops.triforce_C, "decoder_layers", spies[1], raising=False)
    cache = FullCache(model.config, ids.shape[0], max(64, ids.shape[1]), dtype=model.dtype)
    model(ids, cache=cache, **kw)
    monkeypatch.undo()
    return spies[0].calls + spies[1].calls


def test_where_the_path_is_taken(monkeypatch):
    model = make_model()
    L = model.config.num_hidden_layers
    ids = torch.randint(0, 97, (2, 3))
    assert count_fused_calls(model, monkeypatch, ids) == L
    assert count_fused_calls(model, monkeypatch, torch.randint(0, 97, (1, ROWWISE_MAX_ROWS))) == L
    # more rows than the rowwise kernels take (a prefill chunk): the modules, torch's GEMM
    assert count_fused_calls(model, monkeypatch, torch.randint(0, 97, (1, ROWWISE_MAX_ROWS + 1))) == 0
    monkeypatch.setattr(llama_mod, "_FUSED", False)  # the A/B switch (TRIFORCE_FUSED_LAYER=0)
    assert count_fused_calls(model, monkeypatch, ids) == 0
    half = make_model(dtype=torch.float16)  # no rowwise kernel for float16
    assert count_fused_calls(half, monkeypatch, ids) == 0
    with torch.no_grad():
        h = torch.zeros(1, 1, 64)
        layer = model.model.layers[0]
        assert layer.fused_arguments(h) is not None
        assert layer.fused_arguments(h.bfloat16()) is None  # weights float32, input bfloat16
        layer.mlp.up_proj = torch.nn.Linear(80, 64, bias=False)  # a module the fused path does not know
        assert layer.fused_arguments(h) is None
    with torch.enable_grad():
        assert model.model.layers[1].fused_arguments(h) is None  # autograd: the modules


def test_op_checks():
    with pytest.raises(RuntimeError, match="expected 4 projections"):
        torch.ops.triforce_C.decoder_attn_out_mlp(torch.zeros(1, 1, 8), torch.zeros(1, 1, 2, 4), torch.ones(8), 1e-5,
                                                 [torch.zeros(8, 8)], [None], [None])
    with pytest.raises(RuntimeError, match="head_dim must be even"):
        w = [torch.zeros(8, 8)] * 3
        torch.ops.triforce_C.decoder_attn_in(torch.zeros(1, 1, 8), torch.ones(8), 1e-5, w, [None] * 3, [None] * 3,
                                             None, None, 0.0, torch.zeros(1, 1, 1, 3), torch.zeros(1, 1, 1, 3), 3)


# ---- triforce_C::silu_mul and gelu_tanh_mul (csrc/include/triforce/glu.h): the MLP's act(gate) * up, the fused
# layer's and the modules' on the CPU

GLU = ("silu", "gelu_tanh", "gelu")


def glu_op(act):
    return getattr(torch.ops.triforce_C, f"{act}_mul")


def act_exact(act, x: torch.Tensor) -> torch.Tensor:
    """The activation in float64 as x / (1 + e^t) (GELU's tanh form without 1 + tanh's cancellation); the exact
    GELU as x erfc(-x / sqrt 2) / 2 (no cancellation in its negative tail)."""
    x = x.double()
    if act == "gelu":
        return x * torch.special.erfc(-x / 2 ** 0.5) / 2
    t = -x if act == "silu" else -2 * (2 / torch.pi) ** 0.5 * (x + 0.044715 * x ** 3)
    return x / (1 + torch.exp(t))


def ulps_apart(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """|a - b| in units of the spacing of ``dtype`` at |b| (normal range)."""
    bits = {torch.float32: 23, torch.float16: 10, torch.bfloat16: 7}[dtype]
    spacing = torch.exp2(torch.floor(torch.log2(b.double().abs().clamp_min(torch.finfo(dtype).tiny))) - bits)
    return (a.double() - b.double()).abs() / spacing


@given(rows=st.integers(1, 40), width=st.sampled_from([1, 15, 33, 81, 1536, 4864]), threads=st.sampled_from([1, 3]),
       dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]), act=st.sampled_from(GLU),
       seed=st.integers(0, 2**16))
def test_glu_rows_are_independent(rows, width, threads, dtype, act, seed):
    """Each row of act(gate) * up has the bits it has alone, whatever the width and the threads (ATen's SiLU
    does not: a row's last elements round by where they fall in the flattened tensor and the threads' shares,
    e.g. 5 of 186 rows 4864 wide on 3 threads); the activation is the exact value's within its ulps (glu.h),
    rounded to the dtype, and the product rounds that times up; the inputs are left as they were."""
    g = torch.Generator().manual_seed(seed)
    gate = (torch.randn(rows, width, generator=g) * 6).to(dtype)
    up = torch.randn(rows, width, generator=g).to(dtype)
    before = gate.clone(), up.clone()
    op, saved = glu_op(act), torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        out = op(gate, up)
        alone = [op(gate[r:r + 1], up[r:r + 1]) for r in range(rows)]
        a = op(gate, torch.ones_like(up))  # the activation alone, rounded to the dtype
    finally:
        torch.set_num_threads(saved)
    assert out.dtype == dtype and out.shape == gate.shape and out.is_contiguous()
    assert torch.equal(out, torch.cat(alone))
    assert torch.equal(gate, before[0]) and torch.equal(up, before[1])
    assert torch.equal(out, (a.float() * up.float()).to(dtype))  # the product of the rounded activation
    exact = act_exact(act, gate)
    # float32: SiLU 2 ulp, GELU 12 ulp or 2^-22 |x|, the exact GELU 6 ulp (csrc/tests/test_glu.cpp); 16-bit: one
    # rounding more
    slack = {"silu": 2, "gelu_tanh": 12, "gelu": 6}[act] if dtype == torch.float32 else 1
    near = ulps_apart(a, exact, dtype) <= slack
    assert (near | ((a.double() - exact).abs() <= 2.0 ** -22 * gate.double().abs())).all()
    if act == "silu":  # and within a few ulp of PyTorch's F.silu(gate) * up
        ref = torch.nn.functional.silu(gate) * up
        assert (ulps_apart(out, ref, dtype) <= (4 if dtype == torch.float32 else 2)).all()


@pytest.mark.parametrize("act", GLU)
def test_glu_special_values_and_layouts(act):
    x = torch.tensor([0.0, -0.0, 1e-30, 100.0, -100.0, 88.5, -88.5, 1e30, float("inf"), float("-inf"), float("nan")])
    op = glu_op(act)
    got = op(x, torch.ones_like(x))
    fn = {"silu": torch.nn.functional.silu, "gelu": torch.nn.functional.gelu,
          "gelu_tanh": lambda x: torch.nn.functional.gelu(x, approximate="tanh")}[act]
    # (PyTorch's exact GELU of +inf is NaN in its vectorised loop and inf in its scalar one: each element alone)
    want = torch.cat([fn(v[None]) for v in x]) if act == "gelu" else fn(x)
    assert torch.equal(got.isnan(), want.isnan())
    if act == "silu":  # SiLU's 88.5 is exactly PyTorch's too
        assert torch.equal(got[:-2], want[:-2]) and torch.equal(got[:-2].signbit(), want[:-2].signbit())
    else:
        assert torch.equal(got[[0, 2, 3, 5, 7, 8]], want[[0, 2, 3, 5, 7, 8]])
        assert (got[[1, 4, 6]] == 0).all() and got[[4, 6]].signbit().all()
    # a batch of rows in any layout: the contiguous result of the same values; empty tensors
    gate, up = torch.randn(3, 5, 7).transpose(0, 2), torch.randn(7, 5, 3)
    assert torch.equal(op(gate, up), op(gate.contiguous(), up))
    assert op(torch.empty(0, 16), torch.empty(0, 16)).shape == (0, 16)
    assert op(torch.empty(4, 0), torch.empty(4, 0)).shape == (4, 0)
    torch.library.opcheck(op, (torch.randn(4, 33), torch.randn(4, 33)))


@pytest.mark.parametrize("act", GLU)
def test_glu_gradients(act):
    """Under autograd the ops give their forward bits and ATen's derivatives: the gradients of
    act(gate) * up as PyTorch's own ops compute them (the forward values differ in the last places only)."""
    g = torch.Generator().manual_seed(0)
    gate = (torch.randn(5, 33, generator=g) * 4).requires_grad_()
    up = torch.randn(5, 33, generator=g).requires_grad_()
    out = glu_op(act)(gate, up)
    with torch.no_grad():
        assert torch.equal(out, glu_op(act)(gate, up))
    weights = torch.randn(5, 33, generator=g)
    (out * weights).sum().backward()
    mine = gate.grad.clone(), up.grad.clone()
    gate.grad = up.grad = None
    fn = {"silu": torch.nn.functional.silu, "gelu": torch.nn.functional.gelu,
          "gelu_tanh": lambda x: torch.nn.functional.gelu(x, approximate="tanh")}[act]
    ((fn(gate) * up) * weights).sum().backward()
    assert torch.allclose(mine[0], gate.grad, rtol=1e-5, atol=1e-6)
    assert torch.allclose(mine[1], up.grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("act", GLU)
def test_glu_checks(act):
    op = glu_op(act)
    with pytest.raises(RuntimeError, match=f"{act}_mul: gate and up must have one shape"):
        op(torch.zeros(2, 8), torch.zeros(2, 9))
    with pytest.raises(RuntimeError, match="one dtype"):
        op(torch.zeros(2, 8), torch.zeros(2, 8, dtype=torch.bfloat16))
    with pytest.raises(RuntimeError, match="unsupported dtype"):
        op(torch.zeros(2, 8, dtype=torch.float64), torch.zeros(2, 8, dtype=torch.float64))


def test_the_module_and_the_fused_layer_share_silu(monkeypatch):
    """The MLP module on the CPU calls triforce_C::silu_mul (the fused layer's), not F.silu: at a width that is
    not a multiple of 32 their rounding differs, and the modules' logits stay bitwise the fused layer's."""
    calls = []
    real = torch.ops.triforce_C.silu_mul
    monkeypatch.setattr(torch.ops.triforce_C, "silu_mul", lambda g, u: calls.append(g.shape) or real(g, u))
    model = make_model(intermediate_size=81)
    steps = ((1, None), (3, None), (4, "tree"))
    assert_bitwise(run(model, False, monkeypatch, B=2, steps=steps), run(model, True, monkeypatch, B=2, steps=steps))
    assert calls and all(shape[-1] == 81 for shape in calls)


@pytest.mark.parametrize("act", GLU + ("swiglu_clamped",))
def test_glu_benchmark_rows(tmp_path, monkeypatch, act):
    """bench/bench_layer_ops.py's CPU rows on a tiny shape: the op against PyTorch's, bytes and baseline."""
    import csv

    from bench import bench_layer_ops
    path = tmp_path / "rows.csv"
    monkeypatch.setenv("TRIFORCE_BENCH_CSV", str(path))
    monkeypatch.setitem(bench_layer_ops.MODELS, "tiny", (32, 2, 8, 48))
    bench_layer_ops.bench_cpu_glu("tiny", 3, torch.bfloat16, act, reps=2)
    rows = list(csv.DictReader(open(path)))
    assert [(r["op"], r["backend"], r["dtype"]) for r in rows] == [(f"{act}_mul", "torch", "bfloat16"),
                                                                   (f"{act}_mul", "cpu", "bfloat16")]
    assert rows[0]["bytes"] == rows[1]["bytes"] == str(3 * 3 * 48 * 2) and rows[1]["baseline"] == "torch"


@pytest.mark.parametrize("fused", [False, True])
def test_compiled_forward_traces_the_native_calls(fused, monkeypatch):
    """The model layer's native calls (the fused layer's and the rowwise kernels') have fake
    implementations: a cached CPU forward compiles with ``fullgraph=True`` (no graph break at them) and,
    with ``aot_eager`` (the real kernels on the traced graph), gives the eager logits and cache."""
    monkeypatch.setattr(llama_mod, "_FUSED", fused)
    model = make_model("qwen3-bias")
    ids = torch.randint(0, 97, (2, 3), generator=torch.Generator().manual_seed(0))
    caches = [FullCache(model.config, 2, 16) for _ in range(2)]
    with torch.no_grad():
        eager = model(ids, cache=caches[0])
        compiled = torch.compile(lambda x: model(x, cache=caches[1]), backend="aot_eager", fullgraph=True)(ids)
    torch._dynamo.reset()
    assert torch.equal(compiled, eager)
    assert all(torch.equal(a, b) for a, b in zip(caches[0].k + caches[0].v, caches[1].k + caches[1].v))
    assert torch.equal(caches[0].lengths, caches[1].lengths)


# ---- the native stack: triforce_C::decoder_layers runs a forward's layers and the cache's side in one call

def run_both(model, monkeypatch, *args, **kw):
    """``run`` with the native stack off (two fused calls per layer from Python) and on; -> both results and
    the layers the stack ran in the second."""
    monkeypatch.setattr(llama_mod, "_STACK", False)
    per_layer = run(model, True, monkeypatch, *args, **kw)
    monkeypatch.setattr(llama_mod, "_STACK", None)
    spy = LayerSpy(torch.ops.triforce_C.decoder_layers)
    monkeypatch.setattr(torch.ops.triforce_C, "decoder_layers", spy, raising=False)
    stacked = run(model, True, monkeypatch, *args, **kw)
    monkeypatch.setattr(torch.ops.triforce_C, "decoder_layers", spy.real, raising=False)
    return per_layer, stacked, spy.calls


@pytest.mark.parametrize("cache_kind", ["full", "streaming", "retrieval"])
@pytest.mark.parametrize("family", ["llama-biases", "qwen3-bias"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, "int8"])
def test_native_stack_equals_the_per_layer_calls(cache_kind, family, dtype, monkeypatch):
    """One native call for all layers gives bitwise the logits and every cache buffer of the per-layer
    calls (and so of the modules): the rows written to k / v (and a StreamingLLM cache's k_raw), a full
    cache's last queries (the retrieval case's full cache keeps them, prefill's query_index included), chain
    and tree steps. The stack must actually run."""
    model = make_model(family)
    model = int8_copy(model) if dtype == "int8" else model.to(dtype)
    per_layer, stacked, layers = run_both(model, monkeypatch, cache_kind)
    assert_bitwise(per_layer, stacked)
    # the full cache's prefill and the four steps (a StreamingLLM cache's prefill of up to 30 tokens is a
    # step larger than its max_step, 8: its temporary-buffer path runs the layers one by one)
    assert layers == 5 * model.config.num_hidden_layers


@pytest.mark.parametrize("cache_kind", ["full", "streaming", "retrieval"])
@pytest.mark.parametrize("family", list(STACK_FAMILIES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_native_stack_runs_layer_norms_and_ungated_mlps(cache_kind, family, dtype, monkeypatch):
    """The stack's LayerNorms (torch's, ATen's op), ungated MLPs (GELU's two forms, ReLU, ReLU squared: the
    module's own ops) and parallel blocks: one native call for all layers gives bitwise the logits and every cache
    buffer of the modules run one by one (chain and tree steps, a NoPE model's learned positions and a partial RoPE
    among them), and it runs where the per-layer fused calls do not (those take RMSNorm and SwiGLU in sequence
    only)."""
    model = make_model(family, dtype)
    modules = run(model, False, monkeypatch, cache_kind)
    per_layer, stacked, layers = run_both(model, monkeypatch, cache_kind)
    assert_bitwise(modules, stacked)
    assert_bitwise(per_layer, stacked)
    assert layers == 5 * model.config.num_hidden_layers
    ids = torch.randint(0, 97, (2, 3))
    monkeypatch.setattr(llama_mod, "_STACK", False)
    assert count_fused_calls(model, monkeypatch, ids) == 0


@pytest.mark.parametrize("cache_kind", ["full", "streaming", "retrieval"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_native_stack_runs_each_layers_rope(cache_kind, dtype, monkeypatch):
    """Layers of different RoPE tables in one native call (decoder_layers' ropes and rope_of): SmolLM3's NoPE layers
    (theirs the identity's, cos 1 and sin 0) among its RoPE layers, which until 2026-12-04 ran as two fused calls per
    layer; bitwise the modules and the per-layer calls, chain and tree steps. (Gemma 3's local layers' own RoPE:
    STACK_FAMILIES' gemma3.)"""
    model = make_model("llama", dtype, model_type="smollm3", extra={"no_rope_layers": [1, 0, 1]}, num_hidden_layers=3)
    ropes = model.rope_tables(torch.zeros(1, 1, dtype=torch.long))
    assert ropes[0] is ropes[2] and ropes[1] is not ropes[0]  # (two tables, the second a NoPE layer's)
    modules = run(model, False, monkeypatch, cache_kind)
    per_layer, stacked, layers = run_both(model, monkeypatch, cache_kind)
    assert_bitwise(modules, stacked)
    assert_bitwise(per_layer, stacked)
    assert layers == 5 * model.config.num_hidden_layers


# mixtures of experts on the plain layer: the attention's side in native calls (decoder_attn_in, the cache,
# decoder_attn_out), the mixture in Python; a dense layer among them (mlp_only_layers) takes the two calls
MOE_FAMILIES = {
    "mixtral": dict(model_type="mixtral", extra=dict(num_local_experts=4, num_experts_per_tok=2)),
    "qwen3_moe": dict(model_type="qwen3_moe", head_dim=8, extra=dict(
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24, norm_topk_prob=True, mlp_only_layers=[1])),
    "qwen2_moe": dict(model_type="qwen2_moe", extra=dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24,
                                                         shared_expert_intermediate_size=40)),
    # mixtures under the stack's other layer kinds (the stack alone runs their attention): Granite's multipliers,
    # OLMoE's q/k norms over whole projections
    "granitemoe": dict(model_type="granitemoe", extra=dict(num_local_experts=4, num_experts_per_tok=2,
                                                           residual_multiplier=0.375, attention_multiplier=0.03125,
                                                           embedding_multiplier=12.0, logits_scaling=8.0)),
    "olmoe": dict(model_type="olmoe", extra=dict(num_experts=4, num_experts_per_tok=2)),
    # mixtures in the other layouts (the call returns h2 and the mixture's input; Python adds the mixture, normed after
    # the blocks): Cohere 2 MoE's parallel block (the mixture on the layer input's norm; a dense first layer), Kolibri's
    # four norms (its router's correction bias, a shared expert), FlexOlmo's norms after the blocks
    "cohere2_moe": dict(model_type="cohere2_moe", head_dim=16, extra=dict(
        num_experts=4, num_experts_per_tok=2, first_k_dense_replace=1, sliding_window=5,
        layer_types=["sliding_attention", "full_attention"])),
    "kolibri1": dict(model_type="kolibri1", head_dim=16, extra=dict(
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24, shared_expert_intermediate_size=40,
        sliding_window=5, layer_types=["sliding_attention", "full_attention"])),
    "flex_olmo": dict(model_type="flex_olmo", extra=dict(num_experts=4, num_experts_per_tok=2)),
    # gates on the heads' output (decoder_layers' attn_gate_kind): AFMoE's sigmoid (four float32 norms, NoPE global
    # layers), Laguna's softplus per head, and per dim with layers of their own head counts
    "afmoe": dict(model_type="afmoe", head_dim=16, extra=dict(
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24, num_shared_experts=1, sliding_window=5,
        global_attn_every_n_layers=2)),
    "laguna": dict(model_type="laguna", head_dim=16, extra=dict(
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24, shared_expert_intermediate_size=24,
        sliding_window=5)),
    "laguna-dims": dict(model_type="laguna", head_dim=16, num_hidden_layers=3, extra=dict(
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24, shared_expert_intermediate_size=24,
        sliding_window=5, gating="per-element", num_attention_heads_per_layer=[4, 2, 6],
        layer_types=["full_attention", "sliding_attention", "full_attention"],
        mlp_layer_types=["dense", "sparse", "sparse"])),
}


@pytest.mark.parametrize("cache_kind", ["full", "streaming", "retrieval"])
@pytest.mark.parametrize("family", list(MOE_FAMILIES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, "int8"])
def test_mixture_layers_take_the_native_attention(cache_kind, family, dtype, monkeypatch):
    """A layer whose MLP is a mixture of experts runs its attention's side natively, the mixture in Python: in the stack
    (``decoder_layers``' ``mixture_last``: a call stops before the last layer's mixture; a model's layers as runs ending
    at each mixture, any layer kind the stack runs: Granite's multipliers, OLMoE's whole-projection q/k norms; Cohere 2
    MoE's parallel block, Kolibri's four norms, FlexOlmo's norms after the blocks) and, with the stack off, on the plain
    layer's per-layer calls (``decoder_attn_in``, the cache's attend, ``decoder_attn_out``: o_proj, the residual add and
    the norm before the mixture). Both bitwise the modules (logits, every cache buffer; chain and tree steps, every
    cache kind, float32 / bfloat16 / the int8 copy; Mixtral's, Qwen3-MoE's with a dense layer, Qwen2-MoE's with its
    shared expert), every layer in the stack."""
    torch.manual_seed(0)
    model = Llama(LlamaConfig(**{**BASE, **MOE_FAMILIES[family]})).eval()
    model = int8_copy(model) if dtype == "int8" else model.to(dtype)
    modules = run(model, False, monkeypatch, cache_kind)
    per_layer, stacked, layers = run_both(model, monkeypatch, cache_kind)
    assert_bitwise(modules, stacked)
    assert_bitwise(modules, per_layer)
    assert layers == 5 * model.config.num_hidden_layers  # (the stack: every layer, each call up to a mixture)
    sparse = sum(type(layer.mlp) is llama_mod.SparseMoE for layer in model.model.layers)
    plain = LlamaConfig(**{**BASE, **MOE_FAMILIES[family]}).model_type in ("mixtral", "qwen3_moe", "qwen2_moe")
    spy = Spy(torch.ops.triforce_C.decoder_attn_out)
    monkeypatch.setattr(torch.ops.triforce_C, "decoder_attn_out", spy, raising=False)
    monkeypatch.setattr(llama_mod, "_STACK", False)  # (the per-layer calls: the plain layer's mixtures only)
    assert sparse >= 1 and count_fused_calls(model, monkeypatch, torch.randint(0, 97, (2, 3))) == \
        (model.config.num_hidden_layers if plain else 0)
    assert spy.calls == (sparse if plain else 0)


def test_native_stack_steps_aside_for_other_norms_and_mlps(monkeypatch):
    """Layers the stack does not run stay on the modules: a mixture of norm or MLP kinds among one call's layers (the
    stack takes one of each). (Nemotron's LayerNorm1P and Apertus's xIELU stepped aside too until 2026-12-04: they run
    in the stack since, STACK_FAMILIES.)"""
    ids = torch.randint(0, 97, (2, 3))
    model = make_model("gpt2")
    assert count_fused_calls(model, monkeypatch, ids) == model.config.num_hidden_layers
    model.model.layers[1].mlp.activation = "relu"  # (one layer's MLP of another kind than GELU's: the whole call
    assert count_fused_calls(model, monkeypatch, ids) == 0  # steps aside)


@pytest.mark.parametrize("cache_kind", ["full", "streaming", "retrieval"])
@pytest.mark.parametrize("dtype,kv", [(torch.float32, torch.bfloat16), (torch.float32, torch.float16),
                                      (torch.bfloat16, torch.float32), ("int8", torch.bfloat16)])
def test_caches_in_another_dtype(cache_kind, dtype, kv, monkeypatch):
    """Caches in another dtype than the model's (``Llama.kv_dtype``): the modules one by one, the two fused calls
    per layer and the native stack give bitwise the same logits and cache buffers (each rounds q, k, v to the
    cache's dtype and the attention's output back), and the stack runs."""
    model = make_model("llama-biases")
    model = int8_copy(model) if dtype == "int8" else model.to(dtype)
    modules = run(model, False, monkeypatch, cache_kind, kv=kv)
    per_layer, stacked, layers = run_both(model, monkeypatch, cache_kind, kv=kv)
    assert_bitwise(modules, per_layer)
    assert_bitwise(per_layer, stacked)
    assert layers == 5 * model.config.num_hidden_layers
    assert all(t.dtype == kv for t in stacked[-2 * model.config.num_hidden_layers:])


@given(B=st.integers(1, 3), T=st.integers(1, 5), n_kv=st.integers(1, 3), group=st.integers(1, 2),
       head_dim=st.sampled_from([2, 4, 8, 16]), cache_kind=st.sampled_from(["full", "chunked", "streaming", "retrieval"]),
       dtype=st.sampled_from(["float32", "bfloat16", "int8"]), tree=st.booleans(), seed=st.integers(0, 2**16),
       family=st.sampled_from(["llama", "starcoder2", "arcee", "opt-350m", "openai-gpt", "bloom", "gemma2",
                               "gemma3", "olmo2", "granite", "cohere2", "ministral3"]))
def test_property_native_stack_equals_the_per_layer_calls(B, T, n_kv, group, head_dim, cache_kind, dtype, tree, seed,
                                                          family):
    """Random shapes, ragged prompts, every cache kind, chain or random tree, RMSNorm with SwiGLU or the stack's
    other kinds (StarCoder 2's LayerNorms, biases and GELU; Arcee's ReLU squared; opt-350m's and GPT-1's norms after
    the residual adds, multi-head; BLOOM's ALiBi; Gemma 2's sandwich norms, windows and soft cap; Gemma 3's two
    RoPEs; OLMo 2's norms after the blocks; Granite's multipliers; Cohere 2's norm, parallel block and float32 RoPE;
    Ministral 3's query temperature): one forward after a prefill gives bitwise the logits and every buffer (k, v,
    k_raw, last queries) of the per-layer calls (the modules, for those)."""
    torch.manual_seed(seed)
    fam = dict(STACK_FAMILIES.get(family, {}))
    if "num_key_value_heads" in fam:  # (a multi-head family: a key / value head per query head, hidden / heads wide)
        n_kv, group, head_dim = n_kv * group, 1, 8
        del fam["num_key_value_heads"]
    kw = {**BASE, "num_attention_heads": n_kv * group, "num_key_value_heads": n_kv, "head_dim": head_dim,
          "hidden_size": 8 * n_kv * group, **fam}
    if family == "olmo2":  # (its q norm over the whole projection: hidden_size = heads * head_dim)
        kw["hidden_size"] = kw["num_attention_heads"] * kw["head_dim"]
    model = Llama(LlamaConfig(**kw)).eval()
    model = int8_copy(model) if dtype == "int8" else model.to(getattr(torch, dtype))
    cfg, cdtype = model.config, (torch.float32 if dtype == "int8" else getattr(torch, dtype))
    prompts = [torch.randint(0, 97, (int(n),)) for n in torch.randint(4, 13, (B,))]
    ids = torch.randint(0, 97, (B, T))
    parents = TokenTree(torch.tensor([[-1] + [int(torch.randint(0, t, ())) for t in range(1, T)]] * B)) if tree else None
    outs = []
    for stack in (False, None):
        llama_mod._STACK = stack
        try:
            full = FullCache(cfg, B, 32, dtype=cdtype, chunk_size=2 if cache_kind in ("chunked", "retrieval") else None)
            cache = full
            if cache_kind == "streaming":
                cache = StreamingCache(cfg, B, sink=2, window=6, max_step=5, dtype=cdtype)
            logits = [model.prefill(prompts, cache)]
            if cache_kind == "retrieval":
                cache = RetrievalCache(cfg, full, budget=4, chunk_size=2, max_step=5)
            logits.append(model(ids, cache=cache, tree_parents=parents))
            buffers = list(cache.k) + list(cache.v) + list(getattr(cache, "k_raw", None) or [])
            outs.append(logits + buffers + list(full.last_query or []))
        finally:
            llama_mod._STACK = None
    assert_bitwise(*outs)


def test_native_stack_last_queries(monkeypatch):
    """A chunked full cache's last_query after a ragged prefill (each row's last prompt token, in a different
    place per row) and after a step: the stack's equal the per-layer calls', and the step replaced every
    row's query of every layer."""
    model = make_model("llama")
    runs = []
    for stack in (False, None):
        monkeypatch.setattr(llama_mod, "_STACK", stack)
        torch.manual_seed(2)
        prompts = [torch.randint(0, 97, (n,)) for n in (9, 14, 5)]
        cache = FullCache(model.config, 3, 32, chunk_size=4)
        logits = [model.prefill(prompts, cache)]
        after_prefill = [q.clone() for q in cache.last_query]
        logits.append(model(torch.randint(0, 97, (3, 2)), cache=cache))
        runs.append((logits, after_prefill, [q.clone() for q in cache.last_query], list(cache.chunk_keys)))
    for a, b in zip(*runs):
        assert_bitwise(a, b)
    _, after_prefill, after_step, _ = runs[1]
    for before, after in zip(after_prefill, after_step):
        assert all(not torch.equal(before[r], after[r]) for r in range(3))


class ExtraTokens:
    """A forward_hidden tap entering layer 1: two extra tokens join the tree there (children of token 0 and
    of the first extra one), as Hidden Transfer's pseudo tokens do."""
    layer = 1

    def __init__(self):
        self.seen = []

    def __call__(self, h, parents):
        self.seen.append(h.clone())
        B, T, _ = h.shape
        if parents is None:
            parents = torch.arange(-1, T - 1).expand(B, T)
        extra = torch.cat([h[:, :1] * 0.5, h[:, -1:] * 0.25], 1)
        return extra, torch.cat([parents, torch.tensor([[0, T]]).expand(B, 2)], 1)


def test_native_stack_with_a_tap(monkeypatch):
    """forward_hidden with a tap: the stack runs the layers before the tap and the layers after it (with the
    wider step) in two calls; the tap sees the same stream, and the states and caches are bitwise the
    per-layer calls' and the modules'."""
    torch.manual_seed(0)
    model = Llama(LlamaConfig(**{**BASE, "num_hidden_layers": 3})).eval()
    results = []
    for fused, stack in ((False, None), (True, False), (True, None)):
        monkeypatch.setattr(llama_mod, "_FUSED", fused)
        monkeypatch.setattr(llama_mod, "_STACK", stack)
        torch.manual_seed(1)
        cache = FullCache(model.config, 2, 40)
        model.prefill(torch.randint(0, 97, (2, 11)), cache)
        tap = ExtraTokens()
        spy = LayerSpy(torch.ops.triforce_C.decoder_layers)
        monkeypatch.setattr(torch.ops.triforce_C, "decoder_layers", spy, raising=False)
        z = model.forward_hidden(torch.randint(0, 97, (2, 3)), cache, tap=tap)
        monkeypatch.setattr(torch.ops.triforce_C, "decoder_layers", spy.real, raising=False)
        results.append(([z] + tap.seen + list(cache.k) + list(cache.v), spy.calls))
    (modules, n0), (per_layer, n1), (stacked, n2) = results
    assert (n0, n1, n2) == (0, 0, 3)
    assert z.shape == (2, 5, 64)
    assert_bitwise(modules, per_layer)
    assert_bitwise(per_layer, stacked)


def test_native_stack_not_taken(monkeypatch):
    """The stack steps aside where the per-layer path must run: a layer with a forward hook (which then
    runs), a cache whose attend a subclass changed, a StreamingLLM cache's large step, another backend
    chosen for verify_attention (TRIFORCE_BACKEND), and the switch TRIFORCE_DECODER_LAYERS=0."""
    model = make_model()
    L = model.config.num_hidden_layers
    ids = torch.randint(0, 97, (2, 3))

    def stack_layers(cache=None):
        spy = LayerSpy(torch.ops.triforce_C.decoder_layers)
        monkeypatch.setattr(torch.ops.triforce_C, "decoder_layers", spy, raising=False)
        try:
            model(ids, cache=cache or FullCache(model.config, 2, 64))
        finally:
            monkeypatch.setattr(torch.ops.triforce_C, "decoder_layers", spy.real, raising=False)
        return spy.calls

    assert stack_layers() == L
    calls = []
    handle = model.model.layers[1].register_forward_hook(lambda *a: calls.append(1))
    assert stack_layers() == 0 and calls == [1]
    handle.remove()

    class Counting(FullCache):
        def attend(self, layer, q, k, v, step, k_raw=None):
            calls.append(layer)
            return super().attend(layer, q, k, v, step, k_raw)

    calls.clear()
    assert stack_layers(Counting(model.config, 2, 64)) == 0 and calls == list(range(L))
    streaming = StreamingCache(model.config, 2, sink=4, window=8, max_step=2)
    assert stack_layers(streaming) == 0  # 3 tokens > max_step: the temporary-buffer path
    monkeypatch.setenv("TRIFORCE_BACKEND", "reference")
    assert stack_layers() == 0
    monkeypatch.delenv("TRIFORCE_BACKEND")
    monkeypatch.setattr(llama_mod, "_STACK", False)
    assert stack_layers() == 0 and count_fused_calls(model, monkeypatch, ids) == L


def test_native_stack_checks_before_writing(monkeypatch):
    """A slot outside the cache or a query index outside the step raises before any buffer is written."""
    model = make_model()
    layers = model.model.layers
    cache = FullCache(model.config, 2, 16, chunk_size=4)
    h = torch.randn(2, 3, 64)
    with torch.no_grad():
        for bad_slot, bad_index in ((16, None), (-1, None), (None, 3), (None, -4)):
            step = cache.begin(3, query_index=torch.tensor([0, 1]), query_valid=torch.tensor([True, False]))
            if bad_slot is not None:
                step.slots[1, 2] = bad_slot
            if bad_index is not None:
                step.query_index[0] = bad_index
            cos, sin = llama_mod.rope_cos_sin(model.inv_freq, step.positions, torch.float32)
            before = [t.clone() for t in cache.k + cache.v + cache.last_query]
            with pytest.raises(RuntimeError, match="outside"):
                llama_mod._native_layers(layers, 0, len(layers), h, cos, sin, cache, step)
            assert_bitwise(before, cache.k + cache.v + cache.last_query)
        step = cache.begin(3)
        cos, sin = llama_mod.rope_cos_sin(model.inv_freq, step.positions, torch.float32)
        with pytest.raises(RuntimeError, match="expected 14 projections"):
            torch.ops.triforce_C.decoder_layers(h, cos, sin, 16, [], [], [], [], [], [], [], cache.k, cache.v, [], [],
                                                step.slots, step.seqlens, None, None, None)


def test_native_stack_checks_its_kinds(monkeypatch):
    """An MLP the stack does not know, norm biases other than two per layer or an attention scale that is no finite
    positive number raise naming them before any buffer is written."""
    model = make_model("gpt2")
    real, calls = torch.ops.triforce_C.decoder_layers, []
    monkeypatch.setattr(torch.ops.triforce_C, "decoder_layers", lambda *a: calls.append(a) or real(*a), raising=False)
    cache = FullCache(model.config, 2, 16)
    with torch.no_grad():
        model(torch.randint(0, 97, (2, 3)), cache=cache)
    *args, norm_bias, mlp, scale, parallel = calls[0]
    assert mlp == "gelu_tanh" and len(norm_bias) == 2 * model.config.num_hidden_layers and scale == 16 ** -0.5
    assert parallel is False
    cache.rollback(torch.zeros(2, dtype=torch.int32))
    before = [t.clone() for t in cache.k + cache.v]
    for bad, match in (((norm_bias, "swish", scale), "mlp must be 'silu'"),
                       ((norm_bias[:-1], mlp, scale), "expected 2 norm biases"),
                       ((norm_bias, mlp, 0.0), "attention_scale must be finite and > 0"),
                       ((norm_bias, mlp, float("nan")), "attention_scale must be finite")):
        with pytest.raises(RuntimeError, match=match):
            real(*args, *bad, parallel)
    assert_bitwise(before, cache.k + cache.v)


def test_native_stack_takes_norms_after_the_adds_by_name(monkeypatch):
    """opt-350m's and GPT-1's layers reach the stack with ``norm_after`` set (by name: the other families' calls keep
    their arguments), and the stack refuses it together with ``parallel`` (two layouts) or ``mixture_last`` before any
    buffer is written."""
    model = make_model("openai-gpt")
    real, calls = torch.ops.triforce_C.decoder_layers, []
    monkeypatch.setattr(torch.ops.triforce_C, "decoder_layers", lambda *a, **k: calls.append((a, k)) or real(*a, **k),
                        raising=False)
    cache = FullCache(model.config, 2, 16)
    with torch.no_grad():
        model(torch.randint(0, 97, (2, 3)), cache=cache)
    (args, kwargs), = calls
    assert kwargs == {"norm_after": True} and args[-1] is False  # (parallel)
    cache.rollback(torch.zeros(2, dtype=torch.int32))
    before = [t.clone() for t in cache.k + cache.v]
    with pytest.raises(RuntimeError, match="two layouts"):
        real(*args[:-1], True, norm_after=True)
    with pytest.raises(RuntimeError, match="mixture_last takes a layer whose norms come before"):
        real(*args, norm_after=True, mixture_last=True)  # (no mixture runs after a norm after its add)
    assert_bitwise(before, cache.k + cache.v)


def stack_call(model, monkeypatch):
    """``(args, kwargs, cache)`` of the one ``decoder_layers`` call a cached forward of ``model`` makes (batch 2, three
    tokens, a full cache of 16 slots)."""
    real, calls = torch.ops.triforce_C.decoder_layers, []
    monkeypatch.setattr(torch.ops.triforce_C, "decoder_layers", lambda *a, **k: calls.append((a, k)) or real(*a, **k),
                        raising=False)
    cache = FullCache(model.config, 2, 16)
    with torch.no_grad():
        model(torch.randint(0, 97, (2, 3)), cache=cache)
    monkeypatch.setattr(torch.ops.triforce_C, "decoder_layers", real, raising=False)
    (args, kwargs), = calls
    return args, kwargs, cache


def test_native_stack_takes_gemmas_layers_by_name(monkeypatch):
    """Gemma 3's layers reach the stack with ``sandwich``, ``norm_kind="gemma"``, ``mlp="gelu_tanh_glu"``, its two RoPEs
    (``ropes``, ``rope_of``) and Gemma 2's ``softcap`` by name, four norms a layer; the stack refuses, before any
    buffer is written: a norm count other than four a layer, sandwich with parallel or norm_after or with LayerNorms,
    ropes without rope_of or not in pairs, a rope_of outside the tables, a negative or infinite soft cap."""
    model = make_model("gemma3")
    real = torch.ops.triforce_C.decoder_layers
    args, kwargs, cache = stack_call(model, monkeypatch)
    L = model.config.num_hidden_layers
    assert set(kwargs) == {"sandwich", "norm_kind", "ropes", "rope_of"} and kwargs["rope_of"] == [0, 1]
    assert kwargs["norm_kind"] == "gemma"
    assert len(args[4]) == len(args[5]) == 4 * L and args[24] == "gelu_tanh_glu"
    cache.rollback(torch.zeros(2, dtype=torch.int32))
    before = [t.clone() for t in cache.k + cache.v]
    norms, eps, ropes = args[4], args[5], kwargs["ropes"]
    no_bias = [None] * (2 * L)  # (a norm_bias list: LayerNorms)
    for match, positional, named in (
            ("expected 4 norms, 4 eps", {4: norms[:-1], 5: eps[:-1]}, {}),
            ("expected 2 norms, 2 eps", {}, dict(sandwich=False)),
            ("layouts of their own", {26: True}, {}),  # (parallel)
            ("layouts of their own", {}, dict(norm_after=True)),
            ("layouts of their own", {}, dict(post_norms=True)),
            ("take no norm_bias", {23: no_bias}, {}),
            ("take no norm_bias", {23: no_bias}, dict(sandwich=False)),  # (Gemma's norms)
            ("norm_kind must be 'llama', 'gemma', 'float32' or 'cohere'", {}, dict(norm_kind="layer")),
            ("residual_multiplier must be finite", {}, dict(residual_multiplier=float("nan"))),
            ("qk_norm_after_rope .* goes with neither", {}, dict(qk_norm_after_rope=True, rope_float32=True)),
            ("mlp 'xielu' takes xielu", {}, dict(xielu=[torch.ones(1)] * 8)),  # (GeGLU's layers)
            ("mlp 'xielu' takes xielu", {24: "xielu"}, {}),
            ("expected one sinks tensor a layer", {}, dict(sinks=[torch.zeros(4)])),
            ("qk_norm_kind must be", {}, dict(qk_norm_kind="rms")),
            ("qk_norm_bias goes with qk_norm_kind 'layer'", {}, dict(qk_norm_bias=[None] * 4)),
            ("expected 2 q/k norm biases", {}, dict(qk_norm_kind="layer", qk_norm_bias=[None] * 3)),
            ("query_scale must be \\[B, T\\] in h's dtype", {}, dict(query_scale=torch.ones(2, 3, 1))),
            ("go together", {}, dict(rope_of=None)), ("go together", {}, dict(ropes=ropes[:1])),
            ("rope_of 2 is not one of the 2", {}, dict(rope_of=[0, 2])),
            ("rope_of -1 is not one of", {}, dict(rope_of=[-1, 0])),
            ("expected one rope_of a layer", {}, dict(rope_of=[0])),
            ("softcap must be finite and >= 0", {}, dict(softcap=-1.0)),
            ("softcap must be finite", {}, dict(softcap=float("inf")))):
        a = [positional.get(i, v) for i, v in enumerate(args)]
        with pytest.raises(RuntimeError, match=match):
            real(*a, **{**kwargs, **named})
    assert_bitwise(before, cache.k + cache.v)
    args, kwargs, _ = stack_call(make_model("gemma2"), monkeypatch)  # Gemma 2's cap reaches it by name
    assert kwargs == {"sandwich": True, "norm_kind": "gemma", "softcap": 2.0} and args[24] == "gelu_tanh_glu"


def test_native_stack_takes_norms_after_the_blocks_and_multipliers_by_name(monkeypatch):
    """OLMo 2's layers reach the stack with ``post_norms``, ``norm_kind="float32"`` and ``qk_norm_full``, two norms a
    layer (after the attention, after the MLP); Granite's with its ``residual_multiplier`` (and its attention
    multiplier as the scale); the stack refuses a multiplier with post_norms, parallel or norm_after (the modules'
    layers of those layouts have none) before any buffer is written."""
    real = torch.ops.triforce_C.decoder_layers
    args, kwargs, _ = stack_call(make_model("olmo2"), monkeypatch)
    layer = make_model("olmo2").model.layers[0]
    assert kwargs == {"norm_kind": "float32", "post_norms": True, "qk_norm_full": True}
    assert len(args[4]) == 2 * 2 and args[4][0].shape == (64,) and args[9][0].shape == (64,)  # (whole q norms)
    assert type(layer.post_attention_layernorm) is llama_mod.Float32RMSNorm
    args, kwargs, cache = stack_call(make_model("granite"), monkeypatch)
    assert kwargs == {"residual_multiplier": 0.22} and args[25] == 0.3  # (attention_scale)
    cache.rollback(torch.zeros(2, dtype=torch.int32))
    before = [t.clone() for t in cache.k + cache.v]
    for named in (dict(post_norms=True), dict(norm_after=True), dict(parallel=True)):
        with pytest.raises(RuntimeError, match="residual_multiplier must be finite, and 1 with parallel"):
            real(*args, **{**kwargs, **named}) if "parallel" not in named else real(*args[:26], True, **kwargs)
    assert_bitwise(before, cache.k + cache.v)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, "int8"])
def test_forward_team_never_changes_results(dtype, monkeypatch):
    """With more than one thread, decoder_layers runs a forward's kernels (the linears, the attention and
    its fold) on a team of threads formed once per forward (csrc/include/triforce/team.h). The logits and
    every cache buffer are bitwise those without a team (``TRIFORCE_FORWARD_TEAM=0``: the kernels' own
    OpenMP regions), those of a team whose master runs every index (``serial``), those of one whose worker
    runs every index (``workers``) and those of the default team, where both take indices as they come;
    for chain and tree steps over ragged rows. Layers big enough that every kernel passes the team's
    threshold (the linears 0.1-0.4 MB, the attention over 700 keys)."""
    torch.manual_seed(0)
    cfg = LlamaConfig(**{**BASE, "hidden_size": 256, "intermediate_size": 384, "num_attention_heads": 8,
                         "num_key_value_heads": 2, "max_position_embeddings": 1024})
    model = Llama(cfg).eval()
    model = int8_copy(model) if dtype == "int8" else model.to(dtype)
    cdtype = torch.float32 if dtype == "int8" else dtype
    prompts = [torch.randint(0, 97, (n,)) for n in (700, 650)]
    steps = [(torch.randint(0, 97, (2, T)), tree) for T, tree in ((1, None), (5, None), (5, [-1, 0, 0, 1, 2]))]
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        outs = {}
        for mode in ("0", "serial", "workers", None):
            if mode is None:
                monkeypatch.delenv("TRIFORCE_FORWARD_TEAM", raising=False)
            else:
                monkeypatch.setenv("TRIFORCE_FORWARD_TEAM", mode)
            before = torch.ops.triforce_C.forward_team_stats()
            cache = FullCache(cfg, 2, 800, dtype=cdtype, chunk_size=8)
            logits = [model.prefill(prompts, cache)]
            for ids, tree in steps:
                parents = TokenTree(torch.tensor([tree] * 2)) if tree else None
                logits.append(model(ids, cache=cache, tree_parents=parents))
            after = torch.ops.triforce_C.forward_team_stats()
            outs[mode] = logits + list(cache.k) + list(cache.v) + list(cache.last_query)
            if mode == "0":
                assert after == before  # no team
            elif mode in ("serial", "workers"):
                assert after[0] == before[0] + len(steps)  # every step formed one
                # the worker ran every index of the kernels' loops, or none
                assert (after[2] > before[2]) == (mode == "workers")
        for mode in ("serial", "workers", None):
            assert_bitwise(outs["0"], outs[mode])
    finally:
        torch.set_num_threads(threads)


def test_forward_team_not_formed_for_a_small_forward(monkeypatch):
    """A forward that streams under 2 MiB (weights and the keys and values it reads) runs without a team:
    forming one costs about what such a forward takes. The tiny test models are all below it."""
    monkeypatch.delenv("TRIFORCE_FORWARD_TEAM", raising=False)
    model = make_model()
    cache = FullCache(model.config, 2, 64)
    model.prefill([torch.randint(0, 97, (20,)), torch.randint(0, 97, (9,))], cache)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        spy = LayerSpy(torch.ops.triforce_C.decoder_layers)
        monkeypatch.setattr(torch.ops.triforce_C, "decoder_layers", spy, raising=False)
        before = torch.ops.triforce_C.forward_team_stats()
        with torch.no_grad():
            for T in (1, 5):
                model(torch.randint(0, 97, (2, T)), cache=cache)
        assert spy.calls == 2 * model.config.num_hidden_layers  # both steps took the native stack
        assert torch.ops.triforce_C.forward_team_stats() == before
    finally:
        torch.set_num_threads(threads)


# ---- a ragged step (Llama.forward(..., widths=...)): each row's own tokens, packed through the native stack

def on_path(path: str, spy, call):
    """``call()`` with ``decoder_layers`` replaced by ``spy`` and the forward on ``path``: ``"stack"`` (the native
    stack, as it runs), ``"layers"`` (without it: the layers one by one) or ``"padded"`` (rows not packed: another
    device's path)."""
    saved = llama_mod._STACK, llama_mod._packs_rows, torch.ops.triforce_C.decoder_layers
    try:
        torch.ops.triforce_C.decoder_layers = spy
        if path == "layers":
            llama_mod._STACK = False
        if path == "padded":
            llama_mod._packs_rows = lambda device: False
        return call()
    finally:
        llama_mod._STACK, llama_mod._packs_rows, torch.ops.triforce_C.decoder_layers = saved


class RowsSpy(Spy):
    """Records the ``rows`` each ``decoder_layers`` call gets (None: an unpacked step)."""

    def __init__(self, real):
        super().__init__(real)
        self.rows = []

    def __call__(self, *args):
        self.rows.append(None if len(args) < 21 or args[20] is None else args[20].clone())
        return self.real(*args)


@given(B=st.integers(1, 3), T=st.integers(2, 5), data=st.data(), cache_kind=st.sampled_from(
    ["full", "chunked", "streaming", "retrieval"]), dtype=st.sampled_from(["float32", "bfloat16", "int8"]),
    kv=st.sampled_from([None, torch.bfloat16]), path=st.sampled_from(["stack", "layers", "padded"]),
    seed=st.integers(0, 2**16))
def test_a_ragged_step_computes_each_rows_own_tokens(B, T, data, cache_kind, dtype, kv, path, seed):
    """A ragged step (``widths``) against the same step unpadded: bitwise the logits of every row's real tokens,
    0 at the padding, the cache grown by the widths, and a next step after it (over the cache it left) bitwise
    the next step after the unpadded one rolled back to the widths. Where it runs: the native stack packs the
    real tokens (``path="stack"``: its ``rows`` are exactly they); without the stack (``"layers"``) and where
    rows are not packed (``"padded"``: another device's path) the padding is computed and its logits zeroed.
    The MLP is 81 wide: with ATen's SiLU a row's last elements rounded by the number of rows (a tail loop);
    the model layer's own SiLU computes every element alike (docs/model.md, "SiLU and GELU, one arithmetic ...")."""
    torch.manual_seed(seed)
    model = make_model("llama-biases", seed=seed, intermediate_size=81)
    model = int8_copy(model) if dtype == "int8" else model.to(getattr(torch, dtype))
    cfg, cdtype = model.config, kv or (torch.float32 if dtype == "int8" else getattr(torch, dtype))
    widths = torch.tensor(data.draw(st.lists(st.integers(1, T), min_size=B, max_size=B), label="widths"))
    prompts = [torch.randint(0, 97, (int(n),)) for n in torch.randint(4, 13, (B,))]
    ids, after = torch.randint(0, 97, (B, T)), torch.randint(0, 97, (B, 2))

    def caches():
        full = FullCache(cfg, B, 40, dtype=cdtype, chunk_size=2 if cache_kind in ("chunked", "retrieval") else None)
        cache = StreamingCache(cfg, B, sink=2, window=6, max_step=5, dtype=cdtype) if cache_kind == "streaming" \
            else full
        model.prefill(prompts, cache)
        if cache_kind == "retrieval":
            cache = RetrievalCache(cfg, full, budget=4, chunk_size=2, max_step=5)
        return cache

    cache = caches()
    base = cache.lengths.clone()
    whole = model(ids, cache=cache)
    cache.rollback(base + widths)
    next_whole = model(after, cache=cache)

    spy = RowsSpy(torch.ops.triforce_C.decoder_layers)
    cache = caches()

    def steps():
        out = model(ids, cache=cache, widths=widths)
        assert torch.equal(cache.lengths, base + widths)
        return out, list(spy.rows), model(after, cache=cache)

    ragged, rows_seen, next_ragged = on_path(path, spy, steps)
    real = torch.arange(T) < widths[:, None]
    assert torch.equal(ragged[real], whole[real]) and not ragged[~real].any()
    assert torch.equal(next_ragged, next_whole)
    if path == "stack":  # one stack call, with exactly the real tokens when there is padding
        assert len(rows_seen) == 1
        if real.all():
            assert rows_seen[0] is None
        else:
            assert torch.equal(rows_seen[0], real.flatten().nonzero()[:, 0])
    else:
        assert all(r is None for r in rows_seen)


@given(B=st.integers(1, 3), T=st.integers(2, 5), data=st.data(), cache_kind=st.sampled_from(
    ["full", "chunked", "streaming", "retrieval"]), dtype=st.sampled_from(["float32", "bfloat16", "int8"]),
    path=st.sampled_from(["stack", "layers", "padded"]), seed=st.integers(0, 2**16))
def test_a_ragged_tree_step_computes_each_rows_own_nodes(B, T, data, cache_kind, dtype, path, seed):
    """A ragged step of a token tree (``widths`` with ``tree_parents``: prompt lookup's trees, whose rows have
    different node counts) against the same tree step unpadded, on every cache kind: bitwise the logits of every
    row's real nodes, 0 at the padding, the cache grown by the widths; the native stack packs exactly the real
    nodes."""
    torch.manual_seed(seed)
    model = make_model("llama-biases", seed=seed, intermediate_size=81)
    model = int8_copy(model) if dtype == "int8" else model.to(getattr(torch, dtype))
    cfg, cdtype = model.config, torch.float32 if dtype == "int8" else getattr(torch, dtype)
    widths = torch.tensor(data.draw(st.lists(st.integers(1, T), min_size=B, max_size=B), label="widths"))
    # each row its own tree in topological order; its padding hangs anywhere below its real nodes
    parents = torch.tensor([[-1] + [data.draw(st.integers(0, t - 1), label="parent") for t in range(1, T)]
                            for _ in range(B)])
    prompts = [torch.randint(0, 97, (int(n),)) for n in torch.randint(4, 13, (B,))]
    ids = torch.randint(0, 97, (B, T))

    def cache():
        full = FullCache(cfg, B, 40, dtype=cdtype, chunk_size=2 if cache_kind in ("chunked", "retrieval") else None)
        c = StreamingCache(cfg, B, sink=2, window=6, max_step=5, dtype=cdtype) if cache_kind == "streaming" \
            else full
        model.prefill(prompts, c)
        return RetrievalCache(cfg, full, budget=4, chunk_size=2, max_step=5) if cache_kind == "retrieval" else c

    c = cache()
    base = c.lengths.clone()
    whole = model(ids, cache=c, tree_parents=TokenTree(parents))
    spy = RowsSpy(torch.ops.triforce_C.decoder_layers)
    c = cache()
    ragged = on_path(path, spy, lambda: model(ids, cache=c, tree_parents=TokenTree(parents), widths=widths))
    assert torch.equal(c.lengths, base + widths)
    real = torch.arange(T) < widths[:, None]
    assert torch.equal(ragged[real], whole[real]) and not ragged[~real].any()
    if path == "stack" and not real.all():
        assert len(spy.rows) == 1 and torch.equal(spy.rows[0], real.flatten().nonzero()[:, 0])


def test_ragged_step_checks(monkeypatch):
    model = make_model("llama")
    cache = FullCache(model.config, 2, 32)
    model.prefill([torch.arange(5), torch.arange(7)], cache)
    ids = torch.randint(0, 97, (2, 3))
    for widths, match in ((torch.tensor([3, 0]), r"widths must be in \[1, T=3\]"),
                          (torch.tensor([4, 1]), r"widths must be in \[1, T=3\]"),
                          (torch.tensor([3]), "one width per row"), (torch.tensor([3.0, 1.0]), "int32/int64"),
                          ([3, 1], "int32/int64")):
        with pytest.raises(ValueError, match=match):
            model(ids, cache=cache, widths=widths)
    with pytest.raises(ValueError, match="with cache="):
        model(ids, widths=torch.tensor([3, 1]))
    assert cache.lengths.tolist() == [5, 7]  # nothing ran
    step = cache.begin(3)  # the op's own checks: rows increasing, inside [0, B * T), each row's first tokens
    layers = model.model.layers
    with torch.no_grad():
        h = model.model.embed_tokens(ids)
        cos, sin = llama_mod.rope_cos_sin(model.inv_freq, step.positions, model.dtype, model.rope_scale)
        for rows in (torch.tensor([0, 2, 1]), torch.tensor([0, 6]), torch.tensor([0, 0]), torch.tensor([0, 2]),
                     torch.tensor([1, 3]), torch.tensor([], dtype=torch.long), torch.tensor([0, 1], dtype=torch.int32)):
            with pytest.raises(RuntimeError, match="decoder_layers: rows must"):
                llama_mod._native_layers(layers, 0, len(layers), h, cos, sin, cache, step, rows)
        good = llama_mod._native_layers(layers, 0, len(layers), h, cos, sin, cache, step, torch.tensor([0, 1, 3]))
    assert good.shape == (1, 3, model.config.hidden_size)


# ---- triforce_C::rms_norm: RMSNorm's forward on the CPU (the fused layer's norm), against the ATen ops it replaces

def aten_rms_norm(x, w, eps):
    """triforce.models.llama.RMSNorm's ATen composite: float32 statistics, the weight applied in x's dtype."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return w * xf.to(x.dtype)


@pytest.mark.skipif(not hasattr(torch.ops.triforce_C, "rms_norm"), reason="the extension's rms_norm is not built")
@given(lead=st.lists(st.integers(0, 3), max_size=3), H=st.sampled_from([1, 2, 7, 64, 576, 1000, 2049]),
       dtype=st.sampled_from([torch.float32, torch.bfloat16]), eps=st.sampled_from([1e-6, 1e-5, 0.0]),
       scale=st.sampled_from([1e-20, 1.0, 1e19, 1e30]), special=st.booleans(), seed=st.integers(0, 2 ** 16),
       strided=st.booleans())
def test_rms_norm_op_is_the_aten_composite(lead, H, dtype, eps, scale, special, seed, strided):
    """``triforce_C::rms_norm`` (what :class:`RMSNorm` runs on the CPU) gives bitwise the ATen composite it replaced,
    any shape, float32 and bfloat16, rows that overflow or underflow their sum of squares, infinities and NaNs, a
    strided input; the module takes it (and its ATen path stays the composite)."""
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(*lead, H * (2 if strided else 1), generator=g) * scale).to(dtype)
    x = x[..., ::2] if strided else x
    if special and x.numel():
        flat = x.reshape(-1) if x.is_contiguous() else None
        if flat is not None:
            flat[torch.randint(0, flat.numel(), (3,), generator=g)] = torch.tensor([float("inf"), float("nan"),
                                                                                   -float("inf")]).to(dtype)
    w = (torch.randn(H, generator=g) + 1).to(dtype)
    got, want = torch.ops.triforce_C.rms_norm(x, w, eps), aten_rms_norm(x, w, eps)
    assert got.shape == want.shape and got.dtype == want.dtype
    assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.nan_to_num(0.0), want.nan_to_num(0.0))
    norm = llama_mod.RMSNorm(H, eps).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(w)
        assert torch.equal(norm(x).nan_to_num(0.0), want.nan_to_num(0.0))


def test_rms_norm_op_checks_and_the_modules_fallbacks():
    with pytest.raises(RuntimeError, match="w must be"):
        torch.ops.triforce_C.rms_norm(torch.zeros(2, 4), torch.ones(3), 1e-6)
    norm = llama_mod.RMSNorm(4, 1e-6)
    x = torch.randn(2, 4, requires_grad=True)
    norm(x).sum().backward()  # (autograd: the ATen composite, which has gradients)
    assert x.grad is not None and norm.weight.grad is not None
    half = torch.randn(2, 4).half()  # (float16: the ATen composite)
    assert torch.equal(norm.half()(half), aten_rms_norm(half, norm.weight, 1e-6))


# the stack's arithmetic on special values: each family's native pieces (Gemma's and float32 RMSNorms, Cohere's
# LayerNorm, the soft cap, the multipliers, xIELU, the sinks' sigmoid, the q/k norms' kinds, ALiBi) against the
# modules' ATen ops where rows hold infinities, NaNs, or values whose squares overflow or underflow
SPECIAL_FAMILIES = ("llama", "starcoder2", "bloom", "gemma2", "gemma3", "olmo2", "granite", "cohere-qk", "cohere2",
                    "ministral3", "hunyuan", "apertus", "granite_swa", "flint", "stablelm-qk", "persimmon")
SPECIAL_TOKENS = (90, 91, 92, 93, 94)


def poison_embeddings(model):
    """Tokens 90-94 embed as a row with +inf, -inf or NaN in one lane, a row of values whose squares overflow float32
    (and bfloat16), one whose squares underflow; the model's head untied first (else every logit row holds them)."""
    emb = model.model.embed_tokens.weight
    if model.lm_head.weight is emb:
        model.lm_head.weight = torch.nn.Parameter(emb.detach().clone())
    with torch.no_grad():
        emb[90, 3], emb[91, 5], emb[92, 1] = float("inf"), float("-inf"), float("nan")
        emb[93] = emb[93].float().sign() * 1e25
        emb[94] = emb[94].float() * 1e-30
    return model


@given(family=st.sampled_from(SPECIAL_FAMILIES), dtype=st.sampled_from([torch.float32, torch.bfloat16]),
       cache_kind=st.sampled_from(["full", "streaming", "retrieval"]), T=st.integers(1, 5), data=st.data(),
       seed=st.integers(0, 2 ** 16))
def test_property_native_stack_special_values(family, dtype, cache_kind, T, data, seed):
    """Prompts and steps whose tokens embed as rows holding infinities, NaNs, squares that overflow or underflow:
    the stack gives what the modules give, value by value (the same NaNs, the same infinities, every other value
    bitwise), in the logits and every cache buffer; a row without special tokens stays finite."""
    model = poison_embeddings(make_model(family, dtype, seed=seed % 7))
    cfg, B = model.config, 3
    g = torch.Generator().manual_seed(seed)
    clean = data.draw(st.integers(0, B - 1), label="clean row")
    specials = st.lists(st.sampled_from(SPECIAL_TOKENS), min_size=1, max_size=3)

    def tokens(n, row):
        ids = torch.randint(0, 90, (n,), generator=g)
        if row != clean:
            for tok in data.draw(specials, label="special tokens"):
                ids[data.draw(st.integers(0, n - 1), label="where")] = tok
        return ids

    prompts = [tokens(int(torch.randint(8, 15, (), generator=g)), b) for b in range(B)]
    ids = torch.stack([tokens(T, b) for b in range(B)])
    outs, spy = [], LayerSpy(torch.ops.triforce_C.decoder_layers)
    for fused, stack in ((False, False), (None, None)):
        llama_mod._FUSED, llama_mod._STACK = fused, stack
        torch.ops.triforce_C.decoder_layers = spy
        try:
            full = FullCache(cfg, B, 40, dtype=dtype, chunk_size=4 if cache_kind == "retrieval" else None)
            cache = full
            if cache_kind == "streaming":
                cache = StreamingCache(cfg, B, sink=2, window=8, max_step=5, dtype=dtype)
            with torch.no_grad():
                logits = [model.prefill(prompts, cache)]
                if cache_kind == "retrieval":
                    cache = RetrievalCache(cfg, full, budget=8, chunk_size=4, max_step=5)
                logits.append(model(ids, cache=cache))
            outs.append(logits + list(cache.k) + list(cache.v) + list(getattr(cache, "k_raw", None) or []))
        finally:
            llama_mod._FUSED = llama_mod._STACK = None
            torch.ops.triforce_C.decoder_layers = spy.real
    assert spy.calls == cfg.num_hidden_layers * (1 if cache_kind == "streaming" else 2)  # (the step; the prefill too)
    for i, (a, b) in enumerate(zip(*outs)):
        assert torch.equal(a.isnan(), b.isnan()), f"output {i}: NaNs differ"
        assert torch.equal(a.nan_to_num(0.0), b.nan_to_num(0.0)), f"output {i} differs"
    assert outs[1][0][clean].isfinite().all() and outs[1][1][clean].isfinite().all()


def test_native_stack_takes_gated_outputs_by_name(monkeypatch):
    """AFMoE's layers reach the stack with ``attn_gate`` (each layer's gate projection: weight, scales, bias) and
    ``attn_gate_kind="sigmoid"`` by name; the stack refuses, before any buffer is written, a kind it does not know, a
    gate list of another length than three a layer, and either without the other."""
    torch.manual_seed(0)
    model = Llama(LlamaConfig(**{**BASE, **MOE_FAMILIES["afmoe"], "num_hidden_layers": 1,
                                 "extra": {**MOE_FAMILIES["afmoe"]["extra"], "num_dense_layers": 1}})).eval()
    args, kwargs, cache = stack_call(model, monkeypatch)
    gate = model.model.layers[0].self_attn.gate_proj
    assert kwargs["attn_gate_kind"] == "sigmoid" and len(kwargs["attn_gate"]) == 3
    assert kwargs["attn_gate"][0] is gate.weight and kwargs["attn_gate"][1:] == [None, None]
    cache.rollback(torch.zeros(2, dtype=torch.int32))
    before = [t.clone() for t in cache.k + cache.v]
    real = torch.ops.triforce_C.decoder_layers
    for match, change in (("attn_gate_kind must be", dict(attn_gate_kind="tanh")),
                          ("goes with attn_gate_kind", dict(attn_gate=kwargs["attn_gate"][:2])),
                          ("goes with attn_gate_kind", dict(attn_gate_kind="")),
                          ("has no weight", dict(attn_gate=[None, None, None]))):
        with pytest.raises(RuntimeError, match=match):
            real(*args, **{**kwargs, **change})
    assert_bitwise(before, cache.k + cache.v)
