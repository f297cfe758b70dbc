"""Training draft heads offline on a CPU (``python -m triforce train-heads``; docs/heads.md).

Data, with no download:

* phase 1 (causal LM on text): Python's own documentation, ``pydoc_data.topics`` (~465K characters
  of English prose and code, shipped with every CPython); every 10th topic is held out for evaluation;
* phase 2 (distillation): sequences the target itself generates (sampled, temperature 0.8) from the
  first tokens of training sequences, so the heads learn the distribution they will draft for.
  Steps of phase 1 : phase 2 = 5 : 2 by default (the MLP speculator's recipe).

The target is frozen; its final-normed hidden states ``z`` (and, for the kinds that read a layer, the
stream entering that layer and the keys/values above it) are computed once, then every step trains
the heads on random positions ``t`` of random sequences. Each depth ``i`` produces the LM head's input
for token ``t+2+i``; the loss is the cross-entropy of its logits against that token plus a smooth-L1
regression of the state onto the target's own ``z_{t+1+i}`` (the state from which the target predicts
that token; EAGLE's feature loss). The regression is cheap and dense; the cross-entropy through the
49152-row LM head dominates the cost on a CPU, so it runs on a subset of the positions. With
``labels="target"`` the cross-entropy is taken against the target's own next-token distribution at
``t+1+i`` (``softmax(head(z_{t+1+i}))``, self-distillation) instead of the text's token: greedy
acceptance asks the heads for the target's argmax, which on text is often not the text's next token.

Reproducible: the data, the generation and every step's batch derive from ``seed`` (a step's batch
from ``seed`` and the step number), so a run resumed from a checkpoint takes the same batches.
"""
from __future__ import annotations

import copy
import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from .modules import KINDS, DraftHeads, HiddenTransfer, MLPSpeculator, load_heads, make_heads, token_rank


LABELS = ("text", "target")


@dataclass
class TrainConfig:
    kind: str = "medusa"
    depth: int = 4
    layer: int | None = None
    steps: int = 250            # phase 1 (text)
    distill_steps: int = 100    # phase 2 (the target's own generations)
    seq_len: int = 256
    sequences: int = 192        # phase-1 training sequences
    generated: int = 48         # phase-2 sequences
    batch: int = 4              # sequences per step
    positions: int = 64         # positions per sequence per step
    ce_positions: int = 64      # positions per step that also get the cross-entropy
    lr: float = 1e-3
    reg_weight: float = 1.0
    seed: int = 0
    labels: str = "text"        # "text": the next tokens of the text; "target": the target's distribution there
    text: tuple = ()            # UTF-8 text files to train on (empty: Python's documentation)
    init: str | None = None     # a saved set of the same kind, depth and layer to start from (fine-tuning)

    def __post_init__(self):
        if isinstance(self.text, list):  # a list of paths is the same setting as the tuple (checkpoints compare)
            self.text = tuple(self.text)

    def check(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind: expected one of {', '.join(KINDS)}, got {self.kind!r}")
        for k in ("depth", "steps", "seq_len", "sequences", "batch", "positions", "ce_positions"):
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{k}: expected an int >= 1, got {v!r}")
        for k in ("distill_steps", "generated"):
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{k}: expected an int >= 0, got {v!r}")
        if self.distill_steps and not self.generated:
            raise ValueError("distill_steps > 0 needs generated > 0 sequences")
        if self.seq_len < self.depth + 3:
            raise ValueError(f"seq_len: needs at least depth + 3 = {self.depth + 3} tokens, got {self.seq_len}")
        if isinstance(self.lr, bool) or not isinstance(self.lr, (int, float)) or not 0 < self.lr < math.inf:
            raise ValueError(f"lr: expected a finite number > 0, got {self.lr!r}")
        w = self.reg_weight
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not 0 <= w < math.inf:
            raise ValueError(f"reg_weight: expected a finite number >= 0, got {w!r}")
        if self.labels not in LABELS:
            raise ValueError(f"labels: expected one of {', '.join(LABELS)}, got {self.labels!r}")
        if isinstance(self.text, (str, os.PathLike)) or not all(isinstance(p, str) for p in self.text):
            raise ValueError(f"text: expected a tuple of file paths, got {self.text!r}")
        for p in self.text:
            if not os.path.isfile(p):
                raise FileNotFoundError(f"text: no such file {p!r}")
        if self.init is not None and not os.path.isfile(self.init):
            raise FileNotFoundError(f"init: no head set at {self.init!r}")


# ---- data
def python_docs() -> tuple[list[str], list[str]]:
    """(training texts, held-out texts) from ``pydoc_data.topics``; every 10th topic is held out."""
    from pydoc_data.topics import topics

    keys = sorted(topics)
    train = [topics[k] for i, k in enumerate(keys) if i % 10]
    held = [topics[k] for i, k in enumerate(keys) if not i % 10]
    return train, held


PIECE_CHARS = 2000  # a text file is cut at blank lines into pieces of at least this many characters


def corpus(paths=()) -> tuple[list[str], list[str]]:
    """(training texts, held-out texts): Python's documentation (:func:`python_docs`) when ``paths`` is
    empty, else the UTF-8 files ``paths`` cut at blank lines into pieces of at least ``PIECE_CHARS``
    characters, every 10th piece held out (the first of every ten, so one is held out from the start)."""
    if not paths:
        return python_docs()
    pieces = []
    for path in paths:
        try:
            with open(path, encoding="utf-8") as fh:
                text = fh.read()
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"text: cannot read {path!r} as UTF-8 text ({type(e).__name__}: {e})") from None
        piece = ""
        for para in text.split("\n\n"):
            piece = f"{piece}\n\n{para}" if piece else para
            if len(piece) >= PIECE_CHARS:
                pieces.append(piece)
                piece = ""
        if piece.strip():
            pieces.append(piece)
    if len(pieces) < 2:
        raise ValueError(f"text: {len(pieces)} piece(s) of ~{PIECE_CHARS} characters in {list(paths)}; training "
                         f"needs at least 2 (every 10th is held out for the evaluation)")
    return [p for i, p in enumerate(pieces) if i % 10], [p for i, p in enumerate(pieces) if not i % 10]


