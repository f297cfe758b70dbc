"""Weight loading: Hugging Face directories (config.json + safetensors) and GGUF files.

GGUF tensors are dequantised to float32 with the ``gguf`` package. llama.cpp's converter permutes the
rows of ``attn_q`` / ``attn_k`` so that RoPE rotates interleaved pairs (x0, x1), (x2, x3), ...; our
RoPE (like HF's) rotates the half-split pairs (x_i, x_{i + D/2}), so we apply the inverse permutation,
exactly as ``transformers``' GGUF loader does. Converted GGUF models are cached as a Hugging Face
directory under ``~/.cache/triforce`` (or ``$TRIFORCE_CACHE_DIR``), keyed by the file's path, size and
modification time, so the second load skips the dequantisation.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch

from .config import LlamaConfig

_GGUF_NAMES = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
}


def default_cache_dir() -> Path:
    if os.environ.get("TRIFORCE_CACHE_DIR"):
        return Path(os.environ["TRIFORCE_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "triforce"


def _is_gguf(path: Path) -> bool:
    if path.suffix.lower() == ".gguf":
        return True
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"GGUF"
    except OSError:
        return False


def load_pretrained(path, device=None, dtype=None, cache_dir=None):
    """See :meth:`triforce.models.Llama.from_pretrained`."""
    path = Path(path).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"no model at {str(path)!r} (expected a Hugging Face directory or a .gguf file)")
    if path.is_dir():
        return _load_hf_dir(path, device, dtype)
    if _is_gguf(path):
        if cache_dir is False:
            config, sd = read_gguf(path)
            return _build(config, sd, device, dtype)
        cached = gguf_cache_path(path, cache_dir)
        if not (cached / "model.safetensors").exists():
            config, sd = read_gguf(path)
            _write_hf_dir(cached, config, sd)
        return _load_hf_dir(cached, device, dtype)
    raise ValueError(f"{str(path)!r} is neither a directory nor a GGUF file")


# Part of the cache key: bump it when read_gguf's output changes, so that no conversion by an older reader
# is reused (2: metadata that read_gguf used to ignore, e.g. a yarn rope.scaling.type, now raises).
_GGUF_CACHE_VERSION = 2


def gguf_cache_path(path: Path, cache_dir=None) -> Path:
    st = path.stat()
    ident = f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}|v{_GGUF_CACHE_VERSION}"
    key = hashlib.sha256(ident.encode()).hexdigest()[:16]
    return Path(cache_dir or default_cache_dir()) / f"{path.stem}-{key}"


# ---- Hugging Face layout
def _load_hf_dir(directory: Path, device, dtype):
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    cfg = directory / "config.json"
    if not cfg.exists():
        raise FileNotFoundError(f"{str(directory)!r} has no config.json (not a Hugging Face model directory)")
    try:
        config = LlamaConfig.from_json_file(cfg)
    except (json.JSONDecodeError, TypeError) as e:
        raise ValueError(f"{str(cfg)!r} is not a valid Llama config: {e}") from None
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{str(directory)!r} has no *.safetensors weights")
    sd = {}
    for f in files:
        try:
            sd.update(load_file(f))
        except (SafetensorError, OSError, ValueError) as e:
            raise ValueError(f"cannot read {str(f)!r} (corrupt or not safetensors): {e}") from None
    return _build(config, sd, device, dtype)


def _build(config: LlamaConfig, sd: dict, device, dtype):
    from .llama import Llama

    with torch.device("meta"):
        model = Llama(config)
    sd = dict(sd)
    if config.tie_word_embeddings:
        sd.pop("lm_head.weight", None)
    expected = {k for k in model.state_dict() if not (config.tie_word_embeddings and k == "lm_head.weight")}
    missing, unexpected = sorted(expected - sd.keys()), sorted(sd.keys() - expected)
    unexpected = [k for k in unexpected if not k.endswith("rotary_emb.inv_freq")]
    if missing or unexpected:
        raise ValueError(f"weights do not match the config: missing {missing[:5]}{'...' if len(missing) > 5 else ''}, "
                         f"unexpected {unexpected[:5]}{'...' if len(unexpected) > 5 else ''}")
    dev = torch.device(device) if device is not None else torch.device("cpu")
    dtype = dtype or torch.float32
    for name, p in model.state_dict(keep_vars=True).items():
        if name in sd and tuple(sd[name].shape) != tuple(p.shape):
            raise ValueError(f"weight {name} has shape {list(sd[name].shape)}, the config implies {list(p.shape)}")
    sd = {k: v.to(device=dev, dtype=dtype) for k, v in sd.items() if k in expected}
    model.load_state_dict(sd, strict=False, assign=True)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    from .rope import rope_inv_freq
    model.inv_freq = rope_inv_freq(config, dev)
    return model.eval()


def save_pretrained(model, directory) -> None:
    _write_hf_dir(Path(directory), model.config, model.state_dict())


def _write_hf_dir(directory: Path, config: LlamaConfig, sd: dict) -> None:
    """Write atomically (temporary directory + rename), so an interrupted write never leaves a cache hit."""
    from safetensors.torch import save_file

    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=directory.name + ".tmp", dir=directory.parent))
    try:
        tensors = {k: v.detach().contiguous().cpu() for k, v in sd.items()
                   if not (config.tie_word_embeddings and k == "lm_head.weight")}
        save_file(tensors, tmp / "model.safetensors", metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(config.to_dict(), indent=2))
        if directory.exists():
            shutil.rmtree(directory)
        os.replace(tmp, directory)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


# ---- GGUF
def open_gguf(path: Path):
    import gguf

    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as e:  # the reader raises ValueError/struct.error/IndexError on garbage
        raise ValueError(f"cannot read GGUF file {str(path)!r} (corrupt or truncated): {type(e).__name__}: {e}") from None
    return reader


def gguf_field(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.contents()


def _unpermute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """Inverse of llama.cpp's ``permute`` (interleaved RoPE pairs -> half-split pairs), per head."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


