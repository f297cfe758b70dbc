"""Trained draft heads (triforce.heads, engines/heads.py): lossless tree decoding with every kind
(greedy equality on tiny and real models, the sampled distribution on a tiny model with random heads),
the training path's pseudo-token forward equals decoding's, training steps, checkpoints and errors."""
import json
import math

import numpy as np
import pytest
import torch

import triforce
import triforce_kernels as tk
from triforce.heads import KINDS, load_heads, make_heads, shipped_heads_path
from triforce.engines.heads import heads_for
from triforce.heads.train import TrainConfig, features, losses, step_batch, train
from triforce.models import Llama, LlamaConfig
from triforce.models.cache import FullCache

V = 16


def tiny(seed=0, vocab=64, layers=4, init=0.02):
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      initializer_range=init)
    return Llama(cfg).eval()


def random_heads(model, kind, depth=3, std=0.3, seed=1):
    """Heads with random weights: losslessness must not depend on their quality."""
    torch.manual_seed(seed)
    layered = kind in ("hidden_transfer", "early_exit")
    h = make_heads(kind, model.config, depth=depth, layer=model.config.num_hidden_layers // 2 if layered else None)
    h.init_from(model)
    for p in h.parameters():
        if p.dim() > 1:
            torch.nn.init.normal_(p, std=std)
    return h


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shape", [(2, 2, 1), (1,), (3, 1)])
def test_greedy_equals_autoregressive_tiny(kind, shape):
    m = tiny()
    prompts = [torch.randint(0, 64, (n,), generator=torch.Generator().manual_seed(n)) for n in (9, 17, 5)]
    ref = triforce.generate(m, prompts, method="autoregressive", max_new_tokens=24)
    out = triforce.generate(m, prompts, method="tree", draft=random_heads(m, kind), tree=shape, max_new_tokens=24)
    assert all(torch.equal(a, b) for a, b in zip(out.tokens, ref.tokens))
    assert out.stats["target_passes"] <= 24


@pytest.mark.parametrize("kind", KINDS)
def test_heads_on_a_gemma_target(kind):
    """A Gemma target (its final norm scales by 1 + w): an untrained set's norms start at that factor, and random
    heads' trees give autoregressive's tokens."""
    torch.manual_seed(0)
    m = Llama(LlamaConfig(model_type="gemma", vocab_size=64, hidden_size=32, intermediate_size=64,
                          num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                          max_position_embeddings=256, initializer_range=0.02)).eval()
    with torch.no_grad():
        m.model.norm.weight.normal_(0, 0.3)
    h = random_heads(m, kind)
    norms = [mod for mod in h.modules() if type(mod).__name__ == "RMSNorm"]
    assert all(torch.equal(n.weight, 1 + m.model.norm.weight) for n in norms)
    prompts = [torch.randint(0, 64, (n,), generator=torch.Generator().manual_seed(n)) for n in (9, 17, 5)]
    ref = triforce.generate(m, prompts, method="autoregressive", max_new_tokens=16)
    out = triforce.generate(m, prompts, method="tree", draft=h, tree=(2, 1), max_new_tokens=16)
    assert all(torch.equal(a, b) for a, b in zip(out.tokens, ref.tokens))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_overflowing_heads_change_nothing(kind, dtype):
    """Heads whose drafts overflow (non-finite pseudo tokens of hidden_transfer share the target's pass,
    their values sit in the cache beside the real nodes'): the output is the target's all the same."""
    m = tiny(init=0.3).to(dtype)
    h = random_heads(tiny(init=0.3), kind, depth=2)
    with torch.no_grad():
        for p in h.parameters():
            if p.dim() > 1:
                p.mul_(1e4 if dtype == torch.float16 else math.inf)  # float32: inf weights, NaN states
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    ref = triforce.generate(m, ids, method="autoregressive", max_new_tokens=8)
    out = triforce.generate(m, ids, method="tree", draft=h, tree=(1, 1), max_new_tokens=8)
    assert torch.equal(out.tokens[0], ref.tokens[0])


def test_identity_heads_draft_something():
    """An untrained (identity) medusa set on a model whose next token repeats the current one accepts."""
    m = tiny(vocab=V, init=0.3)
    with torch.no_grad():  # make the target copy its input: the head reads the embedding back
        for layer in m.model.layers:
            layer.mlp.down_proj.weight.zero_()
            layer.self_attn.o_proj.weight.zero_()
        m.lm_head.weight = torch.nn.Parameter(m.model.embed_tokens.weight.clone())
    prompt = torch.tensor([[3, 3, 3, 3]])
    out = triforce.generate(m, prompt, method="tree", draft=make_heads("medusa", m.config, 3).init_from(m),
                            tree=(1, 1, 1), max_new_tokens=16)
    ref = triforce.generate(m, prompt, method="autoregressive", max_new_tokens=16)
    assert torch.equal(out.tokens[0], ref.tokens[0])
    assert out.stats["mean_accepted"] > 2.0, out.stats


# ---- the sampled distribution (chi-square) with random heads on a tiny model
N, P = 3000, 12


@pytest.fixture(scope="module")
def exact34():
    """The target's exact joint distribution of new tokens 3 and 4 (marginal over tokens 1, 2)."""
    m = tiny(seed=0, vocab=V, layers=2, init=0.3)
    prompt = torch.randint(0, V, (P,), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        joint = torch.ones(1, dtype=torch.float64)
        ctx = prompt[None]
        for _ in range(4):  # p(t1..ti) over every prefix: V^i rows
            p = tk.logits_to_probs(m(ctx)[:, -1], 1.0).double()          # [V^(i-1), V]
            joint = (joint[:, None] * p).reshape(-1)
            ctx = torch.cat([ctx.repeat_interleave(V, 0), torch.arange(V).repeat(ctx.shape[0])[:, None]], 1)
    return m, prompt, joint.view(V, V, V, V).sum((0, 1)).numpy()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("build", ["static", "probability"])
def test_sampled_distribution_with_random_heads(exact34, kind, build):
    from tests.test_engines_sampling import chi2_pvalue

    m, prompt, p34 = exact34
    shape = {"tree": (2, 2, 1)} if build == "static" else {"tree_nodes": (2, 2, 2)}
    out = triforce.generate(m, prompt.expand(N, P), method="tree", draft=random_heads(m, kind, std=0.5),
                            max_new_tokens=4, temperature=1.0, seed=7, **shape)
    t = torch.stack(out.tokens).numpy()
    c34 = np.zeros((V, V))
    np.add.at(c34, (t[:, 2], t[:, 3]), 1)
    assert out.stats["acceptance"]["tree->full"] > 0.02  # the heads' drafts were really used
    assert chi2_pvalue(c34, p34) > 1e-3


# ---- the real model with the shipped sets
@pytest.fixture(scope="module")
def smollm2():
    return triforce.models.smollm2_135m()  # installed by the test command, as for tests/test_model_smollm2.py


@pytest.mark.parametrize("kind", KINDS)
def test_greedy_equals_autoregressive_smollm2_shipped(smollm2, kind):
    model, tok = smollm2
    prompts = [torch.tensor(tok.encode(s)) for s in
               ("def fibonacci(n):\n    ", "The capital of France is", "Lists in Python are")]
    ref = triforce.generate(model, prompts, method="autoregressive", max_new_tokens=24)
    out = triforce.generate(model, prompts, method="tree", draft=kind, tree=(2, 2, 1), max_new_tokens=24)
    assert all(torch.equal(a, b) for a, b in zip(out.tokens, ref.tokens))
    # trained heads draft better than the same kind untrained (identity maps: the target's own head)
    shipped = load_heads(shipped_heads_path(model, kind), model)
    untrained = make_heads(kind, model.config, shipped.depth, shipped.layer).init_from(model)
    base = triforce.generate(model, prompts, method="tree", draft=untrained, tree=(2, 2, 1), max_new_tokens=24)
    assert all(torch.equal(a, b) for a, b in zip(base.tokens, ref.tokens))
    assert out.stats["mean_accepted"] > base.stats["mean_accepted"] + 0.1, (out.stats, base.stats)


# ---- training
def assert_perturbed_heads_train_as_they_decode(m):
    """Hidden Transfer heads on ``m`` (depth 3, from layer 1), initialised from it and perturbed: their training
    forward equals decoding (:func:`assert_training_forward_equals_decoding`)."""
    from triforce.heads import make_heads

    h = make_heads("hidden_transfer", m.config, depth=3, layer=1).init_from(m)
    with torch.no_grad():
        for p in h.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    assert_training_forward_equals_decoding(m, h)


def assert_training_forward_equals_decoding(m, h):
    """Hidden Transfer heads ``h`` on model ``m``: their training forward (``upper_forward`` over a text's
    features) gives, at each anchor, the pseudo tokens' hidden states that decoding computes there (a prefill
    to the anchor, then one step with the heads tapped)."""
    from triforce.engines.heads import _Tap

    ids = torch.randint(0, 64, (1, 20), generator=torch.Generator().manual_seed(3))
    f = features(m, ids, h.layer, True, kv_dtype=torch.float32)
    anchors = torch.tensor([0, 3, 10, 15])
    with torch.no_grad():
        trained = h.upper_forward(m, f.h[0], anchors, [k[0] for k in f.keys], [v[0] for v in f.values])
    for j, t in enumerate(anchors.tolist()):
        cache = FullCache(m.config, 1, 64)
        if t:
            m.prefill(ids[:, :t], cache)
        with torch.no_grad():
            z = m.forward_hidden(ids[:, t:t + 1], cache, torch.tensor([[-1]]), tap=_Tap(h, h.depth))
        torch.testing.assert_close(z[0, 1:], trained[j], atol=1e-5, rtol=1e-5)


def test_pseudo_tokens_training_forward_equals_decoding():
    m = tiny()
    assert_training_forward_equals_decoding(m, random_heads(m, "hidden_transfer", std=0.2))


@pytest.mark.parametrize("kind", KINDS)
def test_loss_decreases_on_a_fixed_batch(kind):
    m = tiny(init=0.3)  # an LM head with some range (at std 0.02 every logit is ~0)
    for p in m.parameters():
        p.requires_grad_(False)
    cfg = TrainConfig(kind=kind, depth=3, layer=2 if kind in ("hidden_transfer", "early_exit") else None,
                      seq_len=32, batch=2, positions=8, ce_positions=16)
    ids = torch.randint(0, 64, (4, 32), generator=torch.Generator().manual_seed(0))
    f = features(m, ids, cfg.layer, kind == "hidden_transfer")
    h = make_heads(kind, m.config, cfg.depth, cfg.layer).init_from(m)
    opt = torch.optim.Adam(h.parameters(), lr=1e-2)
    seq, pos = step_batch(cfg, 4, 0)
    first = None
    for _ in range(30):
        loss, ce, reg = losses(m, h, f, seq, pos, cfg)
        first = first if first is not None else loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.8 * first, (first, loss.item())


@pytest.mark.parametrize("kind", KINDS)
def test_target_labels_distill_the_targets_distribution(kind):
    """``labels="target"``: each depth's cross-entropy is against the target's own distribution at
    ``t+1+i`` (what greedy acceptance asks the heads to match), not against the text's token."""
    from triforce.heads.train import head_states

    m = tiny(init=0.3)
    for p in m.parameters():
        p.requires_grad_(False)
    cfg = TrainConfig(kind=kind, depth=2, layer=2 if kind in ("hidden_transfer", "early_exit") else None,
                      seq_len=32, batch=2, positions=8, ce_positions=16, labels="target")
    ids = torch.randint(0, 64, (4, 32), generator=torch.Generator().manual_seed(0))
    f = features(m, ids, cfg.layer, kind == "hidden_transfer")
    h = make_heads(kind, m.config, cfg.depth, cfg.layer).init_from(m)
    seq, pos = step_batch(cfg, 4, 0)
    d = torch.arange(cfg.depth)
    teacher = torch.softmax(m.head(f.z[seq[:, None], pos[:, None] + 1 + d]).float(), -1)   # [R, k, V]
    entropy = -(teacher * teacher.clamp_min(1e-30).log()).sum(-1).mean(0)                 # [k]

    def kl_and_agreement():
        with torch.no_grad():
            logits = m.head(head_states(m, h, f, seq, pos)).float()
            kl = (teacher * (teacher.clamp_min(1e-30).log() - torch.log_softmax(logits, -1))).sum(-1).mean()
            return kl.item(), (logits.argmax(-1) == teacher.argmax(-1)).float().mean().item()

    loss, ce, _ = losses(m, h, f, seq, pos, cfg)  # every row sampled (ce_positions = rows): the manual value
    with torch.no_grad():
        want = -(teacher * torch.log_softmax(m.head(head_states(m, h, f, seq, pos)).float(), -1)).sum(-1).mean(0)
    torch.testing.assert_close(ce, want, rtol=1e-5, atol=1e-5)
    assert (ce >= entropy - 1e-4).all()  # a cross-entropy is never below the teacher's entropy
    kl0, agree0 = kl_and_agreement()
    opt = torch.optim.Adam(h.parameters(), lr=1e-2)
    for _ in range(40):
        loss, ce, reg = losses(m, h, f, seq, pos, cfg)
        opt.zero_grad()
        loss.backward()
        opt.step()
    kl1, agree1 = kl_and_agreement()
    assert kl1 < 0.5 * kl0, (kl0, kl1)
    assert agree1 > agree0, (agree0, agree1)
    with pytest.raises(ValueError, match="labels"):
        TrainConfig(labels="tokens").check()


class _Tok:
    """A tokenizer for a 64-token model: bytes modulo 64."""

    def encode(self, s):
        return [b % 64 for b in s.encode()]


def test_checkpoint_resume_reproduces_an_uninterrupted_run(tmp_path):
    m = tiny()
    cfg = dict(kind="mlp", depth=2, steps=6, distill_steps=2, seq_len=32, sequences=6, generated=2, batch=2,
               positions=8, ce_positions=8)
    a, _ = train(m, _Tok(), TrainConfig(**cfg), str(tmp_path / "a"), progress=False, log=lambda s: None, eval_rows=16)
    train(m, _Tok(), TrainConfig(**cfg), str(tmp_path / "b"), checkpoint_every=100, stop_after=5,
          progress=False, log=lambda s: None)
    assert not (tmp_path / "b" / "mlp.safetensors").exists()
    b, out = train(m, _Tok(), TrainConfig(**cfg), str(tmp_path / "b"), resume=True, progress=False,
                   log=lambda s: None, eval_rows=16)
    for (k, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(x, y), k
    assert len(out["history"]["step"]) == 8
    loaded = load_heads(tmp_path / "b" / "mlp.safetensors", m)
    for (k, x), (_, y) in zip(loaded.state_dict().items(), b.state_dict().items()):
        assert torch.equal(x, y.float()), k
    for name in ("mlp-loss.png", "mlp-eval.json", "mlp-history.json"):
        assert (tmp_path / "b" / name).stat().st_size > 0


def test_training_errors(tmp_path):
    m = tiny()
    cfg = TrainConfig(kind="medusa", depth=2, steps=2, distill_steps=0, seq_len=32, sequences=2, generated=0)
    with pytest.raises(FileNotFoundError, match="--resume: no checkpoint"):
        train(m, _Tok(), cfg, str(tmp_path), resume=True, progress=False, log=lambda s: None)
    (tmp_path / "medusa.ckpt").write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="not a readable train-heads checkpoint"):
        train(m, _Tok(), cfg, str(tmp_path), resume=True, progress=False, log=lambda s: None)
    train(m, _Tok(), cfg, str(tmp_path), stop_after=1, progress=False, log=lambda s: None)
    other = TrainConfig(**{**cfg.__dict__, "lr": 5e-4})
    with pytest.raises(ValueError, match="other settings.*lr"):
        train(m, _Tok(), other, str(tmp_path), resume=True, progress=False, log=lambda s: None)
    with pytest.raises(ValueError, match="kind"):
        TrainConfig(kind="eagle").check()
    with pytest.raises(ValueError, match="distill_steps"):
        TrainConfig(distill_steps=3, generated=0).check()


@pytest.mark.parametrize("dtype, vocab", [(torch.bfloat16, 64), (torch.float16, 64), (torch.float32, 4)])
def test_training_a_half_precision_or_tiny_vocabulary_target(tmp_path, dtype, vocab):
    """A bfloat16/float16 target trains (on a float32 copy: the heads train in float32), and so does a
    vocabulary smaller than the evaluation's top-5; the set then decodes losslessly on the target."""
    class Tok:
        def encode(self, s):
            return [b % vocab for b in s.encode()]

    m = tiny(vocab=vocab).to(dtype)
    cfg = TrainConfig(kind="hidden_transfer", depth=2, steps=2, distill_steps=1, seq_len=32, sequences=2,
                      generated=1, text=(_write_text(tmp_path / "t.txt", 20),))
    heads, info = train(m, Tok(), cfg, str(tmp_path / "o"), progress=False, log=lambda s: None, eval_rows=64)
    assert m.dtype == dtype and len(info["eval"]["top5"]) == 2
    h = load_heads(tmp_path / "o" / "hidden_transfer.safetensors", m)
    ids = torch.tensor([[1, 2, 3, 1, 2]]) % vocab
    ref = triforce.generate(m, ids, method="autoregressive", max_new_tokens=8)
    assert torch.equal(triforce.generate(m, ids, method="tree", draft=h, tree=(1, 1), max_new_tokens=8).tokens[0],
                       ref.tokens[0])

def test_checkpoint_from_before_labels_resumes_as_text(tmp_path):
    """A checkpoint written before ``TrainConfig.labels`` existed trained on the text's tokens: it resumes
    with ``labels="text"`` and is refused, naming ``labels``, with ``labels="target"``."""
    m = tiny()
    cfg = TrainConfig(kind="medusa", depth=2, steps=3, distill_steps=0, seq_len=32, sequences=2, generated=0,
                      batch=2, positions=8, ce_positions=8)
    train(m, _Tok(), cfg, str(tmp_path), stop_after=1, progress=False, log=lambda s: None)
    path = tmp_path / "medusa.ckpt"
    ckpt = torch.load(path, weights_only=True)
    del ckpt["config"]["labels"]
    torch.save(ckpt, path)
    target = TrainConfig(**{**cfg.__dict__, "labels": "target"})
    with pytest.raises(ValueError, match="other settings.*labels"):
        train(m, _Tok(), target, str(tmp_path), resume=True, progress=False, log=lambda s: None)
    _, out = train(m, _Tok(), cfg, str(tmp_path), resume=True, progress=False, log=lambda s: None, eval_rows=16)
    assert out["history"]["step"] == [0, 1, 2]


def test_heads_name_the_target_family(tmp_path):
    """A head set records the target's model_type: heads for a Llama do not load on a Qwen2 of the same
    shapes (its q/k/v biases give other hidden states), and the saved family survives a reload."""
    m = tiny()
    torch.manual_seed(0)
    qwen = Llama(LlamaConfig(**{**m.config.__dict__, "model_type": "qwen2"})).eval()
    h = random_heads(m, "mlp")
    h.save(tmp_path / "m.safetensors")
    assert load_heads(tmp_path / "m.safetensors", m).target["architecture"] == "llama"
    with pytest.raises(ValueError, match="trained for another model.*architecture: heads 'llama', model 'qwen2'"):
        load_heads(tmp_path / "m.safetensors", qwen)
    hq = random_heads(qwen, "medusa")
    hq.save(tmp_path / "q.safetensors")
    assert load_heads(tmp_path / "q.safetensors", qwen).target["architecture"] == "qwen2"


def safe_metadata(path):
    from safetensors import safe_open

    with safe_open(path, "pt") as f:
        return f.metadata()["triforce_heads"]


def test_heads_errors(tmp_path):
    m, other = tiny(), tiny(layers=2)
    h = random_heads(m, "medusa")
    h.save(tmp_path / "m.safetensors")
    with pytest.raises(ValueError, match="trained for another model.*num_hidden_layers"):
        load_heads(tmp_path / "m.safetensors", other)
    with pytest.raises(ValueError, match="trained for another model"):
        triforce.generate(other, torch.tensor([[1, 2, 3]]), method="tree", draft=h, max_new_tokens=2)
    (tmp_path / "bad.safetensors").write_bytes(b"garbage")
    with pytest.raises(ValueError, match="not a triforce head set"):
        load_heads(tmp_path / "bad.safetensors")
    with pytest.raises(FileNotFoundError, match="no head set"):
        load_heads(tmp_path / "missing.safetensors")
    with pytest.raises(ValueError, match="depth >= 4"):
        triforce.generate(m, torch.tensor([[1, 2, 3]]), method="tree", draft=h, tree=(1, 1, 1, 1), max_new_tokens=2)
    with pytest.raises(ValueError, match="tree_nodes: at most vocab_size=64"):
        triforce.generate(m, torch.tensor([[1, 2, 3]]), method="tree", draft=h, tree_nodes=(65,), max_new_tokens=2)
    with pytest.raises(ValueError, match="method=.tree. or .triforce."):
        triforce.generate(m, torch.tensor([[1, 2, 3]]), method="speculative", draft="medusa", max_new_tokens=2)
    with pytest.raises(FileNotFoundError, match="no trained 'mlp' heads ship for this model"):
        shipped_heads_path(m, "mlp")
    with pytest.raises(ValueError, match="layer"):
        make_heads("hidden_transfer", m.config, 2, layer=4)
    with pytest.raises(ValueError, match="take no layer"):
        make_heads("medusa", m.config, 2, layer=2)
    with pytest.raises(ValueError, match="a model of 1 layer has none"):
        make_heads("hidden_transfer", tiny(layers=1).config, 2)
    with pytest.raises(TypeError, match="draft: expected None, a draft model"):
        triforce.generate(m, torch.tensor([[1, 2, 3]]), method="speculative", draft=b"medusa", max_new_tokens=2)
    with pytest.raises(ValueError, match=r"trained heads \(a medusa set\) draft for"):  # not the module's repr
        triforce.generate(m, torch.tensor([[1, 2, 3]]), method="speculative", draft=h, max_new_tokens=2)
    with pytest.raises(ValueError, match="tree, tree_nodes: give one"):
        triforce.generate(m, torch.tensor([[1, 2, 3]]), method="tree", draft=h, tree=(1, 1), tree_nodes=(2, 2),
                          max_new_tokens=2)
    # metadata that is not what DraftHeads.save writes: a clear ValueError naming the file
    from safetensors.torch import load_file, save_file

    meta = json.loads(safe_metadata(tmp_path / "m.safetensors"))
    for bad in ([1, 2], {**meta, "target": None}, {k: v for k, v in meta.items() if k != "target"},
                {**meta, "target": {k: v for k, v in meta["target"].items() if k != "head_dim"}},
                {k: v for k, v in meta.items() if k != "depth"}, {**meta, "depth": 0}):
        save_file(load_file(tmp_path / "m.safetensors"), tmp_path / "x.safetensors",
                  metadata={"triforce_heads": json.dumps(bad)})
        with pytest.raises(ValueError, match="x.safetensors"):
            load_heads(tmp_path / "x.safetensors")


def test_a_saved_set_is_the_file_as_it_is_now(tmp_path, monkeypatch):
    """A path names the file it points to now: the same relative name in another directory, or the file
    written again by a new training run, is another set (it was served from the first load's cache)."""
    m = tiny()
    ids = torch.tensor([[1, 2, 3, 4]])
    for d, kind, depth in (("a", "mlp", 1), ("b", "hidden_transfer", 2)):
        (tmp_path / d).mkdir()
        h = random_heads(m, kind, depth=depth)
        h.save(tmp_path / d / "h.safetensors")
    monkeypatch.chdir(tmp_path / "a")
    triforce.generate(m, ids, method="tree", draft="h.safetensors", tree=(1,), max_new_tokens=3)
    monkeypatch.chdir(tmp_path / "b")
    out = triforce.generate(m, ids, method="tree", draft="h.safetensors", tree=(1, 1), max_new_tokens=3)
    assert out.tokens[0].numel() == 3
    random_heads(m, "medusa", depth=3).save(tmp_path / "b" / "h.safetensors")  # trained again
    assert heads_for(m, "h.safetensors").kind == "medusa"
    (tmp_path / "b" / "h.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="no head set"):
        triforce.generate(m, ids, method="tree", draft="h.safetensors", max_new_tokens=3)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_tree_by_cumulative_probability(kind, temperature):
    """tree_nodes: per-row trees chosen by path probability; greedy equality, sampled runs."""
    m = tiny()
    prompts = [torch.randint(0, 64, (n,), generator=torch.Generator().manual_seed(n)) for n in (9, 17, 5)]
    h = random_heads(m, kind)
    out = triforce.generate(m, prompts, method="tree", draft=h, tree_nodes=(3, 3, 2), max_new_tokens=20,
                            temperature=temperature, seed=0)
    if temperature == 0:
        ref = triforce.generate(m, prompts, method="autoregressive", max_new_tokens=20)
        assert all(torch.equal(a, b) for a, b in zip(out.tokens, ref.tokens))
    assert out.stats["lengths"] == [20, 20, 20]


@pytest.mark.parametrize("kind", [k for k in KINDS if k != "mlp"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_drafts_in_the_verification_head_call_change_nothing(monkeypatch, kind, temperature):
    """The draft logits of every node computed in the verification's LM-head call (a small pass) give
    the same tokens and the same acceptance as the accepted node's alone, computed after the pass."""
    import triforce.engines.heads as engine_heads

    m = tiny()
    prompts = [torch.randint(0, 64, (n,), generator=torch.Generator().manual_seed(n)) for n in (40, 57)]
    h = random_heads(m, kind)
    calls = []
    real_head = m.head
    monkeypatch.setattr(m, "head", lambda z: calls.append(z.shape[1]) or real_head(z))

    def run(method, **opts):
        calls.clear()
        out = triforce.generate(m, prompts, method=method, draft=h, max_new_tokens=16, temperature=temperature,
                                seed=3, **opts)
        return out, list(calls)

    for method, opts, rows in (("tree", {"tree": (1, 1)}, 3), ("triforce", {"gamma1": 2, "gamma2": 3, "budget": 1000,
                                                                             "chunk_size": 64}, 3)):
        fused, fused_calls = run(method, **opts)
        monkeypatch.setattr(engine_heads, "FUSED_DRAFT_MAX_ROWS", 0)  # every draft after the pass, as before
        apart, apart_calls = run(method, **opts)
        monkeypatch.setattr(engine_heads, "FUSED_DRAFT_MAX_ROWS", 32)
        assert all(torch.equal(a, b) for a, b in zip(fused.tokens, apart.tokens)), method
        assert fused.stats["accepted_hist"] == apart.stats["accepted_hist"], method
        assert fused.stats["target_passes"] == apart.stats["target_passes"], method
        # fused: one head call per pass, on the nodes and their drafts; apart: a second call per pass
        assert fused_calls.count(rows * 3) >= 1 and len(apart_calls) > len(fused_calls), (fused_calls, apart_calls)


@pytest.mark.parametrize("kind", [k for k in KINDS if k != "mlp"])
def test_draft_vocab_drafts_after_the_pass_from_its_rows(monkeypatch, kind):
    """With a draft vocabulary the verification's LM-head call holds the tree's nodes only: the accepted
    node's drafts read the vocabulary's rows of the head after the pass (fewer rows through the whole
    head; the fused call would cost T * depth more). Greedy output stays autoregressive's."""
    from triforce.engines.heads import _DraftVocab

    m = tiny()
    prompts = [torch.randint(0, 64, (n,), generator=torch.Generator().manual_seed(n)) for n in (40, 57)]
    h = ranked_heads(m, kind)
    head_rows, vocab_rows = [], []
    real_head, real_logits = m.head, _DraftVocab.logits
    monkeypatch.setattr(m, "head", lambda z: head_rows.append(z.shape[1]) or real_head(z))

    def logits(self, x):
        vocab_rows.append(tuple(x.shape[:-1]))
        return real_logits(self, x)
    monkeypatch.setattr(_DraftVocab, "logits", logits)
    out = triforce.generate(m, prompts, method="tree", draft=h, tree=(1, 1), draft_vocab=5, max_new_tokens=16)
    ref = triforce.generate(m, prompts, method="autoregressive", max_new_tokens=16)
    assert all(torch.equal(a, b) for a, b in zip(out.tokens, ref.tokens))
    assert head_rows and max(head_rows) <= 3, head_rows  # the nodes of (1, 1), never their drafts too
    # one restricted call per pass: per row, the accepted node's drafts at the tree's 2 depths (rows: both, then
    # the one left once the other finished and left the batch)
    batches = [b for b, _ in vocab_rows]
    assert len(vocab_rows) == out.stats["target_passes"] and {d for _, d in vocab_rows} == {2}, vocab_rows
    assert batches[0] == 2 and batches == sorted(batches, reverse=True), vocab_rows


def test_tree_nodes_needs_heads():
    m = tiny()
    with pytest.raises(ValueError, match="tree_nodes: a tree by cumulative probability"):
        triforce.generate(m, torch.tensor([[1, 2, 3]]), method="tree", tree_nodes=(2, 2), max_new_tokens=2)


# ---- heads as TriForce's bottom level
@pytest.mark.parametrize("kind", KINDS)
def test_triforce_with_heads_greedy_equals_autoregressive(kind):
    m = tiny()
    prompts = [torch.randint(0, 64, (n,), generator=torch.Generator().manual_seed(n)) for n in (40, 57, 33)]
    ref = triforce.generate(m, prompts, method="autoregressive", max_new_tokens=30)
    for opts in ({"gamma1": 2, "gamma2": 3, "budget": 16, "chunk_size": 4, "rebuild_stride": 8},
                 {"gamma1": 3, "gamma2": 6, "budget": 1000, "chunk_size": 64}):  # no retrieval cache: chain
        out = triforce.generate(m, prompts, method="triforce", draft=random_heads(m, kind), max_new_tokens=30,
                                **opts)
        assert all(torch.equal(a, b) for a, b in zip(out.tokens, ref.tokens)), opts


@pytest.mark.parametrize("kind", KINDS)
def test_triforce_with_heads_sampled_distribution(exact34, kind):
    from tests.test_engines_sampling import chi2_pvalue

    m, prompt, p34 = exact34
    out = triforce.generate(m, prompt.expand(N, P), method="triforce", draft=random_heads(m, kind, std=0.5),
                            max_new_tokens=4, temperature=1.0, seed=11, gamma1=2, gamma2=3, budget=12, chunk_size=4)
    t = torch.stack(out.tokens).numpy()
    c34 = np.zeros((V, V))
    np.add.at(c34, (t[:, 2], t[:, 3]), 1)
    assert out.stats["acceptance"]["draft->retrieval"] > 0.02
    assert chi2_pvalue(c34, p34) > 1e-3


def test_cli_generate_with_shipped_heads(smollm2, capsys):
    from triforce import cli

    rc = cli.main(["generate", "--prompt", "The capital of France is", "--method", "tree", "--draft",
                   "hidden_transfer", "--tree", "2,1", "--max-new-tokens", "8", "--ignore-eos"])
    tree_text = capsys.readouterr().out
    rc2 = cli.main(["generate", "--prompt", "The capital of France is", "--max-new-tokens", "8", "--ignore-eos"])
    assert rc == rc2 == 0 and capsys.readouterr().out == tree_text
    assert cli.main(["generate", "--prompt", "x", "--method", "speculative", "--draft", "medusa"]) == 2


# ---- a draft vocabulary (draft_vocab): the heads draft from the most frequent tokens only
def ranked_heads(model, kind, std=0.3, seed=1):
    h = random_heads(model, kind, std=std, seed=seed)
    h.token_rank = torch.randperm(model.config.vocab_size, generator=torch.Generator().manual_seed(seed + 5))
    return h


@pytest.mark.parametrize("kind", KINDS)
def test_draft_vocab_greedy_equals_autoregressive_and_drafts_stay_inside(monkeypatch, kind):
    from triforce.engines.heads import HeadDrafter

    m = tiny()
    prompts = [torch.randint(0, 64, (n,), generator=torch.Generator().manual_seed(n)) for n in (40, 57, 33)]
    ref = triforce.generate(m, prompts, method="autoregressive", max_new_tokens=24)
    h = ranked_heads(m, kind)
    keep = set(h.token_rank[:8].tolist())
    drafted = []
    for name in ("propose_tree", "propose_by_probability", "propose"):
        real = getattr(HeadDrafter, name)

        def spy(self, *a, _real=real, **k):
            out = _real(self, *a, **k)
            if self.state is not None:  # past the first step: drafts from the heads
                drafted.append(out[0][:, 1:] if out[0].shape[1] > 1 and _real.__name__ != "propose" else out[0])
            return out
        monkeypatch.setattr(HeadDrafter, name, spy)
    # wider than the draft vocabulary too: the argmax repeats past its 8 tokens
    for method, opts in (("tree", {"tree": (2, 2, 1)}), ("tree", {"tree": (1, 1)}), ("tree", {"tree_nodes": (3, 2)}),
                         ("tree", {"tree": (11, 1)}), ("tree", {"tree_nodes": (10, 12)}),
                         ("triforce", {"gamma1": 2, "gamma2": 3, "budget": 16, "chunk_size": 4, "rebuild_stride": 8})):
        drafted.clear()
        out = triforce.generate(m, prompts, method=method, draft=h, max_new_tokens=24, draft_vocab=8, **opts)
        assert all(torch.equal(a, b) for a, b in zip(out.tokens, ref.tokens)), (method, opts)
        assert drafted and set(torch.cat([d.flatten() for d in drafted]).tolist()) <= keep, (method, opts)
    for opts in ({"tree": (11, 1)}, {"tree_nodes": (10, 12)}):  # sampled
        drafted.clear()
        triforce.generate(m, prompts, method="tree", draft=h, max_new_tokens=24, draft_vocab=8, temperature=1.0,
                          seed=3, **opts)
        assert drafted and set(torch.cat([d.flatten() for d in drafted]).tolist()) <= keep, opts


@pytest.mark.parametrize("kind", KINDS)
def test_draft_vocab_logits_are_the_heads_restricted(kind):
    """The drafter's logits with a draft vocabulary: the heads' own logits on the kept tokens, -inf elsewhere."""
    from triforce.engines.heads import HeadDrafter
    from triforce.engines.steps import Sampling

    m = tiny()
    h = ranked_heads(m, kind)
    full = HeadDrafter(m, h, Sampling(0.0, None, None, None), 2)
    cut = HeadDrafter(m, h, Sampling(0.0, None, None, None), 2, draft_vocab=10)
    x = torch.randn(3, 2, 32)
    a, b = full._head(x), cut._head(x)
    keep = torch.zeros(64, dtype=torch.bool)
    keep[h.token_rank[:10]] = True
    assert torch.allclose(b[..., keep], a[..., keep], rtol=1e-5, atol=1e-5)
    assert torch.isneginf(b[..., ~keep]).all()


@pytest.mark.parametrize("kind", KINDS)
def test_draft_vocab_sampled_distribution(exact34, kind):
    """Drafts from 5 of 16 tokens (zero draft probability elsewhere): still the target's distribution."""
    from tests.test_engines_sampling import chi2_pvalue

    m, prompt, p34 = exact34
    out = triforce.generate(m, prompt.expand(N, P), method="tree", draft=ranked_heads(m, kind, std=0.5),
                            max_new_tokens=4, temperature=1.0, seed=7, tree=(2, 2, 1), draft_vocab=5)
    t = torch.stack(out.tokens).numpy()
    c34 = np.zeros((V, V))
    np.add.at(c34, (t[:, 2], t[:, 3]), 1)
    assert out.stats["acceptance"]["tree->full"] > 0.02
    assert chi2_pvalue(c34, p34) > 1e-3


def test_draft_vocab_errors_and_saved_ranking(tmp_path):
    m = tiny()
    ids = torch.tensor([[1, 2, 3, 4]])
    h = random_heads(m, "medusa")
    with pytest.raises(ValueError, match="draft_vocab: these heads carry no token ranking"):
        triforce.generate(m, ids, method="tree", draft=h, tree=(1, 1), max_new_tokens=2, draft_vocab=8)
    h.token_rank = torch.arange(64).flip(0)
    with pytest.raises(ValueError, match="draft_vocab: at most vocab_size=64"):
        triforce.generate(m, ids, method="tree", draft=h, tree=(1, 1), max_new_tokens=2, draft_vocab=65)
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="draft_vocab: expected an int >= 1"):
            triforce.generate(m, ids, method="tree", draft=h, tree=(1, 1), max_new_tokens=2, draft_vocab=bad)
    with pytest.raises(ValueError, match="draft_vocab: a draft vocabulary restricts trained heads"):
        triforce.generate(m, ids, method="tree", max_new_tokens=2, draft_vocab=8)
    with pytest.raises(TypeError, match="draft_vocab"):
        triforce.generate(m, ids, method="speculative", max_new_tokens=2, draft_vocab=8)
    # the whole vocabulary as the draft vocabulary drafts as without one
    ref = triforce.generate(m, ids, method="tree", draft=h, tree=(1, 1), max_new_tokens=12)
    out = triforce.generate(m, ids, method="tree", draft=h, tree=(1, 1), max_new_tokens=12, draft_vocab=64)
    assert torch.equal(out.tokens[0], ref.tokens[0]) and out.stats["accepted_hist"] == ref.stats["accepted_hist"]
    # saved and loaded with the set; a file whose ranking is not a permutation is refused
    h.save(tmp_path / "h.safetensors")
    assert torch.equal(load_heads(tmp_path / "h.safetensors", m).token_rank, h.token_rank)
    from safetensors.torch import load_file, save_file
    from safetensors import safe_open

    with safe_open(str(tmp_path / "h.safetensors"), "pt") as f:
        meta = f.metadata()
    sd = load_file(tmp_path / "h.safetensors")
    sd["token_rank"] = torch.zeros(64, dtype=torch.int64)
    save_file(sd, tmp_path / "bad.safetensors", metadata=meta)
    with pytest.raises(ValueError, match="token_rank must hold each of the 64 token ids once"):
        load_heads(tmp_path / "bad.safetensors", m)


def test_training_writes_a_token_ranking(tmp_path):
    m = tiny()
    cfg = TrainConfig(kind="medusa", depth=2, steps=2, distill_steps=0, seq_len=32, sequences=4, generated=0,
                      batch=2, positions=8, ce_positions=8)
    train(m, _Tok(), cfg, str(tmp_path), progress=False, log=lambda s: None, eval_rows=16)
    from triforce.heads.train import python_docs, token_sequences

    rank = load_heads(tmp_path / "medusa.safetensors", m).token_rank
    counts = torch.bincount(token_sequences(_Tok(), python_docs()[0], 32, 4).flatten(), minlength=64)
    assert torch.equal(counts[rank], counts[rank].sort(descending=True).values)  # most frequent first
    assert torch.equal(rank, torch.sort(-counts, stable=True).indices)           # ties in id order


def test_shipped_sets_carry_a_token_ranking():
    from triforce.heads import TRAINED_DIR

    for path in sorted(TRAINED_DIR.glob("*.safetensors")):
        h = load_heads(path)
        assert h.token_rank is not None and h.token_rank.numel() == h.target["vocab_size"], path


# ---- property test: every kind, tree / tree_nodes / triforce, ragged batches, with and without a draft
# vocabulary, the shared LM-head call on and off (the batch decides): greedy output is autoregressive's
from hypothesis import given, strategies as st  # noqa: E402


@given(data=st.data())
def test_heads_random_batches_trees_and_draft_vocab(data):
    from triforce.engines.heads import HeadDrafter

    kind = data.draw(st.sampled_from(KINDS), label="kind")
    m = tiny(seed=data.draw(st.integers(0, 3), label="model"))
    depth = data.draw(st.integers(1, 3), label="depth")
    h = ranked_heads(m, kind, seed=data.draw(st.integers(0, 9), label="heads"))
    if depth != h.depth:
        h = random_heads(m, kind, depth=depth)
        h.token_rank = torch.randperm(64, generator=torch.Generator().manual_seed(depth))
    B = data.draw(st.integers(1, 4), label="batch")
    lens = data.draw(st.lists(st.integers(20, 60), min_size=B, max_size=B), label="lens")
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2 ** 16), label="seed"))
    prompts = [torch.randint(0, 64, (n,), generator=g) for n in lens]
    build = data.draw(st.sampled_from(["tree", "tree_nodes", "triforce"]), label="build")
    if build == "tree":
        opts = {"tree": tuple(data.draw(st.lists(st.integers(1, 3), min_size=1, max_size=depth), label="tree"))}
    elif build == "tree_nodes":
        opts = {"tree_nodes": tuple(data.draw(st.lists(st.integers(1, 4), min_size=1, max_size=depth), label="w"))}
    else:
        chunk = data.draw(st.integers(1, 4), label="chunk")
        opts = {"gamma1": data.draw(st.integers(1, depth), label="gamma1"), "gamma2": data.draw(st.integers(1, 6)),
                "chunk_size": chunk, "budget": data.draw(st.integers(3 * chunk, 8 * chunk), label="budget"),
                "rebuild_stride": data.draw(st.integers(1, 16), label="stride")}
    vocab = data.draw(st.sampled_from([None, 1, 5, 64]) | st.integers(1, 64), label="draft_vocab")
    temperature = data.draw(st.sampled_from([0.0, 0.0, 1.0]), label="temperature")
    max_new = data.draw(st.integers(1, 20), label="max_new")
    keep = set(h.token_rank[:vocab].tolist()) if vocab else set(range(64))
    drafted = []  # every draft distribution: the drafter's own LM-head calls and the committed states
    real_head, real_take = HeadDrafter._head, HeadDrafter._take_state

    def head(self, x):
        out = real_head(self, x)
        drafted.append(out)
        return out

    def take(self, adv, path):
        real_take(self, adv, path)
        if self.heads.kind != "mlp":  # the depth logits, from the verification's call or the drafter's
            drafted.append(self.state)
    HeadDrafter._head, HeadDrafter._take_state = head, take
    try:
        out = triforce.generate(m, prompts, method="triforce" if build == "triforce" else "tree", draft=h,
                                max_new_tokens=max_new, temperature=temperature, seed=1, draft_vocab=vocab, **opts)
    finally:
        HeadDrafter._head, HeadDrafter._take_state = real_head, real_take
    for logits in drafted:
        finite = torch.isfinite(logits).flatten(0, -2).any(0).nonzero().flatten().tolist()
        assert set(finite) <= keep, (kind, build, vocab)
    assert out.lengths == [max_new] * B
    assert all(t.shape == (max_new,) and bool(((t >= 0) & (t < 64)).all()) for t in out.tokens)
    if temperature == 0:
        ref = triforce.generate(m, prompts, method="autoregressive", max_new_tokens=max_new)
        assert all(torch.equal(a, b) for a, b in zip(out.tokens, ref.tokens)), (kind, build, opts, vocab)


# ---- training on your own text, and fine-tuning a saved set
def _write_text(path, paragraphs, seed=0):
    rng = np.random.default_rng(seed)
    words = ["alpha", "beta", "gamma", "delta", "kernel", "cache", "tree", "draft"]
    path.write_text("\n\n".join(" ".join(rng.choice(words, 60)) for _ in range(paragraphs)), encoding="utf-8")
    return str(path)


def test_corpus_from_text_files(tmp_path):
    from triforce.heads.train import PIECE_CHARS, corpus, python_docs

    assert corpus(()) == python_docs()
    a, b = _write_text(tmp_path / "a.txt", 40), _write_text(tmp_path / "b.txt", 25, seed=1)

    def in_order(paths):  # the pieces in file order: the held-out one is the first of every ten
        train_text, held = corpus(paths)
        n = len(train_text) + len(held)
        assert len(held) == (n + 9) // 10
        return [held[i // 10] if i % 10 == 0 else train_text[i - i // 10 - 1] for i in range(n)]

    pieces_a, pieces_b = in_order((a,)), in_order((b,))
    for pieces, path in ((pieces_a, a), (pieces_b, b)):
        assert len(pieces) >= 3 and all(len(p) >= PIECE_CHARS for p in pieces[:-1])  # the last may be shorter
        assert "\n\n".join(pieces) == open(path, encoding="utf-8").read()          # cut at blank lines, nothing lost
    assert in_order((a, b)) == pieces_a + pieces_b
    (tmp_path / "short.txt").write_text("one paragraph only", encoding="utf-8")
    with pytest.raises(ValueError, match="text: 1 piece"):
        corpus((str(tmp_path / "short.txt"),))
    (tmp_path / "bin.txt").write_bytes(b"\xff\xfe\xfa" * 100)
    with pytest.raises(ValueError, match="cannot read .*bin.txt.* as UTF-8"):
        corpus((str(tmp_path / "bin.txt"),))


def test_training_on_text_files_and_fine_tuning(tmp_path):
    m = tiny()
    text = _write_text(tmp_path / "t.txt", 80)
    base = dict(kind="mlp", depth=2, steps=3, distill_steps=1, seq_len=32, sequences=8, generated=2, batch=2,
                positions=8, ce_positions=8, text=(text,))
    first, _ = train(m, _Tok(), TrainConfig(**base), str(tmp_path / "a"), progress=False, log=lambda s: None,
                     eval_rows=16)
    saved = str(tmp_path / "a" / "mlp.safetensors")
    # the ranking is the file's: its most frequent byte (mod 64) first
    from triforce.heads.train import corpus, token_sequences

    counts = torch.bincount(token_sequences(_Tok(), corpus((text,))[0], 32, 8).flatten(), minlength=64)
    assert int(load_heads(saved, m).token_rank[0]) == int(counts.argmax())
    # fine-tuning starts from the saved set: with a vanishing learning rate it ends where it started
    tuned, _ = train(m, _Tok(), TrainConfig(**{**base, "init": saved, "lr": 1e-12}), str(tmp_path / "b"),
                     progress=False, log=lambda s: None, eval_rows=16)
    fresh, _ = train(m, _Tok(), TrainConfig(**{**base, "lr": 1e-12}), str(tmp_path / "c"), progress=False,
                     log=lambda s: None, eval_rows=16)
    for (k, x), (_, y), (_, z) in zip(first.state_dict().items(), tuned.state_dict().items(),
                                      fresh.state_dict().items()):
        assert torch.allclose(x, y, atol=1e-6), k
    assert any(not torch.allclose(x, z, atol=1e-3) for x, z in zip(first.state_dict().values(),
                                                                   fresh.state_dict().values()))
    # a checkpoint records the text and the starting set: resuming with others is refused, naming them
    train(m, _Tok(), TrainConfig(**base), str(tmp_path / "d"), stop_after=1, progress=False, log=lambda s: None)
    with pytest.raises(ValueError, match="other settings.*init"):
        train(m, _Tok(), TrainConfig(**{**base, "init": saved}), str(tmp_path / "d"), resume=True, progress=False,
              log=lambda s: None)
    other = _write_text(tmp_path / "u.txt", 80, seed=3)
    with pytest.raises(ValueError, match="other settings.*text"):
        train(m, _Tok(), TrainConfig(**{**base, "text": (other,)}), str(tmp_path / "d"), resume=True,
              progress=False, log=lambda s: None)


def test_fine_tuning_errors(tmp_path):
    m = tiny()
    text = _write_text(tmp_path / "t.txt", 80)
    cfg = dict(kind="medusa", depth=2, steps=1, distill_steps=0, seq_len=32, sequences=4, generated=0, batch=2,
               positions=8, ce_positions=8, text=(text,))
    h = random_heads(m, "medusa", depth=3)
    h.save(tmp_path / "d3.safetensors")
    with pytest.raises(ValueError, match="init: .*holds a medusa set of depth 3, layer None; this run trains "
                                         "medusa of depth 2"):
        train(m, _Tok(), TrainConfig(**{**cfg, "init": str(tmp_path / "d3.safetensors")}), str(tmp_path / "o"),
              progress=False, log=lambda s: None)
    with pytest.raises(FileNotFoundError, match="init: no head set"):
        TrainConfig(**{**cfg, "init": str(tmp_path / "none.safetensors")}).check()
    with pytest.raises(FileNotFoundError, match="text: no such file"):
        TrainConfig(**{**cfg, "text": (str(tmp_path / "none.txt"),)}).check()
    with pytest.raises(ValueError, match="text: expected a tuple of file paths"):
        TrainConfig(**{**cfg, "text": text}).check()
    with pytest.raises(ValueError, match="seq_len: 100000 tokens exceed the model's context of 256"):
        train(m, _Tok(), TrainConfig(**{**cfg, "seq_len": 100000}), str(tmp_path / "o"), progress=False,
              log=lambda s: None)
    long_context = Llama(m.config.replace(max_position_embeddings=100000)).eval()
    with pytest.raises(ValueError, match="held-out pieces .* too short"):
        train(long_context, _Tok(), TrainConfig(**{**cfg, "seq_len": 100000}), str(tmp_path / "o"), progress=False,
              log=lambda s: None)
    for k, v in (("lr", math.inf), ("lr", math.nan), ("reg_weight", math.nan), ("reg_weight", -1.0)):
        with pytest.raises(ValueError, match=f"{k}: expected a finite number"):
            TrainConfig(**{**cfg, k: v}).check()


def test_cli_layer_applies_to_the_kinds_that_read_one(tmp_path, monkeypatch, capsys):
    from triforce import cli
    from triforce.models import hub

    m = tiny()
    monkeypatch.setattr(hub, "load_model", lambda name, dtype: (m, _Tok()))
    text = _write_text(tmp_path / "t.txt", 40)
    common = ["--text", text, "--out", str(tmp_path / "out"), "--steps", "1", "--distill-steps", "0",
              "--sequences", "2", "--seq-len", "16", "--positions", "4", "--batch", "1", "--no-progress"]
    assert cli.main(["train-heads", "--kind", "medusa", "hidden_transfer", "--layer", "1", *common]) == 0
    paths = capsys.readouterr().out.strip().splitlines()[-2:]
    assert [load_heads(p, m).layer for p in paths] == [None, 1]
    # alone, a kind without a layer refuses one
    assert cli.main(["train-heads", "--kind", "medusa", "--layer", "1", *common]) != 0
    assert "take no layer" in capsys.readouterr().err


def test_cli_fine_tunes_a_shipped_set_on_text(smollm2, tmp_path, capsys):
    from triforce import cli

    text = _write_text(tmp_path / "t.txt", 40)
    rc = cli.main(["train-heads", "--kind", "medusa", "--init", "shipped", "--text", text, "--out",
                   str(tmp_path / "out"), "--steps", "2", "--distill-steps", "0", "--sequences", "2",
                   "--seq-len", "16", "--positions", "4", "--batch", "1", "--no-progress"])
    assert rc == 0
    path = capsys.readouterr().out.strip().splitlines()[-1]
    model, _ = smollm2
    tuned, shipped = load_heads(path, model), load_heads(shipped_heads_path(model, "medusa"), model)
    # two small steps from the shipped weights, not from the identity
    for (k, x), (_, y) in zip(tuned.state_dict().items(), shipped.state_dict().items()):
        assert (x - y).abs().max() < 0.05, k
    assert not torch.equal(tuned.token_rank, shipped.token_rank)  # ranked by the new text