def token_sequences(tok, texts: list[str], seq_len: int, limit: int | None = None) -> torch.Tensor:
    """The texts joined and tokenized, cut into ``[N, seq_len]`` int64 rows (at most ``limit``)."""
    ids, want = [], None if limit is None else limit * seq_len
    for text in texts:  # encode only as much text as the rows need
        ids += tok.encode(text + "\n\n")
        if want is not None and len(ids) >= want:
            break
    n = len(ids) // seq_len
    if limit is not None:
        n = min(n, limit)
    if n < 1:
        raise ValueError(f"the text holds {len(ids)} tokens, fewer than one sequence of {seq_len}")
    return torch.tensor(ids[: n * seq_len], dtype=torch.int64).view(n, seq_len)


def generated_sequences(model, prompts: torch.Tensor, seq_len: int, seed: int, batch: int = 16,
                        progress=None) -> torch.Tensor:
    """The target's own continuations (temperature 0.8) of ``prompts [N, P]`` to ``seq_len`` tokens."""
    from triforce.generate import generate

    out = []
    for s in range(0, prompts.shape[0], batch):
        p = prompts[s: s + batch].to(model.device)
        r = generate(model, p, method="autoregressive", max_new_tokens=seq_len - p.shape[1], temperature=0.8,
                     seed=seed + s)
        out.append(torch.cat([p.cpu(), torch.stack(r.tokens).cpu()], 1))
        if progress:
            progress(min(s + batch, prompts.shape[0]), prompts.shape[0])
    return torch.cat(out)


class _Capture:
    """A forward_hidden tap that only keeps the stream entering ``layer``."""

    def __init__(self, layer):
        self.layer, self.h = layer, None

    def __call__(self, h, parents):
        self.h = h
        return None


@dataclass
class Features:
    ids: torch.Tensor       # [N, S] int64
    z: torch.Tensor         # [N, S, H] final-normed hidden states
    h: torch.Tensor | None  # [N, S, H] stream entering the heads' layer
    keys: list | None       # per layer >= heads' layer: [N, S, Hkv, D] (bfloat16), hidden_transfer only
    values: list | None


