"""``LlamaConfig``: the architecture hyper-parameters, with Hugging Face's LlamaConfig field names."""
from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field

_SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


@dataclass
class LlamaConfig:
    """Llama architecture (GQA, RoPE, RMSNorm, SwiGLU), field names as in ``transformers.LlamaConfig``.

    ``num_key_value_heads`` defaults to ``num_attention_heads`` (MHA) and ``head_dim`` to
    ``hidden_size // num_attention_heads``. ``rope_scaling`` is ``None`` or a dict with ``rope_type``
    (or ``type``) ``"default"``, ``"linear"`` (``factor``) or ``"llama3"`` (``factor``,
    ``low_freq_factor``, ``high_freq_factor``, ``original_max_position_embeddings``).
    """

    vocab_size: int = 32000
    hidden_size: int = 4096
    intermediate_size: int = 11008
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    max_position_embeddings: int = 2048
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    initializer_range: float = 0.02
    bos_token_id: int | None = None
    eos_token_id: int | list | None = None
    pad_token_id: int | None = None
    extra: dict = field(default_factory=dict, repr=False)  # unknown HF fields, kept for round trips

    def __post_init__(self):
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "max_position_embeddings"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"LlamaConfig.{name} must be a positive int, got {v!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"LlamaConfig.num_attention_heads ({self.num_attention_heads}) must be a multiple "
                             f"of num_key_value_heads ({self.num_key_value_heads})")
        if self.head_dim is None:
            if self.hidden_size % self.num_attention_heads:
                raise ValueError("LlamaConfig.hidden_size must be a multiple of num_attention_heads "
                                 "(or give head_dim)")
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.head_dim < 2 or self.head_dim % 2:
            raise ValueError(f"LlamaConfig.head_dim must be even and >= 2 (RoPE rotates pairs), got {self.head_dim}")
        if not self.rope_theta > 0:
            raise ValueError(f"LlamaConfig.rope_theta must be > 0, got {self.rope_theta}")
        if not self.rms_norm_eps > 0:
            raise ValueError(f"LlamaConfig.rms_norm_eps must be > 0, got {self.rms_norm_eps}")
        if self.rope_scaling is not None:
            rs = dict(self.rope_scaling)
            kind = rs.get("rope_type", rs.get("type", "default"))
            if kind not in _SUPPORTED_ROPE_TYPES:
                raise ValueError(f"LlamaConfig.rope_scaling type {kind!r} is not supported "
                                 f"(supported: {', '.join(_SUPPORTED_ROPE_TYPES)})")
            need = {"linear": ("factor",), "llama3": ("factor", "low_freq_factor", "high_freq_factor",
                                                      "original_max_position_embeddings")}.get(kind, ())
            missing = [k for k in need if k not in rs]
            if missing:
                raise ValueError(f"LlamaConfig.rope_scaling of type {kind!r} needs {', '.join(missing)}")
            rs["rope_type"] = kind
            self.rope_scaling = rs

    @property
    def rope_type(self) -> str:
        return "default" if self.rope_scaling is None else self.rope_scaling["rope_type"]

    # ---- Hugging Face config.json round trip
    @classmethod
    def from_dict(cls, d: dict) -> "LlamaConfig":
        """From a Hugging Face ``config.json`` dict. Llama features we do not implement raise."""
        d = dict(d)
        arch = d.get("model_type")
        if arch not in (None, "llama", "mistral"):
            raise ValueError(f"config model_type {arch!r} is not a Llama architecture")
        for flag in ("attention_bias", "mlp_bias"):
            if d.get(flag):
                raise ValueError(f"config {flag}=True is not supported by triforce.models.Llama")
        if d.get("hidden_act", "silu") != "silu":
            raise ValueError(f"config hidden_act {d['hidden_act']!r} is not supported (SwiGLU uses silu)")
        names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        known = {k: v for k, v in d.items() if k in names}
        extra = {k: v for k, v in d.items() if k not in names}
        return cls(**known, extra=extra)

    @classmethod
    def from_json_file(cls, path: str | os.PathLike) -> "LlamaConfig":
        with open(path) as f:
            return cls.from_dict(json.load(f))

    def to_dict(self) -> dict:
        d = {**self.extra, **{f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "extra"}}
        d["model_type"] = "llama"
        d.setdefault("architectures", ["LlamaForCausalLM"])
        d.setdefault("hidden_act", "silu")
        return d

    def replace(self, **changes) -> "LlamaConfig":
        return dataclasses.replace(self, **changes)
