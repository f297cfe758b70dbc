"""FP8 checkpoints (``quantization_config`` ``{"quant_method": "fp8", ...}``: DeepSeek-V3 / R1 as shipped, Qwen3
*-FP8, GLM-4.5-FP8, Ministral 3): each float8 weight times its ``*_scale_inv`` (per block or per tensor) dequantised
on loading, against transformers' dequantised models (``FineGrainedFP8Config``, which dequantises without a GPU)
and a loop over the blocks."""
import json

import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

import triforce
from triforce.models import FullCache, Llama, LlamaConfig
from triforce.models.llama import _rowwise_available
from triforce.models.loading import _build, dequantize_fp8

from .test_families import TINY, randomize_
from .test_model import TOL

transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

DEEPSEEK_V3_FP8 = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                   "weight_block_size": [128, 128]}  # DeepSeek-V3's config.json
QWEN3_FP8 = {"activation_scheme": "dynamic", "modules_to_not_convert": ["lm_head"], "fmt": "e4m3",
             "quant_method": "fp8", "weight_block_size": [128, 128]}  # Qwen3-8B-FP8's
MINISTRAL3_FP8 = {"activation_scheme": "static", "dequantize": False, "quant_method": "fp8",
                  "modules_to_not_convert": ["model.vision_tower", "model.multi_modal_projector", "lm_head",
                                             "model.multi_modal_projector.linear_1"],
                  "weight_block_size": None}  # Ministral 3's: per tensor, static activation scales


def quantize_fp8(w: torch.Tensor, block=None):
    """(float8_e4m3fn weights, float32 scales) of ``w`` ``[R, C]``: per ``block`` (the last partial) or per tensor,
    each scale its block's largest magnitude / 448 (e4m3's largest)."""
    if block is None:
        s = w.abs().max().float().clamp_min(1e-12) / 448
        return (w.float() / s).to(torch.float8_e4m3fn), s.reshape(())
    R, C = w.shape
    (b0, b1), gr, gc = block, -(-R // block[0]), -(-C // block[1])
    padded = torch.zeros(gr * b0, gc * b1)
    padded[:R, :C] = w.float()
    s = padded.reshape(gr, b0, gc, b1).abs().amax((1, 3)).clamp_min(1e-12) / 448
    q = (padded.reshape(gr, b0, gc, b1) / s[:, None, :, None]).reshape(gr * b0, gc * b1)[:R, :C]
    return q.to(torch.float8_e4m3fn), s


def dequantize_by_loop(q, s, block, dtype):
    """``dequantize_fp8``'s reference: every weight ``[r, c]`` times ``s[r // b0, c // b1]`` (its block's scale,
    looked up by index), rounded to ``dtype``."""
    if s.numel() == 1:
        return (q.float() * s.float().reshape(())).to(dtype)
    R, C = q.shape[-2:]
    rows, cols = torch.arange(R) // block[0], torch.arange(C) // block[1]
    return (q.float() * s.float()[..., rows, :][..., cols]).to(dtype)


def is_quantised(name: str, t: torch.Tensor) -> bool:
    """Whether an FP8 checkpoint holds ``name`` in float8: every linear layer's weight but a router's (as
    DeepSeek-V3's and Qwen3-FP8's)."""
    return t.dim() == 2 and name.endswith(("proj.weight", ".w1.weight", ".w2.weight", ".w3.weight",
                                           "indexer.wq_b.weight", "indexer.wk.weight")) \
        and not name.endswith("weights_proj.weight") \
        or name.endswith("kv_a_proj_with_mqa.weight")  # (Mixtral's names: MiniMax-M2's; DeepSeek-V3.2's indexer)


def write_fp8(directory, quantization_config, block, shards: int = 1, static: bool = False) -> dict:
    """Replaces the float checkpoint in ``directory`` by its FP8 one (``block`` x ``block`` scales, or per tensor;
    ``static``: an activation_scale beside each weight, as Ministral 3's), in ``shards`` files with an index
    (each weight's scales in the next shard), the config's quantization_config set; -> the dequantised weights."""
    path = directory / "model.safetensors"
    sd, out, dequantised = safetensors_torch.load_file(path), {}, {}
    for name, t in sd.items():
        if is_quantised(name, t):
            q, s = quantize_fp8(t, block)
            out[name], out[name + "_scale_inv"] = q, s
            dequantised[name] = dequantize_by_loop(q, s, block, torch.float32)
            if static:
                out[name[:-len("weight")] + "activation_scale"] = torch.tensor(0.02)
        else:
            out[name] = t
    path.unlink()
    names = list(out)
    files = {name: f"model-{(i + name.endswith('_scale_inv')) % shards + 1:05d}-of-{shards:05d}.safetensors"
             for i, name in enumerate(names)}
    for f in set(files.values()):
        safetensors_torch.save_file({n: out[n].contiguous() for n in names if files[n] == f}, directory / f)
    if shards > 1:
        (directory / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": files}))
    else:
        (directory / next(iter(files.values()))).rename(path)
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "quantization_config": quantization_config}))
    return dequantised


