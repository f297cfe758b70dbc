"""DeepSeek-V3.2 (``model_type="deepseek_v32"``: V3.2-Exp, V3.2, V3.2-Speciale): DeepSeek-V3's latent attention and
mixture with DeepSeek's sparse attention (DSA): each layer's lightning indexer scores every key a query sees and the
query attends to its ``index_topk`` best (triforce.models.llama.Indexer, triforce.models.cache.indexed_attention);
against transformers' DeepseekV32ForCausalLM on the same weights, and the attention's choice against a reference
written out."""
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from triforce.models import FullCache, Llama, LlamaConfig, StreamingCache
from triforce.models.cache import indexed_attention
from triforce.models.llama import Indexer, LatentAttention

from .test_deepseek import V3, tiny_deepseek, transformers_pair
from .test_engines import TINY_CASES, assert_greedy_equals_autoregressive
from .test_model import TOL
from .test_moe import assert_checkpoint_directories_both_ways
from .test_sliding_window import assert_every_path_matches, assert_pass_equals_steps

transformers = pytest.importorskip("transformers")

# DeepSeek-V3's tiny model (tests/test_deepseek.py's "v3") and an indexer of 16 heads of 16 (RoPE on 8): each query
# attends to its 8 best keys of the 40-token sequences (index_topk 8), a dense first layer
BASE = dict(vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=4, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12,
            n_routed_experts=6, num_experts_per_tok=2, moe_intermediate_size=40, first_k_dense_replace=1,
            n_shared_experts=1, q_lora_rank=24, n_group=3, topk_group=2, norm_topk_prob=True,
            routed_scaling_factor=2.5, index_topk=8, index_head_dim=16, index_n_heads=16)
_YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 16,
         "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}
CASES = {
    "topk-8": {},
    # 24 of the keys: the prefill's and the pass's queries cross from every key to a choice; YaRN; the dense layers
    # by mlp_layer_types; an indexer key wider than its RoPE'd dims by 24
    "topk-24-yarn": dict(index_topk=24, index_head_dim=32, rope_parameters=dict(_YARN), max_position_embeddings=64,
                         num_hidden_layers=4, mlp_layer_types=["dense", "sparse", "dense", "sparse"]),
}


def pair(case="topk-8", **kw):
    """transformers' DeepseekV32ForCausalLM of ``case`` (random weights, decisive routers: std 0.5; random correction
    biases) and ours on its weights."""
    return transformers_pair("DeepseekV32", {**BASE, **CASES[case], **kw})


@pytest.mark.parametrize("case", list(CASES))
def test_logits_and_every_path_match_transformers(case):
    """The plain forward, a chunked prefill, a verify pass, steps and a tree over the cache give transformers'
    logits (each query over its index_topk best keys); the config reads back in transformers as the same model."""
    hf, ours = pair(case)
    c = ours.config
    assert all(type(layer.self_attn) is LatentAttention and type(layer.self_attn.indexer) is Indexer
               for layer in ours.model.layers)
    assert (c.dsa.n_heads, c.dsa.head_dim, c.dsa.topk) == (16, hf.config.index_head_dim, hf.config.index_topk)
    assert c.experts.layers == tuple(t == "sparse" for t in hf.config.mlp_layer_types)
    assert_every_path_matches(hf, ours)
    back = transformers.DeepseekV32Config.from_dict(c.to_dict())
    for key in ("index_topk", "index_head_dim", "index_n_heads", "mlp_layer_types", "layer_types", "q_lora_rank",
                "kv_lora_rank", "qk_rope_head_dim", "rope_parameters", "n_group", "topk_group"):
        assert getattr(back, key) == getattr(hf.config, key), key


