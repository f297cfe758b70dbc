"""The engines and the model layer on CUDA tensors (skipped without a GPU).

The engines take their device from the prompts, and the model layer calls the public ops, which pick the
GPU backends (Triton, the CUDA samplers) for CUDA tensors: so on a GPU every method runs its real GPU
path. Checked here, as on the CPU in tests/test_engines.py: every method's greedy output equals the
autoregressive greedy output on the same device, on tiny random models with ragged batches and on the
embedded SmolLM2-135M; a sampled run is reproducible from its seed; and the model's logits on the GPU
agree with its logits on the CPU.
"""
from __future__ import annotations

import pytest
import torch

import triforce
from tests.test_engines import LONGROPE, SMOL_CASES, TINY_CASES, load_smollm2, ragged_prompts, tiny

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
DEV = torch.device("cuda")


@pytest.fixture(scope="module")
def tiny_models_cuda():
    return tiny(0).to(DEV), tiny(1).to(DEV)


@pytest.mark.parametrize("method,opts", TINY_CASES, ids=[f"{m}-{i}" for i, (m, _) in enumerate(TINY_CASES)])
def test_greedy_equals_autoregressive_tiny_ragged_cuda(tiny_models_cuda, method, opts):
    target, draft = tiny_models_cuda
    prompts = ragged_prompts(DEV)
    ref = triforce.generate(target, prompts, method="autoregressive", max_new_tokens=37)
    out = triforce.generate(target, prompts, method=method, max_new_tokens=37,
                            draft=draft if method in ("speculative", "triforce") else None, **opts)
    for b in range(len(prompts)):
        assert out.tokens[b].device.type == DEV.type and out.tokens[b].shape == (37,)
        assert torch.equal(out.tokens[b], ref.tokens[b]), (b, out.tokens[b], ref.tokens[b])


@pytest.mark.parametrize("method,opts", [("speculative", {"gamma": 4}), ("tree", {"tree": (3, 2, 1, 1)}),
                                         ("triforce", {"gamma1": 2, "gamma2": 5, "budget": 12, "chunk_size": 4})])
def test_prompt_lookup_greedy_equals_autoregressive_cuda(tiny_models_cuda, method, opts):
    """Prompt lookup's chains and trees (and as TriForce's bottom level) on the GPU: padded passes, autoregressive
    decoding's tokens; with ragged passes switched on (``TRIFORCE_RAGGED_PASSES=1``: the padding computed and its
    logits zeroed on a GPU) too."""
    from tests.test_lookup import repetitive_prompts

    target, _ = tiny_models_cuda
    prompts = [p.to(DEV) for p in repetitive_prompts()]
    ref = triforce.generate(target, prompts, method="autoregressive", max_new_tokens=37)
    for ragged in ("0", "1"):
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("TRIFORCE_RAGGED_PASSES", ragged)
            out = triforce.generate(target, prompts, method=method, draft="lookup", max_new_tokens=37, **opts)
        assert [t.tolist() for t in out.tokens] == [t.tolist() for t in ref.tokens], ragged


@pytest.mark.parametrize("method,opts", [c for c in TINY_CASES if c[0] != "speculative"][:4])
def test_sampling_is_reproducible_cuda(tiny_models_cuda, method, opts):
    target, draft = tiny_models_cuda
    prompts = ragged_prompts(DEV)
    kw = dict(method=method, max_new_tokens=24, temperature=0.8, draft=draft if method == "triforce" else None, **opts)
    a = triforce.generate(target, prompts, seed=11, **kw)
    b = triforce.generate(target, prompts, seed=11, **kw)
    for x, y in zip(a.tokens, b.tokens):
        assert torch.equal(x, y)
        assert ((x >= 0) & (x < 64)).all()


@pytest.fixture(scope="module")
def smol_cuda():
    model, tok = load_smollm2()
    from triforce.demo import natural_prompt

    prompts = [torch.tensor(natural_prompt(tok, n, offset=o)) for n, o in ((41, 0), (67, 9000), (52, 31000))]
    return model, prompts


def test_smollm2_logits_cuda_match_cpu(smol_cuda):
    model, prompts = smol_cuda
    ids = prompts[1].view(1, -1)
    want = model(ids).double()
    gpu = model.to(DEV)
    try:
        got = gpu(ids.to(DEV)).double().cpu()
    finally:
        model.to("cpu")
    err = (got - want).norm() / want.norm()
    assert err < 1e-4, err
    assert torch.equal(got[0, -1].argmax(), want[0, -1].argmax())