CASES = {
    # DeepSeek-V3: 16 x 16 blocks; latent attention, experts each quantised, the router not
    "deepseek_v3": ("DeepseekV3", dict(TINY, num_hidden_layers=3, num_key_value_heads=4, kv_lora_rank=32,
                                       qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=16, q_lora_rank=32,
                                       n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                       first_k_dense_replace=1, n_group=2, topk_group=1),
                    {**DEEPSEEK_V3_FP8, "weight_block_size": [16, 16]}),
    # DeepSeek-V3.2: V3's, the indexer's query and key projections quantised too (its head weights not); 16 heads
    # (with few, a key every head scores 0 is common: equal scores, which transformers' topk picks either of)
    "deepseek_v32": ("DeepseekV32", dict(TINY, num_hidden_layers=3, num_key_value_heads=4, kv_lora_rank=32,
                                         qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=16, q_lora_rank=32,
                                         n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                         first_k_dense_replace=1, n_group=2, topk_group=1, index_topk=6,
                                         index_head_dim=32, index_n_heads=16),
                     {**DEEPSEEK_V3_FP8, "weight_block_size": [16, 16], "scale_fmt": "ue8m0"}),
    # Qwen3: 32 x 16 blocks over q/k norms
    "qwen3": ("Qwen3", dict(TINY, head_dim=16), {**QWEN3_FP8, "weight_block_size": [32, 16]}),
    # Qwen3-MoE: every expert's projections
    "qwen3_moe": ("Qwen3Moe", dict(TINY, head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32),
                  QWEN3_FP8 | {"weight_block_size": [16, 32]}),
    # MiniMax-M2: its experts under Mixtral's names (w1 / w3 / w2), the router and its correction bias float, as its
    # published quantization_config has them (fmt float8_e4m3fn, modules_to_not_convert)
    "minimax_m2": ("MiniMaxM2", dict(TINY, head_dim=16, num_local_experts=4, num_experts_per_tok=2, rotary_dim=8),
                   {"activation_scheme": "dynamic", "fmt": "float8_e4m3fn", "quant_method": "fp8",
                    "weight_block_size": [16, 16], "modules_to_not_convert": ["gate", "e_score_correction_bias",
                                                                              "lm_head"]}),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", list(CASES))
def test_an_fp8_checkpoint_loads_as_transformers_dequantises_it(tmp_path, case, dtype):
    """An FP8 checkpoint (linear weights float8 with per-block scales) loads with the weights transformers'
    FineGrainedFP8 loading dequantises, bitwise in float32 and bfloat16 (each product in float32, rounded once),
    and (float32) with its logits; what the model saves is float, without the quantization_config."""
    name, kw, quantization = CASES[case]
    torch.manual_seed(0)
    hf = randomize_(getattr(transformers, f"{name}ForCausalLM")(getattr(transformers, f"{name}Config")(**kw)))
    hf.save_pretrained(tmp_path / "ckpt")
    dequantised = write_fp8(tmp_path / "ckpt", quantization, quantization["weight_block_size"])
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt", dtype=dtype).eval()
    ours = Llama.from_pretrained(tmp_path / "ckpt", dtype=dtype)
    theirs_sd = theirs.state_dict()
    named = [key for key in dequantised if key in theirs_sd]  # (transformers stacks the experts: checked below)
    assert len(named) >= 8
    for key in named:  # transformers' weights: the loop's
        assert torch.equal(theirs_sd[key], dequantised[key].to(dtype)), key
    # ours: those of the model built on transformers' weights (DeepSeek's RoPE rows in our order), bitwise
    want = _build(LlamaConfig.from_dict(theirs.config.to_dict()), theirs_sd, None, dtype).state_dict()
    mine = ours.state_dict()
    assert mine.keys() == want.keys() and all(torch.equal(mine[k], want[k]) for k in mine)
    if dtype == torch.float32:  # (transformers' bfloat16 DeepSeek-V3 mixes dtypes in its forward on the CPU)
        ids = torch.randint(0, 101, (2, 24), generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            assert (ours(ids) - theirs(input_ids=ids).logits).abs().max().item() <= TOL
    assert "quantization_config" not in ours.config.to_dict()
    ours.save_pretrained(tmp_path / "float")
    back = Llama.from_pretrained(tmp_path / "float", dtype=dtype).state_dict()
    assert all(torch.equal(back[k], mine[k]) for k in mine)


def test_ministral3_fp8_per_tensor_with_static_activation_scales(tmp_path):
    """Ministral 3 as Mistral ships it (a mistral3 image + text checkpoint, the wrapper's quantization_config: per
    tensor scales, static activation scales): it loads as transformers dequantises it (the activation scales,
    which round the activations in an FP8 matmul, dropped), with its logits; sharded, each scale in another file
    than its weight, the same."""
    from .test_ministral3 import MINISTRAL3
    from .test_mistral3 import VISION

    config = transformers.Mistral3Config(text_config={**MINISTRAL3, "model_type": "ministral3"}, vision_config=VISION,
                                         image_token_index=100)
    torch.manual_seed(0)
    hf = randomize_(transformers.Mistral3ForConditionalGeneration(config).eval())
    ids = torch.randint(0, 100, (2, 24), generator=torch.Generator().manual_seed(1))
    for shards in (1, 3):
        directory = tmp_path / f"ckpt{shards}"
        hf.save_pretrained(directory)
        dequantised = write_fp8(directory, MINISTRAL3_FP8, None, shards=shards, static=True)
        theirs = transformers.AutoModelForImageTextToText.from_pretrained(directory).eval()
        ours = Llama.from_pretrained(directory)
        assert ours.config.model_type == "ministral3"
        for key, w in dequantised.items():
            if key.startswith("model.language_model."):
                assert torch.equal(ours.state_dict()["model." + key[len("model.language_model."):]], w), key
        with torch.no_grad():
            assert (ours(ids) - theirs(input_ids=ids).logits).abs().max().item() <= TOL


def test_partial_blocks_take_their_own_scale(tmp_path):
    """DeepSeek-V3's shapes are not all multiples of its 128 x 128 blocks (``kv_a_proj_with_mqa``: 576 rows, 5
    blocks): the last block of a row or column takes its own scale, as DeepSeek's ``weight_dequant`` has it
    (transformers refuses such shapes). Here every weight's last block is partial (12 x 12 blocks): the model
    is the float model holding the loop's dequantised weights, bitwise."""
    torch.manual_seed(0)
    kw = {**CASES["deepseek_v3"][1], "kv_lora_rank": 20, "qk_rope_head_dim": 8, "moe_intermediate_size": 28}
    hf = randomize_(transformers.DeepseekV3ForCausalLM(transformers.DeepseekV3Config(**kw)))
    hf.save_pretrained(tmp_path)
    dequantised = write_fp8(tmp_path, {**DEEPSEEK_V3_FP8, "weight_block_size": [12, 12]}, (12, 12))
    assert any(w.shape[0] % 12 and w.shape[1] % 12 for w in dequantised.values())
    ours = Llama.from_pretrained(tmp_path)
    sd = {k: v for k, v in safetensors_torch.load_file(tmp_path / "model.safetensors").items()
          if not k.endswith("_scale_inv")}
    plain = _build(ours.config, {**sd, **dequantised}, None, None)
    ids = torch.randint(0, 101, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(ours(ids), plain(ids))


@given(lead=st.lists(st.integers(1, 2), max_size=1), R=st.integers(1, 20), C=st.integers(1, 20),
       b0=st.integers(1, 8), b1=st.integers(1, 8),
       scales=st.sampled_from(["float32", "bfloat16", "ue8m0", "float8_e8m0fnu"]),
       dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]), seed=st.integers(0, 2**16))
def test_dequantize_fp8_is_the_loop_over_blocks(lead, R, C, b0, b1, scales, dtype, seed):
    """``dequantize_fp8`` = each weight times its block's scale by index (partial last blocks included, stacked weights
    [E, R, C] block by block), rounded once to ``dtype``: float32, 16-bit and UE8M0 (exponent bytes: uint8 or
    float8_e8m0fnu) scales; a
    single scale serves the whole tensor."""
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(*lead, R, C, generator=g) * 100).to(torch.float8_e4m3fn)
    grid = (*lead, -(-R // b0), -(-C // b1))
    if scales in ("ue8m0", "float8_e8m0fnu"):  # exponent bytes, as uint8 or as float8_e8m0fnu
        s = torch.randint(110, 140, grid, generator=g, dtype=torch.uint8)
        as_float = (s.float() - 127).exp2()
        s = s if scales == "ue8m0" else s.view(torch.float8_e8m0fnu)
    else:
        s = (torch.rand(grid, generator=g) + 0.01).to(getattr(torch, scales))
        as_float = s.float()
    assert torch.equal(dequantize_fp8(q, s, (b0, b1), dtype), dequantize_by_loop(q, as_float, (b0, b1), dtype))
    one = as_float.flatten()[:1]
    assert torch.equal(dequantize_fp8(q, s.flatten()[:1], (b0, b1), dtype), (q.float() * one).to(dtype))


def test_dequantize_fp8_chunks_large_weights():
    """A weight of more than one chunk of rows (~4M products) gives the products of one pass."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2100, 2050, generator=g).to(torch.float8_e4m3fn)
    s = torch.rand(-(-2100 // 128), -(-2050 // 128), generator=g) + 0.5
    full = s.repeat_interleave(128, 0)[:2100].repeat_interleave(128, 1)[:, :2050]
    assert torch.equal(dequantize_fp8(q, s, (128, 128), torch.bfloat16), (q.float() * full).to(torch.bfloat16))


def test_bad_fp8_checkpoints_raise(tmp_path):
    """A weight without its scales, scales without their weight, scales of the wrong grid, float8 weights under a
    config without an fp8 quantization_config, a float weight with scales, and quantization configs this does not
    dequantise (other formats, FP4 experts, unknown keys) raise, naming what is wrong."""
    torch.manual_seed(0)
    hf = randomize_(transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**TINY, head_dim=16)))
    hf.save_pretrained(tmp_path)
    write_fp8(tmp_path, QWEN3_FP8 | {"weight_block_size": [16, 16]}, (16, 16))
    Llama.from_pretrained(tmp_path)
    good = safetensors_torch.load_file(tmp_path / "model.safetensors")
    config = json.loads((tmp_path / "config.json").read_text())
    w = "model.layers.1.mlp.down_proj.weight"

    def raises(sd, match, quantization=config["quantization_config"]):
        safetensors_torch.save_file(sd, tmp_path / "model.safetensors")
        (tmp_path / "config.json").write_text(json.dumps({**config, "quantization_config": quantization}))
        with pytest.raises(ValueError, match=match):
            Llama.from_pretrained(tmp_path)

    raises({k: v for k, v in good.items() if k != w + "_scale_inv"}, f"{w}_scale_inv beside it")
    raises({k: v for k, v in good.items() if k != w}, f"float8 weight {w} beside it")
    raises({**good, w + "_scale_inv": good[w + "_scale_inv"][:, :1].contiguous()}, r"one per 16 x 16 block, \[4, 6\]")
    raises(good, "no quantization_config", None)
    raises(good, r"one scale \(quantization_config weight_block_size null\)", {**QWEN3_FP8, "weight_block_size": None})
    raises({**good, w: good[w].float()}, f"no float8 weight {w} beside it \\({w} is torch.float32\\)")
    with pytest.raises(ValueError, match="must be float8"):
        dequantize_fp8(torch.ones(2, 2), torch.ones(()))
    for bad in ({"quant_method": "fp8", "fmt": "e5m2"}, {"quant_method": "fp8", "activation_scheme": "tensor"},
                {"quant_method": "fp8", "weight_block_size": [128]}, {"quant_method": "fp8", "expert_dtype": "fp4"},
                {"quant_method": "fp8", "group_size": 128}):
        with pytest.raises(ValueError, match="'quantization_config'"):
            LlamaConfig.from_dict({**config, "quantization_config": bad})


def test_published_fp8_configs_read():
    """The quantization_configs of DeepSeek-V3, DeepSeek-V3.1 (UE8M0 scales), Qwen3-FP8, GLM-4.5-FP8 (no block
    size: FineGrainedFP8Config's 128 x 128), MiniMax's (``ignored_layers``) and Ministral 3 are read; the config
    writes none back (what the model holds is float)."""
    for q in (DEEPSEEK_V3_FP8, {**DEEPSEEK_V3_FP8, "scale_fmt": "ue8m0"}, QWEN3_FP8, MINISTRAL3_FP8,
              {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8"},
              {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "ignored_layers": ["lm_head"],
               "weight_block_size": [128, 128]}):
        c = LlamaConfig.from_dict({**TINY, "model_type": "qwen3", "quantization_config": q})
        assert c.extra["quantization_config"] == q and "quantization_config" not in c.to_dict()


# ---- an FP8 checkpoint on its own float8 weights (quant.load_fp8, Fp8Linear, triforce_C::rowwise_linear_fp8)

needs_fp8_kernel = pytest.mark.skipif(not (_rowwise_available()
                                           and hasattr(torch.ops.triforce_C, "rowwise_linear_fp8")),
                                      reason="the C++ extension is not built")
FINITE_CODES = torch.tensor([c for c in range(256) if c & 0x7F != 0x7F], dtype=torch.uint8)  # (0x7f, 0xff: NaN)


def fp8_product(x, q, s, bc):
    """The kernel on float8_e4m3fn ``q`` with scales ``s`` per row and ``bc`` columns (packed here, the scales per
    chunk of 64 columns: quant.pack_fp8, fp8_chunk_scales)."""
    from triforce.models.quant import fp8_chunk_scales, pack_fp8

    return torch.ops.triforce_C.rowwise_linear_fp8(x, pack_fp8(q), fp8_chunk_scales(s, bc, q.shape[1]))


@needs_fp8_kernel
@given(M=st.integers(0, 9), N=st.integers(0, 40), K=st.integers(1, 300), bc=st.sampled_from([64, 128, 192, 0]),
       seed=st.integers(0, 2**31 - 1))
@example(M=1, N=1536, K=576, bc=128, seed=0)  # (a partial last block of columns: 576 = 4.5 blocks)
@example(M=5, N=7, K=33, bc=64, seed=2)  # a masked tail, a partial block of weight rows
def test_rowwise_linear_fp8_is_rowwise_linear_on_the_dequantised_weight(M, N, K, bc, seed):
    """Every finite e4m3fn code (subnormals, both zeros, the largest) times its block's scale, then the float32
    kernel's arithmetic: bitwise ``rowwise_linear`` on ``dequantize_fp8``'s float32 weight, and row m of an M-row
    product bitwise its 1-row product; ``bc`` 0: one block a row (at least K columns, any width)."""
    g = torch.Generator().manual_seed(seed)
    bc = bc or K + int(torch.randint(0, 5, (1,), generator=g))
    q = FINITE_CODES[torch.randint(0, len(FINITE_CODES), (N, K), generator=g)].view(torch.float8_e4m3fn)
    s = torch.rand(N, -(-K // bc), generator=g) * 4 - 1  # (negative and tiny scales too)
    x = torch.randn(M, K, generator=g)
    out = fp8_product(x, q, s, bc)
    want = torch.ops.triforce_C.rowwise_linear(x, dequantize_fp8(q, s, (1, bc), torch.float32))
    assert out.shape == (M, N) and torch.equal(out, want)
    for m in range(M):
        assert torch.equal(fp8_product(x[m:m + 1], q, s, bc)[0], out[m])


@needs_fp8_kernel
def test_rowwise_linear_fp8_nan_codes_and_bad_arguments():
    """The NaN codes (0x7f, 0xff) give NaN as torch's conversion does; scales at float32's ends (2^8 s past its
    range, subnormal s) the products of the dequantised weight; misshapen or mistyped operands raise."""
    for M in (2, 6):  # (one group of rows: decoded in registers; more: into a buffer)
        x = torch.randn(M, 200)
        q = torch.zeros(8, 200, dtype=torch.uint8)
        q[1, 5], q[2, 130], q[7, 199] = 0x7F, 0xFF, 0x7F
        out = fp8_product(x, q.view(torch.float8_e4m3fn), torch.ones(8, 4), 64)
        assert out[:, [0, 3, 4, 5, 6]].eq(0).all() and out[:, [1, 2, 7]].isnan().all()
        # scales at float32's ends (2^8 s overflowing, subnormal s), beside ordinary ones: each product one rounding
        # of the exact one, as torch's
        codes = FINITE_CODES[torch.arange(1600) % len(FINITE_CODES)].reshape(8, 200).view(torch.float8_e4m3fn)
        for scale in (2.0 ** 125, 2.0 ** 127 * 1.5, 1e-40, 2.0 ** -140, 3e38):
            ss = torch.rand(8, 4)
            ss[::3, ::2] = scale
            want = torch.ops.triforce_C.rowwise_linear(x, dequantize_fp8(codes, ss, (1, 64), torch.float32))
            torch.testing.assert_close(fp8_product(x, codes, ss, 64), want, rtol=0, atol=0, equal_nan=True)  # bitwise
    x = torch.randn(2, 32)
    q = torch.zeros(3, 64, dtype=torch.float8_e4m3fn)  # (packed: 32 codes padded to 64)
    op = torch.ops.triforce_C.rowwise_linear_fp8
    for args, match in (((x, q, torch.ones(3, 2)), r"scales must be \[3, 1\]"),
                        ((x, q.view(torch.uint8), torch.ones(3, 1)), "q float8_e4m3fn"),
                        ((x.double(), q, torch.ones(3, 1)), "x float32"),
                        ((x, q[:, :32], torch.ones(3, 1)), "must be 64 codes"),
                        ((x, q, torch.ones(3, 1).double()), "scales float32")):
        with pytest.raises(RuntimeError, match=match):
            op(*args)
    from triforce.models.quant import fp8_chunk_scales, pack_fp8, unpack_fp8

    with pytest.raises(ValueError, match="multiple of 64 or at least 100"):
        fp8_chunk_scales(torch.ones(3, 4), 32, 100)
    assert torch.equal(fp8_chunk_scales(torch.tensor([[1.0, 2.0]]), 128, 200), torch.tensor([[1.0, 1.0, 2.0, 2.0]]))

    codes = FINITE_CODES[torch.randint(0, len(FINITE_CODES), (3, 100))].view(torch.float8_e4m3fn)
    packed = pack_fp8(codes).view(torch.uint8)
    at = [64 * (c // 64) + 16 * (c % 16 // 4) + 4 * (c % 64 // 16) + c % 4 for c in range(128)]  # (code c's byte)
    assert packed.shape == (3, 128) and sorted(at) == list(range(128)) and packed[:, at[100:]].eq(0).all()
    assert torch.equal(unpack_fp8(packed, 100).view(torch.uint8), codes.view(torch.uint8))
    assert packed[0, 16 * 1 + 4 * 2 + 3].item() == codes[0, 16 * 2 + 4 * 1 + 3].view(torch.uint8).item()


def fp8_checkpoint(directory, case: str, block=(16, 16)):
    """transformers' model of ``case`` (CASES) saved to ``directory`` as an FP8 checkpoint of ``block`` blocks."""
    name, kw, quantization = CASES[case]
    torch.manual_seed(0)
    hf = randomize_(getattr(transformers, f"{name}ForCausalLM")(getattr(transformers, f"{name}Config")(**kw)))
    hf.save_pretrained(directory)
    write_fp8(directory, {**quantization, "weight_block_size": list(block)}, block)
    return hf


@needs_fp8_kernel
@pytest.mark.parametrize("case,block", [("deepseek_v3", (16, 64)), ("qwen3", (32, 64)), ("qwen3_moe", (16, 128)),
                                        ("deepseek_v3", (48, 128)), ("minimax_m2", (16, 64)),
                                        ("deepseek_v32", (16, 32))])
def test_an_fp8_checkpoint_runs_on_its_own_weights(tmp_path, monkeypatch, case, block):
    """``load_fp8`` (``load_model(directory, "fp8")``): every linear layer of the checkpoint an Fp8Linear on its
    float8 weights (DeepSeek's RoPE rows reordered, experts' gate and up joined, partial column blocks), its
    weight the float32 model's bitwise; the fused CPU layer takes a dense layer's, ``moe_experts`` a sparse layer's
    experts (one call, the bits of their modules); the logits of every path and every method's tokens bitwise those
    of ``Llama.from_pretrained`` (float32, dequantised)."""
    from triforce.models import hub
    from triforce.models.quant import Fp8Linear

    from .test_gpt_oss import assert_one_moe_experts_call

    fp8_checkpoint(tmp_path / "ckpt", case, block)
    plain = Llama.from_pretrained(tmp_path / "ckpt")
    ours, _ = hub.load_model(str(tmp_path / "ckpt"), "fp8")
    layers = {n: m for n, m in ours.named_modules() if isinstance(m, Fp8Linear)}
    floats = dict(plain.named_modules())
    assert len(layers) >= 14 and all(m.codes.dtype == torch.float8_e4m3fn for m in layers.values())
    for n, m in layers.items():
        assert torch.equal(m.weight, floats[n].weight), n
    # the fused CPU layer takes the layers of a dense model's layer; a sparse layer's experts run in one moe_experts
    # call with the bits of their modules
    layer = ours.model.layers[-1]
    if getattr(layer.mlp, "experts", None) is not None:
        assert_one_moe_experts_call(layer.mlp, monkeypatch)
    elif ours.config.mla is None:
        with torch.no_grad():
            assert layer.fused_arguments(torch.zeros(1, 1, ours.config.hidden_size)) is not None
    assert_runs_as(ours, plain)


def assert_runs_as(ours, plain, vocab: int = 101):
    """``ours`` computes bitwise what ``plain`` computes: a forward, a prefill and one-row steps, and every
    method's tokens."""
    ids = torch.randint(0, vocab, (2, 30), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(ours(ids), plain(ids))
        cache, ref = FullCache(ours.config, 2, 40), FullCache(plain.config, 2, 40)
        assert torch.equal(ours(ids[:, :29], cache=cache), plain(ids[:, :29], cache=ref))
        assert torch.equal(ours(ids[:, 29:], cache=cache), plain(ids[:, 29:], cache=ref))  # one-row steps
    prompts = [ids[0, :9], ids[1, :17]]
    want = triforce.generate(plain, prompts, method="autoregressive", max_new_tokens=10)
    for method, opts in (("autoregressive", {}), ("speculative", {"gamma": 3, "draft_layers": 1}),
                         ("magicdec", {"gamma": 2, "sink": 1, "window": 8})):
        out = triforce.generate(ours, prompts, method=method, max_new_tokens=10, **opts)
        assert all(torch.equal(a, b) for a, b in zip(out.tokens, want.tokens)), method


@needs_fp8_kernel
def test_ministral3_per_tensor_fp8_runs_on_its_own_weights(tmp_path):
    """Ministral 3's per-tensor scales (a mistral3 checkpoint, static activation scales): one block a row, the
    float32 model's logits bitwise."""
    from triforce.models.quant import Fp8Linear, load_fp8

    from .test_ministral3 import MINISTRAL3
    from .test_mistral3 import VISION

    config = transformers.Mistral3Config(text_config={**MINISTRAL3, "model_type": "ministral3"}, vision_config=VISION,
                                         image_token_index=100)
    torch.manual_seed(0)
    randomize_(transformers.Mistral3ForConditionalGeneration(config)).save_pretrained(tmp_path)
    write_fp8(tmp_path, MINISTRAL3_FP8, None, static=True)
    ours, plain = load_fp8(tmp_path), Llama.from_pretrained(tmp_path)
    layers = [m for m in ours.modules() if isinstance(m, Fp8Linear)]
    assert len(layers) == 21 and all(m.scales.eq(m.scales[:, :1]).all() for m in layers)  # (one scale a tensor)
    ids = torch.randint(0, 100, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(ours(ids), plain(ids))


def test_load_fp8_errors(tmp_path, monkeypatch):
    """A directory without an fp8 quantization_config, or a GPU device, raises before anything loads; column
    blocks the kernel cannot take (48 wide: not whole chunks of 64) stay float32, dequantised."""
    from triforce.models import hub
    from triforce.models.quant import Fp8Linear, load_fp8

    fp8_checkpoint(tmp_path / "ckpt", "qwen3", (16, 48))
    ours, plain = load_fp8(tmp_path / "ckpt"), Llama.from_pretrained(tmp_path / "ckpt")
    assert not any(isinstance(m, Fp8Linear) for m in ours.modules())
    with torch.no_grad():
        ids = torch.randint(0, 101, (1, 12), generator=torch.Generator().manual_seed(1))
        assert torch.equal(ours(ids), plain(ids))
    plain.save_pretrained(tmp_path / "float")
    for bad in (tmp_path / "float", tmp_path / "missing"):
        with pytest.raises(ValueError, match="not a checkpoint directory with an fp8 quantization_config"):
            load_fp8(bad)
        with pytest.raises(ValueError, match="fp8 quantization_config"):
            hub.load_model(str(bad), "fp8")
    monkeypatch.setattr(hub, "device_of", lambda name: torch.device("cuda", 0))  # as on a machine with a GPU
    with pytest.raises(ValueError, match="'fp8' runs on the CPU only"):
        hub.load_model(str(tmp_path / "ckpt"), "fp8", device="cuda")
    assert hub.load_draft(str(tmp_path / "ckpt"), "fp8").config == plain.config


@needs_fp8_kernel
def test_the_cli_runs_an_fp8_checkpoint_on_its_own_weights(tmp_path, capsys):
    """``triforce generate --dtype fp8`` on an FP8 checkpoint directory prints the float32 model's text, with every
    method (an int8 draft of it, too); ``--dtype fp8`` on a float checkpoint fails naming the directory."""
    from .test_cli import VOCAB, _word_tokenizer, run

    torch.manual_seed(0)
    model = Llama(LlamaConfig(vocab_size=len(VOCAB), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256))
    with torch.no_grad():
        model.lm_head.weight.normal_(0, 1)
    model.save_pretrained(tmp_path / "float")
    model.save_pretrained(tmp_path / "fp8")
    write_fp8(tmp_path / "fp8", QWEN3_FP8 | {"weight_block_size": [16, 64]}, (16, 64))
    for d in ("float", "fp8"):
        _word_tokenizer().save(str(tmp_path / d / "tokenizer.json"))
    args = ["generate", "--prompt", "the cat sat on a mat", "--max-new-tokens", "12"]
    rc, want, _ = run([*args, "--model", str(tmp_path / "fp8")], capsys)  # (float32, dequantised)
    assert rc == 0 and want.split()
    for extra in ([], ["--method", "speculative", "--draft", "int8", "--gamma", "3"],
                  ["--method", "magicdec", "--gamma", "2", "--window", "8"]):
        rc, out, err = run([*args, "--model", str(tmp_path / "fp8"), "--dtype", "fp8", *extra], capsys)
        assert rc == 0 and out == want, (extra, err)
    rc, _, err = run([*args, "--model", str(tmp_path / "float"), "--dtype", "fp8"], capsys)
    assert rc != 0 and "fp8 quantization_config" in err and "float" in err  # (as --dtype gguf on a directory)


@needs_fp8_kernel
def test_ue8m0_scales_run_on_the_fp8_kernel(tmp_path):
    """UE8M0 scales (DeepSeek-V3.1's ``scale_fmt`` ue8m0: exponent bytes, uint8 or float8_e8m0fnu) keep their
    weights on Fp8Linear as the powers of two they are: the float32 model's logits bitwise."""
    from triforce.models.quant import Fp8Linear, load_fp8

    fp8_checkpoint(tmp_path, "qwen3", (16, 64))
    path = tmp_path / "model.safetensors"
    sd = safetensors_torch.load_file(path)
    names = sorted(k for k in sd if k.endswith("_scale_inv"))
    for i, k in enumerate(names):  # each scale the exponent byte of a power of two near it
        e = (sd[k].float().log2().round() + 127).clamp(1, 254).to(torch.uint8)
        sd[k] = e if i % 2 else e.view(torch.float8_e8m0fnu)
    safetensors_torch.save_file(sd, path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["quantization_config"]["scale_fmt"] = "ue8m0"
    (tmp_path / "config.json").write_text(json.dumps(config))
    ours, plain = load_fp8(tmp_path), Llama.from_pretrained(tmp_path)
    layers = {n: m for n, m in ours.named_modules() if isinstance(m, Fp8Linear)}
    assert len(layers) == 14
    floats = dict(plain.named_modules())
    assert all(torch.equal(m.weight, floats[n].weight) for n, m in layers.items())
    ids = torch.randint(0, 101, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(ours(ids), plain(ids))
