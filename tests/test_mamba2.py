"""Granite 4.0's Mamba-2 layers (``model_type="granitemoehybrid"`` with ``"mamba"`` / ``"linear_attention"`` layers:
granite-4.0-h-*): :class:`~triforce.models.llama.Mamba2Mixer` against transformers' GraniteMoeHybridForCausalLM, and
the caches' state space model states through steps, trees, rollbacks (replayed from a checkpoint), evictions and
retrieval."""
import pytest
import torch

import triforce.models.cache as cache_module
from triforce.models import Llama, LlamaConfig
from triforce.models.cache import FullCache
from triforce.models.llama import Attention, Mamba2Mixer

from .test_engines import TINY_CASES, assert_greedy_equals_autoregressive
from .test_families import TINY, assert_save_loads, assert_saved_reads_back, tiny_family, transformers_and_ours
from .test_granite4 import MICRO
from .test_lfm2 import (_steps, assert_draft_caches_exact, assert_parts_count,
                        assert_rollbacks_restore_the_state, assert_rows_kept_apart)
from .test_sliding_window import assert_every_path_matches, assert_pass_equals_steps

transformers = pytest.importorskip("transformers")

HYBRID = dict(TINY, num_hidden_layers=3, layer_types=["mamba", "attention", "mamba"], shared_intermediate_size=48,
              mamba_n_heads=8, mamba_d_state=16, mamba_n_groups=2, mamba_d_conv=4, mamba_chunk_size=8,
              embedding_multiplier=2.0, residual_multiplier=0.5, logits_scaling=2.0)
CASES = {"dense-rope-two-groups": dict(num_local_experts=0, num_experts_per_tok=0, position_embedding_type="rope"),
         # (a mixture; its Mamba layers by transformers' name, with biased projections and an unbiased convolution, one
         # group, state 8, 3 taps, NoPE)
         "moe-nope-biased": dict(num_local_experts=4, num_experts_per_tok=2, mamba_n_groups=1, mamba_d_state=8,
                                 mamba_d_conv=3, mamba_proj_bias=True, mamba_conv_bias=False,
                                 layer_types=["linear_attention", "attention", "linear_attention"])}
EXTRA = {"layer_types": ["mamba", "attention", "mamba"], "mamba_n_heads": 4, "mamba_d_state": 8, "mamba_n_groups": 2,
         "num_local_experts": 0, "num_experts_per_tok": 0, "shared_intermediate_size": 48,
         "position_embedding_type": "rope"}


def assert_matches_both_ways(tmp_path, hf, ours):
    """Every path of ``ours`` gives transformers' ``hf``'s logits; our save reads back in transformers, its save in
    ours (bitwise ours)."""
    assert_every_path_matches(hf, ours)
    assert_saved_reads_back(tmp_path / "ours", hf, ours)
    ids = torch.randint(0, 101, (2, 24), generator=torch.Generator().manual_seed(5))
    assert_save_loads(hf, tmp_path / "theirs", ids, ours)


def drawn_pair(name: str, module: str, attn_implementation="eager", std=0.2, **config):
    """transformers' ``<name>ForCausalLM`` of ``config`` (its recurrent layers' projections and convolution, the
    weights under ``.<module>.``, drawn larger than transformers' initialisation so that they count; A_log and D moved;
    biases and norms randomised) and ours built from its config and weights."""
    from triforce.models.loading import _build

    hf, _ = transformers_and_ours(name, attn_implementation=attn_implementation, **config)
    with torch.no_grad():
        for key, p in hf.named_parameters():
            if f".{module}." in key and key.endswith("weight") and "norm" not in key:
                p.normal_(0, std)
            if key.endswith(("A_log", ".D")):
                p.add_(torch.randn_like(p) * 0.3)
    return hf, _build(LlamaConfig.from_dict(hf.config.to_dict()), hf.state_dict(), None, None)


def pair(case="dense-rope-two-groups"):
    """transformers' GraniteMoeHybridForCausalLM of ``case`` and ours (:func:`drawn_pair`)."""
    return drawn_pair("GraniteMoeHybrid", "mamba", **{**HYBRID, **CASES[case]})


def tiny(seed, types=("mamba", "attention", "mamba")):
    return tiny_family("granitemoehybrid", seed, layers=len(types), extra={**EXTRA, "layer_types": list(types)})


@pytest.mark.parametrize("case", list(CASES))
def test_every_path_and_our_save_match_transformers(tmp_path, case):
    """Every path (the plain forward, a chunked prefill, a verify pass, one-token steps, a tree whose branches each run
    the state from their own parent) gives transformers' logits; our save reads back in transformers."""
    hf, ours = pair(case)
    kinds = [type(layer.self_attn) for layer in ours.model.layers]
    assert kinds == [Mamba2Mixer, Attention, Mamba2Mixer]
    assert ours.config.kv_heads_per_layer == (0, 2, 0)
    assert_every_path_matches(hf, ours)
    assert_saved_reads_back(tmp_path, hf, ours)


def test_transformers_directory_loads(tmp_path):
    hf, ours = pair("moe-nope-biased")
    ids = torch.randint(0, 101, (2, 24), generator=torch.Generator().manual_seed(5))
    assert_save_loads(hf, tmp_path, ids, ours)


def test_each_part_moves_the_logits():
    """A_log, dt_bias, D, the convolution, the gated norm's weight, the gate's share of in_proj count; so does the state
    a cached step starts from: zeroed, the next step's logits move."""
    hf, ours = pair()
    ids = torch.randint(0, 101, (2, 16), generator=torch.Generator().manual_seed(4))
    m = ours.model.layers[2].self_attn
    assert_parts_count(hf, ours, ids, (m.A_log, m.dt_bias, m.D, m.conv1d.weight, m.norm.weight,
                                       m.in_proj.weight[:128]), lambda cache: cache.ssm[2].zero_())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", list(CASES))
def test_a_pass_gives_the_bits_of_one_token_steps(dtype, case):
    assert_pass_equals_steps(pair(case)[1], dtype)


def test_rollback_and_commit_path_rebuild_the_state():
    """Rolled back to any accepted length after a pass, over several forwards, or past a checkpoint (the state replayed
    from the last one before it), and after a tree's commit_path (a chain-shaped tree fully accepted too), the next
    steps' logits are bitwise those of a cache that only ever saw the accepted tokens."""
    model = tiny(0)
    ids, want = assert_rollbacks_restore_the_state(model, length=42)
    assert_a_deep_rollback_replays(model, ids, want)
    with torch.no_grad():
        cache = FullCache(model.config, 2, 96)  # (a tree that is a chain, every node accepted: its length as a chain's)
        model(ids[:, :12], cache=cache)
        model(ids[:, 12:15], cache=cache, tree_parents=torch.tensor([[-1, 0, 1]] * 2))
        cache.commit_path(torch.full((2,), 12, dtype=torch.int32), torch.tensor([[0, 1, 2]] * 2),
                          torch.full((2,), 2, dtype=torch.int32))
        assert torch.equal(_steps(model, cache, ids[:, 15:], [1, 2]), want[:, 15:18])


def assert_a_deep_rollback_replays(model, ids, want):
    """After many one-token forwards, a rollback back over all of them (past checkpoints: the state replayed from the
    last one before it) gives the next steps' logits ``want`` bitwise."""
    with torch.no_grad():
        cache = FullCache(model.config, 2, 96)
        _steps(model, cache, ids, [12] + [1] * 25)
        cache.rollback(torch.full((2,), 15, dtype=torch.int32))
        assert torch.equal(_steps(model, cache, ids[:, 15:], [3, 1]), want[:, 15:19])


def test_a_rollback_before_every_checkpoint_raises(monkeypatch):
    """With two checkpoints a token apart, a rollback before the older raises (on the CPU) instead of replaying from
    a state it does not have; one after it does not."""
    assert_rollback_before_the_checkpoints_raises(monkeypatch, tiny(0))