# llama.* GGUF metadata: what read_gguf reads, what never changes the logits, and what is supported at
# one value only (key -> (harmless(value, config), the value we implement)). Any other llama.* key raises.
_GGUF_READ = frozenset({
    "vocab_size", "context_length", "embedding_length", "block_count", "feed_forward_length",
    "attention.head_count", "attention.head_count_kv", "attention.key_length", "attention.layer_norm_rms_epsilon",
    "rope.freq_base", "rope.scaling.type", "rope.scaling.factor", "rope.scale_linear",
})
_GGUF_METADATA = frozenset({
    "tensor_data_layout",  # how the converter read the checkpoint; the stored q/k layout is the same
    "rope.scaling.finetuned", "rope.scaling.original_context_length",  # read by yarn only, which raises
})
_GGUF_HARMLESS_ONLY_AT = {
    "attention.value_length": (lambda v, c: v == c.head_dim, "attention.key_length (one head_dim)"),
    "rope.dimension_count": (lambda v, c: v == c.head_dim, "head_dim (RoPE on the whole head)"),
    "rope.scaling.attn_factor": (lambda v, c: v == 1, "1.0"),
    "attention.causal": (lambda v, c: v is True, "true"),
    "attention.sliding_window": (lambda v, c: v == 0 or v >= c.max_position_embeddings,
                                 "0 or >= context_length (no sliding-window attention)"),
    "use_parallel_residual": (lambda v, c: v is False, "false"),
    "expert_count": (lambda v, c: v == 0, "0 (dense MLP)"),
    "expert_used_count": (lambda v, c: v == 0, "0 (dense MLP)"),
    "logit_scale": (lambda v, c: v == 1, "1.0"),
    "embedding_scale": (lambda v, c: v == 1, "1.0"),
    "residual_scale": (lambda v, c: v == 1, "1.0"),
}


def _gguf_rope_scaling(reader, path: Path):
    """``rope_scaling`` as llama.cpp reads it: a missing ``rope.scaling.type`` means linear, the factor is
    ``rope.scaling.factor`` (or the older ``rope.scale_linear``; 0 or missing: none); ``none`` turns it
    off; yarn / longrope raise."""
    kind = gguf_field(reader, "llama.rope.scaling.type")
    factor = gguf_field(reader, "llama.rope.scaling.factor", gguf_field(reader, "llama.rope.scale_linear"))
    factor = float(factor) if factor is not None else 0.0
    if kind not in (None, "linear", "none"):
        raise ValueError(f"GGUF file {str(path)!r} has llama.rope.scaling.type = {kind!r}; only linear RoPE "
                         "scaling is supported (use a model without yarn / longrope scaling)")
    if kind == "none":
        if factor not in (0.0, 1.0):
            raise ValueError(f"GGUF file {str(path)!r} has llama.rope.scaling.type = 'none' but "
                             f"llama.rope.scaling.factor = {factor}; the two contradict each other")
        return None
    return None if factor in (0.0, 1.0) else {"rope_type": "linear", "factor": factor}