def test_the_choice_matters():
    """Attending to every key (a top-k past the sequence), or the indexer's head weights changed, move the logits
    far past the tests' tolerance: the test above sees the choice."""
    hf, ours = pair()
    ids = torch.randint(0, 101, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(ids).logits
        _, dense = pair(index_topk=64)
        assert (dense(ids) - ref).abs().max().item() > 100 * TOL
        ours.model.layers[1].self_attn.indexer.weights_proj.weight.neg_()
        assert (ours(ids) - ref).abs().max().item() > 100 * TOL


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_pass_gives_the_bits_of_one_token_steps(case, dtype):
    """A 10-token pass after a 20-token prefill gives bitwise the logits of 10 one-token steps: each query's scores,
    choice and attention are its own row's (with top-k 24 the steps' queries see every key until the 24th, the
    pass's choose: the same bits)."""
    assert_pass_equals_steps(pair(case)[1], dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16_bit_models_as_transformers_loads_them(tmp_path, dtype):
    """In bfloat16 every weight is bfloat16 (the indexer's head weights too: transformers' ``_keep_in_fp32_modules``
    acts in float16 only, where the head weights stay float32); the logits are as near float32's as transformers'
    model's in that dtype."""
    hf, _ = pair()
    ids = torch.randint(0, 101, (2, 24), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = hf(ids).logits
        hf.save_pretrained(tmp_path)
        theirs = transformers.DeepseekV32ForCausalLM.from_pretrained(tmp_path, dtype=dtype).eval()
        ours = Llama.from_pretrained(tmp_path, dtype=dtype)
        kept = theirs.model.layers[0].self_attn.indexer.weights_proj.weight.dtype
        assert kept == (torch.float32 if dtype == torch.float16 else dtype)
        indexer = ours.model.layers[0].self_attn.indexer
        assert indexer.weights_proj.weight.dtype == kept and indexer.wq_b.weight.dtype == dtype
        mine = (ours(ids).float() - ref).abs().max().item()
        assert mine <= 2 * (theirs(ids).logits.float() - ref).abs().max().item() + 1e-3


def test_checkpoint_directories_both_ways(tmp_path):
    """A checkpoint transformers saved (the indexer's wq_b, wk, k_norm with its bias, weights_proj) loads with its
    logits; ours saves the same names, which transformers reads back bitwise as the same model."""
    assert_checkpoint_directories_both_ways(tmp_path, pair()[0])


def test_the_full_cache_holds_the_indexers_keys():
    """A full cache holds each layer's indexer keys beside its latent (and counts their bytes); a StreamingLLM
    cache (a draft's) holds none and attends to every key it keeps."""
    _, ours = pair()
    c = ours.config
    full = FullCache(c, 2, 32)
    assert len(full.index_k) == c.num_hidden_layers and full.index_k[0].shape == (2, 32, 16)
    assert full.memory_bytes() == 2 * 4 + c.num_hidden_layers * 2 * 32 * (c.head_dim + 16) * 4  # (lengths, latents)
    stream = StreamingCache(c, 2, sink=2, window=8, max_step=4)
    assert getattr(stream, "index_k", None) is None
    ids = torch.randint(0, 101, (2, 20), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ours.prefill(ids, full)
        assert full.index_k[0][:, :20].abs().amin() > 0 and full.index_k[0][:, 20:].abs().amax() == 0


def test_rows_leave_an_indexed_cache():
    """select_rows (finished rows leaving the batch) keeps the kept rows' indexer keys: the next steps of the kept
    rows give the logits of the same rows in a cache that never held the others."""
    _, ours = pair()
    ids = torch.randint(0, 101, (3, 25), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        cache, alone = FullCache(ours.config, 3, 32), FullCache(ours.config, 2, 32)
        for i in range(20):
            ours(ids[:, i:i + 1], cache=cache)
            ours(ids[[2, 0], i:i + 1], cache=alone)
        cache.select_rows([2, 0])
        assert torch.equal(ours(ids[[2, 0], 20:], cache=cache), ours(ids[[2, 0], 20:], cache=alone))


@pytest.mark.parametrize("method,opts", TINY_CASES, ids=[f"{m}-{i}" for i, (m, _) in enumerate(TINY_CASES)])
def test_greedy_equals_autoregressive(method, opts):
    """Every method emits autoregressive decoding's tokens (each query over its 8 best keys; the drafts' StreamingLLM
    and retrieval caches attend to every key they hold; trees commit the accepted path's indexer keys)."""
    assert_greedy_equals_autoregressive(tiny_deepseek("deepseek_v32", 0), tiny_deepseek("deepseek_v32", 1), method,
                                        opts)


def reference_indexed_attention(q, k, index_k, index_q, weights, prefix, tree_mask, topk, scale):
    """``indexed_attention`` written out in float64: every score, each query's visible keys, its ``topk`` best (the
    earlier slot first on equal scores), a softmax over them."""
    B, T, H, D = q.shape
    n = k.shape[1]
    out = torch.zeros(B, T, H, D, dtype=torch.float64)
    for b in range(B):
        for t in range(T):
            s = torch.relu(index_q[b, t].double() @ index_k[b].double().T * index_q.shape[-1] ** -0.5)  # [heads, n]
            score = (weights[b, t].double()[:, None] * s).sum(0)
            seen = [(i < prefix[b]) or (0 <= i - prefix[b] < T and (i - prefix[b] <= t if tree_mask is None
                                                                     else bool(tree_mask[b, t, i - prefix[b]])))
                    for i in range(n)]
            ranked = sorted((i for i in range(n) if seen[i]), key=lambda i: (-score[i].item(), i))[:topk]
            keys = k[b, sorted(ranked), 0].double()  # [K, D]
            p = torch.softmax(q[b, t].double() @ keys.T * scale, -1)
            out[b, t] = p @ keys
    return out


@given(data=st.data())
def test_indexed_attention_is_its_reference(data):
    """Any batch, step, prefix per row, tree or chain, top-k and widths: each query's output is the softmax over its
    top-k keys by the indexer's score (written out in float64), within float32 rounding."""
    B, T = data.draw(st.integers(1, 3), label="B"), data.draw(st.integers(1, 6), label="T")
    prefix = torch.tensor(data.draw(st.lists(st.integers(0, 12), min_size=B, max_size=B), label="prefix"))
    n = int(prefix.max()) + T + data.draw(st.integers(0, 3), label="slack")
    H, D = data.draw(st.sampled_from([(1, 8), (4, 16), (3, 10)]), label="H, D")
    heads, Dh = data.draw(st.sampled_from([(1, 4), (4, 8), (8, 6)]), label="indexer")
    topk = data.draw(st.integers(1, n + 2), label="topk")
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2**31 - 1), label="seed"))
    q, k = torch.randn(B, T, H, D, generator=g), torch.randn(B, n, 1, D, generator=g)
    index_q, index_k = torch.randn(B, T, heads, Dh, generator=g), torch.randn(B, n, Dh, generator=g)
    weights = torch.randn(B, T, heads, generator=g)
    tree_mask = None
    if data.draw(st.booleans(), label="tree") and T > 1:
        parents = [-1] + [data.draw(st.integers(0, i - 1), label=f"parent {i}") for i in range(1, T)]
        m = torch.zeros(T, T, dtype=torch.bool)
        for t in range(T):
            i = t
            while i >= 0:
                m[t, i] = True
                i = parents[i]
        tree_mask = m.expand(B, T, T).contiguous()
    scale = D ** -0.5
    got, choice = indexed_attention(q, k, index_k, index_q, weights, prefix, tree_mask, topk, n, scale, 0.0)
    want = reference_indexed_attention(q, k, index_k, index_q, weights, prefix, tree_mask, topk, scale)
    assert (got.double() - want).abs().max().item() <= 1e-5
    # the choice given back (GLM-5's shared layers) gives the same output bitwise, the indexer's inputs unread
    again, _ = indexed_attention(q, k, None, None, None, prefix, tree_mask, topk, n, scale, 0.0, choice=choice)
    assert torch.equal(again, got)


# The keys and values of DeepSeek-V3.2-Exp's config.json: V3's with the indexer's (FP8 blocks with ue8m0 scales)
V32 = {**{k: v for k, v in V3.items() if k not in ("architectures", "model_type", "quantization_config", "auto_map")},
       "architectures": ["DeepseekV32ForCausalLM"], "model_type": "deepseek_v32", "index_head_dim": 128,
       "index_n_heads": 64, "index_topk": 2048, "max_position_embeddings": 163840,
       "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                               "scale_fmt": "ue8m0", "weight_block_size": [128, 128]}}


def test_the_published_config_loads():
    """DeepSeek-V3.2-Exp's config.json reads as transformers reads it: V3's latent attention and router, an indexer
    of 64 heads of 128 choosing 2048 keys; it saves and reads back the same."""
    c = LlamaConfig.from_dict(V32)
    assert c.dsa.n_heads == 64 and c.dsa.head_dim == 128 and c.dsa.topk == 2048
    assert (c.num_key_value_heads, c.head_dim, c.mla.q_lora_rank, c.mla.rope_interleaved) == (1, 576, 1536, True)
    e = c.experts
    assert (e.count, e.top_k, e.groups, e.scoring, e.correction_bias) == (256, 8, (8, 4), "sigmoid", True)
    assert e.layers == (False,) * 3 + (True,) * 58
    saved = c.to_dict()  # (float: the FP8 weights are dequantised on loading)
    assert "quantization_config" not in saved and LlamaConfig.from_dict(saved).to_dict() == saved
    theirs = transformers.DeepseekV32Config.from_dict({**V32, "num_hidden_layers": 1})
    assert (theirs.index_n_heads, theirs.index_head_dim, theirs.index_topk) == (64, 128, 2048)


@pytest.mark.parametrize("change,match", [
    (dict(q_lora_rank=None), "q_lora_rank"),
    (dict(index_head_dim=4), "index_head_dim"),
    (dict(index_topk=0), "index_topk"),
    (dict(index_n_heads=1.5), "index_n_heads"),
    (dict(rope_interleave=False), "rope_interleave"),
    (dict(layer_types=["full_attention"] * 61), "layer_types"),
    (dict(model_type="deepseek_v3"), "index_"),
])
def test_bad_configs_raise(change, match):
    """The indexer needs the low-rank query latent and at least its RoPE'd dims; its keys are V3.2's only; V3.2's
    RoPE pairs are always adjacent (transformers reads no switch) and its layers all indexed."""
    with pytest.raises(ValueError, match=match):
        LlamaConfig.from_dict({**V32, **change})


@pytest.mark.parametrize("case", list(CASES))
def test_gguf_deepseek32_as_llama_cpp_writes_it(tmp_path, case):
    """A deepseek32 GGUF (llama.cpp's converter: deepseek2's tensors and keys in its latent layout, the indexer's
    blk.N.indexer.* tensors and attention.indexer.* keys) loads as its checkpoint's model: transformers' logits, the
    conversion cache read back by transformers as the same model, the file's blocks computing the loaded model
    bitwise."""
    from .test_deepseek import _GGUF_WIDTHS, assert_grouped_gguf_loads

    # (index_head_dim a multiple of 64: llama.cpp's Hadamard rotation of the indexer's; the dense layers leading, as
    # the file's leading_dense_block_count can say only)
    hf, ours = pair(case, **_GGUF_WIDTHS, index_head_dim=64, mlp_layer_types=None)
    loaded = assert_grouped_gguf_loads(tmp_path, hf, ours, "deepseek32")
    assert loaded.config.dsa == ours.config.dsa


def test_gguf_deepseek32_what_is_not_supported_raises(tmp_path):
    """A deepseek32 file without its indexer's keys, or with a softmax router, raises naming the key."""
    from triforce.models.loading import read_gguf

    from .test_deepseek import _GGUF_WIDTHS, write_grouped_gguf

    hf, _ = pair(**_GGUF_WIDTHS)
    with pytest.raises(ValueError, match="attention.indexer.top_k"):
        read_gguf(write_grouped_gguf(tmp_path / "a.gguf", hf, "deepseek32", drop=("attention.indexer.top_k",)))
    with pytest.raises(ValueError, match="softmax router"):
        read_gguf(write_grouped_gguf(tmp_path / "b.gguf", hf, "deepseek32", meta={"expert_gating_func": 1}))


_NATIVE = hasattr(torch.ops.triforce_C, "index_scores")


@pytest.mark.skipif(not _NATIVE, reason="the extension's index_scores is not built")
@given(data=st.data())
def test_index_scores_is_its_reference_and_each_scores_bits_its_own(data):
    """``triforce_C::index_scores`` (the indexer's scores in one pass: csrc/cpu/dsa.cpp) is ``sum_h w_h relu(scale *
    q_h . k)`` (float64 written out: within float32 rounding), for float32, bfloat16 and float16 keys, any shapes
    (tiles of 32 keys, 4 heads at a time, with their tails); a score's bits are the same in any subset of the queries
    and any prefix of the keys (a pass's queries and a step's, a longer cache)."""
    M, H = data.draw(st.integers(1, 5), label="M"), data.draw(st.integers(1, 9), label="H")
    D, n = data.draw(st.integers(1, 40), label="D"), data.draw(st.integers(1, 100), label="n")
    dtype = data.draw(st.sampled_from([torch.float32, torch.bfloat16, torch.float16]), label="keys' dtype")
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2**31 - 1), label="seed"))
    q, k, w = torch.randn(M, H, D, generator=g), torch.randn(n, D, generator=g).to(dtype), torch.randn(M, H, generator=g)
    scale = D ** -0.5
    got = torch.ops.triforce_C.index_scores(q, k, w, scale)
    want = (w.double()[:, :, None] * torch.relu(scale * torch.einsum("mhd,nd->mhn", q.double(), k.double()))).sum(1)
    bound = (w.double().abs()[:, :, None] * (scale * torch.einsum("mhd,nd->mhn", q.double().abs(),
                                                                   k.double().abs()))).sum(1)
    assert ((got.double() - want).abs() <= 1e-5 * bound + 1e-30).all()
    m0 = data.draw(st.integers(0, M - 1), label="a query")
    n0 = data.draw(st.integers(1, n), label="a prefix of the keys")
    assert torch.equal(torch.ops.triforce_C.index_scores(q[m0:m0 + 1], k[:n0], w[m0:m0 + 1], scale), got[m0:m0 + 1, :n0])


