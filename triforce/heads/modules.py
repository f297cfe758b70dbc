"""Trained draft heads on a target's own hidden states (docs/heads.md).

Four kinds, one interface. Each set drafts ``depth`` tokens *after* the target's pending token (the
token the last verification sampled) from the hidden state of the last accepted position ``t``:

* ``medusa``: ``depth`` independent residual blocks on the final-normed hidden state ``z_t``; block
  ``i`` predicts token ``t+2+i`` through the target's LM head (Cai et al., Medusa-1 heads).
* ``early_exit``: the same blocks on the residual stream entering decoder layer ``layer`` (through
  their own RMSNorm): the "early exiting" row of the Hidden Transfer paper's comparison.
* ``mlp``: the multi-stage MLP speculator (IBM): stage ``i`` maps the previous stage's state and the
  embedding of the token stage ``i-1`` predicted (stage 0: ``z_t`` and the pending token) to a new
  state, read by the LM head; each guess is conditioned on the one before it.
* ``hidden_transfer``: ``depth`` linear maps turn the residual stream of position ``t`` entering layer
  ``layer`` into pseudo hidden states of positions ``t+1 .. t+depth``, which continue through the
  remaining layers attending to the context and to each other; the LM head reads the drafts off them
  (Wu et al.). In decoding the pseudo tokens ride in the verification pass (``HiddenTransfer.tap``).

Every set shares the target's embedding, final norm and LM head (never stored), so a set is a few MB.
Every trainable map starts at the identity (zero-initialised residual), so an untrained set already
predicts like the target's own next-token head.
"""
from __future__ import annotations

import json
import math
import os

import torch
import torch.nn.functional as F
from torch import nn

from triforce.models.llama import GemmaRMSNorm, LayerNorm1P, RMSNorm

KINDS = ("medusa", "mlp", "hidden_transfer", "early_exit")
FORMAT = 1
TOKEN_RANK = "token_rank"  # the saved set's tensor holding DraftHeads.token_rank (absent: no ranking)


def token_rank(counts: torch.Tensor) -> torch.Tensor:
    """Token ids by ``counts`` (``[vocab_size]``), most frequent first; ties (unseen tokens among them) in
    id order -> int64 ``[vocab_size]``."""
    return torch.sort(-counts.to(torch.float64), stable=True).indices