def _check_gguf_keys(reader, config: LlamaConfig, path: Path) -> None:
    for full in reader.fields:
        if not full.startswith("llama."):
            continue  # general.* (provenance), tokenizer.* (the tokenizer), GGUF.* (the container)
        key = full[len("llama."):]
        if key in _GGUF_READ or key in _GGUF_METADATA:
            continue
        value = gguf_field(reader, full)
        if key in _GGUF_HARMLESS_ONLY_AT:
            harmless, supported = _GGUF_HARMLESS_ONLY_AT[key]
            if not harmless(value, config):
                raise ValueError(f"GGUF file {str(path)!r} has {full} = {value!r}; triforce.models.Llama "
                                 f"implements only {supported} and would compute different logits")
            continue
        raise ValueError(f"GGUF file {str(path)!r} has metadata {full}, which triforce.models.Llama does not "
                         "understand and which could change the model's math; use a plain Llama GGUF")


def read_gguf(path: Path):
    """(LlamaConfig, float32 HF-named state dict) from a llama-architecture GGUF file."""
    import gguf

    reader = open_gguf(path)
    arch = gguf_field(reader, "general.architecture")
    if arch != "llama":
        raise ValueError(f"GGUF file {str(path)!r} has architecture {arch!r}; only 'llama' is supported")

    def need(key):
        v = gguf_field(reader, f"llama.{key}")
        if v is None:
            raise ValueError(f"GGUF file {str(path)!r} lacks metadata llama.{key}")
        return v

    tensors = {t.name: t for t in reader.tensors}
    if "rope_freqs.weight" in tensors:
        raise ValueError("GGUF files with rope_freqs (Llama-3.1 frequency factors) are not supported; "
                         "load the Hugging Face checkpoint instead")
    n_head, n_kv = int(need("attention.head_count")), int(gguf_field(reader, "llama.attention.head_count_kv",
                                                                  need("attention.head_count")))
    hidden = int(need("embedding_length"))
    if "token_embd.weight" not in tensors:
        raise ValueError(f"GGUF file {str(path)!r} has no token_embd.weight")
    vocab = int(gguf_field(reader, "llama.vocab_size", 0)) or int(tensors["token_embd.weight"].shape[1])
    head_dim = int(gguf_field(reader, "llama.attention.key_length", 0)) or hidden // n_head
    tok = lambda k: gguf_field(reader, f"tokenizer.ggml.{k}")  # noqa: E731
    config = LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=int(need("feed_forward_length")),
        num_hidden_layers=int(need("block_count")), num_attention_heads=n_head, num_key_value_heads=n_kv,
        head_dim=head_dim, max_position_embeddings=int(need("context_length")),
        rope_theta=float(gguf_field(reader, "llama.rope.freq_base", 10000.0)),  # llama.cpp's default too
        rope_scaling=_gguf_rope_scaling(reader, path),
        rms_norm_eps=float(need("attention.layer_norm_rms_epsilon")),
        tie_word_embeddings="output.weight" not in tensors,
        bos_token_id=tok("bos_token_id"), eos_token_id=tok("eos_token_id"), pad_token_id=tok("padding_token_id"))
    _check_gguf_keys(reader, config, path)

    sd = {}
    for name, t in tensors.items():
        try:
            w = torch.from_numpy(gguf.quants.dequantize(t.data, t.tensor_type).copy()).float()
        except Exception as e:
            raise ValueError(f"cannot dequantise tensor {name} ({t.tensor_type.name}) of {str(path)!r}: {e}") from None
        if name == "token_embd.weight":
            key = "model.embed_tokens.weight"
        elif name == "output_norm.weight":
            key = "model.norm.weight"
        elif name == "output.weight":
            key = "lm_head.weight"
        elif name.startswith("blk."):
            _, i, kind, suffix = name.split(".", 3)
            if kind not in _GGUF_NAMES or suffix != "weight":  # e.g. attn_q.bias: biases are not implemented
                raise ValueError(f"unexpected GGUF tensor {name} in {str(path)!r} (triforce.models.Llama has "
                                 f"no such parameter)")
            key = f"model.layers.{int(i)}.{_GGUF_NAMES[kind]}.weight"
            if kind == "attn_q":
                w = _unpermute(w, n_head)
            elif kind == "attn_k":
                w = _unpermute(w, n_kv)
        else:
            raise ValueError(f"unexpected GGUF tensor {name}")
        sd[key] = w
    return config, sd