@pytest.mark.skipif(not _NATIVE, reason="the extension's index_scores is not built")
def test_index_scores_checks_its_arguments():
    q, k, w = torch.zeros(2, 3, 8), torch.zeros(5, 8), torch.zeros(2, 3)
    for args, match in [((q, k[:, :4], w), "must agree"), ((q, k, w[:, :2]), "must agree"),
                        ((q[0], k, w), r"q \[M, H, D\]"), ((q.double(), k, w), "float32"),
                        ((q, k.double(), w), "unsupported dtype")]:
        with pytest.raises(RuntimeError, match=match):
            torch.ops.triforce_C.index_scores(*args, 0.5)
    assert torch.ops.triforce_C.index_scores(q, k[:0], w, 0.5).shape == (2, 0)


def test_an_int8_copy_drafts_losslessly():
    """The int8 draft copy replaces the indexer's linear layers too (its head weights' dtype read from the copy's
    weight) and drafts for the model with autoregressive decoding's tokens."""
    from triforce.models.quant import Q8Linear, int8_copy

    model = tiny_deepseek("deepseek_v32", 0)
    draft = int8_copy(model)
    indexer = draft.model.layers[0].self_attn.indexer
    assert all(type(m) is Q8Linear for m in (indexer.wq_b, indexer.wk, indexer.weights_proj))
    assert_greedy_equals_autoregressive(model, draft, "speculative", {"gamma": 3})