@torch.no_grad()
def features(model, ids: torch.Tensor, layer: int | None, keep_kv: bool, batch: int = 8,
             kv_dtype: torch.dtype = torch.bfloat16) -> Features:
    """The frozen target's states of ``ids [N, S]`` (keys/values kept in ``kv_dtype`` to halve memory)."""
    from triforce.models.cache import FullCache

    zs, hs, ks, vs = [], [], [], []
    cap = _Capture(layer) if layer is not None else None
    for s in range(0, ids.shape[0], batch):
        x = ids[s: s + batch].to(model.device)
        cache = FullCache(model.config, x.shape[0], x.shape[1], device=model.device, dtype=model.dtype)
        zs.append(model.forward_hidden(x, cache, tap=cap).float().cpu())
        if cap is not None:
            hs.append(cap.h.float().cpu())
        if keep_kv:
            ks.append([cache.k[j][:, : x.shape[1]].to(kv_dtype).cpu() for j in range(layer, len(cache.k))])
            vs.append([cache.v[j][:, : x.shape[1]].to(kv_dtype).cpu() for j in range(layer, len(cache.v))])
    cat = (lambda parts: [torch.cat([p[j] for p in parts]) for j in range(len(parts[0]))]) if keep_kv else None
    return Features(ids, torch.cat(zs), torch.cat(hs) if hs else None,
                    cat(ks) if keep_kv else None, cat(vs) if keep_kv else None)


# ---- one step
def head_states(model, heads: DraftHeads, f: Features, seq: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """The heads' LM-head inputs ``[R, depth, H]`` at rows ``(seq[r], pos[r])`` (sorted by sequence)."""
    if isinstance(heads, HiddenTransfer):
        out = []
        for s in seq.unique(sorted=True).tolist():
            t = pos[seq == s]
            out.append(heads.upper_forward(model, f.h[s], t, [k[s] for k in f.keys], [v[s] for v in f.values]))
        return torch.cat(out)
    if isinstance(heads, MLPSpeculator):
        fed = f.ids[seq[:, None], pos[:, None] + 1 + torch.arange(heads.depth)]
        return heads.teacher_forced(model, f.z[seq, pos], fed)
    return heads.states(f.h[seq, pos] if heads.reads_layer else f.z[seq, pos])


def step_batch(cfg: TrainConfig, n_seq: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This step's rows: ``batch`` sequences x ``positions`` positions, drawn from (seed, step) only."""
    g = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)
    seq = torch.randint(n_seq, (cfg.batch,), generator=g).repeat_interleave(cfg.positions)
    pos = torch.randint(cfg.seq_len - cfg.depth - 1, (cfg.batch * cfg.positions,), generator=g)
    order = torch.argsort(seq * cfg.seq_len + pos)
    return seq[order], pos[order]


def losses(model, heads: DraftHeads, f: Features, seq, pos, cfg: TrainConfig):
    """-> (total loss, cross-entropy per depth [depth], regression loss)."""
    d = torch.arange(heads.depth)
    states = head_states(model, heads, f, seq, pos)                     # [R, k, H]
    target_z = f.z[seq[:, None], pos[:, None] + 1 + d]                  # [R, k, H]
    labels = f.ids[seq[:, None], pos[:, None] + 2 + d]                  # [R, k]
    reg = F.smooth_l1_loss(states.float(), target_z)
    sub = torch.linspace(0, len(seq) - 1, min(cfg.ce_positions, len(seq))).long()
    logits = model.head(states[sub])                                    # [r, k, V]
    if cfg.labels == "target":  # the target's own next-token distribution at t+1+i (self-distillation)
        with torch.no_grad():
            teacher = torch.softmax(model.head(target_z[sub].to(states.dtype)).float(), -1)
        ce = -(teacher * torch.log_softmax(logits.float(), -1)).sum(-1).mean(0)
    else:
        ce = F.cross_entropy(logits.flatten(0, 1), labels[sub].flatten(), reduction="none").view(len(sub), -1).mean(0)
    return ce.sum() + cfg.reg_weight * reg, ce.detach(), reg.detach()


def lr_at(cfg: TrainConfig, step: int) -> float:
    total, warm = cfg.steps + cfg.distill_steps, max(1, (cfg.steps + cfg.distill_steps) // 20)
    if step < warm:
        return cfg.lr * (step + 1) / warm
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, total - warm))))