def default_layer(num_hidden_layers: int) -> int:
    """The tapped layer of ``hidden_transfer`` / ``early_exit`` by default: two thirds of the way up."""
    return max(1, (2 * num_hidden_layers) // 3)


def target_identity(config) -> dict:
    """What a head set must agree on with the target it drafts for."""
    return {"architecture": config.model_type, "hidden_size": config.hidden_size, "vocab_size": config.vocab_size,
            "num_hidden_layers": config.num_hidden_layers, "num_attention_heads": config.num_attention_heads,
            "num_key_value_heads": config.num_key_value_heads, "head_dim": config.head_dim}


def _rms(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def _zero_linear(h: int, bias: bool = True) -> nn.Linear:
    lin = nn.Linear(h, h, bias=bias)
    nn.init.zeros_(lin.weight)
    if bias:
        nn.init.zeros_(lin.bias)
    return lin


class DraftHeads(nn.Module):
    """Base class: ``kind``, ``depth`` (tokens drafted past the pending one), ``layer`` (the tapped
    decoder layer, or None), ``target`` (the identity of the model it was built for)."""

    kind: str = ""
    reads_layer = False  # reads the residual stream entering ``layer`` (else the final-normed state)

    def __init__(self, config, depth: int, layer: int | None = None):
        super().__init__()
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise ValueError(f"depth: expected an int >= 1, got {depth!r}")
        n = config.num_hidden_layers
        if self.reads_layer:
            if n < 2:
                raise ValueError(f"layer: {self.kind!r} heads tap a layer in [1, num_hidden_layers - 1], and a "
                                 f"model of {n} layer has none; use medusa or mlp heads")
            layer = default_layer(n) if layer is None else layer
            if isinstance(layer, bool) or not isinstance(layer, int) or not 1 <= layer < n:
                raise ValueError(f"layer: expected an int in [1, {n - 1}], got {layer!r}")
        elif layer is not None:
            raise ValueError(f"layer: {self.kind!r} heads read the final hidden state and take no layer")
        self.depth, self.layer = depth, layer
        self.target = target_identity(config)
        self.hidden_size, self.eps = config.hidden_size, config.rms_norm_eps
        # The target's token ids, most frequent in the training text first (int64 [vocab_size]), or None:
        # what a draft vocabulary (generate's ``draft_vocab``) keeps. Not a parameter: saved beside them.
        self.token_rank: torch.Tensor | None = None

    # ---- identity, saving, loading
    def meta(self) -> dict:
        return {"format": FORMAT, "kind": self.kind, "depth": self.depth, "layer": self.layer, "eps": self.eps,
                "target": self.target}

    def check_target(self, model) -> None:
        """Raise ``ValueError`` naming the difference when ``model`` is not the kind of model these heads
        were trained for."""
        have = target_identity(model.config)
        diff = [f"{k}: heads {self.target.get(k)!r}, model {v!r}" for k, v in have.items() if self.target.get(k) != v]
        if diff:
            raise ValueError(f"these {self.kind} heads were trained for another model ({'; '.join(diff)})")

    def init_from(self, model) -> "DraftHeads":
        """Copy what starts from the target (norm weights) so an untrained set predicts as its head. A Gemma
        target's final norm scales by ``1 + w`` (:class:`~triforce.models.llama.GemmaRMSNorm`), as a Nemotron one's
        (:class:`~triforce.models.llama.LayerNorm1P`): the heads' norms, which scale by their weight, start at that
        factor; OLMo's has no weight (:class:`~triforce.models.llama.BareLayerNorm`): 1."""
        self.check_target(model)
        norm = model.model.norm
        w = norm._parameters.get("weight")
        factor = (1.0 if w is None else w.float()) + (1.0 if isinstance(norm, (GemmaRMSNorm, LayerNorm1P)) else 0.0)
        with torch.no_grad():
            for m in self.modules():
                if isinstance(m, RMSNorm):
                    m.weight.copy_(factor)
        return self

    def save(self, path: str | os.PathLike) -> None:
        """One safetensors file: the trainable weights (float32) + ``meta()`` as JSON metadata."""
        from safetensors.torch import save_file

        sd = {k: v.detach().float().contiguous().cpu() for k, v in self.state_dict().items()}
        if self.token_rank is not None:
            sd[TOKEN_RANK] = self.token_rank.to(torch.int64).contiguous().cpu()
        tmp = f"{os.fspath(path)}.tmp"
        save_file(sd, tmp, metadata={"triforce_heads": json.dumps(self.meta())})
        os.replace(tmp, path)


class MedusaHeads(DraftHeads):
    """``medusa`` (``layer=None``: reads ``z_t``) and ``early_exit`` (reads the stream entering ``layer``)."""

    kind = "medusa"

    def __init__(self, config, depth: int = 4, layer: int | None = None):
        super().__init__(config, depth, layer)
        h = config.hidden_size
        self.blocks = nn.ModuleList(_zero_linear(h) for _ in range(depth))
        self.norm = RMSNorm(h, config.rms_norm_eps) if self.reads_layer else None

    def states(self, x: torch.Tensor, n: int | None = None) -> torch.Tensor:
        """``[..., H]`` -> ``[..., n, H]`` (``n <= depth``, default depth): the LM head's input for each
        of the next ``n`` future tokens."""
        if self.norm is not None:
            x = self.norm(x)
        return torch.stack([x + F.silu(b(x)) for b in self.blocks[: n or self.depth]], -2)


class EarlyExitHeads(MedusaHeads):
    kind = "early_exit"
    reads_layer = True


class MLPSpeculator(DraftHeads):
    """Stage ``i``: ``s_{i+1} = gelu(LN_i(a * P_i s_i + b * rms(E[x_i])))``, logits
    ``head(N_i(O_i s_{i+1}))`` for token ``t+2+i``; ``s_0 = z_t``, ``x_0`` = the pending token, ``x_i`` =
    stage ``i-1``'s token. ``a = 0.5 ** (0.5 / depth)`` and ``b = sqrt(1 - a^2)`` weigh the state
    against the token (as IBM's speculator's state/embedding weights). IBM's speculator has a trained
    head per stage; ours shares the target's frozen LM head, which reads signed final-normed states, so
    a linear map ``O_i`` takes the (GELU, nearly non-negative) state back to that space."""

    kind = "mlp"

    def __init__(self, config, depth: int = 4, layer: int | None = None):
        super().__init__(config, depth, layer)
        h = config.hidden_size
        self.proj = nn.ModuleList(nn.Linear(h, h, bias=False) for _ in range(depth))
        for p in self.proj:
            nn.init.eye_(p.weight)
        self.ln = nn.ModuleList(nn.LayerNorm(h) for _ in range(depth))
        self.out = nn.ModuleList(nn.Linear(h, h, bias=False) for _ in range(depth))
        for o in self.out:
            nn.init.eye_(o.weight)
        self.out_norm = nn.ModuleList(RMSNorm(h, config.rms_norm_eps) for _ in range(depth))
        self.a = 0.5 ** (0.5 / depth)
        self.b = math.sqrt(1 - self.a ** 2)

    def stage(self, model, i: int, state: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """``state [..., H]``, ``tokens [...]`` (int64) -> the next state ``[..., H]``."""
        emb = _rms(model.model.embed_tokens(tokens).to(state.dtype))
        return F.gelu(self.ln[i](self.a * self.proj[i](state) + self.b * emb))

    def stage_input(self, i: int, state: torch.Tensor) -> torch.Tensor:
        """The LM head's input for stage ``i``'s token, from the state ``stage`` returned."""
        return self.out_norm[i](self.out[i](state))

    def teacher_forced(self, model, z: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Training: ``z [N, H]`` at positions ``t``, ``tokens [N, depth]`` = ``x_{t+1} .. x_{t+depth}``
        (the ground truth fed to each stage) -> the states ``[N, depth, H]`` the LM head reads."""
        out, s = [], z
        for i in range(self.depth):
            s = self.stage(model, i, s, tokens[:, i])
            out.append(self.out_norm[i](self.out[i](s)))
        return torch.stack(out, 1)


class HiddenTransfer(DraftHeads):
    """``pseudo_i = h_t + M_i h_t`` (``i = 1 .. depth``) for the stream ``h_t`` entering ``layer``."""

    kind = "hidden_transfer"
    reads_layer = True

    def __init__(self, config, depth: int = 4, layer: int | None = None):
        super().__init__(config, depth, layer)
        self.maps = nn.ModuleList(_zero_linear(config.hidden_size) for _ in range(depth))

    def pseudo(self, h: torch.Tensor, n: int | None = None) -> torch.Tensor:
        """``[..., H]`` -> ``[..., n, H]`` (``n <= depth``, default depth) pseudo hidden states."""
        return torch.stack([h + m(h) for m in self.maps[: n or self.depth]], -2)

    def upper_forward(self, model, h: torch.Tensor, anchors: torch.Tensor, keys: list, values: list) -> torch.Tensor:
        """Training forward of the pseudo tokens (gradients flow to the maps only).

        ``h [S, H]``: one sequence's stream entering ``layer``; ``anchors [A]`` positions ``t``; ``keys``,
        ``values``: per layer ``>= layer``, that sequence's cached (RoPE'd) keys/values ``[S, Hkv, D]``.
        Pseudo token ``i`` of anchor ``t`` sits at position ``t+i`` and attends to real positions ``<= t``
        and to pseudo tokens ``1 .. i`` of its anchor, exactly the tree mask the decoding tap builds.
        -> final-normed states ``[A, depth, H]``."""
        for j, layer in enumerate(model.model.layers[self.layer:], start=self.layer):
            att = layer._modules.get("self_attn")
            if "mamba" in layer._modules or not hasattr(att, "project") or not hasattr(layer, "residual"):
                raise ValueError(f"hidden_transfer heads train through the attention of the layers past their tap; "
                                 f"layer {j}'s mixer is {'a Mamba mixer beside ' if 'mamba' in layer._modules else ''}"
                                 f"{type(att).__name__}, whose state this training does not run: use medusa or mlp "
                                 "heads, or tap a layer past it")
        k_n, S, A = self.depth, h.shape[0], anchors.shape[0]
        x = self.pseudo(h[anchors]).reshape(1, A * k_n, -1)  # [1, A*k, H]
        i = torch.arange(1, k_n + 1, device=h.device)
        pos = (anchors[:, None] + i).reshape(1, -1)
        # per layer (Gemma 3's sliding layers: their own RoPE); LongRoPE's factors as the features' cache of S
        # slots rotated the keys (FullCache's default)
        start = model.config.rope_long_from
        ropes = model.rope_tables(pos, x.dtype, rows_long=None if start is None else S > start)
        real = torch.arange(S, device=h.device)[None, :] <= anchors.repeat_interleave(k_n)[:, None]  # [A*k, S]
        grp = torch.arange(A, device=h.device).repeat_interleave(k_n)
        idx = i.repeat(A)
        own = (grp[:, None] == grp[None, :]) & (idx[None, :] <= idx[:, None])  # [A*k, A*k]
        mask = torch.cat([real, own], 1)
        near = pos[0][:, None] - torch.arange(S, device=h.device)[None, :]  # query position - real position
        for j, layer in enumerate(model.model.layers[self.layer:]):
            att = layer.self_attn
            xn = layer.input_layernorm(x)
            q, kk, _, vv = att.project(xn, *ropes[self.layer + j])
            if att.temperature is not None:  # Ministral 3's query temperature, at the queries' positions
                q = att.temper(q, pos)
            K = torch.cat([keys[j][None].to(kk.dtype), kk], 1)
            V = torch.cat([values[j][None].to(vv.dtype), vv], 1)
            m = mask
            if att.window:  # a sliding window: the real positions of the query's last W (its pseudo ones are nearer)
                m = torch.cat([real & (near < att.window), own & (idx[:, None] - idx[None, :] < att.window)], 1)
            if att.alibi is not None:  # ALiBi (BLOOM, MPT, Falcon-RW): -slope x the key's distance from its query,
                # as verify_attention's alibi_slopes (a pseudo key i' of the query's anchor is i - i' before it)
                dist = torch.cat([near, (idx[:, None] - idx[None, :]).expand(-1, A * k_n)], 1).clamp(min=0)
                slopes = torch.tensor(att.alibi, dtype=torch.float32, device=h.device)[:, None, None]
                m = (-slopes * dist).masked_fill(~m, float("-inf")).to(q.dtype)
            o = F.scaled_dot_product_attention(q.transpose(1, 2), K.transpose(1, 2), V.transpose(1, 2),
                                               attn_mask=m, scale=att.scale, enable_gqa=att.n_heads != att.n_kv)
            x = layer.residual(x, att.output(o.transpose(1, 2).reshape(1, A * k_n, -1), xn))
        return model.model.norm(x).view(A, k_n, -1)


_CLASSES = {c.kind: c for c in (MedusaHeads, EarlyExitHeads, MLPSpeculator, HiddenTransfer)}


def make_heads(kind: str, config, depth: int = 4, layer: int | None = None) -> DraftHeads:
    """A new (untrained, identity-initialised) head set of ``kind`` for a model with ``config``."""
    if kind not in _CLASSES:
        raise ValueError(f"kind: expected one of {', '.join(KINDS)}, got {kind!r}")
    return _CLASSES[kind](config, depth, layer)


def _is_pos_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


def load_heads(path: str | os.PathLike, model=None) -> DraftHeads:
    """Load a head set saved by :meth:`DraftHeads.save`; with ``model``, check it was trained for it."""
    from safetensors import safe_open

    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no head set at {path!r}")
    try:
        with safe_open(path, "pt") as f:
            meta = json.loads((f.metadata() or {})["triforce_heads"])
            sd = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as e:  # safetensors raises its own error types on garbage
        raise ValueError(f"{path!r} is not a triforce head set: {type(e).__name__}: {e}") from None
    if not isinstance(meta, dict):
        raise ValueError(f"{path!r}: the head-set metadata must be a JSON object, got {type(meta).__name__}")
    if meta.get("format") != FORMAT or meta.get("kind") not in _CLASSES:
        raise ValueError(f"{path!r}: unsupported head-set format {meta.get('format')!r} / kind {meta.get('kind')!r}")
    t = meta.get("target")
    fields = ("hidden_size", "vocab_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
              "head_dim")
    missing = [k for k in ("depth", "layer") if k not in meta]
    if not isinstance(t, dict):
        missing.append("target")
    else:
        missing += [f"target.{k}" for k in fields if not _is_pos_int(t.get(k))]
    if missing:
        raise ValueError(f"{path!r}: the head-set metadata lacks or has a bad {', '.join(missing)} (the target "
                         "model's shape, positive ints); not a set written by DraftHeads.save")

    class _Cfg:  # the config fields the constructors read
        model_type = t.get("architecture", "llama")
        hidden_size, vocab_size = t["hidden_size"], t["vocab_size"]
        num_hidden_layers, num_attention_heads = t["num_hidden_layers"], t["num_attention_heads"]
        num_key_value_heads, head_dim, rms_norm_eps = t["num_key_value_heads"], t["head_dim"], meta.get("eps", 1e-5)

    try:
        heads = _CLASSES[meta["kind"]](_Cfg, meta["depth"], meta["layer"])
    except ValueError as e:
        raise ValueError(f"{path!r}: {e}") from None
    heads.target = t
    rank = sd.pop(TOKEN_RANK, None)
    if rank is not None:
        V = t["vocab_size"]
        if (rank.dim() != 1 or rank.dtype != torch.int64 or rank.numel() != V
                or not torch.equal(rank.sort().values, torch.arange(V))):
            raise ValueError(f"{path!r}: {TOKEN_RANK} must hold each of the {V} token ids once (int64)")
        heads.token_rank = rank
    try:
        heads.load_state_dict(sd)
    except RuntimeError as e:
        raise ValueError(f"{path!r}: weights do not match a {meta['kind']} set of depth {meta['depth']}: {e}") from None
    if model is not None:
        heads.check_target(model)
    return heads