def assert_rollback_before_the_checkpoints_raises(monkeypatch, model):
    """With two checkpoints a token apart, a rollback of ``model``'s cache before the older raises (on the CPU); one
    after it does not."""
    monkeypatch.setattr(cache_module, "SSM_CHECKPOINTS", 2)
    monkeypatch.setattr(cache_module, "SSM_CHECKPOINT_STRIDE", 1)
    cache = FullCache(model.config, 1, 64)
    ids = torch.randint(0, 64, (1, 20), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        _steps(model, cache, ids, [10, 4, 3, 3])  # (checkpoints at 14 and 17)
        cache.rollback(torch.tensor([15], dtype=torch.int32))
        with pytest.raises(ValueError, match="SSM_CHECKPOINTS"):
            cache.rollback(torch.tensor([12], dtype=torch.int32))


def test_drafts_caches_run_the_state_exactly():
    """On a model of Mamba layers only, StreamingLLM and retrieval caches give the full cache's logits bitwise (their
    states copied from it where they are filled from it)."""
    assert_draft_caches_exact(tiny(3, types=("mamba", "mamba")))


def test_ragged_rows_and_row_selection_keep_each_rows_state():
    assert_rows_kept_apart(tiny(0))


def test_config_reads_mamba_layers_as_transformers_reads_them():
    """GraniteMoeHybridConfig's defaults (no layer_types, or null: every layer Mamba; mamba_d_head 'auto'); a
    granite-4.0-h-shaped config; refusals."""
    c, want = LlamaConfig.from_dict({"model_type": "granitemoehybrid"}), transformers.GraniteMoeHybridConfig()
    m = c.mamba
    assert m.layers == (True,) * 32 and (m.heads, m.head_dim, m.groups, m.state, m.kernel, m.conv_bias) == (
        want.mamba_n_heads, want.mamba_d_head, want.mamba_n_groups, want.mamba_d_state, want.mamba_d_conv,
        want.mamba_conv_bias)
    h = LlamaConfig.from_dict({**MICRO, "layer_types": ["mamba"] * 9 + ["attention"] + ["mamba"] * 30})
    assert h.mamba.layers.count(False) == 1 and h.mamba.inner == 5120 and h.kv_heads_per_layer[9] == 8
    assert LlamaConfig.from_dict({**MICRO, "layer_types": None}).mamba.layers == (True,) * 40
    for bad, match in (({"mamba_d_head": 64}, "mamba_d_head"), ({"time_step_limit": [0.0, 1.0]}, "time_step_limit"),
                       ({"mamba_n_groups": 3}, "mamba_n_groups"), ({"mamba_conv_bias": 1}, "mamba_conv_bias")):
        with pytest.raises(ValueError, match=match):
            LlamaConfig.from_dict({**MICRO, "layer_types": ["mamba"] * 40, **bad})


@pytest.mark.parametrize("method,opts", [TINY_CASES[i] for i in (0, 2, 3, 4, 6)],
                         ids=[f"{TINY_CASES[i][0]}-{i}" for i in (0, 2, 3, 4, 6)])
def test_greedy_equals_autoregressive(method, opts):
    assert_greedy_equals_autoregressive(tiny(0), tiny(1), method, opts)


def _scan_inputs(b, T, H, P, G, N, seed):
    g = torch.Generator().manual_seed(seed)
    x, B, C = (torch.randn(shape, generator=g) for shape in ((b, T, H, P), (b, T, G, N), (b, T, G, N)))
    dt = torch.rand(b, T, H, generator=g) * 0.5
    decay = torch.exp(-dt * (1 + torch.rand(H, generator=g)))
    return torch.randn(b, H, P, N, generator=g), x, B, C, dt, decay, torch.randn(H, generator=g)


@pytest.mark.parametrize("shape", [(2, 5, 4, 8, 2, 16), (1, 3, 6, 5, 3, 21), (3, 1, 2, 4, 1, 40)])
def test_ssm_scan_is_the_recurrence(shape):
    """``ssm_scan`` (the extension's kernel where built, else PyTorch's ops) against the recurrence in float64; a
    T-token call bitwise T one-token calls and the same with one thread; tokens past a row's count leave its state."""
    from triforce.models.cache import ssm_scan

    b, T, H, P, G, N = shape
    state, x, B, C, dt, decay, D = _scan_inputs(*shape, seed=sum(shape))
    s64, want = state.double(), []
    Bh, Ch = (t.double().repeat_interleave(H // G, dim=2) for t in (B, C))
    for t in range(T):
        s64 = s64 * decay[:, t, :, None, None].double() + (dt[:, t, :, None].double() * Bh[:, t])[:, :, None, :] \
            * x[:, t, ..., None].double()
        want.append((s64 * Ch[:, t, :, None, :]).sum(-1) + D[:, None].double() * x[:, t].double())
    got_state = state.clone()
    y = ssm_scan(got_state, x, B, C, dt, decay, D)
    assert torch.allclose(y.double(), torch.stack(want, 1), atol=1e-4, rtol=1e-4)
    assert torch.allclose(got_state.double(), s64, atol=1e-4, rtol=1e-4)
    steps, one = state.clone(), []
    for t in range(T):
        one.append(ssm_scan(steps, x[:, t:t + 1], B[:, t:t + 1], C[:, t:t + 1], dt[:, t:t + 1], decay[:, t:t + 1], D))
    assert torch.equal(torch.cat(one, 1), y) and torch.equal(steps, got_state)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        single = state.clone()
        assert torch.equal(ssm_scan(single, x, B, C, dt, decay, D), y) and torch.equal(single, got_state)
    finally:
        torch.set_num_threads(threads)
    counts = torch.arange(b) % (T + 1)
    part = state.clone()
    ssm_scan(part, x, B, C, dt, decay, D, counts)
    for i in range(b):
        ref = state[i:i + 1].clone()
        k = int(counts[i])
        ssm_scan(ref, x[i:i + 1, :k], B[i:i + 1, :k], C[i:i + 1, :k], dt[i:i + 1, :k], decay[i:i + 1, :k], D)
        assert torch.equal(part[i:i + 1], ref)


def mamba_gguf_tensor(name: str, t: torch.Tensor, groups: int, inner: int):
    """A Mamba-2 layer's tensor as llama.cpp's converters write it (Mamba2Model): A as -exp(A_log) [H, 1], D [H, 1],
    the norm [groups, inner / groups], the convolution squeezed; None for every other tensor."""
    if name.endswith("A_log"):
        return -torch.exp(t)[:, None]
    if name.endswith(".D"):
        return t[:, None]
    if name.endswith(("mamba.norm.weight", "mixer.norm.weight")):
        return t.reshape(groups, inner // groups)
    if name.endswith("conv1d.weight"):
        return t.squeeze(1)
    return None


def stacked_experts_gguf(tensors: dict, name: str, t: torch.Tensor, i) -> bool:
    """Layer ``i``'s experts as transformers 5 stacks them (``experts.gate_up_proj`` ``[E, 2I, H]``, the gate's rows
    first; ``experts.down_proj`` ``[E, H, I]``) into ``tensors`` as llama.cpp's ffn_*_exps; whether ``name`` was one."""
    if name.endswith("experts.gate_up_proj"):
        gate, up = t.chunk(2, dim=1)
        tensors.update({f"blk.{i}.ffn_gate_exps.weight": gate.numpy(), f"blk.{i}.ffn_up_exps.weight": up.numpy()})
        return True
    if name.endswith("experts.down_proj"):
        tensors[f"blk.{i}.ffn_down_exps.weight"] = t.numpy()
        return True
    return False


def write_granitehybrid_gguf(path, hf, quant=None, meta=None):
    """A GGUF of transformers' GraniteMoeHybridForCausalLM ``hf`` as llama.cpp's converter writes it
    (GraniteHybridModel): granite's keys and multipliers, the KV heads per layer (0 on the Mamba layers), ssm.* keys,
    rope.scaling.finetuned for RoPE; q / k rows permuted as llama's; A as -exp(A_log) [H, 1], D [H, 1], the norm
    [groups, inner / groups], the convolution squeezed, dt_bias as ssm_dt.bias; the shared MLP's rows split into
    ffn_gate / ffn_up (ffn_*_shexp beside experts), the experts' stacks into ffn_*_exps."""
    from .test_families import write_converted_gguf

    c = hf.config
    head_dim = c.hidden_size // c.num_attention_heads
    moe = c.num_local_experts > 0
    kv = {"context_length": c.max_position_embeddings, "embedding_length": c.hidden_size,
          "feed_forward_length": c.intermediate_size, "block_count": c.num_hidden_layers,
          "attention.head_count": c.num_attention_heads,
          "attention.head_count_kv": [0 if t in ("mamba", "linear_attention") else c.num_key_value_heads
                                      for t in c.layers_block_type],
          "rope.dimension_count": head_dim, "rope.freq_base": float(c.rope_parameters["rope_theta"]),
          "attention.layer_norm_rms_epsilon": float(c.rms_norm_eps), "vocab_size": c.vocab_size,
          "embedding_scale": float(c.embedding_multiplier), "residual_scale": float(c.residual_multiplier),
          "attention.scale": float(c.attention_multiplier), "logit_scale": float(c.logits_scaling),
          "rope.scaling.finetuned": c.position_embedding_type == "rope",
          "expert_shared_feed_forward_length": c.shared_intermediate_size, "ssm.conv_kernel": c.mamba_d_conv,
          "ssm.state_size": c.mamba_d_state, "ssm.group_count": c.mamba_n_groups,
          "ssm.inner_size": c.mamba_expand * c.hidden_size, "ssm.time_step_rank": c.mamba_n_heads,
          **({"expert_count": c.num_local_experts, "expert_used_count": c.num_experts_per_tok} if moe else {})}
    kv.update(meta or {})
    inner = c.mamba_expand * c.hidden_size

    def permute(t, heads):  # (llama.cpp's: each head's rows in interleaved RoPE pairs)
        return t.reshape(heads, 2, t.shape[0] // heads // 2, *t.shape[1:]).swapaxes(1, 2).reshape(t.shape)

    tensors = {}

    def convert(name, t):
        i = name.split(".")[2] if name.startswith("model.layers.") else None
        if name.endswith("q_proj.weight"):
            return permute(t, c.num_attention_heads)
        if name.endswith("k_proj.weight"):
            return permute(t, c.num_key_value_heads)
        mamba = mamba_gguf_tensor(name, t, c.mamba_n_groups, inner)
        if mamba is not None:
            return mamba
        if name.endswith("mamba.dt_bias"):
            tensors[f"blk.{i}.ssm_dt.bias"] = t.numpy()
            return None
        if name.endswith("shared_mlp.input_linear.weight"):
            gate, up = t.chunk(2)
            suffix = "_shexp" if moe else ""
            tensors.update({f"blk.{i}.ffn_gate{suffix}.weight": gate.numpy(),
                            f"blk.{i}.ffn_up{suffix}.weight": up.numpy()})
            return None
        if name.endswith("shared_mlp.output_linear.weight"):
            tensors[f"blk.{i}.ffn_down{'_shexp' if moe else ''}.weight"] = t.numpy()
            return None
        if stacked_experts_gguf(tensors, name, t, i):
            return None
        if name.endswith("block_sparse_moe.router.weight"):
            tensors[f"blk.{i}.ffn_gate_inp.weight"] = t.numpy()
            return None
        return t

    for name, t in hf.state_dict().items():  # (the tensors written otherwise: into tensors first)
        convert(name, t.detach().float())
    return write_converted_gguf(path, hf, "granitehybrid", kv, tensors=tensors, quant=quant, convert=convert)


@pytest.mark.parametrize("case", list(CASES))
def test_gguf_granitehybrid_as_llama_cpp_writes_it(tmp_path, case):
    """A granitehybrid GGUF (dense with RoPE; a mixture without) loads as the checkpoint (A read back as
    log(-A)): transformers' logits; in Q8_0 / Q5_0 blocks its blocks compute the loaded model bitwise; an inner size
    its heads do not divide raises."""
    import numpy as np

    from triforce.models.loading import read_gguf

    from .test_families import QT, TOL, assert_blocks_compute_the_loaded_model, quantizer

    hf, ours = pair(case)
    path = write_granitehybrid_gguf(tmp_path / "f32.gguf", hf)
    loaded = Llama.from_pretrained(path, cache_dir=False)
    c = loaded.config
    assert c.mamba == ours.config.mamba and c.rope_layers == ours.config.rope_layers
    assert (c.experts is None) == (ours.config.experts is None)
    ids = torch.randint(0, 101, (2, 30), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ref = hf(ids).logits
        assert (loaded(ids) - ref).abs().max().item() <= TOL
    q = write_granitehybrid_gguf(tmp_path / "q.gguf", hf, quant=quantizer(np.random.default_rng(0),
                                                                          types=(QT.Q8_0, QT.Q5_0)))
    assert_blocks_compute_the_loaded_model(q, ids)
    with pytest.raises(ValueError, match="time_step_rank"):
        read_gguf(write_granitehybrid_gguf(tmp_path / "bad.gguf", hf, meta={"ssm.time_step_rank": 7}))


BAMBA = dict(TINY, num_hidden_layers=3, attn_layer_indices=[1], mamba_n_heads=8, mamba_d_state=16, mamba_n_groups=2,
             mamba_chunk_size=8)


def bamba_pair(**kw):
    return drawn_pair("Bamba", "mamba", **{**BAMBA, **kw})


@pytest.mark.parametrize("kw", [{}, dict(attention_bias=True, mlp_bias=True, tie_word_embeddings=True,
                                         mamba_proj_bias=True)], ids=["plain", "biased-tied"])
def test_bamba_every_path_and_saves_match_transformers(tmp_path, kw):
    """Bamba (BambaForCausalLM): its Mamba-2 layers and the attention layers of attn_layer_indices (RoPE on half of
    each head), every path against transformers, our save read back by it and its save by us; a pass bitwise its
    steps."""
    hf, ours = bamba_pair(**kw)
    c = ours.config
    assert c.mamba.layers == (True, False, True) and c.rotary_dim == c.head_dim // 2
    assert_matches_both_ways(tmp_path, hf, ours)
    assert_pass_equals_steps(ours, torch.float32)


def test_bamba_config_defaults_and_refusals():
    c, want = LlamaConfig.from_dict({"model_type": "bamba"}), transformers.BambaConfig()
    assert c.mamba.layers == (True,) * 32 and c.mamba.heads == want.mamba_n_heads and c.rotary_dim == 64
    assert (c.vocab_size, c.hidden_size, c.num_key_value_heads, c.max_position_embeddings) == (
        want.vocab_size, want.hidden_size, want.num_key_value_heads, want.max_position_embeddings)
    for bad, match in (({"partial_rotary_factor": 1.0}, "partial_rotary_factor"),
                       ({"attn_layer_indices": [40]}, "attn_layer_indices"),
                       ({"time_step_limit": [0.0, 2.0]}, "time_step_limit")):
        with pytest.raises(ValueError, match=match):
            LlamaConfig.from_dict({"model_type": "bamba", **bad})


@pytest.mark.parametrize("method,opts", [TINY_CASES[i] for i in (2, 6)],
                         ids=[f"{TINY_CASES[i][0]}-{i}" for i in (2, 6)])
def test_bamba_greedy_equals_autoregressive(method, opts):
    def tiny_bamba(seed):
        extra = {"attn_layer_indices": [1], "mamba_n_heads": 4, "mamba_d_state": 8, "mamba_n_groups": 2}
        return tiny_family("bamba", seed, extra=extra)
    assert_greedy_equals_autoregressive(tiny_bamba(0), tiny_bamba(1), method, opts)


@pytest.mark.parametrize("family", ["lfm2", "mamba"])
def test_the_gpus_path_of_the_recurrent_state_is_exact(monkeypatch, family):
    """With the caches' value checks off (a GPU's path: no reads for checks, the padding's masks and the merges of
    replayed rows taken always), rollbacks, a tree's commit_path, the draft caches and ragged rows stay bitwise."""
    from .test_lfm2 import tiny as tiny_lfm2

    monkeypatch.setattr(cache_module, "check_values", lambda t: False)
    model = tiny(0) if family == "mamba" else tiny_lfm2(0)
    assert_rollbacks_restore_the_state(model, length=42)
    assert_rows_kept_apart(model)
    only = tiny(3, types=("mamba", "mamba")) if family == "mamba" else tiny_lfm2(3, types=("conv", "conv"))
    assert_draft_caches_exact(only)


LAYER_SKIPS = {
    "lfm2-by-index": ("lfm2", {"full_attn_idxs": [2], "conv_bias": True}),
    "lfm2_moe-dense-first": ("lfm2_moe", {"layer_types": ["conv", "full_attention", "conv"], "num_dense_layers": 2,
                                          "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16}),
    "granite-h": ("granitemoehybrid", EXTRA),
    "bamba": ("bamba", {"attn_layer_indices": [2], "mamba_n_heads": 4, "mamba_d_state": 8}),
    "mamba2": ("mamba2", {"mamba_n_heads": 4, "mamba_d_head": 16, "mamba_d_state": 8, "mamba_n_groups": 2}),
    "nemotron_h": ("nemotron_h", {"layers_block_type": ["linear_attention", "full_attention", "mlp"],
                                  "mamba_n_heads": 4, "mamba_d_head": 16, "mamba_d_state": 8, "mamba_n_groups": 2}),
    "qwen3_5": ("qwen3_5_text", {"layer_types": ["linear_attention", "linear_attention", "full_attention"],
                                 "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 8,
                                 "linear_value_head_dim": 8}),
    "olmo_hybrid": ("olmo_hybrid", {"layer_types": ["linear_attention", "full_attention", "linear_attention"],
                                    "linear_num_key_heads": 2, "linear_num_value_heads": 2, "linear_key_head_dim": 8,
                                    "linear_value_head_dim": 8}),
    "mamba": ("mamba", {"mamba_d_state": 8, "mamba_expand": 2, "mamba_d_conv": 4, "mamba_dt_rank": "auto",
                        "mamba_conv_bias": True, "mamba_proj_bias": False, "residual_in_fp32": True}),
    "falcon_h1": ("falcon_h1", {"mamba_d_ssm": 32, "mamba_n_heads": 4, "mamba_d_state": 8, "mamba_n_groups": 2,
                                "mamba_rms_norm": True, "embedding_multiplier": 2.0, "lm_head_multiplier": 0.5}),
    "lfm3": ("lfm3", {"layer_types": ["conv", "sliding_attention", "full_attention"], "sliding_window": 6,
                      "conv_bias": True}),
    "jamba": ("jamba", {"attn_layer_period": 2, "attn_layer_offset": 1, "expert_layer_period": 2,
                        "expert_layer_offset": 0, "num_experts": 4, "num_experts_per_tok": 2, "mamba_d_state": 8,
                        "mamba_dt_rank": 4, "mamba_expand": 2, "mamba_d_conv": 4, "mamba_conv_bias": True,
                        "mamba_proj_bias": False}),
}


@pytest.mark.parametrize("name", list(LAYER_SKIPS))
def test_layer_skip_drafts_of_the_recurrent_families(name):
    """A layer-skip draft keeps the layer indices and counts its first layers hold (LFM2's full_attn_idxs, Bamba's
    attn_layer_indices, LFM2-MoE's num_dense_layers: they were refused past its last layer), and speculative decoding
    with it (``draft_layers``) is greedy lossless."""
    model_type, extra = LAYER_SKIPS[name]
    assert_layer_skip_is_lossless(tiny_family(model_type, 0, extra=extra))


def assert_layer_skip_is_lossless(target):
    """``target``'s layer-skip draft of its first layer keeps that layer's KV heads, and speculative decoding with it
    (``draft_layers``) is greedy lossless on ragged prompts."""
    import triforce

    from .test_engines import ragged_prompts

    draft = target.layer_skip(1)
    assert draft.config.kv_heads_per_layer == target.config.kv_heads_per_layer[:1]
    prompts = ragged_prompts()
    ref = triforce.generate(target, prompts, method="autoregressive", max_new_tokens=20)
    out = triforce.generate(target, prompts, method="speculative", max_new_tokens=20, draft_layers=1, gamma=3)
    for b in range(len(prompts)):
        assert torch.equal(out.tokens[b], ref.tokens[b])


MAMBA2 = dict(vocab_size=101, hidden_size=64, num_hidden_layers=2, num_heads=8, head_dim=16, state_size=16, n_groups=2,
              chunk_size=8)


def mamba2_pair(**kw):
    return drawn_pair("Mamba2", "mixer", attn_implementation=None, **{**MAMBA2, **kw})


@pytest.mark.parametrize("kw", [{}, dict(use_bias=True, use_conv_bias=False, tie_word_embeddings=True, n_groups=1,
                                         residual_in_fp32=False)], ids=["plain", "biased-tied-one-group"])
def test_mamba2_every_path_and_saves_match_transformers(tmp_path, kw):
    """Mamba-2 itself (Mamba2ForCausalLM: every layer a mixer after one norm, no MLP, no attention), every path
    against transformers, our save read back by it and its save by us; a pass bitwise its steps (bfloat16 with its
    float32 residual stream too)."""
    from triforce.models.llama import MixerLayer

    hf, ours = mamba2_pair(**kw)
    assert all(type(layer) is MixerLayer for layer in ours.model.layers) and ours.config.kv_heads_per_layer == (0, 0)
    assert_matches_both_ways(tmp_path, hf, ours)
    for dtype in (torch.float32, torch.bfloat16):
        assert_pass_equals_steps(mamba2_pair(**kw)[1], dtype)


def test_mamba2_config_defaults_and_refusals():
    c, want = LlamaConfig.from_dict({"model_type": "mamba2"}), transformers.Mamba2Config()
    m = c.mamba
    assert (m.heads, m.head_dim, m.state, m.groups, m.kernel, m.inner) == (
        want.num_heads, want.head_dim, want.state_size, want.n_groups, want.conv_kernel, want.expand * want.hidden_size)
    assert c.rms_norm_eps == want.layer_norm_epsilon and c.extra["residual_in_fp32"] is True
    d = c.to_dict()
    assert LlamaConfig.from_dict(d).to_dict() == d and "num_attention_heads" not in d and d["num_heads"] == 128
    for bad, match in (({"num_attention_heads": 8}, "num_attention_heads"), ({"rms_norm": False}, "rms_norm"),
                       ({"head_dim": 48}, "mamba_d_head"), ({"residual_in_fp32": "yes"}, "residual_in_fp32")):
        with pytest.raises(ValueError, match=match):
            LlamaConfig.from_dict({"model_type": "mamba2", **bad})


@pytest.mark.parametrize("method,opts", [TINY_CASES[i] for i in (0, 2, 6)],
                         ids=[f"{TINY_CASES[i][0]}-{i}" for i in (0, 2, 6)])
def test_mamba2_greedy_equals_autoregressive(method, opts):
    def tiny_mamba2(seed):
        extra = {"mamba_n_heads": 4, "mamba_d_head": 16, "mamba_d_state": 8, "mamba_n_groups": 2,
                 "residual_in_fp32": True}
        return tiny_family("mamba2", seed, layers=2, extra=extra)
    assert_greedy_equals_autoregressive(tiny_mamba2(0), tiny_mamba2(1), method, opts)


def test_gguf_mamba2_as_llama_cpp_writes_it(tmp_path):
    """A mamba2 GGUF (Mamba2Model's converter: no attention keys but head_count 0, ssm.*, the mixers' tensors as
    granitehybrid's, the layers' norm as attn_norm) loads with transformers' logits; Q8_0 / Q5_0 blocks bitwise."""
    from .test_families import assert_gguf_file_loads, write_converted_gguf

    hf, ours = mamba2_pair(vocab_size=112)  # (its converter pads the vocabulary to a multiple of 16)
    c = hf.config
    inner = c.expand * c.hidden_size
    kv = {"context_length": 1 << 20, "embedding_length": c.hidden_size, "feed_forward_length": 0,
          "attention.head_count": 0, "block_count": c.num_hidden_layers, "ssm.conv_kernel": c.conv_kernel,
          "ssm.inner_size": inner, "ssm.state_size": c.state_size, "ssm.time_step_rank": c.num_heads,
          "ssm.group_count": c.n_groups, "attention.layer_norm_rms_epsilon": float(c.layer_norm_epsilon),
          "vocab_size": c.vocab_size}
    tensors = {f"blk.{i}.ssm_dt.bias": hf.backbone.layers[i].mixer.dt_bias.detach().numpy()
               for i in range(c.num_hidden_layers)}

    def convert(name, t):
        mamba = mamba_gguf_tensor(name, t, c.n_groups, inner)
        if mamba is not None:
            return mamba
        return None if name.endswith("mixer.dt_bias") else t

    loaded = assert_gguf_file_loads(hf, lambda path, quant: write_converted_gguf(
        path, hf, "mamba2", kv, tensors=tensors, convert=convert, quant=quant), tmp_path, 112)
    assert loaded.config.model_type == "mamba2" and loaded.config.mamba == ours.config.mamba


NEMOTRON_H = dict(vocab_size=101, hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=16, intermediate_size=96, hybrid_override_pattern="M*-M", mamba_num_heads=8,
                  mamba_head_dim=16, ssm_state_size=16, n_groups=2, chunk_size=8)


def nemotron_h_pair(**kw):
    return drawn_pair("NemotronH", "mixer", **{**NEMOTRON_H, **kw})


@pytest.mark.parametrize("kw", [{}, dict(hybrid_override_pattern="*M-M-", num_hidden_layers=5, use_bias=True,
                                         attention_bias=True, mlp_bias=True, residual_in_fp32=True,
                                         time_step_min=0.05)], ids=["plain", "biased-fp32"])
def test_nemotron_h_every_path_and_saves_match_transformers(tmp_path, kw):
    """Nemotron-H (NemotronHForCausalLM): its Mamba-2, attention (no RoPE) and ReLU-squared MLP blocks each after one
    norm, every path against transformers (dt clamped at time_step_min everywhere, as its chunked form clamps), saves
    both ways, a pass bitwise its steps."""
    from triforce.models.llama import MixerLayer

    hf, ours = nemotron_h_pair(**kw)
    c = ours.config
    assert all(type(layer) is MixerLayer for layer in ours.model.layers) and not any(c.rope_layers)
    assert c.mamba.dt_min == hf.config.time_step_min
    assert_matches_both_ways(tmp_path, hf, ours)
    assert_pass_equals_steps(ours, torch.float32)


# Nemotron 3's mixture (its blocks E / "moe"): 4 experts in 2 groups, 2 a token from the best group
NEMOTRON_3 = dict(n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=24,
                  moe_shared_expert_intermediate_size=32, n_group=2, topk_group=1, routed_scaling_factor=1.5)


def nemotron_3_pair(**kw):
    """transformers' Nemotron-H with Nemotron 3's mixture blocks (the routers' correction biases drawn: transformers
    starts them at 0) and ours."""
    from triforce.models.loading import _build

    hf, _ = nemotron_h_pair(**{"hybrid_override_pattern": "M*EM", **NEMOTRON_3, **kw})
    with torch.no_grad():
        for name, t in hf.named_buffers():
            if name.endswith("e_score_correction_bias"):
                t.normal_(0, 0.5, generator=torch.Generator().manual_seed(7))
    return hf, _build(LlamaConfig.from_dict(hf.config.to_dict()), hf.state_dict(), None, None)


@pytest.mark.parametrize("kw", [{}, dict(hybrid_override_pattern="E*M-E", num_hidden_layers=5, n_group=1,
                                         norm_topk_prob=False, mlp_bias=True, routed_scaling_factor=1.0),
                                dict(moe_latent_size=24, mlp_bias=True)],
                         ids=["grouped-scaled", "ungrouped-unnormalised-biased", "latent-biased"])
def test_nemotron_3_mixture_blocks_match_transformers(tmp_path, kw):
    """Nemotron 3's mixture blocks (E / "moe"): DeepSeek-V3's router in float32 (the sigmoid plus the correction bias
    choosing within the groups of the best two, renormalised where norm_topk_prob, times routed_scaling_factor), ungated
    ReLU-squared experts and shared expert, Super's routed experts in a latent width (moe_latent_size: the token
    projected in by fc1_latent_proj, their sum out by fc2_latent_proj); every path against transformers, saves both
    ways (its experts one by one on disk), each part counts, a pass bitwise its steps (float32, bfloat16)."""
    from triforce.models.llama import SparseMoE, UngatedExpert

    hf, ours = nemotron_3_pair(**kw)
    moe = [layer.mlp for layer in ours.model.layers if type(layer.__dict__["_modules"].get("mlp")) is SparseMoE]
    assert moe and all(type(e) is UngatedExpert for m in moe for e in m.experts)
    assert_matches_both_ways(tmp_path, hf, ours)
    m = moe[0]
    ids = torch.randint(0, 101, (2, 16), generator=torch.Generator().manual_seed(4))
    latent = (m.fc1_latent_proj.weight, m.fc2_latent_proj.weight) if "moe_latent_size" in kw else ()
    assert (m.experts[0].up_proj.weight.shape[1] == 24) == bool(latent)
    assert_parts_count(hf, ours, ids, (m.gate.e_score_correction_bias, m.experts[1].up_proj.weight,
                                       m.shared_expert.down_proj.weight, *latent),
                       lambda cache: next(state for state in cache.ssm if state is not None).zero_())
    for dtype in (torch.float32, torch.bfloat16):
        assert_pass_equals_steps(ours, dtype)


@pytest.mark.parametrize("method,opts", [TINY_CASES[i] for i in (2, 6)],
                         ids=[f"{TINY_CASES[i][0]}-{i}" for i in (2, 6)])
def test_nemotron_3_greedy_equals_autoregressive(method, opts):
    def tiny_nemotron_3(seed):
        extra = {"layers_block_type": ["linear_attention", "full_attention", "moe"], "mamba_n_heads": 4,
                 "mamba_d_head": 16, "mamba_d_state": 8, "mamba_n_groups": 2, **NEMOTRON_3}
        return tiny_family("nemotron_h", seed, head_dim=8, extra=extra)
    assert_greedy_equals_autoregressive(tiny_nemotron_3(0), tiny_nemotron_3(1), method, opts)


def test_nemotron_h_config_and_refusals():
    c = LlamaConfig.from_dict(transformers.NemotronHConfig(**NEMOTRON_H).to_dict())
    assert c.block_types == ("linear_attention", "full_attention", "mlp", "linear_attention")
    assert c.kv_heads_per_layer == (0, 2, 0, 0) and c.mamba.layers == (True, False, False, True)
    d = c.to_dict()
    assert LlamaConfig.from_dict(d).to_dict() == d and d["mamba_num_heads"] == 8 and "rope_theta" not in d
    moe = {"hybrid_override_pattern": "M*E-", **NEMOTRON_3}
    assert LlamaConfig.from_dict({**NEMOTRON_H, "model_type": "nemotron_h", **moe,
                                  "moe_latent_size": 16}).experts.latent_size == 16  # (Super's latent mixture)
    for bad, match in (({"hybrid_override_pattern": "M*X-"}, "M, \\*"), ({**moe, "moe_latent_size": 0}, "latent"),
                       ({**moe, "num_experts_per_tok": 5}, "mixture of 4 experts"),
                       ({**moe, "n_group": 3}, "mixture of 4 experts"), ({**moe, "n_routed_experts": 0}, "ints >= 1")):
        with pytest.raises(ValueError, match=match):
            LlamaConfig.from_dict({**{k: v for k, v in NEMOTRON_H.items()}, "model_type": "nemotron_h", **bad})
    # (its mixture's keys, read by no block without one)
    assert LlamaConfig.from_dict({**NEMOTRON_H, "model_type": "nemotron_h", "moe_latent_size": 16}).experts is None


@pytest.mark.parametrize("method,opts", [TINY_CASES[i] for i in (0, 2, 6)],
                         ids=[f"{TINY_CASES[i][0]}-{i}" for i in (0, 2, 6)])
def test_nemotron_h_greedy_equals_autoregressive(method, opts):
    def tiny_nemotron(seed):
        extra = {"layers_block_type": ["linear_attention", "full_attention", "mlp"], "mamba_n_heads": 4,
                 "mamba_d_head": 16, "mamba_d_state": 8, "mamba_n_groups": 2}
        return tiny_family("nemotron_h", seed, head_dim=8, extra=extra)
    assert_greedy_equals_autoregressive(tiny_nemotron(0), tiny_nemotron(1), method, opts)


def write_nemotron_h_gguf(path, hf, quant=None, meta=None):
    """A GGUF of transformers' NemotronHForCausalLM ``hf`` as llama.cpp's converter writes it (NemotronHModel, a
    GraniteHybridModel): each block's kind as its attention.head_count_kv and feed_forward_length entries (0 on the
    others), the ssm.* keys (the inner width the heads'), the context 2^20, rope.dimension_count hidden / heads (no RoPE
    is run); q / k rows permuted as llama's; the Mamba tensors as Mamba2Model writes them, dt_bias as ssm_dt.bias; the
    gguf package's names of backbone.*."""
    import gguf

    from .test_families import write_gguf_file

    c = hf.config
    types = c.layers_block_type
    inner = c.mamba_num_heads * c.mamba_head_dim
    moe = "moe" in types
    arch = "nemotron_h_moe" if moe else "nemotron_h"
    kv = {"context_length": 1 << 20, "embedding_length": c.hidden_size, "block_count": c.num_hidden_layers,
          "attention.head_count": c.num_attention_heads, "vocab_size": c.vocab_size,
          "attention.head_count_kv": [c.num_key_value_heads if t == "full_attention" else 0 for t in types],
          "feed_forward_length": [c.intermediate_size if t == "mlp" else c.moe_intermediate_size if t == "moe" else 0
                                  for t in types],
          "attention.key_length": c.head_dim, "attention.value_length": c.head_dim,
          "rope.dimension_count": c.hidden_size // c.num_attention_heads, "rope.scaling.finetuned": False,
          "attention.layer_norm_rms_epsilon": float(c.layer_norm_epsilon), "ssm.conv_kernel": c.conv_kernel,
          "ssm.state_size": c.ssm_state_size, "ssm.group_count": c.n_groups, "ssm.inner_size": inner,
          "ssm.time_step_rank": c.mamba_num_heads}
    if getattr(c, "moe_latent_size", None):  # (Super's latent mixture: its width; ffn_latent_down / _up)
        kv["moe_latent_size"] = c.moe_latent_size
    if moe:  # (NemotronHModel's nemotron_h_moe keys)
        kv.update({"expert_count": c.n_routed_experts, "expert_used_count": c.num_experts_per_tok,
                   "expert_feed_forward_length": c.moe_intermediate_size,
                   "expert_shared_feed_forward_length": c.moe_shared_expert_intermediate_size,
                   "expert_shared_count": 1, "expert_weights_norm": c.norm_topk_prob,
                   "expert_weights_scale": float(c.routed_scaling_factor), "expert_group_count": c.n_group,
                   "expert_group_used_count": c.topk_group, "expert_gating_func": 2})
    kv.update(meta or {})
    names = gguf.get_tensor_name_map(next(a for a, n in gguf.MODEL_ARCH_NAMES.items() if n == arch),
                                     c.num_hidden_layers)

    def permute(t, heads):  # (llama.cpp's: each head's rows in interleaved RoPE pairs)
        return t.reshape(heads, 2, t.shape[0] // heads // 2, *t.shape[1:]).swapaxes(1, 2).reshape(t.shape)

    tensors = {}
    for name, t in hf.state_dict().items():
        t = t.detach().float()
        if name == "lm_head.weight" and c.tie_word_embeddings:
            continue
        i = name.split(".")[2] if name.startswith("model.layers.") else None
        if name.endswith("mixer.dt_bias"):
            tensors[f"blk.{i}.ssm_dt.bias"] = t.numpy()
            continue
        if name.endswith(("mixer.experts.up_proj", "mixer.experts.down_proj")):  # (stacked, [E, out, in])
            tensors[f"blk.{i}.ffn_{name.rsplit('.', 1)[1][:-5]}_exps.weight"] = t.numpy()
            continue
        if name.endswith("mixer.gate.e_score_correction_bias"):
            tensors[f"blk.{i}.exp_probs_b.bias"] = t.numpy()
            continue
        mamba = mamba_gguf_tensor(name, t, c.n_groups, inner)
        t = mamba if mamba is not None else permute(t, c.num_attention_heads) if name.endswith("q_proj.weight") \
            else permute(t, c.num_key_value_heads) if name.endswith("k_proj.weight") else t
        key = names.get_name(name.replace("model.", "backbone.", 1), try_suffixes=(".weight", ".bias"))
        tensors[key] = t.numpy()
    return write_gguf_file(path, arch, kv, tensors, c, quant)


NEMOTRON_H_GGUF = {
    # (an inner width no multiple of the embedding's; biased MLP blocks; a contradicting width raises)
    "nemotron_h": (lambda: nemotron_h_pair(vocab_size=104, mamba_num_heads=6, mlp_bias=True),
                   {"feed_forward_length": [0, 96, 96, 0]}, "one MLP width"),
    # (Nemotron 3's mixture blocks: its experts stacked as ffn_up_exps / ffn_down_exps, the correction bias as
    # exp_probs_b, the shared expert as ffn_*_shexp, the router's settings as expert_* keys; another gating raises)
    "nemotron_h_moe": (lambda: nemotron_3_pair(vocab_size=104, hybrid_override_pattern="M*EM",
                                               moe_intermediate_size=32),
                       {"expert_gating_func": 1}, "expert_gating_func"),
    # (Nemotron 3 Super's latent mixture: moe_latent_size, its projections as ffn_latent_down / ffn_latent_up)
    "nemotron_h_moe-latent": (lambda: nemotron_3_pair(vocab_size=104, hybrid_override_pattern="M*EM",
                                                      moe_intermediate_size=32, moe_latent_size=32),
                              {"expert_gating_func": 1}, "expert_gating_func")}


@pytest.mark.parametrize("arch", list(NEMOTRON_H_GGUF))
def test_gguf_nemotron_h_as_llama_cpp_writes_it(tmp_path, arch):
    """A nemotron_h / nemotron_h_moe GGUF (its blocks' kinds as per-layer KV heads and MLP widths, q / k permuted)
    loads as the checkpoint: transformers' logits; Q8_0 / Q5_0 blocks bitwise; metadata it cannot read raises."""
    import numpy as np

    from triforce.models.loading import read_gguf

    from .test_families import QT, TOL, assert_blocks_compute_the_loaded_model, quantizer

    make, bad, match = NEMOTRON_H_GGUF[arch]
    hf, ours = make()
    path = write_nemotron_h_gguf(tmp_path / "f32.gguf", hf)
    loaded = Llama.from_pretrained(path, cache_dir=False)
    c = loaded.config
    assert c.block_types == ours.config.block_types and c.mamba == ours.config.mamba
    assert c.experts == ours.config.experts and c.mlp_bias == ours.config.mlp_bias
    assert (c.experts.latent_size if c.experts else None) == (32 if "latent" in arch else None)
    ids = torch.randint(0, 104, (2, 30), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert (loaded(ids) - hf(ids).logits).abs().max().item() <= TOL
    q = write_nemotron_h_gguf(tmp_path / "q.gguf", hf, quant=quantizer(np.random.default_rng(0),
                                                                       types=(QT.Q8_0, QT.Q5_0)))
    assert_blocks_compute_the_loaded_model(q, ids)
    with pytest.raises(ValueError, match=match):
        read_gguf(write_nemotron_h_gguf(tmp_path / "bad.gguf", hf, meta=bad))


MAMBA1 = dict(vocab_size=101, hidden_size=64, num_hidden_layers=3, state_size=8, expand=2, conv_kernel=4)


def mamba1_pair(std=0.1, **kw):
    """transformers' MambaForCausalLM and ours (its mixers' projections drawn at 0.1: at 0.2 transformers' own float32
    strays from its float64 by 1.8e-5, ours by 5e-6: test_mamba1_as_close_to_float64_as_transformers)."""
    return drawn_pair("Mamba", "mixer", std=std, **{**MAMBA1, **kw})


def tiny_mamba1(seed, layers=2):
    return tiny_family("mamba", seed, layers=layers, extra={"mamba_d_state": 8, "mamba_expand": 2, "mamba_d_conv": 4,
                                                            "mamba_dt_rank": "auto", "mamba_conv_bias": True,
                                                            "mamba_proj_bias": False, "residual_in_fp32": True})


@pytest.mark.parametrize("name,kw", [("Mamba", {}),
                                     ("Mamba", dict(use_bias=True, use_conv_bias=False, tie_word_embeddings=False,
                                                    residual_in_fp32=False, time_step_rank=6, conv_kernel=3)),
                                     ("FalconMamba", dict(mixer_rms_eps=1e-3, tie_word_embeddings=False))],
                         ids=["plain", "biased-untied", "falcon-mamba"])
def test_mamba1_every_path_and_saves_match_transformers(tmp_path, name, kw):
    """Mamba (MambaForCausalLM): every layer a Mamba(-1) mixer after one norm (its selective scan: a state per channel,
    decayed by exp(dt A) per state dim); Falcon Mamba's with weightless RMSNorms on dt's low rank, B and C; every path
    against transformers, saves both ways, a pass bitwise its steps (float32, bfloat16)."""
    from triforce.models.llama import Mamba1Mixer, MixerLayer

    hf, ours = drawn_pair(name, "mixer", std=0.1, **{**MAMBA1, **kw})
    assert (ours.config.mamba1.bcdt_eps is not None) == (name == "FalconMamba")
    assert all(type(layer) is MixerLayer and type(layer.self_attn) is Mamba1Mixer for layer in ours.model.layers)
    assert ours.config.kv_heads_per_layer == (0, 0, 0)
    assert_matches_both_ways(tmp_path, hf, ours)
    for dtype in (torch.float32, torch.bfloat16):
        assert_pass_equals_steps(ours, dtype)


def test_mamba1_as_close_to_float64_as_transformers():
    """With projections drawn large enough that float32's rounding alone moves the logits past TOL, ours stay as close
    to transformers' model in float64 as transformers' own float32 forward, within a factor of 1.5."""
    import copy

    hf, ours = mamba1_pair(std=0.2)
    ids = torch.randint(0, 101, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        exact = copy.deepcopy(hf).double()(ids).logits
        theirs = (hf(ids).logits.double() - exact).abs().max().item()
        mine = (ours(ids).double() - exact).abs().max().item()
    assert theirs > 1e-5 and mine <= 1.5 * theirs, (mine, theirs)


def test_mamba1_each_part_moves_the_logits():
    hf, ours = mamba1_pair()
    ids = torch.randint(0, 101, (2, 16), generator=torch.Generator().manual_seed(4))
    m = ours.model.layers[1].self_attn
    assert_parts_count(hf, ours, ids, (m.A_log, m.D, m.conv1d.weight, m.x_proj.weight[:4], m.x_proj.weight[-8:],
                                       m.dt_proj.bias, m.in_proj.weight[128:]), lambda cache: cache.ssm[1].zero_())


def test_mamba1_caches_roll_back_and_draft_exactly(monkeypatch):
    """Rollbacks and commit_path rebuild the state from a checkpoint (its replay takes the layer's A), StreamingLLM and
    retrieval caches give the full cache's logits bitwise, ragged rows keep their own states; with the GPU's path
    too."""
    model = tiny_mamba1(0)
    assert_rollbacks_restore_the_state(model, length=42)
    assert_draft_caches_exact(tiny_mamba1(3))
    assert_rows_kept_apart(model)
    monkeypatch.setattr(cache_module, "check_values", lambda t: False)
    assert_rollbacks_restore_the_state(model, length=42)
    assert_rows_kept_apart(model)


def test_mamba1_config_defaults_and_refusals():
    want = transformers.MambaConfig()
    c = LlamaConfig.from_dict({"model_type": "mamba"})
    m = c.mamba1
    assert (m.inner, m.state, m.kernel, m.dt_rank, m.conv_bias, m.proj_bias) == (
        want.intermediate_size, want.state_size, want.conv_kernel, want.time_step_rank, want.use_conv_bias,
        want.use_bias)
    assert c.tie_word_embeddings and c.num_hidden_layers == want.num_hidden_layers
    d = LlamaConfig.from_dict(want.to_dict()).to_dict()
    assert LlamaConfig.from_dict(d).to_dict() == d and "num_attention_heads" not in d
    for bad, match in (({"intermediate_size": 100}, "expand x hidden_size"), ({"hidden_act": "gelu"}, "SiLU"),
                       ({"num_attention_heads": 4}, "MambaConfig")):
        with pytest.raises(ValueError, match=match):
            LlamaConfig.from_dict({"model_type": "mamba", **bad})


@pytest.mark.parametrize("method,opts", [TINY_CASES[i] for i in (0, 2, 6)],
                         ids=[f"{TINY_CASES[i][0]}-{i}" for i in (0, 2, 6)])
def test_mamba1_greedy_equals_autoregressive(method, opts):
    assert_greedy_equals_autoregressive(tiny_mamba1(0), tiny_mamba1(1), method, opts)


@pytest.mark.parametrize("name", ["Mamba", "FalconMamba"])
def test_gguf_mamba_as_llama_cpp_writes_it(tmp_path, name):
    """A mamba GGUF (MambaModel's converter: head_count and feed_forward_length 0, ssm.* keys, A as -exp(A_log)
    [inner, state], the convolution squeezed; Falcon Mamba's with ssm.dt_b_c_rms, its norms' eps the layers' as
    llama.cpp takes it) loads as the checkpoint: transformers' logits; Q8_0 / Q5_0 blocks bitwise."""
    import dataclasses
    import math

    from .test_families import assert_gguf_file_loads, write_converted_gguf

    falcon = name == "FalconMamba"  # (its mixer_rms_eps as the layers' eps: the file has one)
    hf, ours = drawn_pair(name, "mixer", std=0.1, **{**MAMBA1, "vocab_size": 104, "hidden_size": 64},
                          **({"mixer_rms_eps": 1e-5} if falcon else {}))
    c = hf.config
    kv = {"context_length": 1 << 20, "embedding_length": c.hidden_size, "feed_forward_length": 0,
          "attention.head_count": 0, "block_count": c.num_hidden_layers, "ssm.conv_kernel": c.conv_kernel,
          "ssm.inner_size": c.intermediate_size, "ssm.state_size": c.state_size,
          "ssm.time_step_rank": c.time_step_rank, "attention.layer_norm_rms_epsilon": float(c.layer_norm_epsilon),
          "ssm.dt_b_c_rms": falcon, "vocab_size": c.vocab_size}

    def convert(key, t):
        return -torch.exp(t) if key.endswith("A_log") else t.squeeze(1) if key.endswith("conv1d.weight") else t

    loaded = assert_gguf_file_loads(hf, lambda path, quant: write_converted_gguf(
        path, hf, "mamba", kv, convert=convert, quant=quant), tmp_path, 104)
    assert loaded.config.model_type == ("falcon_mamba" if falcon else "mamba")
    got, want = loaded.config.mamba1, ours.config.mamba1  # (the file's eps a float32)
    assert dataclasses.replace(got, bcdt_eps=want.bcdt_eps) == want
    assert (got.bcdt_eps is None) == (want.bcdt_eps is None) and (got.bcdt_eps is None or math.isclose(
        got.bcdt_eps, want.bcdt_eps, rel_tol=1e-6))


JAMBA = dict(vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2,
             expert_layer_offset=0, num_experts=4, num_experts_per_tok=2, mamba_d_state=8, mamba_dt_rank=8)


@pytest.mark.parametrize("kw", [{}, dict(num_experts=1, tie_word_embeddings=True, mamba_proj_bias=True,
                                         mamba_conv_bias=False, attn_layer_offset=0, mamba_dt_rank="auto")],
                         ids=["mixture", "dense-tied-biased"])
def test_jamba_every_path_and_saves_match_transformers(tmp_path, kw):
    """Jamba (JambaForCausalLM): Mamba(-1) layers with RMSNorms of their own on dt's low rank, B and C beside attention
    layers without RoPE, each layer's MLP a mixture (the softmax's top k, not renormalised) or dense; every path against
    transformers, saves both ways (its experts one by one on disk), a pass bitwise its steps (float32, bfloat16)."""
    from triforce.models.llama import Attention, Mamba1Mixer

    hf, ours = drawn_pair("Jamba", "mamba", std=0.1, **{**JAMBA, **kw})
    kinds = [type(layer.self_attn) for layer in ours.model.layers]
    assert kinds.count(Attention) == 2 and kinds.count(Mamba1Mixer) == 2 and not any(ours.config.rope_layers)
    assert (ours.config.experts is None) == ("num_experts" in kw)
    assert_matches_both_ways(tmp_path, hf, ours)
    for dtype in (torch.float32, torch.bfloat16):
        assert_pass_equals_steps(ours, dtype)


def test_jamba_each_part_moves_the_logits():
    hf, ours = drawn_pair("Jamba", "mamba", std=0.1, **JAMBA)
    ids = torch.randint(0, 101, (2, 16), generator=torch.Generator().manual_seed(4))
    m = ours.model.layers[0].self_attn
    assert_parts_count(hf, ours, ids, (m.dt_layernorm.weight, m.b_layernorm.weight, m.c_layernorm.weight,
                                       ours.model.layers[0].mlp.gate.weight), lambda cache: cache.ssm[0].zero_())


@pytest.mark.parametrize("method,opts", [TINY_CASES[i] for i in (2, 6)],
                         ids=[f"{TINY_CASES[i][0]}-{i}" for i in (2, 6)])
def test_jamba_greedy_equals_autoregressive(method, opts):
    def tiny_jamba(seed):
        extra = {"attn_layer_period": 2, "attn_layer_offset": 1, "expert_layer_period": 2, "expert_layer_offset": 0,
                 "num_experts": 4, "num_experts_per_tok": 2, "mamba_d_state": 8, "mamba_dt_rank": 4,
                 "mamba_expand": 2, "mamba_d_conv": 4, "mamba_conv_bias": True, "mamba_proj_bias": False}
        return tiny_family("jamba", seed, layers=4, extra=extra)
    assert_greedy_equals_autoregressive(tiny_jamba(0), tiny_jamba(1), method, opts)


def test_jamba_config_reads_its_layers_as_transformers_reads_them():
    want = transformers.JambaConfig()
    c = LlamaConfig.from_dict({"model_type": "jamba"})
    assert c.mamba1.layers == tuple(t == "mamba" for t in want.layers_block_type)
    assert c.experts.layers == tuple(n > 1 for n in want.layers_num_experts)
    assert (c.mamba1.dt_rank, c.mamba1.inner, c.experts.count, c.experts.top_k) == (
        want.mamba_dt_rank, want.mamba_expand * want.hidden_size, want.num_experts, want.num_experts_per_tok)
    with pytest.raises(ValueError, match="attn_layer_period"):
        LlamaConfig.from_dict({"model_type": "jamba", "attn_layer_period": 0})


@pytest.mark.parametrize("kw", [{}, dict(num_experts=1, attn_layer_offset=0, mamba_conv_bias=False)],
                         ids=["mixture", "dense-attention-first"])
def test_gguf_jamba_as_llama_cpp_writes_it(tmp_path, kw):
    """A jamba GGUF (JambaModel's converter: head_count_kv per layer, 0 on the Mamba layers; ssm.* keys; a router
    tensor where a layer is a mixture, the experts stacked; A as -exp(A_log), the convolution squeezed, dt / B / C's
    norms as ssm_*_norm; no RoPE, q / k as they are) loads with transformers' logits; Q8_0 / Q5_0 blocks bitwise; a
    pattern of attention layers no period gives raises."""
    import dataclasses
    import math

    from .test_families import assert_gguf_file_loads, write_converted_gguf

    hf, ours = drawn_pair("Jamba", "mamba", std=0.1, **{**JAMBA, "vocab_size": 112, **kw})
    c = hf.config
    n = c.num_hidden_layers
    kv_heads = [c.num_key_value_heads if i % c.attn_layer_period == c.attn_layer_offset else 0 for i in range(n)]
    kv = {"context_length": c.max_position_embeddings, "embedding_length": c.hidden_size,
          "feed_forward_length": c.intermediate_size, "attention.head_count": c.num_attention_heads,
          "attention.head_count_kv": kv_heads, "block_count": n, "ssm.conv_kernel": c.mamba_d_conv,
          "ssm.inner_size": c.mamba_expand * c.hidden_size, "ssm.state_size": c.mamba_d_state,
          "ssm.time_step_rank": ours.config.mamba1.dt_rank,
          "attention.layer_norm_rms_epsilon": float(c.rms_norm_eps), "vocab_size": c.vocab_size,
          **({"expert_count": c.num_experts, "expert_used_count": c.num_experts_per_tok} if c.num_experts > 1
             else {})}
    tensors = {}  # (the experts stacked as the converter writes them)
    for key, t in hf.state_dict().items():
        if key.startswith("model.layers."):
            stacked_experts_gguf(tensors, key, t.detach().float(), int(key.split(".")[2]))

    def convert(key, t):
        if key.endswith(("experts.gate_up_proj", "experts.down_proj")):
            return None
        return -torch.exp(t) if key.endswith("A_log") else t.squeeze(1) if key.endswith("conv1d.weight") else t

    loaded = assert_gguf_file_loads(hf, lambda path, quant: write_converted_gguf(
        path, hf, "jamba", kv, tensors=tensors, convert=convert, quant=quant), tmp_path, 112)
    got, want = loaded.config.mamba1, ours.config.mamba1  # (the file's eps a float32)
    assert loaded.config.model_type == "jamba" and dataclasses.replace(got, bcdt_eps=want.bcdt_eps) == want
    assert math.isclose(got.bcdt_eps, want.bcdt_eps, rel_tol=1e-6)
    assert loaded.config.experts == ours.config.experts and loaded.config.kv_heads_per_layer == tuple(kv_heads)
    if not kw:
        bad = write_converted_gguf(tmp_path / "bad.gguf", hf, "jamba", {**kv, "attention.head_count_kv": [
            2, 2, 0, 2]}, tensors=tensors, convert=convert)
        with pytest.raises(ValueError, match="every n-th layer"):
            Llama.from_pretrained(bad, cache_dir=False)