# ---- evaluation
@torch.no_grad()
def accuracy(model, heads: DraftHeads, f: Features, rows: int = 1024, seed: int = 0) -> dict:
    """Per depth ``i``: how often the target's greedy token ``argmax head(z_{t+1+i})`` is the heads'
    top-1 / in their top-5, at ``rows`` held-out positions (mlp stages fed the true tokens)."""
    n_seq, S = f.ids.shape
    g = torch.Generator().manual_seed(seed)
    seq = torch.randint(n_seq, (rows,), generator=g)
    pos = torch.randint(S - heads.depth - 1, (rows,), generator=g)
    order = torch.argsort(seq * S + pos)
    seq, pos = seq[order], pos[order]
    top1, top5 = torch.zeros(heads.depth), torch.zeros(heads.depth)
    for s in range(0, rows, 256):
        sq, ps = seq[s: s + 256], pos[s: s + 256]
        d = torch.arange(heads.depth)
        want = model.head(f.z[sq[:, None], ps[:, None] + 1 + d]).argmax(-1)          # [r, k]
        top = model.head(head_states(model, heads, f, sq, ps))
        top = top.topk(min(5, top.shape[-1]), -1).indices                             # [r, k, 5]
        top1 += (top[..., 0] == want).float().sum(0)
        top5 += (top == want[..., None]).any(-1).float().sum(0)
    return {"top1": (top1 / rows).tolist(), "top5": (top5 / rows).tolist(), "positions": rows}


# ---- the loop
_MEMO: dict = {}  # one process training several kinds computes the data and the states once


def _memo(key, make, *refs):
    """``make()`` once per key; the objects whose ``id`` is in the key are kept alive with the entry,
    so an id cannot be reused by another object while the entry exists."""
    if key not in _MEMO:
        if len(_MEMO) > 8:
            _MEMO.clear()
        _MEMO[key] = (make(), refs)
    return _MEMO[key][0]