@pytest.mark.parametrize("method,opts", SMOL_CASES, ids=[f"{m}-{i}" for i, (m, _) in enumerate(SMOL_CASES)])
def test_greedy_equals_autoregressive_smollm2_cuda(smol_cuda, method, opts):
    model, prompts = smol_cuda
    model = model.to(DEV)
    try:
        prompts = [p.to(DEV) for p in prompts]
        ref = triforce.generate(model, prompts, method="autoregressive", max_new_tokens=20)
        out = triforce.generate(model, prompts, method=method, max_new_tokens=20, **opts)
        for b in range(len(prompts)):
            assert torch.equal(out.tokens[b], ref.tokens[b]), (method, b, out.tokens[b], ref.tokens[b])
        assert out.stats["mean_accepted"] >= 1.0
    finally:
        model.to("cpu")


@pytest.mark.parametrize("family", ["mistral", "gemma2", "longrope", "smollm3", "ministral3", "granite", "qwen3_moe",
                                    "olmo2", "olmo3", "glm4", "exaone4", "cohere", "cohere2", "seed_oss", "ernie4_5"])
@pytest.mark.parametrize("method,opts", TINY_CASES, ids=[f"{m}-{i}" for i, (m, _) in enumerate(TINY_CASES)])
def test_windowed_and_capped_models_greedy_cuda(family, method, opts):
    """Sliding windows (a tiny Mistral, window 8), soft-capped scores and logits (a tiny Gemma 2, every other layer
    windowed), LongRoPE (rows on either factor set, in captured CUDA graphs), SmolLM3's NoPE layers and Ministral 3's
    query temperature (per-layer RoPE tables and a per-position query scale in the graphs), Granite's multipliers (the
    residual one off the fused elementwise kernel), a mixture of experts (Qwen3-MoE: eager, its routing read on the
    host, the CUDA graphs declined), OLMo 3's post-norms and two RoPEs, GLM-4's half-head RoPE and q/k/v biases, EXAONE
    4's NoPE layers beside sliding ones, Cohere's and Cohere 2's parallel block and LayerNorm, Seed-OSS's biases, ERNIE
    4.5's float32 RoPE: the Triton kernels' window and cap paths through the model layer and every engine, greedy tokens
    equal autoregressive decoding's on the GPU."""
    if family == "smollm3":
        from tests.test_smollm3 import tiny_smollm3 as make
    elif family == "ministral3":
        from tests.test_ministral3 import tiny_ministral3 as make
    elif family == "granite":
        from tests.test_granite import tiny_granite as make
    elif family == "qwen3_moe":
        from tests.test_moe import tiny_moe as make
    elif family == "ernie4_5":
        from tests.test_ernie4_5 import tiny_ernie4_5 as make
    elif family == "seed_oss":
        from tests.test_seed_oss import tiny_seed_oss as make
    elif family == "cohere":
        from tests.test_cohere import tiny_cohere as make
    elif family == "cohere2":
        from tests.test_cohere2 import tiny_cohere2 as make
    elif family == "exaone4":
        from tests.test_exaone4 import tiny_exaone4 as make
    elif family == "glm4":
        from tests.test_glm4 import tiny_glm4 as make
    elif family in ("olmo2", "olmo3"):
        from tests.test_olmo import tiny_olmo

        def make(seed):
            return tiny_olmo(family, seed)
    elif family == "mistral":
        from tests.test_retrieval_windows import windowed as make
    elif family == "longrope":
        def make(seed):
            return tiny(seed, rope_scaling=LONGROPE)
    else:
        from tests.test_gemma2 import tiny_gemma2 as make
    prompts = ragged_prompts(DEV)
    target, draft = make(0).to(DEV), make(1).to(DEV)
    ref = triforce.generate(target, prompts, method="autoregressive", max_new_tokens=30)
    out = triforce.generate(target, prompts, method=method, max_new_tokens=30,
                            draft=draft if method in ("speculative", "triforce") else None, **opts)
    for b in range(len(prompts)):
        assert torch.equal(out.tokens[b], ref.tokens[b]), (b, out.tokens[b], ref.tokens[b])