@given(data=st.data())
def test_gguf_files_of_drawn_dsa_configs_load_as_their_checkpoints(data):
    """Property: a deepseek32 / glm-dsa GGUF of a drawn tiny checkpoint (top-k from 1 past the 24 tokens, 16 or 24
    indexer heads, V3.2's with YaRN or not, groups, renormalisation, GLM-5's shared layers drawn, a prediction layer
    appended, Q8_0 blocks) loads with transformers' logits, and its blocks compute the loaded model bitwise (with
    ``TRIFORCE_LLAMA_CPP=1`` llama.cpp runs every file too). (With 4 indexer heads, keys every head scores 0 are
    common, and transformers, llama.cpp and this model each break such ties their own way; llama.cpp's glm-dsa reads
    no rope.scaling.yarn_log_multiplier, so with YaRN it scales the scores otherwise than the checkpoint: docs/model.md;
    GLM-5 has no YaRN.)"""
    import numpy as np

    from .test_deepseek import _GGUF_WIDTHS, _YARN, assert_drawn_gguf_loads
    from .test_families import QT, quantizer

    draw = data.draw
    glm = draw(st.booleans(), label="GLM-5")
    groups = draw(st.sampled_from([1, 2, 3]), label="groups")
    kw = {**_GGUF_WIDTHS, "index_topk": draw(st.integers(1, 30), label="top-k"), "index_head_dim": 64,
          "index_n_heads": draw(st.sampled_from([16, 24]), label="indexer heads"), "mlp_layer_types": None,
          "n_group": groups, "topk_group": draw(st.integers(1, groups), label="top groups"),
          "norm_topk_prob": draw(st.booleans(), label="renormalised"), "rms_norm_eps": 1e-6,
          "first_k_dense_replace": draw(st.integers(0, 1), label="dense first")}
    if not glm and draw(st.booleans(), label="YaRN"):  # (llama.cpp's glm-dsa reads no yarn_log_multiplier: below)
        kw.update(max_position_embeddings=64, rope_parameters={**_YARN, "mscale": 1.0, "mscale_all_dim": 1.0})
    if glm:
        n = kw["num_hidden_layers"] = draw(st.integers(2, 4), label="layers")
        kw["indexer_types"] = ["full"] + [draw(st.sampled_from(["full", "shared"]), label=f"layer {i}")
                                          for i in range(1, n)]
    hf, _ = transformers_pair("GlmMoeDsa" if glm else "DeepseekV32", {**BASE, **kw})
    quant = quantizer(np.random.default_rng(0), types=(QT.Q8_0,)) if draw(st.booleans(), label="Q8_0") else None
    assert_drawn_gguf_loads(hf, "glm-dsa" if glm else "deepseek32", 24, quant,
                            mtp=draw(st.booleans(), label="prediction layer"))