def training_data(model, tok, cfg: TrainConfig, progress: bool = True, log=print):
    """-> (phase-1 text ``[N, S]``, phase-2 generated ``[M, S]`` or None), made once per process."""
    def text():
        train_text, _ = corpus(cfg.text)
        return token_sequences(tok, train_text, cfg.seq_len, cfg.sequences)

    ids = _memo(("text", id(model), id(tok), cfg.seq_len, cfg.sequences, cfg.text), text, model, tok)
    log(f"{cfg.kind}: {ids.shape[0]} text sequences of {cfg.seq_len} tokens")
    if not cfg.distill_steps:
        return ids, None

    def generated():
        g = torch.Generator().manual_seed(cfg.seed)
        pick = torch.randperm(ids.shape[0], generator=g)[: cfg.generated]
        return generated_sequences(model, ids[pick, : min(32, cfg.seq_len // 4)], cfg.seq_len, cfg.seed,
                                   progress=_Bar(cfg.generated, "generating distillation text", progress))

    return ids, _memo(("generated", id(model), id(ids), cfg.generated, cfg.seed), generated, model, ids)


class _Bar:
    """A one-line progress bar on stderr (redrawn in place on a terminal, a line per 5% elsewhere)."""

    def __init__(self, total: int, label: str, enabled: bool = True):
        self.total, self.label, self.enabled = total, label, enabled
        self.t0, self.tty, self.last = time.perf_counter(), sys.stderr.isatty(), -1

    def __call__(self, done: int, note: str = "") -> None:
        if not self.enabled:
            return
        frac = done / max(self.total, 1)
        el = time.perf_counter() - self.t0
        eta = el / frac - el if frac > 0 else float("nan")
        bar = "#" * int(30 * frac) + "-" * (30 - int(30 * frac))
        line = f"{self.label} [{bar}] {done}/{self.total} {note} {el:.0f}s elapsed, eta {eta:.0f}s"
        if self.tty:
            sys.stderr.write("\r" + line[:160])
            if done >= self.total:
                sys.stderr.write("\n")
        elif int(20 * frac) != self.last or done >= self.total:
            self.last = int(20 * frac)
            sys.stderr.write(line + "\n")
        sys.stderr.flush()


def _check_resume(ckpt: dict, cfg: TrainConfig, path: str) -> None:
    # checkpoints from before ``labels`` trained on text; from before ``text``/``init``, on Python's docs from scratch
    have = {"labels": "text", "text": (), "init": None, **ckpt.get("config", {})}
    if have != asdict(cfg):
        diff = sorted(k for k in asdict(cfg) if have.get(k) != asdict(cfg)[k])
        raise ValueError(f"{path}: the checkpoint was written with other settings ({', '.join(diff)}); "
                         f"rerun with the same settings, or without --resume to start over")


def train(model, tok, cfg: TrainConfig, out_dir: str, resume: bool = False, checkpoint_every: int = 50,
          stop_after: int | None = None, progress: bool = True, log=print, eval_rows: int = 2048) -> tuple[DraftHeads, dict]:
    """Train one head set; writes ``<kind>.ckpt`` (every ``checkpoint_every`` steps), ``<kind>.safetensors``,
    ``<kind>-history.json``, ``<kind>-loss.png`` and ``<kind>-eval.json`` under ``out_dir``.
    ``stop_after``: stop (after checkpointing) at that step, as an interrupted run would.
    -> (heads, {"history": ..., "eval": ...})."""
    cfg.check()
    if cfg.seq_len > model.config.max_position_embeddings:
        raise ValueError(f"seq_len: {cfg.seq_len} tokens exceed the model's context of "
                         f"{model.config.max_position_embeddings}")
    _matplotlib()  # before any work: the loss curves are written at the end
    os.makedirs(out_dir, exist_ok=True)
    if model.dtype != torch.float32:  # the heads train in float32, on the target's float32 states and LM head
        log(f"{cfg.kind}: training on a float32 copy of the {str(model.dtype).removeprefix('torch.')} target")
        model = _memo(("float32", id(model)), lambda: copy.deepcopy(model).float(), model)
    for p in model.parameters():
        p.requires_grad_(False)
    torch.manual_seed(cfg.seed)
    heads = make_heads(cfg.kind, model.config, cfg.depth, cfg.layer).init_from(model)
    if cfg.init is not None:  # fine-tuning: start from a saved set (checked against the target and the settings)
        base = load_heads(cfg.init, model)
        got, want = (base.kind, base.depth, base.layer), (heads.kind, heads.depth, heads.layer)
        if got != want:
            raise ValueError(f"init: {cfg.init!r} holds a {base.kind} set of depth {base.depth}, layer "
                             f"{base.layer}; this run trains {heads.kind} of depth {heads.depth}, layer {heads.layer} "
                             f"(pass --kind, --depth and --layer to match)")
        heads.load_state_dict(base.state_dict())
    heads = heads.to(model.device)
    _, held_text = corpus(cfg.text)  # before any work: a held-out text too short to evaluate on fails here
    try:
        held_ids = token_sequences(tok, held_text, cfg.seq_len, 32)
    except ValueError as e:
        raise ValueError(f"text: the held-out pieces (every 10th) are too short to evaluate on: {e}; give more "
                         f"text or a smaller seq_len") from None
    opt = torch.optim.AdamW(heads.parameters(), lr=cfg.lr, weight_decay=0.0)
    ckpt_path = os.path.join(out_dir, f"{cfg.kind}.ckpt")
    history, start = {"step": [], "loss": [], "ce": [], "reg": [], "phase": []}, 0
    if resume:
        if not os.path.isfile(ckpt_path):
            raise FileNotFoundError(f"--resume: no checkpoint at {ckpt_path!r}")
        try:
            ckpt = torch.load(ckpt_path, map_location="cpu", weights_only=True)
            heads_sd, opt_sd = ckpt["heads"], ckpt["optimizer"]
        except Exception as e:
            raise ValueError(f"{ckpt_path}: not a readable train-heads checkpoint ({type(e).__name__}: {e})") from None
        _check_resume(ckpt, cfg, ckpt_path)
        heads.load_state_dict(heads_sd)
        opt.load_state_dict(opt_sd)
        history, start = ckpt["history"], ckpt["step"]
        log(f"resumed {cfg.kind} at step {start} from {ckpt_path}")

    layer, kv = heads.layer, isinstance(heads, HiddenTransfer)
    text, gen = training_data(model, tok, cfg, progress, log)
    phases = [_memo(("features", id(model), id(text), layer, kv), lambda: features(model, text, layer, kv),
                    model, text)]
    if cfg.distill_steps:
        phases.append(_memo(("features", id(model), id(gen), layer, kv), lambda: features(model, gen, layer, kv),
                                    model, gen))

    total = cfg.steps + cfg.distill_steps
    bar = _Bar(total, f"training {cfg.kind}", progress)
    for step in range(start, total):
        phase = 0 if step < cfg.steps else 1
        f = phases[phase]
        seq, pos = step_batch(cfg, f.ids.shape[0], step)
        for group in opt.param_groups:
            group["lr"] = lr_at(cfg, step)
        loss, ce, reg = losses(model, heads, f, seq, pos, cfg)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        for k, v in (("step", step), ("loss", loss.item()), ("ce", ce.tolist()), ("reg", reg.item()), ("phase", phase)):
            history[k].append(v)
        bar(step + 1, f"loss {loss.item():.3f} ce@1 {ce[0].item():.2f}")
        done = step + 1
        if done % checkpoint_every == 0 or done == total or done == stop_after:
            tmp = ckpt_path + ".tmp"
            torch.save({"config": asdict(cfg), "heads": heads.state_dict(), "optimizer": opt.state_dict(),
                        "step": done, "history": history}, tmp)
            os.replace(tmp, ckpt_path)
        if done == stop_after:
            return heads, {"history": history, "eval": None}

    # the training text's token counts rank the vocabulary for a draft vocabulary (generate's draft_vocab)
    heads.token_rank = token_rank(torch.bincount(text.flatten(), minlength=model.config.vocab_size))
    heads.save(os.path.join(out_dir, f"{cfg.kind}.safetensors"))
    held = features(model, held_ids, layer, isinstance(heads, HiddenTransfer))
    ev = accuracy(model, heads, held, rows=eval_rows, seed=cfg.seed)
    with open(os.path.join(out_dir, f"{cfg.kind}-eval.json"), "w") as fh:
        json.dump({"config": asdict(cfg), "heldout": ev}, fh, indent=1)
    with open(os.path.join(out_dir, f"{cfg.kind}-history.json"), "w") as fh:
        json.dump(history, fh)
    plot_losses({cfg.kind: history}, os.path.join(out_dir, f"{cfg.kind}-loss.png"), cfg.steps)
    log(f"{cfg.kind}: held-out top-1 per depth {[round(a, 3) for a in ev['top1']]}, "
        f"top-5 {[round(a, 3) for a in ev['top5']]}")
    return heads, {"history": history, "eval": ev}


def _matplotlib():
    try:
        import matplotlib
    except ImportError:
        raise ImportError("train-heads writes its loss curves with matplotlib: pip install matplotlib") from None
    return matplotlib


def plot_losses(histories: dict, path: str, phase1_steps: int | None = None) -> None:
    """Cross-entropy per depth against step, one panel per kind; the phase boundary dashed."""
    matplotlib = _matplotlib()
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(histories), figsize=(4.5 * len(histories), 3.6), squeeze=False)
    for ax, (kind, h) in zip(axes[0], histories.items()):
        ce = torch.tensor(h["ce"])
        w = max(1, len(h["step"]) // 40)  # a running mean: per-step losses are noisy
        for i in range(ce.shape[1]):
            c = ce[:, i]
            sm = torch.nn.functional.avg_pool1d(c[None, None], w, 1).flatten() if len(c) >= w else c
            ax.plot(h["step"][w - 1:] if len(c) >= w else h["step"], sm.tolist(), label=f"depth {i + 1}")
        boundary = phase1_steps if phase1_steps is not None else next(
            (s for s, p in zip(h["step"], h["phase"]) if p == 1), None)
        if boundary is not None and boundary < (h["step"][-1] if h["step"] else 0):
            ax.axvline(boundary, ls="--", c="gray", lw=1)
        ax.set_title(kind)
        ax.set_xlabel("step")
        ax.set_ylabel("cross-entropy (nats)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
