"""``LlamaConfig``: the architecture hyper-parameters, with Hugging Face's LlamaConfig field names.

Reading a ``config.json`` is strict: every key is either implemented (a field of ``LlamaConfig``, or
the RoPE settings in either transformers spelling), known not to change the logits (``_METADATA_KEYS``),
or supported only at one harmless value (``_HARMLESS_ONLY_AT``, checked by value). Anything else
raises ``ValueError`` naming the key: a key we do not understand may change the math, and loading it
anyway would give silently wrong logits.

Families (``model_type``): ``llama`` (Llama 2/3, SmolLM; ``iquestcoder`` and ``internlm3`` under their own
defaults), ``mistral``, ``qwen2`` (Qwen2 and Qwen2.5), ``qwen3``, ``gemma`` (Gemma 1), ``gemma2``, ``vaultgemma``
(Gemma 2 without its post-norms), ``gemma3_text`` (Gemma 3's language model), ``phi3``, ``smollm3``, ``ministral3``,
``granite``, ``olmo`` (OLMo 1: LayerNorms without weights, ``torch_layer_norm`` ``"bare"``), ``olmo2``, ``olmo3``,
``exaone4``, ``cwm``, ``glm4``, ``cohere``, ``cohere2``, ``seed_oss``, ``ernie4_5``, ``youtu`` and ``minicpm3``
(DeepSeek's latent attention, :class:`MLA`, with dense MLPs; MiniCPM3's three scales), ``stablelm`` (torch's
LayerNorm with a bias: ``torch_layer_norm``), ``starcoder2``, ``arcee``, ``apertus``, ``jais2``, ``nemotron``,
``phi``, ``persimmon``, ``gptj``, ``codegen``, ``gpt_neox``, ``gpt_neox_japanese`` (its last layer's output bias:
``layer_out_bias``), ``falcon`` and ``gpt2`` (ungated MLPs: ``gated_mlp``;
LayerNorms with a bias but Arcee's and Apertus's; GPT-NeoX's exact GELU and its parallel block's two norms,
``parallel_norms``; GPT-2's learned absolute positions, ``position_offset``), ``gpt_bigcode`` (GPT-2's,
multi-query), ``openai-gpt`` (GPT-2's, norms after the residual adds: ``norm_after_residual``), ``gpt_neo`` (GPT-2's,
local windows, unscaled), ``opt`` (learned positions, ReLU; opt-350m's norms after the residual adds and projected
embeddings, ``embed_dim``), ``biogpt`` (OPT's, scaled embeddings), ``xglm`` (BioGPT's, sinusoidal positions),
``bloom`` and ``mpt`` (ALiBi instead of RoPE: ``alibi_slopes``, as Falcon-RW's by its ``alibi`` key; BLOOM's norm of
the embeddings, ``embed_layernorm``),
``nanochat`` (its q/k norms after RoPE, ``embed_norm``), and the mixtures of experts ``mixtral``, ``phimoe``
(SparseMixer's routing), ``dbrx``, ``qwen2_moe``,
``qwen3_moe``, ``granitemoe``, ``granitemoeshared``, ``granitemoe_swa`` (and ``granite_swa``, its dense sibling:
attention sinks, windows, a RoPE base per layer), ``granitemoehybrid`` (Granite 4.0, dense or not, its Mamba-2
layers: :class:`Mamba`), ``lfm2`` and ``lfm2_moe`` (LFM2's convolution layers), ``olmoe``, ``flex_olmo``,
``gpt_oss``, ``deepseek_v2``,
``deepseek_v3``, ``deepseek_v32`` and ``glm_moe_dsa`` (GLM-5; both with DeepSeek's sparse attention, :class:`DSA`),
``cohere2_moe`` (Cohere 2's parallel layer with a mixture), ``mellum`` (Qwen3-MoE's layer with windows and a RoPE
per layer type), ``laguna`` (query heads per layer, a softplus output gate), ``glm4_moe``, ``glm4_moe_lite``,
``axk1`` (DeepSeek-V3's
layer with a norm on its mixtures' output), ``dots1``,
``ernie4_5_moe``, ``minimax_m2``, ``afmoe`` (its attention's output gated, ``attn_output_gate``), ``kolibri1``
(its router's choice by the logits plus the correction bias), ``flint`` (GPT-OSS's sinks, NoPE full layers) and
``exaone_moe``, ``hy_v3``, ``hunyuan_v1_dense`` and ``hunyuan_v1_moe`` (Hunyuan: q/k norms
after RoPE, ``qk_norm_after_rope``; RoPE of a fixed NTK alpha) (also from the image + text
wrappers in :data:`WRAPPERS`). They are one model with a switch
per difference, not a copy per family: ``qkv_bias`` (Qwen2: biases on q/k/v, none on o; GLM-4 too, by
``attention_bias``),
``attention_bias`` (biases on q/k/v/o: Llama's, Qwen3's and Gemma's key), ``mlp_bias`` (Llama's key), ``qk_norm``
(Qwen3, Gemma 3: an RMSNorm over head_dim on each query and key head before RoPE; ``qk_norm_full``: OLMoE's, over
each token's whole query and key projections),
``clip_qkv`` (OLMoE's clamp of the queries, keys and values), ``gemma_norm`` (Gemma: RMSNorm's weight applied as ``1 +
w`` in float32, then rounded), ``embed_scale`` (Gemma: the embeddings times sqrt(hidden_size) in the model's dtype),
``activation`` (``"silu"``: SwiGLU; ``"gelu_tanh"``: Gemma's GeGLU, GELU in its tanh form), ``sandwich_norms`` (Gemma 3:
a norm after the attention and around the MLP), ``post_norms`` (OLMo 2 / 3: norms after the attention and the MLP, none
before), ``rope_interleaved`` (GLM-4's RoPE pairs of adjacent dims, reordered on loading), ``rope_float32`` (Cohere 2's
and ERNIE 4.5's RoPE arithmetic in float32), ``layer_norm`` / ``parallel_block`` / ``logit_scale`` (Cohere 2's),
``layer_windows`` (sliding windows), ``attention_scale``, ``mla`` (DeepSeek's multi-head latent attention),
``attn_softcap`` / ``final_softcap`` (Gemma 2's soft-capping of the scores and logits), ``local_rope_theta`` (Gemma 3's
RoPE base on its sliding layers), ``rope_layers`` (the layers that take the model's RoPE: not Gemma 3's sliding ones,
not SmolLM3's NoPE ones), ``query_temperature`` (Ministral 3's), ``embedding_multiplier`` / ``residual_multiplier`` /
``logits_scaling`` (Granite's), ``experts`` (a mixture of experts' sparse MLPs), ``attention_sinks``, ``float32_norm``
and ``swiglu_clamp`` (GPT-OSS's), an explicit ``head_dim`` and the RoPE settings. A family's fixed switches come from
:data:`FAMILIES`; a config.json that leaves a key out gets that family's transformers default.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
from dataclasses import dataclass, field

from .bitnet import bitnet_config
from .compressed import compressed_config
from .gptq_awq import check_config as _check_gptq_awq
from .gptq_awq import gptq_awq_config

# rope_type -> the keys it needs (rope.py implements each). 'dynamic': Hunyuan's with a fixed 'alpha' (the base
# stretched once, whatever the length), or transformers' dynamic NTK RoPE by its 'factor', which within the context
# (the positions every cache here holds) is plain RoPE at the base transformers computes at its start
_ROPE_TYPES = {
    "default": (),
    "dynamic": (),
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "yarn": ("factor", "original_max_position_embeddings"),
    "longrope": ("short_factor", "long_factor", "original_max_position_embeddings"),
    # Gemma 4's and LFM3's: the whole head's pairs, the first partial_rotary_factor of them turning at
    # base ** (-2i / head_dim) (over factor, 1 by default), the others not (rope.rope_inv_freq)
    "proportional": (),
}
_ROPE_LISTS = ("short_factor", "long_factor")  # per-pair factors: rotary_dim // 2 numbers > 0
_SUPPORTED_ROPE_TYPES = tuple(_ROPE_TYPES)
# rope_type -> the keys it may have besides those it needs (transformers' defaults apply without them).
# yarn: attention_factor (else from factor, or from mscale / mscale_all_dim), beta_fast 32, beta_slow 1,
# truncate true; "finetuned" is the original YaRN code's flag for its dynamic variant, which static yarn
# does not read (Yarn-Llama-2's config.json has it).
_ROPE_OPTIONAL = {
    # llama_4_scaling_beta: Ministral 3's query temperature (LlamaConfig.query_temperature; ministral3 only)
    "yarn": ("attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "truncate", "finetuned",
             "llama_4_scaling_beta"),
    # longrope: factor (else max_position_embeddings / original_max_position_embeddings) sets the default
    # attention_factor, sqrt(1 + ln(factor) / ln(original_max_position_embeddings))
    "longrope": ("factor", "attention_factor"),
    # Hunyuan's: transformers' NTK-alpha RoPE reads alpha alone (its checkpoints' YaRN-looking keys are not read);
    # transformers' dynamic NTK RoPE reads factor (original_max_position_embeddings: not read, as transformers 5)
    "dynamic": ("alpha", "factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim",
                "original_max_position_embeddings"),
    "proportional": ("factor",),
}


@dataclass(frozen=True)
class Family:
    """What a ``model_type`` fixes: its transformers class, the switches it implies, the bias keys its
    transformers config reads, and transformers' defaults (transformers 5.x) for the keys a
    ``config.json`` may leave out, where they differ from ``LlamaConfig``'s."""

    architecture: str
    qkv_bias: bool = False
    qk_norm: bool = False
    qk_norm_full: bool = False  # the q/k RMSNorm over each token's whole q and k projections (OLMoE), not per head
    gemma_norm: bool = False  # RMSNorm: x_f32 * rsqrt(...) * (1 + w_f32), rounded to the dtype at the end
    embed_scale: bool = False  # the embeddings times sqrt(hidden_size), the factor rounded to the dtype
    activation: str = "silu"  # the gated MLP's: "silu" (SwiGLU) or "gelu_tanh" (GeGLU, GELU's tanh form)
    hidden_acts: tuple = ("silu",)  # hidden_act values of the family's config.json that mean `activation`
    sandwich_norms: bool = False  # Gemma 3: h + norm(attn(norm(h))), then h + norm(mlp(norm(h)))
    post_norms: bool = False  # OLMo 2 / 3: h + norm(attn(h)), then h + norm(mlp(h)): no norm before either
    reads: tuple = ()  # of "attention_bias", "mlp_bias": the family's config has the key
    defaults: dict = field(default_factory=dict)
    # the fused projections its checkpoints hold ("qkv_proj": q, k, v as one; "gate_up_proj": the gate and up
    # projections as one, gate first): Phi-3's both, GLM-4's gate_up_proj (loading.py splits them on reading and joins
    # them on saving; the model is Llama's)
    fused_projections: tuple = ()
    # GLM-4: its checkpoints' RoPE pairs are adjacent dims (2i, 2i + 1), not i and i + r/2 (loading.py reorders the
    # q / k dims: rotary_order); partial_rotary_factor: the family's default (the share of each head RoPE turns)
    rope_interleaved: bool = False
    partial_rotary_factor: float = 1.0
    # transformers' RoPE in float32 for this family: "math" (Cohere 2: q and k times the dtype's cos and sin in float32,
    # rounded once) or "tables" (ERNIE 4.5: the cos and sin tables kept in float32 too); "": the model's dtype
    rope_float32: str = ""
    # Cohere 2: LayerNorm (the mean subtracted, no bias, the weight applied in float32) instead of RMSNorm, its eps the
    # config's layer_norm_eps; the attention and the MLP in parallel on one normed input (h + attn(x) + mlp(x))
    layer_norm: bool = False
    parallel_block: bool = False
    float32_norm: bool = False  # RMSNorm: x_f32 * rsqrt(...) * w_f32, rounded to the dtype at the end (GPT-OSS)
    attention_sinks: bool = False  # a learned logit per query head in every softmax, on no value (GPT-OSS)
    float32_sinks: bool = False  # the sinks kept in float32 whatever the model's dtype (Flint's, as transformers keeps)
    # Hunyuan: the per-head q/k RMSNorm after RoPE, not before (LlamaConfig.qk_norm_after_rope)
    qk_norm_after_rope: bool = False
    # StarCoder 2, Arcee, Nemotron, Phi-2: the MLP ungated, down(act(up(x))) (LlamaConfig.gated_mlp)
    gated_mlp: bool = True
    # torch's LayerNorm with a bias (in the model's dtype), not RMSNorm: "plain" (StarCoder 2's, StableLM's and Phi-2's
    # nn.LayerNorm) or "1p" (Nemotron's LayerNorm1P: the weight stored as an offset from 1, applied as 1 + w in the
    # weight's dtype); "bare": OLMo's, no weight and no bias, in float32; "nobias": DBRX's, a weight and no bias
    torch_layer_norm: str = ""
    # GPT-NeoX: its parallel block's MLP on a norm of its own, h + attn(norm1(h)) + mlp(norm2(h))
    # (LlamaConfig.parallel_norms)
    parallel_norms: bool = False
    # NanoChat: the final norm applied to the embeddings too, before the first layer (LlamaConfig.embed_norm); its
    # RMSNorms have no weight in its checkpoints (loading.py gives them ones, exact: w * x is x; saving drops them)
    embed_norm: bool = False
    weightless_norms: bool = False
    # NanoChat: RoPE by -angle (its rotate_half's signs flipped), read as RoPE by +angle on each q / k head's halves
    # swapped (loading.rotary_order; the scores are the same dot products)
    rope_reversed: bool = False
    # AFMoE: the heads' output times the sigmoid of a projection of the layer's input (self_attn.gate_proj), before
    # o_proj (LlamaConfig.attn_output_gate)
    attn_output_gate: bool = False
    # GPT-2: learned absolute position embeddings added to the token embeddings (model.embed_positions, its rows
    # max_position_embeddings + position_offset; position p reads row p + position_offset: OPT's 2), no RoPE
    learned_positions: bool = False
    position_offset: int = 0
    # XGLM: those positions fixed, a sinusoid (computed: no checkpoint holds them; LlamaConfig.sinusoidal_positions)
    sinusoidal_positions: bool = False
    # ALiBi instead of RoPE, its slopes by this rule (BLOOM's "bloom", MPT's "mpt"; Falcon-RW's by its alibi key:
    # LlamaConfig.alibi_slopes); "": none
    alibi: str = ""
    # BLOOM: a LayerNorm with a bias on the embeddings, before the first layer (model.embed_layernorm)
    embed_layernorm: bool = False
    # BitNet: an RMSNorm on the heads' output before o_proj (self_attn.attn_sub_norm) and on the gated product before
    # down_proj (mlp.ffn_sub_norm) (LlamaConfig.sub_norms)
    sub_norms: bool = False


_QWEN_DEFAULT_WINDOW = 4096  # Qwen2Config/Qwen3Config: the window when use_sliding_window is set
_QWEN_DEFAULTS = {"vocab_size": 151936, "intermediate_size": 22016, "max_position_embeddings": 32768}
# transformers' defaults of the gated DeltaNet layers' keys (Qwen3NextConfig's, Qwen3_5TextConfig's)
_DELTA_DEFAULTS = {"linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
                   "linear_num_key_heads": 16, "linear_num_value_heads": 32}
FAMILIES = {
    "llama": Family("LlamaForCausalLM", reads=("attention_bias", "mlp_bias")),
    "mistral": Family("MistralForCausalLM", defaults={
        "intermediate_size": 14336, "num_key_value_heads": 8, "max_position_embeddings": 131072,
        "sliding_window": 4096}),
    "qwen2": Family("Qwen2ForCausalLM", qkv_bias=True, defaults=dict(_QWEN_DEFAULTS)),
    "qwen3": Family("Qwen3ForCausalLM", qk_norm=True, reads=("attention_bias",),
                    defaults={**_QWEN_DEFAULTS, "head_dim": 128}),
    # transformers reads Gemma's legacy hidden_act "gelu" as the tanh form (GemmaConfig, with a warning)
    "gemma": Family("GemmaForCausalLM", gemma_norm=True, embed_scale=True, activation="gelu_tanh",
                    hidden_acts=("gelu_pytorch_tanh", "gelu"), reads=("attention_bias",), defaults={
                        "vocab_size": 256000, "hidden_size": 3072, "intermediate_size": 24576,
                        "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 16,
                        "head_dim": 256, "max_position_embeddings": 8192, "tie_word_embeddings": True}),
}
# Gemma 3's language model (Gemma3ForCausalLM: gemma-3-1b, and the text half of the larger ones): Gemma's
# norms, GeGLU and scaled embeddings, plus q/k norms (Gemma's 1 + w), sandwich norms, the attention scaled by
# query_pre_attn_scalar ** -0.5, and sliding-window layers (5 of every 6 by default) with their own RoPE base.
FAMILIES["gemma3_text"] = Family(
    "Gemma3ForCausalLM", qk_norm=True, gemma_norm=True, embed_scale=True, activation="gelu_tanh",
    hidden_acts=("gelu_pytorch_tanh",), sandwich_norms=True, reads=("attention_bias",), defaults={
        "vocab_size": 262208, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
        "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "max_position_embeddings": 131072,
        "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "sliding_window": 4096,
        "query_pre_attn_scalar": 256, "rope_local_base_freq": 10000.0})
_GEMMA3_PATTERN = 6  # Gemma3TextConfig: every 6th layer is global, the others slide
# Gemma 2: Gemma 3's layer without the q/k norms and with one RoPE, every other layer sliding (the first does),
# and soft-capped attention scores and logits (cap * tanh(x / cap)).
FAMILIES["gemma2"] = Family(
    "Gemma2ForCausalLM", gemma_norm=True, embed_scale=True, activation="gelu_tanh", hidden_acts=("gelu_pytorch_tanh",),
    sandwich_norms=True, reads=("attention_bias",), defaults={
        "vocab_size": 256000, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
        "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "sliding_window": 4096, "query_pre_attn_scalar": 256,
        "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0})
_GEMMA2_PATTERN = 2
# VaultGemma (VaultGemmaForCausalLM: vaultgemma-1b, trained with differential privacy): Gemma 2's layer without its
# norms after the attention and the MLP (Gemma's two norms before them), under Gemma2Config's keys and defaults
FAMILIES["vaultgemma"] = dataclasses.replace(FAMILIES["gemma2"], architecture="VaultGemmaForCausalLM",
                                             sandwich_norms=False)
_GEMMA2S = ("gemma2", "vaultgemma")  # (Gemma 2's keys: soft-caps, query_pre_attn_scalar, every other layer sliding)
# Phi-3 / Phi-4 (Phi3ForCausalLM: Phi-3-mini / medium, Phi-4 14B): Llama's layer with fused q/k/v and gate/up
# projections in its checkpoints, no biases, a sliding window on every layer where the config sets one (Phi-3
# mini 4k: 2047), RoPE on the whole head or on its first dims (Phi-4-mini's partial_rotary_factor 0.75), plain RoPE or
# LongRoPE (Phi-3 128k, Phi-3.5: rope_scaling "longrope", also spelled "su" or "yarn", which transformers' Phi-3
# reads as LongRoPE; its original_max_position_embeddings is a top-level key, 4096 when absent).
FAMILIES["phi3"] = Family("Phi3ForCausalLM", fused_projections=("qkv_proj", "gate_up_proj"), defaults={
    "vocab_size": 32064, "hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 32,
    "num_attention_heads": 32, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "bos_token_id": 1,
    "eos_token_id": 32000, "pad_token_id": 32000})
_PHI3_ORIGINAL_CONTEXT = 4096  # Phi3Config's original_max_position_embeddings when config.json has none
# SmolLM3 (SmolLM3ForCausalLM: SmolLM3-3B): Llama's layer, but every no_rope_layer_interval-th layer (4) has no
# RoPE at all (NoPE: no_rope_layers[i] == 0), and a sliding window only on NoPE layers where use_sliding_window.
FAMILIES["smollm3"] = Family("SmolLM3ForCausalLM", reads=("attention_bias", "mlp_bias"), defaults={
    "vocab_size": 128256, "hidden_size": 2048, "intermediate_size": 11008, "num_hidden_layers": 36,
    "num_attention_heads": 16, "num_key_value_heads": 4, "max_position_embeddings": 32768, "rms_norm_eps": 1e-6,
    "rope_theta": 2000000.0, "tie_word_embeddings": True, "bos_token_id": 128000, "eos_token_id": 128001,
    "pad_token_id": 128004})
_SMOLLM3_INTERVAL = 4  # SmolLM3Config's no_rope_layer_interval (llama.cpp's n_no_rope_layer_step, fixed)
# Ministral 3 (Ministral3ForCausalLM: Ministral-3 3B / 8B / 14B, the text half of Mistral3ForConditionalGeneration):
# Mistral's layer with YaRN RoPE, and each query, after RoPE, times 1 + beta * ln(1 + floor(position / original))
# (Llama 4's attention temperature: rope_parameters' llama_4_scaling_beta over its original context).
_MINISTRAL3_ROPE = {"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 16.0,
                    "original_max_position_embeddings": 16384, "beta_fast": 32.0, "beta_slow": 1.0,
                    "mscale_all_dim": 1.0, "mscale": 1.0, "llama_4_scaling_beta": 0.1}
FAMILIES["ministral3"] = Family("Ministral3ForCausalLM", defaults={
    "vocab_size": 131072, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 34,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 262144,
    "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 11})
# Llama 4's language model (Llama4ForCausalLM, model_type llama4_text: the text half of Llama 4 Scout / Maverick,
# Llama4ForConditionalGeneration's text_config: WRAPPERS["llama4"]): Llama's layer (no biases but attention_bias's)
# with RoPE on adjacent pairs of dims (transformers' complex product in float32 of float32 tables, rounded once;
# reordered on loading as GLM-4's). Its RoPE layers (no_rope_layers[i] == 1: by default all but every
# no_rope_layer_interval-th, 4) attend in chunks of attention_chunk_size positions (a token sees the earlier tokens of
# its own chunk only: LlamaConfig.layer_chunks) and, with use_qk_norm, L2-normalise q and k after RoPE (an RMSNorm
# without a weight, rms_norm_eps: LlamaConfig.l2_qk_norm); its NoPE layers see every earlier token and, with
# attn_temperature_tuning, scale each query by 1 + attn_scale * ln(1 + floor((position + 1) / floor_scale))
# (LlamaConfig.nope_temperature). Every interleave_moe_layer_step-th layer (or moe_layers') is a mixture: the top
# num_experts_per_tok of num_local_experts router logits chosen, each chosen expert fed the token times the sigmoid of
# its logit (Experts.scaled_inputs; experts of intermediate_size), plus a shared expert of intermediate_size; the
# other layers a dense MLP of intermediate_size_mlp.
FAMILIES["llama4_text"] = Family("Llama4ForCausalLM", rope_interleaved=True, rope_float32="tables",
                                 reads=("attention_bias",), defaults={
                                     "vocab_size": 202048, "hidden_size": 5120, "intermediate_size": 8192,
                                     "num_hidden_layers": 48, "num_attention_heads": 40, "num_key_value_heads": 8,
                                     "head_dim": 128, "max_position_embeddings": 131072, "rope_theta": 500000.0,
                                     "rms_norm_eps": 1e-5, "bos_token_id": 1, "eos_token_id": 2,
                                     "intermediate_size_mlp": 16384, "num_local_experts": 16,
                                     "num_experts_per_tok": 1, "interleave_moe_layer_step": 1, "use_qk_norm": True,
                                     "no_rope_layer_interval": 4, "attention_chunk_size": 8192,
                                     "attn_temperature_tuning": True, "floor_scale": 8192, "attn_scale": 0.1})
# Aria's language model (AriaTextForCausalLM, model_type aria_text: rhymes-ai's Aria, AriaForConditionalGeneration's
# text_config: WRAPPERS["aria"]): Llama's attention, every layer a mixture: the softmax of the top moe_topk of
# moe_num_experts router logits (GraniteMoE's order, in the dtype), SwiGLU experts of intermediate_size without biases
# (stacked as x @ W in its checkpoints, as Llama 4's), plus moe_num_shared_experts shared experts as one MLP of that
# many intermediate_size (biased by mlp_bias, activated by hidden_act).
FAMILIES["aria_text"] = Family("AriaTextForCausalLM", reads=("attention_bias", "mlp_bias"), defaults={
    "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 4096, "num_hidden_layers": 32,
    "num_attention_heads": 32, "max_position_embeddings": 2048, "rms_norm_eps": 1e-6, "pad_token_id": 2,
    "bos_token_id": 1, "eos_token_id": 2, "moe_num_experts": 8, "moe_topk": 2, "moe_num_shared_experts": 2})
# Granite (GraniteForCausalLM: IBM Granite 3.x dense): Llama's layer with four numbers: the embeddings times
# embedding_multiplier, the attention scores scaled by attention_multiplier (instead of head_dim ** -0.5), each
# block's output times residual_multiplier before its residual add, and the logits divided by logits_scaling.
FAMILIES["granite"] = Family("GraniteForCausalLM", reads=("attention_bias", "mlp_bias"), defaults={
    "vocab_size": 32000, "rms_norm_eps": 1e-6, "bos_token_id": 1, "eos_token_id": 2})
_GRANITE_SCALES = ("embedding_multiplier", "attention_multiplier", "residual_multiplier", "logits_scaling")
_GRANITE_MOES = ("granitemoe", "granitemoeshared", "granitemoe_swa")
# HyperCLOVA X SEED (HyperCLOVAXForCausalLM: HyperCLOVAX-SEED-Think-14B): Granite's layer with Peri-LN, a norm after
# each block's output before its multiplier and residual add (use_post_norm: Gemma 3's four norms, under its names
# post_norm1 / post_norm2 around its post_attention_layernorm before the MLP), the logits *times* logits_scaling (not
# divided), the attention scaled by attention_multiplier or head_dim ** -0.5 where it is null
FAMILIES["hyperclovax"] = Family("HyperCLOVAXForCausalLM", reads=("attention_bias", "mlp_bias"),
                                 defaults=dict(FAMILIES["granite"].defaults))
# Granite 4.0 (GraniteMoeHybridForCausalLM: granite-4.0-micro, -1b, -350m attention only; granite-4.0-h-* with Mamba-2
# layers, LlamaConfig.mamba): Granite's layer and multipliers, its MLP the shared one (shared_mlp: input_linear holding
# the gate and up rows, output_linear; shared_intermediate_size wide), with num_local_experts > 0 GraniteMoeShared's
# mixture beside it; RoPE only where position_embedding_type is 'rope' (else none at all: NoPE).
FAMILIES["granitemoehybrid"] = Family("GraniteMoeHybridForCausalLM", reads=("attention_bias",), defaults={
    "vocab_size": 32000, "rms_norm_eps": 1e-6, "bos_token_id": 1, "eos_token_id": 2, "num_local_experts": 8,
    "num_experts_per_tok": 2, "shared_intermediate_size": 1024})
# Bamba (BambaForCausalLM: IBM's Bamba-9B): Mamba-2 layers (LlamaConfig.mamba) beside the attention layers of
# attn_layer_indices (none: every layer Mamba), RoPE on the first half of each head (BambaConfig fixes
# partial_rotary_factor 0.5 whatever a config says), a SwiGLU MLP (feed_forward) after pre_ff_layernorm; the final norm
# final_layernorm; attention_bias / mlp_bias as Llama's
FAMILIES["bamba"] = Family("BambaForCausalLM", partial_rotary_factor=0.5, reads=("attention_bias", "mlp_bias"),
                           defaults={"vocab_size": 128000, "hidden_size": 4096, "intermediate_size": 14336,
                                     "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                                     "max_position_embeddings": 262144, "rms_norm_eps": 1e-5, "pad_token_id": 0,
                                     "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": False,
                                     "rope_theta": 10000.0})
# Mamba-2 (Mamba2ForCausalLM: state-spaces' mamba2-*, Mamba-Codestral-7B): every layer a Mamba-2 mixer after one norm,
# no MLP (triforce.models.llama.MixerLayer), its residual stream in float32 where residual_in_fp32; its config's names
# (_MAMBA2_NAMES) as the hybrids'; no attention (the model's attention fields placeholders, not written back)
FAMILIES["mamba2"] = Family("Mamba2ForCausalLM", defaults={
    "vocab_size": 32768, "hidden_size": 4096, "num_hidden_layers": 64, "rms_norm_eps": 1e-5, "pad_token_id": 1,
    "bos_token_id": 0, "eos_token_id": 2, "tie_word_embeddings": False, "mamba_n_heads": 128, "mamba_d_head": 64,
    "mamba_d_state": 128, "mamba_expand": 2, "mamba_d_conv": 4, "mamba_n_groups": 8, "mamba_proj_bias": False,
    "mamba_conv_bias": True, "residual_in_fp32": True, "num_attention_heads": 1, "num_key_value_heads": 1,
    "intermediate_size": 1, "max_position_embeddings": 1 << 20})
# Falcon-H1 (FalconH1ForCausalLM: tiiuae's Falcon-H1-0.5B ... 34B, Falcon-H1R, Falcon-H1-Tiny): every layer an attention
# and a Mamba-2 mixer in parallel on the same normed input, their outputs summed into the residual
# (LlamaConfig.parallel_mamba), then a SwiGLU MLP (feed_forward) after pre_ff_layernorm; the final norm
# final_layernorm. Its muP multipliers: the embeddings' (embedding_multiplier) and the logits' (lm_head_multiplier)
# applied as Granite's and Cohere's, the others folded into the weights they scale on loading (and out on saving:
# loading._falcon_h1_multipliers); the Mamba mixer's width mamba_d_ssm (else expand x hidden_size), its gated norm
# normalising before the gate (mamba_norm_before_gate) or after it, or absent (mamba_rms_norm false: y silu(z)), its
# out_proj biased by projectors_bias
FAMILIES["falcon_h1"] = Family("FalconH1ForCausalLM", reads=("attention_bias", "mlp_bias"), defaults={
    "vocab_size": 128000, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-5, "max_position_embeddings": 8192,
    "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": False, "mamba_d_ssm": 1024,
    "mamba_n_heads": 128, "mamba_d_head": "auto", "mamba_n_groups": 1, "mamba_d_state": 256, "mamba_d_conv": 4,
    "mamba_expand": 2, "mamba_conv_bias": True, "mamba_proj_bias": False, "mamba_norm_before_gate": True,
    "mamba_rms_norm": False, "projectors_bias": False})
# Falcon-H1's multipliers (FalconH1Config's defaults: 1, [1, 1], [1] * 5)
_FALCON_H1_SCALARS = ("lm_head_multiplier", "embedding_multiplier", "key_multiplier", "attention_out_multiplier",
                      "attention_in_multiplier", "ssm_in_multiplier", "ssm_out_multiplier")
_FALCON_H1_LISTS = {"mlp_multipliers": 2, "ssm_multipliers": 5}
_MAMBA2_NAMES = {"num_heads": "mamba_n_heads", "head_dim": "mamba_d_head", "state_size": "mamba_d_state",
                 "expand": "mamba_expand", "conv_kernel": "mamba_d_conv", "n_groups": "mamba_n_groups",
                 "use_bias": "mamba_proj_bias", "use_conv_bias": "mamba_conv_bias", "chunk_size": "mamba_chunk_size",
                 "layer_norm_epsilon": "rms_norm_eps"}
# Mamba (MambaForCausalLM: state-spaces' mamba-130m-hf ... 2.8b): every layer a Mamba(-1) mixer after one norm, no MLP
# (triforce.models.llama.MixerLayer, Mamba1Mixer: LlamaConfig.mamba1), its residual stream in float32 where
# residual_in_fp32; its config's names (_MAMBA1_NAMES); no attention (placeholders, as Mamba-2's)
FAMILIES["mamba"] = Family("MambaForCausalLM", defaults={
    "vocab_size": 50280, "hidden_size": 768, "num_hidden_layers": 32, "rms_norm_eps": 1e-5, "pad_token_id": 0,
    "bos_token_id": 0, "eos_token_id": 0, "tie_word_embeddings": True, "mamba_d_state": 16, "mamba_expand": 2,
    "mamba_d_conv": 4, "mamba_proj_bias": False, "mamba_conv_bias": True, "mamba_dt_rank": "auto",
    "residual_in_fp32": True, "num_attention_heads": 1, "num_key_value_heads": 1, "max_position_embeddings": 1 << 20})
# Falcon Mamba (FalconMambaForCausalLM: falcon-mamba-7b): Mamba's layers with weightless RMSNorms (mixer_rms_eps) on
# the time step's low rank, B and C after x_proj (LlamaConfig.mamba1's bcdt_eps)
FAMILIES["falcon_mamba"] = Family("FalconMambaForCausalLM", defaults={**FAMILIES["mamba"].defaults,
                                                                      "mixer_rms_eps": 1e-6})
_MAMBA1S = ("mamba", "falcon_mamba")
# Jamba (JambaForCausalLM: AI21's Jamba, Jamba 1.5 / 1.6 / 1.7 mini and large): Mamba(-1) layers (LlamaConfig.mamba1,
# with RMSNorms of their own weights on dt's low rank, B and C) beside attention layers without RoPE (every
# attn_layer_period-th from attn_layer_offset), each layer's MLP a mixture (every expert_layer_period-th from
# expert_layer_offset: the softmax's top k, not renormalised, rounded to the dtype) or a SwiGLU MLP, after
# pre_ff_layernorm; the final norm final_layernorm
FAMILIES["jamba"] = Family("JambaForCausalLM", defaults={
    "vocab_size": 65536, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-6, "max_position_embeddings": 262144,
    "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": False, "num_experts": 16,
    "num_experts_per_tok": 2, "expert_layer_period": 2, "expert_layer_offset": 1, "attn_layer_period": 8,
    "attn_layer_offset": 4, "mamba_d_state": 16, "mamba_d_conv": 4, "mamba_expand": 2, "mamba_dt_rank": 256,
    "mamba_conv_bias": True, "mamba_proj_bias": False})
_MAMBA1_KEYS = (*_MAMBA1S, "jamba")  # (the families with Mamba(-1)'s mamba_* keys)
_MAMBA1_NAMES = {"state_size": "mamba_d_state", "expand": "mamba_expand", "conv_kernel": "mamba_d_conv",
                 "use_bias": "mamba_proj_bias", "use_conv_bias": "mamba_conv_bias", "time_step_rank": "mamba_dt_rank",
                 "layer_norm_epsilon": "rms_norm_eps"}
# Nemotron-H (NemotronHForCausalLM: NVIDIA's Nemotron-H, Nemotron Nano 2): each layer one block after one RMSNorm, h +
# block(norm(h)): a Mamba-2 mixer, an attention (no RoPE) or an ungated ReLU-squared MLP, by layers_block_type (or the
# hybrid_override_pattern's M / * / -); its mixtures' blocks (E, "moe") are not read; its config's names
# (_NEMOTRON_H_NAMES)
FAMILIES["nemotron_h"] = Family("NemotronHForCausalLM", activation="relu2", hidden_acts=("relu2",), gated_mlp=False,
                                reads=("mlp_bias",), defaults={
                                    "vocab_size": 131072, "hidden_size": 4096, "intermediate_size": 21504,
                                    "num_hidden_layers": 52, "num_attention_heads": 32, "num_key_value_heads": 8,
                                    "head_dim": 128, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
                                    "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2,
                                    "tie_word_embeddings": False, "mamba_d_state": 128, "mamba_n_heads": 128,
                                    "mamba_d_head": 64, "mamba_n_groups": 8, "mamba_d_conv": 4, "mamba_expand": 2,
                                    "mamba_conv_bias": True, "mamba_proj_bias": False, "residual_in_fp32": False})
_NEMOTRON_H_NAMES = {"ssm_state_size": "mamba_d_state", "mamba_num_heads": "mamba_n_heads",
                     "mamba_head_dim": "mamba_d_head", "n_groups": "mamba_n_groups", "conv_kernel": "mamba_d_conv",
                     "expand": "mamba_expand", "use_conv_bias": "mamba_conv_bias", "chunk_size": "mamba_chunk_size",
                     "layer_norm_epsilon": "rms_norm_eps", "mlp_hidden_act": "hidden_act",
                     "use_bias": "mamba_proj_bias"}  # (its Mamba projections' biases; its mamba_proj_bias unread)
_NEMOTRON_H_BLOCKS = {"M": "linear_attention", "*": "full_attention", "-": "mlp", "E": "moe"}
_MAMBA_FAMILIES = ("granitemoehybrid", "bamba", "mamba2", "nemotron_h", "falcon_h1")
_GRANITE_SWAS = ("granite_swa", "granitemoe_swa")
_GRANITES = ("granite", *_GRANITE_MOES, "granite_swa", "hyperclovax", "granitemoehybrid")  # Granite's four multipliers
_HYBRID_ATTENTION = ("attention", "full_attention")  # (its layer_types' attention layers; 'linear_attention': Mamba)
_JSON_INF = {"__float__": "Infinity"}  # (transformers' config.json spelling of an infinite float)
_MAMBA_TYPES = ("linear_attention", "mamba")  # (its layer_types' Mamba layers: transformers' name, the hub's older one)
# GraniteMoeHybridConfig's Mamba settings where a config leaves them out (mamba_d_head "auto": inner / heads)
_MAMBA_DEFAULTS = {"mamba_n_heads": 128, "mamba_n_groups": 1, "mamba_d_state": 256, "mamba_d_head": "auto",
                   "mamba_d_conv": 4, "mamba_expand": 2, "mamba_conv_bias": True, "mamba_proj_bias": False}
# Mixtures of experts: each sparse layer's MLP is a router (one logit per expert: softmax in float32, the top
# num_experts_per_tok experts, their probabilities renormalised to sum 1 or not) and that many of its experts (gated
# MLPs), summed by the router's weights. Mixtral (MixtralForCausalLM: Mixtral 8x7B / 8x22B): Mistral's layer, every
# layer sparse, always renormalised, the weights kept in float32. Qwen3-MoE (Qwen3MoeForCausalLM: Qwen3-30B-A3B,
# Qwen3-235B-A22B): Qwen3's layer; norm_topk_prob renormalises; the weights rounded to the model's dtype; the experts'
# width moe_intermediate_size; dense layers (intermediate_size) at mlp_only_layers and off decoder_sparse_step.
FAMILIES["mixtral"] = Family("MixtralForCausalLM", defaults={
    "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
    "rope_theta": 1000000.0, "bos_token_id": 1, "eos_token_id": 2, "num_local_experts": 8, "num_experts_per_tok": 2})
FAMILIES["qwen3_moe"] = Family("Qwen3MoeForCausalLM", qk_norm=True, reads=("attention_bias",), defaults={
    **_QWEN_DEFAULTS, "intermediate_size": 6144, "hidden_size": 2048, "num_hidden_layers": 24,
    "num_attention_heads": 32, "num_key_value_heads": 4, "num_experts": 128, "num_experts_per_tok": 8,
    "moe_intermediate_size": 768})
# Granite's mixture (GraniteMoeForCausalLM: granite-3.0-1b-a400m, granite-3.0-3b-a800m, granite-3.1-*-a*): Granite's
# layer and multipliers, every layer sparse, the router's top k logits (float32) through a softmax (the renormalised
# probabilities, computed another way), rounded to the dtype; its checkpoints hold each layer's experts stacked.
FAMILIES["granitemoe"] = Family("GraniteMoeForCausalLM", reads=("attention_bias",), defaults={
    "vocab_size": 32000, "intermediate_size": 11008, "rms_norm_eps": 1e-6, "bos_token_id": 1, "eos_token_id": 2,
    "num_local_experts": 8, "num_experts_per_tok": 2})
# GraniteMoE with a shared expert (GraniteMoeSharedForCausalLM): every token's gated MLP of width
# shared_intermediate_size (0: none) added to the experts' sum, no gate of its own
FAMILIES["granitemoeshared"] = Family("GraniteMoeSharedForCausalLM", reads=("attention_bias",), defaults={
    **FAMILIES["granitemoe"].defaults, "shared_intermediate_size": 0})
# Granite SWA (GraniteSWAForCausalLM: granite-swash-2b; GraniteMoeSWAForCausalLM: granite-swash-3b-a600m, GraniteMoE's
# mixture with GraniteMoeShared's shared expert, none by default): Granite's layer and multipliers with GPT-OSS's sinks
# (a learned logit per query head in every softmax: the heads' output times sigmoid(logsumexp(scores) - sink)),
# sliding_window (128) on the layer_types' sliding layers (by default all but every fourth from layer 0), and a RoPE
# base per layer (layer_rope_theta; 0: none, NoPE), read where the layers take at most two RoPEs: rope_theta's (with
# its rope_parameters) and NoPE, or with plain RoPE a second base (LlamaConfig.rope_layers, local_rope_theta)
FAMILIES["granite_swa"] = Family("GraniteSWAForCausalLM", attention_sinks=True, reads=("attention_bias", "mlp_bias"),
                                 defaults={
                                     "vocab_size": 100352, "hidden_size": 2560, "intermediate_size": 8192,
                                     "num_hidden_layers": 24, "num_attention_heads": 20, "num_key_value_heads": 4,
                                     "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "bos_token_id": 100257,
                                     "eos_token_id": 100257, "tie_word_embeddings": True, "sliding_window": 128})
FAMILIES["granitemoe_swa"] = Family("GraniteMoeSWAForCausalLM", attention_sinks=True, reads=("attention_bias",),
                                    defaults={**FAMILIES["granitemoeshared"].defaults, "sliding_window": 128})
# Qwen2-MoE (Qwen2MoeForCausalLM: Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B): Qwen2's layer (q/k/v biases, its qkv_bias key)
# whose sparse MLP adds a shared expert (width shared_expert_intermediate_size) times the sigmoid of its own gate
FAMILIES["qwen2_moe"] = Family("Qwen2MoeForCausalLM", qkv_bias=True, defaults={
    **_QWEN_DEFAULTS, "intermediate_size": 5632, "hidden_size": 2048, "num_hidden_layers": 24,
    "num_attention_heads": 16, "num_key_value_heads": 16, "num_experts": 60, "num_experts_per_tok": 4,
    "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632})
# Qwen3.5 (Qwen3_5ForCausalLM: Qwen3.5-0.8B ... 27B; its image + text model's language model, WRAPPERS["qwen3_5"]):
# gated DeltaNet layers (LlamaConfig.delta: layer_types' "linear_attention", by default all but every fourth) beside
# Qwen3's attention with its heads' output gated (q_proj's rows per head: the query, then a gate, whose sigmoid the
# output is multiplied by: attn_output_gate), RoPE on the first quarter of each head (partial_rotary_factor 0.25; its
# M-RoPE on text is that RoPE), every RMSNorm's weight applied as 1 + w (gemma_norm), a SwiGLU MLP
FAMILIES["qwen3_5_text"] = Family("Qwen3_5ForCausalLM", qk_norm=True, gemma_norm=True, attn_output_gate=True,
                                  partial_rotary_factor=0.25, reads=("attention_bias",), defaults={
                                      "vocab_size": 248320, "hidden_size": 4096, "intermediate_size": 12288,
                                      "num_hidden_layers": 32, "num_attention_heads": 16, "num_key_value_heads": 4,
                                      "head_dim": 256, "max_position_embeddings": 32768, "rms_norm_eps": 1e-6,
                                      "tie_word_embeddings": False, "rope_theta": 10000.0, **_DELTA_DEFAULTS})
# Qwen3-Next (Qwen3NextForCausalLM: Qwen3-Next-80B-A3B): Qwen3.5's layers with Qwen2-MoE's mixture (its shared expert
# times the sigmoid of its own gate; sparse off mlp_only_layers and by decoder_sparse_step) routed as Qwen3-MoE's
# (renormalised where norm_topk_prob, by default); its DeltaNet projections fused in its checkpoints (in_proj_qkvz and
# in_proj_ba, grouped by key head: loading.py splits and joins them)
FAMILIES["qwen3_next"] = Family("Qwen3NextForCausalLM", qk_norm=True, gemma_norm=True, attn_output_gate=True,
                                partial_rotary_factor=0.25, reads=("attention_bias",), defaults={
                                    "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 5632,
                                    "num_hidden_layers": 48, "num_attention_heads": 16, "num_key_value_heads": 2,
                                    "head_dim": 256, "max_position_embeddings": 32768, "rms_norm_eps": 1e-6,
                                    "tie_word_embeddings": False, "rope_theta": 10000.0, "decoder_sparse_step": 1,
                                    "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512,
                                    "num_experts_per_tok": 10, "num_experts": 512, "norm_topk_prob": True,
                                    "mlp_only_layers": [], **_DELTA_DEFAULTS})
# Qwen3.5-MoE (Qwen3_5MoeForCausalLM: Qwen3.5-35B-A3B ... 397B-A17B; its image + text model, WRAPPERS["qwen3_5_moe"]):
# Qwen3.5's layers, every one's MLP Qwen3-Next's mixture, its router always renormalising (no keys for the rest)
FAMILIES["qwen3_5_moe_text"] = Family("Qwen3_5MoeForCausalLM", qk_norm=True, gemma_norm=True, attn_output_gate=True,
                                      partial_rotary_factor=0.25, reads=("attention_bias",), defaults={
                                          "vocab_size": 248320, "hidden_size": 2048, "num_hidden_layers": 40,
                                          "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256,
                                          "max_position_embeddings": 32768, "rms_norm_eps": 1e-6,
                                          "tie_word_embeddings": False, "rope_theta": 10000.0,
                                          "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512,
                                          "num_experts_per_tok": 8, "num_experts": 256, **_DELTA_DEFAULTS})
_DELTA_FAMILIES = ("qwen3_5_text", "qwen3_next", "qwen3_5_moe_text", "olmo_hybrid")
# OLMoE (OlmoeForCausalLM: OLMoE-1B-7B): Llama's layer with an RMSNorm over each token's whole query and key
# projections (before the heads are split and RoPE'd) and an optional clamp of q, k and v (clip_qkv); every layer
# sparse, Qwen3-MoE's routing (the softmax in float32, the top k, renormalised where norm_topk_prob, rounded to the
# dtype), its experts of width intermediate_size.
FAMILIES["olmoe"] = Family("OlmoeForCausalLM", qk_norm=True, qk_norm_full=True, reads=("attention_bias",), defaults={
    "vocab_size": 50304, "hidden_size": 2048, "intermediate_size": 2048, "num_hidden_layers": 16,
    "num_attention_heads": 16, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "pad_token_id": 1,
    "bos_token_id": None, "eos_token_id": 50279, "num_experts": 64, "num_experts_per_tok": 8})
# GPT-OSS (GptOssForCausalLM: gpt-oss-20b, gpt-oss-120b): q/k/v/o biases, a learned sink logit per query head in
# each softmax (attention sinks: the softmax's denominator gains exp(sink), no value is added), every other layer
# sliding (the first does; 128 tokens), YaRN RoPE, RMSNorm's weight applied in float32; every layer a mixture whose
# router has a bias and weighs the softmax of its top k logits (GraniteMoE's order), whose experts have biases and
# a clamped SwiGLU: (clamp(up, -l, l) + 1) * g * sigmoid(alpha * g) with g = min(gate, l) (swiglu_alpha,
# swiglu_limit). Its checkpoints hold the experts' gate and up projections interleaved, transposed and, as OpenAI
# ships them, in MXFP4 blocks (loading.py dequantises them).
_GPT_OSS_ROPE = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                 "original_max_position_embeddings": 4096}
FAMILIES["gpt_oss"] = Family("GptOssForCausalLM", activation="swiglu_clamped", float32_norm=True,
                             attention_sinks=True, reads=("attention_bias",), defaults={
                                 "vocab_size": 201088, "hidden_size": 2880, "intermediate_size": 2880,
                                 "num_hidden_layers": 36, "num_attention_heads": 64, "num_key_value_heads": 8,
                                 "head_dim": 64, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
                                 "rope_theta": 150000.0, "attention_bias": True, "sliding_window": 128,
                                 "num_local_experts": 128, "num_experts_per_tok": 4, "swiglu_alpha": 1.702,
                                 "swiglu_limit": 7.0})
_GPT_OSS_PATTERN = 2  # GptOssConfig's layer_types by default: sliding, full, sliding, ...
# OLMo 2 (Olmo2ForCausalLM: OLMo-2 1B / 7B / 13B / 32B): Llama's layer with its norms after the attention and the MLP
# instead of before (h + norm(attn(h)), then h + norm(mlp(h))), an RMSNorm over each token's whole query and key
# projections (OLMoE's), every RMSNorm's weight applied in float32 (GPT-OSS's). OLMo 3 (Olmo3ForCausalLM): OLMo 2's
# layer with three of every four layers sliding (a window of 4096 by default); the sliding layers take plain RoPE
# (rope_parameters' 'sliding_attention', the same base by default), the others the model's (its YaRN, say).
_OLMO_DEFAULTS = {"vocab_size": 50304, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
                  "num_attention_heads": 32, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "pad_token_id": 1,
                  "bos_token_id": None, "eos_token_id": 50279}
# OLMo (OlmoForCausalLM: OLMo-1B-hf, OLMo-7B-hf, OLMo-7B-0424-hf, OLMo-1.7-7B-hf): Llama's layer with a LayerNorm of
# no weight and no bias (in float32, eps 1e-5 fixed: its config has no eps key) before the attention, the MLP and the
# head, and with clip_qkv the queries, keys and values clamped (OLMoE's clamp)
FAMILIES["olmo"] = Family("OlmoForCausalLM", torch_layer_norm="bare", reads=("attention_bias",),
                          defaults=dict(_OLMO_DEFAULTS))
FAMILIES["olmo2"] = Family("Olmo2ForCausalLM", qk_norm=True, qk_norm_full=True, post_norms=True, float32_norm=True,
                           reads=("attention_bias",), defaults=dict(_OLMO_DEFAULTS))
FAMILIES["olmo3"] = Family("Olmo3ForCausalLM", qk_norm=True, qk_norm_full=True, post_norms=True, float32_norm=True,
                           reads=("attention_bias",), defaults={**_OLMO_DEFAULTS, "rope_theta": 500000.0,
                                                                 "sliding_window": 4096})
_OLMO3_PATTERN = 4  # Olmo3Config's layer_types by default: every 4th layer full, the others sliding
# OLMo Hybrid (OlmoHybridForCausalLM): OLMo 3's attention layers (norms after the blocks, the q / k RMSNorm over each
# token's whole projections, RMSNorm's weight in float32; no window) beside gated DeltaNet layers (LlamaConfig.delta:
# layer_types' "linear_attention", by default all but every fourth), which are pre-norm layers (input_layernorm, then
# post_attention_layernorm before the MLP); its DeltaNet's projections separate (q / k / v, g, a, b, o), its output
# norm's eps 1e-5, beta doubled where linear_allow_neg_eigval (default true); its widths by default from the attention's
# (key heads = value heads = num_attention_heads, key dim int(0.75 hidden / heads), value dim twice that)
FAMILIES["olmo_hybrid"] = Family("OlmoHybridForCausalLM", qk_norm=True, qk_norm_full=True, post_norms=True,
                                 float32_norm=True, reads=("attention_bias",), defaults={
                                     "vocab_size": 100352, "hidden_size": 3840, "intermediate_size": 11008,
                                     "num_hidden_layers": 32, "num_attention_heads": 30,
                                     "max_position_embeddings": 65536, "rms_norm_eps": 1e-6, "pad_token_id": 100277,
                                     "bos_token_id": None, "eos_token_id": 100257, "tie_word_embeddings": False,
                                     "rope_theta": 10000.0, "linear_conv_kernel_dim": 4,
                                     "linear_allow_neg_eigval": True})
# FlexOlmo (FlexOlmoForCausalLM: FlexOlmo-7x7B-1T, -RT): OLMo 2's layer (the q / k RMSNorm over each token's whole
# projections, norms after the blocks, RMSNorm's weight in float32) whose MLP is OLMoE's mixture on every layer (the
# softmax's top num_experts_per_tok of num_experts, renormalised where norm_topk_prob)
FAMILIES["flex_olmo"] = Family("FlexOlmoForCausalLM", qk_norm=True, qk_norm_full=True, post_norms=True,
                               float32_norm=True, reads=("attention_bias",), defaults={
                                   "vocab_size": 100352, "hidden_size": 4096, "intermediate_size": 11008,
                                   "num_hidden_layers": 32, "num_attention_heads": 32, "max_position_embeddings": 4096,
                                   "rms_norm_eps": 1e-6, "rope_theta": 500000.0, "pad_token_id": 100277,
                                   "bos_token_id": None, "eos_token_id": 100257, "num_experts": 7,
                                   "num_experts_per_tok": 5})
# EXAONE 4 (Exaone4ForCausalLM: EXAONE-4.0-1.2B, -32B): OLMo 2's norms after the blocks (Llama's RMSNorm), Qwen3's q/k
# norms per head; with a sliding_window, the layer_types' sliding layers (by default three of every four,
# sliding_window_pattern) slide and take RoPE, the others neither (NoPE, SmolLM3's zero frequencies); without one, every
# layer full with RoPE.
FAMILIES["exaone4"] = Family("Exaone4ForCausalLM", qk_norm=True, post_norms=True, defaults={
    "vocab_size": 102400, "hidden_size": 4096, "intermediate_size": 16384, "num_hidden_layers": 32,
    "num_attention_heads": 32, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "bos_token_id": 0,
    "eos_token_id": 2, "pad_token_id": None, "sliding_window": 4096, "sliding_window_pattern": 4})
# EXAONE MoE (ExaoneMoeForCausalLM: K-EXAONE-236B-A23B): EXAONE 4's attention (q/k norms per head, the layer_types'
# sliding layers taking RoPE and a window, the others neither) in Llama's pre-norm layer, from first_k_dense_replace on
# (or by mlp_layer_types) DeepSeek-V3's mixture under EXAONE's keys (num_experts, num_shared_experts); its
# multi-token prediction weights (mtp.*) skipped on loading, as transformers skips them.
FAMILIES["exaone_moe"] = Family("ExaoneMoeForCausalLM", qk_norm=True, defaults={
    "vocab_size": 102400, "hidden_size": 4096, "intermediate_size": 16384, "num_hidden_layers": 32,
    "num_attention_heads": 32, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "bos_token_id": 1,
    "eos_token_id": 53, "pad_token_id": 0, "sliding_window": 4096, "sliding_window_pattern": 4,
    "moe_intermediate_size": 1024, "num_experts": 64, "num_experts_per_tok": 8, "num_shared_experts": 1,
    "norm_topk_prob": True, "routed_scaling_factor": 2.5, "n_group": 1, "topk_group": 1, "first_k_dense_replace": 1})
# Kolibri-1 (Kolibri1ForCausalLM: Aleph Alpha's Kolibri-1): EXAONE 4's attention (q/k RMSNorms per head before RoPE;
# with a window, RoPE and the window on the layer_types' sliding layers only, by default four of every five, the
# others neither) in GLM-4's layer (four norms: post_self_attn_layernorm, post_attention_layernorm before the MLP,
# post_mlp_layernorm), every MLP a mixture: the router's float32 logits, the top k of the logits plus a correction
# bias chosen, the chosen logits' sigmoid as weights (renormalised where norm_topk_prob), in float32, and an ungated
# shared expert (shared_expert_intermediate_size) added. A window always (transformers' model fails without one).
FAMILIES["kolibri1"] = Family("Kolibri1ForCausalLM", qk_norm=True, sandwich_norms=True, defaults={
    "vocab_size": 128000, "hidden_size": 2560, "num_hidden_layers": 50, "num_attention_heads": 48,
    "num_key_value_heads": 4, "head_dim": 128, "max_position_embeddings": 262144, "rms_norm_eps": 1e-6,
    "bos_token_id": None, "eos_token_id": None, "pad_token_id": None, "sliding_window": 513,
    "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512, "num_experts_per_tok": 6,
    "num_experts": 384, "norm_topk_prob": False})
_KOLIBRI_PATTERN = 5  # Kolibri1Config's layer_types by default: every fifth layer full, the others sliding
# Mellum 2 (MellumForCausalLM: JetBrains' Mellum2-12B-A2.5B): Qwen3-MoE's layer (q/k RMSNorms per head; the top k of the
# softmax, renormalised where norm_topk_prob, rounded to the dtype) with its window (1024) on the layer_types' sliding
# layers (none by default) and a RoPE per layer type (rope_parameters: the full layers' with its scaling, by default
# base 5e5; the sliding layers' plain, by default base 1e4: OLMo 3's way); its dense and sparse layers by
# mlp_layer_types (every layer sparse by default); its multi-token prediction weights (mtp.*) skipped on loading, as
# transformers skips them
FAMILIES["mellum"] = Family("MellumForCausalLM", qk_norm=True, reads=("attention_bias",), defaults={
    "vocab_size": 98304, "hidden_size": 2304, "intermediate_size": 7168, "num_hidden_layers": 28,
    "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-6, "bos_token_id": None, "eos_token_id": None, "pad_token_id": None, "sliding_window": 1024,
    "num_experts": 64, "num_experts_per_tok": 8, "moe_intermediate_size": 896, "norm_topk_prob": True})
# Laguna (LagunaForCausalLM): AFMoE's attention (q/k RMSNorms per head; its window on the layer_types'
# sliding layers, none by default) with a query head count per layer (num_attention_heads_per_layer; the KV heads
# shared), the heads' output times the softplus of its own projection of the layer's input (g_proj: one gate per head,
# gating true or 'per-head', else one per dim), a RoPE per layer type (the full layers' on the first
# partial_rotary_factor, 0.5, of each head at base 5e5, the sliding layers' on all of it at 1e4); its mlp_layer_types'
# sparse layers (by default all but the first) a mixture: the router's logits in the dtype, soft-capped by
# moe_router_logit_softcapping where > 0, their sigmoid plus the correction bias choosing, renormalised, in the dtype,
# the routed output times moe_routed_scaling_factor, plus an ungated shared expert (shared_expert_intermediate_size)
FAMILIES["laguna"] = Family("LagunaForCausalLM", qk_norm=True, reads=("attention_bias",), defaults={
    "vocab_size": 100352, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 40,
    "num_attention_heads": 48, "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-6, "bos_token_id": None, "eos_token_id": None, "pad_token_id": None, "sliding_window": 512,
    "num_experts": 256, "num_experts_per_tok": 8, "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512,
    "gating": True, "moe_routed_scaling_factor": 1.0, "moe_router_logit_softcapping": 0.0})
_LAGUNA_ROPE = {"full_attention": {"rope_type": "default", "rope_theta": 500000.0, "partial_rotary_factor": 0.5},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 1.0}}
_MELLUM_ROPE = {"full_attention": {"rope_type": "default", "rope_theta": 500000.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}  # (MellumConfig's by default)
# MiMo-V2-Flash (MiMoV2FlashForCausalLM: Xiaomi's MiMo-V2-Flash): Llama's layer whose layer_types' sliding layers
# (by default all but layer 0 and every sixth) take twice num_key_value_heads, a window of sliding_window keys (129; its
# checkpoints' sliding_window_size + 1) and GPT-OSS's sinks, the others neither; keys of head_dim (192) and values of
# v_head_dim (128), the values times attention_value_scale; a RoPE per layer type on the first partial_rotary_factor
# (0.334) of each head (the full layers' at base 5e6, the sliding layers' at 1e4); its mlp_layer_types' sparse layers
# (by default all but the first) DeepSeek-V3's mixture without shared experts (n_routed_experts, stacked experts).
FAMILIES["mimo_v2_flash"] = Family("MiMoV2FlashForCausalLM", attention_sinks=True, partial_rotary_factor=0.334,
                                   reads=("attention_bias",), defaults={
    "vocab_size": 152576, "hidden_size": 4096, "intermediate_size": 16384, "num_hidden_layers": 48,
    "num_attention_heads": 64, "num_key_value_heads": 4, "head_dim": 192, "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5, "bos_token_id": 1, "eos_token_id": None, "pad_token_id": None, "sliding_window": 129,
    "v_head_dim": 128, "attention_value_scale": 0.707, "moe_intermediate_size": 2048, "num_experts_per_tok": 8,
    "n_routed_experts": 256, "routed_scaling_factor": 1.0, "n_group": 1, "topk_group": 1, "norm_topk_prob": True})
_MIMO_ROPE = {kind: {"rope_type": "default", "rope_theta": theta, "partial_rotary_factor": 0.334}
              for kind, theta in (("full_attention", 5000000.0), ("sliding_attention", 10000.0))}
_MIMO_PATTERN = 6  # MiMoV2FlashConfig: layer 0 and every sixth full, the others sliding
# JetMoE (JetMoeForCausalLM: jetmoe-8b): Llama's pre-norm layer (the layers' RMSNorms at eps 1e-6 whatever rms_norm_eps,
# which the final norm takes) whose attention is a mixture (MoA): the router's top num_experts_per_tok of
# num_local_experts logits through a softmax (float32, rounded to the dtype, GraniteMoE's), each chosen expert's query
# projection giving num_key_value_heads heads of kv_channels over the shared keys and values (kv_proj), its output
# projection taking them back, the outputs times the weights summed, plus a bias; its MLP GraniteMoE's mixture of the
# same router rule plus a bias; every projection unbiased. num_attention_heads is num_key_value_heads * top k.
FAMILIES["jetmoe"] = Family("JetMoeForCausalLM", defaults={
    "vocab_size": 32000, "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 12,
    "num_key_value_heads": 16, "head_dim": 128, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6,
    "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": None, "tie_word_embeddings": True, "num_local_experts": 8,
    "num_experts_per_tok": 2})
_JETMOE_NAMES = {"kv_channels": "head_dim", "activation_function": "hidden_act"}  # (its config's -> ours)
_JETMOE_LAYER_EPS = 1e-6  # JetMoeRMSNorm's default: the layers' norms take it (transformers passes no eps to them)
# LFM2 (Lfm2ForCausalLM: Liquid AI's LFM2-350M / 700M / 1.2B / 2.6B, LFM2.5): Llama's pre-norm layers, some of
# whose mixers are not attention but a gated short convolution (layer_types' "conv": in_proj to B, C and x, a causal
# depthwise convolution of B * x over the last conv_L_cache tokens, C times it, out_proj; every conv projection biased
# where conv_bias); its attention layers Qwen3's (q/k RMSNorms per head, here q_layernorm / k_layernorm); its MLP's
# width intermediate_size, or with block_auto_adjust_ff_dim 2/3 of it times block_ffn_dim_multiplier rounded up to
# block_multiple_of; its norms' eps norm_eps; the final norm named embedding_norm. LlamaConfig.conv_layers says which
# layers convolve (layer_types, or full_attn_idxs' complement; neither: every layer attention, as Lfm2Config reads)
FAMILIES["lfm2"] = Family("Lfm2ForCausalLM", qk_norm=True, defaults={
    "vocab_size": 65536, "hidden_size": 2560, "intermediate_size": 12288, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 128000, "rms_norm_eps": 1e-5,
    "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0, "tie_word_embeddings": True, "rope_theta": 1000000.0,
    "conv_bias": False, "conv_L_cache": 3, "block_multiple_of": 256, "block_ffn_dim_multiplier": 1.0,
    "block_auto_adjust_ff_dim": True})
# LFM2-MoE (Lfm2MoeForCausalLM: LFM2-8B-A1B): LFM2's layers (layer_types required) whose MLPs from num_dense_layers on
# are a mixture: the router's logits in the dtype, their sigmoid (in the dtype) plus expert_bias (a float32 buffer,
# where use_expert_bias) choosing the top num_experts_per_tok, those sigmoids renormalised over their sum + 1e-6 where
# norm_topk_prob and times routed_scaling_factor, in the dtype; experts of moe_intermediate_size; the dense MLPs of
# intermediate_size as it is
FAMILIES["lfm2_moe"] = Family("Lfm2MoeForCausalLM", qk_norm=True, defaults={
    "vocab_size": 65536, "hidden_size": 2048, "intermediate_size": 7168, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 128000, "rms_norm_eps": 1e-5,
    "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0, "tie_word_embeddings": True, "rope_theta": 1000000.0,
    "conv_bias": False, "conv_L_cache": 3, "moe_intermediate_size": 1792, "num_dense_layers": 2,
    "num_experts_per_tok": 4, "num_experts": 32, "use_expert_bias": True, "routed_scaling_factor": 1.0,
    "norm_topk_prob": True})
# LFM3 (Lfm3ForCausalLM): LFM2's layers (its convolutions, conv_L_cache 7 by default) with sandwich norms where
# use_sandwich_norm (post_operator_norm after the mixer, post_ffn_norm after the MLP: Gemma 3's four), attention
# layers of two kinds by layer_types (by default: every fourth from 2 full, every fourth from 4 sliding, the rest
# convolutions): Qwen3's attention (per-head q / k norms, q_norm / k_norm, o_proj) with each head's output times the
# sigmoid of g_proj of the layer's input (one gate per head, in the dtype) where use_attention_gate, the full layers'
# RoPE proportional (rope_type "proportional": the whole head's pairs, the first partial_rotary_factor of them turning
# at base ** (-2i / head_dim), the others not at all), the sliding layers' plain RoPE at their own base over a window
# of sliding_window (256); an MLP of intermediate_size as it is
FAMILIES["lfm3"] = Family("Lfm3ForCausalLM", qk_norm=True, reads=("attention_bias",), defaults={
    "vocab_size": 128000, "hidden_size": 2048, "intermediate_size": 7680, "num_hidden_layers": 24,
    "num_attention_heads": 16, "num_key_value_heads": 4, "head_dim": 128, "max_position_embeddings": 128000,
    "rms_norm_eps": 1e-5, "pad_token_id": 124893, "bos_token_id": 124894, "eos_token_id": 124900,
    "tie_word_embeddings": True, "conv_bias": False, "conv_L_cache": 7, "sliding_window": 256,
    "use_sandwich_norm": True, "use_attention_gate": True})
_LFM3_ROPE = {"full_attention": {"rope_type": "proportional", "rope_theta": 1000000.0, "partial_rotary_factor": 0.5},
              "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}  # (Lfm3Config's by default)
_LFM2S = ("lfm2", "lfm2_moe", "lfm3")
# their configs' other names (Lfm2Config reads block_ff_dim as intermediate_size; both tie_embedding as
# tie_word_embeddings)
_LFM2_NAMES = {"block_ff_dim": "intermediate_size", "tie_embedding": "tie_word_embeddings"}
# Flint (FlintForCausalLM: RecursiveSI's Flint): Qwen3's attention (q/k RMSNorms per head) with GPT-OSS's sinks and
# RMSNorm (the weight applied in float32); RoPE and sliding_window (513) on the layer_types' sliding layers only (by
# default all but layers 0, 1, every fourth from 1 and the last), the others NoPE; Qwen2-MoE's mixture from the layers
# not in mlp_only_layers ([0, 1]): the router's float32 logits (its weight kept in float32), the top k of their
# sigmoid, renormalised where norm_topk_prob, in float32, and an ungated shared expert (shared_expert_intermediate_size)
# added. A window always (FlintConfig's is an int).
FAMILIES["flint"] = Family("FlintForCausalLM", qk_norm=True, float32_norm=True, attention_sinks=True,
                           float32_sinks=True, reads=("attention_bias",), defaults={
                               "vocab_size": 150144, "hidden_size": 2048, "intermediate_size": 6144,
                               "num_hidden_layers": 49, "num_attention_heads": 32, "num_key_value_heads": 4,
                               "head_dim": 128, "max_position_embeddings": 262144, "rms_norm_eps": 1e-6,
                               "bos_token_id": None, "eos_token_id": None, "pad_token_id": None, "sliding_window": 513,
                               "moe_intermediate_size": 512, "shared_expert_intermediate_size": 1024,
                               "num_experts_per_tok": 6, "num_experts": 256, "norm_topk_prob": True,
                               "mlp_only_layers": [0, 1], "decoder_sparse_step": 1})
# Hunyuan V3 (HYV3ForCausalLM: Tencent's Hy3): Apertus's attention (Llama's with a q/k RMSNorm per head before RoPE)
# in Llama's layer, its dense and sparse layers by mlp_layer_types (by default the first dense); a sparse layer's
# mixture DeepSeek-V3's router without groups (the float32 logits' sigmoid, the correction bias added for the choice,
# renormalised over their sum plus 1e-20, times router_scaling_factor) with num_shared_experts ungated shared experts
# of moe_intermediate_size; its multi-token prediction layer (model.layers.{n}) dropped on loading, as transformers
# drops it
FAMILIES["hy_v3"] = Family("HYV3ForCausalLM", qk_norm=True, reads=("attention_bias", "mlp_bias"), defaults={
    "vocab_size": 120832, "hidden_size": 4096, "intermediate_size": 13312, "num_hidden_layers": 80,
    "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5, "rope_theta": 11158840.0, "bos_token_id": None, "eos_token_id": None, "pad_token_id": None,
    "num_experts": 192, "num_experts_per_tok": 8, "num_shared_experts": 1, "moe_intermediate_size": 1536,
    "router_scaling_factor": 2.826})
# Seed-OSS (SeedOssForCausalLM: Seed-OSS-36B, 512K context): Llama's layer with biases on q, k and v by
# attention_bias (default true) and on o by attention_out_bias (default false); its dropouts act in training only.
FAMILIES["seed_oss"] = Family("SeedOssForCausalLM", reads=("attention_bias", "mlp_bias"), defaults={
    "vocab_size": 155136, "hidden_size": 4096, "intermediate_size": 27648, "num_hidden_layers": 64,
    "num_attention_heads": 80, "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 524288,
    "rms_norm_eps": 1e-6, "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2, "attention_bias": True})
# ERNIE 4.5 (Ernie4_5ForCausalLM: ERNIE-4.5-0.3B): Llama's layer with biases on every projection by its one use_bias
# key (read as attention_bias and mlp_bias), RoPE on adjacent pairs of dims computed in float32 (its cos and sin
# tables too) and rounded once, a tied head.
FAMILIES["ernie4_5"] = Family("Ernie4_5ForCausalLM", rope_interleaved=True, rope_float32="tables",
                              reads=("attention_bias", "mlp_bias"), defaults={
                                  "vocab_size": 103424, "hidden_size": 1024, "intermediate_size": 3072,
                                  "num_hidden_layers": 18, "num_attention_heads": 16, "num_key_value_heads": 2,
                                  "head_dim": 128, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
                                  "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": True})
# ERNIE 4.5's mixtures (Ernie4_5_MoeForCausalLM: ERNIE-4.5-21B-A3B, ERNIE-4.5-300B-A47B): ERNIE 4.5's layer; sparse
# where (i + 1) % moe_layer_interval == 0 from moe_layer_start_index to moe_layer_end_index (-1: the last layer), a
# dense MLP of intermediate_size elsewhere; the router (kept in float32) takes the softmax of its logits in float32,
# chooses the top moe_k by those probabilities plus its correction bias (moe_statics),
# weighs them by the probabilities renormalised and rounded to the dtype; moe_num_shared_experts shared experts as
# one MLP of that many moe_intermediate_size (with use_bias's biases) added to every token's.
FAMILIES["ernie4_5_moe"] = Family("Ernie4_5_MoeForCausalLM", rope_interleaved=True, rope_float32="tables",
                                  reads=("attention_bias", "mlp_bias"), defaults={
                                      "vocab_size": 103424, "hidden_size": 2560, "intermediate_size": 12288,
                                      "num_hidden_layers": 28, "num_attention_heads": 20, "num_key_value_heads": 4,
                                      "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "pad_token_id": 0,
                                      "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": True,
                                      "rope_theta": 500000.0, "moe_intermediate_size": 1536, "moe_k": 6,
                                      "moe_num_experts": 64, "moe_num_shared_experts": 2, "moe_layer_start_index": 1,
                                      "moe_layer_end_index": -1, "moe_layer_interval": 1})
_ERNIES = ("ernie4_5", "ernie4_5_moe")
_USE_BIAS = (*_ERNIES, "starcoder2")  # (one bias key, use_bias, for every projection)
# MiniMax-M2 (MiniMaxM2ForCausalLM: MiniMax-M2, M2.1, M2.5): Llama's attention with an RMSNorm over each token's whole
# query and key projections (OLMoE's, heads x head_dim wide) and RoPE on the first partial_rotary_factor of each head
# (its checkpoints' rotary_dim: 64 of 128, half-split pairs); every layer a mixture of num_local_experts experts of
# intermediate_size (Mixtral's names), num_experts_per_tok of them chosen by the sigmoid of the router's logits
# (computed in the model's dtype, the sigmoid in float32) plus a correction bias, weighted by those sigmoids
# renormalised, kept in float32.
FAMILIES["minimax_m2"] = Family("MiniMaxM2ForCausalLM", qk_norm=True, qk_norm_full=True, defaults={
    "vocab_size": 200064, "hidden_size": 3072, "intermediate_size": 1536, "num_hidden_layers": 62,
    "num_attention_heads": 48, "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 196608,
    "rms_norm_eps": 1e-6, "pad_token_id": None, "bos_token_id": 200034, "eos_token_id": 200020,
    "rope_theta": 5000000.0, "num_local_experts": 256, "num_experts_per_tok": 8})
# StarCoder 2 (Starcoder2ForCausalLM: starcoder2-3b / 7b / 15b): torch's LayerNorm with a bias (norm_epsilon), biases
# on every projection by its one use_bias key, an ungated MLP (c_fc, GELU's tanh form, c_proj), a sliding window on
# every layer where its config sets one, a tied head. Arcee (ArceeForCausalLM: AFM-4.5B): Llama's layer with an
# ungated MLP of ReLU squared (up_proj, down_proj).
FAMILIES["starcoder2"] = Family("Starcoder2ForCausalLM", activation="gelu_tanh", hidden_acts=("gelu_pytorch_tanh",),
                                gated_mlp=False, torch_layer_norm="plain", reads=("attention_bias", "mlp_bias"),
                                defaults={
                                    "vocab_size": 49152, "hidden_size": 3072, "intermediate_size": 12288,
                                    "num_hidden_layers": 30, "num_attention_heads": 24, "num_key_value_heads": 2,
                                    "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "bos_token_id": 50256,
                                    "eos_token_id": 50256, "tie_word_embeddings": True, "attention_bias": True,
                                    "mlp_bias": True})
# BitNet b1.58 (BitNetForCausalLM: microsoft/bitnet-b1.58-2B-4T and its -bf16 master weights): Llama's layer with an
# RMSNorm on the heads' output before o_proj and one on the gated MLP's product before down_proj (sub_norms), the MLP
# gated by ReLU squared; with quantization_config "bitnet" its projections ternary with int8 activations
# (triforce/models/bitnet.py), else float as its master weights compute.
FAMILIES["bitnet"] = Family("BitNetForCausalLM", activation="relu2", hidden_acts=("relu2",), sub_norms=True,
                            reads=("attention_bias",), defaults={
                                "vocab_size": 128256, "hidden_size": 2560, "intermediate_size": 6912,
                                "num_hidden_layers": 30, "num_attention_heads": 20, "num_key_value_heads": 5,
                                "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
                                "bos_token_id": 128000, "eos_token_id": 128001})
FAMILIES["arcee"] = Family("ArceeForCausalLM", activation="relu2", hidden_acts=("relu2",), gated_mlp=False,
                           reads=("attention_bias", "mlp_bias"), defaults={
                               "vocab_size": 32000, "hidden_size": 2560, "intermediate_size": 18432,
                               "num_hidden_layers": 32, "num_attention_heads": 32, "max_position_embeddings": 4096,
                               "rms_norm_eps": 1e-5, "bos_token_id": 128000, "eos_token_id": 128001})
# Jais 2 (Jais2ForCausalLM: Jais-2-8B-Chat, Jais-2-70B-Chat): Arcee's ungated MLP of ReLU squared on torch's LayerNorm
# with a bias (layer_norm_eps), biases on every projection by attention_bias and mlp_bias (both true by default)
FAMILIES["jais2"] = Family("Jais2ForCausalLM", activation="relu2", hidden_acts=("relu2",), gated_mlp=False,
                           torch_layer_norm="plain", reads=("attention_bias", "mlp_bias"), defaults={
                               "vocab_size": 150272, "hidden_size": 3328, "intermediate_size": 26624,
                               "num_attention_heads": 26, "max_position_embeddings": 8192, "rms_norm_eps": 1e-5,
                               "bos_token_id": 0, "eos_token_id": 150024, "attention_bias": True, "mlp_bias": True})
# Apertus (ApertusForCausalLM: Swiss AI's Apertus-8B / 70B, Base and Instruct): Llama's layer with Qwen3's per-head q/k
# RMSNorms before RoPE, its two norms named attention_layernorm / feedforward_layernorm (renamed on loading), and an
# ungated MLP (up_proj, down_proj, no biases) of xIELU with learned numbers per layer (mlp.act_fn.alpha_p / alpha_n /
# beta / eps: llama.XIELU); Llama 3.1's RoPE at base 1.2e7 where its config gives no RoPE dict
FAMILIES["apertus"] = Family("ApertusForCausalLM", activation="xielu", hidden_acts=("xielu",), gated_mlp=False,
                             qk_norm=True, reads=("attention_bias",), defaults={
                                 "vocab_size": 131072, "hidden_size": 4096, "intermediate_size": 14336,
                                 "num_hidden_layers": 32, "num_attention_heads": 32, "max_position_embeddings": 65536,
                                 "rms_norm_eps": 1e-5, "pad_token_id": 3, "bos_token_id": 1, "eos_token_id": 2})
_APERTUS_ROPE = {"rope_type": "llama3", "rope_theta": 12000000.0, "factor": 8.0,
                 "original_max_position_embeddings": 8192, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
# Phi-2 (PhiForCausalLM: phi-1, phi-1.5, phi-2): one torch LayerNorm (with a bias) before the attention and the MLP,
# which run in parallel on it (Cohere 2's block); biases on every projection and on the LM head, always; RoPE on the
# first partial_rotary_factor (0.5; phi-2: 0.4) of each head; an ungated MLP of GELU's tanh form (fc1, fc2); the
# checkpoints' names self_attn.dense, mlp.fc1 / fc2 and model.final_layernorm (renamed on loading)
FAMILIES["phi"] = Family("PhiForCausalLM", activation="gelu_tanh", hidden_acts=("gelu_new",), gated_mlp=False,
                         torch_layer_norm="plain", parallel_block=True, partial_rotary_factor=0.5,
                         reads=("attention_bias", "mlp_bias"), defaults={
                             "vocab_size": 51200, "hidden_size": 2048, "intermediate_size": 8192,
                             "num_hidden_layers": 24, "num_attention_heads": 32, "max_position_embeddings": 2048,
                             "rms_norm_eps": 1e-5, "bos_token_id": 1, "eos_token_id": 2})
# StableLM (StableLmForCausalLM: stablelm-2-1_6b / zephyr, stablelm-2-12b, stablelm-3b-4e1t, stablelm-zephyr-3b):
# Llama's gated MLP on torch's LayerNorm with a bias (layer_norm_eps), RoPE on the first partial_rotary_factor (0.25)
# of each head, biases on q / k / v by use_qkv_bias, with use_parallel_residual the attention and the MLP in parallel
# on the one norm, with qk_layernorm (12B) a LayerNorm without a bias on each q / k head, weights of its own per head
FAMILIES["stablelm"] = Family("StableLmForCausalLM", torch_layer_norm="plain", partial_rotary_factor=0.25, defaults={
    "vocab_size": 50304, "hidden_size": 2560, "intermediate_size": 6912, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 32, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
    "bos_token_id": 0, "eos_token_id": 0})
# Nemotron (NemotronForCausalLM: Nemotron-Mini-4B, Minitron-4B / 8B, Nemotron-4): LayerNorm1P (torch's LayerNorm with
# a bias, its weight applied as 1 + w; norm_eps), RoPE on the first half of each head (partial_rotary_factor 0.5), an
# ungated MLP of ReLU squared
FAMILIES["nemotron"] = Family("NemotronForCausalLM", activation="relu2", hidden_acts=("relu2",), gated_mlp=False,
                              torch_layer_norm="1p", partial_rotary_factor=0.5, reads=("attention_bias", "mlp_bias"),
                              defaults={"vocab_size": 256000, "hidden_size": 6144, "intermediate_size": 24576,
                                        "num_hidden_layers": 32, "num_attention_heads": 48,
                                        "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "bos_token_id": 2,
                                        "eos_token_id": 3})
# Hunyuan (HunYuanDenseV1ForCausalLM: Hunyuan-0.5B / 1.8B / 4B / 7B, Hunyuan-MT; HunYuanMoEV1ForCausalLM:
# Hunyuan-A13B): Llama's layer with a per-head q/k RMSNorm after RoPE (query_layernorm, key_layernorm), RoPE of a fixed
# NTK alpha (rope_scaling 'dynamic' with 'alpha': the base times alpha ** (head_dim / (head_dim - 2)), whatever the
# length); the mixture: every layer sparse, the router's weight kept in float32 (mlp.gate.wg), the softmax's top
# moe_topk renormalised, kept in float32, and a shared expert of width intermediate_size (mlp.shared_mlp) added as it
# is.
_HUNYUAN_DEFAULTS = {"vocab_size": 290943, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
                     "num_attention_heads": 32, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5,
                     "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
FAMILIES["hunyuan_v1_dense"] = Family("HunYuanDenseV1ForCausalLM", qk_norm=True, qk_norm_after_rope=True,
                                      reads=("attention_bias",), defaults=dict(_HUNYUAN_DEFAULTS))
FAMILIES["hunyuan_v1_moe"] = Family("HunYuanMoEV1ForCausalLM", qk_norm=True, qk_norm_after_rope=True,
                                    reads=("attention_bias",), defaults={**_HUNYUAN_DEFAULTS, "num_experts": 1,
                                                                         "moe_topk": 1})
_HUNYUANS = ("hunyuan_v1_dense", "hunyuan_v1_moe")
# GPT-NeoX (GPTNeoXForCausalLM: Pythia 14M-12B, GPT-NeoX-20B, Dolly v2, RedPajama-INCITE, StableLM-Alpha): torch's
# LayerNorm with a bias (layer_norm_eps), by default (use_parallel_residual) the attention and the MLP in parallel,
# each on its own norm of the block's input (h + attn(norm1(h)) + mlp(norm2(h))); multi-head attention (no KV groups)
# with q, k and v as one per-head interleaved query_key_value (rows [q_h; k_h; v_h] for each head h), biases on it
# and on dense by attention_bias; RoPE on the first rotary_pct (0.25) of each head at base rotary_emb_base; an
# ungated MLP of the exact GELU (dense_h_to_4h, dense_4h_to_h, biased) or, by hidden_act, GELU's tanh form
# (GPT-NeoX-20B's gelu_fast); an untied head (embed_out). Its checkpoints' names under gpt_neox.* (renamed on
# loading).
FAMILIES["gpt_neox"] = Family("GPTNeoXForCausalLM", activation="gelu",
                              hidden_acts=("gelu", "gelu_fast", "gelu_new", "gelu_pytorch_tanh"), gated_mlp=False,
                              torch_layer_norm="plain", parallel_block=True, parallel_norms=True,
                              partial_rotary_factor=0.25, fused_projections=("query_key_value",),
                              reads=("attention_bias", "mlp_bias"), defaults={
                                  "vocab_size": 50432, "hidden_size": 6144, "intermediate_size": 24576,
                                  "num_hidden_layers": 44, "num_attention_heads": 64, "max_position_embeddings": 2048,
                                  "rms_norm_eps": 1e-5, "bos_token_id": 0, "eos_token_id": 2,
                                  "attention_bias": True})
# GPT-NeoX Japanese (GPTNeoXJapaneseForCausalLM: abeja's gpt-neox-japanese-2.7b): GPT-NeoX's layer in sequence (h +
# attn(norm1(h)), then + mlp(norm2(.)); torch's LayerNorms with biases, layer_norm_eps), its per-head interleaved
# query_key_value and dense without biases, but for the last layer's attention: a bias on its output (dense_bias,
# added before the residual; LlamaConfig.layer_out_bias); RoPE on the first rotary_pct (1.0) of each head at base
# rotary_emb_base; an ungated MLP of the exact GELU, hidden_size * intermediate_multiple_size wide, unbiased; a tied
# head by default (embed_out). Its checkpoints' names under gpt_neox_japanese.* (renamed on loading).
FAMILIES["gpt_neox_japanese"] = dataclasses.replace(
    FAMILIES["gpt_neox"], architecture="GPTNeoXJapaneseForCausalLM", parallel_block=False, parallel_norms=False,
    partial_rotary_factor=1.0, reads=(), defaults={
        "vocab_size": 32000, "hidden_size": 2560, "intermediate_size": 10240, "num_hidden_layers": 32,
        "num_attention_heads": 32, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "bos_token_id": 31996,
        "eos_token_id": 31999, "tie_word_embeddings": True})
# ModernBERT decoder (ModernBertDecoderForCausalLM: the Ettin decoders, 17M-1B): torch's LayerNorm (a bias by
# norm_bias, default none; eps norm_eps) on the embeddings and before each block but the first layer's attention;
# multi-head attention (q_proj, k_proj, v_proj, Wo; biases by attention_bias), every global_attn_every_n_layers-th layer
# (from the first) global at RoPE base 160000, the others sliding over local_attention // 2 tokens at base 10000
# (rope_parameters per layer type); a gated MLP of the exact GELU, its gate and up projections one Wi (rows [gate;
# up]); the final norm, then a prediction head norm(gelu(dense(h))) (LlamaConfig.head_transform) before the tied
# decoder (a bias by decoder_bias, default true). Its checkpoints' names renamed on loading (loading.py).
# ModernBertDecoderConfig's local_attention, global_attn_every_n_layers and its sliding layers' RoPE base
_MODERNBERT_LOCAL, _MODERNBERT_EVERY, _MODERNBERT_LOCAL_THETA = 128, 3, 10000.0
FAMILIES["modernbert-decoder"] = Family(
    "ModernBertDecoderForCausalLM", activation="gelu", hidden_acts=("gelu",), torch_layer_norm="nobias",
    embed_layernorm=True, fused_projections=("gate_up_proj",), reads=("attention_bias", "mlp_bias"), defaults={
        "vocab_size": 50368, "hidden_size": 768, "intermediate_size": 1152, "num_hidden_layers": 22,
        "num_attention_heads": 12, "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 160000.0,
        "bos_token_id": 50281, "eos_token_id": 50282, "pad_token_id": 50283, "tie_word_embeddings": True,
        "sliding_window": _MODERNBERT_LOCAL // 2})
_NEOX_JA_WIDTH = 4  # GPTNeoXJapaneseConfig's intermediate_multiple_size: the MLP's width over hidden_size
# GPT-J (GPTJForCausalLM: gpt-j-6b, GPT-JT, its fine-tunes): Phi-2's parallel block (one torch LayerNorm with a bias,
# ln_1, before the attention and the MLP) without attention biases: q, k, v and out_proj unbiased, an ungated MLP of
# GELU's tanh form (activation_function gelu_new; fc_in, fc_out, biased), a biased head; RoPE at base 10000 on the
# first rotary_dim (64) dims of each head on adjacent pairs (rotate_every_two), its cos and sin in float32; its config's
# names (n_embd, n_layer, n_head, n_positions, n_inner: 4 * n_embd when null) and checkpoints' (transformer.*)
FAMILIES["gptj"] = Family("GPTJForCausalLM", activation="gelu_tanh", hidden_acts=("gelu_new",), gated_mlp=False,
                          torch_layer_norm="plain", parallel_block=True, rope_interleaved=True, rope_float32="tables",
                          reads=("mlp_bias",), defaults={
                              "vocab_size": 50400, "hidden_size": 4096, "num_hidden_layers": 28,
                              "num_attention_heads": 16, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5,
                              "bos_token_id": 50256, "eos_token_id": 50256, "pad_token_id": None})
_GPTJ_ROTARY = 64  # GPTJConfig's rotary_dim
# CodeGen (CodeGenForCausalLM: Salesforce's codegen-350M / 2B / 6B / 16B, mono / multi / nl): GPT-J's layer and config
# with q, k and v as one unbiased qkv_proj in its model-parallel layout (4 blocks, each its heads' q, then v, then k:
# split on loading, joined on saving)
FAMILIES["codegen"] = Family("CodeGenForCausalLM", activation="gelu_tanh", hidden_acts=("gelu_new",), gated_mlp=False,
                             torch_layer_norm="plain", parallel_block=True, rope_interleaved=True,
                             rope_float32="tables", reads=("mlp_bias",), defaults=dict(FAMILIES["gptj"].defaults))
_GPTJS = ("gptj", "codegen")
# Persimmon (PersimmonForCausalLM: Adept's persimmon-8b-base / -chat; Fuyu's language model): torch's LayerNorm with a
# bias before the attention and the MLP (sequential); q, k and v as one per-head query_key_value (GPT-NeoX's layout),
# biases everywhere but the head; a LayerNorm with a bias over head_dim shared by the heads on q and k
# (qk_layernorm, on by default: Phi's); RoPE on the first half of each head (partial_rotary_factor 0.5); an ungated MLP
# of ReLU squared (dense_h_to_4h, dense_4h_to_h)
FAMILIES["persimmon"] = Family("PersimmonForCausalLM", activation="relu2", hidden_acts=("relu2",), gated_mlp=False,
                               torch_layer_norm="plain", partial_rotary_factor=0.5,
                               fused_projections=("query_key_value",), reads=("attention_bias", "mlp_bias"),
                               defaults={
                                   "vocab_size": 262144, "hidden_size": 4096, "intermediate_size": 16384,
                                   "num_hidden_layers": 36, "num_attention_heads": 64,
                                   "max_position_embeddings": 16384, "rms_norm_eps": 1e-5, "bos_token_id": 1,
                                   "eos_token_id": 2, "pad_token_id": None, "qk_layernorm": True})
_GPTJ_NAMES = {"n_embd": "hidden_size", "n_layer": "num_hidden_layers", "n_head": "num_attention_heads",
               "n_positions": "max_position_embeddings", "n_inner": "intermediate_size",
               "activation_function": "hidden_act"}  # (GPTJConfig's names -> the model's; GPT2Config's too)
# GPT-2 (GPT2LMHeadModel: gpt2 to gpt2-xl, distilgpt2, DialoGPT, Cerebras-GPT, their fine-tunes): learned absolute
# position embeddings (wpe) added to the token embeddings, no RoPE; torch's LayerNorm with a bias before the attention
# and the MLP (ln_1, ln_2); multi-head attention with q, k and v as one biased c_attn, scaled by head_dim ** -0.5 (1
# where scale_attn_weights is false); an ungated MLP (c_fc, c_proj; n_inner, 4 * n_embd when null) of GELU's tanh form
# (activation_function gelu_new; gelu exact, relu by its key); a tied head; GPTJConfig's names (n_embd, n_layer,
# n_head, n_positions, n_inner, layer_norm_epsilon). Its checkpoints' transformer.* (or unprefixed, as gpt2's own)
# with Conv1D weights ([in, out]: transposed on loading and saving) and q, k, v as one c_attn (split, joined)
FAMILIES["gpt2"] = Family("GPT2LMHeadModel", activation="gelu_tanh",
                          hidden_acts=("gelu_new", "gelu_pytorch_tanh", "gelu_fast", "gelu", "relu"), gated_mlp=False,
                          torch_layer_norm="plain", learned_positions=True, reads=("attention_bias", "mlp_bias"),
                          defaults={
                              "vocab_size": 50257, "hidden_size": 768, "num_hidden_layers": 12,
                              "num_attention_heads": 12, "max_position_embeddings": 1024, "rms_norm_eps": 1e-5,
                              "bos_token_id": 50256, "eos_token_id": 50256, "pad_token_id": None,
                              "tie_word_embeddings": True})
# Falcon (FalconForCausalLM: falcon-7b / 40b / 180b, their instruct models, Falcon-RW: ALiBi by alibi): torch's
# LayerNorm with a bias (layer_norm_epsilon), an ungated MLP of the exact GELU (dense_h_to_4h, dense_4h_to_h;
# ffn_hidden_size, 4 * hidden by default), one bias key for every projection (bias), RoPE over the whole head, a tied
# head; q, k and v as one query_key_value in one of three layouts: new_decoder_architecture (40b, 180b: per KV group
# its queries, then its key and value; num_kv_heads groups), multi_query (7b: every query head, then one key and one
# value) or per head q, k, v (GPT-NeoX's); the attention and the MLP in parallel (parallel_attn; the new architecture
# always), on one norm or, with the new architecture's num_ln_in_parallel_attn 2 (its default), each on its own
# (ln_attn, ln_mlp)
FAMILIES["falcon"] = Family("FalconForCausalLM", activation="gelu", hidden_acts=("gelu",), gated_mlp=False,
                            torch_layer_norm="plain", parallel_block=True, parallel_norms=True,
                            reads=("attention_bias", "mlp_bias"), defaults={
                                "vocab_size": 65024, "hidden_size": 4544, "num_hidden_layers": 32,
                                "num_attention_heads": 71, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5,
                                "bos_token_id": 11, "eos_token_id": 11, "tie_word_embeddings": True})
_FALCON_LAYOUT = ("new_decoder_architecture", "multi_query", "parallel_attn", "num_kv_heads",
                  "num_ln_in_parallel_attn", "ffn_hidden_size", "activation", "alibi", "bias")
# BLOOM (BloomForCausalLM: bigscience's bloom-560m / 1b1 / 1b7 / 3b / 7b1 / 176b, bloomz, their fine-tunes): ALiBi (no
# RoPE; slopes 2 ** (-8 k / n) as BloomModel computes them), a LayerNorm with a bias on the embeddings
# (word_embeddings_layernorm), torch's LayerNorm with a bias (layer_norm_epsilon) before the attention and the MLP,
# multi-head attention with q, k and v as one per-head query_key_value (GPT-NeoX's layout), an ungated MLP of 4 x
# hidden_size of GELU's tanh form, biases on every projection, a tied head; its config's names (n_layer, n_head; n_embed
# in old ones), its checkpoints' transformer.* (or unprefixed, as bigscience's own)
FAMILIES["bloom"] = Family("BloomForCausalLM", activation="gelu_tanh", hidden_acts=("gelu_tanh",), gated_mlp=False,
                           torch_layer_norm="plain", alibi="bloom", embed_layernorm=True,
                           reads=("attention_bias", "mlp_bias"), defaults={
                               "vocab_size": 250880, "hidden_size": 64, "num_hidden_layers": 2,
                               "num_attention_heads": 8, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5,
                               "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": None,
                               "tie_word_embeddings": True})
_BLOOM_NAMES = {"n_embed": "hidden_size", "n_layer": "num_hidden_layers", "n_head": "num_attention_heads"}
# MPT (MptForCausalLM: mosaicml's mpt-7b / 30b and their instruct / chat models): ALiBi (no RoPE; slopes 1 / 2 ** (k
# * 8 / n), attn_config's alibi_bias_max 8), torch's LayerNorm without a bias (layer_norm_epsilon) before the attention
# and the MLP and at the end, multi-head attention with q, k and v as one Wqkv ([q; k; v]), optionally clamped
# (attn_config's clip_qkv), its scores scaled by attn_config's softmax_scale (default head_dim ** -0.5), an ungated MLP
# of 4 x d_model
# of the exact GELU, no biases (no_bias), a tied head; its config's names (d_model, n_heads, n_layers, max_seq_len,
# attn_config), its checkpoints' transformer.* (wte, blocks, norm_f)
FAMILIES["mpt"] = Family("MptForCausalLM", activation="gelu", hidden_acts=("gelu",), gated_mlp=False,
                         torch_layer_norm="nobias", alibi="mpt", defaults={
                             "vocab_size": 50368, "hidden_size": 2048, "num_hidden_layers": 24,
                             "num_attention_heads": 16, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5,
                             "bos_token_id": None, "eos_token_id": None, "pad_token_id": None,
                             "tie_word_embeddings": True})
_MPT_NAMES = {"d_model": "hidden_size", "n_heads": "num_attention_heads", "n_layers": "num_hidden_layers",
              "max_seq_len": "max_position_embeddings"}  # (MptConfig's names -> the model's)
_MPT_ATTN = ("clip_qkv", "softmax_scale")  # (its attn_config's keys the model reads: in extra)
# GPT-NeoX's names for the RoPE keys (transformers 5 moves them into rope_parameters, where its own win: here the two
# must agree)
# GPT-BigCode (GPTBigCodeForCausalLM: StarCoder, StarCoderBase, SantaCoder in transformers' layout, tiny_starcoder_py,
# WizardCoder, OctoCoder): GPT-2's layer, config names and learned positions with nn.Linear weights and, by default
# (multi_query), one key / value head (c_attn's rows [q; k; v]); without it multi-head attention, c_attn's rows per head
# [q_h; k_h; v_h]; GELU's tanh form (gelu_pytorch_tanh) by default
FAMILIES["gpt_bigcode"] = Family("GPTBigCodeForCausalLM", activation="gelu_tanh",
                                 hidden_acts=("gelu_pytorch_tanh", "gelu_new", "gelu_fast", "gelu", "relu"),
                                 gated_mlp=False, torch_layer_norm="plain", learned_positions=True,
                                 reads=("attention_bias", "mlp_bias"), defaults=dict(FAMILIES["gpt2"].defaults))
_GPT2S = ("gpt2", "gpt_bigcode")
# GPT-1 (OpenAIGPTLMHeadModel: openai-community/openai-gpt): GPT-2's embeddings, learned positions (offset 0) and
# Conv1D layer names, its norms after each block's residual add (h = ln_1(h + attn(h)), then ln_2(h + mlp(h)):
# LlamaConfig.norm_after_residual) and no final norm, an ungated MLP of 4 x n_embd (afn: "gelu" is GELU's tanh form,
# "relu"), biases everywhere, scaled scores, a tied head; its config's names (n_embd, n_layer, n_head, n_positions,
# afn, layer_norm_epsilon); its checkpoints' transformer.* (tokens_embed, positions_embed, h.*), or unprefixed
FAMILIES["openai-gpt"] = dataclasses.replace(
    FAMILIES["gpt2"], architecture="OpenAIGPTLMHeadModel", hidden_acts=("gelu", "relu"),
    defaults={**FAMILIES["gpt2"].defaults, "vocab_size": 40478, "max_position_embeddings": 512,
              "bos_token_id": None, "eos_token_id": None})
_OPENAI_NAMES = {"n_embd": "hidden_size", "n_layer": "num_hidden_layers", "n_head": "num_attention_heads",
                 "n_positions": "max_position_embeddings", "afn": "hidden_act"}  # (OpenAIGPTConfig's -> the model's)
# GPT-Neo (GPTNeoForCausalLM: EleutherAI's gpt-neo-125m / 1.3B / 2.7B, the TinyStories models, their fine-tunes):
# GPT-2's learned positions and layer with separate unbiased q, k, v (out_proj biased), unscaled scores (scale 1), a
# window of window_size (256) tokens on the attention_types' local layers (by default every other layer from the
# second: [[["global", "local"], 12]]); its config's names (num_layers, num_heads; intermediate_size, 4 * hidden when
# null), its checkpoints' transformer.* (attn.attention.*)
FAMILIES["gpt_neo"] = Family("GPTNeoForCausalLM", activation="gelu_tanh",
                             hidden_acts=("gelu_new", "gelu_pytorch_tanh", "gelu_fast", "gelu", "relu"),
                             gated_mlp=False, torch_layer_norm="plain", learned_positions=True, reads=("mlp_bias",),
                             defaults={"vocab_size": 50257, "hidden_size": 2048, "num_hidden_layers": 24,
                                       "num_attention_heads": 16, "max_position_embeddings": 2048,
                                       "rms_norm_eps": 1e-5, "bos_token_id": 50256, "eos_token_id": 50256,
                                       "pad_token_id": None, "tie_word_embeddings": True})
_GPT_NEO_NAMES = {"num_layers": "num_hidden_layers", "num_heads": "num_attention_heads",
                  "activation_function": "hidden_act"}  # (GPTNeoConfig's names -> the model's)
_GPT_NEO_TYPES = [[["global", "local"], 12]]  # GPTNeoConfig's attention_types
# OPT (OPTForCausalLM: facebook's opt-125m, 1.3b, 2.7b, 6.7b, 13b, 30b, 66b, their fine-tunes, Galactica's layout is
# not OPT's): GPT-2's learned positions with an offset (position p reads row p + 2), torch's LayerNorm with a bias
# (its eps fixed, 1e-5) before the attention and the MLP (self_attn_layer_norm, final_layer_norm) and at the end;
# multi-head attention (q, k, v, out_proj) with its queries scaled before the scores (the same scale: rounding only);
# an ungated MLP (fc1, fc2; ffn_dim) of ReLU (activation_function); biases on every projection by enable_bias; a tied
# head. Its checkpoints' names under model.decoder.* (or decoder.*, as facebook's own). opt-350m's layout: its norms
# after each block's residual add (do_layer_norm_before false: LlamaConfig.norm_after_residual) and no final norm,
# its embeddings narrower than the layers (word_embed_proj_dim, LlamaConfig.embed_dim: project_in after the token
# embedding, project_out before the head); _remove_final_layer_norm drops the final norm of a pre-norm model
FAMILIES["opt"] = Family("OPTForCausalLM", activation="relu", hidden_acts=("relu", "gelu", "gelu_new"),
                         gated_mlp=False, torch_layer_norm="plain", learned_positions=True, position_offset=2,
                         reads=("attention_bias", "mlp_bias"), defaults={
                             "vocab_size": 50272, "hidden_size": 768, "intermediate_size": 3072,
                             "num_hidden_layers": 12, "num_attention_heads": 12, "max_position_embeddings": 2048,
                             "rms_norm_eps": 1e-5, "pad_token_id": 1, "bos_token_id": 2, "eos_token_id": 2,
                             "tie_word_embeddings": True})
# BioGPT (BioGptForCausalLM: microsoft's biogpt, BioGPT-Large and their fine-tunes): OPT's layer (learned positions at
# offset 2, LayerNorms of eps 1e-5 whatever its layer_norm_eps says: its modules never pass it) with the exact GELU,
# the embeddings times sqrt(hidden_size) where scale_embedding (its default), a tied head (output_projection); its
# checkpoints' biogpt.* names
FAMILIES["biogpt"] = dataclasses.replace(
    FAMILIES["opt"], architecture="BioGptForCausalLM", activation="gelu", hidden_acts=("gelu", "gelu_new", "relu"),
    defaults={**FAMILIES["opt"].defaults, "vocab_size": 42384, "hidden_size": 1024, "intermediate_size": 4096,
              "num_hidden_layers": 24, "num_attention_heads": 16, "max_position_embeddings": 1024, "bos_token_id": 0})
# XGLM (XGLMForCausalLM: facebook's xglm-564M / 1.7B / 2.9B / 4.5B / 7.5B): BioGPT's layer with fixed sinusoidal
# positions at offset 2 (fairseq's table: sin then cos of position x 10000 ** (-i / (d/2 - 1)); computed, in no
# checkpoint), the embeddings times sqrt(d_model) by scale_embedding; its config's names (d_model, num_layers,
# attention_heads, ffn_dim, activation_function)
FAMILIES["xglm"] = dataclasses.replace(
    FAMILIES["biogpt"], architecture="XGLMForCausalLM", sinusoidal_positions=True,
    defaults={**FAMILIES["opt"].defaults, "vocab_size": 256008, "hidden_size": 1024, "intermediate_size": 4096,
              "num_hidden_layers": 24, "num_attention_heads": 16, "max_position_embeddings": 2048, "bos_token_id": 0})
_XGLM_NAMES = {"d_model": "hidden_size", "num_layers": "num_hidden_layers", "attention_heads": "num_attention_heads",
               "ffn_dim": "intermediate_size", "activation_function": "hidden_act",
               "init_std": "initializer_range"}  # (XGLMConfig's names -> the model's)
_OPT_NAMES = {"ffn_dim": "intermediate_size", "activation_function": "hidden_act",
              "init_std": "initializer_range"}  # (OPTConfig's names -> the model's)
_NEOX_ROPE_KEYS = {"rotary_pct": "partial_rotary_factor", "rotary_emb_base": "rope_theta"}
_NORM_EPS_KEY = {"starcoder2": "norm_epsilon", "nemotron": "norm_eps", "lfm2": "norm_eps", "lfm2_moe": "norm_eps",
                 "lfm3": "norm_eps",
                 "phi": "layer_norm_eps",
                 "persimmon": "layer_norm_eps",
                 "gptj": "layer_norm_epsilon", "codegen": "layer_norm_epsilon", "gpt2": "layer_norm_epsilon",
                 "openai-gpt": "layer_norm_epsilon",
                 "gpt_bigcode": "layer_norm_epsilon", "gpt_neo": "layer_norm_epsilon",
                 "jais2": "layer_norm_eps", "falcon": "layer_norm_epsilon", "bloom": "layer_norm_epsilon",
                 "mpt": "layer_norm_epsilon",
                 "stablelm": "layer_norm_eps", "gpt_neox": "layer_norm_eps", "gpt_neox_japanese": "layer_norm_eps",
                 "modernbert-decoder": "norm_eps"}  # (the LayerNorm families' own eps keys)
# Cohere 2 (Cohere2ForCausalLM: Command R7B, Command A): one LayerNorm (no bias) before the attention and the MLP,
# which run in parallel on it (h + attn(x) + mlp(x)); the logits times logit_scale; the layer_types' sliding layers
# (three of every four by default) slide and take RoPE on adjacent pairs of dims, the others take none (NoPE); a tied
# head.
FAMILIES["cohere2"] = Family("Cohere2ForCausalLM", layer_norm=True, parallel_block=True, rope_interleaved=True,
                             rope_float32="math", reads=("attention_bias",), defaults={
                                 "vocab_size": 256000, "hidden_size": 8192, "intermediate_size": 22528,
                                 "num_hidden_layers": 40, "num_attention_heads": 64, "max_position_embeddings": 8192,
                                 "rms_norm_eps": 1e-5, "pad_token_id": 0, "bos_token_id": 5, "eos_token_id": 255001,
                                 "tie_word_embeddings": True, "sliding_window": 4096, "sliding_window_pattern": 4,
                                 "logit_scale": 0.0625})
# Cohere (CohereForCausalLM: Command R, Command R 08-2024, Command R+, Aya 23, Aya Expanse): Cohere 2's layer without
# sliding windows (RoPE on every layer); with use_qk_norm (Command R+) a LayerNorm on every q / k head, its own weights
# per head.
FAMILIES["cohere"] = Family("CohereForCausalLM", layer_norm=True, parallel_block=True, rope_interleaved=True,
                            rope_float32="math", reads=("attention_bias",), defaults={
                                **{k: v for k, v in FAMILIES["cohere2"].defaults.items()
                                   if k not in ("sliding_window", "sliding_window_pattern")}})
_COHERES = ("cohere", "cohere2")
# Cohere 2's mixture (Cohere2MoeForCausalLM: Command A+): Cohere 2's parallel layer (one norm before the attention and
# the MLP: its LayerNorm without a bias of layer_norm_eps, or, where rms_norm_eps is set, Llama's RMSNorm; RoPE on
# adjacent pairs of dims, in float32, on the layer_types' sliding layers only, and on the dense layers too where
# prefix_dense_sliding_window_pattern is 1; the window on the sliding layers; head_dim its own), the logits times
# logit_scale; its mlp_layer_types' sparse layers a mixture of num_experts of intermediate_size: the router's top
# num_experts_per_tok logits, their softmax (expert_selection_fn 'softmax') or their sigmoid (renormalised where
# norm_topk_prob), in the dtype, with num_shared_experts shared experts as one MLP summed with the routed output or
# averaged with it (shared_expert_combination_strategy); the dense layers' MLPs prefix_dense_intermediate_size wide
# (null: intermediate_size). Its layer lists by default (AXK1's way) from first_k_dense_replace (a legacy key, 0):
# those dense, their types by prefix_dense_sliding_window_pattern, the rest by sliding_window_pattern.
FAMILIES["cohere2_moe"] = Family("Cohere2MoeForCausalLM", layer_norm=True, parallel_block=True, rope_interleaved=True,
                                 rope_float32="math", reads=("attention_bias",), defaults={
                                     **FAMILIES["cohere2"].defaults, "head_dim": 128, "num_experts": 8,
                                     "num_experts_per_tok": 2, "num_shared_experts": 0,
                                     "shared_expert_combination_strategy": "average",
                                     "expert_selection_fn": "softmax", "prefix_dense_sliding_window_pattern": 1,
                                     "norm_topk_prob": True, "first_k_dense_replace": 0})
# GLM-4 (Glm4ForCausalLM: GLM-4-9B-0414, GLM-4-32B-0414, GLM-Z1): Gemma 3's four norms around the blocks (under its own
# names: post_self_attn_layernorm after the attention, post_attention_layernorm before the MLP, post_mlp_layernorm
# after it), Llama's RMSNorm; biases on q, k and v by attention_bias (none on o); RoPE on the first half of each head
# (partial_rotary_factor 0.5) on adjacent pairs of dims; its checkpoints hold the gate and up projections as one.
FAMILIES["glm4"] = Family("Glm4ForCausalLM", sandwich_norms=True, fused_projections=("gate_up_proj",),
                          rope_interleaved=True, partial_rotary_factor=0.5, reads=("attention_bias",), defaults={
                              "vocab_size": 151552, "hidden_size": 4096, "intermediate_size": 13696,
                              "num_hidden_layers": 40, "num_attention_heads": 32, "num_key_value_heads": 2,
                              "head_dim": 128, "max_position_embeddings": 131072, "rms_norm_eps": 1.5625e-07,
                              "pad_token_id": 151329, "bos_token_id": None, "eos_token_id": None,
                              "attention_bias": True})
# NanoChat (NanoChatForCausalLM: Karpathy's nanochat d20 / d32 as transformers converts them): RMSNorms without weights
# (Llama 4's L2 norm: x * rsqrt(mean(x^2) + eps)) before the attention and the MLP, at the end and also on the
# embeddings before the first layer; Qwen3's attention with its per-head q / k norms after RoPE (Hunyuan's order) and
# RoPE by -angle (its rotate_half's signs flipped: read as RoPE on each q / k head's halves swapped); an
# ungated MLP (fc1, hidden_act, fc2; ReLU squared); the logits soft-capped (final_logit_softcapping, 15).
FAMILIES["nanochat"] = Family("NanoChatForCausalLM", activation="relu2", hidden_acts=("relu2",), gated_mlp=False,
                              qk_norm=True, qk_norm_after_rope=True, embed_norm=True, weightless_norms=True,
                              rope_reversed=True,
                              reads=("attention_bias",), defaults={
                                  "vocab_size": 50304, "hidden_size": 768, "intermediate_size": 8192,
                                  "num_hidden_layers": 12, "num_attention_heads": 6, "max_position_embeddings": 2048,
                                  "rms_norm_eps": 1e-6, "bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 1,
                                  "final_logit_softcapping": 15.0})
# Helium (HeliumForCausalLM: Kyutai's Helium-1 2B): Llama's layer with RoPE on adjacent pairs of dims (reordered on
# loading) and its RMSNorm's weight applied in float32 (rounded to the dtype at the end)
FAMILIES["helium"] = Family("HeliumForCausalLM", rope_interleaved=True, float32_norm=True,
                            reads=("attention_bias", "mlp_bias"), defaults={
                                "vocab_size": 48000, "hidden_size": 2560, "intermediate_size": 7040,
                                "num_hidden_layers": 24, "num_attention_heads": 20, "num_key_value_heads": 20,
                                "head_dim": 128, "max_position_embeddings": 4096, "rms_norm_eps": 1e-8,
                                "rope_theta": 100000.0, "pad_token_id": 3, "eos_token_id": 2, "bos_token_id": 1})
# CWM (CwmForCausalLM: Meta's Code World Model, cwm 32B): Llama's layer with Llama 3.1's RoPE (CwmConfig's: base 1e6,
# factor 16 over 8192 positions, when the config has no RoPE dict) and sliding_window (8192) on the layer_types'
# sliding layers, by default three of every four (layer 0 full, then every fourth); no attention biases
FAMILIES["cwm"] = Family("CwmForCausalLM", reads=("mlp_bias",), defaults={
    "vocab_size": 128256, "hidden_size": 6144, "intermediate_size": 21504, "num_hidden_layers": 64,
    "num_attention_heads": 48, "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5, "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "pad_token_id": None,
    "sliding_window": 8192})
_CWM_ROPE = {"rope_type": "llama3", "rope_theta": 1000000.0, "factor": 16.0, "original_max_position_embeddings": 8192,
             "low_freq_factor": 1.0, "high_freq_factor": 4.0}
_OWN_LLAMA3_ROPE = {"apertus": ("ApertusConfig", _APERTUS_ROPE), "cwm": ("CwmConfig", _CWM_ROPE)}  # (with no RoPE
# dict in the config: its config's Llama 3.1 RoPE, which ignores a top-level rope_theta)
_CWM_PATTERN = 4  # CwmConfig's and GraniteSWAConfig's layer_types by default: layer 0 full, then every fourth
# Ministral 8B (MinistralForCausalLM: Ministral-8B-Instruct-2410): Mistral's layer with its window on the layer_types'
# sliding layers (every layer by default)
FAMILIES["ministral"] = Family("MinistralForCausalLM", defaults=dict(FAMILIES["mistral"].defaults))
# GLM-4 of 2024 (GlmForCausalLM: glm-4-9b-hf, glm-4-9b-chat-hf, glm-edge): GLM-4's layer with Llama's two norms (not
# its four), the same biases, RoPE and fused gate / up projections
FAMILIES["glm"] = Family("GlmForCausalLM", fused_projections=("gate_up_proj",), rope_interleaved=True,
                         partial_rotary_factor=0.5, reads=("attention_bias",), defaults=dict(FAMILIES["glm4"].defaults))
_GLMS = ("glm", "glm4", "glm4_moe")  # (GLM's attention_bias: q, k and v only)
# InternLM3 (model_type internlm3: internlm3-8b-instruct; transformers runs it as LlamaForCausalLM): Llama's layer
# under InternLM3Config's defaults, its biases by the keys qkv_bias (q, k, v, o: Llama's attention_bias) and bias (the
# MLP's), which must agree (InternLM3Config refuses them apart); its checkpoints' dynamic NTK RoPE (factor 6)
FAMILIES["internlm3"] = Family("LlamaForCausalLM", reads=("attention_bias", "mlp_bias"), defaults={
    "vocab_size": 128512, "hidden_size": 4096, "intermediate_size": 10240, "num_hidden_layers": 48,
    "num_attention_heads": 32, "num_key_value_heads": 2, "head_dim": 128, "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-5, "pad_token_id": 2, "bos_token_id": 1, "eos_token_id": 2})
_BIAS_ALIASES = {"qkv_bias": "attention_bias", "bias": "mlp_bias"}  # (InternLM3Config.attribute_map)
# the remote code their checkpoints name (auto_map), which transformers runs as its own (LlamaForCausalLM)
_OWN_CODE = {t: {f"configuration_{t}.{n}Config", f"modeling_{t}.{n}Model", f"modeling_{t}.{n}ForCausalLM",
                 *(f"modeling_{t}.{n}For{task}" for task in ("SequenceClassification", "TokenClassification",
                                                            "QuestionAnswering"))}
             for t, n in (("internlm3", "InternLM3"), ("iquestcoder", "IQuestCoder"), ("afmoe", "Afmoe"),
                          ("falcon", "Falcon"), ("mpt", "MPT"))}
# IQuest-Coder-V1 (model_type iquestcoder: IQuest-Coder-V1-40B Base / Instruct; transformers runs it as
# LlamaForCausalLM): Llama's layer with IQuestCoderConfig's defaults (its 40B shape, head_dim 128); its original code's
# clip_qkv and sliding window are refused, as transformers refuses them (no released checkpoint sets them)
FAMILIES["iquestcoder"] = Family("LlamaForCausalLM", reads=("attention_bias", "mlp_bias"), defaults={
    "vocab_size": 76800, "hidden_size": 5120, "intermediate_size": 27648, "num_hidden_layers": 80,
    "num_attention_heads": 40, "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5, "bos_token_id": 1, "eos_token_id": 2})
# DeepSeek-V2 / V3 (DeepseekV2ForCausalLM: DeepSeek-V2, V2-Lite, V2.5, DeepSeek-Coder-V2; DeepseekV3ForCausalLM:
# DeepSeek-V3, R1, Moonlight): multi-head latent attention (MLA: each token's keys and values are one latent of
# kv_lora_rank, normed, and one RoPE'd key of qk_rope_head_dim shared by every head; the queries from a low-rank
# projection where q_lora_rank is set) and, from layer first_k_dense_replace on, a mixture of experts with shared
# experts (V2: the softmax's top k, greedy or within the top groups, times routed_scaling_factor; V3: sigmoid scores
# with a correction bias choosing the experts within the top groups (each group's best two summed), renormalised where
# norm_topk_prob, times routed_scaling_factor). RoPE on adjacent pairs of dims (V2's complex product in float32; V3's by
# rope_interleave, in the dtype); the attention's scale times YaRN's mscale_all_dim factor squared.
_DEEPSEEK_DEFAULTS = {"vocab_size": 102400, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
                      "num_attention_heads": 32, "max_position_embeddings": 2048, "rms_norm_eps": 1e-6,
                      "bos_token_id": 1, "eos_token_id": 2, "kv_lora_rank": 512, "q_lora_rank": 1536,
                      "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "n_routed_experts": 64,
                      "n_shared_experts": 2, "moe_intermediate_size": 1407, "routed_scaling_factor": 1.0,
                      "first_k_dense_replace": 0, "topk_method": "greedy", "n_group": None, "topk_group": None,
                      "norm_topk_prob": False}
FAMILIES["deepseek_v2"] = Family("DeepseekV2ForCausalLM", rope_float32="tables", defaults=_DEEPSEEK_DEFAULTS)
FAMILIES["deepseek_v3"] = Family("DeepseekV3ForCausalLM", defaults={  # (no topk_method: V3 computes noaux_tc)
    **{k: v for k, v in _DEEPSEEK_DEFAULTS.items() if k != "topk_method"},
    "vocab_size": 129280, "hidden_size": 7168, "intermediate_size": 18432,
    "moe_intermediate_size": 2048, "num_hidden_layers": 61, "num_attention_heads": 128, "n_shared_experts": 1,
    "n_routed_experts": 256, "routed_scaling_factor": 2.5, "n_group": 8, "topk_group": 4, "num_experts_per_tok": 8,
    "first_k_dense_replace": 3, "norm_topk_prob": True, "max_position_embeddings": 4096, "bos_token_id": 0,
    "eos_token_id": 1, "rope_interleave": True})
# DeepSeek-V3.2 (DeepseekV32ForCausalLM: V3.2-Exp, V3.2, V3.2-Speciale): V3's layer with DeepSeek's sparse attention
# (DSA, LlamaConfig.dsa): each layer's lightning indexer scores every key a query sees, and the query attends to the
# index_topk best only. transformers' V3.2 always pairs adjacent RoPE dims in the latent attention (no rope_interleave
# switch); the dense layers are mlp_layer_types' (by default first_k_dense_replace's)
FAMILIES["deepseek_v32"] = Family("DeepseekV32ForCausalLM", defaults={
    **FAMILIES["deepseek_v3"].defaults, "max_position_embeddings": 163840, "index_topk": 2048, "index_head_dim": 128,
    "index_n_heads": 64})
# GLM-5 (GlmMoeDsaForCausalLM): DeepSeek-V3.2's layer (the latent attention, DSA, V3's router) under GLM's name, its
# indexer's RoPE on adjacent pairs of dims; layers whose indexer_types are "shared" attend to the keys the previous
# "full" layer chose (no indexer of their own)
FAMILIES["glm_moe_dsa"] = Family("GlmMoeDsaForCausalLM", defaults={
    **FAMILIES["deepseek_v32"].defaults, "vocab_size": 154880, "hidden_size": 6144, "intermediate_size": 12288,
    "moe_intermediate_size": 2048, "num_hidden_layers": 78, "num_attention_heads": 64, "n_routed_experts": 256,
    "kv_lora_rank": 512, "q_lora_rank": 2048, "qk_rope_head_dim": 64, "v_head_dim": 256, "qk_nope_head_dim": 192,
    "n_group": 1, "topk_group": 1, "max_position_embeddings": 202752, "rms_norm_eps": 1e-5, "index_n_heads": 32})
# GLM-4.5 / 4.6 / 4.7 (Glm4MoeForCausalLM: GLM-4.5, GLM-4.5-Air, GLM-4.6, GLM-4.7): Llama's attention with q/k/v biases
# by attention_bias (none on o), RoPE on the first partial_rotary_factor (0.5) of each head (half-split pairs), a
# per-head q/k RMSNorm where use_qk_norm; from first_k_dense_replace on, DeepSeek-V3's mixture (the sigmoid router with
# its correction bias, groups, renormalisation, routed_scaling_factor, shared experts).
FAMILIES["glm4_moe"] = Family("Glm4MoeForCausalLM", partial_rotary_factor=0.5, reads=("attention_bias",), defaults={
    "vocab_size": 151552, "hidden_size": 4096, "intermediate_size": 10944, "num_hidden_layers": 46,
    "num_attention_heads": 96, "num_key_value_heads": 8, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
    "moe_intermediate_size": 1408, "num_experts_per_tok": 8, "n_shared_experts": 1, "n_routed_experts": 128,
    "routed_scaling_factor": 1.0, "n_group": 1, "topk_group": 1, "first_k_dense_replace": 1, "norm_topk_prob": True,
    "use_qk_norm": False})
# GLM-4.7-Flash (Glm4MoeLiteForCausalLM): DeepSeek-V3's layer (latent attention, its router, shared experts) under
# GLM's name, its dense and sparse layers listed by mlp_layer_types (by default the first dense)
FAMILIES["glm4_moe_lite"] = Family("Glm4MoeLiteForCausalLM", defaults={
    **{k: v for k, v in FAMILIES["deepseek_v3"].defaults.items() if k != "first_k_dense_replace"},
    "vocab_size": 154880, "hidden_size": 2048, "intermediate_size": 10240, "moe_intermediate_size": 1536,
    "num_hidden_layers": 47, "num_attention_heads": 20, "n_shared_experts": 1, "n_routed_experts": 64,
    "routed_scaling_factor": 1.8, "kv_lora_rank": 512, "q_lora_rank": 768, "qk_rope_head_dim": 64, "v_head_dim": 256,
    "qk_nope_head_dim": 192, "n_group": 1, "topk_group": 1, "num_experts_per_tok": 4, "norm_topk_prob": True,
    "max_position_embeddings": 202752, "rms_norm_eps": 1e-5, "bos_token_id": 0, "eos_token_id": 1,
    "rope_interleave": True})
# dots.llm1 (Dots1ForCausalLM: dots.llm1.base / .inst): Qwen3's attention (a per-head q/k RMSNorm; Qwen's sliding
# windows from max_window_layers on, without use_sliding_window) with DeepSeek-V3's mixture from
# first_k_dense_replace on
FAMILIES["dots1"] = Family("Dots1ForCausalLM", qk_norm=True, reads=("attention_bias",), defaults={
    "vocab_size": 152064, "hidden_size": 4608, "intermediate_size": 10944, "num_hidden_layers": 62,
    "num_attention_heads": 32, "max_position_embeddings": 2048, "rms_norm_eps": 1e-6, "moe_intermediate_size": 1408,
    "n_shared_experts": None, "n_group": 1, "topk_group": 1, "first_k_dense_replace": 0, "norm_topk_prob": False,
    "routed_scaling_factor": 1.0, "sliding_window": 4096, "max_window_layers": 62})
# A.X-K1 (AXK1ForCausalLM: SK Telecom's A.X-K1): DeepSeek-V3's layer (the latent attention, always with q_lora_rank;
# its router, shared experts) with an RMSNorm on each sparse MLP's output (mlp.post_mlp_layernorm; its checkpoints'
# post_mlp_layernorm), its dense and sparse layers by mlp_layer_types (by default first_k_dense_replace's, 1, and
# moe_layer_freq's, 1)
FAMILIES["axk1"] = Family("AXK1ForCausalLM", defaults={
    **{k: v for k, v in FAMILIES["deepseek_v3"].defaults.items() if k != "first_k_dense_replace"},
    "vocab_size": 163840, "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
    "num_hidden_layers": 61, "num_attention_heads": 64, "n_shared_experts": 1, "n_routed_experts": 192,
    "routed_scaling_factor": 2.5, "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64, "v_head_dim": 128,
    "qk_nope_head_dim": 128, "n_group": 8, "topk_group": 4, "num_experts_per_tok": 8, "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6, "bos_token_id": 163691, "eos_token_id": 163691, "norm_topk_prob": True,
    "rope_interleave": True})
# Kimi Linear (KimiLinearForCausalLM: moonshotai's Kimi-Linear-48B-A3B): DeepSeek-V3's latent attention without RoPE
# (its RoPE'd key dims kept, unrotated) on the full_attention layers of layer_types, Kimi Delta Attention on the others
# (LlamaConfig.delta with a decay per key channel: triforce.models.llama.KimiDeltaAttention), V3's mixtures on the
# "sparse" layers of mlp_layer_types (by default all but the first); its config's names (_KIMI_NAMES) read as
# DeepSeek's, its checkpoints' linear_attn_config too
FAMILIES["kimi_linear"] = Family("KimiLinearForCausalLM", defaults={
    **{k: v for k, v in FAMILIES["deepseek_v3"].defaults.items() if k not in ("first_k_dense_replace",
                                                                              "rope_interleave")},
    "vocab_size": 163840, "hidden_size": 2304, "intermediate_size": 9216, "moe_intermediate_size": 1024,
    "num_hidden_layers": 27, "num_attention_heads": 32, "n_shared_experts": 1, "n_routed_experts": 256,
    "routed_scaling_factor": 2.446, "kv_lora_rank": 512, "q_lora_rank": None, "qk_rope_head_dim": 64,
    "v_head_dim": 128, "qk_nope_head_dim": 128, "n_group": 1, "topk_group": 1, "num_experts_per_tok": 8,
    "norm_topk_prob": True, "max_position_embeddings": 1048576, "rms_norm_eps": 1e-5, "pad_token_id": 163839,
    "bos_token_id": 163584, "eos_token_id": 163586, "tie_word_embeddings": False, "linear_head_dim": 128,
    "linear_num_heads": 32, "linear_conv_kernel_dim": 4})
# KimiLinearConfig's names of DeepSeek's keys (its attribute_map's)
_KIMI_NAMES = {"num_shared_experts": "n_shared_experts", "num_expert_group": "n_group",
               "num_experts_per_token": "num_experts_per_tok", "moe_renormalize": "norm_topk_prob",
               "model_max_length": "max_position_embeddings", "num_experts": "n_routed_experts"}
# the latent attention's families (LlamaConfig.mla)
_DEEPSEEKS = ("deepseek_v2", "deepseek_v3", "glm4_moe_lite", "deepseek_v32", "glm_moe_dsa", "axk1", "kimi_linear")
# Youtu (YoutuForCausalLM: Tencent's Youtu-LLM 2B): DeepSeek-V3's multi-head latent attention (RoPE on adjacent pairs
# by rope_interleave, default true) with Llama's dense MLP on every layer, a tied head
FAMILIES["youtu"] = Family("YoutuForCausalLM", defaults={
    "vocab_size": 128256, "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 32,
    "num_attention_heads": 16, "max_position_embeddings": 131072, "rms_norm_eps": 1e-6, "bos_token_id": 128000,
    "eos_token_id": 128001, "tie_word_embeddings": True, "kv_lora_rank": 512, "q_lora_rank": 1536,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "rope_interleave": True})
# MiniCPM3 (MiniCPM3ForCausalLM: openbmb's MiniCPM3-4B): DeepSeek-V2's multi-head latent attention with half-split RoPE
# pairs, Llama's MLP, and three numbers: the embeddings times scale_emb (rounded to the dtype first), each block's
# output times scale_depth / sqrt(num_hidden_layers) before its residual add, the final hidden states divided by
# hidden_size / dim_model_base before the head; a tied head
FAMILIES["minicpm3"] = Family("MiniCPM3ForCausalLM", reads=("mlp_bias",), defaults={
    "vocab_size": 73448, "hidden_size": 2560, "intermediate_size": 6400, "num_hidden_layers": 62,
    "num_attention_heads": 40, "max_position_embeddings": 32768, "rms_norm_eps": 1e-5, "tie_word_embeddings": True,
    "kv_lora_rank": 256, "q_lora_rank": 768, "qk_nope_head_dim": 64, "qk_rope_head_dim": 32, "scale_emb": 12,
    "scale_depth": 1.4, "dim_model_base": 256})
_MLAS = (*_DEEPSEEKS, "youtu", "minicpm3")  # the families of multi-head latent attention (LlamaConfig.mla)
# DeepSeek-V3's router (sigmoid, correction bias, groups)
_V3_ROUTERS = ("deepseek_v3", "glm4_moe", "glm4_moe_lite", "dots1", "deepseek_v32", "glm_moe_dsa", "exaone_moe",
               "axk1", "mimo_v2_flash", "kimi_linear")
_DSAS = ("deepseek_v32", "glm_moe_dsa")  # DeepSeek's sparse attention (LlamaConfig.dsa)
# the families with DeepSeek's mixtures (LlamaConfig._deepseek_experts)
_GROUPED = (*_DEEPSEEKS, "glm4_moe", "dots1", "exaone_moe", "mimo_v2_flash")
_MLA_DIMS = ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
_DEEPSEEK_INTS = (*_MLA_DIMS, "n_routed_experts")  # (num_experts_per_tok, moe_intermediate_size: as other mixtures')
_DEEPSEEK_METHODS = {"deepseek_v2": ("greedy", "group_limited_greedy"), "deepseek_v3": ("noaux_tc",),
                     "dots1": ("noaux_tc",),
                     "glm4_moe_lite": ("noaux_tc",), "deepseek_v32": ("noaux_tc",), "glm_moe_dsa": ("noaux_tc",),
                     "axk1": ("noaux_tc",), "kimi_linear": ("noaux_tc",)}
_DEEPSEEK_AUTO_MAP = {f"{kind}.Deepseek{v}{cls}" for v in ("V2", "V3", "V32") for kind, cls in (
    ("configuration_deepseek", "Config"), ("modeling_deepseek", "Model"), ("modeling_deepseek", "ForCausalLM"))}
# AFMoE (AfmoeForCausalLM: Arcee's Trinity Nano / Mini / Large): Gemma 3's four norms around the blocks (named
# post_attention_layernorm, pre_mlp_layernorm, post_mlp_layernorm), RMSNorm's weight in float32, per-head q / k norms
# before RoPE, the attention's output gated by the sigmoid of its own projection of the layer's input, its
# layer_types' sliding layers (every global_attn_every_n_layers-th full) slide and take RoPE, the full ones none
# (NoPE); from num_dense_layers on a mixture: sigmoid scores, the top k chosen by them plus a correction bias
# (mlp.expert_bias), renormalised (+1e-20) and times route_scale, num_shared_experts shared experts as one MLP; with
# mup_enabled the embeddings times sqrt(hidden_size).
FAMILIES["afmoe"] = Family("AfmoeForCausalLM", qk_norm=True, sandwich_norms=True, float32_norm=True,
                           attn_output_gate=True, reads=("attention_bias",), defaults={
                               "vocab_size": 200192, "hidden_size": 2048, "intermediate_size": 6144,
                               "num_hidden_layers": 32, "num_attention_heads": 16, "head_dim": 128,
                               "max_position_embeddings": 16384, "rms_norm_eps": 1e-5, "bos_token_id": None,
                               "eos_token_id": None, "pad_token_id": None, "moe_intermediate_size": 1408,
                               "num_dense_layers": 1, "num_experts": 64, "num_experts_per_tok": 6,
                               "num_shared_experts": 2, "route_scale": 1.0, "global_attn_every_n_layers": 4,
                               "sliding_window": 1024, "mup_enabled": False})
# PhiMoE (PhimoeForCausalLM: Phi-3.5-MoE-instruct, Phi-mini-MoE): Mixtral's mixture on torch's LayerNorm with a bias
# (eps rms_norm_eps), biases on q, k, v, o by attention_bias, on the head by lm_head_bias, routed by SparseMixer (its
# inference form: the best expert, then the best of the rest, each weighted by the softmax of the logits within
# 2 * router_jitter_noise of it, relatively, in the model's dtype), LongRoPE with its short_mscale / long_mscale as the
# attention factor (equal: other values raise), a window on every layer where sliding_window is set (Mixtral's)
FAMILIES["phimoe"] = Family("PhimoeForCausalLM", torch_layer_norm="plain", reads=("attention_bias",), defaults={
    "vocab_size": 32064, "hidden_size": 4096, "intermediate_size": 6400, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
    "rope_theta": 1000000.0, "bos_token_id": 1, "eos_token_id": 2, "num_local_experts": 16, "num_experts_per_tok": 2,
    "router_jitter_noise": 0.01})
# DBRX (DbrxForCausalLM: dbrx-base, dbrx-instruct): its own config names (d_model, n_heads, n_layers, max_seq_len; an
# attn_config with kv_n_heads, clip_qkv and its RoPE base; an ffn_config with the mixture's), torch's LayerNorm
# without a bias (eps 1e-5), q, k and v as one Wqkv (rows [q; k; v]) clamped by clip_qkv, every layer a mixture: the
# softmax's top moe_top_k of moe_num_experts, normalised by their moe_normalize_expert_weights-norm (1: their sum;
# null: not) in the model's dtype, SwiGLU experts (w1 gate, v1 up, w2 down) stacked in its checkpoints
FAMILIES["dbrx"] = Family("DbrxForCausalLM", torch_layer_norm="nobias", defaults={
    "vocab_size": 32000, "hidden_size": 2048, "intermediate_size": 3584, "num_hidden_layers": 24,
    "num_attention_heads": 16, "num_key_value_heads": 1, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5,
    "bos_token_id": None, "eos_token_id": None, "num_local_experts": 4, "num_experts_per_tok": 1})
_DBRX_TOP = {"d_model": "hidden_size", "n_heads": "num_attention_heads", "n_layers": "num_hidden_layers",
             "max_seq_len": "max_position_embeddings"}
_MOE_TYPES = ("mixtral", "phimoe", "dbrx", "qwen3_moe", "granitemoe", "qwen2_moe", "qwen3_next", "qwen3_5_moe_text",
              "olmoe", "flex_olmo", "granitemoeshared", "granitemoe_swa", "gpt_oss", "jetmoe")
_ANY_MOE = (*_MOE_TYPES, *_GROUPED, "ernie4_5_moe", "minimax_m2", "hunyuan_v1_moe", "afmoe", "granitemoehybrid",
            "kolibri1", "flint", "hy_v3", "cohere2_moe", "mellum", "laguna", "llama4_text", "aria_text", "lfm2_moe")
_QWEN_MOES = ("qwen3_moe", "qwen2_moe", "qwen3_next")
_NORM_TOPK = (*_QWEN_MOES, "olmoe", "flex_olmo")  # the families whose norm_topk_prob chooses renormalisation
_EXPERT_COUNT_KEYS = ("num_local_experts", "num_experts")  # (transformers reads one as the other)


@dataclass(frozen=True)
class Experts:
    """A mixture-of-experts family's sparse MLP (``LlamaConfig.experts``): ``count`` experts of width
    ``intermediate_size``, ``top_k`` chosen per token, their router probabilities renormalised to sum 1 where
    ``renormalize``, the weights kept in float32 (Mixtral: each expert's output times its weight in float32, rounded
    once) or rounded to the model's dtype first (Qwen3-MoE); ``layers``: per layer, whether it is sparse;
    ``softmax_of_top_k``: the weights are the softmax of the top k logits instead (GraniteMoE: the renormalised
    probabilities, computed another way); ``shared_intermediate_size``: a shared expert of that width, every token's
    (0: none), times the sigmoid of its own gate where ``shared_gated`` (Qwen2-MoE), else added as it is
    (GraniteMoeShared); ``biases``: the router and each expert's projections have biases (GPT-OSS)."""

    count: int
    top_k: int
    intermediate_size: int
    renormalize: bool
    float32_weights: bool
    layers: tuple
    softmax_of_top_k: bool = False
    shared_intermediate_size: int = 0
    shared_gated: bool = False
    biases: bool = False
    # DeepSeek's routers: the chosen weights times `scale` (routed_scaling_factor, in float32); "sigmoid" scores (V3;
    # else the softmax's), a correction bias (the router's e_score_correction_bias) added to them for the choice
    # only; `groups` (n_group, topk_group): the experts chosen within the topk_group groups of the best scores (V2's
    # group_limited_greedy: each group's best; V3: each group's best two summed, `group_top2`); `renormalize_eps`:
    # added to the renormalising sum (V3's 1e-20); `grouped_router`: the router is one of these
    scale: float = 1.0
    scoring: str = "softmax"
    correction_bias: bool = False
    groups: tuple | None = None
    group_top2: bool = False
    renormalize_eps: float = 0.0
    grouped_router: bool = False  # DeepSeek's routers (V2's, V3's: GLM-4.5's too), computed as transformers does
    float32_router: bool = False  # the router's weight kept in float32 whatever the model's dtype (ERNIE 4.5's)
    # PhiMoE: SparseMixer's choice of two experts (scoring "sparsemixer"), its jitter (router_jitter_noise)
    jitter_eps: float = 0.0
    logits_in_dtype: bool = False  # the router's logits in the model's dtype, then float32 (MiniMax-M2's)
    bias_on_logits: bool = False  # the correction bias added to the logits for the choice, not the scores (Kolibri-1)
    shared_average: bool = False  # the routed and shared outputs averaged, not summed (Cohere 2 MoE's 'average')
    logit_softcap: float = 0.0  # the router's logits as tanh(l / c) * c where c > 0 (Laguna's)
    # Llama 4: each chosen expert fed the token times its weight (in the dtype), its output added unweighted; the
    # weights (scoring "top_k_sigmoid") the sigmoid of the top k router logits (computed in the dtype), in the dtype
    scaled_inputs: bool = False
    output_bias: bool = False  # JetMoE: a bias (mlp.bias) added to the mixture's output
    gated: bool = True  # the experts (and the shared one) gated MLPs; Nemotron 3's: ungated, down(act(up(x)))
    # Nemotron 3 Super's latent mixture: the routed experts work on a projection of the token to this width
    # (fc1_latent_proj), their sum projected back (fc2_latent_proj); the router and the shared expert see the token
    latent_size: int | None = None
    # LFM2-MoE: DeepSeek's router path with the sigmoid, the renormalisation and the scale in the model's dtype (the
    # renormalising sum in float32, rounded once, as torch sums a 16-bit tensor)
    scores_in_dtype: bool = False


@dataclass(frozen=True)
class Mamba:
    """Mamba-2 layers (``LlamaConfig.mamba``: Granite 4.0's), as transformers' GraniteMoeHybridMambaLayer computes them:
    ``in_proj`` of the layer's input into a gate ``z`` (``inner``), ``xBC`` (``conv_dim = inner + 2 groups state``)
    and ``dt`` (``heads``); a causal depthwise convolution of ``xBC`` over ``kernel`` tokens (biased where
    ``conv_bias``), SiLU; per head h its ``head_dim`` channels of x, and per group B and C of ``state``; the state
    ``S_h`` (``head_dim x state``) ``S_h * exp(dt_h A_h) + dt_h x_h B^T`` with ``dt_h = softplus(dt + dt_bias)`` and
    ``A_h = -exp(A_log_h)``, the output ``S_h C + D_h x_h``; a grouped RMSNorm of it times ``silu(z)``; ``out_proj``
    (biased where ``proj_bias``, as ``in_proj``). ``layers``: per layer, whether it is one."""

    heads: int
    head_dim: int
    groups: int
    state: int
    kernel: int
    inner: int
    conv_bias: bool
    proj_bias: bool
    layers: tuple
    dt_min: float = 0.0  # dt clamped below at it (Nemotron-H's time_step_min, as transformers' chunked form clamps)
    # the output's gated norm: "gate_first" (the grouped RMSNorm of y silu(z), Mamba-2's), "norm_first" (the norm of
    # y, then times silu(z): Falcon-H1's mamba_norm_before_gate) or "none" (y silu(z), no norm: Falcon-H1's
    # mamba_rms_norm false)
    norm: str = "gate_first"
    out_bias: bool | None = None  # out_proj's bias where it is not in_proj's (Falcon-H1's projectors_bias)

    @property
    def conv_dim(self) -> int:
        return self.inner + 2 * self.groups * self.state

    @property
    def state_shape(self) -> tuple:
        """A row's state of one layer: ``(heads, head_dim, state)``, float32."""
        return (self.heads, self.head_dim, self.state)

    @property
    def ring_width(self) -> int:
        """The floats a cache keeps per token to replay the state: its x, B, dt and decay."""
        return self.inner + self.groups * self.state + 2 * self.heads


@dataclass(frozen=True)
class DeltaNet:
    """Gated DeltaNet layers (``LlamaConfig.delta``: Qwen3-Next's and Qwen3.5's ``"linear_attention"`` layers), as
    transformers' Qwen3NextGatedDeltaNet computes them: projections of the layer's input into ``qkv`` (``k_heads``
    query and key heads of ``k_dim``, ``v_heads`` value heads of ``v_dim``), the gate ``z`` (``v_heads x v_dim``),
    ``b`` and ``a`` (``v_heads``); a causal depthwise convolution of ``qkv`` over ``kernel`` tokens (no bias), SiLU;
    q and k L2-normalised (float32), q times ``k_dim ** -0.5``; per value head h (its key head ``h // (v_heads /
    k_heads)``) the state ``S_h`` (``k_dim x v_dim``, float32) decayed by ``exp(g)`` with ``g = -exp(A_log) *
    softplus(a + dt_bias)``, then moved by the delta rule ``S += k (beta (v - S^T k))^T`` with ``beta =
    sigmoid(b)``, the output ``S^T q``; an RMSNorm per head times ``silu(z)``; ``out_proj``. ``layers``: per layer,
    whether it is one."""

    k_heads: int
    v_heads: int
    k_dim: int
    v_dim: int
    kernel: int
    layers: tuple
    beta_scale: float = 1.0  # beta times it (OLMo Hybrid's linear_allow_neg_eigval: 2, beta in (0, 2))
    norm_eps: float | None = None  # its output norm's eps (OLMo Hybrid's 1e-5); None: rms_norm_eps
    channel_decay: bool = False  # a decay per key channel (each row of S its own): Kimi's KDA; else one per head

    @property
    def decay_width(self) -> int:
        """A token's decays of one layer: one per value head, or one per value head and key channel (KDA)."""
        return self.v_heads * (self.k_dim if self.channel_decay else 1)

    @property
    def conv_dim(self) -> int:
        return 2 * self.k_heads * self.k_dim + self.v_heads * self.v_dim

    @property
    def state_shape(self) -> tuple:
        """A row's state of one layer: ``(v_heads, k_dim, v_dim)``, float32."""
        return (self.v_heads, self.k_dim, self.v_dim)

    @property
    def ring_width(self) -> int:
        """The floats a cache keeps per token to replay the state: its key, value, beta and decay."""
        return self.k_heads * self.k_dim + self.v_heads * self.v_dim + self.v_heads + self.decay_width


@dataclass(frozen=True)
class Mamba1:
    """Mamba(-1) layers (``LlamaConfig.mamba1``: MambaForCausalLM's), as transformers' MambaMixer computes them:
    ``in_proj`` into x and the gate z (``inner`` each); a causal depthwise convolution of x (``kernel`` taps, biased
    where ``conv_bias``), SiLU; ``x_proj`` of it into the time step's low rank (``dt_rank``), B and C (``state`` each);
    ``dt = softplus(dt_proj(dt_low))`` (its bias added in float32); per channel c its state ``h_c`` (``state`` floats,
    float32) ``h_c * exp(dt_c A_c) + dt_c B x_c`` with ``A = -exp(A_log)`` (``[inner, state]``), the output ``h_c . C +
    D_c x_c``, times ``silu(z)``; ``out_proj`` (biased where ``proj_bias``). ``layers``: per layer, whether it is
    one."""

    inner: int
    state: int
    kernel: int
    dt_rank: int
    conv_bias: bool
    proj_bias: bool
    layers: tuple
    bcdt_eps: float | None = None  # Falcon Mamba's: weightless RMSNorms of this eps on dt's low rank, B and C
    bcdt_weights: bool = False  # Jamba's: those norms with weights of their own (dt_layernorm, b_ / c_layernorm)

    @property
    def conv_dim(self) -> int:
        return self.inner

    @property
    def state_shape(self) -> tuple:
        """A row's state of one layer: ``(inner, state)``, float32."""
        return (self.inner, self.state)

    @property
    def ring_width(self) -> int:
        """The floats a cache keeps per token to replay the state: its x, dt and B."""
        return 2 * self.inner + self.state


@dataclass(frozen=True)
class MLA:
    """DeepSeek's multi-head latent attention (``LlamaConfig.mla``), as the model computes it, absorbed: each token's
    keys and values are one latent ``c`` of ``kv_lora_rank`` (``kv_a_layernorm`` of ``kv_a_proj_with_mqa``'s first
    rows) and one key ``k_pe`` of ``qk_rope_head_dim`` (its other rows, RoPE'd) shared by every head; a head's key is
    ``[W_UK c, k_pe]`` and its value ``W_UV c`` (``kv_b_proj``'s rows), so its score is ``(W_UK^T q_nope) . c + q_pe .
    k_pe`` and its output ``W_UV`` times the weighted sum of the ``c``. The caches hold ``[k_pe, c]`` once per token:
    one KV head (``num_key_value_heads`` 1) of ``head_dim = kv_lora_rank + qk_rope_head_dim`` (576 for DeepSeek's), the
    values the keys themselves; the queries ``[q_pe, W_UK^T q_nope]``. ``q_lora_rank``: the queries' low rank (None:
    one projection); ``rope_interleaved``: the checkpoint's RoPE pairs adjacent dims (reordered on loading)."""

    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    rope_interleaved: bool

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    def slots(self) -> tuple:
        """``(rope, latent)``: int64 index tensors of the RoPE'd dims and of the latent's dims in a cached key of
        ``head_dim = kv_lora_rank + qk_rope_head_dim``: the RoPE pairs (half-split, as the model's RoPE turns
        dims ``j`` and ``j + head_dim / 2``) at the first ``qk_rope_head_dim / 2`` dims of each half, the latent's
        halves after them."""
        import torch  # (config.py stays importable without torch)

        r, R = self.qk_rope_head_dim, self.kv_lora_rank
        half = (r + R) // 2
        cpu = torch.device("cpu")  # (whatever the default device)
        rope = torch.cat([torch.arange(r // 2, device=cpu), torch.arange(half, half + r // 2, device=cpu)])
        latent = torch.cat([torch.arange(r // 2, half, device=cpu), torch.arange(half + r // 2, 2 * half, device=cpu)])
        return rope, latent


@dataclass(frozen=True)
class DSA:
    """DeepSeek's sparse attention (``LlamaConfig.dsa``: DeepSeek-V3.2), on top of :class:`MLA`: each layer's lightning
    indexer (``self_attn.indexer``) gives every key ``s`` a query ``t`` sees the score ``sum_h w_h(x_t) relu(q_h(t) .
    k(s) / sqrt(head_dim))`` over its ``n_heads`` heads (``q_h``: ``wq_b`` of the queries' low-rank latent, ``k``: the
    LayerNorm ``k_norm`` of ``wk(x)``, both RoPE'd on their first ``qk_rope_head_dim`` dims, half-split pairs;
    ``w``: ``weights_proj(x)``, made float32, over ``sqrt(n_heads)``), and the query attends to its ``topk`` best keys
    only (every key it sees while it sees at most ``topk``). The caches hold each token's indexer key ``k`` beside
    its latent (``FullCache.index_k``)."""

    n_heads: int
    head_dim: int
    topk: int
    # GLM-5: the indexer's RoPE pairs adjacent dims in its checkpoints (reordered on loading, as MLA's); per layer,
    # whether it attends to the keys the previous full layer chose (its indexer_types' "shared": no indexer)
    rope_interleaved: bool = False
    shared: tuple = ()


_MODEL_TYPES = ", ".join(repr(t) for t in FAMILIES)
# Image + text checkpoints whose text model is one of the families: the wrapper's model_type -> (its
# text_config's model_type (or the ones it may be, the first by default; "*" among them: any family's), the
# wrapper's own keys: the image side's, which a text-only forward never reads, and how its head is tied: a bool,
# the wrapper's tie_word_embeddings default (transformers 5 ties the head by the wrapper's key; a text_config
# that says otherwise raises); None: a wrapper without the key takes its text_config's; "either": tied where
# either says so; ("wrapper", default): the wrapper's key alone, the text_config's not read; "text": the
# text_config's alone). Its language model
# is what loads (LlamaConfig.from_dict; loading.py renames its weights).
# LLaVA's image side's keys (transformers' LlavaConfig; ignore_index and vocab_size: its 4.3x configs', not read)
_LLAVA_KEYS = ("image_token_index", "image_seq_length", "projector_hidden_act", "vision_feature_select_strategy",
               "vision_feature_layer", "multimodal_projector_bias", "ignore_index", "vocab_size")
WRAPPERS = {
    "gemma3": ("gemma3_text", frozenset({  # Gemma3ForConditionalGeneration: gemma-3-4b / 12b / 27b
        "vision_config", "mm_tokens_per_image", "boi_token_index", "eoi_token_index", "image_token_index",
        "boi_token_id", "eoi_token_id", "image_token_id", "initializer_range"}), True),
    # Mistral3ForConditionalGeneration: Mistral Small 3.1 / 3.2 (24B). Their checkpoints hold an untied head
    # (language_model.lm_head) and say so only in text_config (MistralConfig's default); transformers 4 followed
    # it, transformers 5 (Mistral3Config's default True) ties the head and drops those weights. The weights are
    # the model, so a wrapper without the key (as transformers 4 wrote it) takes its text_config's; one with the
    # key (as transformers 5 writes it) decides, as transformers 5 has it.
    "mistral3": (("mistral", "ministral3"), frozenset({
        "vision_config", "image_token_index", "image_token_id", "projector_hidden_act", "vision_feature_layer",
        "multimodal_projector_bias", "spatial_merge_size"}), None),
    # Moonshot's image + text models, DeepSeek-V3's language model under language_model.*: Kimi K2.5
    # (KimiK25ForConditionalGeneration: Kimi K2's, text_config model_type kimi_k2; its vision tower and mm_projector
    # not read; Moonshot's config keys and transformers' Kimi_K25Config's) and Kimi-VL
    # (KimiVLForConditionalGeneration: Kimi-VL-A3B, a Moonlight-shaped deepseek_v3). The head: as Mistral 3's
    # (transformers' Kimi_K25Config defaults to tied; the checkpoints hold their own, untied in text_config)
    **{kind: (text, frozenset({"vision_config", "ignore_index", "media_placeholder_token_id", "auto_map", *own}),
              None) for kind, text, own in (
        ("kimi_k25", ("kimi_k2", "deepseek_v3"), (
            "use_unified_vision_chunk", "video_placeholder", "projection_hidden_size", "projection_layer_norm_eps",
            "image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")),
        ("kimi_vl", ("deepseek_v3",), ()))},
    # Qwen's image + text models: Qwen2-VL and Qwen2.5-VL (Qwen2's language model), Qwen3-VL (Qwen3's) and
    # Qwen3-VL-MoE (Qwen3-MoE's), their text configs (_VL_TEXTS) read as those families'. Qwen2(.5)-VL's
    # checkpoints ship a flat config (the language model's keys at the top, as transformers 4 wrote it; transformers 5
    # moves them into text_config) and a head tied where either the wrapper's or the text_config's
    # tie_word_embeddings says so ("either": transformers 5's Qwen2VLConfig); Qwen3-VL's text_config may hold the key
    # too, which transformers 5 does not read (("wrapper", False): the wrapper's, default false, decides).
    **{kind: ((text,), frozenset({"vision_config", "image_token_id", "video_token_id", "vision_start_token_id",
                                  "vision_end_token_id", "vision_token_id"}), tie)
       for kind, text, tie in (("qwen2_vl", "qwen2_vl_text", "either"), ("qwen2_5_vl", "qwen2_5_vl_text", "either"),
                               ("qwen3_vl", "qwen3_vl_text", ("wrapper", False)),
                               ("qwen3_vl_moe", "qwen3_vl_moe_text", ("wrapper", False)),
                               # Qwen3.5 (Qwen3_5ForConditionalGeneration: every Qwen3.5 checkpoint), its language
                               # model's text_config qwen3_5_text
                               ("qwen3_5", "qwen3_5_text", ("wrapper", False)),
                               ("qwen3_5_moe", "qwen3_5_moe_text", ("wrapper", False)))},
    # GLM-4.1V-Thinking (glm4v: GLM-4's language model) and GLM-4.5V (glm4v_moe: GLM-4.5's), M-RoPE as Qwen2-VL's;
    # tied where either key says so (transformers 5's back-compatibility)
    **{kind: ((text,), frozenset({"vision_config", "image_token_id", "video_token_id", "image_start_token_id",
                                  "image_end_token_id", "video_start_token_id", "video_end_token_id"}), "either")
       for kind, text in (("glm4v", "glm4v_text"), ("glm4v_moe", "glm4v_moe_text"))},
    # Qwen's omni models (Qwen2.5-Omni 3B / 7B, Qwen3-Omni-30B-A3B): the language model of their thinker (its
    # text_config: _VL_TEXTS), tied by the thinker's key alone (default false); the whole model's config holds the
    # thinker's under thinker_config beside its talker's and speech decoder's (not read)
    **{kind: ((text,), frozenset({"audio_config", "vision_config", "audio_token_index", "image_token_index",
                                  "video_token_index", "audio_token_id", "image_token_id", "video_token_id",
                                  "position_id_per_seconds", "seconds_per_chunk", "audio_start_token_id",
                                  "audio_end_token_id", "user_token_id", "initializer_range", "vision_start_token_id",
                                  "vision_end_token_id"}), ("wrapper", False))
       for kind, text in (("qwen2_5_omni_thinker", "qwen2_5_omni_text"),
                          ("qwen3_omni_moe_thinker", "qwen3_omni_moe_text"))},
    **{kind: ((thinker,), frozenset({"talker_config", "token2wav_config", "code2wav_config", "enable_audio_output",
                                     "im_start_token_id", "im_end_token_id", "tts_pad_token_id", "tts_bos_token_id",
                                     "tts_eos_token_id", "system_token_id", "user_token_id", "assistant_token_id",
                                     "initializer_range"}), "text")
       for kind, thinker in (("qwen2_5_omni", "qwen2_5_omni_thinker"), ("qwen3_omni_moe", "qwen3_omni_moe_thinker"))},
    # LFM2-VL (Lfm2VlForConditionalGeneration: LiquidAI's LFM2-VL-450M / 1.6B / 3B, LFM2.5-VL): its LFM2 language model
    # (model.language_model.*), tied by the wrapper's key (default true); its SigLIP2 tower and projector not read
    "lfm2_vl": (("lfm2",), frozenset({
        "vision_config", "image_token_id", "image_token_index", "projector_hidden_act", "projector_hidden_size",
        "projector_bias", "projector_use_layernorm", "downsample_factor", "vision_feature_layer", "encoder_patch_size",
        "max_image_tokens", "min_image_tokens", "max_num_patches", "max_tiles", "min_tiles", "tile_size",
        "max_pixels_tolerance", "use_image_special_tokens", "use_thumbnail", "do_image_splitting",
        "initializer_range"}), ("wrapper", True)),
    # LFM3-VL (Lfm3VlForConditionalGeneration): its LFM3 language model (model.language_model.*), tied by the
    # wrapper's key (default true); its vision tower and projector not read
    "lfm3_vl": (("lfm3",), frozenset({
        "vision_config", "image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id",
        "projector_hidden_act", "projector_hidden_size", "projector_bias", "initializer_range"}), ("wrapper", True)),
    # Aria (AriaForConditionalGeneration: rhymes-ai's Aria): its language model (text_config aria_text), tied by the
    # wrapper's key alone (default false); its vision tower and projector not read
    "aria": (("aria_text",), frozenset({"vision_config", "vision_feature_layer", "projector_patch_to_query_dict",
                                        "max_value_projector_patch_to_query_dict",
                                        "image_token_index", "image_token_id", "initializer_range"}),
             ("wrapper", False)),
    # Llama 4 (Llama4ForConditionalGeneration: Scout, Maverick): its language model (text_config llama4_text), tied
    # by the wrapper's key alone (default false); its vision model and projector not read
    "llama4": (("llama4_text",), frozenset({"vision_config", "boi_token_index", "eoi_token_index", "image_token_index",
                                             "boi_token_id", "eoi_token_id", "image_token_id"}), ("wrapper", False)),
    # Llama 3.2 Vision (mllama: 11B / 90B): its language model without its cross-attention layers (loading.py
    # renumbers the others and drops the 8 image tokens' embedding rows; text_config's tie_word_embeddings)
    "mllama": (("mllama_text_model",), frozenset({"vision_config", "image_token_index", "image_token_id"}), None),
    # Emu3 (Emu3ForConditionalGeneration: Emu3-Chat-hf, Emu3-Gen-hf): its language model (model.text_model.*;
    # text_config emu3_text_model), tied by the wrapper's key (default false); its VQ-VAE (vq_config, model.vqmodel.*)
    # not read
    "emu3": (("emu3_text_model",), frozenset({"vq_config", "vocabulary_map", "image_token_id", "is_encoder_decoder"}),
             ("wrapper", False)),
    # Image + text models whose text_config may be any language model (transformers' AutoConfig; "*": any family
    # read here, the first its default): LLaVA 1.5 (llava: Llama / Vicuna, Mistral, ...), LLaVA-NeXT (llava_next),
    # LLaVA-OneVision (llava_onevision: Qwen2), InternVL 3 / 3.5 in transformers' layout (internvl: Qwen2.5 / Qwen3),
    # Idefics3 and SmolVLM (Llama / SmolLM2), Aya Vision (aya_vision: Cohere 2), LLaVA-NeXT-Video, Qwen2-Audio (its
    # audio side as an image side). The head: LLaVA's and OneVision's tied
    # where either key says so (transformers 5's back-compatibility); the others by the wrapper's key alone, at
    # its default where absent (InternVL's and Aya Vision's: tied), the text_config's not read.
    **{kind: (text, frozenset({"vision_config", *own}), tie) for kind, text, own, tie in (
        ("llava", ("llama", "*"), _LLAVA_KEYS, "either"),
        ("llava_next", ("llama", "*"), (*_LLAVA_KEYS, "image_grid_pinpoints"), ("wrapper", False)),
        ("llava_onevision", ("qwen2", "*"), (*_LLAVA_KEYS, "image_grid_pinpoints", "video_token_index",
                                            "vision_aspect_ratio"), "either"),
        ("internvl", ("qwen2", "*"), ("image_token_id", "image_seq_length", "downsample_ratio", "projector_hidden_act",
                                      "vision_feature_layer", "vision_feature_select_strategy"), ("wrapper", True)),
        ("idefics3", ("llama", "*"), ("image_token_id", "scale_factor", "_pad_token_id"), ("wrapper", False)),
        ("smolvlm", ("llama", "*"), ("image_token_id", "scale_factor", "_pad_token_id"), ("wrapper", False)),
        ("aya_vision", ("cohere2", "*"), ("image_token_index", "vision_feature_layer", "vision_feature_select_strategy",
                                         "downsample_factor", "adapter_layer_norm_eps"), ("wrapper", True)),
        ("llava_next_video", ("llama", "*"), (*_LLAVA_KEYS, "image_grid_pinpoints", "video_token_index",
                                             "spatial_pool_mode", "spatial_pool_stride", "video_seq_length"), "either"),
        # Fuyu (fuyu: Adept's fuyu-8b: Persimmon's language model; its image patches' linear embedding not read)
        ("fuyu", ("persimmon", "*"), ("image_size", "patch_size", "num_channels", "image_token_id",
                                      "initializer_range"), ("wrapper", False)),
        # Qwen2-Audio (Qwen2's language model; its head never tied: transformers' model ties it by no key)
        ("qwen2_audio", ("qwen2", "*"), ("audio_config", "audio_token_index"), ("wrapper", False)),
        # EXAONE 4.5 (exaone4_5: EXAONE 4's language model, its text_config exaone4, first released as exaone4_5_text;
        # Qwen2.5-VL's image side, plain RoPE on text)
        ("exaone4_5", ("exaone4", "exaone4_5_text"), ("image_token_id", "video_token_id"), ("wrapper", False)),
        # InternVL's own checkpoints (internvl_chat: InternVL 2 / 2.5 / 3 / 3.5, their modeling code's
        # InternVLChatModel): the language model is AutoModelForCausalLM of its llm_config (read as text_config), tied
        # by llm_config's key alone ("text"); the image side (InternViT, mlp1) and its settings not read
        ("internvl_chat", ("qwen2", "*"), (
            "auto_map", "template", "select_layer", "downsample_ratio", "dynamic_image_size", "use_thumbnail",
            "ps_version", "min_dynamic_patch", "max_dynamic_patch", "force_image_size", "pad2square",
            "use_backbone_lora", "use_llm_lora", "hidden_size", "image_fold", "system_message"), "text"))},
}
_FLAT_WRAPPERS = ("qwen2_vl", "qwen2_5_vl")  # configs whose language model's keys may sit at the top level
# Qwen's and GLM's image + text models' language-model configs: the family each is read as (the same layer and
# weights) and transformers' defaults of its config class (Qwen2VLTextConfig, Qwen2_5_VLTextConfig, Qwen3VLTextConfig,
# Glm4vTextConfig, ...). Their RoPE is M-RoPE: each head's frequencies split into mrope_section's three parts
# (interleaved in Qwen3-VL), turned by a token's temporal, height and width positions. A text token's three positions
# are its one position (transformers' get_rope_index: the same arange for the three where no image or video is in the
# input), so on text M-RoPE is the family's RoPE at any sections: the sections are read (three ints that cover the
# frequencies where transformers splits them by it; mrope_interleaved a bool) and not kept.
_QWEN2_VL_TEXT = {"vocab_size": 152064, "hidden_size": 8192, "intermediate_size": 29568, "num_hidden_layers": 80,
                  "num_attention_heads": 64, "num_key_value_heads": 8, "max_position_embeddings": 32768,
                  "rms_norm_eps": 1e-5, "use_sliding_window": False, "sliding_window": 4096, "max_window_layers": 80,
                  "rope_theta": 1000000.0, "bos_token_id": 151643, "eos_token_id": 151645}
_VL_TEXTS = {
    "qwen2_vl_text": ("qwen2", _QWEN2_VL_TEXT), "qwen2_5_vl_text": ("qwen2", _QWEN2_VL_TEXT),
    # (Qwen3VLTextConfig and Qwen3VLMoeTextConfig have no sliding window: those keys raise unless they say none)
    "qwen3_vl_text": ("qwen3", {"vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 22016,
                                "num_hidden_layers": 32, "num_attention_heads": 32, "head_dim": 128,
                                "max_position_embeddings": 128000, "rms_norm_eps": 1e-6, "rope_theta": 500000.0}),
    # (Qwen3-MoE's router with its top k probabilities always renormalised: norm_topk_prob, which it has no key for)
    "qwen3_vl_moe_text": ("qwen3_moe", {
        "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 24,
        "num_attention_heads": 16, "num_key_value_heads": 16, "max_position_embeddings": 128000, "rms_norm_eps": 1e-6,
        "rope_theta": 500000.0, "decoder_sparse_step": 1, "moe_intermediate_size": 1408, "num_experts_per_tok": 4,
        "num_experts": 60, "mlp_only_layers": []}),
    # Qwen3.5's language model (its family's own: FAMILIES["qwen3_5_text"]; interleaved M-RoPE)
    "qwen3_5_text": ("qwen3_5_text", {}), "qwen3_5_moe_text": ("qwen3_5_moe_text", {}),
    # Qwen's omni models' thinkers' language models (Qwen2_5OmniTextConfig: Qwen2's, M-RoPE; Qwen3OmniMoeTextConfig:
    # Qwen3-MoE's, interleaved M-RoPE, its router always renormalising, head_dim hidden / heads where absent)
    "qwen2_5_omni_text": ("qwen2", {**_QWEN2_VL_TEXT, "hidden_size": 3584, "intermediate_size": 18944,
                                    "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
                                    "rms_norm_eps": 1e-6, "max_window_layers": 28, "bos_token_id": None,
                                    "eos_token_id": None}),
    "qwen3_omni_moe_text": ("qwen3_moe", {
        "vocab_size": 3584, "hidden_size": 2048, "intermediate_size": 18944, "num_hidden_layers": 28,
        "num_attention_heads": 28, "num_key_value_heads": 4, "max_position_embeddings": 32768, "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0, "decoder_sparse_step": 1, "moe_intermediate_size": 768, "num_experts_per_tok": 8,
        "num_experts": 128, "mlp_only_layers": [], "bos_token_id": None, "eos_token_id": None}),
    # Solar Open (SolarOpenForCausalLM: Upstage's Solar-Open-100B): GLM-4.5's mixture on every layer (no dense ones)
    # under Llama's attention (RoPE on the whole head, half-split pairs; no q / k norms): read as glm4_moe so
    "solar_open": ("glm4_moe", {
        "vocab_size": 196608, "hidden_size": 4096, "num_hidden_layers": 48, "num_attention_heads": 64,
        "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
        "rope_theta": 1000000.0, "attention_bias": False, "moe_intermediate_size": 1280, "num_experts_per_tok": 8,
        "n_shared_experts": 1, "n_routed_experts": 128, "routed_scaling_factor": 1.0, "n_group": 1, "topk_group": 1,
        "norm_topk_prob": True, "bos_token_id": None, "eos_token_id": None, "pad_token_id": None}),
    # EXAONE 4.5's first releases' name of its EXAONE 4 text model (transformers reads it as exaone4)
    "exaone4_5_text": ("exaone4", {}),
    # Llama 3.2 Vision's (MllamaTextConfig): Llama 3.1's layers with cross-attention layers among them, which a
    # text-only forward skips (MllamaTextModel: no image states, no cached ones): read as the Llama of its other layers
    "mllama_text_model": ("llama", {"vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336,
                                    "num_hidden_layers": 40, "num_attention_heads": 32, "num_key_value_heads": 8,
                                    "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
                                    "bos_token_id": 128000, "eos_token_id": 128001, "pad_token_id": 128004}),
    # Emu3's (Emu3TextConfig: BAAI's Emu3-Chat / Emu3-Gen): Llama's layer (its vocabulary holds the image tokens'
    # codes; its attention_dropout, 0.1 by default, training only): read as Llama
    "emu3_text_model": ("llama", {"vocab_size": 184622, "hidden_size": 4096, "intermediate_size": 14336,
                                  "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                                  "max_position_embeddings": 9216, "rms_norm_eps": 1e-5, "rope_theta": 1000000.0,
                                  "bos_token_id": 151849, "eos_token_id": 151850, "pad_token_id": 151643}),
    # GLM-4.1V's (Glm4vTextConfig): GLM-4's layer, its q / k / v biases always and head_dim hidden / heads (it has
    # neither key), RoPE on adjacent pairs over partial_rotary_factor of each head (1 where the config gives none)
    "glm4v_text": ("glm4", {"vocab_size": 151552, "hidden_size": 4096, "intermediate_size": 13696,
                            "num_hidden_layers": 40, "num_attention_heads": 32, "num_key_value_heads": 2,
                            "max_position_embeddings": 32768, "rms_norm_eps": 1e-5, "pad_token_id": None}),
    # GLM-4.5V's (Glm4vMoeTextConfig): GLM-4.5's layer without q / k norms (no key), RoPE over partial_rotary_factor
    # (1 where none is given)
    "glm4v_moe_text": ("glm4_moe", {
        "vocab_size": 151424, "hidden_size": 4096, "intermediate_size": 10944, "num_hidden_layers": 46,
        "num_attention_heads": 96, "num_key_value_heads": 8, "max_position_embeddings": 65536, "rms_norm_eps": 1e-5,
        "attention_bias": True, "moe_intermediate_size": 1408, "num_experts_per_tok": 8, "n_shared_experts": 1,
        "n_routed_experts": 128, "routed_scaling_factor": 1.0, "n_group": 1, "topk_group": 1,
        "first_k_dense_replace": 1, "norm_topk_prob": True}),
}

# Keys that never change the logits of a forward: provenance, special token ids (the forward never
# reads them), transformers runtime switches, and the generation defaults transformers 4.x wrote into
# config.json (read by generate(), not by the model). Kept in ``LlamaConfig.extra`` for round trips.
_METADATA_KEYS = frozenset({
    "architectures", "transformers_version", "_name_or_path", "name_or_path", "_commit_hash",
    "torch_dtype", "dtype", "tokenizer_class", "is_llama_config", "transformers.js_config", "finetuning_task",
    "id2label", "label2id", "num_labels", "problem_type", "prefix", "task_specific_params",
    "sep_token_id", "unk_token_id", "decoder_start_token_id",
    "use_cache", "output_attentions", "output_hidden_states", "return_dict", "torchscript", "use_bfloat16",
    "tf_legacy_loss", "chunk_size_feed_forward", "attn_implementation", "_attn_implementation",
    "_attn_implementation_autoset", "is_decoder", "tie_encoder_decoder", "cross_attention_hidden_size",
    # transformers 4.x split the matmuls into this many slices (same math); transformers 5 ignores it
    "pretraining_tp",
    # which KV-cache class transformers' generate() builds ("hybrid": Gemma 2/3's sliding + global layers)
    "cache_implementation",
    "max_length", "min_length", "do_sample", "early_stopping", "num_beams", "num_beam_groups",
    "diversity_penalty", "temperature", "top_k", "top_p", "typical_p", "repetition_penalty", "length_penalty",
    "no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "bad_words_ids", "num_return_sequences",
    "output_scores", "return_dict_in_generate", "forced_bos_token_id", "forced_eos_token_id",
    "remove_invalid_values", "exponential_decay_length_penalty", "suppress_tokens", "begin_suppress_tokens",
})


_WINDOWS = ("a sliding window as transformers reads it (Mistral, Phi-3: every layer; Gemma 2 / 3, GPT-OSS, OLMo 3, "
            "CWM, Granite SWA: on the layer_types' 'sliding_attention' layers, CWM's and Granite SWA's a positive int; "
            "Qwen2/3: with use_sliding_window, "
            "on the layer_types' 'sliding_attention' layers, by default those from max_window_layers on; Qwen2-MoE: "
            "with use_sliding_window, on the layer_types' 'sliding_attention' layers, by default every other layer "
            "from the first below max_window_layers), a positive int or null (Qwen2-MoE: a positive int); "
            "IQuest-Coder: use_sliding_window false, its window keys then not read; other "
            "families: none, or one at least max_position_embeddings long")

# key -> (harmless(value, config), the value we implement). Any other value raises.
_HARMLESS_ONLY_AT = {
    "hidden_act": (lambda v, c: v in FAMILIES[c.model_type].hidden_acts,
                   "the family's activation ('silu': SwiGLU; Gemma's 'gelu_pytorch_tanh' or its legacy 'gelu')"),
    # transformers 4.x Gemma's key (it overrode hidden_act); 5.x reads hidden_act only
    "hidden_activation": (lambda v, c: c.model_type in ("gemma", *_GEMMA2S, "gemma3_text")
                          and v in (None, "gelu_pytorch_tanh"),
                          "'gelu_pytorch_tanh' (Gemma)"),
    "use_bidirectional_attention": (lambda v, c: not v, "false or null (causal attention)"),
    # Gemma 2's soft-capping (LlamaConfig.attn_softcap, final_softcap; Gemma 3 keeps the keys, null; NanoChat caps
    # the logits only)
    **{key: (lambda v, c, key=key: v is None or (c.model_type in (*_GEMMA2S, *(("nanochat",) if key[0] == "f" else ()))
                                                 and _is_number(v) and 0 < v < float("inf")),
             "null (Gemma 2, and NanoChat's logits: a number > 0, the cap of cap * tanh(x / cap))")
       for key in ("attn_logit_softcapping", "final_logit_softcapping")},
    # Gemma 2 / 3's: LlamaConfig.attention_scale, local_rope_theta, layer_windows
    "query_pre_attn_scalar": (lambda v, c: c.model_type in (*_GEMMA2S, "gemma3_text") and _is_number(v) and v > 0,
                              "a number > 0 (Gemma 2 / 3: the attention's scale is its inverse square root)"),
    # (OLMo 3: read from rope_parameters['sliding_attention'], its config has no such key: _split_layer_rope)
    "rope_local_base_freq": (lambda v, c: c.model_type in ("gemma3_text", "olmo3", "mellum", "laguna", "lfm3",
                                                                       "mimo_v2_flash", "modernbert-decoder")
                             and _is_number(v)
                             and v > 0,
                             "a number > 0 (Gemma 3: the RoPE base of its sliding layers)"),
    **{key: (lambda v, c, key=key: (c.model_type == "gemma3_text" and _is_int(v) and v >= 1)
             or (key == "sliding_window_pattern"
                 and c.model_type in ("exaone4", "exaone_moe", "cohere2", "cohere2_moe")
                 and (_is_int(v) and v >= 1 or v is None or "layer_types" in c.extra)),
             "an int >= 1 (Gemma 3, EXAONE 4, Cohere 2: every n-th layer global, the others sliding; EXAONE 4, Cohere "
             "2: any, with layer_types, which transformers reads instead)")
       for key in ("sliding_window_pattern", "_sliding_window_pattern")},
    # the model has no dropout; transformers applies this one in training mode
    "attention_dropout": (lambda v, c: v in (0, None) or (c.model_type in ("seed_oss", "gpt_neox", "persimmon", "opt",
                                                                           "gpt_neo", "xglm", "gpt_neox_japanese")
                                                          and _is_number(v)
                                                          and 0 <= v < 1),
                          "0.0 (Seed-OSS, GPT-NeoX (Japanese), Persimmon, OPT: any, as Seed-OSS's configs ship 0.1: "
                          "dropout acts in training only)"),
    # Seed-OSS's: LlamaConfig.out_bias; its residual dropout (training only)
    "attention_out_bias": (lambda v, c: c.model_type == "seed_oss" and isinstance(v, bool),
                           "absent (Seed-OSS: a bool)"),
    "residual_dropout": (lambda v, c: c.model_type in ("seed_oss", "starcoder2") and _is_number(v) and 0 <= v < 1,
                         "absent (Seed-OSS, StarCoder 2: any in [0, 1), training only)"),
    "embedding_dropout": (lambda v, c: c.model_type == "starcoder2" and _is_number(v) and 0 <= v < 1,
                          "absent (StarCoder 2: any in [0, 1), training only)"),
    # Phi-3's other dropouts (training only, as that one); DBRX's resid_pdrop (one key, one entry: a second of the same
    # name would replace this one)
    "embd_pdrop": (lambda v, c: c.model_type == "phi3" and v in (0, None)
                   or c.model_type in ("phi", *_GPTJS, *_GPT2S, "openai-gpt") and _is_number(v) and 0 <= v < 1,
                   "0.0 (Phi-3; Phi-2, GPT-J, GPT-2, GPT-1: any in [0, 1))"),
    "resid_pdrop": (lambda v, c: c.model_type == "phi3" and v in (0, None)
                    or c.model_type in ("phi", "dbrx", *_GPTJS, *_GPT2S, "openai-gpt") and _is_number(v) and 0 <= v < 1,
                    "0.0 (Phi-3; Phi-2, DBRX, GPT-J, GPT-2, GPT-1: any in [0, 1))"),
    "attn_pdrop": (lambda v, c: c.model_type in (*_GPTJS, *_GPT2S, "openai-gpt") and _is_number(v) and 0 <= v < 1,
                   "absent (GPT-J, CodeGen, GPT-2, GPT-1: any in [0, 1), training only)"),
    "n_ctx": (lambda v, c: c.model_type in ("codegen", "gpt2", "openai-gpt") and _is_int(v) and v >= 1,
              "absent (CodeGen, GPT-2, GPT-1: an int >= 1, not read by transformers' model)"),
    # GPT-1's first config's keys (openai-gpt's config.json), which transformers' model does not read
    "n_special": (lambda v, c: c.model_type == "openai-gpt" and v == 0,
                  "absent (GPT-1: 0; special tokens' rows past vocab_size are not read)"),
    "predict_special_tokens": (lambda v, c: c.model_type == "openai-gpt" and isinstance(v, bool),
                               "absent (GPT-1: a bool, not read)"),
    # BioGPT's: its dropouts (training only), its embeddings' scale (LlamaConfig.rounded_embed_factor), its
    # layer_norm_eps (its modules' LayerNorms never read it: 1e-5)
    **{key: (lambda v, c: c.model_type == "biogpt" and _is_number(v) and 0 <= v < 1,
             "absent (BioGPT: any in [0, 1), training only)")
       for key in ("hidden_dropout_prob", "attention_probs_dropout_prob")},
    "scale_embedding": (lambda v, c: c.model_type in ("biogpt", "xglm") and isinstance(v, bool),
                        "absent (BioGPT, XGLM: a bool)"),
    # OPT's dropouts (training only) and its layouts (opt-350m's: norms after the residual adds, projected embeddings)
    **{key: (lambda v, c: c.model_type in ("opt", "xglm") and _is_number(v) and 0 <= v < 1
             or c.model_type == "biogpt" and key != "dropout" and _is_number(v) and 0 <= v < 1,
             "absent (OPT, XGLM: any in [0, 1), training only; BioGPT: activation_dropout, layerdrop)")
       for key in ("dropout", "activation_dropout", "layerdrop")},
    "do_layer_norm_before": (lambda v, c: c.model_type == "opt" and isinstance(v, bool),
                             "absent (OPT: a bool; false: opt-350m's norms after the residual adds)"),
    "_remove_final_layer_norm": (lambda v, c: c.model_type == "opt" and isinstance(v, bool),
                                 "absent (OPT: a bool)"),
    "word_embed_proj_dim": (lambda v, c: c.model_type == "opt" and (v is None or _is_int(v) and v >= 1),
                            "absent (OPT: null or a positive int, the embeddings' width: opt-350m's 512)"),
    "layer_norm_elementwise_affine": (lambda v, c: c.model_type == "opt" and v is True,
                                      "absent (OPT: true; LayerNorms without weights are not implemented)"),
    # GPT-2's (GPT-BigCode's): its attention's scale (LlamaConfig.attention_scale), its float32 scores (ours are: either
    # reads), its double-heads model's summary head (not a causal LM's: not read)
    "scale_attn_weights": (lambda v, c: c.model_type in _GPT2S and isinstance(v, bool),
                           "absent (GPT-2, GPT-BigCode: a bool)"),
    **{key: (lambda v, c: c.model_type == "gpt_bigcode" and isinstance(v, bool),
             "absent (GPT-BigCode: a bool; the softmax is float32 either way)")
       for key in ("attention_softmax_in_fp32", "scale_attention_softmax_in_fp32")},
    # (GPT-BigCode's first configs' keys for Megatron's inference runner: transformers reads none)
    **{key: (lambda v, c: c.model_type == "gpt_bigcode", "absent (GPT-BigCode: any, an inference runner's, unread)")
       for key in ("inference_runner", "max_batch_size", "max_sequence_length", "pad_key_length",
                   "pre_allocate_kv_cache", "validate_runner_input")},
    "scale_attn_by_inverse_layer_idx": (lambda v, c: c.model_type == "gpt2" and v is False,
                                        "absent (GPT-2: false; a scale per layer is not implemented)"),
    "reorder_and_upcast_attn": (lambda v, c: c.model_type == "gpt2" and isinstance(v, bool),
                                "absent (GPT-2: a bool; the scores are float32 either way)"),
    **{key: (lambda v, c: c.model_type in ("gpt2", "openai-gpt"),
             "absent (GPT-2, GPT-1: any, their double-heads models' summary head)")
       for key in ("summary_type", "summary_use_proj", "summary_activation", "summary_proj_to_labels",
                   "summary_first_dropout")},
    # Phi-2's and StableLM's q / k LayerNorm over head_dim (LlamaConfig.qk_norm): off in phi-1, phi-1.5, phi-2 and
    # StableLM up to 3B, on in StableLM 2 12B (weights of its own per head, no bias)
    "qk_layernorm": (lambda v, c: c.model_type in ("phi", "stablelm", "persimmon") and isinstance(v, bool),
                     "absent (Phi-2, StableLM: a bool)"),
    # StableLM's q / k / v biases (LlamaConfig.qkv_bias) and parallel block (LlamaConfig.parallel_block; GPT-NeoX's)
    "use_qkv_bias": (lambda v, c: c.model_type == "stablelm" and isinstance(v, bool), "absent (StableLM: a bool)"),
    "use_parallel_residual": (lambda v, c: c.model_type in ("stablelm", "gpt_neox") and isinstance(v, bool),
                              "absent (StableLM, GPT-NeoX: a bool)"),
    "hidden_dropout": (lambda v, c: c.model_type in ("stablelm", "gpt_neox", "falcon", "persimmon",
                                                     "gpt_neox_japanese") and _is_number(v) and 0 <= v < 1,
                       "absent (StableLM, GPT-NeoX (Japanese), Falcon: any in [0, 1), training only)"),
    # GPT-NeoX's dropout of its sequence-classification head (not a causal LM's)
    "classifier_dropout": (lambda v, c: c.model_type in ("gpt_neox", "gpt_neo")
                           and (v is None or _is_number(v) and 0 <= v < 1),
                           "absent (GPT-NeoX, GPT-Neo: null or any in [0, 1), its classifier's)"),
    # GPT-Neo's dropouts (training only) and its windows (LlamaConfig.layer_windows, _layer_windows)
    **{key: (lambda v, c: c.model_type == "gpt_neo" and _is_number(v) and 0 <= v < 1,
             "absent (GPT-Neo: any in [0, 1), training only)") for key in ("embed_dropout", "resid_dropout")},
    **{key: (lambda v, c, key=key: c.model_type == "gpt_neo" and _layer_windows(c)[1] != key,
             "absent (GPT-Neo: window_size an int >= 1; attention_types a list of [[kinds 'global' / 'local'], "
             "repeats] one kind per layer in all; attention_layers, as transformers writes it, their expansion)")
       for key in ("window_size", "attention_types", "attention_layers")},
    "partial_rotary_factor": (lambda v, c: v in (1, None) and c.model_type != "bamba" or (c.model_type == "bamba"
                                                                                         and v == 0.5)
                              or (c.model_type in ("phi3", *_GLMS,
                                                                               "minimax_m2", "nemotron", "phi",
                                                                               "stablelm", "gpt_neox", *_GPTJS,
                                                                               "persimmon", "laguna", "lfm3",
                                                                               "mimo_v2_flash",
                                                                               "gpt_neox_japanese", *_DELTA_FAMILIES)
                                                               and _is_number(v)
                                                               and 0 < v < 1 and int(c.head_dim * v) % 2 == 0
                                                               and int(c.head_dim * v) >= 2),
                              "1.0 (RoPE on the whole head; Phi-3 / Phi-4 / GLM-4 / GLM-4.5: a number in (0, 1] "
                              "leaving an even number >= 2 of rotated dims, int(head_dim * factor))"),
    "logit_scale": (lambda v, c: c.model_type in (*_COHERES, "cohere2_moe") and _is_number(v)
                    and 0 < abs(v) < float("inf"),
                    "absent (Cohere, Cohere 2: a finite nonzero number, the logits' factor)"),
    # Cohere's per-head q/k LayerNorm (Command R+): LlamaConfig.qk_norm
    # Command R7B's config.json has it; transformers does not read it (RoPE on the whole head); llama.cpp's converter
    # does: only 1.0, where the two agree
    "rotary_pct": (lambda v, c: c.model_type in _COHERES and v == 1, "1.0 (Cohere, Cohere 2: RoPE on the whole head)"),
    # Granite's multipliers: LlamaConfig.embedding_multiplier, attention_scale, residual_multiplier, logits_scaling
    **{key: (lambda v, c, key=key: c.model_type in _GRANITES and _is_number(v) and 0 < v < float("inf") or (
        key == "attention_multiplier" and c.model_type == "hyperclovax" and v is None),
             "absent (Granite: a finite number > 0; HyperCLOVA X's attention_multiplier: null too)")
       for key in _GRANITE_SCALES},
    "use_post_norm": (lambda v, c: c.model_type == "hyperclovax" and isinstance(v, bool),
                      "absent (HyperCLOVA X: a bool, its Peri-LN norms)"),
    # mixtures of experts: LlamaConfig.experts (checked together there)
    **{key: (lambda v, c, key=key: (c.model_type in _MOE_TYPES or key == "num_experts_per_tok"
                                    and c.model_type in _GROUPED
                                    or key in ("num_local_experts", "num_experts_per_tok")
                                    and c.model_type == "minimax_m2"
                                    or key == "num_experts" and c.model_type == "exaone_moe") and _is_int(v) and v >= 1,
             "absent (Mixtral, Qwen3-MoE, DeepSeek, MiniMax-M2, EXAONE MoE: an int >= 1)")
       for key in (*_EXPERT_COUNT_KEYS, "num_experts_per_tok")},
    **{key: (lambda v, c, key=key: (c.model_type in _QWEN_MOES or key == "moe_intermediate_size"
                                    and c.model_type in (*_GROUPED, "ernie4_5_moe", "qwen3_5_moe_text"))
             and _is_int(v) and v >= 1,
             "absent (Qwen2-MoE, Qwen3-MoE, DeepSeek, ERNIE 4.5 MoE: an int >= 1)")
       for key in ("moe_intermediate_size", "decoder_sparse_step")},
    "shared_expert_intermediate_size": (lambda v, c: c.model_type in ("qwen2_moe", "qwen3_next", "qwen3_5_moe_text")
                                        and _is_int(v) and v >= 1,
                                        "absent (Qwen2-MoE, Qwen3-Next, Qwen3.5-MoE: an int >= 1)"),
    # Granite SWA's RoPE base per layer (0: NoPE): LlamaConfig.rope_layers, local_rope_theta
    "layer_rope_theta": (lambda v, c: c.model_type in _GRANITE_SWAS and _granite_swa_thetas(c, v) is not None,
                         "absent (Granite SWA: one number >= 0 per layer, at most two RoPEs: rope_theta's and NoPE "
                         "(0), or, with plain RoPE over the whole head, rope_theta's and one other base)"),
    "shared_intermediate_size": (lambda v, c: c.model_type in ("granitemoeshared", "granitemoe_swa")
                                 and _is_int(v) and v >= 0
                                 or c.model_type == "minimax_m2" and v == 0,
                                 "absent (GraniteMoeShared: an int >= 0; MiniMax-M2: 0, no shared expert)"),
    # GPT-OSS's clamped SwiGLU (LlamaConfig.swiglu_clamp)
    **{key: (lambda v, c: c.model_type == "gpt_oss" and _is_number(v) and 0 < v < float("inf"),
             "absent (GPT-OSS: a finite number > 0)") for key in ("swiglu_alpha", "swiglu_limit")},
    # GPT-OSS's config.json as OpenAI wrote it: the RoPE's original context again (rope_scaling has the one read)
    # and the experts per token under another name (transformers reads num_experts_per_tok)
    "initial_context_length": (lambda v, c: c.model_type == "gpt_oss" and _is_int(v) and v >= 1,
                               "absent (GPT-OSS: an int, not read)"),
    "experts_per_token": (lambda v, c: c.model_type == "gpt_oss" and v == c.extra.get("num_experts_per_tok"),
                          "absent (GPT-OSS: num_experts_per_tok's value)"),
    "norm_topk_prob": (lambda v, c: (c.model_type in (*_NORM_TOPK, *_V3_ROUTERS) and isinstance(v, bool))
                       or (c.model_type == "deepseek_v2" and v is False)
                       or (c.model_type == "qwen3_5_moe_text" and v is True),
                       "absent (Qwen2-MoE, Qwen3-MoE, OLMoE, DeepSeek-V3: a bool; DeepSeek-V2: false, as its "
                       "checkpoints have it: transformers' DeepSeek-V2 never renormalises, DeepSeek's own code does "
                       "where it is true)"),
    # DeepSeek-V2 / V3: LlamaConfig.mla and LlamaConfig.experts (checked together in LlamaConfig.__post_init__)
    **{key: (lambda v, c, key=key: (c.model_type in _DEEPSEEKS or key == "n_routed_experts"
                                    and c.model_type in _GROUPED
                                    or key in _MLA_DIMS and c.model_type in ("youtu", "minicpm3")
                                    or key == "v_head_dim" and c.model_type == "mimo_v2_flash")
             and _is_int(v) and v >= 1,
             "absent (DeepSeek: an int >= 1; GLM-4.5, dots.llm1, MiMo-V2-Flash: n_routed_experts; MiMo-V2-Flash: "
             "v_head_dim)") for key in _DEEPSEEK_INTS},
    # MiniCPM3's three numbers (LlamaConfig.rounded_embed_factor, residual_multiplier, head_divisor; null: 1)
    "scale_emb": (lambda v, c: c.model_type == "minicpm3" and _is_number(v) and 0 < abs(v) < float("inf"),
                  "absent (MiniCPM3: a number, the embeddings' factor)"),
    **{key: (lambda v, c: c.model_type == "minicpm3" and (v is None or _is_number(v) and 0 < v < float("inf")),
             "absent (MiniCPM3: null or a number > 0)") for key in ("scale_depth", "dim_model_base")},
    # Granite 4.0 (granitemoehybrid): its mixture's keys, its RoPE switch, its Mamba layers' keys (LlamaConfig.mamba)
    "position_embedding_type": (lambda v, c: c.model_type == "granitemoehybrid" and v in (None, "rope", "nope"),
                                "absent (Granite 4.0: 'rope', or null / 'nope': no RoPE)"),
    # (Granite 4.0's configs: its training initialiser, its norm)
    "init_method": (lambda v, c: c.model_type == "granitemoehybrid" and isinstance(v, str),
                    "absent (Granite 4.0: a string, its training's initialiser)"),
    "normalization_function": (lambda v, c: c.model_type == "granitemoehybrid" and v == "rmsnorm",
                               "absent (Granite 4.0: 'rmsnorm')"),
    "layers_block_type": (lambda v, c: c.model_type == "granitemoehybrid"
                          and _layer_windows(c)[1] != "layers_block_type",
                          "absent (Granite 4.0: one of 'attention' / 'full_attention' / 'linear_attention' / 'mamba' "
                          "per layer)"),
    **{key: (lambda v, c, key=key: (c.model_type in _MAMBA_FAMILIES or c.model_type in _MAMBA1_KEYS and key in (
        "mamba_d_state", "mamba_d_conv", "mamba_expand")) and _is_int(v) and v >= 1,
             "absent (Granite 4.0, Bamba, Mamba: an int >= 1)")
       for key in ("mamba_n_heads", "mamba_n_groups", "mamba_d_state", "mamba_d_conv", "mamba_expand",
                   "mamba_chunk_size")},
    "mixer_rms_eps": (lambda v, c: c.model_type == "falcon_mamba" and _is_number(v) and v > 0,
                      "absent (Falcon Mamba: a number > 0)"),
    "mamba_dt_rank": (lambda v, c: c.model_type in _MAMBA1_KEYS and (v == "auto" or _is_int(v) and v >= 1),
                      "absent (Mamba: 'auto' or an int >= 1, its time step's rank)"),
    **{key: (lambda v, c: c.model_type in _MAMBA1_KEYS and v in (True, False, None, "random", "constant")
             or c.model_type in _MAMBA1S and _is_number(v),
             "absent (Mamba: its kernels' choice or an initialisation's)")
       for key in ("use_mambapy", "use_associative_scan", "time_step_scale", "time_step_init_scheme")},
    "mamba_d_head": (lambda v, c: c.model_type in _MAMBA_FAMILIES and (v == "auto" or _is_int(v) and v >= 1),
                     "absent (Granite 4.0, Bamba: 'auto' or an int >= 1)"),
    **{key: (lambda v, c: (c.model_type in _MAMBA_FAMILIES or c.model_type in _MAMBA1_KEYS) and isinstance(v, bool),
             "absent (Granite 4.0, Bamba, Mamba: a bool)") for key in ("mamba_conv_bias", "mamba_proj_bias")},
    # Bamba's attention layers; its training-only z-loss; its generate's logits to keep (every logit is computed here)
    "residual_in_fp32": (lambda v, c: c.model_type in ("mamba2", "nemotron_h", *_MAMBA1S) and isinstance(v, bool),
                         "absent (Mamba-2, Nemotron-H, Mamba: a bool, the residual stream in float32)"),
    **{key: (lambda v, c: c.model_type in ("mamba2", "nemotron_h", *_MAMBA1S)
             and (v is None or v == "auto" or _is_number(v)),
             "absent (Mamba-2, Nemotron-H, Mamba: a number or 'auto', an initialisation's)")
       for key in ("time_step_rank", "time_step_min", "time_step_max", "time_step_floor")},
    "rescale_prenorm_residual": (lambda v, c: c.model_type in ("mamba2", "nemotron_h", *_MAMBA1S)
                                 and isinstance(v, bool),
                                 "absent (Mamba-2, Nemotron-H, Mamba: a bool, an initialisation's)"),
    "attn_layer_indices": (lambda v, c: c.model_type == "bamba" and (v is None or isinstance(v, list) and all(
        _is_int(i) and 0 <= i < c.num_hidden_layers for i in v)), "absent (Bamba: null or a list of layer indices)"),
    "z_loss_coefficient": (lambda v, c: c.model_type == "bamba" and (v is None or _is_number(v)),
                           "absent (Bamba: a number, training only)"),
    "num_logits_to_keep": (lambda v, c: c.model_type in ("bamba", "nemotron_h") and (v is None or _is_int(v)),
                           "absent (Bamba, Nemotron-H: an int, generate's)"),
    # (its recurrent form clamps no time step while its chunked form would: only the limit that clamps nothing)
    "time_step_limit": (lambda v, c: c.model_type in _MAMBA_FAMILIES and (v is None or isinstance(v, (list, tuple))
                                                                            and len(v) == 2 and v[0] == 0
                                                                            and v[1] in (float("inf"), _JSON_INF)),
                        "absent (Granite 4.0: null or [0.0, inf], no clamp)"),
    # (the RW code's, before transformers had Falcon: false in Falcon's checkpoints, and transformers does not read it)
    "apply_residual_connection_post_layernorm": (lambda v, c: c.model_type == "falcon" and v is False,
                                                 "absent (Falcon: false)"),
    # Falcon's layout keys (read by _falcon_keys and falcon_layout; kept, and written back, as they are)
    **{key: (lambda v, c: c.model_type == "falcon", "absent (Falcon: its layout, read as the model's fields)")
       for key in _FALCON_LAYOUT},
    # DBRX's (read by _dbrx_keys: its router weights' normalisation; its dropouts, training only)
    "moe_normalize_expert_weights": (lambda v, c: c.model_type == "dbrx" and v in (1, 1.0, None),
                                     "absent (DBRX: 1 or null)"),
    "emb_pdrop": (lambda v, c: c.model_type == "dbrx" and _is_number(v) and 0 <= v < 1, "absent (DBRX: in [0, 1))"),
    # PhiMoE's: SparseMixer's jitter (LlamaConfig.experts), its input jitter (training only), its head's bias
    "input_jitter_noise": (lambda v, c: c.model_type == "phimoe" and _is_number(v) and 0 <= v < float("inf"),
                           "absent (PhiMoE: a number >= 0, training only)"),
    "lm_head_bias": (lambda v, c: c.model_type == "phimoe" and isinstance(v, bool),
                     "absent (PhiMoE: a bool, the head's bias)"),
    # Youtu's initialiser of its embeddings (training only)
    "embedding_initializer_range": (lambda v, c: c.model_type == "youtu" and (v is None or _is_number(v)),
                                    "absent (Youtu: null or a number, its embeddings' initialiser)"),
    "q_lora_rank": (lambda v, c: c.model_type in _MLAS and (v is None and c.model_type != "axk1"
                                                           or _is_int(v) and v >= 1),
                    "absent (DeepSeek: null or an int >= 1; A.X-K1: an int >= 1)"),
    "n_shared_experts": (lambda v, c: c.model_type in _GROUPED and c.model_type not in ("exaone_moe", "mimo_v2_flash")
                         and (v is None or _is_int(v) and v >= 0), "absent (DeepSeek: null or an int >= 0)"),
    "num_shared_experts": (lambda v, c: c.model_type == "exaone_moe" and _is_int(v) and v >= 0,
                           "absent (EXAONE MoE: an int >= 0)"),
    "first_k_dense_replace": (lambda v, c: c.model_type in _GROUPED and c.model_type not in ("glm4_moe_lite",
                                                                                            "mimo_v2_flash")
                              and _is_int(v)
                              and v >= 0,
                              "absent (DeepSeek: an int >= 0, the dense layers before the mixtures)"),
    "routed_scaling_factor": (lambda v, c: c.model_type in _GROUPED and _is_number(v) and 0 < v < float("inf")
                              or c.model_type == "mimo_v2_flash" and v is None,
                              "absent (DeepSeek: a finite number > 0; MiMo-V2-Flash: or null, 1)"),
    "topk_method": (lambda v, c: v in _DEEPSEEK_METHODS.get(c.model_type, ()),
                    "absent (DeepSeek-V2: 'greedy' or 'group_limited_greedy'; DeepSeek-V3: 'noaux_tc')"),
    **{key: (lambda v, c: c.model_type in _GROUPED and (v is None or _is_int(v) and v >= 1),
             "absent (DeepSeek, GLM-4.5: null or an int >= 1)") for key in ("n_group", "topk_group")},
    "use_qk_norm": (lambda v, c: c.model_type in ("cohere", "glm4_moe") and isinstance(v, bool) or v is None
                    or c.model_type == "minimax_m2" and v is True,
                    "absent (Cohere: a bool, its per-head q/k LayerNorm; GLM-4.5: a bool, its per-head q/k RMSNorm; "
                    "MiniMax-M2: true)"),
    "scoring_func": (lambda v, c: (c.model_type, v) in (("deepseek_v2", "softmax"), ("deepseek_v3", "sigmoid"),
                                                         ("glm4_moe_lite", "sigmoid"), ("dots1", "sigmoid"),
                                                         ("deepseek_v32", "sigmoid"), ("glm_moe_dsa", "sigmoid"),
                                                         ("minimax_m2", "sigmoid"), ("axk1", "sigmoid"),
                                                         ("kimi_linear", "sigmoid")),
                     "absent (DeepSeek-V2: 'softmax'; DeepSeek-V3: 'sigmoid', as transformers computes them)"),
    "rope_interleave": (lambda v, c: c.model_type in ("deepseek_v3", "glm4_moe_lite", "youtu", "axk1")
                        and isinstance(v, bool) or c.model_type in _DSAS and v is True,
                        "absent (DeepSeek-V3, GLM-4.7-Flash, Youtu: a bool, its RoPE on adjacent pairs of dims; "
                        "DeepSeek-V3.2, GLM-5: true, as transformers always pairs them)"),
    # GLM-4.7-Flash's, DeepSeek-V3.2's and GLM-5's dense and sparse layers (LlamaConfig.experts)
    "mlp_layer_types": (lambda v, c: c.model_type in ("glm4_moe_lite", "exaone_moe", "axk1", "mimo_v2_flash",
                                                     "kimi_linear", *_DSAS) and (
        v is None or isinstance(v, list) and len(v) == c.num_hidden_layers and set(v) <= {"dense", "sparse"}),
        "absent (GLM-4.7-Flash, DeepSeek-V3.2, GLM-5: one 'dense' or 'sparse' per layer)"),
    # DeepSeek's sparse attention (LlamaConfig.dsa; checked together there)
    **{key: (lambda v, c: c.model_type in _DSAS and _is_int(v) and v >= 1,
             "absent (DeepSeek-V3.2, GLM-5: an int >= 1, its indexer's)") for key in ("index_topk", "index_head_dim",
                                                                                      "index_n_heads")},
    # GLM-5's layers sharing the previous full layer's choice (LlamaConfig.dsa: _indexer_types)
    "indexer_types": (lambda v, c: c.model_type == "glm_moe_dsa" and (v is None or isinstance(v, list)),
                      "absent (GLM-5: one 'full' or 'shared' per layer, the first 'full')"),
    "index_topk_pattern": (lambda v, c: c.model_type == "glm_moe_dsa" and (v is None or isinstance(v, (str, list))),
                           "absent (GLM-5: 'F' or 'S' per layer, or a list of 'full' / 'shared')"),
    **{key: (lambda v, c: c.model_type == "glm_moe_dsa" and _is_int(v), "absent (GLM-5: an int)")
       for key in ("index_topk_freq", "index_skip_topk_offset")},
    # DeepSeek's own code makes every moe_layer_freq-th layer sparse, transformers every one: they agree at 1 only
    "moe_layer_freq": (lambda v, c: c.model_type in _DEEPSEEKS and v == 1
                       or c.model_type == "axk1" and _is_int(v) and v >= 1,
                       "absent (DeepSeek: 1; A.X-K1: an int >= 1, every n-th layer sparse past the dense ones)"),
    # DeepSeek's training and parallelism settings, and V3's multi-token prediction layers (not in the forward: their
    # weights are skipped on loading, as transformers skips them)
    "ep_size": (lambda v, c: c.model_type in _DEEPSEEKS and _is_int(v) and v >= 1, "absent (DeepSeek: an int >= 1)"),
    "aux_loss_alpha": (lambda v, c: c.model_type in _DEEPSEEKS and _is_number(v), "absent (DeepSeek: a number)"),
    "seq_aux": (lambda v, c: c.model_type in _DEEPSEEKS and isinstance(v, bool), "absent (DeepSeek: a bool)"),
    **{key: (lambda v, c: c.model_type in (*_V3_ROUTERS, "ernie4_5_moe") and c.model_type != "dots1" and _is_int(v)
             and v >= 0, "absent (DeepSeek-V3, GLM-4.5, ERNIE 4.5 MoE: an int >= 0, its multi-token prediction "
                         "layers, not part of the forward)")
       for key in ("num_nextn_predict_layers", "num_mtp_layers")},
    # OLMoE's clamp of q, k and v to [-clip_qkv, clip_qkv] (LlamaConfig.clip_qkv)
    "clip_qkv": (lambda v, c: v is None or (c.model_type in ("olmoe", "olmo", "dbrx") and _is_number(v)
                                            and 0 < v < float("inf")),
                 "null (OLMoE, OLMo: a number > 0)"),
    "qkv_bias": (lambda v, c: c.model_type == "qwen2_moe" and isinstance(v, bool), "absent (Qwen2-MoE: a bool)"),
    # llama.cpp's M-RoPE on text (GGUF qwen2vl / qwen3vl / qwen3vlmoe: loading._gguf_mrope): the RoPE pairs it turns
    # by a text token's fourth position, 0, and so leaves as they are (rope.rope_inv_freq: frequency 0)
    "rope_still_pairs": (lambda v, c: c.model_type in ("qwen2", "qwen3", "qwen3_moe") and isinstance(v, list)
                         and len(set(v)) == len(v) and all(_is_int(i) and 0 <= i < c.rotary_dim // 2 for i in v),
                         "absent (Qwen2 / Qwen3 / Qwen3-MoE: distinct RoPE pair indices, from llama.cpp's M-RoPE)"),
    "mlp_only_layers": (lambda v, c: c.model_type in _QWEN_MOES and (v is None or isinstance(v, list) and all(
        _is_int(i) and 0 <= i < c.num_hidden_layers for i in v)), "absent (Qwen2-MoE, Qwen3-MoE: layer indices)"),
    # ERNIE 4.5's mixture (LlamaConfig.experts)
    **{key: (lambda v, c, low=low: c.model_type == "ernie4_5_moe" and _is_int(v) and v >= low,
             f"absent (ERNIE 4.5 MoE: an int >= {low})")
       for key, low in (("moe_num_experts", 1), ("moe_k", 1), ("moe_num_shared_experts", 0),
                        ("moe_layer_start_index", 0), ("moe_layer_end_index", -1), ("moe_layer_interval", 1))},
    # (transformers' ERNIE 4.5 always adds its router's correction bias, zeros where a checkpoint has none)
    "moe_use_aux_free": (lambda v, c: c.model_type == "ernie4_5_moe" and v is True,
                         "absent (ERNIE 4.5 MoE: true, its router's correction bias, as transformers computes it)"),
    "moe_gate_act": (lambda v, c: c.model_type == "ernie4_5_moe" and v == "softmax",
                     "absent (ERNIE 4.5 MoE: 'softmax', the only one transformers computes)"),
    # the renormalising sum clamped from below: the top k's probabilities sum to at least 1 / experts, so a clamp at
    # most that never acts (the sum itself divides, bitwise)
    "moe_norm_min": (lambda v, c: c.model_type == "ernie4_5_moe" and _is_number(v)
                     and 0 < v <= 1 / c.extra.get("moe_num_experts", 64),
                     "absent (ERNIE 4.5 MoE: a number in (0, 1 / moe_num_experts])"),
    # its training settings (tokens per expert in training; the multi-token prediction layers, not part of the
    # forward: their weights are skipped on loading, as transformers skips them)
    "moe_capacity": (lambda v, c: c.model_type == "ernie4_5_moe" and isinstance(v, list) and all(
        _is_int(x) for x in v), "absent (ERNIE 4.5 MoE: a list of ints, read in training only)"),
    "multi_token_pred_lambda": (lambda v, c: c.model_type == "ernie4_5_moe" and _is_number(v),
                                "absent (ERNIE 4.5 MoE: a number, read in training only)"),
    # the router's training loss and transformers' switch to return its logits: neither changes the logits
    "router_aux_loss_coef": (lambda v, c: c.model_type in _ANY_MOE and _is_number(v), "absent (MoE: a number)"),
    "aux_loss_coef": (lambda v, c: c.model_type == "jetmoe" and _is_number(v),
                      "absent (JetMoE: a number, training only)"),
    "output_router_logits": (lambda v, c: c.model_type in _ANY_MOE and isinstance(v, bool), "absent (MoE: a bool)"),
    # Mixtral's training-time noise on the router's input (transformers applies it in training mode only)
    "router_jitter_noise": (lambda v, c: c.model_type in ("mixtral", "minimax_m2") and _is_number(v) and v >= 0,
                            "absent (Mixtral, MiniMax-M2: a number >= 0, read in training only)"),
    # MiniMax-M2's checkpoints' keys from MiniMax-Text-01's code, read at the values its model has (transformers'
    # MiniMaxM2Config reads none): every layer full attention (attn_type_list 1; 0 was Text-01's linear attention),
    # its q/k norm over each token's whole projections, its routing bias; the multi-token prediction modules (not
    # part of the forward, and not in the released weights)
    "attn_type_list": (lambda v, c: c.model_type == "minimax_m2" and isinstance(v, list)
                       and len(v) == c.num_hidden_layers and all(x == 1 for x in v),
                       "absent (MiniMax-M2: a 1 per layer, full attention)"),
    "qk_norm_type": (lambda v, c: c.model_type == "minimax_m2" and v == "per_layer",
                     "absent (MiniMax-M2: 'per_layer', one RMSNorm over each token's whole q / k projections)"),
    "use_routing_bias": (lambda v, c: c.model_type == "minimax_m2" and v is True,
                         "absent (MiniMax-M2: true, its router's correction bias)"),
    "use_mtp": (lambda v, c: c.model_type == "minimax_m2" and isinstance(v, bool), "absent (MiniMax-M2: a bool)"),
    **{key: (lambda v, c: c.model_type == "minimax_m2" and _is_int(v) and v >= 0,
             "absent (MiniMax-M2: an int >= 0, its multi-token prediction modules)")
       for key in ("num_mtp_modules", "mtp_transformer_layers")},
    # SmolLM3's NoPE layers: LlamaConfig.rope_layers
    "no_rope_layers": (lambda v, c: c.model_type == "smollm3" and isinstance(v, list)
                       and len(v) == c.num_hidden_layers and all(x in (0, 1) for x in v),
                       "absent (SmolLM3: one 0 or 1 per layer, 0 where the layer has no RoPE)"),
    "no_rope_layer_interval": (lambda v, c: c.model_type == "smollm3" and _is_int(v) and v >= 1,
                               "absent (SmolLM3: an int >= 1, every n-th layer without RoPE)"),
    # sliding windows: LlamaConfig.layer_windows (_layer_windows)
    **{key: (lambda v, c, key=key: _layer_windows(c)[1] != key, _WINDOWS)
       for key in ("sliding_window", "use_sliding_window", "max_window_layers", "layer_types")},
    "rope_interleaved": (lambda v, c: v in (False, None), "false (half-split RoPE pairs, as transformers)"),
    "pruned_heads": (lambda v, c: not v, "{} (no pruned heads)"),
    "is_encoder_decoder": (lambda v, c: not v, "false"),
    "add_cross_attention": (lambda v, c: not v, "false"),
    "quantization_config": (lambda v, c: v is None or (c.model_type == "gpt_oss" and _mxfp4(v)) or fp8_config(v)
                            or (c.model_type == "bitnet" and bitnet_config(v))
                            or compressed_config(v) or _check_gptq_awq(v) or gptq_awq_config(v),
                            "null (float weights), fp8 (float8 weights with weight_scale_inv per block or tensor, "
                            "dequantised on loading: quant_method 'fp8', fmt 'e4m3', activation_scheme 'dynamic' or "
                            "'static', weight_block_size null or [rows, columns], scale_fmt 'float' or 'ue8m0', "
                            "expert_dtype 'fp8'), compressed-tensors (quant_method 'compressed-tensors': FP8, INT8, "
                            "packed INT1-8, NVFP4 and MXFP4 weights, dequantised on loading), GPTQ (quant_method "
                            "'gptq': 2, 4 or 8 bits, checkpoint_format 'gptq' or 'gptq_v2') or AWQ (quant_method "
                            "'awq': 4 bits, version 'gemm', zero points), dequantised on loading, or, for GPT-OSS, "
                            "OpenAI's MXFP4 experts (dequantised on loading), for BitNet its ternary linear layers "
                            "(quant_method 'bitnet': linear_class 'bitlinear' offline, or 'autobitlinear' offline or "
                            "online, without use_rms_norm, modules_to_not_convert null or ['lm_head']); "
                            "other quantised HF checkpoints are not read, GGUF files are"),
    # Microsoft's Phi-3 configs name the modeling code that transformers took in as Phi3ForCausalLM: transformers
    # reads them with its own (without trust_remote_code), as here
    "auto_map": (lambda v, c: not v or (c.model_type == "phi3" and isinstance(v, dict) and set(v.values()) <= {
        "configuration_phi3.Phi3Config", "modeling_phi3.Phi3ForCausalLM"}) or (
        c.model_type in _DEEPSEEKS and isinstance(v, dict) and set(v.values()) <= _DEEPSEEK_AUTO_MAP) or (
        c.model_type == "minimax_m2" and isinstance(v, dict) and set(v.values()) <= {
            "configuration_minimax_m2.MiniMaxM2Config", "modeling_minimax_m2.MiniMaxM2ForCausalLM"}) or (
        c.model_type in _OWN_CODE and isinstance(v, dict) and set(v.values()) <= _OWN_CODE[c.model_type]),
        "absent (the checkpoint ships its own modeling code; Phi-3's naming Phi3Config / Phi3ForCausalLM only, "
        "DeepSeek's naming its DeepseekV2 / V3 Config, Model, ForCausalLM, MiniMax-M2's its MiniMaxM2Config / "
        "MiniMaxM2ForCausalLM, InternLM3's, IQuest-Coder's and AFMoE's their Config, Model, ForCausalLM, which "
        "transformers reads as its own)"),
    # transformers reads it for llama3, yarn and longrope RoPE only (from_dict moves it into rope_scaling then)
    "original_max_position_embeddings": (
        lambda v, c: c.rope_type not in ("llama3", "yarn", "longrope")
        or v == c.rope_scaling["original_max_position_embeddings"],
        "the rope_scaling value (llama3 / yarn / longrope RoPE)"),
}


def _per_layer(v, ok) -> bool:
    """``v`` a value ``ok`` accepts, or a non-empty list of one per layer, all equal and accepted (Hunyuan's keys that
    may be per layer, which transformers reads only where they are one value)."""
    if isinstance(v, list):
        return bool(v) and all(x == v[0] for x in v) and ok(v[0])
    return ok(v)


def _first(v):
    """A per-layer key's one value (:func:`_per_layer`)."""
    return v[0] if isinstance(v, list) else v


def _add_checks(checks: dict) -> None:
    """New keys' checks into ``_HARMLESS_ONLY_AT``; a key it has already raises (a second family's values of a key go
    through :func:`_also`: replacing its check would refuse the first family's)."""
    taken = sorted(set(checks) & set(_HARMLESS_ONLY_AT))
    if taken:
        raise RuntimeError(f"config checks for {taken} exist already: add a family's values with _also")
    _HARMLESS_ONLY_AT.update(checks)


# Qwen3-Next's and Qwen3.5's gated DeltaNet keys (LlamaConfig.delta), the interval its configs' layer_types come from,
# its attention's output gate (always on: attn_output_gate), its multi-token prediction layers (not read: the
# checkpoints' mtp.* weights are dropped, as transformers drops them)
_QWEN_DELTAS = ("qwen3_5_text", "qwen3_next", "qwen3_5_moe_text")
_add_checks({
    **{key: (lambda v, c, key=key: c.model_type in _DELTA_FAMILIES and _is_int(v) and v >= 1
             or c.model_type == "olmo_hybrid" and v is None and key != "linear_conv_kernel_dim",
             "absent (Qwen3-Next, Qwen3.5, OLMo Hybrid: an int >= 1; OLMo Hybrid's widths: null, its default)")
       for key in _DELTA_DEFAULTS},
    "full_attention_interval": (lambda v, c: c.model_type in _QWEN_DELTAS and _is_int(v) and v >= 1,
                                "absent (Qwen3-Next, Qwen3.5: an int >= 1)"),
    "attn_output_gate": (lambda v, c: c.model_type in _QWEN_DELTAS and v is True,
                         "absent (Qwen3-Next, Qwen3.5: true, their attention's output always gated)"),
    "mtp_num_hidden_layers": (lambda v, c: c.model_type in _QWEN_DELTAS and _is_int(v) and v >= 0,
                              "absent (Qwen3-Next, Qwen3.5: an int >= 0, the multi-token prediction layers, not read)"),
    "mtp_use_dedicated_embeddings": (lambda v, c: c.model_type in _QWEN_DELTAS and isinstance(v, bool),
                                     "absent (Qwen3.5: a bool, of its multi-token prediction layers, not read)"),
    # OLMo Hybrid's: beta doubled (LlamaConfig.delta's beta_scale); its DeltaNet's initialisation ranges, not read
    "linear_allow_neg_eigval": (lambda v, c: c.model_type == "olmo_hybrid" and isinstance(v, bool),
                                "absent (OLMo Hybrid: a bool)"),
    # (OLMo Hybrid's NoPE mode, rope_parameters' rope_theta null: read into this, LlamaConfig.rope_layers)
    "no_rope": (lambda v, c: c.model_type == "olmo_hybrid" and v is True, "absent (OLMo Hybrid's NoPE: true)"),
    **{key: (lambda v, c: c.model_type == "olmo_hybrid" and _is_number(v), "absent (OLMo Hybrid: a number, init only)")
       for key in ("linear_a_log_min", "linear_a_log_max", "linear_dt_min", "linear_dt_max", "linear_dt_init_floor")},
})


# LFM2's keys (LlamaConfig.conv_layers, conv_kernel, conv_bias, dense_intermediate_size) and its hub configs' older
# ones, which Lfm2Config does not read: the same widths again, init settings
_add_checks({
    "conv_L_cache": (lambda v, c: c.model_type in _LFM2S and _is_int(v) and v >= 1,
                     "absent (LFM2: an int >= 1, the convolution's taps)"),
    "conv_bias": (lambda v, c: c.model_type in _LFM2S and isinstance(v, bool), "absent (LFM2: a bool)"),
    "use_expert_bias": (lambda v, c: c.model_type == "lfm2_moe" and isinstance(v, bool), "absent (LFM2-MoE: a bool)"),

    "full_attn_idxs": (lambda v, c: c.model_type == "lfm2" and (v is None or isinstance(v, list) and all(
        _is_int(i) and 0 <= i < c.num_hidden_layers for i in v)) and (_lfm2_conv_layers(c) is not None or not (
            isinstance(types := c.extra.get("layer_types"), list) and len(types) == c.num_hidden_layers
            and set(types) <= {"conv", "full_attention"})),
        "absent (LFM2: null or a list of layer indices, the attention layers; with layer_types, theirs)"),
    "block_multiple_of": (lambda v, c: c.model_type == "lfm2" and _is_int(v) and v >= 1,
                          "absent (LFM2: an int >= 1)"),
    "block_ffn_dim_multiplier": (lambda v, c: c.model_type == "lfm2" and (v is None or _is_number(v) and v > 0),
                                 "absent (LFM2: null or a number > 0)"),
    "block_auto_adjust_ff_dim": (lambda v, c: c.model_type == "lfm2" and isinstance(v, bool), "absent (LFM2: a bool)"),
    **{key: (lambda v, c: c.model_type == "lfm2" and v == c.hidden_size, "absent (LFM2: hidden_size, not read)")
       for key in ("block_dim", "conv_dim", "conv_dim_out")},
    "num_heads": (lambda v, c: c.model_type == "lfm2" and v == c.num_attention_heads,
                  "absent (LFM2: num_attention_heads, not read)"),
    "theta": (lambda v, c: c.model_type == "lfm2" and v == c.rope_theta, "absent (LFM2: rope_theta, not read)"),
    **{key: (lambda v, c: c.model_type == "lfm2" and v is True, "absent (LFM2: true, not read)")
       for key in ("block_use_swiglu", "use_pos_enc")},
    **{key: (lambda v, c: c.model_type == "lfm2" and (v is None or isinstance(v, bool) or _is_number(v)),
             "absent (LFM2: a number or a bool, an initialisation's, not read)")
       for key in ("block_norm_eps", "block_mlp_init_scale", "block_out_init_scale", "block_use_xavier_init",
                   "conv_use_xavier_init")}})


def _mamba2_keys(d: dict) -> None:
    """A Mamba2Config's keys in ``d`` under the model's names, in place (:data:`_MAMBA2_NAMES`); its attention fields
    (none: the model's placeholders, one head of hidden_size) and its MLP's (none) refused."""
    for key in ("num_attention_heads", "num_key_value_heads", "intermediate_size", "rms_norm_eps", "mamba_n_heads",
                "mamba_d_head"):
        if key in d:
            raise ValueError(f"config key {key!r} is not Mamba2Config's (its names: {sorted(_MAMBA2_NAMES)})")
    _own_names(d, _MAMBA2_NAMES, "Mamba-2")
    if d.pop("rms_norm", True) is not True:
        raise ValueError("config rms_norm = false: Mamba-2 is read with its RMSNorms only (transformers' too)")


def _kimi_linear_keys(d: dict) -> None:
    """A KimiLinearConfig's keys in ``d`` under DeepSeek's names, in place (:data:`_KIMI_NAMES`); its checkpoints'
    ``linear_attn_config`` (``head_dim``, ``num_heads``, ``short_conv_kernel_size``, the 1-based ``full_attn_layers``
    and ``kda_layers``) as ``linear_*`` and ``layer_types``, as KimiLinearConfig reads it (its other keys refused)."""
    _own_names(d, _KIMI_NAMES, "Kimi Linear")
    lac = d.pop("linear_attn_config", None)
    if lac is None:
        return
    names = {"head_dim": "linear_head_dim", "num_heads": "linear_num_heads",
             "short_conv_kernel_size": "linear_conv_kernel_dim"}
    if not isinstance(lac, dict) or set(lac) - {*names, "full_attn_layers", "kda_layers"}:
        raise ValueError(f"config linear_attn_config = {lac!r}: Kimi Linear reads a dict of "
                         f"{sorted(names)}, full_attn_layers and kda_layers only")
    for key, ours in names.items():
        if key in lac:
            if d.get(ours, lac[key]) != lac[key]:
                raise ValueError(f"config {ours} = {d[ours]!r} and linear_attn_config's {key} = {lac[key]!r} "
                                 "disagree; keep one")
            d[ours] = lac[key]
    n = d.get("num_hidden_layers", FAMILIES["kimi_linear"].defaults["num_hidden_layers"])
    full, kda = lac.get("full_attn_layers"), lac.get("kda_layers")
    if d.get("layer_types") is None and full is not None and kda is not None:
        if not (isinstance(full, list) and isinstance(kda, list) and sorted(full + kda) == list(range(1, n + 1))):
            raise ValueError(f"config linear_attn_config's full_attn_layers {full!r} and kda_layers {kda!r} must "
                             f"number each of the {n} layers once, from 1")
        d["layer_types"] = ["full_attention" if i + 1 in full else "linear_attention" for i in range(n)]


def _mamba1_keys(d: dict) -> None:
    """A MambaConfig's keys in ``d`` under the model's names, in place (:data:`_MAMBA1_NAMES`); its
    ``intermediate_size`` (expand x hidden_size, which MambaConfig computes) checked and dropped; attention fields
    refused (none: the model's placeholders)."""
    for key in ("num_attention_heads", "num_key_value_heads", "rms_norm_eps"):
        if key in d:
            raise ValueError(f"config key {key!r} is not MambaConfig's (its names: {sorted(_MAMBA1_NAMES)})")
    _own_names(d, _MAMBA1_NAMES, "Mamba")
    inner = d.pop("intermediate_size", None)
    expected = d.get("mamba_expand", 2) * d.get("hidden_size", FAMILIES["mamba"].defaults["hidden_size"])
    if inner is not None and inner != expected:
        raise ValueError(f"config intermediate_size = {inner!r}: Mamba's is expand x hidden_size ({expected})")
    if d.get("hidden_act", "silu") != "silu":
        raise ValueError(f"config hidden_act = {d['hidden_act']!r}: Mamba's mixer is read with SiLU only")
    d.pop("hidden_act", None)


def _nemotron_h_keys(d: dict) -> None:
    """A NemotronHConfig's keys in ``d`` under the model's names, in place (:data:`_NEMOTRON_H_NAMES`; its ``mamba_*``
    aliases are the model's names already); its ``hybrid_override_pattern`` (M / * / - / E per layer) as
    ``layers_block_type`` (which wins where both are given, as NemotronHConfig reads them; ``layer_types`` its
    alias); blocks other than Mamba, attention and MLP (its mixtures') raise."""
    for key in ("mamba_proj_bias", "attention_bias"):  # (NemotronHConfig's keys its model does not read: use_bias
        unread = d.pop(key, None)  # is its Mamba projections' bias; its attention is unbiased)
        if unread not in (None, False, True):
            raise ValueError(f"config {key} = {unread!r} must be a bool (Nemotron-H does not read it)")
    _own_names(d, {**_NEMOTRON_H_NAMES, "layer_types": "layers_block_type"}, "Nemotron-H")
    pattern = d.pop("hybrid_override_pattern", None)
    if d.get("layers_block_type") is None:
        if pattern is not None:
            if not isinstance(pattern, str) or set(pattern) - set(_NEMOTRON_H_BLOCKS):
                raise ValueError(f"config hybrid_override_pattern = {pattern!r}: one of M, *, -, E per layer")
            d["layers_block_type"] = [_NEMOTRON_H_BLOCKS[c] for c in pattern]
        else:
            d["layers_block_type"] = ["linear_attention", "moe", "full_attention", "mlp"]  # (NemotronHConfig's)
    types = d["layers_block_type"]
    if not isinstance(types, list) or set(types) - {"linear_attention", "full_attention", "mlp", "moe", "mamba",
                                                     "attention"}:
        raise ValueError(f"config layers_block_type = {types!r}: Nemotron-H's blocks are 'linear_attention', "
                         "'full_attention', 'mlp' and 'moe'")
    d["layers_block_type"] = [{"mamba": "linear_attention", "attention": "full_attention"}.get(t, t) for t in types]
    d.setdefault("num_hidden_layers", len(d["layers_block_type"]))


def _delta_layer_types(c: "LlamaConfig") -> list | None:
    """Qwen3-Next's / Qwen3.5's layer types as their configs read them: ``layer_types`` (``"linear_attention"`` or
    ``"full_attention"`` each), by default every ``full_attention_interval``-th (4) layer attention, the others gated
    DeltaNet; None where the key says something else."""
    n, x = c.num_hidden_layers, c.extra
    types = x.get("layer_types")
    if types is None and c.model_type == "olmo_hybrid":  # (every fourth attention, else the last)
        types = ["full_attention" if i % 4 == 3 or (n < 4 and i == n - 1) else "linear_attention" for i in range(n)]
    if types is None and c.model_type == "kimi_linear":  # (KimiLinearConfig's: layers 4, 8, ... attention)
        types = ["full_attention" if i and i % 4 == 0 else "linear_attention" for i in range(n)]
    if types is None:
        every = x.get("full_attention_interval", 4)
        return None if not (_is_int(every) and every >= 1) else [
            "linear_attention" if (i + 1) % every else "full_attention" for i in range(n)]
    if isinstance(types, list) and len(types) == n and set(types) <= {"linear_attention", "full_attention"}:
        return types
    return None


def _lfm3_layer_types(c: "LlamaConfig") -> list | None:
    """LFM3's layer types as Lfm3Config reads them: ``layer_types`` (``"conv"``, ``"full_attention"`` or
    ``"sliding_attention"`` each), by default every fourth layer from 2 full, every fourth from 4 sliding, the others
    convolutions; None where the key says something else."""
    n, types = c.num_hidden_layers, c.extra.get("layer_types")
    if types is None:
        return ["full_attention" if i % 4 == 2 else "sliding_attention" if i % 4 == 0 and i > 0 else "conv"
                for i in range(n)]
    ok = isinstance(types, list) and len(types) == n and set(types) <= {"conv", "full_attention", "sliding_attention"}
    return types if ok else None


def _lfm2_conv_layers(c: "LlamaConfig") -> tuple | None:
    """LFM2's convolution layers, a bool per layer, as Lfm2Config reads its keys: ``layer_types`` (``"conv"`` or
    ``"full_attention"`` each), else every layer not in ``full_attn_idxs``, else none; None where the keys say
    something else."""
    n, x = c.num_hidden_layers, c.extra
    types, idxs = x.get("layer_types"), x.get("full_attn_idxs") if c.model_type == "lfm2" else None
    if c.model_type == "lfm2_moe" and types is None:  # (Lfm2MoeConfig has no default: its model indexes them)
        return None
    if c.model_type == "lfm3":  # (its sliding layers too; by default Lfm3Config's pattern)
        types = _lfm3_layer_types(c)
        return None if types is None else tuple(t == "conv" for t in types)
    if types is not None:
        if not (isinstance(types, list) and len(types) == n and set(types) <= {"conv", "full_attention"}):
            return None
        if idxs is not None and (not isinstance(idxs, list) or sorted(idxs) != [
                i for i, t in enumerate(types) if t == "full_attention"]):
            return None  # (both given: they must agree; Lfm2Config reads layer_types)
        return tuple(t == "conv" for t in types)
    if idxs is None:
        return (False,) * n
    if not (isinstance(idxs, list) and all(_is_int(i) and 0 <= i < n for i in idxs)):
        return None
    return tuple(i not in idxs for i in range(n))


# Hunyuan's config.json keys (its checkpoints' remote code and transformers' HunYuan classes): what the model reads
# and the values where its keys are harmless
_HUNYUAN_IDS = ("eod_token_id", "pad_id", "im_start_id", "im_end_id", "im_newline_id", "mask_init_id", "text_start_id",
                "text_end_id")
_add_checks({
    # cross-layer attention (keys shared by layers) is Hunyuan-Large's, off in these models
    "use_cla": (lambda v, c: c.model_type in _HUNYUANS and v in (False, None), "absent (Hunyuan: false)"),
    "cla_share_factor": (lambda v, c: c.model_type in _HUNYUANS and (v is None or _is_int(v)),
                         "absent (Hunyuan: an int, read only with use_cla, which must be false)"),
    "use_rotary_pos_emb": (lambda v, c: c.model_type in _HUNYUANS and v is True, "absent (Hunyuan: true)"),
    "norm_type": (lambda v, c: c.model_type in _HUNYUANS and v == "rms", "absent (Hunyuan: 'rms')"),
    "attention_head_dim": (lambda v, c: c.model_type in _HUNYUANS and v == c.head_dim,
                           "absent (Hunyuan: head_dim's value)"),
    # a classification head on the last token (reward models): not the language model's
    "add_classification_head": (lambda v, c: c.model_type in _HUNYUANS and v in (False, None),
                                "absent (Hunyuan: false)"),
    **{key: (lambda v, c: c.model_type in _HUNYUANS and not c.extra.get("add_classification_head"),
             "absent (Hunyuan without add_classification_head: any, not read)")
       for key in ("class_num", "pool_type", "dense_list")},
    "org_vocab_size": (lambda v, c: c.model_type in _HUNYUANS and _is_int(v), "absent (Hunyuan: an int, not read)"),
    **{key: (lambda v, c: c.model_type in _HUNYUANS and (v is None or _is_int(v)),
             "absent (Hunyuan: a token id, not read)") for key in _HUNYUAN_IDS},
    # the mixture (LlamaConfig.experts): one value per model, transformers' shared expert (use_mixed_mlp_moe, one
    # of intermediate_size) and experts of intermediate_size
    "moe_topk": (lambda v, c: c.model_type == "hunyuan_v1_moe" and _per_layer(v, lambda x: _is_int(x) and x >= 1),
                 "absent (Hunyuan MoE: an int >= 1, or one per layer, all equal)"),
    "num_shared_expert": (lambda v, c: c.model_type == "hunyuan_v1_moe" and _per_layer(v, lambda x: x == 1),
                          "absent (Hunyuan MoE: 1, or 1 per layer)"),
    "use_mixed_mlp_moe": (lambda v, c: c.model_type == "hunyuan_v1_moe" and v is True,
                          "absent (Hunyuan MoE: true, its shared expert)"),
    # token dropping beyond an expert's capacity: training only
    **{key: (lambda v, c: c.model_type == "hunyuan_v1_moe" and v is False, "absent (Hunyuan MoE: false)")
       for key in ("moe_drop_tokens", "moe_random_routing_dropped_token", "group_limited_greedy")},
    "capacity_factor": (lambda v, c: c.model_type == "hunyuan_v1_moe" and (v is None or _is_number(v)),
                        "absent (Hunyuan MoE: a number, read only with moe_drop_tokens)"),
    "moe_layer_num_skipped": (lambda v, c: c.model_type == "hunyuan_v1_moe" and v == 0,
                              "absent (Hunyuan MoE: 0, every layer sparse)"),
    "use_mla": (lambda v, c: c.model_type in _HUNYUANS and v in (False, None), "absent (Hunyuan: false)"),
})


def _also(key: str, ok, what: str) -> None:
    """``_HARMLESS_ONLY_AT[key]`` accepting what ``ok(v, c)`` accepts too (described by ``what``)."""
    old, text = _HARMLESS_ONLY_AT[key]
    _HARMLESS_ONLY_AT[key] = (lambda v, c: old(v, c) or ok(v, c), f"{text}; {what}")


_also("use_qk_norm", lambda v, c: c.model_type in _HUNYUANS and v is True, "Hunyuan: true")
# Llama 4's keys (LlamaConfig.experts, rope_layers, layer_chunks, l2_qk_norm, nope_temperature; its layer_types:
# _layer_windows)
_also("use_qk_norm", lambda v, c: c.model_type == "llama4_text" and isinstance(v, bool),
      "Llama 4: a bool, its q/k L2 norms on the RoPE layers")
for _key in ("num_local_experts", "num_experts_per_tok"):  # (MobileLLM-R1's: 0 experts, no mixture layer)
    _also(_key, lambda v, c: c.model_type == "llama4_text" and _is_int(v) and v >= (0 if c.experts is None else 1),
          "Llama 4: an int >= 1 (0 where no layer is a mixture: MobileLLM-R1's)")
_also("no_rope_layers", lambda v, c: c.model_type == "llama4_text" and (
    v is None or isinstance(v, list) and (not v or len(v) >= c.num_hidden_layers and all(
        x in (0, 1) for x in v))), "Llama 4: null, [] or a 0 or 1 per layer (at least one per layer; 1: RoPE)")
_also("no_rope_layer_interval", lambda v, c: c.model_type == "llama4_text" and _is_int(v) and v >= 1,
      "Llama 4: an int >= 1 (every n-th layer NoPE, where no_rope_layers is empty)")
_also("router_jitter_noise", lambda v, c: c.model_type == "llama4_text" and _is_number(v) and v >= 0,
      "Llama 4: a number >= 0 (its router does not read it)")
for _key, _lo in (("moe_num_experts", 1), ("moe_topk", 1), ("moe_num_shared_experts", 0)):  # Aria's mixture
    _also(_key, lambda v, c, lo=_lo: c.model_type == "aria_text" and _is_int(v) and v >= lo, f"Aria: an int >= {_lo}")
_add_checks({
    "intermediate_size_mlp": (lambda v, c: c.model_type == "llama4_text" and _is_int(v) and v >= 1,
                              "absent (Llama 4: an int >= 1, the dense layers' MLP width)"),
    "moe_layers": (lambda v, c: c.model_type == "llama4_text" and (v is None or isinstance(v, list) and all(
        _is_int(x) and 0 <= x < c.num_hidden_layers for x in v) and len(set(v)) == len(v)),
                   "absent (Llama 4: null or distinct layer indices, the mixtures' layers)"),
    "interleave_moe_layer_step": (lambda v, c: c.model_type == "llama4_text" and _is_int(v) and (
        v >= 1 or v == 0 and c.extra.get("moe_layers") is not None),
        "absent (Llama 4: an int >= 1, every n-th layer a mixture where moe_layers is null; 0 with moe_layers)"),
    "attention_chunk_size": (lambda v, c: c.model_type == "llama4_text" and _is_int(v) and v >= 1,
                             "absent (Llama 4: an int >= 1, the RoPE layers' chunks of positions)"),
    "attn_temperature_tuning": (lambda v, c: c.model_type == "llama4_text" and isinstance(v, bool),
                                "absent (Llama 4: a bool, the NoPE layers' query temperature)"),
    "floor_scale": (lambda v, c: c.model_type == "llama4_text" and _is_number(v) and 0 < v < float("inf"),
                    "absent (Llama 4: a finite number > 0, the temperature's step in positions)"),
    "attn_scale": (lambda v, c: c.model_type == "llama4_text" and _is_number(v) and abs(v) < float("inf"),
                   "absent (Llama 4: a finite number, the temperature's factor)"),
})
# ModernBERT decoder's (its norms' and heads' biases: LlamaConfig.torch_layer_norm, head_bias, head_transform_bias; its
# prediction head's GELU; its window's key, local_attention // 2; its dropouts, training only; its initialisation)
for _key in ("attention_dropout", "classifier_dropout", "embedding_dropout"):  # (others' keys too)
    _also(_key, lambda v, c: c.model_type == "modernbert-decoder" and _is_number(v) and 0 <= v < 1,
          "ModernBERT decoder: any in [0, 1), training only")
_add_checks({
    "mlp_dropout": (lambda v, c: c.model_type == "modernbert-decoder" and _is_number(v) and 0 <= v < 1,
                    "absent (ModernBERT decoder: any in [0, 1), training only)"),
    **{key: (lambda v, c: c.model_type == "modernbert-decoder" and isinstance(v, bool),
             "absent (ModernBERT decoder: a bool)") for key in ("decoder_bias", "classifier_bias", "norm_bias")},
    "classifier_activation": (lambda v, c: c.model_type == "modernbert-decoder" and v == "gelu",
                              "absent (ModernBERT decoder: 'gelu', its prediction head's exact GELU)"),
    "local_attention": (lambda v, c: c.model_type == "modernbert-decoder" and _is_int(v) and v >= 2,
                        "absent (ModernBERT decoder: an int >= 2, its sliding layers' window twice over)"),
    "initializer_cutoff_factor": (lambda v, c: c.model_type == "modernbert-decoder" and _is_number(v),
                                  "absent (ModernBERT decoder: a number, its initialisation's)"),
    "cls_token_id": (lambda v, c: c.model_type == "modernbert-decoder" and (v is None or _is_int(v)),
                     "absent (ModernBERT decoder: an id, not read)")})
_also("attention_dropout", lambda v, c: c.model_type in ("starcoder2", "stablelm") and _is_number(v) and 0 <= v < 1,
      "StarCoder 2, StableLM: any in [0, 1), as their configs may ship 0.1 (training only)")
_also("attention_dropout", lambda v, c: c.model_type in _HUNYUANS and _is_number(v) and 0 <= v < 1,
      "Hunyuan: any in [0, 1), as its configs ship 0.1")
# BLOOM's (LlamaConfig.alibi_slopes; its dropouts, training only; Megatron-DeepSpeed's kernel fusions and tensor
# parallel slices, the same math; its keys that transformers' BloomModel does not read)
_also("hidden_dropout", lambda v, c: c.model_type == "bloom" and _is_number(v) and 0 <= v < 1,
      "BLOOM: any in [0, 1), training only")
_also("attention_dropout", lambda v, c: c.model_type == "bloom" and _is_number(v) and 0 <= v < 1,
      "BLOOM: any in [0, 1), training only")
_also("apply_residual_connection_post_layernorm", lambda v, c: c.model_type == "bloom" and v is False,
      "BLOOM: false (the residual from the normed input, true, is not implemented)")
_also("attention_softmax_in_fp32", lambda v, c: c.model_type == "bloom" and isinstance(v, bool),
      "BLOOM: a bool, the softmax in float32 either way")
_add_checks({
    **{key: (lambda v, c: c.model_type == "bloom" and isinstance(v, bool),
             "absent (BLOOM: a bool, Megatron-DeepSpeed's kernels' choice or tensor-parallel slices: the same math)")
       for key in ("slow_but_exact", "masked_softmax_fusion", "bias_dropout_fusion", "skip_bias_add",
                   "skip_bias_add_qkv")},
    "offset_alibi": (lambda v, c: c.model_type == "bloom" and _is_int(v), "absent (BLOOM: an int, not read)"),
    "n_inner": (lambda v, c: c.model_type == "bloom" and v in (None, 4 * c.hidden_size),
                "absent (BLOOM: null or 4 x hidden_size, its MLP's width whatever it says)")})
# MPT's (its attn_config's read keys, in extra: LlamaConfig.clip_qkv, attention_scale; its dropouts and
# initialisation, training only; the keys transformers' MptModel does not read, at the values it computes)
_also("clip_qkv", lambda v, c: c.model_type == "mpt" and _is_number(v) and 0 < v < float("inf"),
      "MPT: attn_config's, a number > 0")
_also("emb_pdrop", lambda v, c: c.model_type == "mpt" and _is_number(v) and 0 <= v < 1, "MPT: in [0, 1)")
_also("resid_pdrop", lambda v, c: c.model_type == "mpt" and _is_number(v) and 0 <= v < 1, "MPT: in [0, 1)")
_also("norm_type", lambda v, c: c.model_type == "mpt" and v in ("low_precision_layernorm", "layernorm"),
      "MPT: 'low_precision_layernorm' or 'layernorm' (torch's LayerNorm in the dtype)")
_also("logit_scale", lambda v, c: c.model_type == "mpt" and v is None,
      "MPT: null (transformers' MPT does not scale its logits; MosaicML's code would)")
_add_checks({
    "softmax_scale": (lambda v, c: c.model_type == "mpt" and _is_number(v) and 0 < v < float("inf"),
                      "absent (MPT: attn_config's, a number > 0)"),
    "expansion_ratio": (lambda v, c: c.model_type == "mpt" and v == 4,
                        "absent (MPT: 4; transformers' MptMLP is 4 x d_model whatever it says)"),
    "no_bias": (lambda v, c: c.model_type == "mpt" and v is True,
                "absent (MPT: true; transformers' MPT has no biases)"),
    "learned_pos_emb": (lambda v, c: c.model_type == "mpt" and isinstance(v, bool),
                        "absent (MPT: a bool, not read: ALiBi, no position embeddings)"),
    "embedding_fraction": (lambda v, c: c.model_type == "mpt" and _is_number(v),
                           "absent (MPT: a number, its embeddings' gradient scale: training only)"),
    "init_device": (lambda v, c: c.model_type == "mpt" and isinstance(v, str), "absent (MPT: a device name)"),
    "init_config": (lambda v, c: c.model_type == "mpt" and isinstance(v, dict),
                    "absent (MPT: its initialisation's settings)"),
    "tokenizer_name": (lambda v, c: c.model_type == "mpt" and isinstance(v, str), "absent (MPT: a name)"),
    "verbose": (lambda v, c: c.model_type == "mpt" and _is_int(v), "absent (MPT: an int)")})
_also("num_experts", lambda v, c: (c.model_type == "hunyuan_v1_moe" and _per_layer(v, lambda x: _is_int(x) and x >= 1))
      or (c.model_type == "hunyuan_v1_dense" and v == 1), "Hunyuan MoE: an int >= 1 (or one per layer, all equal); "
      "dense Hunyuan: 1")
_also("moe_intermediate_size", lambda v, c: c.model_type == "hunyuan_v1_moe" and _per_layer(
    v, lambda x: x == c.intermediate_size), "Hunyuan MoE: intermediate_size (or it per layer), its experts' width")
_also("norm_topk_prob", lambda v, c: c.model_type == "hunyuan_v1_moe" and v is True, "Hunyuan MoE: true")
_also("routed_scaling_factor", lambda v, c: c.model_type == "hunyuan_v1_moe" and v == 1, "Hunyuan MoE: 1.0")
for _key in (*_MLA_DIMS, "q_lora_rank", "n_group", "topk_group"):
    _also(_key, lambda v, c: c.model_type in _HUNYUANS and v is None, "Hunyuan: null")
# AFMoE's mixture and layers (LlamaConfig.experts, layer_windows, rope_layers, embedding_multiplier; the counts checked
# together in LlamaConfig._check_afmoe)
for _key in ("moe_intermediate_size", "num_experts", "num_experts_per_tok"):
    _also(_key, lambda v, c: c.model_type == "afmoe" and _is_int(v) and v >= 1, "AFMoE: an int >= 1")
# Kolibri-1's, Flint's, Hunyuan V3's, Laguna's, Mellum's and Cohere 2 MoE's mixtures (LlamaConfig.experts): per
# family, its mixture's int keys (each >= 1; the count under either
# name where transformers reads both), whether its config has norm_topk_prob (a bool), its shared expert's width key
# (an int >= 0) and its dense / sparse layer list (one per layer)
_NEW_MOES = {  # family -> (int keys, norm_topk_prob, shared width key, mlp_layer_types)
    "kolibri1": (("moe_intermediate_size", "num_experts", "num_local_experts", "num_experts_per_tok"), True,
                 "shared_expert_intermediate_size", False),
    "flint": (("moe_intermediate_size", "num_experts", "num_local_experts", "num_experts_per_tok"), True,
              "shared_expert_intermediate_size", False),
    "hy_v3": (("moe_intermediate_size", "num_experts", "num_local_experts", "num_experts_per_tok"), False,
              "num_shared_experts", True),
    "laguna": (("moe_intermediate_size", "num_experts", "num_experts_per_tok"), False,
               "shared_expert_intermediate_size", True),
    "mellum": (("moe_intermediate_size", "num_experts", "num_local_experts", "num_experts_per_tok"), True, None, True),
    "cohere2_moe": (("num_experts", "num_experts_per_tok"), True, "num_shared_experts", True)}
for _key in ("moe_intermediate_size", "num_experts", "num_local_experts", "num_experts_per_tok"):
    _also(_key, lambda v, c, key=_key: key in _NEW_MOES.get(c.model_type, ((),))[0] and _is_int(v) and v >= 1,
          "Kolibri-1, Flint, Hunyuan V3, Laguna, Mellum, Cohere 2 MoE: an int >= 1")
_also("norm_topk_prob", lambda v, c: _NEW_MOES.get(c.model_type, (0, False))[1] and isinstance(v, bool),
      "Kolibri-1, Flint, Mellum, Cohere 2 MoE: a bool")
for _key in ("shared_expert_intermediate_size", "num_shared_experts"):
    _also(_key, lambda v, c, key=_key: _NEW_MOES.get(c.model_type, (0, 0, None))[2] == key and _is_int(v) and v >= 0,
          "Kolibri-1, Flint, Laguna: an int >= 0, the ungated shared expert's width; Hunyuan V3, Cohere 2 MoE: the "
          "shared experts' count")
_also("mlp_layer_types", lambda v, c: _NEW_MOES.get(c.model_type, (0, 0, 0, False))[3] and (
    v is None or isinstance(v, list) and len(v) == c.num_hidden_layers and set(v) <= {"dense", "sparse"}),
    "Hunyuan V3, Laguna, Mellum, Cohere 2 MoE: one 'dense' or 'sparse' per layer")
_also("decoder_sparse_step", lambda v, c: c.model_type == "flint" and _is_int(v) and v >= 1, "Flint: an int >= 1")
# Laguna's attention and router (LlamaConfig.layer_heads, softplus_gate, experts)
_add_checks({
    "gating": (lambda v, c: c.model_type == "laguna" and (isinstance(v, bool) or v in ("per-head", "per-element")),
               "absent (Laguna: a bool, 'per-head' or 'per-element', its output gate's granularity)"),
    "num_attention_heads_per_layer": (lambda v, c: c.model_type == "laguna" and (
        v is None or isinstance(v, list) and len(v) == c.num_hidden_layers
        and all(_is_int(h) and h >= 1 and h % c.num_key_value_heads == 0 for h in v)),
        "absent (Laguna: one query head count per layer, each a multiple of num_key_value_heads)"),
    "moe_routed_scaling_factor": (lambda v, c: c.model_type == "laguna" and _is_number(v) and 0 < v < float("inf"),
                                  "absent (Laguna: a finite number > 0)"),
    "moe_router_logit_softcapping": (lambda v, c: c.model_type == "laguna" and _is_number(v) and 0 <= v < float("inf"),
                                     "absent (Laguna: a number >= 0, 0 none)"),
    "moe_apply_router_weight_on_input": (lambda v, c: c.model_type == "laguna" and v is False,
                                         "absent (Laguna: false; transformers refuses true)")})
# MiMo-V2-Flash's values (LlamaConfig.value_head_dim, value_scale) and its checkpoints' window (_layer_windows)
_add_checks({
    "attention_value_scale": (lambda v, c: c.model_type == "mimo_v2_flash" and (
        v is None or _is_number(v) and 0 < abs(v) < float("inf")),
        "absent (MiMo-V2-Flash: null or a finite nonzero number, the values' factor)"),
    "sliding_window_size": (lambda v, c: c.model_type == "mimo_v2_flash"
                            and _layer_windows(c)[1] != "sliding_window_size",
                            "absent (MiMo-V2-Flash: an int >= 0, the keys a sliding layer sees before a query's own)")})
# Mellum 2's multi-token prediction head's keys (not part of the forward: its weights are skipped)
_add_checks({
    **{key: (lambda v, c: c.model_type == "mellum" and (v is None or isinstance(v, list)),
             "absent (Mellum: its prediction head's, null or a list)") for key in ("mtp_layer_types",
                                                                                  "mtp_mlp_layer_types")}})
_also("num_nextn_predict_layers", lambda v, c: c.model_type == "mellum" and (v is None or v in (0, 1)),
      "Mellum: null, 0 or 1 (its prediction head, not run)")
# Cohere 2 MoE's layers and mixture (LlamaConfig.experts, layer_windows, rope_layers, layer_norm,
# dense_intermediate_size)
_also("first_k_dense_replace", lambda v, c: c.model_type == "cohere2_moe" and _is_int(v)
      and 0 <= v <= c.num_hidden_layers, "Cohere 2 MoE: an int in [0, num_hidden_layers], its dense prefix")
_add_checks({
    "shared_expert_combination_strategy": (lambda v, c: c.model_type == "cohere2_moe" and v in ("sum", "average"),
                                           "absent (Cohere 2 MoE: 'sum' or 'average')"),
    "expert_selection_fn": (lambda v, c: c.model_type == "cohere2_moe" and v in ("softmax", "sigmoid"),
                            "absent (Cohere 2 MoE: 'softmax' or 'sigmoid')"),
    "prefix_dense_sliding_window_pattern": (lambda v, c: c.model_type == "cohere2_moe" and _is_int(v) and v >= 1,
                                            "absent (Cohere 2 MoE: an int >= 1)"),
    "prefix_dense_intermediate_size": (lambda v, c: c.model_type == "cohere2_moe" and (v is None or _is_int(v)
                                                                                       and v >= 1),
                                       "absent (Cohere 2 MoE: null or an int >= 1, its dense layers' width)"),
    "layer_norm_eps": (lambda v, c: c.model_type == "cohere2_moe" and _is_number(v) and 0 < v < float("inf"),
                       "absent (Cohere 2 MoE: a number > 0, beside rms_norm_eps, unread)")})
_also("layer_norm_eps", lambda v, c: c.model_type == "biogpt" and _is_number(v) and 0 < v < float("inf"),
      "BioGPT: a number > 0, unread (its LayerNorms take 1e-5)")
# Hunyuan V3's router (enable_moe_fp32_combine's float32 sum of the routed and shared outputs rounds as the dtype's
# sum of the two rounds: either value reads)
_add_checks({
    "router_scaling_factor": (lambda v, c: c.model_type == "hy_v3" and _is_number(v) and 0 < v < float("inf"),
                              "absent (Hunyuan V3: a finite number > 0, the chosen weights' factor)"),
    "enable_moe_fp32_combine": (lambda v, c: c.model_type == "hy_v3" and isinstance(v, bool),
                                "absent (Hunyuan V3: a bool)")})
_also("mlp_only_layers", lambda v, c: c.model_type == "flint" and (v is None or isinstance(v, list) and all(
    _is_int(i) and 0 <= i < c.num_hidden_layers for i in v)), "Flint: layer indices")
_also("router_jitter_noise", lambda v, c: c.model_type == "phimoe" and _is_number(v) and 0 <= v < float("inf"),
      "PhiMoE: a number >= 0, SparseMixer's jitter")
_also("num_local_experts", lambda v, c: c.model_type == "granitemoehybrid" and _is_int(v) and v >= 0,
      "Granite 4.0: an int >= 0 (0: dense)")
_also("num_experts_per_tok", lambda v, c: c.model_type == "granitemoehybrid" and _is_int(v)
      and v >= (1 if c.experts is not None else 0), "Granite 4.0: an int >= 1 (its dense checkpoints': 0 too)")
_also("shared_intermediate_size", lambda v, c: c.model_type == "granitemoehybrid" and _is_int(v) and v >= 1,
      "Granite 4.0: an int >= 1, its MLP's width")
_also("num_shared_experts", lambda v, c: c.model_type == "afmoe" and _is_int(v) and v >= 0, "AFMoE: an int >= 0")
_add_checks({
    "num_dense_layers": (lambda v, c: c.model_type == "afmoe" and _is_int(v) and 0 <= v <= c.num_hidden_layers,
                         "absent (AFMoE: an int in [0, num_hidden_layers], the dense layers before the mixture's)"),
    "global_attn_every_n_layers": (lambda v, c: c.model_type == "afmoe" and _is_int(v) and v >= 1,
                                   "absent (AFMoE: an int >= 1, every n-th layer full, the others sliding)"),
    "route_scale": (lambda v, c: c.model_type == "afmoe" and _is_number(v) and 0 < v < float("inf"),
                    "absent (AFMoE: a number > 0, the chosen experts' weights' factor)"),
    "mup_enabled": (lambda v, c: c.model_type == "afmoe" and isinstance(v, bool),
                    "absent (AFMoE: a bool, the embeddings times sqrt(hidden_size))"),
    # Arcee's own code's router settings in Trinity's configs, at the values transformers' AFMoE computes (it reads
    # none of them): renormalised sigmoid scores, one group of every expert; use_grouped_mm its kernels' choice
    "route_norm": (lambda v, c: c.model_type == "afmoe" and v is True, "absent (AFMoE: true, renormalised weights)"),
    "score_func": (lambda v, c: c.model_type == "afmoe" and v == "sigmoid", "absent (AFMoE: 'sigmoid')"),
    **{key: (lambda v, c: c.model_type == "afmoe" and v in (1, None), "absent (AFMoE: 1 or null, one group)")
       for key in ("num_expert_groups", "num_limited_groups")},
    "use_grouped_mm": (lambda v, c: c.model_type == "afmoe" and isinstance(v, bool),
                       "absent (AFMoE: a bool, its kernels' choice)"),
})
_also("num_dense_layers", lambda v, c: c.model_type == "lfm2_moe" and _is_int(v) and 0 <= v <= c.num_hidden_layers,
      "LFM2-MoE: an int in [0, num_hidden_layers], the first layers' dense MLPs")
# Nemotron-H's blocks (LlamaConfig.block_types, checked by _nemotron_h_keys), and its kernels', mixtures' and training's
# settings (its mixture blocks, 'moe', raise: none of these is read)
_also("layers_block_type", lambda v, c: c.model_type == "nemotron_h" and isinstance(v, list)
      and len(v) == c.num_hidden_layers, "Nemotron-H: one 'linear_attention' / 'full_attention' / 'mlp' per layer")
_NEMOTRON_H_UNREAD = ("n_routed_experts", "moe_intermediate_size", "num_experts_per_tok", "routed_scaling_factor",
                      "norm_topk_prob", "output_router_logits", "n_group", "topk_group", "n_shared_experts",
                      "hidden_dropout", "num_nextn_predict_layers")
_NEMOTRON_H_MOE_INTS = ("n_routed_experts", "moe_intermediate_size", "num_experts_per_tok", "n_group", "topk_group")
for _key in _NEMOTRON_H_UNREAD:  # (its mixture's keys: read where it has mixture blocks, LlamaConfig.experts)
    _also(_key, lambda v, c, key=_key: c.model_type == "nemotron_h" and (
        v is None or isinstance(v, (bool, int, float))) and (
        "moe" not in c.block_types or (key not in _NEMOTRON_H_MOE_INTS or _is_int(v) and v >= 1)
        and (key != "routed_scaling_factor" or _is_number(v) and v > 0)
        and (key != "norm_topk_prob" or isinstance(v, bool))),
          "Nemotron-H: any without mixture blocks (its mixtures' or training's setting); with them its mixture's "
          "counts and widths ints >= 1, routed_scaling_factor a number > 0, norm_topk_prob a bool")
_add_checks({key: (lambda v, c: c.model_type == "nemotron_h" and (v is None or isinstance(v, (bool, int, float, str,
                                                                                              list))),
                   "absent (Nemotron-H: its kernels' / mixtures' / training's setting, not read)")
             for key in ("use_mamba_kernels", "mamba_hidden_act", "mamba_ssm_cache_dtype", "moe_shared_expert_overlap",
                         "mtp_layers_block_type")})
# Jamba's layer periods and offsets (LlamaConfig.mamba1, experts), its mixture's size, its kernels' and training's keys
_add_checks({
    **{key: (lambda v, c, low=low: c.model_type == "jamba" and _is_int(v) and v >= low,
             f"absent (Jamba: an int >= {low})")
       for key, low in (("attn_layer_period", 1), ("attn_layer_offset", 0), ("expert_layer_period", 1),
                        ("expert_layer_offset", 0))}})
_also("router_aux_loss_coef", lambda v, c: c.model_type == "jamba" and _is_number(v), "Jamba: a number, training's")
_also("use_mamba_kernels", lambda v, c: c.model_type == "jamba" and isinstance(v, bool), "Jamba: a bool, its kernels'")
for _key in ("num_experts", "num_experts_per_tok"):
    _also(_key, lambda v, c: c.model_type == "jamba" and _is_int(v) and v >= 1, "Jamba: an int >= 1")
_also("output_router_logits", lambda v, c: c.model_type == "jamba" and isinstance(v, bool), "Jamba: a bool")
def _multiplier(v) -> bool:
    """A Falcon-H1 multiplier: a finite number, not 0 (folded into a weight, divided out on saving)."""
    return _is_number(v) and 0 < abs(v) < float("inf")


# Kimi Linear's KDA layers (LlamaConfig.delta), its checkpoints' first_k_dense_replace (its mlp_layer_types' default)
_add_checks({key: (lambda v, c: c.model_type == "kimi_linear" and _is_int(v) and v >= 1,
                   "absent (Kimi Linear: an int >= 1)") for key in ("linear_head_dim", "linear_num_heads")})
_also("linear_conv_kernel_dim", lambda v, c: c.model_type == "kimi_linear" and _is_int(v) and v >= 1,
      "Kimi Linear: an int >= 1")
_also("first_k_dense_replace", lambda v, c: c.model_type == "kimi_linear" and _is_int(v) and v >= 0,
      "Kimi Linear: an int >= 0")


# LFM3's switches (LlamaConfig.sandwich_norms, sigmoid_head_gate)
_add_checks({key: (lambda v, c: c.model_type == "lfm3" and isinstance(v, bool), "absent (LFM3: a bool)")
             for key in ("use_sandwich_norm", "use_attention_gate")})


# Falcon-H1's keys (LlamaConfig.mamba, parallel_mamba, embedding_multiplier, logit_scale; the other multipliers folded
# into the weights on loading)
_add_checks({
    "mamba_d_ssm": (lambda v, c: c.model_type == "falcon_h1" and (v is None or _is_int(v) and v >= 1),
                    "absent (Falcon-H1: null or an int >= 1, its Mamba mixer's width)"),
    **{key: (lambda v, c: c.model_type == "falcon_h1" and isinstance(v, bool), "absent (Falcon-H1: a bool)")
       for key in ("mamba_norm_before_gate", "mamba_rms_norm", "projectors_bias")},
    **{key: (lambda v, c: c.model_type == "falcon_h1" and _multiplier(v), "absent (Falcon-H1: a finite number, not 0)")
       for key in _FALCON_H1_SCALARS if key != "embedding_multiplier"},
    **{key: (lambda v, c, n=n: c.model_type == "falcon_h1" and (v is None or isinstance(v, list) and len(v) == n
                                                                 and all(map(_multiplier, v))),
             f"absent (Falcon-H1: null or {n} finite numbers, none 0)")
       for key, n in _FALCON_H1_LISTS.items()}})
_also("embedding_multiplier", lambda v, c: c.model_type == "falcon_h1" and _multiplier(v), "Falcon-H1: a finite number")
_also("num_logits_to_keep", lambda v, c: c.model_type == "falcon_h1" and (v is None or _is_int(v)),
      "Falcon-H1: an int, generate's")
_also("use_mamba_kernels", lambda v, c: c.model_type == "falcon_h1" and isinstance(v, bool),
      "Falcon-H1: a bool, its kernels'")
# its mixture's shared expert's width and latent projection (Nemotron 3 Super's: LlamaConfig.experts.latent_size)
_add_checks({"moe_shared_expert_intermediate_size": (
                 lambda v, c: c.model_type == "nemotron_h" and (_is_int(v) and v >= 1 or "moe" not in c.block_types),
                 "absent (Nemotron-H: an int >= 1, its mixture's shared expert's width)"),
             "moe_latent_size": (
                 lambda v, c: c.model_type == "nemotron_h" and (v is None or _is_int(v) and v >= 1),
                 "absent (Nemotron 3: null or an int >= 1, its mixture's latent width: Super's)")})
for _key in ("moe_intermediate_size", "num_experts", "num_experts_per_tok"):
    _also(_key, lambda v, c: c.model_type == "lfm2_moe" and _is_int(v) and v >= 1, "LFM2-MoE: an int >= 1")
_also("routed_scaling_factor", lambda v, c: c.model_type == "lfm2_moe" and _is_number(v) and 0 < v < float("inf"),
      "LFM2-MoE: a number > 0")
_also("norm_topk_prob", lambda v, c: c.model_type == "lfm2_moe" and isinstance(v, bool), "LFM2-MoE: a bool")
for _key in ("n_group", "topk_group"):
    _also(_key, lambda v, c: c.model_type == "afmoe" and v in (1, None), "AFMoE: 1 or null (one group)")


def _mxfp4(v) -> bool:
    """Whether ``quantization_config`` ``v`` is OpenAI's MXFP4 one (GPT-OSS: its experts' weights in MXFP4 blocks,
    which loading.py dequantises; which tensors are quantised is read from the checkpoint's names)."""
    return isinstance(v, dict) and v.get("quant_method") == "mxfp4" and set(v) <= {"quant_method",
                                                                                 "modules_to_not_convert"}


_FP8_KEYS = {  # FineGrainedFP8Config's keys (transformers) and the values whose dequantised model is the same
    "quant_method": lambda v: v == "fp8",
    "fmt": lambda v: v in ("e4m3", "float8_e4m3fn"),  # (MiniMax-M2's: torch's name of the same format)
    # the activations' FP8 rounding (per block of a row, or by a static activation_scale) belongs to an FP8 matmul;
    # the dequantised model, which this one is (as transformers' with dequantize = True), has none
    "activation_scheme": lambda v: v in ("dynamic", "static"),
    "weight_block_size": lambda v: v is None or (isinstance(v, (list, tuple)) and len(v) == 2
                                                 and all(_is_int(b) and b > 0 for b in v)),
    "scale_fmt": lambda v: v in ("float", "ue8m0"),  # ue8m0: powers of two, as float32 or as their exponent bytes
    "expert_dtype": lambda v: v == "fp8",
    "dequantize": lambda v: isinstance(v, bool),
    # which modules are quantised is read from the weights (each float8 tensor and its *_scale_inv)
    "modules_to_not_convert": lambda v: v is None or (isinstance(v, list) and all(isinstance(m, str) for m in v)),
    "ignored_layers": lambda v: v is None or (isinstance(v, list) and all(isinstance(m, str) for m in v)),
    "modules_to_convert": lambda v: v is None or (isinstance(v, list) and all(isinstance(m, str) for m in v)),
}


def fp8_config(v) -> bool:
    """Whether ``quantization_config`` ``v`` is a fine-grained FP8 one (transformers' ``FineGrainedFP8Config``:
    DeepSeek-V3 / R1, Qwen3 *-FP8, GLM-4.5-FP8, Ministral 3, ...): float8 weights, each with a ``*_scale_inv`` per
    ``weight_block_size`` block or per tensor, which loading dequantises (:func:`triforce.models.loading
    .dequantize_fp8`)."""
    return isinstance(v, dict) and v.get("quant_method") == "fp8" and all(
        k in _FP8_KEYS and _FP8_KEYS[k](x) for k, x in v.items())


def _layer_windows(c: "LlamaConfig") -> tuple:
    """Each layer's sliding window as transformers 5 reads ``c``'s keys (0: none), and the key whose value it
    would not read so (None when there is none: the config raises naming it). Mistral: ``sliding_window`` on
    every layer. Qwen2/3: a window only with ``use_sliding_window``, on the ``layer_types``'
    ``"sliding_attention"`` layers (by default those from ``max_window_layers`` on); with ``use_sliding_window``
    and no ``sliding_window`` key the window is 4096, an explicit null is none. Llama and Gemma 1 have no
    sliding window: the key may only say none. A window at least ``max_position_embeddings`` long never hides a
    key from a token the model emits, and is none."""
    x = c.extra
    n = c.num_hidden_layers
    none = (0,) * n
    if c.model_type == "lfm3":  # (sliding_window on its layer_types' sliding layers)
        types, window = _lfm3_layer_types(c), x.get("sliding_window", FAMILIES["lfm3"].defaults["sliding_window"])
        if types is None:
            return none, "layer_types"
        sliding = [t == "sliding_attention" for t in types]
        if not any(sliding) or window is None:
            return none, "sliding_window" if any(sliding) else None
        if not _is_int(window) or window < 1:
            return none, "sliding_window"
        return (none if window >= c.max_position_embeddings else tuple(window if s else 0 for s in sliding)), None
    if c.model_type in _LFM2S:  # no window; its layer_types (conv or full attention) as LlamaConfig.conv_layers
        return none, "layer_types" if _lfm2_conv_layers(c) is None else next(  # reads them
            (k for k in ("sliding_window", "use_sliding_window", "max_window_layers") if x.get(k) is not None), None)
    if c.model_type in (*_DELTA_FAMILIES, "kimi_linear"):  # no window; its layer_types as LlamaConfig.delta reads them
        return none, "layer_types" if _delta_layer_types(c) is None else next(
            (k for k in ("sliding_window", "use_sliding_window", "max_window_layers") if x.get(k) is not None), None)
    if c.model_type == "llama4_text":  # no window; its layer_types (transformers' masks: chunked or full) as
        types = x.get("layer_types")  # LlamaConfig.layer_chunks reads them
        if types is not None and not (isinstance(types, list) and len(types) == n
                                      and set(types) <= {"chunked_attention", "full_attention"}):
            return none, "layer_types"
        bad = next((k for k in ("sliding_window", "use_sliding_window", "max_window_layers") if x.get(k) is not None),
                   None)
        return none, bad
    if c.model_type in _PATTERNED:
        window = x.get("sliding_window", FAMILIES[c.model_type].defaults["sliding_window"])
        if c.model_type == "modernbert-decoder":  # (its window local_attention // 2, as its config computes it)
            local = x.get("local_attention", _MODERNBERT_LOCAL)
            if not (_is_int(local) and local >= 2) or x.get("sliding_window", local // 2) != local // 2:
                return none, "sliding_window"
            window = local // 2
        if c.model_type == "mimo_v2_flash" and x.get("sliding_window_size") is not None:  # (its checkpoints' key:
            size = x["sliding_window_size"]  # the keys before the query's own, as MiMoV2FlashConfig reads it)
            if not _is_int(size) or size < 0:
                return none, "sliding_window_size"
            window = size + 1
        sliding, bad = _sliding_layers(c)
        if sliding is None:
            return none, bad
        if window is None:  # (OLMo 3, EXAONE 4, Cohere 2: transformers' cache fails on a sliding layer without one;
            # AFMoE: refused too)
            refused = c.model_type in ("olmo3", *_EXAONES, "cohere2", "afmoe", "cohere2_moe", "mimo_v2_flash") \
                and any(sliding) or \
                c.model_type in ("kolibri1", "flint")  # (Kolibri-1's model builds a sliding mask from it whatever
            # the layers; FlintConfig's window is an int)
            return none, "sliding_window" if refused else None
    elif c.model_type in ("qwen2", "qwen3", "smollm3"):
        # Qwen2/3: with use_sliding_window, from max_window_layers on by default; SmolLM3Config: with
        # use_sliding_window, on the NoPE layers by default
        qwen = c.model_type != "smollm3"
        window = x.get("sliding_window", _QWEN_DEFAULT_WINDOW if qwen else None)
        use = x.get("use_sliding_window", False)
        types = x.get("layer_types")
        if types is not None and not _layer_types_ok(types, n):
            return none, "layer_types"
        if use not in (False, None, True):
            return none, "use_sliding_window"
        if not qwen and "max_window_layers" in x:
            return none, "max_window_layers"
        if not use or window is None:
            return none, None
        if types is None and qwen:
            start = x.get("max_window_layers", 28)
            if not _is_int(start):
                return none, "max_window_layers"
            types = ["sliding_attention" if i >= start else "full_attention" for i in range(n)]
        elif types is None:
            types = ["full_attention" if r else "sliding_attention" for r in c.rope_layers]
        sliding = [t == "sliding_attention" for t in types]
    elif c.model_type == "dots1":
        # Dots1Config: sliding_window (4096) on the layer_types' sliding layers, by default those from
        # max_window_layers (62) on where there is a window; use_sliding_window is read by neither it nor the model
        window, types, start = x.get("sliding_window", 4096), x.get("layer_types"), x.get("max_window_layers", 62)
        if types is not None and not _layer_types_ok(types, n):
            return none, "layer_types"
        if x.get("use_sliding_window", False) not in (False, None, True):
            return none, "use_sliding_window"
        if types is None and not _is_int(start):
            return none, "max_window_layers"
        if types is None:
            types = ["sliding_attention" if window is not None and i >= start else "full_attention" for i in range(n)]
        sliding = [t == "sliding_attention" for t in types]
        if window is None:  # (transformers' mask fails on a sliding layer without one)
            return none, "sliding_window" if any(sliding) else None
    elif c.model_type == "qwen2_moe":
        # Qwen2MoeConfig: with use_sliding_window, sliding_window (4096 when absent) on the layer_types' sliding
        # layers, by default every other layer from the first below max_window_layers; without it the window is 0
        # (a sliding layer would see nothing), and a null window fails transformers' mask: both raise here
        use, window, types = x.get("use_sliding_window", False), x.get("sliding_window", _QWEN_DEFAULT_WINDOW), \
            x.get("layer_types")
        if use not in (False, None, True):
            return none, "use_sliding_window"
        if types is not None and (not _layer_types_ok(types, n) or (not use and "sliding_attention" in types)):
            return none, "layer_types"
        if not use:
            return none, None
        if window is None:
            return none, "sliding_window"
        if types is None:
            start = x.get("max_window_layers", 28)
            if not _is_int(start):
                return none, "max_window_layers"
            types = ["sliding_attention" if i % 2 == 0 and i < start else "full_attention" for i in range(n)]
        sliding = [t == "sliding_attention" for t in types]
    elif c.model_type in ("mellum", "laguna"):
        # MellumConfig, LagunaConfig: sliding_window (1024, 512) on the layer_types' sliding layers (none by default);
        # a sliding layer without one fails transformers' mask
        window, types = x.get("sliding_window", FAMILIES[c.model_type].defaults["sliding_window"]), x.get("layer_types")
        if types is not None and not _layer_types_ok(types, n):
            return none, "layer_types"
        sliding = [t == "sliding_attention" for t in types] if types is not None else [False] * n
        if window is None:
            return none, "sliding_window" if any(sliding) else None
    elif c.model_type == "ministral":
        # MinistralConfig: sliding_window (Mistral's 4096 when absent; null: none) on the layer_types' sliding layers,
        # by default every layer where there is a window
        window, types = x.get("sliding_window", FAMILIES["ministral"].defaults["sliding_window"]), x.get("layer_types")
        if types is not None and not _layer_types_ok(types, n):
            return none, "layer_types"
        sliding = [t == "sliding_attention" for t in types] if types is not None else [window is not None] * n
        if window is None:  # (transformers' mask fails on a sliding layer without one)
            return none, "sliding_window" if any(sliding) else None
    elif c.model_type in ("cwm", *_GRANITE_SWAS):
        # CwmConfig, GraniteSWAConfig: sliding_window (8192, 128; an int >= 1: 0 and null fail CwmConfig, null fails
        # GraniteSWA's mask) on the layer_types' sliding layers, by default all but every fourth from layer 0
        window, types = x.get("sliding_window", FAMILIES[c.model_type].defaults["sliding_window"]), x.get("layer_types")
        if types is not None and not _layer_types_ok(types, n):
            return none, "layer_types"
        for key in ("use_sliding_window", "max_window_layers"):  # (Qwen's keys: their configs keep them unread)
            if key in x:
                return none, key
        if window is None:
            return none, "sliding_window"
        sliding = [t == "sliding_attention" for t in types] if types is not None else \
            [i % _CWM_PATTERN != 0 for i in range(n)]
    elif c.model_type == "gpt_neo":  # GPTNeoConfig: window_size on the attention_types' local layers
        window, layers = x.get("window_size", 256), _gpt_neo_layers(c)
        if isinstance(layers, str):
            return none, layers
        if not _is_int(window) or window < 1:
            return none, "window_size"
        if window >= c.max_position_embeddings:
            return none, None
        return tuple(window if kind == "local" else 0 for kind in layers), None
    elif c.model_type == "qwen3_moe":  # Qwen3MoeConfig: sliding_window on every layer with use_sliding_window
        if "layer_types" in x and set(x["layer_types"] or ()) - {"full_attention"}:
            return none, "layer_types"  # (not read by Qwen3-MoE, nor max_window_layers)
        use, window = x.get("use_sliding_window", False), x.get("sliding_window", _QWEN_DEFAULT_WINDOW)
        if use not in (False, None, True):
            return none, "use_sliding_window"
        if not use or window is None:
            return none, None
        sliding = [True] * n
    else:
        if c.model_type == "granitemoehybrid":  # (its layer_types: attention, or Mamba's: LlamaConfig.mamba)
            types = x.get("layer_types") or x.get("layers_block_type") or ["linear_attention"] * n  # (none: Mamba)
            if not isinstance(types, list) or len(types) != n or not set(types) <= {*_HYBRID_ATTENTION,
                                                                                      *_MAMBA_TYPES}:
                named = "layer_types" in x or "layers_block_type" not in x
                return none, "layer_types" if named else "layers_block_type"
            return none, None
        if c.model_type == "iquestcoder":  # its original code's window, off (transformers refuses it on): then its
            if x.get("use_sliding_window", False) is not False:  # sliding_window and max_window_layers are not read
                return none, "use_sliding_window"
            if "layer_types" in x and set(x["layer_types"] or ()) - {"full_attention"}:
                return none, "layer_types"
            return none, None
        for key in ("use_sliding_window", "max_window_layers"):  # Qwen's keys in a family that does not read them
            if key in x:
                return none, key
        if c.model_type in _DSAS:  # (every layer DSA's: LlamaConfig.dsa)
            if x.get("layer_types") not in (None, ["indexed_attention"] * n):
                return none, "layer_types"
        elif "layer_types" in x and set(x["layer_types"] or ()) - {"full_attention"}:
            return none, "layer_types"
        window = x.get("sliding_window")
        if window is None:
            return none, None
        sliding = [True] * n  # Mistral's; another family's must not mask (below)
    if not _is_int(window) or window < 1:
        return none, "sliding_window"
    if window >= c.max_position_embeddings or not any(sliding):
        return none, None
    if c.model_type not in ("mistral", "ministral", "ministral3", "cwm", *_GRANITE_SWAS, "mellum", "laguna", "phi3",
                            "qwen2",
                            "qwen3",
                            "smollm3", "mixtral",
                            "phimoe",
                            "qwen3_moe",
                            "qwen2_moe", "dots1", "starcoder2", *_PATTERNED):
        return none, "sliding_window"  # a window that masks, in a family without one
    return tuple(window if s else 0 for s in sliding), None


def _gpt_neo_layers(c: "LlamaConfig") -> list | str:
    """GPT-Neo's attention kind per layer (``"global"`` or ``"local"``): its ``attention_types`` expanded (each
    ``[kinds, repeats]``: the kinds repeated; GPTNeoConfig's by default), one per layer; the bad key where there is
    none such (``attention_layers``, which transformers writes beside it, must be that expansion)."""
    types = c.extra.get("attention_types", _GPT_NEO_TYPES)
    layers = []
    for item in types if isinstance(types, (list, tuple)) else [None]:
        if not (isinstance(item, (list, tuple)) and len(item) == 2 and isinstance(item[0], (list, tuple))
                and set(item[0]) <= {"global", "local"} and _is_int(item[1]) and item[1] >= 0):
            return "attention_types"
        layers += list(item[0]) * item[1]
    if len(layers) != c.num_hidden_layers:
        return "attention_types"
    if list(c.extra.get("attention_layers", layers)) != layers:
        return "attention_layers"
    return layers


_EXAONES = ("exaone4", "exaone_moe")
# layer_types, else a pattern
_PATTERNED = (*_GEMMA2S, "gemma3_text", "gpt_oss", "olmo3", *_EXAONES, "cohere2", "afmoe", "kolibri1", "flint",
              "cohere2_moe", "modernbert-decoder", "mimo_v2_flash")


def _sliding_layers(c: "LlamaConfig") -> tuple:
    """Gemma 2 / 3, GPT-OSS, OLMo 3, EXAONE 4, Cohere 2: per layer, whether its type is ``"sliding_attention"`` (its
    ``layer_types``, by default the family's pattern: every n-th layer full), whatever its window; ``(None, the bad key
    or None)`` where the keys say no such list."""
    x, n = c.extra, c.num_hidden_layers
    types = x.get("layer_types")
    if types is None and c.model_type in _EXAONES and x.get("sliding_window", 4096) is None:
        return [False] * n, None  # (Exaone4Config's pattern 0 then: no sliding layer)
    if types is None and c.model_type == "cohere2_moe":  # (Cohere2MoeConfig's: its dense prefix by its own pattern)
        k, prefix = x.get("first_k_dense_replace", 0), x.get("prefix_dense_sliding_window_pattern", 1)
        every = x.get("sliding_window_pattern", 4)
        if not all(_is_int(v) and v >= 1 for v in (prefix, every)) or not (_is_int(k) and 0 <= k <= n):
            return None, None  # (its own check names it)
        return [(i + 1) % prefix != 0 if i < k else (i - k + 1) % every != 0 for i in range(n)], None
    if types is None and c.model_type == "modernbert-decoder":  # (its config's: every n-th from the first global)
        every = x.get("global_attn_every_n_layers", _MODERNBERT_EVERY)
        if not (_is_int(every) and every >= 1):
            return None, None  # (its own check names it)
        return [i % every != 0 for i in range(n)], None
    if types is None and c.model_type == "mimo_v2_flash":  # (MiMoV2FlashConfig's: layer 0 and every sixth full)
        return [not (i == 0 or (i + 1) % _MIMO_PATTERN == 0) for i in range(n)], None
    if types is None and c.model_type == "flint":  # (FlintConfig's: full on layers 0, 1, every fourth from 1, the last)
        return [not (i < 2 or i % 4 == 1 or i == n - 1) for i in range(n)], None
    if types is None:
        default = FAMILIES[c.model_type].defaults.get("sliding_window_pattern", _GEMMA3_PATTERN)  # (EXAONE 4's: 4)
        patterns = {**dict.fromkeys(_GEMMA2S, _GEMMA2_PATTERN), "gpt_oss": _GPT_OSS_PATTERN, "olmo3": _OLMO3_PATTERN,
                    "kolibri1": _KOLIBRI_PATTERN}
        pattern = patterns.get(c.model_type) or (x.get("global_attn_every_n_layers", 4) if c.model_type == "afmoe"
                                                 else x.get("sliding_window_pattern",
                                                            x.get("_sliding_window_pattern", default)))
        if not _is_int(pattern) or pattern < 1:
            return None, None  # (its own check names it)
        types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n)]
    elif not _layer_types_ok(types, n):
        return None, "layer_types"
    return [t == "sliding_attention" for t in types], None


def _granite_swa_thetas(c: "LlamaConfig", v="absent") -> list | None:
    """Granite SWA: each layer's RoPE base (``layer_rope_theta``, by default ``rope_theta`` everywhere; 0: NoPE), or
    None where the layers would take more than two RoPEs: besides ``rope_theta``'s (with its ``rope_scaling``), either
    NoPE or, with plain RoPE over the whole head, one other base."""
    n = c.num_hidden_layers
    v = c.extra.get("layer_rope_theta") if v == "absent" else v
    if v is None:
        return [c.rope_theta] * n
    if not (isinstance(v, list) and len(v) == n and all(_is_number(t) and 0 <= t < float("inf") for t in v)):
        return None
    others = {t for t in v if t and t != c.rope_theta}
    if others and (len(others) > 1 or 0 in v or c.rope_scaling is not None or c.rotary_dim != c.head_dim):
        return None
    return [float(t) for t in v]


def _layer_types_ok(types, n: int) -> bool:
    """``layer_types`` as transformers reads it: a list of one ``"full_attention"`` or ``"sliding_attention"`` per
    layer."""
    return isinstance(types, list) and len(types) == n and set(types) <= {"full_attention", "sliding_attention"}


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


@dataclass
class LlamaConfig:
    """Llama architecture (GQA, RoPE, RMSNorm, SwiGLU), field names as in ``transformers.LlamaConfig``.

    ``num_key_value_heads`` defaults to ``num_attention_heads`` (MHA) and ``head_dim`` to
    ``hidden_size // num_attention_heads``. ``rope_scaling`` is ``None`` or a dict with ``rope_type``
    (or ``type``) ``"default"``, ``"linear"`` (``factor``), ``"llama3"`` (``factor``,
    ``low_freq_factor``, ``high_freq_factor``, ``original_max_position_embeddings``) or ``"yarn"``
    (``factor``, ``original_max_position_embeddings``; optionally ``attention_factor``, ``beta_fast``,
    ``beta_slow``, ``mscale``, ``mscale_all_dim``, ``truncate``, as transformers reads them) or ``"longrope"``
    (``short_factor``, ``long_factor``: ``rotary_dim // 2`` numbers each, ``original_max_position_embeddings``;
    optionally ``factor``, ``attention_factor``: :func:`triforce.models.rope.rope_inv_freq`); it may also hold
    ``rope_theta`` (equal to the field) and ``partial_rotary_factor`` 1.0, as transformers 5's
    ``rope_parameters`` do (a partial RoPE's factor is ``extra['partial_rotary_factor']``: :attr:`rotary_dim`).
    Any other key in it raises. ``extra`` holds the other ``config.json`` keys, each either metadata or at its
    one supported value (see the module docstring); others raise.
    """

    model_type: str = "llama"
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
    attention_bias: bool = False
    mlp_bias: bool = False
    initializer_range: float = 0.02
    bos_token_id: int | None = None
    eos_token_id: int | list | None = None
    pad_token_id: int | None = None
    extra: dict = field(default_factory=dict, repr=False)  # other config.json keys, kept for round trips

    def __post_init__(self):
        if self.model_type not in FAMILIES:
            raise ValueError(f"LlamaConfig.model_type {self.model_type!r} is not supported: triforce.models.Llama "
                             f"implements {_MODEL_TYPES}")
        family = FAMILIES[self.model_type]
        for name in ("attention_bias", "mlp_bias"):
            v = getattr(self, name)
            if not isinstance(v, bool):
                raise ValueError(f"LlamaConfig.{name} must be true or false, got {v!r}")
            if v and name not in family.reads:
                raise ValueError(f"config key {name!r} = True is not supported for model_type {self.model_type!r}: "
                                 f"transformers' {family.architecture} has no such switch (only false is)")
        if self.model_type in _MLAS:  # the attention kernels' shape of MLA: one latent KV head (LlamaConfig.mla)
            self._mla_shape()
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "max_position_embeddings"):
            v = getattr(self, name)
            if not _is_int(v) or v < 1:
                raise ValueError(f"LlamaConfig.{name} must be a positive int, got {v!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"LlamaConfig.num_attention_heads ({self.num_attention_heads}) must be a multiple "
                             f"of num_key_value_heads ({self.num_key_value_heads})")
        if self.head_dim is None:
            if self.hidden_size % self.num_attention_heads:
                raise ValueError("LlamaConfig.hidden_size must be a multiple of num_attention_heads "
                                 "(or give head_dim)")
            self.head_dim = self.hidden_size // self.num_attention_heads
        if not _is_int(self.head_dim) or self.head_dim < 2 or self.head_dim % 2:
            raise ValueError(f"LlamaConfig.head_dim must be an even int >= 2 (RoPE rotates pairs), "
                             f"got {self.head_dim!r}")
        for name in ("rope_theta", "rms_norm_eps"):
            v = getattr(self, name)
            if not _is_number(v) or not v > 0:
                raise ValueError(f"LlamaConfig.{name} must be a number > 0, got {v!r}")
        if not isinstance(self.tie_word_embeddings, bool):
            raise ValueError(f"LlamaConfig.tie_word_embeddings must be true or false, got {self.tie_word_embeddings!r}")
        self.rope_scaling = self._checked_rope_scaling()
        beta = (self.rope_scaling or {}).get("llama_4_scaling_beta")
        if (beta is not None) != (self.model_type == "ministral3"):
            raise ValueError("rope_parameters['llama_4_scaling_beta'] (a query temperature) is Ministral 3's: "
                             f"model_type 'ministral3' needs it (with yarn RoPE), {self.model_type!r} takes none; "
                             f"got {beta!r}")
        for key, value in self.extra.items():
            self._check_extra_key(key, value)
        if self.model_type in _MOE_TYPES:
            qwen = self.model_type in (*_QWEN_MOES, "olmoe", "flex_olmo")  # (their count key: num_experts)
            need = ("num_experts_per_tok",) + (("moe_intermediate_size",) if self.model_type in _QWEN_MOES else ()) + (
                ("shared_expert_intermediate_size",) if self.model_type in ("qwen2_moe", "qwen3_next") else ())
            missing = [k for k in need if k not in self.extra]
            if not any(k in self.extra for k in _EXPERT_COUNT_KEYS):
                missing.insert(0, _EXPERT_COUNT_KEYS[qwen])
            if missing:
                raise ValueError(f"model_type {self.model_type!r} needs config key {missing[0]!r} (a mixture of "
                                 "experts: LlamaConfig.experts)")
            e = self.experts
            if e.top_k > e.count:
                raise ValueError(f"config num_experts_per_tok = {e.top_k} is more than the {e.count} experts")
        if self.model_type in _LFM2S and _lfm2_conv_layers(self) is None:
            x = self.extra
            raise ValueError(f"config layer_types {x.get('layer_types')!r} / full_attn_idxs "
                             f"{x.get('full_attn_idxs')!r}: LFM2 takes one of 'conv' / 'full_attention' per layer, or "
                             "the attention layers' indices (both given: they must agree); LFM3 one of 'conv' / "
                             "'full_attention' / 'sliding_attention' per layer")
        if self.model_type == "granitemoehybrid" and _layer_windows(self)[1] is not None:
            x = self.extra
            raise ValueError(f"model_type 'granitemoehybrid' with layer types "
                             f"{x.get('layer_types', x.get('layers_block_type'))!r}: one of "
                             f"{(*_HYBRID_ATTENTION, *_MAMBA_TYPES)} per layer")
        if self.model_type in _MAMBA_FAMILIES and self.mamba is not None:
            self._check_mamba()
        if self.model_type == "nemotron_h" and self.experts is not None:
            e = self.experts
            groups, top_groups = e.groups
            if e.top_k > e.count or e.count % groups or top_groups > groups:
                raise ValueError(f"config: Nemotron-H's mixture of {e.count} experts takes {e.top_k} a token within "
                                 f"{top_groups} of {groups} groups: at most its experts, within at most its groups, "
                                 "which must divide them")
        if self.model_type in _DELTA_FAMILIES:
            if _delta_layer_types(self) is None:
                raise ValueError(f"config layer_types = {self.extra.get('layer_types')!r}: {self.model_type} takes "
                                 f"one of 'linear_attention' / 'full_attention' per layer ({self.num_hidden_layers})")
            d = self.delta
            if d is not None and d.v_heads % d.k_heads:
                raise ValueError(f"config linear_num_value_heads ({d.v_heads}) must be a multiple of "
                                 f"linear_num_key_heads ({d.k_heads})")
        if self.model_type in ("afmoe", "granitemoehybrid") and self.experts is not None \
                and self.experts.top_k > self.experts.count:
            raise ValueError(f"config num_experts_per_tok = {self.experts.top_k} is more than the "
                             f"{self.experts.count} experts")
        if self.model_type in _GROUPED:
            self._check_deepseek_experts()
        if self.model_type == "mimo_v2_flash" and self.value_head_dim > self.head_dim:
            raise ValueError(f"config v_head_dim = {self.value_head_dim} is more than head_dim = {self.head_dim}: the "
                             "caches hold each value in a key's width (a narrower one padded), not a wider one")
        if self.model_type == "mimo_v2_flash" and self.rope_scaling is not None:
            raise ValueError(f"config rope_parameters of rope_type {self.rope_type!r}: MiMo-V2-Flash is read with its "
                             "default RoPE only (its rotary's own, on partial_rotary_factor of each head)")
        if self.model_type in _DSAS:
            self._check_dsa()
        if self.model_type in ("ernie4_5_moe", "minimax_m2", "hunyuan_v1_moe", "llama4_text", "aria_text") and \
                self.experts is not None and self.experts.top_k > self.experts.count:
            raise ValueError(f"config num_experts_per_tok (ERNIE's moe_k) = {self.experts.top_k} is more than the "
                             f"{self.experts.count} experts")
        if self.model_type in ("olmo", "opt", "biogpt", "xglm"):  # (OlmoLayerNorm's, OPT's, BioGPT's and XGLM's eps
            self.rms_norm_eps = 1e-5  # are fixed: no key of their configs sets another)
        if self.model_type == "opt" and self.attention_bias != self.mlp_bias:
            raise ValueError("model_type 'opt' has one bias switch (enable_bias) for every projection: attention_bias "
                             f"{self.attention_bias} and mlp_bias {self.mlp_bias} must agree")
        if self.model_type in ("gpt_neox", *_GPTJS, *_GPT2S, "opt", "gpt_neo", "biogpt", "xglm",
                               "gpt_neox_japanese") and (
                not self.mlp_bias and self.model_type not in ("opt", "gpt_neox_japanese")
                or self.num_key_value_heads not in (self.num_attention_heads,
                                                    *((1,) if self.model_type == "gpt_bigcode" else ()))
                or self.head_dim * self.num_attention_heads != self.hidden_size):
            mlps = "" if self.model_type in ("opt", "gpt_neox_japanese") else " with biased MLPs"
            raise ValueError(f"model_type {self.model_type!r} is multi-head attention of head_dim hidden_size // heads"
                             f"{mlps}: got {self.num_key_value_heads} KV heads of "
                             f"{self.num_attention_heads}, "
                             f"head_dim {self.head_dim} of hidden_size {self.hidden_size}, mlp_bias {self.mlp_bias}")
        if self.model_type in (*_GPT2S, "biogpt", "xglm") and not self.attention_bias:
            raise ValueError(f"model_type {self.model_type!r} has biases on every projection: attention_bias must be "
                             "true")
        if self.model_type in _USE_BIAS and self.attention_bias != self.mlp_bias:
            raise ValueError(f"model_type {self.model_type!r} has one bias switch (use_bias) for every projection: "
                             f"attention_bias and mlp_bias must agree, got {self.attention_bias} and {self.mlp_bias}")
        if self.qk_norm_full and self.model_type != "minimax_m2" and \
                self.head_dim * self.num_attention_heads != self.hidden_size:
            raise ValueError(f"model_type {self.model_type!r} normalises each token's queries over hidden_size = "
                             f"{self.hidden_size}, so head_dim * num_attention_heads must equal it, got "
                             f"{self.head_dim} * {self.num_attention_heads}")

    def _deepseek(self, key: str):
        """A DeepSeek config key's value (its family's default where absent)."""
        return self.extra.get(key, FAMILIES[self.model_type].defaults.get(key))

    def _mla_shape(self) -> None:
        """DeepSeek: ``num_key_value_heads`` 1 and ``head_dim`` ``kv_lora_rank + qk_rope_head_dim`` (the latent KV
        head the caches hold: :class:`MLA`), filled in where None; other values raise, as do MLA's sizes where the
        latent layout cannot hold them (odd ranks)."""
        for key in _MLA_DIMS:
            v = self._deepseek(key)
            if not _is_int(v) or v < 1:
                raise ValueError(f"config key {key!r} = {v!r} is not supported: DeepSeek's MLA needs an int >= 1")
        R, r = self._deepseek("kv_lora_rank"), self._deepseek("qk_rope_head_dim")
        if R % 2 or r % 2:
            raise ValueError(f"DeepSeek's kv_lora_rank ({R}) and qk_rope_head_dim ({r}) must be even: the cached "
                             "latent key is split in halves around the RoPE pairs (LlamaConfig.mla)")
        if self.num_key_value_heads is None:
            self.num_key_value_heads = 1
        if self.head_dim is None:
            self.head_dim = R + r
        if (self.num_key_value_heads, self.head_dim) != (1, R + r):
            raise ValueError(f"model_type {self.model_type!r}: LlamaConfig.num_key_value_heads and head_dim are MLA's "
                             f"latent KV head as the caches hold it, 1 and kv_lora_rank + qk_rope_head_dim = {R + r}; "
                             f"got {self.num_key_value_heads} and {self.head_dim} (from_dict reads a config.json's "
                             "values, transformers' per-head ones)")

    def _check_dsa(self) -> None:
        """DeepSeek-V3.2's indexer: its queries come from the low-rank query latent, and it RoPEs its first
        ``qk_rope_head_dim`` dims; GLM-5's layers each full or shared, the first full."""
        if self.model_type == "glm_moe_dsa":
            types = self._indexer_types()
            if not (isinstance(types, list) and len(types) == self.num_hidden_layers
                    and set(types) <= {"full", "shared"} and types[0] == "full"):
                raise ValueError(f"GLM-5's indexer_types (or index_topk_pattern / index_topk_freq / "
                                 f"index_skip_topk_offset) must give one 'full' or 'shared' per layer "
                                 f"({self.num_hidden_layers}), the first 'full' (a shared layer attends to the keys "
                                 f"the previous full layer chose), got {types!r}")
        d, m = self.dsa, self.mla
        if m.q_lora_rank is None:
            raise ValueError("DeepSeek's sparse attention needs q_lora_rank (an int >= 1): its indexer's queries "
                             "are projected from the queries' low-rank latent")
        if d.head_dim < m.qk_rope_head_dim:
            raise ValueError(f"config index_head_dim = {d.head_dim} must be at least qk_rope_head_dim = "
                             f"{m.qk_rope_head_dim} (the indexer RoPEs that many of its dims)")

    def _check_deepseek_experts(self) -> None:
        """DeepSeek's router keys together: the experts per token within the experts, the groups dividing them."""
        if self.extra.get("num_experts_per_tok") is None:
            raise ValueError(f"model_type {self.model_type!r} needs config key 'num_experts_per_tok' (an int >= 1: "
                             "the routed experts each token takes)")
        e = self.experts
        if e.top_k > e.count:
            raise ValueError(f"config num_experts_per_tok = {e.top_k} is more than the {e.count} routed experts")
        if e.groups is not None:
            groups, top_groups = e.groups
            if groups is None or top_groups is None:
                raise ValueError(f"config n_group = {groups} and topk_group = {top_groups}: a grouped router "
                                 f"(topk_method {self._deepseek('topk_method')!r}) needs both as ints >= 1")
            if e.count % groups or top_groups > groups:
                raise ValueError(f"config n_group = {groups} and topk_group = {top_groups}: n_group must divide "
                                 f"n_routed_experts ({e.count}) and topk_group be at most n_group")
            if e.top_k > top_groups * (e.count // groups) or (e.group_top2 and e.count // groups < 2):
                raise ValueError(f"config num_experts_per_tok = {e.top_k} cannot be chosen within topk_group = "
                                 f"{top_groups} groups of {e.count // groups} experts" + (
                                     " (DeepSeek-V3 ranks each group by its best two)" if e.group_top2 else ""))

    def _checked_rope_scaling(self) -> dict | None:
        """``rope_scaling`` with ``rope_type`` set and ``type`` / ``rope_theta`` / ``partial_rotary_factor``
        dropped (after checking them), or ``None`` for plain RoPE; raises on anything rope.py does not do."""
        if self.rope_scaling is None:
            return None
        if not isinstance(self.rope_scaling, dict):
            raise ValueError(f"LlamaConfig.rope_scaling must be null or a dict, got {self.rope_scaling!r}")
        rs = dict(self.rope_scaling)
        kind = rs.pop("rope_type", None)
        old = rs.pop("type", None)  # the transformers 4.x spelling
        if kind is not None and old is not None and kind != old:
            raise ValueError(f"rope_scaling has rope_type {kind!r} and type {old!r}; they must agree (keep rope_type)")
        kind = kind if kind is not None else old if old is not None else "default"
        if kind not in _ROPE_TYPES:
            raise ValueError(f"rope_type {kind!r} (rope_scaling / rope_parameters) is not supported: "
                             f"LlamaConfig.rope_scaling implements {', '.join(_SUPPORTED_ROPE_TYPES)}; "
                             "use a checkpoint with one of those RoPE types")
        if kind == "dynamic" and "alpha" in rs and self.model_type not in _HUNYUANS:
            raise ValueError(f"rope_type 'dynamic' with an 'alpha' (NTK alpha, the base stretched once) is Hunyuan's; "
                             f"model_type {self.model_type!r} does not read it")
        if kind == "dynamic" and "alpha" not in rs and "factor" not in rs:
            raise ValueError("rope_scaling of rope_type 'dynamic' needs factor (transformers' dynamic NTK RoPE) or, "
                             "in Hunyuan, alpha")
        if "rope_theta" in rs:
            theta = rs.pop("rope_theta")
            if theta != self.rope_theta:
                raise ValueError(f"rope_scaling['rope_theta'] = {theta!r} differs from LlamaConfig.rope_theta = "
                                 f"{self.rope_theta!r}; pass it as rope_theta only")
        if rs.get("partial_rotary_factor", 1) not in (1, None):
            raise ValueError(f"rope partial_rotary_factor = {rs['partial_rotary_factor']!r} inside rope_scaling: "
                             "LlamaConfig reads RoPE on a part of the head from extra['partial_rotary_factor'] "
                             "(Phi-3 / Phi-4 only; from_dict moves it there)")
        rs.pop("partial_rotary_factor", None)
        need, optional = _ROPE_TYPES[kind], _ROPE_OPTIONAL.get(kind, ())
        missing = [k for k in need if k not in rs]
        if missing:
            raise ValueError(f"rope_scaling of rope_type {kind!r} needs {', '.join(missing)}")
        unknown = sorted(set(rs) - set(need) - set(optional))
        if unknown:
            raise ValueError(f"rope_scaling key {unknown[0]!r} is not understood for rope_type {kind!r} "
                             f"(which reads {', '.join(need + optional) or 'nothing else'}) and could change the "
                             "RoPE frequencies; remove it if you know it does not")
        flags = ("truncate", "finetuned")
        pairs = self.rotary_dim // 2
        for k in _ROPE_LISTS if kind == "longrope" else ():
            v = rs[k]
            if not isinstance(v, (list, tuple)) or len(v) != pairs or not all(_is_number(x) and x > 0 for x in v):
                raise ValueError(f"rope_scaling[{k!r}] must be a list of rotary_dim // 2 = {pairs} numbers > 0 (one "
                                 f"per RoPE pair), got {v!r}")
            rs[k] = [float(x) for x in v]
        need = tuple(k for k in need if k not in _ROPE_LISTS)
        for k in need + tuple(k for k in optional if rs.get(k) is not None and k not in flags):
            if not _is_number(rs[k]) or not rs[k] > 0:
                raise ValueError(f"rope_scaling[{k!r}] must be a number > 0, got {rs[k]!r}")
        for k in flags:
            if k in optional and rs.get(k) is not None and not isinstance(rs[k], bool):
                raise ValueError(f"rope_scaling[{k!r}] must be true or false, got {rs[k]!r}")
        return None if kind == "default" else {"rope_type": kind, **rs}

    def _check_extra_key(self, key, value):
        if key in _METADATA_KEYS:
            return
        if key in _HARMLESS_ONLY_AT:
            harmless, supported = _HARMLESS_ONLY_AT[key]
            if not harmless(value, self):
                raise ValueError(f"config key {key!r} = {value!r} is not supported: triforce.models.Llama "
                                 f"implements only {key} = {supported}, and would compute different logits; "
                                 "use a checkpoint without this feature")
            return
        raise ValueError(f"config key {key!r} is not understood by triforce.models.Llama and could change the "
                         "model's math (silently wrong logits if ignored); if you know it only labels the "
                         "checkpoint, delete it from config.json")

    @property
    def head_bias(self) -> bool:
        """A bias on the LM head: ERNIE 4.5 MoE's by ``use_bias`` (its dense sibling's head has none), Phi-2's, PhiMoE's
        by ``lm_head_bias``."""
        if self.model_type == "modernbert-decoder":  # (its decoder's, by decoder_bias)
            return bool(self.extra.get("decoder_bias", True))
        return self.model_type == "ernie4_5_moe" and self.mlp_bias or self.model_type in ("phi", *_GPTJS) or (
            self.model_type == "phimoe" and bool(self.extra.get("lm_head_bias", False)))

    @property
    def qkv_bias(self) -> bool:
        """Biases on the q/k/v projections (Qwen2's always, Qwen2-MoE's by its ``qkv_bias`` key (default true),
        anyone's with ``attention_bias``)."""
        if self.model_type == "qwen2_moe":
            return bool(self.extra.get("qkv_bias", True))
        if self.model_type == "stablelm":  # (its use_qkv_bias; none on o)
            return bool(self.extra.get("use_qkv_bias", False))
        return FAMILIES[self.model_type].qkv_bias or self.attention_bias

    def layer_out_bias(self, layer: int) -> bool:
        """A bias on layer ``layer``'s attention output projection: :attr:`out_bias`, and GPT-NeoX Japanese's last
        layer's (its ``dense_bias``, that layer's only)."""
        return self.out_bias or (self.model_type == "gpt_neox_japanese" and layer == self.num_hidden_layers - 1)

    @property
    def out_bias(self) -> bool:
        """A bias on the attention's output projection: ``attention_bias``'s, but GLM's and Helium's (q/k/v only) and
        Seed-OSS's (its own ``attention_out_bias``, default false) and MiMo-V2-Flash's (q/k/v only); GPT-Neo's always
        (none on q / k / v)."""
        if self.model_type == "seed_oss":
            return bool(self.extra.get("attention_out_bias", False))
        if self.model_type == "gpt_neo":
            return True
        return self.attention_bias and self.model_type not in (*_GLMS, "helium", "mimo_v2_flash")

    @property
    def rope_float32(self) -> str:
        """transformers' RoPE arithmetic for the family: ``"math"`` (Cohere 2: in float32 on the dtype's cos and sin,
        rounded once), ``"tables"`` (ERNIE 4.5: the tables in float32 too) or ``""`` (the model's dtype)."""
        return FAMILIES[self.model_type].rope_float32

    @property
    def rope_interleaved(self) -> bool:
        """The checkpoint's RoPE pairs adjacent dims (GLM-4): loading.py reorders each q / k head (``rotary_order``)."""
        return FAMILIES[self.model_type].rope_interleaved

    @property
    def layer_windows(self) -> tuple:
        """Each layer's sliding window (0: none): a token at position p attends to positions p - W + 1 .. p
        only (``tk.verify_attention(..., window=W)``). Mistral's ``sliding_window``; Qwen's on its sliding
        layers (docs/model.md, "Sliding windows")."""
        return _layer_windows(self)[0]

    @property
    def sandwich_norms(self) -> bool:
        """Gemma 3's layer: ``h + post_attention_layernorm(attn(input_layernorm(h)))``, then
        ``h + post_feedforward_layernorm(mlp(pre_feedforward_layernorm(h)))``."""
        return FAMILIES[self.model_type].sandwich_norms or (self.model_type == "hyperclovax"
                                                            and self.extra.get("use_post_norm", True) is True) or (
            self.model_type == "lfm3" and self.extra.get("use_sandwich_norm", True) is True)

    @property
    def layer_norm(self) -> bool:
        """Cohere 2's norms: LayerNorm without a bias (the mean subtracted; the weight applied in float32), eps
        ``rms_norm_eps`` (its config's ``layer_norm_eps``). Cohere 2 MoE's where its config's ``rms_norm_eps`` is null
        (then ``layer_norm_eps`` is not in ``extra``: from_dict moved it to ``rms_norm_eps``); else Llama's RMSNorm."""
        if self.model_type == "cohere2_moe":
            return "layer_norm_eps" not in self.extra
        return FAMILIES[self.model_type].layer_norm

    @property
    def parallel_block(self) -> bool:
        """Cohere 2's layer: ``h + attn(x) + mlp(x)`` with ``x = input_layernorm(h)`` (Phi-2's; StableLM's with
        ``use_parallel_residual``; GPT-NeoX's unless ``use_parallel_residual`` is false, with
        :attr:`parallel_norms`)."""
        if self.model_type in ("stablelm", "gpt_neox"):
            return bool(self.extra.get("use_parallel_residual", FAMILIES[self.model_type].parallel_block))
        if self.model_type == "falcon":
            return falcon_layout(self.extra, self.num_attention_heads)[2]
        return FAMILIES[self.model_type].parallel_block

    @property
    def parallel_norms(self) -> bool:
        """GPT-NeoX's parallel block: the MLP on a norm of its own (``post_attention_layernorm``) of the block's input,
        ``h + attn(input_layernorm(h)) + mlp(post_attention_layernorm(h))``."""
        if self.model_type == "falcon":
            return falcon_layout(self.extra, self.num_attention_heads)[3]
        return self.parallel_block and FAMILIES[self.model_type].parallel_norms

    @property
    def logit_scale(self) -> float:
        """Cohere, Cohere 2: the logits times ``logit_scale`` (in the model's dtype, as transformers); HyperCLOVA X's
        ``logits_scaling``, Falcon-H1's ``lm_head_multiplier`` likewise; 1.0 elsewhere."""
        if self.model_type == "hyperclovax":  # (its logits_scaling: a factor)
            return float(self.extra.get("logits_scaling", 1.0))
        if self.model_type == "falcon_h1":
            return float(self.extra.get("lm_head_multiplier", 1.0))
        if self.model_type not in (*_COHERES, "cohere2_moe"):
            return 1.0
        return float(self.extra.get("logit_scale", FAMILIES["cohere2"].defaults["logit_scale"]))

    @property
    def sliding_layers(self) -> tuple:
        """Per layer, whether its type is ``"sliding_attention"`` (Gemma 2 / 3, GPT-OSS, OLMo 3, EXAONE 4, Cohere 2:
        ``layer_types`` or the family's pattern), whatever its window; all False for the other families."""
        sliding = _sliding_layers(self)[0] if self.model_type in _PATTERNED else None
        return (False,) * self.num_hidden_layers if sliding is None else tuple(sliding)

    @property
    def norm_after_residual(self) -> bool:
        """opt-350m's layer (OPT's ``do_layer_norm_before`` false; GPT-1's): ``h = input_layernorm(h + attn(h))``, then
        ``post_attention_layernorm(h + mlp(h))``: each norm after its block's residual add, none before a block."""
        return self.model_type == "opt" and self.extra.get("do_layer_norm_before", True) is False \
            or self.model_type == "openai-gpt"

    @property
    def final_norm(self) -> bool:
        """Whether the last layer's output is normed before the head (OPT's: only a pre-norm model's, and not with
        ``_remove_final_layer_norm``; GPT-1's: never)."""
        return not (self.model_type == "openai-gpt" or self.model_type == "opt" and (
            self.norm_after_residual or self.extra.get("_remove_final_layer_norm", False)))

    @property
    def embed_dim(self) -> int:
        """The token embeddings' (and the tied head's) width: ``hidden_size``, or OPT's ``word_embed_proj_dim``
        (opt-350m's 512 under 1024-wide layers: ``model.project_in`` after the embedding, ``model.project_out``
        before the head)."""
        given = self.extra.get("word_embed_proj_dim") if self.model_type == "opt" else None
        return self.hidden_size if given is None else int(given)

    @property
    def post_norms(self) -> bool:
        """OLMo 2 / 3's layer: ``h + post_attention_layernorm(attn(h))``, then ``h +
        post_feedforward_layernorm(mlp(h))``: its norms after the blocks, none before them."""
        return FAMILIES[self.model_type].post_norms

    @property
    def attention_scale(self) -> float:
        """The attention scores' scale: ``head_dim ** -0.5``; Gemma 3's ``query_pre_attn_scalar ** -0.5``."""
        if self.model_type in (*_GEMMA2S, "gemma3_text"):
            return float(self.extra.get("query_pre_attn_scalar", 256)) ** -0.5  # (as transformers computes it)
        if self.model_type == "hyperclovax" and self.extra.get("attention_multiplier") is None:
            return self.head_dim ** -0.5  # (HyperCLOVAXConfig's when null, computed as it computes it)
        if self.model_type in _GRANITES:
            return self._granite("attention_multiplier")
        if self.model_type == "mpt":  # (attn_config's softmax_scale, else as MptAttention computes its default)
            scale = self.extra.get("softmax_scale")
            return 1 / math.sqrt(self.hidden_size / self.num_attention_heads) if scale is None else float(scale)
        if self.model_type in _GPT2S and not self.extra.get("scale_attn_weights", True) or self.model_type == "gpt_neo":
            return 1.0  # (GPT-2's scores unscaled; GPT-Neo's always)
        if self.model_type in _MLAS:  # qk_head_dim ** -0.5, times YaRN's mscale_all_dim factor squared
            scale = self.mla.qk_head_dim ** (-0.5)
            rs = self.rope_scaling or {}
            if rs.get("mscale_all_dim"):
                factor = rs["factor"]
                m = 1.0 if factor <= 1 else 0.1 * rs["mscale_all_dim"] * math.log(factor) + 1.0
                scale = scale * m * m
            return scale
        return 1.0 / math.sqrt(self.head_dim)  # (the kernels' own default, bit for bit)

    def _minicpm3(self, key: str) -> float:
        """MiniCPM3's ``key`` (its default where absent; null: the value that scales by 1)."""
        v = self.extra.get(key, FAMILIES["minicpm3"].defaults[key])
        if key == "scale_depth":
            return float(math.sqrt(self.num_hidden_layers) if v is None else v)
        return float(self.hidden_size if v is None else v)

    @property
    def rounded_embed_factor(self) -> float | None:
        """The embeddings' factor, rounded to the model's dtype before the product as transformers rounds it: Gemma's
        sqrt(hidden_size) (``embed_scale``), MiniCPM3's ``scale_emb``; None elsewhere."""
        if self.embed_scale or self.model_type in ("biogpt", "xglm") and self.extra.get("scale_embedding", True):
            return self.hidden_size ** 0.5  # (BioGPT's by its scale_embedding)
        return self._minicpm3("scale_emb") if self.model_type == "minicpm3" else None

    @property
    def dense_intermediate_size(self) -> int:
        """The dense MLP's width (and Granite 4.0's shared MLP's beside a mixture): ``intermediate_size``, Granite
        4.0's ``shared_intermediate_size``."""
        if self.model_type == "granitemoehybrid":
            return int(self.extra.get("shared_intermediate_size",
                                      FAMILIES["granitemoehybrid"].defaults["shared_intermediate_size"]))
        if self.model_type == "cohere2_moe":  # (its dense prefix's width)
            return int(self.extra.get("prefix_dense_intermediate_size") or self.intermediate_size)
        if self.model_type == "llama4_text":  # (its dense layers' own width)
            return int(self._deepseek("intermediate_size_mlp"))
        if self.model_type == "lfm2" and self.extra.get("block_auto_adjust_ff_dim", True):  # (Lfm2MLP's width)
            width = int(2 * self.intermediate_size / 3)
            multiplier = self.extra.get("block_ffn_dim_multiplier", 1.0)
            if multiplier is not None:
                step = int(self.extra.get("block_multiple_of", 256))
                width = int(multiplier * width)
                width = step * ((width + step - 1) // step)
            return width
        return self.intermediate_size

    @property
    def head_divisor(self) -> float:
        """MiniCPM3: the final hidden states divided by ``hidden_size / dim_model_base`` before the head; 1.0
        elsewhere."""
        return self.hidden_size / self._minicpm3("dim_model_base") if self.model_type == "minicpm3" else 1.0

    def _granite(self, key: str) -> float:
        """Granite's ``key`` (GraniteConfig's default 1.0); 1.0 for the other families."""
        return float(self.extra.get(key, 1.0)) if self.model_type in _GRANITES else 1.0

    @property
    def embedding_multiplier(self) -> float:
        """Granite: the embeddings' factor (``embedding_multiplier``); AFMoE's with ``mup_enabled``: sqrt(hidden_size)
        (a Python float, as transformers multiplies); Falcon-H1's ``embedding_multiplier``; 1.0 elsewhere (Gemma's is
        ``embed_scale``, rounded first)."""
        if self.model_type == "afmoe":
            return self.hidden_size ** 0.5 if self._deepseek("mup_enabled") else 1.0
        if self.model_type == "falcon_h1":
            return float(self.extra.get("embedding_multiplier", 1.0))
        return self._granite("embedding_multiplier")

    @property
    def attn_output_gate(self) -> bool:
        """The heads' output times the sigmoid of its own projection of the layer's input before ``o_proj`` (AFMoE;
        Qwen3-Next's and Qwen3.5's, their q_proj's gate rows)."""
        return FAMILIES[self.model_type].attn_output_gate

    @property
    def attn_gate_bias(self) -> bool:
        """A bias on that projection: Qwen3-Next's and Qwen3.5's with ``attention_bias`` (the gate's share of q_proj's
        bias); AFMoE's has none."""
        return self.model_type in _DELTA_FAMILIES and self.qkv_bias

    @property
    def residual_multiplier(self) -> float:
        """Granite: each block's output times this before its residual add; MiniCPM3's ``scale_depth /
        sqrt(num_hidden_layers)``; 1.0 elsewhere."""
        if self.model_type == "minicpm3":
            return self._minicpm3("scale_depth") / math.sqrt(self.num_hidden_layers)
        return self._granite("residual_multiplier")

    @property
    def logits_scaling(self) -> float:
        """Granite: the logits divided by this (in the model's dtype, as transformers divides); 1.0 elsewhere
        (HyperCLOVA X's multiplies: :attr:`logit_scale`)."""
        return 1.0 if self.model_type == "hyperclovax" else self._granite("logits_scaling")

    @property
    def attn_softcap(self) -> float | None:
        """Gemma 2's cap on the scaled attention scores (``s -> cap * tanh(s / cap)``), or None."""
        return self._softcap("attn_logit_softcapping")

    @property
    def final_softcap(self) -> float | None:
        """Gemma 2's cap on the logits, or None."""
        return self._softcap("final_logit_softcapping")

    def _softcap(self, key: str) -> float | None:
        if self.model_type not in _GEMMA2S and (self.model_type, key) != ("nanochat", "final_logit_softcapping"):
            return None
        v = self.extra.get(key, FAMILIES[self.model_type].defaults[key])
        return None if v is None else float(v)

    @property
    def rotary_dim(self) -> int:
        """The head dims RoPE rotates: ``head_dim``, or its first ``int(head_dim * partial_rotary_factor)``
        (Phi-4-mini: 96 of 128; docs/model.md, "Partial RoPE")."""
        if self.model_type in _MLAS:  # (MLA's RoPE'd key; its dims in the latent head: MLA.slots)
            return self._deepseek("qk_rope_head_dim")
        f = self.extra.get("partial_rotary_factor", FAMILIES[self.model_type].partial_rotary_factor)
        rs = self.rope_scaling if isinstance(self.rope_scaling, dict) else {}  # (read before it is checked too)
        if rs.get("rope_type", rs.get("type")) == "proportional":  # (the whole head's pairs, f of them turning:
            return self.head_dim  # rope.rope_inv_freq)
        return int(self.head_dim * f) if _is_number(f) and 0 < f < 1 else self.head_dim

    @property
    def local_rotary_dim(self) -> int:
        """The head dims RoPE rotates on the layers of ``rope.rope_local_inv_freq``: the whole head; MiMo-V2-Flash's
        :attr:`rotary_dim` (its sliding layers take the full layers' share)."""
        return self.rotary_dim if self.model_type == "mimo_v2_flash" else self.head_dim

    @property
    def rope_long_from(self) -> int | None:
        """LongRoPE: the sequence length past which its long factors apply (``original_max_position_embeddings``;
        docs/model.md, "LongRoPE"); None for every other RoPE."""
        return self.rope_scaling["original_max_position_embeddings"] if self.rope_type == "longrope" else None

    @property
    def local_rope_theta(self) -> float | None:
        """Gemma 3: the RoPE base of its sliding-window layers (``rope_local_base_freq``, plain RoPE; the
        others take ``rope_theta`` and ``rope_scaling``); OLMo 3: its ``sliding_attention`` layers' (plain RoPE,
        ``rope_theta`` unless its ``rope_parameters`` give them another); Granite SWA: its ``layer_rope_theta``'s other
        base (plain RoPE; None where its other layers take none); None for the other families (one RoPE)."""
        if self.model_type in ("olmo3", *_OWN_ROPES):  # its sliding layers' rope_parameters (the same base unless
            return float(self.extra.get("rope_local_base_freq", self.rope_theta))  # they say one)
        if self.model_type == "modernbert-decoder":  # (its local layers' base, 10000 unless it says another)
            return float(self.extra.get("rope_local_base_freq", _MODERNBERT_LOCAL_THETA))
        if self.model_type in _GRANITE_SWAS:  # its layers' other base (None: NoPE)
            return next((t for t in _granite_swa_thetas(self) or () if t and t != self.rope_theta), None)
        if self.model_type != "gemma3_text":
            return None
        return float(self.extra.get("rope_local_base_freq", FAMILIES["gemma3_text"].defaults["rope_local_base_freq"]))

    def layer_rope_theta(self, layer: int) -> float | None:
        """The RoPE base of ``layer`` when it is another than the model's (``rope_theta`` with ``rope_scaling``):
        Gemma 3's sliding layers' ``local_rope_theta``; else None (SmolLM3's NoPE layers too: no RoPE)."""
        local = self.local_rope_theta
        return local if local is not None and not self.rope_layers[layer] else None

    @property
    def query_temperature(self) -> tuple | None:
        """Ministral 3: ``(beta, original)``, each query after RoPE times ``1 + beta * ln(1 + floor(position /
        original))`` (rope_parameters' ``llama_4_scaling_beta`` and ``original_max_position_embeddings``); None
        for the other families."""
        rs = self.rope_scaling or {}
        beta = rs.get("llama_4_scaling_beta")
        return None if beta is None else (float(beta), int(rs["original_max_position_embeddings"]))

    @property
    def layer_chunks(self) -> tuple:
        """Each layer's chunk of positions (0: none): Llama 4's chunked layers (its ``layer_types``'
        ``"chunked_attention"``, by default its RoPE layers) attend from the start of the query's chunk of
        ``attention_chunk_size`` positions, ``p - p % C .. p``, as transformers' chunked mask (a full or pass-through
        cache applies it: ``cache.chunked_attention``)."""
        n = self.num_hidden_layers
        if self.model_type != "llama4_text":
            return (0,) * n
        types = self.extra.get("layer_types")
        chunked = self.rope_layers if types is None else tuple(t == "chunked_attention" for t in types)
        size = int(self._deepseek("attention_chunk_size"))
        return tuple(size if c else 0 for c in chunked)

    @property
    def l2_qk_norm(self) -> tuple:
        """Per layer, Llama 4's L2 norm of q and k after RoPE (an RMSNorm without a weight, in float32, rounded; eps
        ``rms_norm_eps``) where ``use_qk_norm``, on its RoPE layers; all False for the other families."""
        if self.model_type != "llama4_text" or not self._deepseek("use_qk_norm"):
            return (False,) * self.num_hidden_layers
        return self.rope_layers

    @property
    def nope_temperature(self) -> tuple | None:
        """Llama 4 with ``attn_temperature_tuning``: ``(attn_scale, floor_scale)``, each query of a NoPE layer (not
        :attr:`rope_layers`') times ``1 + attn_scale * ln(1 + floor((position + 1) / floor_scale))``, computed in
        float32 and applied in float32, rounded once (transformers' Llama4TextAttention); None otherwise."""
        if self.model_type != "llama4_text" or not self._deepseek("attn_temperature_tuning"):
            return None
        return float(self._deepseek("attn_scale")), float(self._deepseek("floor_scale"))

    @property
    def rope_layers(self) -> tuple:
        """Per layer, whether it takes the model's RoPE (``rope_theta`` with ``rope_scaling``). The others take
        ``rope.rope_local_inv_freq``'s: Gemma 3's and OLMo 3's sliding layers plain RoPE with their own base
        (``local_rope_theta``), SmolLM3's NoPE layers (``no_rope_layers[i] == 0``; by default every
        ``no_rope_layer_interval``-th, 4) none."""
        n = self.num_hidden_layers
        if self.model_type == "gemma3_text":
            return tuple(not w for w in self.layer_windows)
        if self.model_type in ("olmo3", "modernbert-decoder"):  # by layer type, whatever the window (none, or one
            # past the context)
            sliding = _sliding_layers(self)[0]
            return (True,) * n if sliding is None else tuple(not s for s in sliding)
        if self.model_type == "lfm3":  # (its full layers the model's RoPE, its sliding ones their own base)
            return tuple(t == "full_attention" for t in _lfm3_layer_types(self) or ["full_attention"] * n)
        if self.model_type in ("mellum", "laguna"):  # by layer type (its list, else every layer full)
            types = self.extra.get("layer_types")
            return (True,) * n if not _layer_types_ok(types, n) else tuple(t == "full_attention" for t in types)
        if self.model_type == "mimo_v2_flash":  # by layer type (its list, else its pattern), whatever the window
            return tuple(not s for s in _sliding_layers(self)[0] or (False,) * n)
        if self.model_type == "granitemoehybrid":  # RoPE only with position_embedding_type 'rope' (else NoPE)
            return (self.extra.get("position_embedding_type") == "rope",) * n
        if self.model_type == "olmo_hybrid":  # (its NoPE mode: rope_parameters' rope_theta null)
            return (not self.extra.get("no_rope", False),) * n
        if self.model_type in ("nemotron_h", "jamba", "kimi_linear"):  # (their attention takes no RoPE)
            return (False,) * n
        if self.model_type in _GRANITE_SWAS:  # the layers of rope_theta's base (the others: NoPE, or one other base)
            return tuple(t == self.rope_theta for t in _granite_swa_thetas(self) or (self.rope_theta,) * n)
        if self.model_type == "cohere2_moe":  # RoPE on the sliding layers, and on the dense ones with a prefix pattern
            sliding = _sliding_layers(self)[0] or (False,) * n  # of 1 (force_rope)
            force = self._deepseek("prefix_dense_sliding_window_pattern") == 1
            return tuple(s or (force and not sparse) for s, sparse in zip(sliding, self.experts.layers))
        if self.model_type in ("afmoe", "flint"):  # RoPE on its sliding layers only, whatever the window
            return tuple(_sliding_layers(self)[0] or (True,) * n)
        if self.model_type in (*_EXAONES, "cohere2", "kolibri1"):  # with a window (any), RoPE on the sliding layers
            sliding = _sliding_layers(self)[0]  # only (Kolibri-1's: a window, always)
            if sliding is None or self.extra.get("sliding_window", 4096) is None:  # (Cohere 2's: none then)
                return (self.model_type in _EXAONES,) * n
            return tuple(sliding)
        if FAMILIES[self.model_type].learned_positions or self.alibi:  # (GPT-2's, OPT's, ALiBi's: no RoPE at all)
            return (False,) * n
        if self.model_type in ("smollm3", "llama4_text"):  # (Llama 4: an empty list is none, one longer than the
            given = self.extra.get("no_rope_layers")  # layers read as far as they go)
            if given:
                return tuple(bool(x) for x in given[:n])
            every = self.extra.get("no_rope_layer_interval", _SMOLLM3_INTERVAL)
            return tuple((i + 1) % every != 0 for i in range(n))
        return (True,) * n

    @property
    def position_offset(self) -> int | None:
        """Learned absolute position embeddings (GPT-2's ``wpe``): the row of position 0 in ``model.embed_positions``
        (its rows ``max_position_embeddings`` + this); None for the families without (RoPE's, NoPE's)."""
        family = FAMILIES[self.model_type]
        return family.position_offset if family.learned_positions else None

    @property
    def alibi(self) -> str:
        """ALiBi's rule for the slopes (:func:`alibi_slopes`): ``"bloom"``, ``"mpt"``, ``"falcon"`` (Falcon-RW's, by its
        ``alibi`` key), or ``""`` where the family has none."""
        if self.model_type == "falcon":
            return "falcon" if self.extra.get("alibi") else ""
        return FAMILIES[self.model_type].alibi

    @property
    def alibi_slopes(self) -> tuple | None:
        """ALiBi (BLOOM, MPT, Falcon-RW): per query head the slope ``m`` of ``verify_attention``'s ``alibi_slopes``
        (a score of a key ``d`` positions before its query gains ``-m * d``), float32 values; None without ALiBi."""
        kind = self.alibi  # (MPT's alibi_bias_max: 8, as transformers' MptModel builds them)
        return alibi_slopes(kind, self.num_attention_heads, 8.0, self.head_dim) if kind else None

    @property
    def embed_layernorm(self) -> bool:
        """BLOOM: a LayerNorm with a bias on the embeddings before the first layer (``model.embed_layernorm``)."""
        return FAMILIES[self.model_type].embed_layernorm

    @property
    def sinusoidal_positions(self) -> bool:
        """XGLM: ``model.embed_positions`` is fairseq's fixed sinusoid (:func:`sinusoidal_table`), computed, in no
        checkpoint."""
        return FAMILIES[self.model_type].sinusoidal_positions

    @property
    def mla(self) -> MLA | None:
        """DeepSeek's multi-head latent attention (:class:`MLA`), or None for every other family."""
        if self.model_type not in _MLAS:
            return None
        get = self._deepseek
        interleaved = self.model_type in ("deepseek_v2", *_DSAS) or bool(get("rope_interleave"))
        return MLA(get("q_lora_rank"), get("kv_lora_rank"), get("qk_nope_head_dim"), get("qk_rope_head_dim"),
                   get("v_head_dim"), interleaved)

    @property
    def dsa(self) -> DSA | None:
        """DeepSeek's sparse attention (:class:`DSA`), or None for every other family."""
        if self.model_type not in _DSAS:
            return None
        get = self._deepseek
        glm = self.model_type == "glm_moe_dsa"
        shared = tuple(t == "shared" for t in self._indexer_types()) if glm else (False,) * self.num_hidden_layers
        return DSA(get("index_n_heads"), get("index_head_dim"), get("index_topk"), glm, shared)

    def _indexer_types(self) -> list:
        """GLM-5's ``indexer_types`` as GlmMoeDsaConfig reads them: the list, else ``index_topk_pattern`` (``F`` /
        ``S`` per layer, or a list), else every ``index_topk_freq``-th layer full from ``index_skip_topk_offset - 1``
        on (those before full too)."""
        x, n = self.extra, self.num_hidden_layers
        if x.get("indexer_types") is not None:
            return x["indexer_types"]
        pattern = x.get("index_topk_pattern")
        if pattern is not None:
            if isinstance(pattern, str) and set(pattern) <= {"F", "S"}:
                return [{"F": "full", "S": "shared"}[c] for c in pattern]
            return list(pattern)
        freq, offset = max(x.get("index_topk_freq", 1), 1), x.get("index_skip_topk_offset", 2)
        return ["full" if max(i - offset + 1, 0) % freq == 0 else "shared" for i in range(n)]

    @property
    def experts(self) -> Experts | None:
        """A mixture of experts' sparse MLP (:class:`Experts`), or None for a dense family."""
        if self.model_type in _GROUPED:
            return self._deepseek_experts()
        if self.model_type == "lfm2_moe":  # (DeepSeek's router path: the logits and their sigmoid in the dtype, the
            get = self._deepseek  # expert bias choosing, renormalised over the sum + 1e-6, times the scale; the dtype)
            return Experts(get("num_experts"), get("num_experts_per_tok"), get("moe_intermediate_size"),
                           bool(get("norm_topk_prob")), False,
                           tuple(i >= get("num_dense_layers") for i in range(self.num_hidden_layers)),
                           scale=float(get("routed_scaling_factor")), scoring="sigmoid",
                           correction_bias=bool(get("use_expert_bias")), renormalize_eps=1e-6, grouped_router=True,
                           logits_in_dtype=True, scores_in_dtype=True)
        if self.model_type == "ernie4_5_moe":
            return self._ernie_experts()
        if self.model_type == "granitemoehybrid":  # (GraniteMoeShared's mixture, where it has experts)
            x = self.extra
            count = x.get("num_local_experts", FAMILIES["granitemoehybrid"].defaults["num_local_experts"])
            if count == 0:
                return None
            return Experts(count, x.get("num_experts_per_tok", 2), self.intermediate_size, True, False,
                           (True,) * self.num_hidden_layers, softmax_of_top_k=True,
                           shared_intermediate_size=self.dense_intermediate_size)
        if self.model_type == "afmoe":  # (DeepSeek's router path: the sigmoid of logits in the dtype, the correction
            get = self._deepseek  # bias, renormalised with V3's 1e-20, times route_scale; the weights in float32)
            width = get("moe_intermediate_size")
            return Experts(get("num_experts"), get("num_experts_per_tok"), width, True, True,
                           tuple(i >= get("num_dense_layers") for i in range(self.num_hidden_layers)),
                           shared_intermediate_size=width * get("num_shared_experts"), scale=float(get("route_scale")),
                           scoring="sigmoid", correction_bias=True, renormalize_eps=1e-20, grouped_router=True,
                           logits_in_dtype=True)
        if self.model_type == "minimax_m2":  # (DeepSeek's router path: the sigmoid, the correction bias)
            get = self._deepseek
            return Experts(get("num_local_experts"), get("num_experts_per_tok"), self.intermediate_size, True, True,
                           (True,) * self.num_hidden_layers, scoring="sigmoid", correction_bias=True,
                           grouped_router=True, logits_in_dtype=True)
        if self.model_type in ("kolibri1", "flint"):  # (DeepSeek's router path: Kolibri-1's the top k of the logits
            # plus the correction bias, Flint's of the float32 logits' sigmoid, its router's weight in float32; their
            # sigmoid as the weights; an ungated shared expert; Flint's dense layers Qwen2-MoE's)
            get, x = self._deepseek, self.extra
            flint = self.model_type == "flint"
            dense, step = set((get("mlp_only_layers") or ()) if flint else ()), get("decoder_sparse_step") or 1
            return Experts(next((x[k] for k in _EXPERT_COUNT_KEYS if k in x), get("num_experts")),
                           get("num_experts_per_tok"), get("moe_intermediate_size"), bool(get("norm_topk_prob")), True,
                           tuple(i not in dense and (i + 1) % step == 0 for i in range(self.num_hidden_layers)),
                           shared_intermediate_size=get("shared_expert_intermediate_size"), scoring="sigmoid",
                           correction_bias=not flint, grouped_router=True, bias_on_logits=not flint,
                           float32_router=flint)
        if self.model_type == "laguna":  # (DeepSeek's router path: the logits in the dtype, soft-capped; their sigmoid
            get, x = self._deepseek, self.extra  # plus the correction bias choosing; renormalised, in the dtype)
            types = get("mlp_layer_types") or ["dense"] + ["sparse"] * (self.num_hidden_layers - 1)
            return Experts(next((x[k] for k in _EXPERT_COUNT_KEYS if k in x), get("num_experts")),
                           get("num_experts_per_tok"), get("moe_intermediate_size"), True, False,
                           tuple(t == "sparse" for t in types),
                           shared_intermediate_size=get("shared_expert_intermediate_size"),
                           scale=float(get("moe_routed_scaling_factor")), scoring="sigmoid", correction_bias=True,
                           grouped_router=True, logits_in_dtype=True,
                           logit_softcap=float(get("moe_router_logit_softcapping") or 0.0))
        if self.model_type == "mellum":  # (Qwen3-MoE's, its sparse layers listed)
            get, x = self._deepseek, self.extra
            types = get("mlp_layer_types") or ["sparse"] * self.num_hidden_layers
            return Experts(next((x[k] for k in _EXPERT_COUNT_KEYS if k in x), get("num_experts")),
                           get("num_experts_per_tok"), get("moe_intermediate_size"), bool(get("norm_topk_prob")), False,
                           tuple(t == "sparse" for t in types))
        if self.model_type == "cohere2_moe":  # (the top k logits' softmax, GraniteMoE's way, or their sigmoid through
            get, x = self._deepseek, self.extra  # DeepSeek's router path, its logits in the dtype; in the dtype)
            k = get("first_k_dense_replace")
            types = get("mlp_layer_types") or ["dense" if i < k else "sparse" for i in range(self.num_hidden_layers)]
            kind = dict(softmax_of_top_k=True) if get("expert_selection_fn") == "softmax" else dict(
                scoring="sigmoid", grouped_router=True, logits_in_dtype=True)
            return Experts(next((x[k] for k in _EXPERT_COUNT_KEYS if k in x), get("num_experts")),
                           get("num_experts_per_tok"), self.intermediate_size,
                           bool(get("norm_topk_prob")) or "softmax_of_top_k" in kind, False,
                           tuple(t == "sparse" for t in types),
                           shared_intermediate_size=self.intermediate_size * get("num_shared_experts"),
                           shared_average=get("shared_expert_combination_strategy") == "average", **kind)
        if self.model_type == "hy_v3":  # (DeepSeek's router path: V3's without groups, renormalised always)
            get, x = self._deepseek, self.extra
            types = get("mlp_layer_types") or ["dense"] + ["sparse"] * (self.num_hidden_layers - 1)
            width = get("moe_intermediate_size")
            return Experts(next((x[k] for k in _EXPERT_COUNT_KEYS if k in x), get("num_experts")),
                           get("num_experts_per_tok"), width, True, True, tuple(t == "sparse" for t in types),
                           shared_intermediate_size=width * get("num_shared_experts"),
                           scale=float(get("router_scaling_factor")), scoring="sigmoid", correction_bias=True,
                           renormalize_eps=1e-20, grouped_router=True)
        if self.model_type == "aria_text":  # (the softmax of the top k logits, GraniteMoE's way; its shared experts as
            get = self._deepseek  # one MLP)
            return Experts(get("moe_num_experts"), get("moe_topk"), self.intermediate_size, True, False,
                           (True,) * self.num_hidden_layers, softmax_of_top_k=True,
                           shared_intermediate_size=self.intermediate_size * get("moe_num_shared_experts"))
        if self.model_type == "llama4_text":  # (the sigmoid of the top k logits, the chosen experts' inputs scaled by
            get, n = self._deepseek, self.num_hidden_layers  # it; a shared expert of intermediate_size)
            given, step = get("moe_layers"), get("interleave_moe_layer_step")
            sparse = set(given) if given is not None else set(range(step - 1, n, step)) if step >= 1 else set()
            if not sparse:  # (every layer dense: MobileLLM-R1's)
                return None
            return Experts(get("num_local_experts"), get("num_experts_per_tok"), self.intermediate_size, False, False,
                           tuple(i in sparse for i in range(n)), shared_intermediate_size=self.intermediate_size,
                           scoring="top_k_sigmoid", scaled_inputs=True)
        if self.model_type == "nemotron_h":  # (Nemotron 3's mixture blocks: DeepSeek-V3's router, float32, sigmoid
            # plus the correction bias within the groups of the best two, renormalised with 1e-20 where norm_topk_prob,
            # times routed_scaling_factor; ungated ReLU-squared experts and shared expert, their sum in float32)
            sparse = tuple(t == "moe" for t in self.block_types)
            if not any(sparse):
                return None
            get = self.extra.get
            return Experts(get("n_routed_experts", 8), get("num_experts_per_tok", 2),
                           get("moe_intermediate_size", 7688), bool(get("norm_topk_prob", True)), True, sparse,
                           shared_intermediate_size=get("moe_shared_expert_intermediate_size", 7688),
                           scale=float(get("routed_scaling_factor", 1.0)), scoring="sigmoid", correction_bias=True,
                           groups=(get("n_group", 1), get("topk_group", 1)), group_top2=True, renormalize_eps=1e-20,
                           grouped_router=True, gated=False, latent_size=get("moe_latent_size", None))
        if self.model_type == "jamba":  # (the softmax's top k, not renormalised, rounded to the dtype; every
            x = self.extra  # expert_layer_period-th layer from expert_layer_offset; one expert: none)
            if x["num_experts"] <= 1:
                return None
            period, offset = x["expert_layer_period"], x["expert_layer_offset"]
            return Experts(x["num_experts"], x["num_experts_per_tok"], self.intermediate_size, False, False,
                           tuple(i % period == offset for i in range(self.num_hidden_layers)))
        if self.model_type == "hunyuan_v1_moe":  # (the router's weight kept in float32; transformers' shared expert)
            get = self._deepseek
            return Experts(_first(get("num_experts")), _first(get("moe_topk")), self.intermediate_size, True, True,
                           (True,) * self.num_hidden_layers, shared_intermediate_size=self.intermediate_size,
                           float32_router=True)
        if self.model_type not in _MOE_TYPES:
            return None
        x = self.extra
        count = next(x[k] for k in _EXPERT_COUNT_KEYS if k in x)
        if self.model_type == "dbrx":  # (its top k of the softmax, normalised by their sum or not; the dtype's weights)
            return Experts(count, x["num_experts_per_tok"], self.intermediate_size,
                           x.get("moe_normalize_expert_weights", 1.0) is not None, False,
                           (True,) * self.num_hidden_layers)
        if self.model_type == "phimoe":  # (SparseMixer: two experts, its weights in the model's dtype)
            return Experts(count, x["num_experts_per_tok"], self.intermediate_size, False, False,
                           (True,) * self.num_hidden_layers, scoring="sparsemixer",
                           jitter_eps=float(x.get("router_jitter_noise", 0.01)))
        if self.model_type in ("mixtral", *_GRANITE_MOES, "jetmoe"):
            granite = self.model_type != "mixtral"
            return Experts(count, x["num_experts_per_tok"], self.intermediate_size, True, not granite,
                           (True,) * self.num_hidden_layers, softmax_of_top_k=granite,
                           shared_intermediate_size=x.get("shared_intermediate_size", 0),
                           output_bias=self.model_type == "jetmoe")
        if self.model_type in ("olmoe", "flex_olmo"):
            return Experts(count, x["num_experts_per_tok"], self.intermediate_size, x.get("norm_topk_prob", False),
                           False, (True,) * self.num_hidden_layers)
        if self.model_type == "gpt_oss":
            return Experts(count, x["num_experts_per_tok"], self.intermediate_size, True, False,
                           (True,) * self.num_hidden_layers, softmax_of_top_k=True, biases=True)
        dense, step = set(x.get("mlp_only_layers") or ()), x.get("decoder_sparse_step", 1)
        return Experts(count, x["num_experts_per_tok"], x["moe_intermediate_size"], x.get("norm_topk_prob", False),
                       False, tuple(i not in dense and (i + 1) % step == 0 for i in range(self.num_hidden_layers)),
                       shared_intermediate_size=x.get("shared_expert_intermediate_size", 0), shared_gated=True)

    def _ernie_experts(self) -> Experts:
        """ERNIE 4.5's mixture (transformers' Ernie4_5_MoeSparseMoeBlock) on DeepSeek's router path: the softmax of
        the logits in float32 (the router's weight float32), the top ``moe_k`` chosen by the probabilities plus the
        correction bias (``moe_statics``), weighted by the probabilities renormalised (``moe_norm_min``'s clamp
        never acts: checked) and rounded to the dtype; ``moe_num_shared_experts`` shared experts as one MLP."""
        get = self._deepseek
        n, every = self.num_hidden_layers, get("moe_layer_interval")
        start, end = get("moe_layer_start_index"), get("moe_layer_end_index")
        end = n - 1 if end == -1 else end
        width = get("moe_intermediate_size")
        return Experts(get("moe_num_experts"), get("moe_k"), width, True, False,
                       tuple((i + 1) % every == 0 and start <= i <= end for i in range(n)),
                       shared_intermediate_size=width * get("moe_num_shared_experts"),
                       correction_bias=True, grouped_router=True, float32_router=True)

    def _deepseek_experts(self) -> Experts:
        """DeepSeek's mixtures: sparse from ``first_k_dense_replace`` on, ``n_shared_experts`` shared experts as one
        MLP of ``n_shared_experts * moe_intermediate_size``, the weights kept in float32; V2's softmax (greedy, or
        within the ``topk_group`` groups of the best expert), V3's sigmoid with the correction bias within the groups
        of the best two, renormalised where ``norm_topk_prob``."""
        get, v3 = self._deepseek, self.model_type in _V3_ROUTERS
        width = get("moe_intermediate_size")
        # (V3's router with null groups: one group of every expert, as dots.llm1's config has it; V2's grouped
        # method without them raises in _check_deepseek_experts)
        grouped = (v3 and get("n_group") is not None) or get("topk_method") == "group_limited_greedy"
        n = self.num_hidden_layers
        if self.model_type in ("glm4_moe_lite", "mimo_v2_flash"):  # (its list, by default the first layer dense)
            types = self.extra.get("mlp_layer_types") or ["dense"] + ["sparse"] * (n - 1)
            layers = tuple(t == "sparse" for t in types)
        elif self.model_type == "kimi_linear":  # (its list, else its checkpoints' first_k_dense_replace, 1)
            k = self.extra.get("first_k_dense_replace", 1)
            types = self.extra.get("mlp_layer_types") or ["dense" if i < k else "sparse" for i in range(n)]
            layers = tuple(t == "sparse" for t in types)
        elif self.extra.get("mlp_layer_types") is not None:  # (DeepSeek-V3.2's list, else first_k_dense_replace's)
            layers = tuple(t == "sparse" for t in self.extra["mlp_layer_types"])
        elif self.model_type == "axk1":  # (AXK1Config's list from its legacy keys: the first k dense, then every n-th)
            k, every = self.extra.get("first_k_dense_replace", 1), self.extra.get("moe_layer_freq", 1)
            layers = tuple(i >= k and i % every == 0 for i in range(n))
        else:
            layers = tuple(i >= get("first_k_dense_replace") for i in range(n))
        exaone = self.model_type == "exaone_moe"  # (its keys' names)
        count, shared = get("num_experts" if exaone else "n_routed_experts"), get(
            "num_shared_experts" if exaone else "n_shared_experts")
        return Experts(count, get("num_experts_per_tok"), width, v3 and bool(get("norm_topk_prob")),
                       True, layers,
                       shared_intermediate_size=width * (shared or 0),
                       scale=float(get("routed_scaling_factor") or 1.0), scoring="sigmoid" if v3 else "softmax",
                       correction_bias=v3, groups=(get("n_group"), get("topk_group")) if grouped else None,
                       group_top2=v3, renormalize_eps=1e-20 if v3 else 0.0, grouped_router=True)

    @property
    def qk_norm(self) -> bool:
        """An RMSNorm on the queries and keys before RoPE: over ``head_dim`` on every head (Qwen3), or over each
        token's whole query and key projections where :attr:`qk_norm_full` (OLMoE); Cohere's (``use_qk_norm``: a
        LayerNorm over ``head_dim`` with weights of its own per head, ``[heads, head_dim]``; StableLM 2 12B's too, its
        ``qk_layernorm``); Phi's ``qk_layernorm``: torch's LayerNorm with a bias over ``head_dim``, shared by the
        heads."""
        family = FAMILIES[self.model_type]
        return family.qk_norm or (self.model_type in ("cohere", "glm4_moe") and bool(self.extra.get("use_qk_norm"))) \
            or (self.model_type in ("phi", "stablelm", "persimmon") and bool(self.extra.get("qk_layernorm")))

    @property
    def sub_norms(self) -> bool:
        """BitNet's RMSNorms on the heads' output before ``o_proj`` and on the gated MLP's product before
        ``down_proj``."""
        return FAMILIES[self.model_type].sub_norms

    @property
    def bitnet(self) -> dict | None:
        """BitNet's ``quantization_config`` (its projections ternary, its activations int8: triforce/models/bitnet.py),
        or None (float projections)."""
        q = self.extra.get("quantization_config")
        return q if self.model_type == "bitnet" and isinstance(q, dict) and q.get("quant_method") == "bitnet" else None

    @property
    def qk_norm_after_rope(self) -> bool:
        """The per-head q/k RMSNorm applied after RoPE (Hunyuan), not before. The model computes it as the same
        scores in a form RoPE commutes with: each key divided by its RMS before RoPE (which keeps a row's RMS) and
        the key norm's weight moved onto the queries (``q . (w * k) = (w * q) . k``), so that a cache re-rotates its
        keys as any family's (:class:`~triforce.models.llama.Attention`)."""
        return FAMILIES[self.model_type].qk_norm_after_rope

    @property
    def qk_norm_heads(self) -> bool:
        """The q/k norms' weights are per head, ``[heads, head_dim]`` (Cohere's, StableLM's: LayerNorms without a
        bias), not shared across the heads."""
        return self.model_type in ("cohere", "stablelm")

    @property
    def qk_norm_full(self) -> bool:
        """The q/k RMSNorm over each token's whole query (``hidden_size``) and key (``num_key_value_heads *
        head_dim``) projections, before the heads are split (OLMoE)."""
        return FAMILIES[self.model_type].qk_norm_full

    @property
    def clip_qkv(self) -> float | None:
        """OLMoE, OLMo: the queries (after their norm), keys (after theirs) and values clamped to ``[-c, c]``; None:
        no clamp."""
        c = self.extra.get("clip_qkv")
        return None if c is None else float(c)

    @property
    def float32_norm(self) -> bool:
        """RMSNorm's weight applied in float32 to the float32 normalised row, then rounded to the dtype (GPT-OSS)."""
        return FAMILIES[self.model_type].float32_norm

    @property
    def attention_sinks(self) -> bool:
        """A learned sink logit per query head (``self_attn.sinks``) in each softmax's denominator (GPT-OSS)."""
        return FAMILIES[self.model_type].attention_sinks

    def layer_heads(self, layer: int) -> int:
        """The query heads of ``layer``: ``num_attention_heads``; Laguna's ``num_attention_heads_per_layer``'s where
        given."""
        per = self.extra.get("num_attention_heads_per_layer") if self.model_type == "laguna" else None
        return int(per[layer]) if per else self.num_attention_heads

    @property
    def attention_experts(self) -> tuple | None:
        """JetMoE's mixture of attention heads: ``(experts, top_k)``, each token's query and output projections those
        of its router's top k experts (:class:`~triforce.models.llama.MixtureOfAttention`); None for the others."""
        if self.model_type != "jetmoe":
            return None
        return self.experts.count, self.experts.top_k

    @property
    def layer_rms_eps(self) -> float:
        """The eps of the decoder layers' norms: ``rms_norm_eps``; JetMoE's 1e-6 (its final norm takes the key's)."""
        return _JETMOE_LAYER_EPS if self.model_type == "jetmoe" else self.rms_norm_eps

    def layer_sinks(self, layer: int) -> bool:
        """Whether ``layer``'s attention has :attr:`attention_sinks` (MiMo-V2-Flash: its sliding layers only)."""
        if self.model_type == "mimo_v2_flash":
            return bool((_sliding_layers(self)[0] or [False] * (layer + 1))[layer])
        return self.attention_sinks

    def layer_kv_heads(self, layer: int) -> int:
        """The KV heads of ``layer``: ``num_key_value_heads``; twice that on MiMo-V2-Flash's sliding layers."""
        return self.kv_heads_per_layer[layer]

    @property
    def kv_heads_per_layer(self) -> tuple:
        """Each layer's KV heads (:meth:`layer_kv_heads`): the caches' layout with ``head_dim``; 0 on a layer that
        holds no keys (LFM2's convolutions: :attr:`conv_layers`)."""
        n, kv = self.num_hidden_layers, self.num_key_value_heads
        if self.model_type == "nemotron_h":  # (its attention blocks' only)
            return tuple(kv if t == "full_attention" else 0 for t in self.block_types)
        if self.parallel_mamba:  # (every layer attends beside its Mamba mixer)
            return (kv,) * n
        if self.model_type in _LFM2S or self.recurrent is not None:
            return tuple(0 if conv else kv for conv in self.conv_layers)
        if self.model_type != "mimo_v2_flash":
            return (kv,) * n
        return tuple(2 * kv if s else kv for s in _sliding_layers(self)[0] or [False] * n)

    @property
    def conv_layers(self) -> tuple:
        """A bool per layer: whether its mixer convolves its inputs instead of attending: LFM2's gated short convolution
        (:class:`~triforce.models.llama.ShortConv`) or a Mamba-2 layer (:attr:`mamba`, whose convolution feeds its
        state space model); the caches hold such a layer's last inputs (docs/model.md, "LFM2", "Mamba-2")."""
        if self.recurrent is not None:
            return self.recurrent.layers
        if self.model_type not in _LFM2S:
            return (False,) * self.num_hidden_layers
        return _lfm2_conv_layers(self)

    @property
    def block_types(self) -> tuple:
        """Nemotron-H's blocks, one per layer: ``"linear_attention"`` (a Mamba-2 mixer), ``"full_attention"``, ``"mlp"``
        or ``"moe"`` (Nemotron 3's mixture: :attr:`experts`; its layers_block_type); ``()`` for the other families (a
        layer is attention and MLP)."""
        if self.model_type != "nemotron_h":
            return ()
        types = self.extra.get("layers_block_type")
        return tuple(types) if isinstance(types, list) else ()

    @property
    def conv_kernel(self) -> int:
        """The convolution's taps (LFM2's ``conv_L_cache``, Mamba's ``mamba_d_conv``); 0 where no layer convolves."""
        if self.recurrent is not None:
            return self.recurrent.kernel
        default = FAMILIES[self.model_type].defaults.get("conv_L_cache", 3)
        return int(self.extra.get("conv_L_cache", default)) if any(self.conv_layers) else 0

    def conv_width(self, layer: int) -> int:
        """The channels a convolution layer convolves: LFM2's ``hidden_size``, Mamba's and gated DeltaNet's
        ``conv_dim``."""
        return self.recurrent.conv_dim if self.recurrent is not None else self.hidden_size

    @property
    def recurrent(self) -> "Mamba | DeltaNet | Mamba1 | None":
        """The layers whose state the caches carry from token to token (:attr:`mamba`, :attr:`delta` or
        :attr:`mamba1`; a model has one kind), or None."""
        return self.mamba if self.mamba is not None else self.delta if self.delta is not None else self.mamba1

    @property
    def mamba1(self) -> "Mamba1 | None":
        """Mamba(-1)'s layers (:class:`Mamba1`: every layer of a ``mamba`` model), or None."""
        if self.model_type not in _MAMBA1_KEYS:
            return None
        x = self.extra
        if self.model_type == "jamba":  # (its attention layers: every attn_layer_period-th from attn_layer_offset)
            period, offset = x["attn_layer_period"], x["attn_layer_offset"]
            layers = tuple(i % period != offset for i in range(self.num_hidden_layers))
            rank = x.get("mamba_dt_rank", "auto")
            return Mamba1(x["mamba_expand"] * self.hidden_size, x["mamba_d_state"], x["mamba_d_conv"],
                          -(-self.hidden_size // 16) if rank == "auto" else int(rank), bool(x["mamba_conv_bias"]),
                          bool(x["mamba_proj_bias"]), layers, self.rms_norm_eps, True) if any(layers) else None
        rank = x.get("mamba_dt_rank", "auto")
        return Mamba1(x["mamba_expand"] * self.hidden_size, x["mamba_d_state"], x["mamba_d_conv"],
                      -(-self.hidden_size // 16) if rank == "auto" else int(rank), bool(x["mamba_conv_bias"]),
                      bool(x["mamba_proj_bias"]), (True,) * self.num_hidden_layers,
                      float(x.get("mixer_rms_eps", 1e-6)) if self.model_type == "falcon_mamba" else None)

    @property
    def delta(self) -> "DeltaNet | None":
        """Qwen3-Next's and Qwen3.5's gated DeltaNet layers (:class:`DeltaNet`: its ``layer_types``'
        ``"linear_attention"`` layers), or None where no layer is one."""
        if self.model_type not in (*_DELTA_FAMILIES, "kimi_linear"):
            return None
        layers = tuple(t == "linear_attention" for t in _delta_layer_types(self) or ())
        if not any(layers):
            return None
        x = self.extra
        if self.model_type == "kimi_linear":  # (KDA: as many key as value heads, one width, a decay per key channel)
            get = lambda k: int(x.get(k, FAMILIES["kimi_linear"].defaults[k]))  # noqa: E731
            heads, dim = get("linear_num_heads"), get("linear_head_dim")
            return DeltaNet(heads, heads, dim, dim, get("linear_conv_kernel_dim"), layers, channel_decay=True)
        if self.model_type == "olmo_hybrid":  # (its widths' defaults from the attention's, as its config sets them)
            k_heads, v_heads = (x.get(k) or self.num_attention_heads for k in ("linear_num_key_heads",
                                                                                "linear_num_value_heads"))
            k_dim = x.get("linear_key_head_dim") or int(0.75 * self.hidden_size / k_heads)
            return DeltaNet(k_heads, v_heads, k_dim, x.get("linear_value_head_dim") or 2 * k_dim,
                            x.get("linear_conv_kernel_dim", 4), layers,
                            2.0 if x.get("linear_allow_neg_eigval", True) else 1.0, 1e-5)
        get = lambda k: int(x.get(k, _DELTA_DEFAULTS[k]))  # noqa: E731
        return DeltaNet(get("linear_num_key_heads"), get("linear_num_value_heads"), get("linear_key_head_dim"),
                        get("linear_value_head_dim"), get("linear_conv_kernel_dim"), layers)

    @property
    def mamba(self) -> "Mamba | None":
        """Granite 4.0's Mamba-2 layers (:class:`Mamba`: its ``layer_types``' ``"linear_attention"`` / ``"mamba"``
        layers), or None where no layer is one."""
        if self.model_type not in _MAMBA_FAMILIES:
            return None
        x = self.extra  # (no layer_types, or null: GraniteMoeHybridConfig's, every layer Mamba)
        if self.model_type == "nemotron_h":  # (its blocks: Mamba, attention or MLP, each after its own norm)
            types = ["mamba" if t in _MAMBA_TYPES else t for t in self.block_types]
        elif self.model_type == "falcon_h1":  # (every layer: beside its attention, LlamaConfig.parallel_mamba)
            types = ["mamba"] * self.num_hidden_layers
        elif self.model_type in ("bamba", "mamba2"):  # (its attention layers by index; none: every layer Mamba)
            attention = x.get("attn_layer_indices") or []
            types = ["attention" if i in attention else "mamba" for i in range(self.num_hidden_layers)]
        else:
            types = x.get("layer_types") or x.get("layers_block_type") or ["linear_attention"] * self.num_hidden_layers
        layers = tuple(t in _MAMBA_TYPES for t in types) if isinstance(types, list) else ()
        if not any(layers):
            return None
        get = lambda k: x.get(k, _MAMBA_DEFAULTS[k])  # noqa: E731
        heads, inner = get("mamba_n_heads"), get("mamba_expand") * self.hidden_size
        head_dim = get("mamba_d_head")
        if self.model_type == "nemotron_h":  # (its inner width: the heads', not expand's)
            inner = heads * head_dim
        dt_min = float(x.get("time_step_min", 0.001)) if self.model_type == "nemotron_h" else 0.0
        norm, out_bias = "gate_first", None
        if self.model_type == "falcon_h1":  # (its width mamba_d_ssm where given; its norm's place or none)
            inner = x.get("mamba_d_ssm") or inner
            norm = ("norm_first" if x.get("mamba_norm_before_gate", True) else "gate_first") \
                if x.get("mamba_rms_norm", False) else "none"
            out_bias = bool(x.get("projectors_bias", False))
        return Mamba(heads, inner // heads if head_dim == "auto" else head_dim, get("mamba_n_groups"),
                     get("mamba_d_state"), get("mamba_d_conv"), inner, bool(get("mamba_conv_bias")),
                     bool(get("mamba_proj_bias")), layers, dt_min, norm, out_bias)

    @property
    def parallel_mamba(self) -> bool:
        """Falcon-H1's layers: an attention and a Mamba-2 mixer (:attr:`mamba`) in parallel on the same normed input,
        ``h + attn(norm(h)) + mamba(norm(h))``; the caches hold both the layer's keys and its state."""
        return self.model_type == "falcon_h1"

    def _check_mamba(self) -> None:
        m = self.mamba
        if m.heads * m.head_dim != m.inner or m.heads % m.groups:
            raise ValueError(f"config: Mamba's mamba_n_heads ({m.heads}) x mamba_d_head ({m.head_dim}) must be "
                             f"mamba_expand x hidden_size ({m.inner}), and mamba_n_groups ({m.groups}) divide the "
                             "heads")

    @property
    def conv_bias(self) -> bool:
        """LFM2's ``conv_bias``: biases on a convolution layer's projections and its convolution."""
        return bool(self.extra.get("conv_bias", False))

    @property
    def value_head_dim(self) -> int:
        """The width of a head's value and output: ``head_dim``; MiMo-V2-Flash's ``v_head_dim`` (128 of 192). The
        caches hold values ``head_dim`` wide, a narrower value padded with zeros (docs/model.md, "MiMo-V2-Flash")."""
        return int(self._deepseek("v_head_dim")) if self.model_type == "mimo_v2_flash" else self.head_dim

    @property
    def value_scale(self) -> float | None:
        """MiMo-V2-Flash's ``attention_value_scale``: each value times it (in the dtype) before the cache; None: 1."""
        if self.model_type != "mimo_v2_flash":
            return None
        v = self._deepseek("attention_value_scale")
        return None if v is None else float(v)

    @property
    def sigmoid_head_gate(self) -> bool:
        """LFM3's output gate (``use_attention_gate``): each head's output times the sigmoid (in the dtype) of its own
        row of ``g_proj`` of the layer's input."""
        return self.model_type == "lfm3" and self.extra.get("use_attention_gate", True) is True

    @property
    def softplus_gate(self) -> str | None:
        """Laguna's output gate: the heads' output times the softplus of ``g_proj`` of the layer's input, one gate per
        head (``"head"``: its ``gating`` true or ``"per-head"``) or per dim (``"dim"``); None for the other families."""
        if self.model_type != "laguna":
            return None
        gating = self.extra.get("gating", FAMILIES["laguna"].defaults["gating"])
        return "head" if gating is True or gating == "per-head" else "dim"

    @property
    def moe_output_norm(self) -> bool:
        """An RMSNorm on each sparse MLP's output, the shared experts' included (A.X-K1's
        ``mlp.post_mlp_layernorm``)."""
        return self.model_type == "axk1"

    @property
    def float32_sinks(self) -> bool:
        """The attention sinks kept in float32 whatever the model's dtype, as transformers keeps Flint's
        (``_keep_in_fp32_modules_strict``)."""
        return FAMILIES[self.model_type].float32_sinks

    @property
    def swiglu_clamp(self) -> tuple | None:
        """GPT-OSS: ``(alpha, limit)`` of its experts' clamped SwiGLU (``swiglu_alpha``, ``swiglu_limit``); None
        for the other families."""
        if self.model_type != "gpt_oss":
            return None
        d = FAMILIES["gpt_oss"].defaults
        return float(self.extra.get("swiglu_alpha", d["swiglu_alpha"])), float(self.extra.get("swiglu_limit",
                                                                                             d["swiglu_limit"]))

    @property
    def gemma_norm(self) -> bool:
        """RMSNorm's weight applied as ``1 + w`` in float32 before rounding to the dtype (Gemma)."""
        return FAMILIES[self.model_type].gemma_norm

    @property
    def embed_norm(self) -> bool:
        """The final norm applied to the embeddings too, before the first layer (NanoChat)."""
        return FAMILIES[self.model_type].embed_norm

    @property
    def embed_scale(self) -> bool:
        """The embeddings multiplied by sqrt(hidden_size), rounded to the dtype (Gemma)."""
        return FAMILIES[self.model_type].embed_scale

    @property
    def activation(self) -> str:
        """The MLP's activation: ``"silu"`` (SwiGLU), ``"gelu_tanh"`` (GeGLU; StarCoder 2's ungated GELU),
        ``"swiglu_clamped"`` (GPT-OSS's experts: :attr:`swiglu_clamp`), ``"relu2"`` (Arcee's ungated ReLU
        squared), ``"gelu"`` (GPT-NeoX's exact GELU; its ``gelu_fast`` and ``gelu_new``: ``"gelu_tanh"``) or
        ``"xielu"`` (Apertus's ungated xIELU, with its learned numbers: llama.XIELU); GPT-2's ``"relu"`` by its
        key."""
        if self.model_type in ("gpt_neox", "gpt_neox_japanese") and self.extra.get("hidden_act", "gelu") != "gelu":
            return "gelu_tanh"  # (GPT-NeoX-20B's gelu_fast: the tanh form)
        if self.model_type == "openai-gpt":  # (its "gelu" is GELU's tanh form, transformers' gelu_new)
            return "relu" if self.extra.get("hidden_act", "gelu") == "relu" else "gelu_tanh"
        if self.model_type in (*_GPT2S, "opt", "gpt_neo", "biogpt", "xglm"):  # (the exact GELU or ReLU by their key;
            # else GELU's tanh form)
            act = self.extra.get("hidden_act", FAMILIES[self.model_type].hidden_acts[0])
            return act if act in ("gelu", "relu") else "gelu_tanh"
        return FAMILIES[self.model_type].activation

    @property
    def gated_mlp(self) -> bool:
        """The MLP is gated, ``down(act(gate(x)) * up(x))``; else ``down(act(up(x)))`` (StarCoder 2, Arcee)."""
        return FAMILIES[self.model_type].gated_mlp

    @property
    def torch_layer_norm(self) -> str:
        """The norms are torch's LayerNorm with a bias, in the model's dtype: ``"plain"`` (StarCoder 2's
        ``nn.LayerNorm``), ``"1p"`` (Nemotron's LayerNorm1P: the weight applied as ``1 + w``); ``"bare"``: OLMo's, with
        no weight and no bias, in float32; ``"nobias"``: a weight and no bias (DBRX's; ModernBERT decoder's unless
        ``norm_bias``); ``""``: not."""
        if self.model_type == "modernbert-decoder" and self.extra.get("norm_bias", False):
            return "plain"
        return FAMILIES[self.model_type].torch_layer_norm

    @property
    def first_attention_norm(self) -> bool:
        """A norm before the first layer's attention (False: ModernBERT decoder's, whose embeddings' norm is just
        before it)."""
        return self.model_type != "modernbert-decoder"

    @property
    def head_transform(self) -> str | None:
        """ModernBERT decoder's prediction head before the logits, ``norm(act(dense(z)))`` (``model.head_dense``,
        ``model.head_norm``): the activation's name (``classifier_activation``, the exact GELU); None: none."""
        return "gelu" if self.model_type == "modernbert-decoder" else None

    @property
    def head_transform_bias(self) -> bool:
        """A bias on :attr:`head_transform`'s dense layer (ModernBERT decoder's ``classifier_bias``)."""
        return bool(self.extra.get("classifier_bias", False))

    @property
    def rope_type(self) -> str:
        return "default" if self.rope_scaling is None else self.rope_scaling["rope_type"]

    # ---- Hugging Face config.json round trip
    @classmethod
    def from_dict(cls, d: dict) -> "LlamaConfig":
        """From a Hugging Face ``config.json`` dict, as transformers 4.x (top-level ``rope_theta`` and
        ``rope_scaling``) or 5.x (``rope_parameters`` holding ``rope_theta``, ``rope_type`` and the
        scaling keys) write it. Keys we neither implement nor know to be harmless raise ``ValueError``."""
        if not isinstance(d, dict):
            raise ValueError(f"a config must be a JSON object, got {type(d).__name__}")
        d = dict(d)
        model_type = d.setdefault("model_type", "llama")  # a config without one: Llama's, as ever
        if model_type == "kimi_k2":  # Kimi K2 (Moonshot): DeepSeek-V3's architecture and modeling code under its name
            if d.get("architectures", ["DeepseekV3ForCausalLM"]) != ["DeepseekV3ForCausalLM"]:
                raise ValueError(f"config model_type 'kimi_k2' with architectures {d['architectures']!r}: it is read "
                                 "as DeepSeek-V3 (DeepseekV3ForCausalLM, the architecture its config.json names)")
            model_type = d["model_type"] = "deepseek_v3"
        if model_type in WRAPPERS:
            return cls._from_wrapper(d)
        if model_type in _VL_TEXTS:
            model_type = _vl_text(d)
        if model_type not in FAMILIES:
            raise ValueError(f"config model_type {model_type!r} is not supported: triforce.models.Llama reads "
                             f"{_MODEL_TYPES} configs")
        if model_type == "modernbert-decoder":
            _modernbert_keys(d)
        _split_layer_rope(d)
        if model_type in _USE_BIAS:  # its one bias key: every projection's (attention_bias and mlp_bias here)
            for key in ("attention_bias", "mlp_bias"):
                if key in d:
                    raise ValueError(f"config key {key!r} is not read for model_type {model_type!r}: its biases "
                                     "are use_bias's (one key for every projection)")
            d["attention_bias"] = d["mlp_bias"] = d.pop("use_bias", model_type == "starcoder2")
        if model_type in ("phi", "persimmon"):  # (biases on every projection (Phi-2: and the head), always: no key
            for key in ("attention_bias", "mlp_bias"):  # says so)
                if key in d:
                    raise ValueError(f"config key {key!r} is not {model_type}'s config's: it has biases everywhere")
            d["attention_bias"] = d["mlp_bias"] = True
        if model_type == "gpt_neox":
            _gpt_neox_keys(d)
        if model_type == "gpt_neox_japanese":
            _gpt_neox_japanese_keys(d)
        if model_type in _GPTJS:
            _gptj_keys(d)
        if model_type in _GPT2S:
            _gpt2_keys(d)
        if model_type == "openai-gpt":
            _openai_gpt_keys(d)
        if model_type == "opt":
            _opt_keys(d)
        if model_type == "xglm":
            _own_names(d, _XGLM_NAMES, "XGLM")
        if model_type == "jetmoe":
            _jetmoe_keys(d)
        if model_type in _LFM2S:
            _own_names(d, _LFM2_NAMES if model_type == "lfm2" else {"tie_embedding": "tie_word_embeddings"}, "LFM2")
        if model_type == "mamba2":
            _mamba2_keys(d)
        if model_type in _MAMBA1S:
            _mamba1_keys(d)
        if model_type == "kimi_linear":
            _kimi_linear_keys(d)
        if model_type == "nemotron_h":
            _nemotron_h_keys(d)
        if model_type in ("biogpt", "xglm"):
            _biogpt_keys(d)
        if model_type == "gpt_neo":
            _gpt_neo_keys(d)
        if model_type == "falcon":
            _falcon_keys(d)
        if model_type == "bloom":
            _bloom_keys(d)
        if model_type == "mpt":
            _mpt_keys(d)
        if model_type == "dbrx":
            _dbrx_keys(d)
        if model_type == "internlm3":  # (its config's names of Llama's two bias keys: read as transformers reads them)
            for alias, key in _BIAS_ALIASES.items():
                if alias in d:
                    if key in d and d[key] != d[alias]:
                        raise ValueError(f"config keys {alias!r} = {d[alias]!r} and {key!r} = {d[key]!r} disagree "
                                         f"(InternLM3: {alias!r} is {key!r})")
                    d[key] = d.pop(alias)
            if d.get("attention_bias", False) != d.get("mlp_bias", False):
                raise ValueError("config: InternLM3's qkv_bias and bias must agree (transformers' InternLM3Config "
                                 "refuses them apart: Llama's attention_bias is on q, k, v and o)")
        if model_type == "olmo":  # (OlmoLayerNorm's eps is fixed; its config has no key for it: one is not read)
            d.pop("rms_norm_eps", None)
        if model_type in _NORM_EPS_KEY:  # its norms' eps (LayerNorm's): rms_norm_eps here
            d.pop("rms_norm_eps", None)  # (not its config's: transformers keeps it unread)
            if _NORM_EPS_KEY[model_type] in d:
                d["rms_norm_eps"] = d.pop(_NORM_EPS_KEY[model_type])
        if model_type == "minimax_m2" and "rotary_dim" in d:  # (its checkpoints' name of partial RoPE: transformers
            rotary, head = d.pop("rotary_dim"), d.get("head_dim", FAMILIES[model_type].defaults["head_dim"])  # reads
            if not (_is_int(rotary) and _is_int(head) and 0 < rotary <= head):  # it as the factor)
                raise ValueError(f"config rotary_dim = {rotary!r} must be an int in [1, head_dim = {head!r}]")
            d.setdefault("partial_rotary_factor", rotary / head)
        if model_type == "ernie4_5_moe":  # (transformers' aliases of its keys: attribute_map)
            for alias, key in (("num_experts", "moe_num_experts"), ("num_experts_per_tok", "moe_k")):
                if alias in d:
                    if key in d and d[key] != d[alias]:
                        raise ValueError(f"config keys {alias!r} = {d[alias]!r} and {key!r} = {d[key]!r} (its alias "
                                         "in transformers' Ernie4_5_MoeConfig) disagree")
                    d[key] = d.pop(alias)
        if model_type == "cohere2_moe":  # RMSNorm where rms_norm_eps is set (layer_norm_eps kept, unread: its presence
            if d.get("rms_norm_eps") is None:  # says so, LlamaConfig.layer_norm), else LayerNorm of layer_norm_eps
                d["rms_norm_eps"] = d.pop("layer_norm_eps", 1e-5)
            else:
                d.setdefault("layer_norm_eps", 1e-5)
        if model_type in _COHERES:  # its norms' eps (LayerNorm's): rms_norm_eps here
            d.pop("rms_norm_eps", None)  # (not CohereConfig's: transformers keeps it unread)
            if "layer_norm_eps" in d:
                d["rms_norm_eps"] = d.pop("layer_norm_eps")
        if model_type == "cohere2":
            if d.get("head_dim", d.get("hidden_size", 8192) // d.get("num_attention_heads", 64)) != \
                    d.get("hidden_size", 8192) // d.get("num_attention_heads", 64):
                raise ValueError(f"config head_dim = {d['head_dim']!r}: Cohere2Config sets it to hidden_size // "
                                 "num_attention_heads whatever the config says")
        if model_type == "phi3":
            _phi3_rope(d)
        if model_type == "phimoe":
            _phimoe_rope(d)
        if model_type == "minicpm3" and d.get("v_head_dim") is None:  # (MiniCPM3Config's: hidden / heads)
            family = FAMILIES[model_type].defaults
            d["v_head_dim"] = d.get("hidden_size", family["hidden_size"]) // d.get("num_attention_heads",
                                                                                   family["num_attention_heads"])
        if model_type in _MLAS:
            _mla_heads(d)
        if model_type == "ministral3" and d.get("rope_parameters") is None and d.get("rope_scaling") is None:
            d["rope_parameters"] = dict(_MINISTRAL3_ROPE)  # Ministral3Config's when the config has none
        if model_type == "gpt_oss" and d.get("rope_parameters") is None and d.get("rope_scaling") is None:
            d["rope_parameters"] = dict(_GPT_OSS_ROPE)  # GptOssConfig's
        if model_type in _OWN_LLAMA3_ROPE and d.get("rope_parameters") is None and d.get("rope_scaling") is None:
            name, rope = _OWN_LLAMA3_ROPE[model_type]  # its config's, whose base it keeps
            theta = d.pop("rope_theta", rope["rope_theta"])
            if theta != rope["rope_theta"]:  # (transformers would not read this one: say so)
                raise ValueError(f"config rope_theta = {theta!r} without a RoPE dict: {name} then takes Llama "
                                 f"3.1's RoPE at base {rope['rope_theta']} and not this base; give rope_scaling")
            d["rope_parameters"] = dict(rope)
        # transformers 5 writes the RoPE base inside rope_parameters: the family's default then does not apply
        inner = any(isinstance(d.get(k), dict) and "rope_theta" in d[k] for k in ("rope_parameters", "rope_scaling"))
        counts = [k for k in _EXPERT_COUNT_KEYS if k in d]
        if len(counts) == 2 and d[counts[0]] != d[counts[1]]:
            raise ValueError(f"config num_local_experts = {d['num_local_experts']!r} and num_experts = "
                             f"{d['num_experts']!r} differ (transformers reads one as the other); keep one")
        for k, v in FAMILIES[model_type].defaults.items():
            if not (k == "rope_theta" and inner) and not (k in _EXPERT_COUNT_KEYS and counts):
                d.setdefault(k, v)
        if model_type == "olmo_hybrid" and isinstance(d.get("rope_parameters"), dict) \
                and "rope_theta" in d["rope_parameters"] and d["rope_parameters"]["rope_theta"] is None:
            # (its NoPE mode: no rotary embedding at all, as OlmoHybridModel builds none without a base; a null
            # rope_parameters is transformers' default RoPE)
            base = FAMILIES["olmo_hybrid"].defaults["rope_theta"]
            d["rope_parameters"] = {**d["rope_parameters"], "rope_theta": base}
            d["no_rope"] = True
        d.update(_read_rope(d))
        names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        known = {k: v for k, v in d.items() if k in names}
        extra = {k: v for k, v in d.items() if k not in names}
        return cls(**known, extra=extra)

    @classmethod
    def _from_wrapper(cls, d: dict) -> "LlamaConfig":
        """An image + text wrapper's config (``WRAPPERS``): its ``text_config``, read as any config, with the
        wrapper's token ids where it has none. The wrapper's other keys must be its image side's or metadata,
        and its ``tie_word_embeddings`` (given or its default) must agree with the text model's."""
        kind = d["model_type"]
        text_type, own, tie_default = WRAPPERS[kind]
        if kind == "internvl_chat" and "llm_config" in d:  # (its language model's config, under its own name)
            if "text_config" in d:
                raise ValueError("config model_type 'internvl_chat' has both llm_config and text_config; keep one")
            d = {**d, "text_config": d["llm_config"]}
            del d["llm_config"]
        if kind in ("qwen2_5_omni", "qwen3_omni_moe"):  # (its thinker's config, a wrapper of the language model's)
            if "text_config" in d:
                raise ValueError(f"config model_type {kind!r}: its language model is its thinker's, under "
                                 "thinker_config, not text_config")
            d = {**{k: v for k, v in d.items() if k != "thinker_config"}, "text_config": d.get("thinker_config")}
        if "text_config" not in d and kind in _FLAT_WRAPPERS:  # the language model's keys at the top level
            d = {k: v for k, v in d.items() if k in own or k in _METADATA_KEYS or k in ("model_type",
                                                                                      "tie_word_embeddings")} | {
                "text_config": {k: v for k, v in d.items() if not (k in own or k in _METADATA_KEYS or k in (
                    "model_type", "tie_word_embeddings"))}}
        if "text_config" not in d:  # transformers would build one of its own defaults (Mistral3's: Mistral Small's)
            raise ValueError(f"config model_type {kind!r} has no text_config: the language model's keys are not "
                             "in it")
        text = d["text_config"] or {}
        if not isinstance(text, dict):
            raise ValueError(f"config model_type {kind!r}: text_config must be a JSON object, got {text!r}")
        text = dict(text)
        types = text_type if isinstance(text_type, tuple) else (text_type,)
        if "*" in types and text.setdefault("model_type", types[0]) in WRAPPERS:  # (any language model's)
            raise ValueError(f"config model_type {kind!r}: its text_config's model_type must be a language model's, "
                             f"got {text['model_type']!r}")
        if "*" not in types and text.setdefault("model_type", types[0]) not in types:
            raise ValueError(f"config model_type {kind!r}: its text_config's model_type must be "
                             f"{' or '.join(map(repr, types))}, got {text['model_type']!r}")
        for key, value in d.items():
            if key in ("bos_token_id", "eos_token_id", "pad_token_id", "quantization_config"):
                text.setdefault(key, value)  # (Ministral 3's FP8 checkpoints: the wrapper's quantization_config)
            elif key not in own and key not in _METADATA_KEYS and key not in (
                    "model_type", "text_config", "tie_word_embeddings"):
                raise ValueError(f"config key {key!r} of model_type {kind!r} (an image + text model whose "
                                 f"{types[0]!r} language model triforce.models.Llama reads) is not understood: "
                                 f"its language model's keys belong in text_config")
        if tie_default is None and "tie_word_embeddings" in d:  # the wrapper's key decides (transformers 5)
            text["tie_word_embeddings"] = d["tie_word_embeddings"]
        if tie_default == "either" and d.pop("tie_word_embeddings", False):  # tied where either key (or the text
            text["tie_word_embeddings"] = True  # model's default) says so (transformers 5's Qwen2VLConfig, LlavaConfig)
        elif isinstance(tie_default, tuple):  # the wrapper's key (at its default); text_config's is not read
            text["tie_word_embeddings"] = d.pop("tie_word_embeddings", tie_default[1])
        elif tie_default == "text":  # the language model's key alone; the wrapper's is not read
            d.pop("tie_word_embeddings", None)
        if kind == "aya_vision" and text["model_type"] in _COHERES:  # transformers' AyaVisionForConditionalGeneration
            text["logit_scale"] = 1.0  # takes the head's logits as they are, without the text model's logit_scale
            # (vLLM's Aya Vision applies it)
        config = cls.from_dict(text)
        tie = d.get("tie_word_embeddings", tie_default if isinstance(tie_default, bool) else config.tie_word_embeddings)
        if tie != config.tie_word_embeddings:
            raise ValueError(f"config model_type {kind!r}: tie_word_embeddings = {tie!r} (the wrapper's, which "
                             f"transformers follows) disagrees with its text_config's ({config.tie_word_embeddings})")
        return config

    @classmethod
    def from_json_file(cls, path: str | os.PathLike) -> "LlamaConfig":
        with open(path) as f:
            return cls.from_dict(json.load(f))

    def to_dict(self) -> dict:
        """``config.json`` dict in the transformers 4.x spelling (top-level ``rope_theta`` and
        ``rope_scaling``), which transformers 5 reads too."""
        family = FAMILIES[self.model_type]
        d = {**self.extra, **{f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "extra"}}
        for name in ("attention_bias", "mlp_bias"):
            if name not in family.reads:  # always false (checked), and not a key of the family's config
                del d[name]
        d.setdefault("architectures", [family.architecture])
        if d.pop("no_rope", False):  # (OLMo Hybrid's NoPE: its base null, as its config says it)
            d.pop("rope_scaling", None)
            d.pop("rope_theta", None)
            d["rope_parameters"] = {"rope_type": "default", "rope_theta": None}
        if "hidden_activation" not in d:  # (Gemma's transformers 4.x / Gemma 3's own key says it)
            d.setdefault("hidden_act", family.hidden_acts[0])
        if self.rope_type == "longrope":  # Phi3Config takes the top-level key (4096 when absent) over the inner one
            d.setdefault("original_max_position_embeddings", self.rope_scaling["original_max_position_embeddings"])
        if self.bitnet is None:  # what it saves is float (MXFP4 and FP8 weights: dequantised on loading); BitNet's
            d.pop("quantization_config", None)  # ternary layers are saved as they are loaded
        if self.model_type == "mistral":  # none given: none (a config.json without the key means 4096)
            d.setdefault("sliding_window", None)
        if self.model_type == "gemma3_text":  # the values this config reads where it has none of its own
            for k in ("sliding_window", "query_pre_attn_scalar", "rope_local_base_freq"):
                d.setdefault(k, FAMILIES["gemma3_text"].defaults[k])
        if self.model_type == "phimoe" and self.rope_type == "longrope" and "attention_factor" in self.rope_scaling:
            rope = d["rope_scaling"] = dict(self.rope_scaling)  # (its mscales, which PhimoeConfig needs)
            rope["short_mscale"] = rope["long_mscale"] = rope.pop("attention_factor")
        if self.model_type in _GEMMA2S:
            for k in ("sliding_window", "query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping"):
                d.setdefault(k, FAMILIES[self.model_type].defaults[k])
        if self.model_type in _USE_BIAS:  # (its one bias key)
            d["use_bias"] = d.pop("attention_bias")
            del d["mlp_bias"]
        if self.model_type in _NORM_EPS_KEY:  # (its norms' eps under its own key)
            d[_NORM_EPS_KEY[self.model_type]] = d.pop("rms_norm_eps")
        if self.model_type in ("phi", "persimmon"):  # (always biased: not its config's keys)
            del d["attention_bias"], d["mlp_bias"]
        if self.model_type in ("olmo", "opt", "biogpt", "xglm"):  # (fixed: not its config's)
            del d["rms_norm_eps"]
        if self.model_type == "xglm":  # (XGLMConfig's names)
            for old, new in _XGLM_NAMES.items():
                d[old] = d.pop(new)
        if self.model_type in ("biogpt", "xglm"):  # (biases everywhere, MHA, one head_dim, no RoPE: none of its
            # config's keys)
            for key in ("attention_bias", "mlp_bias", "num_key_value_heads", "head_dim", "rope_theta", "rope_scaling",
                        "partial_rotary_factor"):
                d.pop(key, None)
        if self.model_type == "gpt_neo":  # (GPTNeoConfig's names; MHA, one head_dim, biased MLPs, no RoPE)
            for old, new in _GPT_NEO_NAMES.items():
                d[old] = d.pop(new)
            if d["intermediate_size"] == 4 * self.hidden_size:  # (its config's null, as they write it)
                d["intermediate_size"] = None
            for key in ("mlp_bias", "num_key_value_heads", "head_dim", "rope_theta", "rope_scaling",
                        "partial_rotary_factor"):
                d.pop(key, None)
        if self.model_type == "opt":  # (OPTConfig's names, its one bias switch; MHA, one head_dim, no RoPE)
            for old, new in _OPT_NAMES.items():
                d[old] = d.pop(new)
            d["enable_bias"] = d.pop("attention_bias")
            for key in ("mlp_bias", "num_key_value_heads", "head_dim", "rope_theta", "rope_scaling",
                        "partial_rotary_factor"):
                d.pop(key, None)
        if self.model_type == "dbrx":  # (its own names, its attn_config and ffn_config)
            x = self.extra
            d["attn_config"] = {"kv_n_heads": self.num_key_value_heads, "clip_qkv": self.clip_qkv,
                                "rope_theta": self.rope_theta}
            d["ffn_config"] = {"ffn_hidden_size": self.intermediate_size, "moe_num_experts": self.experts.count,
                               "moe_top_k": self.experts.top_k, "ffn_act_fn": {"name": "silu"},
                               "moe_normalize_expert_weights": x.get("moe_normalize_expert_weights", 1.0)}
            for theirs, ours in _DBRX_TOP.items():
                d[theirs] = d.pop(ours)
            for key in ("num_key_value_heads", "head_dim", "intermediate_size", "num_local_experts", "hidden_act",
                        "num_experts_per_tok", "clip_qkv", "moe_normalize_expert_weights", "rms_norm_eps"):
                d.pop(key, None)
        if self.model_type == "falcon":  # (its layout keys, in extra, say these)
            for key in ("num_key_value_heads", "head_dim", "intermediate_size", "attention_bias", "mlp_bias",
                        "hidden_act"):
                d.pop(key, None)
            d["ffn_hidden_size"] = self.intermediate_size
            d["bias"] = self.attention_bias
        if self.model_type in ("bloom", "mpt"):  # (their configs' names; MHA, 4 x hidden, ALiBi: not their keys)
            for old, new in (_BLOOM_NAMES if self.model_type == "bloom" else _MPT_NAMES).items():
                if new in d:
                    d[old] = d.pop(new)
            for key in ("intermediate_size", "num_key_value_heads", "head_dim", "mlp_bias", "attention_bias",
                        "rope_theta", "rope_scaling", "partial_rotary_factor", "hidden_act"):
                d.pop(key, None)
        if self.model_type == "mpt":  # (its attn_config, the read keys from extra)
            d["attn_config"] = {"alibi": True, "alibi_bias_max": 8, **{key: d.pop(key, None) for key in _MPT_ATTN}}
        if self.model_type == "openai-gpt":  # (OpenAIGPTConfig's names; MHA, 4 x n_embd, biases, no RoPE: not keys)
            for old, new in _OPENAI_NAMES.items():
                d[old] = d.pop(new)
            for key in ("intermediate_size", "num_key_value_heads", "head_dim", "mlp_bias", "attention_bias",
                        "rope_theta", "rope_scaling", "partial_rotary_factor"):
                d.pop(key, None)
        if self.model_type in (*_GPTJS, *_GPT2S):  # its own keys (GPTJConfig's names, GPT2Config's too; MHA, one
            for old, new in _GPTJ_NAMES.items():  # head_dim, biased MLPs; GPT-J's RoPE's dims, GPT-2's none)
                if new in d:
                    d[old] = d.pop(new)
            if d["n_inner"] == 4 * d["n_embd"]:  # (their configs' null, as they write it)
                d["n_inner"] = None
            for key in ("num_key_value_heads", "head_dim", "mlp_bias", "attention_bias", "rope_theta", "rope_scaling"):
                d.pop(key, None)
            if self.model_type in _GPTJS:
                d["rotary_dim"] = self.rotary_dim
            if self.model_type == "gpt_bigcode":  # (its one KV head, or every head's own)
                d["multi_query"] = self.num_key_value_heads == 1
            d.pop("partial_rotary_factor", None)
        if self.model_type in ("gpt_neox", "gpt_neox_japanese"):  # its own keys (MHA, one head_dim, the MLP's
            del d["num_key_value_heads"], d["head_dim"]  # biases: none of its config's)
            d.pop("mlp_bias", None)
            d["rotary_emb_base"] = d.pop("rope_theta")
            d["rotary_pct"] = d.pop("partial_rotary_factor", FAMILIES[self.model_type].partial_rotary_factor)
        if self.model_type == "modernbert-decoder":  # (MHA, one head_dim: not its config's keys; its activation's key)
            del d["num_key_value_heads"], d["head_dim"]
            d["hidden_activation"] = d.pop("hidden_act")
        if self.model_type == "jetmoe":  # (its config's names of the head width and the activation)
            for ours, theirs in ((v, k) for k, v in _JETMOE_NAMES.items()):
                d[theirs] = d.pop(ours)
        if self.model_type == "nemotron_h":  # (NemotronHConfig's names; no RoPE: not its keys)
            for key in ("rope_theta", "rope_scaling", "partial_rotary_factor", "intermediate_size_mlp"):
                d.pop(key, None)
            for theirs, ours in _NEMOTRON_H_NAMES.items():
                if ours in d:
                    d[theirs] = d.pop(ours)
        if self.model_type in ("jamba", "kimi_linear"):  # (no RoPE: not their keys)
            for key in ("rope_theta", "rope_scaling", "partial_rotary_factor"):
                d.pop(key, None)
        if self.model_type in (*_MAMBA1S, "mamba2"):  # (MambaConfig's / Mamba2Config's names; no attention, no MLP, no
            # positions: not their keys)
            for key in ("num_attention_heads", "num_key_value_heads", "intermediate_size", "head_dim",
                        "max_position_embeddings", "rope_theta", "rope_scaling", "partial_rotary_factor"):
                d.pop(key, None)
            for theirs, ours in (_MAMBA1_NAMES if self.model_type in _MAMBA1S else _MAMBA2_NAMES).items():
                if ours in d:
                    d[theirs] = d.pop(ours)
        if self.model_type == "gpt_neox_japanese":  # (its MLP's width as a multiple of hidden_size)
            width = d.pop("intermediate_size")
            d["intermediate_multiple_size"] = width // self.hidden_size if width % self.hidden_size == 0 \
                else width / self.hidden_size
        if self.model_type in _COHERES or self.model_type == "cohere2_moe" and self.layer_norm:  # (its norms' eps
            d["layer_norm_eps"] = d.pop("rms_norm_eps")  # under its own key)
            if self.model_type == "cohere2_moe":
                d["rms_norm_eps"] = None
        if self.model_type in _MLAS:  # transformers' per-head values (the latent KV head is MLA's: from_dict)
            d["num_key_value_heads"], d["head_dim"] = self.num_attention_heads, self.mla.qk_rope_head_dim
        if self.model_type == "kimi_linear":  # (KimiLinearConfig's names)
            for theirs, ours in _KIMI_NAMES.items():
                if ours in d:
                    d[theirs] = d.pop(ours)
        if self.model_type in ("olmo3", *_OWN_ROPES, "modernbert-decoder"):  # its sliding layers' own base:
            local = d.pop("rope_local_base_freq", None)  # rope_parameters per layer type (Olmo3Config's;
            # MellumConfig's, LagunaConfig's, MiMoV2FlashConfig's, ModernBertDecoderConfig's always)
            if self.model_type in (*_OWN_ROPES, "modernbert-decoder") or local is not None \
                    and local != self.rope_theta:
                local = (self.local_rope_theta if self.model_type == "modernbert-decoder" else self.rope_theta) \
                    if local is None else local
                full = {"rope_type": "default", **(self.rope_scaling or {}), "rope_theta": self.rope_theta}
                if "partial_rotary_factor" in d:  # (Laguna's full layers': inside their dict)
                    full["partial_rotary_factor"] = d.pop("partial_rotary_factor")
                d["rope_parameters"] = {"full_attention": full,
                                        "sliding_attention": {"rope_type": "default", "rope_theta": local}}
                if self.model_type == "laguna":  # (LagunaConfig's form: its sliding layers' whole head)
                    d["rope_parameters"]["sliding_attention"]["partial_rotary_factor"] = 1.0
                if self.model_type == "mimo_v2_flash":  # (its one share, in both: 0.334 where a dict has none)
                    share = full.setdefault("partial_rotary_factor", FAMILIES["mimo_v2_flash"].partial_rotary_factor)
                    d["rope_parameters"]["sliding_attention"]["partial_rotary_factor"] = share
                del d["rope_theta"], d["rope_scaling"]
        return d

    def replace(self, **changes) -> "LlamaConfig":
        return dataclasses.replace(self, **changes)


def _multi_head_keys(d: dict, model_type: str, config: str):
    """Raise where ``d`` gives KV heads or a head_dim other than multi-head attention's (a family whose ``config`` class
    has neither key: every head its own keys, hidden_size // num_attention_heads wide); -> its hidden_size."""
    defaults = FAMILIES[model_type].defaults
    heads, hidden = (d.get(k, defaults[k]) for k in ("num_attention_heads", "hidden_size"))
    per_head = hidden // heads if _is_int(heads) and _is_int(hidden) and heads > 0 else None
    for key, want in (("num_key_value_heads", heads), ("head_dim", per_head)):
        if key in d and d[key] != want:
            raise ValueError(f"config {key} = {d[key]!r} is not {config}'s: it is multi-head attention of head_dim "
                             f"hidden_size // num_attention_heads ({want!r})")
    return hidden


def _gpt_neox_keys(d: dict) -> None:
    """A GPT-NeoX config's keys in ``d`` under the model's names, in place: rotary_pct and rotary_emb_base as
    partial_rotary_factor and rope_theta (each may be given once), its MLP's biases (always: mlp_bias); the keys
    GPTNeoXConfig does not read and the model would (mlp_bias, num_key_value_heads or head_dim other than MHA's)
    raise."""
    _multi_head_keys(d, "gpt_neox", "GPTNeoXConfig")
    if "mlp_bias" in d:
        raise ValueError("config key 'mlp_bias' is not GPTNeoXConfig's: its MLP always has biases")
    d["mlp_bias"] = True
    _own_names(d, _NEOX_ROPE_KEYS, "GPT-NeoX")


def _gpt_neox_japanese_keys(d: dict) -> None:
    """A GPT-NeoX Japanese config's keys in ``d`` under the model's names, in place: rotary_pct and rotary_emb_base
    as GPT-NeoX's, intermediate_multiple_size as intermediate_size (hidden_size times it, as its MLP's width); the
    keys GPTNeoXJapaneseConfig does not read and the model would (biases: it has none but the last layer's output
    one; KV heads or a head_dim other than multi-head attention's; a width of its own) raise."""
    hidden = _multi_head_keys(d, "gpt_neox_japanese", "GPTNeoXJapaneseConfig")
    _refuse_keys(d, ("attention_bias", "mlp_bias", "intermediate_size"), "GPTNeoXJapaneseConfig",
                 "its projections are unbiased (the last layer's output bias aside), its MLP hidden_size * "
                 "intermediate_multiple_size wide")
    multiple = d.pop("intermediate_multiple_size", _NEOX_JA_WIDTH)
    if not (_is_number(multiple) and multiple > 0 and _is_int(hidden) and int(hidden * multiple) >= 1):
        raise ValueError(f"config intermediate_multiple_size = {multiple!r} must be a number > 0 (the MLP is "
                         "int(hidden_size * it) wide)")
    d["intermediate_size"] = int(hidden * multiple)  # (as GPTNeoXJapaneseMLP computes it)
    d["attention_bias"] = d["mlp_bias"] = False
    _own_names(d, _NEOX_ROPE_KEYS, "GPT-NeoX Japanese")


def _modernbert_keys(d: dict) -> None:
    """A ModernBERT decoder config's keys in ``d`` under the model's, in place, as ModernBertDecoderConfig reads them:
    multi-head attention (KV heads or a head_dim other than its own raise), hidden_activation as hidden_act, its
    sliding window local_attention // 2 (a sliding_window key is not read: transformers computes it), its RoPE bases
    global_rope_theta / local_rope_theta (transformers 4.x's) as rope_parameters per layer type, its
    global_attn_every_n_layers as layer_types."""
    family = FAMILIES["modernbert-decoder"]
    _multi_head_keys(d, "modernbert-decoder", "ModernBertDecoderConfig")
    _own_names(d, {"hidden_activation": "hidden_act"}, "ModernBERT decoder")
    local = d.pop("local_attention", _MODERNBERT_LOCAL)
    if not (_is_int(local) and local >= 2):
        raise ValueError(f"config local_attention = {local!r} must be an int >= 2 (its sliding layers see "
                         "local_attention // 2 tokens)")
    d["local_attention"], d["sliding_window"] = local, local // 2  # (its config's own, whatever sliding_window says)
    if "layer_types" not in d:
        every = d.pop("global_attn_every_n_layers", _MODERNBERT_EVERY)
        if not (_is_int(every) and every >= 1):
            raise ValueError(f"config global_attn_every_n_layers = {every!r} must be an int >= 1")
        n = d.get("num_hidden_layers", family.defaults["num_hidden_layers"])
        if _is_int(n) and n >= 1:
            d["layer_types"] = ["sliding_attention" if i % every else "full_attention" for i in range(n)]
    else:
        d.pop("global_attn_every_n_layers", None)  # (layer_types say it)
    theta = {"full_attention": d.pop("global_rope_theta", None), "sliding_attention": d.pop("local_rope_theta", None)}
    params = d.get("rope_parameters")
    if params is None and d.get("rope_scaling") is None:
        defaults = {"full_attention": family.defaults["rope_theta"], "sliding_attention": _MODERNBERT_LOCAL_THETA}
        d["rope_parameters"] = {kind: {"rope_type": "default", "rope_theta": defaults[kind] if t is None else t}
                                for kind, t in theta.items()}
    elif any(t is not None for t in theta.values()):
        raise ValueError("config: global_rope_theta / local_rope_theta (transformers 4.x's) with rope_parameters or "
                         "rope_scaling: give one")


def _jetmoe_keys(d: dict) -> None:
    """JetMoE's keys as the model's, in ``d``: ``kv_channels`` (head_dim) and ``activation_function`` (hidden_act, SiLU
    only: its MLP and attention experts' gate); ``num_attention_heads`` the query heads of its attention's chosen
    experts, ``num_key_value_heads * num_experts_per_tok`` (as JetMoeConfig sets it; another raises)."""
    if "head_dim" in d:
        raise ValueError("config key 'head_dim' is not JetMoE's: its heads' width is kv_channels")
    _own_names(d, _JETMOE_NAMES, "JetMoE")
    defaults = FAMILIES["jetmoe"].defaults
    kv, k = (d.get(key, defaults[key]) for key in ("num_key_value_heads", "num_experts_per_tok"))
    if _is_int(kv) and _is_int(k) and d.setdefault("num_attention_heads", kv * k) != kv * k:
        raise ValueError(f"config num_attention_heads = {d['num_attention_heads']!r}: JetMoE's are its chosen "
                         f"attention experts' heads, num_key_value_heads * num_experts_per_tok = {kv * k}")


def _own_names(d: dict, names: dict, family: str) -> None:
    """``d``'s keys under a family's own names (``names``: its name -> the model's) renamed in place; a setting given
    under both names must agree."""
    for old, new in names.items():
        if old in d:
            if new in d and d[new] != d[old]:
                raise ValueError(f"config {old} = {d[old]!r} and {new} = {d[new]!r} disagree ({family}'s name and "
                                 "the common one of one setting); keep one")
            d[new] = d.pop(old)


# keys the configs of GPT-J, GPT-2, GPT-Neo, OPT, BioGPT and XGLM do not have, which the model would read: a RoPE's,
# head_dim, the bias switches (each family refuses them, and its own more: _refuse_keys)
_NOT_READ_HERE = ("rope_theta", "rope_scaling", "rope_parameters", "partial_rotary_factor", "head_dim", "mlp_bias",
                  "attention_bias")


def _refuse_keys(d: dict, keys, config: str, why: str) -> None:
    """Raise naming the first of ``keys`` in ``d``: not a key of ``config`` (its transformers class), ``why``."""
    for key in keys:
        if key in d:
            raise ValueError(f"config key {key!r} is not {config}'s: {why}")


def _four_times_hidden(d: dict, family: str):
    """``d``'s ``intermediate_size``, 4 x ``hidden_size`` where null or absent (GPT-J's, GPT-2's, GPT-Neo's rule), set
    in place; -> ``d``'s hidden size (``family``'s default where absent)."""
    hidden = d.get("hidden_size", FAMILIES[family].defaults["hidden_size"])
    if d.get("intermediate_size") is None and _is_int(hidden):
        d["intermediate_size"] = 4 * hidden
    return hidden


def _gptj_keys(d: dict) -> None:
    """A GPT-J config's keys in ``d`` under the model's names, in place (:data:`_GPTJ_NAMES`; each given once):
    ``n_inner`` null as 4 * ``n_embd``, ``rotary_dim`` as ``partial_rotary_factor``, its MLP's
    biases (always). Keys GPTJConfig does not read and the model would (a RoPE base or scaling, KV heads, head_dim,
    biases) raise."""
    _own_names(d, _GPTJ_NAMES, "GPT-J")
    _refuse_keys(d, (*_NOT_READ_HERE, "num_key_value_heads"), "GPTJConfig", "GPT-J is multi-head attention of head_dim "
                 "hidden_size // n_head, RoPE at base 10000 on rotary_dim dims, biased MLPs, unbiased attention")
    family = FAMILIES["gptj"].defaults
    hidden, heads = _four_times_hidden(d, "gptj"), d.get("num_attention_heads", family["num_attention_heads"])
    d["mlp_bias"] = True
    rotary = d.pop("rotary_dim", _GPTJ_ROTARY)
    if _is_int(hidden) and _is_int(heads) and heads > 0 and hidden % heads == 0:
        head = hidden // heads
        if not (_is_int(rotary) and 0 < rotary <= head and rotary % 2 == 0):  # (GPTJConfig's: an int)
            raise ValueError(f"config rotary_dim = {rotary!r} must be an even int in [2, head_dim = {head}]")
        if rotary < head:
            d["partial_rotary_factor"] = rotary / head


def _gpt2_keys(d: dict) -> None:
    """A GPT-2 or GPT-BigCode config's keys in ``d`` under the model's names, in place (:data:`_GPTJ_NAMES`,
    GPT2Config's too; each given once): ``n_inner`` null as 4 * ``n_embd``, biases everywhere (always), GPT-BigCode's
    ``multi_query`` (default true) as one KV head (its config's num_key_value_heads, written by transformers, must
    agree). Keys GPT2Config does not read and the model would (RoPE's, KV heads, head_dim, the bias switches) raise."""
    _own_names(d, _GPTJ_NAMES, "GPT-2")
    if d["model_type"] == "gpt_bigcode":
        mq = d.pop("multi_query", True)
        heads = d.get("num_attention_heads", FAMILIES["gpt2"].defaults["num_attention_heads"])
        if not isinstance(mq, bool):
            raise ValueError(f"config multi_query must be true or false, got {mq!r}")
        kv = d.pop("num_key_value_heads", 1 if mq else heads)
        if kv != (1 if mq else heads):
            raise ValueError(f"config num_key_value_heads = {kv!r} disagrees with multi_query = {mq} (GPT-BigCode: one "
                             "KV head with it, every head's own without)")
        d["num_key_value_heads"] = kv
    _refuse_keys(d, (*_NOT_READ_HERE, *(("num_key_value_heads",) if d["model_type"] == "gpt2" else ())),
                 "GPT2Config", "GPT-2 is multi-head attention of head_dim n_embd // n_head with learned positions (no "
                 "RoPE) and biases on every projection")
    _four_times_hidden(d, "gpt2")
    d["attention_bias"] = d["mlp_bias"] = True


def _openai_gpt_keys(d: dict) -> None:
    """A GPT-1 config's keys in ``d`` under the model's names, in place (:data:`_OPENAI_NAMES`; each given once): an
    MLP of 4 x ``n_embd`` (its config has no key for it), biases everywhere. Keys OpenAIGPTConfig does not read and
    the model would (RoPE's, KV heads, head_dim, the MLP's width, the bias switches) raise."""
    _own_names(d, _OPENAI_NAMES, "GPT-1")
    _refuse_keys(d, (*_NOT_READ_HERE, "num_key_value_heads", "intermediate_size"), "OpenAIGPTConfig",
                 "GPT-1 is multi-head attention of head_dim n_embd // n_head with learned positions (no RoPE), an MLP "
                 "of 4 x n_embd and biases on every projection")
    _four_times_hidden(d, "openai-gpt")
    d["attention_bias"] = d["mlp_bias"] = True


def _gpt_neo_keys(d: dict) -> None:
    """A GPT-Neo config's keys in ``d`` under the model's names, in place (:data:`_GPT_NEO_NAMES`; each given once):
    ``intermediate_size`` null as 4 * ``hidden_size``, its MLP's biases (always). Keys GPTNeoConfig does not read and
    the model would (RoPE's, KV heads, head_dim, the bias switches) raise."""
    _own_names(d, _GPT_NEO_NAMES, "GPT-Neo")
    _refuse_keys(d, (*_NOT_READ_HERE, "num_key_value_heads"), "GPTNeoConfig", "GPT-Neo is multi-head attention of "
                 "head_dim hidden_size // num_heads with learned positions (no RoPE), unbiased q / k / v and biases on "
                 "the rest")
    _four_times_hidden(d, "gpt_neo")
    d["mlp_bias"] = True


def sinusoidal_table(config: "LlamaConfig") -> "torch.Tensor":
    """XGLM's fixed positions, float32 ``[max_position_embeddings + 2, hidden]``: row ``p`` (position ``p - 2``) is
    ``[sin(p f_i), cos(p f_i)]`` with ``f_i = exp(-i ln(10000) / (d/2 - 1))``, ``i < d/2`` (a zero column appended for
    an odd width), the pad token's row zeros, computed op by op as XGLMSinusoidalPositionalEmbedding does."""
    import torch

    n, d = config.max_position_embeddings + 2, config.hidden_size
    half = d // 2
    f = torch.exp(torch.arange(half, dtype=torch.int64).float() * -(math.log(10000) / (half - 1)))
    args = torch.arange(n, dtype=torch.int64).float().unsqueeze(1) * f.unsqueeze(0)
    table = torch.cat([torch.sin(args), torch.cos(args)], dim=1).view(n, -1)
    if d % 2:
        table = torch.cat([table, torch.zeros(n, 1)], dim=1)
    if config.pad_token_id is not None and 0 <= config.pad_token_id < n:
        table[config.pad_token_id, :] = 0
    return table


def _biogpt_keys(d: dict) -> None:
    """A BioGPT or XGLM config's keys in ``d`` read as the model's, in place: biases everywhere (always; BioGPT's
    ``layer_norm_eps`` is kept, unread: BioGptDecoderLayer's LayerNorms take torch's default, 1e-5). Keys their
    configs do not read and the model would (RoPE's, KV heads, head_dim, the bias switches, rms_norm_eps) raise."""
    name = "XGLMConfig" if d["model_type"] == "xglm" else "BioGptConfig"
    _refuse_keys(d, (*_NOT_READ_HERE, "num_key_value_heads", "rms_norm_eps"), name, "a multi-head attention of "
                 "head_dim hidden_size // num_attention_heads with fixed or learned positions (no RoPE), biases "
                 "everywhere and LayerNorms of eps 1e-5")
    d["attention_bias"] = d["mlp_bias"] = True


def _opt_keys(d: dict) -> None:
    """An OPT config's keys in ``d`` under the model's names, in place (:data:`_OPT_NAMES`; each given once):
    ``enable_bias`` as both bias switches (default true). Keys OPTConfig does not read and the model would (RoPE's, KV
    heads, head_dim, the bias switches, a norm eps: OPT's is fixed) raise."""
    _own_names(d, _OPT_NAMES, "OPT")
    _refuse_keys(d, (*_NOT_READ_HERE, "num_key_value_heads", "rms_norm_eps", "layer_norm_eps"), "OPTConfig",
                 "OPT is multi-head attention of head_dim hidden_size // num_attention_heads with learned positions "
                 "(no RoPE), its LayerNorms' eps 1e-5 and one bias switch, enable_bias")
    bias = d.pop("enable_bias", True)
    if not isinstance(bias, bool):
        raise ValueError(f"config enable_bias must be true or false, got {bias!r}")
    d["attention_bias"] = d["mlp_bias"] = bias


def _dbrx_keys(d: dict) -> None:
    """A DBRX config ``d``'s keys read in place as the model's: its top-level names, its attn_config's (kv_n_heads;
    clip_qkv; its RoPE base rope_theta, DBRX's own and transformers 4's reading: transformers 5.23 keeps it unread and
    runs its top-level rope_parameters, 1e4 by default; both given and different raise) and its ffn_config's
    (ffn_hidden_size, the mixture's; SiLU only; moe_normalize_expert_weights 1 or null; its training keys not read)."""
    for ours in _DBRX_TOP.values():
        if ours in d:
            raise ValueError(f"config key {ours!r} is not DbrxConfig's (its own names: {list(_DBRX_TOP)})")
    for theirs, ours in _DBRX_TOP.items():
        if theirs in d:
            d[ours] = d.pop(theirs)
    attn, ffn = _sub_config(d, "attn_config", "DBRX"), _sub_config(d, "ffn_config", "DBRX")
    if "kv_n_heads" in attn:
        d["num_key_value_heads"] = attn.pop("kv_n_heads")
    elif "num_key_value_heads" not in d:
        d["num_key_value_heads"] = 1  # (DbrxAttentionConfig's)
    if attn.get("clip_qkv") is not None:
        d["clip_qkv"] = attn.pop("clip_qkv")
    attn.pop("clip_qkv", None)
    if not _is_number(attn.pop("attn_pdrop", 0.0)):
        raise ValueError("config attn_config.attn_pdrop must be a number (training only)")
    if "rope_theta" in attn:
        theta = attn.pop("rope_theta")
        rope = next((d[k] for k in ("rope_parameters", "rope_scaling") if isinstance(d.get(k), dict)), None)
        given = d.get("rope_theta", (rope or {}).get("rope_theta"))
        if given is not None and given != theta:
            raise ValueError(f"config attn_config.rope_theta = {theta!r} and rope_theta = {given!r} differ (DBRX's own "
                             "code reads the first; transformers 5.23 the second): keep one")
        d["rope_theta"] = theta
    if attn:
        raise ValueError(f"config attn_config key {next(iter(attn))!r} is not understood (DbrxAttentionConfig's: "
                         "kv_n_heads, clip_qkv, attn_pdrop, rope_theta)")
    if ffn.get("hidden_size", d.get("hidden_size")) != d.get("hidden_size", FAMILIES["dbrx"].defaults["hidden_size"]):
        raise ValueError("config ffn_config.hidden_size must be d_model (transformers sets it so)")
    ffn.pop("hidden_size", None)
    act = ffn.pop("ffn_act_fn", None) or {"name": "silu"}
    if act != {"name": "silu"}:
        raise ValueError(f"config ffn_config.ffn_act_fn = {act!r}: DBRX's experts are read with SiLU only")
    for key in ("moe_jitter_eps", "moe_loss_weight"):  # (training only)
        ffn.pop(key, None)
    for theirs, ours in (("ffn_hidden_size", "intermediate_size"), ("moe_num_experts", "num_local_experts"),
                         ("moe_top_k", "num_experts_per_tok")):
        if theirs in ffn:
            d[ours] = ffn.pop(theirs)
    norm = ffn.pop("moe_normalize_expert_weights", 1.0)
    if norm not in (1, 1.0, None):
        raise ValueError(f"config ffn_config.moe_normalize_expert_weights = {norm!r}: DBRX's router weights are read "
                         "normalised by their sum (1) or not at all (null)")
    d["moe_normalize_expert_weights"] = norm
    if ffn:
        raise ValueError(f"config ffn_config key {next(iter(ffn))!r} is not understood (DbrxFFNConfig's)")


@functools.cache
def alibi_slopes(kind: str, heads: int, bias_max: float = 8.0, head_dim: int = 1) -> tuple:
    """ALiBi's slope per query head (float32 values), computed as transformers computes them: ``"bloom"``'s and
    ``"falcon"``'s ``2 ** (-8 k / p)`` for k = 1 .. p (p the largest power of 2 <= ``heads``), then the odd powers of
    ``2 ** (-4 / p)`` for the other heads (BloomModel's ``_get_alibi_slopes``); Falcon-RW's rounded to bfloat16 and
    divided by sqrt(``head_dim``), as its scores' scale multiplies its bias too; ``"mpt"``'s ``1 / 2 ** (k * bias_max /
    p)`` for k = 1 .. p (p the smallest power of 2 >= ``heads``), the odd k first where p > ``heads``
    (``build_mpt_alibi_tensor``)."""
    import torch

    cpu = torch.device("cpu")  # (on the CPU whatever device is the default: a meta one builds empty models)
    if kind == "mpt":
        p = 2 ** math.ceil(math.log2(heads))
        s = 1.0 / torch.pow(2, torch.arange(1, p + 1, dtype=torch.int64, device=cpu).float() * (bias_max / p))
        return tuple((s if p == heads else torch.cat([s[1::2], s[::2]])[:heads]).tolist())
    p = 2 ** math.floor(math.log2(heads))
    s = torch.pow(torch.full((), 2 ** (-(2 ** -(math.log2(p) - 3))), dtype=torch.float32, device=cpu),
                  torch.arange(1, 1 + p, dtype=torch.int32, device=cpu))
    if p != heads:
        extra = torch.full((), 2 ** (-(2 ** -(math.log2(2 * p) - 3))), dtype=torch.float32, device=cpu)
        s = torch.cat([s, torch.pow(extra, torch.arange(1, 1 + 2 * min(p, heads - p), 2, dtype=torch.int32,
                                                        device=cpu))])
    if kind == "falcon":
        s = s.bfloat16().float() / math.sqrt(head_dim)
    return tuple(s.tolist())


def _sub_config(d: dict, key: str, family: str) -> dict:
    """``d``'s sub-config ``key`` (DBRX's, MPT's ``attn_config``), popped, as a new dict without the keys of its own
    PreTrainedConfig that transformers writes in it (unread); those that would mean something raise unless false."""
    sub = dict(d.pop(key, None) or {})
    for name in ("model_type", *_METADATA_KEYS):
        sub.pop(name, None)
    for name in ("is_encoder_decoder", "problem_type", "tie_word_embeddings", "add_cross_attention"):
        if sub.pop(name, None):
            raise ValueError(f"config key {name!r} of {family}'s {key} must be false or null")
    return sub


def _bloom_keys(d: dict) -> None:
    """A BLOOM config's keys in ``d`` under the model's names, in place (:data:`_BLOOM_NAMES`; each given once): an MLP
    of 4 x ``hidden_size``, biases everywhere. Keys BloomConfig does not read and the model would (RoPE's, KV heads,
    head_dim, the MLP's width and activation, the bias switches) raise, as does the residual from the normed input
    (``apply_residual_connection_post_layernorm`` true: not implemented)."""
    _own_names(d, _BLOOM_NAMES, "BLOOM")
    _refuse_keys(d, (*_NOT_READ_HERE, "num_key_value_heads", "intermediate_size", "hidden_act"), "BloomConfig",
                 "BLOOM is multi-head attention of head_dim hidden_size // n_head with ALiBi (no RoPE), an MLP of 4 x "
                 "hidden_size of GELU's tanh form and biases on every projection")
    if d.get("apply_residual_connection_post_layernorm", False) is not False:
        raise ValueError(f"config apply_residual_connection_post_layernorm = "
                         f"{d['apply_residual_connection_post_layernorm']!r}: BLOOM's residual from the normed input "
                         "(true) is not implemented; every released BLOOM has false")
    _four_times_hidden(d, "bloom")
    d["attention_bias"] = d["mlp_bias"] = True


def _mpt_keys(d: dict) -> None:
    """An MPT config's keys in ``d`` under the model's names, in place (:data:`_MPT_NAMES`; each given once), its
    ``attn_config``'s read keys (:data:`_MPT_ATTN`) moved into ``d`` (``extra``), an MLP of 4 x ``d_model``. What
    transformers' MPT does not run as the checkpoint's own code would raise naming the key: ALiBi off, another
    attention type, a prefix LM, q / k LayerNorms, biases, a logit scale, another MLP width (the keys it does not read
    are checked in ``_HARMLESS_ONLY_AT``), an ``alibi_bias_max`` other than 8 (transformers' MptModel builds its slopes
    at 8 whatever it says); so do the model's own names for what its keys say."""
    _own_names(d, _MPT_NAMES, "MPT")
    _refuse_keys(d, (*_NOT_READ_HERE, "num_key_value_heads", "intermediate_size", "hidden_act", *_MPT_ATTN),
                 "MptConfig", "MPT is multi-head attention of head_dim d_model // n_heads with ALiBi (no RoPE), an MLP "
                 "of 4 x d_model of the exact GELU, no biases; its attention's settings are attn_config's")
    attn = _sub_config(d, "attn_config", "MPT")
    for key, want in (("alibi", True), ("attn_type", "multihead_attention"), ("prefix_lm", False), ("qk_ln", False),
                      ("alibi_bias_max", 8)):  # (transformers' MptModel builds its slopes at 8 whatever it says)
        if attn.get(key, want) != want:
            raise ValueError(f"config attn_config.{key} = {attn[key]!r} is not supported: transformers' MPT runs "
                             f"{key} = {want!r} whatever the config says (the checkpoint's own code would not)")
        attn.pop(key, None)
    if attn.pop("attn_impl", "torch") not in ("torch", "flash", "triton"):
        raise ValueError("config attn_config.attn_impl must be 'torch', 'flash' or 'triton' (the same attention)")
    if not (_is_number(attn.get("attn_pdrop", 0)) and 0 <= attn.pop("attn_pdrop", 0) < 1):
        raise ValueError("config attn_config.attn_pdrop must be a number in [0, 1) (training only)")
    if not isinstance(attn.pop("attn_uses_sequence_id", False), bool):  # (with token_type_ids only: never here)
        raise ValueError("config attn_config.attn_uses_sequence_id must be a bool")
    for key in _MPT_ATTN:
        if attn.get(key) is not None:
            d[key] = attn[key]
        attn.pop(key, None)
    if attn:
        raise ValueError(f"config attn_config key {next(iter(attn))!r} is not understood (MptAttentionConfig's: "
                         "attn_type, attn_pdrop, attn_impl, clip_qkv, softmax_scale, prefix_lm, qk_ln, "
                         "attn_uses_sequence_id, alibi, alibi_bias_max)")
    for key, want in (("expansion_ratio", 4), ("no_bias", True), ("logit_scale", None)):
        if d.get(key, want) != want:
            raise ValueError(f"config {key} = {d[key]!r} is not supported: transformers' MPT runs {key} = {want!r} "
                             "whatever the config says (the checkpoint's own code would not)")
    _four_times_hidden(d, "mpt")


def falcon_layout(x: dict, heads: int) -> tuple:
    """A Falcon config's (``extra`` ``x``, ``heads`` query heads) ``(query_key_value's layout, KV heads, parallel
    block, its MLP on a norm of its own)``: layout ``"grouped"`` (new_decoder_architecture), ``"multi_query"`` or
    ``"per_head"`` (GPT-NeoX's)."""
    new = bool(x.get("new_decoder_architecture", False))
    if new:
        kv = x.get("num_kv_heads") or heads
        norms = x.get("num_ln_in_parallel_attn") in (None, 2)
        return "grouped", kv, True, norms
    if x.get("multi_query", True):
        return "multi_query", 1, bool(x.get("parallel_attn", True)), False
    return "per_head", heads, bool(x.get("parallel_attn", True)), False


def _falcon_keys(d: dict) -> None:
    """A Falcon config ``d``'s keys read in place: its layout keys kept (``extra``: :func:`falcon_layout`, written back
    as they were), the model's fields derived from them (``num_key_value_heads``, ``head_dim`` hidden / heads,
    ``intermediate_size`` from ``ffn_hidden_size``, the biases from ``bias``; ALiBi, Falcon-RW's, by ``alibi``:
    LlamaConfig.alibi_slopes); another activation, a sequential block in the new architecture, or the model's own names
    for what those keys say raise."""
    fam = FAMILIES["falcon"].defaults
    for key in ("num_key_value_heads", "head_dim", "intermediate_size", "attention_bias", "mlp_bias", "hidden_act"):
        if key in d:
            raise ValueError(f"config key {key!r} is not FalconConfig's (its own keys say it: {_FALCON_LAYOUT})")
    if d.get("activation", "gelu") != "gelu":
        raise ValueError(f"config activation = {d['activation']!r}: Falcon's MLP is read with the exact GELU only")
    for key in ("new_decoder_architecture", "multi_query", "parallel_attn", "bias", "alibi"):
        if not isinstance(d.get(key, False), bool):
            raise ValueError(f"config {key} = {d[key]!r} must be a bool")
    if d.get("new_decoder_architecture") and d.get("parallel_attn", True) is False:
        raise ValueError("config new_decoder_architecture with parallel_attn false: transformers' Falcon runs the "
                         "new architecture's block in parallel only (its sequential norms are never built)")
    if d.get("num_ln_in_parallel_attn") not in (None, 1, 2):
        raise ValueError(f"config num_ln_in_parallel_attn = {d['num_ln_in_parallel_attn']!r} must be 1, 2 or null")
    heads, hidden = d.get("num_attention_heads", fam["num_attention_heads"]), d.get("hidden_size", fam["hidden_size"])
    kv = d.get("num_kv_heads")
    if kv is not None and not (_is_int(kv) and kv >= 1):
        raise ValueError(f"config num_kv_heads = {kv!r} must be a positive int or null")
    ffn = d.get("ffn_hidden_size")
    if ffn is not None and not (_is_int(ffn) and ffn >= 1):
        raise ValueError(f"config ffn_hidden_size = {ffn!r} must be a positive int or null")
    _, d["num_key_value_heads"], _, _ = falcon_layout(d, heads)
    d["intermediate_size"] = ffn or 4 * hidden
    d["attention_bias"] = d["mlp_bias"] = bool(d.get("bias", False))


def _mla_heads(d: dict) -> None:
    """DeepSeek's ``num_key_value_heads`` and ``head_dim`` in ``d``, in place, as :class:`MLA`'s latent KV head: its
    config.json's per-head values (``num_key_value_heads`` = ``num_attention_heads``, which transformers' DeepSeek
    needs, and ``head_dim`` = ``qk_rope_head_dim``, as transformers writes it; ``qk_head_dim`` = ``qk_nope_head_dim +
    qk_rope_head_dim``) checked and replaced with 1 and ``kv_lora_rank + qk_rope_head_dim``."""
    family = FAMILIES[d["model_type"]].defaults
    dims = {k: d.get(k, family.get(k)) for k in ("num_attention_heads", *_MLA_DIMS)}
    for key, v in dims.items():
        if not _is_int(v) or v < 1:
            raise ValueError(f"config key {key!r} = {v!r} is not supported: DeepSeek needs an int >= 1")
    heads, r = dims["num_attention_heads"], dims["qk_rope_head_dim"]
    for key, want in (("num_key_value_heads", heads), ("head_dim", r),
                      ("qk_head_dim", dims["qk_nope_head_dim"] + r)):
        v = d.pop(key, None)
        if key == "num_key_value_heads" and d["model_type"] == "kimi_linear" and _is_int(v) and v >= 1:
            continue  # (KimiLinearConfig's own default, 32 whatever the heads: its attention does not read it)
        if v is not None and v != want:
            raise ValueError(f"config {key} = {v!r} is not supported for model_type {d['model_type']!r}: MLA's keys "
                             f"and values come per head from one latent, which transformers' DeepSeek reads with "
                             f"{key} = {want}")
    d["num_key_value_heads"], d["head_dim"] = 1, dims["kv_lora_rank"] + r


# (the families of a RoPE per layer type but Gemma 3)
_NAMES_PER_TYPE = {"olmo3": "OLMo 3", "mellum": "Mellum", "laguna": "Laguna", "lfm3": "LFM3",
                   "modernbert-decoder": "ModernBERT decoder", "mimo_v2_flash": "MiMo-V2-Flash"}
_OWN_ROPES = {"mellum": _MELLUM_ROPE, "laguna": _LAGUNA_ROPE, "mimo_v2_flash": _MIMO_ROPE,
              "lfm3": _LFM3_ROPE}  # (their configs' own)


def _split_layer_rope(d: dict) -> None:
    """transformers 5's Gemma 3 and OLMo 3 ``rope_parameters``, one dict per layer type, in place as transformers 4
    wrote Gemma 3's: the ``full_attention`` layers' as the model's RoPE, the ``sliding_attention`` layers' base as
    ``rope_local_base_freq`` (plain RoPE only; :meth:`LlamaConfig.to_dict` writes OLMo 3's back per layer type)."""
    olmo3 = d.get("model_type") in ("olmo3", *_OWN_ROPES, "modernbert-decoder")
    if olmo3 and "rope_local_base_freq" in d:
        raise ValueError(f"config key 'rope_local_base_freq' is Gemma 3's: transformers' {d['model_type']} config does "
                         "not read it (its sliding layers take rope_parameters['sliding_attention'])")
    if d.get("model_type") in _OWN_ROPES:  # (its config's own when absent; its rotary reads them per layer type only)
        if d.get("rope_parameters") is None and d.get("rope_scaling") is None:
            d["rope_parameters"] = {kind: dict(rope) for kind, rope in _OWN_ROPES[d["model_type"]].items()}
        params = d.get("rope_parameters", d.get("rope_scaling"))
        if not (isinstance(params, dict) and "full_attention" in params):
            raise ValueError(f"config rope_parameters = {params!r}: {_NAMES_PER_TYPE[d['model_type']]}'s RoPE is one "
                             "dict per layer type ('full_attention', 'sliding_attention'), as its config's rotary "
                             "embedding reads it")
    params = d.get("rope_parameters")
    if not (isinstance(params, dict) and params and set(params) <= {"full_attention", "sliding_attention"}):
        return
    if d.get("model_type") not in ("gemma3_text", "olmo3", *_OWN_ROPES, "modernbert-decoder"):
        raise ValueError(f"config rope_parameters per layer type ({', '.join(params)}) are read for model_type "
                         f"'gemma3_text', 'olmo3', 'mellum', 'laguna', 'mimo_v2_flash' and 'modernbert-decoder' only, "
                         f"not {d.get('model_type')!r}")
    d["rope_parameters"] = params.get("full_attention")
    local = params.get("sliding_attention")
    if local is None:
        return
    if isinstance(local, dict) and d.get("model_type") == "laguna" and local.get("partial_rotary_factor", 1.0) == 1.0:
        local = {k: v for k, v in local.items() if k != "partial_rotary_factor"}  # (Laguna's: RoPE on the whole head)
    if isinstance(local, dict) and d.get("model_type") == "mimo_v2_flash":  # (MiMo-V2-Flash's: on the full layers'
        full = d["rope_parameters"] if isinstance(d["rope_parameters"], dict) else {}  # share of the head, which
        if local.get("partial_rotary_factor", 0.334) != full.get("partial_rotary_factor", 0.334):  # from_dict reads)
            raise ValueError(f"config rope_parameters' partial_rotary_factor differs per layer type ({full!r}, "
                             f"{local!r}): MiMo-V2-Flash's layers are read with one share of the head rotated")
        local = {k: v for k, v in local.items() if k != "partial_rotary_factor"}
    if not isinstance(local, dict) or local.get("rope_type", "default") != "default" \
            or set(local) - {"rope_type", "rope_theta"}:
        raise ValueError(f"config rope_parameters['sliding_attention'] = {local!r} is not supported: "
                         f"{_NAMES_PER_TYPE.get(d['model_type'], 'Gemma 3')}'s sliding layers take plain RoPE with "
                         "their own rope_theta only")
    if "rope_theta" in local:
        if d.setdefault("rope_local_base_freq", local["rope_theta"]) != local["rope_theta"]:
            raise ValueError(f"config rope_local_base_freq = {d['rope_local_base_freq']!r} differs from "
                             f"rope_parameters['sliding_attention']['rope_theta'] = {local['rope_theta']!r}")


def _phi3_rope(d: dict) -> None:
    """Phi-3's RoPE keys in ``d`` as transformers' Phi3Config reads them, in place: the old names ``su`` and
    ``yarn`` of LongRoPE renamed, any other scaling type but plain RoPE raises, and the top-level
    ``original_max_position_embeddings`` (Phi3Config's field: 4096 when absent) is the one LongRoPE takes."""
    for key in ("rope_scaling", "rope_parameters"):
        rope = d.get(key)
        if not isinstance(rope, dict):
            continue
        rope = d[key] = dict(rope)
        for name in ("rope_type", "type"):
            if rope.get(name) in ("su", "yarn"):
                rope[name] = "longrope"
        kind = rope.get("rope_type", rope.get("type", "default"))
        if kind not in ("default", "longrope"):
            raise ValueError(f"config {key} of rope_type {kind!r} is not supported for model_type 'phi3': "
                             "transformers' Phi-3 reads plain RoPE and LongRoPE ('longrope', 'su', 'yarn') only")
        if kind == "longrope":
            d.setdefault("original_max_position_embeddings", _PHI3_ORIGINAL_CONTEXT)


def _phimoe_rope(d: dict) -> None:
    """PhiMoE's LongRoPE in ``d``, in place: its ``short_mscale`` and ``long_mscale`` (the factor on cos and sin below
    and past the original context) read as LongRoPE's ``attention_factor`` where they are equal (other values raise);
    its ``original_max_position_embeddings`` (4096, as Phi-3's, when absent)."""
    for key in ("rope_scaling", "rope_parameters"):
        rope = d.get(key)
        if not isinstance(rope, dict) or rope.get("rope_type", rope.get("type")) in (None, "default"):
            continue
        rope = d[key] = dict(rope)
        short, long = rope.pop("short_mscale", None), rope.pop("long_mscale", None)
        if short is None and rope.get("rope_type", rope.get("type")) == "longrope" and "attention_factor" not in rope:
            raise ValueError(f"config {key} of rope_type 'longrope' needs short_mscale and long_mscale (PhimoeConfig "
                             "requires them: its factor on cos and sin)")
        if short != long or (short is not None and not (_is_number(short) and short > 0)):
            raise ValueError(f"config {key}'s short_mscale = {short!r} and long_mscale = {long!r}: PhiMoE's attention "
                             "factor is read where they are one number > 0 (the factor on cos and sin at any length)")
        if short is not None:
            if rope.get("attention_factor") not in (None, short):
                raise ValueError(f"config {key}'s attention_factor = {rope['attention_factor']!r} and its mscale = "
                                 f"{short!r} differ")
            rope["attention_factor"] = short
        if rope.get("rope_type", rope.get("type")) == "longrope":
            rope.setdefault("original_max_position_embeddings",
                            d.get("original_max_position_embeddings", _PHI3_ORIGINAL_CONTEXT))


def _vl_text(d: dict) -> str:
    """Read a Qwen / GLM VL language model's config ``d`` (``_VL_TEXTS``) in place as its family's: the M-RoPE keys
    checked and dropped (on text M-RoPE is the family's RoPE), transformers' defaults of its text config filled in,
    ``model_type`` set to the family's, which is returned."""
    kind = d["model_type"]
    family, defaults = _VL_TEXTS[kind]
    interleaved = kind in ("qwen3_vl_text", "qwen3_vl_moe_text", "qwen3_omni_moe_text",  # (Qwen3-VL's, -Omni's,
                           *_DELTA_FAMILIES)  # Qwen3.5's)
    sections = []
    for key in ("rope_parameters", "rope_scaling"):
        rope = d.get(key)
        if not isinstance(rope, dict):
            continue  # (null; anything else raises in _read_rope)
        rope = dict(rope)
        section = rope.pop("mrope_section", None)
        if section is not None and not (isinstance(section, list) and len(section) == 3
                                        and all(_is_int(x) and x >= 0 for x in section)):
            raise ValueError(f"config {key} mrope_section = {section!r} must be a list of three ints >= 0 (the "
                             "temporal, height and width parts of each head's RoPE frequencies)")
        sections += [] if section is None else [section]
        if interleaved and rope.get("mrope_interleaved", True) not in (True, False):
            raise ValueError(f"config {key} mrope_interleaved = {rope['mrope_interleaved']!r} must be a bool")
        if interleaved:
            rope.pop("mrope_interleaved", None)
            if kind == "qwen3_omni_moe_text" and rope.get("interleaved", True) not in (True, False):
                raise ValueError(f"config {key} interleaved = {rope['interleaved']!r} must be a bool")
            if kind == "qwen3_omni_moe_text":  # (Qwen3-Omni's second name of it)
                rope.pop("interleaved", None)
        if rope.get("type") == "mrope":  # (transformers reads it as the default RoPE, and keeps the key beside
            rope.pop("type")  # its rope_type "default")
            rope.setdefault("rope_type", "default")
        if rope.get("rope_type") == "mrope":
            rope["rope_type"] = "default"
        d[key] = rope
    if interleaved and kind not in _DELTA_FAMILIES:  # Qwen3VLTextConfig has no sliding window; the model attends to
        # every key
        for key in ("use_sliding_window", "sliding_window", "max_window_layers", "layer_types"):
            if d.get(key) not in (None, False):
                raise ValueError(f"config key {key!r} = {d[key]!r}: transformers' Qwen3-VL language model has no "
                                 "sliding window and does not read it")
            d.pop(key, None)
    if kind in ("glm4v_text", "glm4v_moe_text"):
        _glm4v_text(d, kind)
    if kind == "solar_open":  # (keys SolarOpenConfig does not have: its model has no dense layers, no q / k norms and
        for key, none in (("first_k_dense_replace", 0), ("use_qk_norm", False), ("partial_rotary_factor", 1.0)):
            inner = [r.get(key, none) for r in (d.get("rope_parameters"), d.get("rope_scaling")) if isinstance(r, dict)]
            if d.get(key, none) != none or any(v != none for v in inner):  # RoPE on the whole head)
                raise ValueError(f"config key {key!r} = {d.get(key, inner)!r}: Solar Open's model does not read it "
                                 f"and has {none!r}")
            d.setdefault(key, none)
    if kind == "emu3_text_model":  # (its dropout: training only, 0.1 by default, as transformers' model applies it)
        if not (_is_number(d.get("attention_dropout", 0.1)) and 0 <= d.get("attention_dropout", 0.1) < 1):
            raise ValueError(f"config attention_dropout = {d['attention_dropout']!r} must be a number in [0, 1)")
        d.pop("attention_dropout", None)
    if kind == "mllama_text_model":  # (the cross-attention layers a text-only forward skips: not read)
        cross = mllama_cross_layers(d)
        d.pop("cross_attention_layers", None)
        d["num_hidden_layers"] = d.get("num_hidden_layers", defaults["num_hidden_layers"]) - len(cross)
        if not (_is_number(d.get("dropout", 0.0)) and 0 <= d.get("dropout", 0.0) < 1):  # (training only)
            raise ValueError(f"config dropout = {d['dropout']!r} must be a number in [0, 1)")
        d.pop("dropout", None)
    if sections and not interleaved:  # (transformers splits the frequencies by them: they must cover them exactly)
        head = d.get("head_dim") or (d.get("hidden_size", defaults["hidden_size"])
                                     // d.get("num_attention_heads", defaults["num_attention_heads"]))
        factor = d.get("partial_rotary_factor", next((r["partial_rotary_factor"] for r in (
            d.get("rope_parameters"), d.get("rope_scaling")) if isinstance(r, dict) and "partial_rotary_factor" in r),
            1.0))
        if sum(sections[0]) != int(head * factor) // 2:
            raise ValueError(f"config mrope_section = {sections[0]!r} must sum to the {int(head * factor) // 2} RoPE "
                             "frequencies of a head (transformers splits them by it)")
    if kind in ("qwen3_vl_moe_text", "qwen3_omni_moe_text", "qwen3_5_moe_text") \
            and d.setdefault("norm_topk_prob", True) is not True:
        raise ValueError(f"config norm_topk_prob = {d['norm_topk_prob']!r}: Qwen3-VL-MoE's, Qwen3-Omni's and "
                         "Qwen3.5-MoE's routers always renormalise their top k probabilities (transformers' "
                         "Qwen3VLMoeTextTopKRouter, Qwen3_5MoeTopKRouter)")
    if kind == "qwen3_omni_moe_text":  # (Qwen3OmniMoeTextConfig has no head_dim: its attention's fallback)
        d.setdefault("head_dim", d.get("hidden_size", defaults["hidden_size"])
                     // d.get("num_attention_heads", defaults["num_attention_heads"]))
    inner = any(isinstance(d.get(k), dict) and "rope_theta" in d[k] for k in ("rope_parameters", "rope_scaling"))
    counted = any(k in d for k in _EXPERT_COUNT_KEYS)  # (transformers 5 writes num_experts as num_local_experts)
    for k, v in defaults.items():
        if not (k == "rope_theta" and inner) and not (k in _EXPERT_COUNT_KEYS and counted):
            d.setdefault(k, v)
    d["model_type"] = family
    return family


_MLLAMA_CROSS = [3, 8, 13, 18, 23, 28, 33, 38]  # MllamaTextConfig's cross_attention_layers when it has none


def mllama_cross_layers(text: dict) -> list:
    """Llama 3.2 Vision's language model's cross-attention layers (its ``text_config`` ``text``; checked: distinct
    layer indices, fewer than the layers)."""
    cross = text.get("cross_attention_layers")
    cross = list(_MLLAMA_CROSS) if cross is None else cross
    layers = text.get("num_hidden_layers", _VL_TEXTS["mllama_text_model"][1]["num_hidden_layers"])
    if not (isinstance(cross, list) and len(set(cross)) == len(cross) < layers
            and all(_is_int(i) and 0 <= i < layers for i in cross)):
        raise ValueError(f"config cross_attention_layers = {cross!r} must be distinct layer indices in [0, {layers}), "
                         "fewer than the layers")
    return sorted(cross)


def _glm4v_text(d: dict, kind: str) -> None:
    """GLM-4.1V's / GLM-4.5V's language model's keys as transformers' Glm4vText / Glm4vMoeText read them, in ``d``:
    RoPE over the whole head where no partial_rotary_factor is given (GLM-4's family default is 0.5); GLM-4.1V's q / k
    / v biases always and head_dim hidden / heads (its config has neither key); GLM-4.5V's head_dim hidden / heads
    where absent, no q / k norms (no key)."""
    inner = [r for r in (d.get("rope_parameters"), d.get("rope_scaling")) if isinstance(r, dict)]
    if "partial_rotary_factor" not in d and not any("partial_rotary_factor" in r for r in inner):
        d["partial_rotary_factor"] = 1.0
    heads = d.get("num_attention_heads", _VL_TEXTS[kind][1]["num_attention_heads"])
    head_dim = d.get("hidden_size", _VL_TEXTS[kind][1]["hidden_size"]) // heads
    if kind == "glm4v_text":
        for key, value in (("attention_bias", True), ("head_dim", head_dim)):
            if d.setdefault(key, value) != value:
                raise ValueError(f"config key {key!r} = {d[key]!r}: transformers' GLM-4.1V language model does not "
                                 f"read it and takes {value!r}")
    else:
        d.setdefault("head_dim", head_dim)
        if d.setdefault("use_qk_norm", False) is not False:
            raise ValueError(f"config use_qk_norm = {d['use_qk_norm']!r}: transformers' GLM-4.5V language model has "
                             "no q / k norms and does not read it")


def _read_rope(d: dict) -> dict:
    """Pop the RoPE keys of a config.json dict ``d`` (both spellings) and return ``rope_theta`` /
    ``rope_scaling`` for ``LlamaConfig``. As in transformers, a ``rope_theta`` inside ``rope_parameters``
    / ``rope_scaling`` wins over the top-level one and a top-level ``original_max_position_embeddings``
    over the one inside for llama3 and yarn; here a disagreement raises instead of picking one."""
    params, scaling = d.pop("rope_parameters", None), d.pop("rope_scaling", None)
    for key, v in (("rope_parameters", params), ("rope_scaling", scaling)):
        if v is not None and not isinstance(v, dict):
            raise ValueError(f"config {key} must be null or a dict, got {v!r}")
    if params and scaling and params != scaling:
        raise ValueError(f"config has both rope_parameters (transformers 5) {params!r} and rope_scaling "
                         f"(transformers 4) {scaling!r}, and they differ; keep one")
    rope = dict(scaling or params or {})
    out = {}
    if "rope_theta" in d:
        out["rope_theta"] = d.pop("rope_theta")
    if "rope_theta" in rope:
        inner = rope.pop("rope_theta")
        if "rope_theta" in out and out["rope_theta"] != inner:
            raise ValueError(f"config rope_theta = {out['rope_theta']!r} differs from the rope_theta = {inner!r} "
                             "inside rope_parameters / rope_scaling; keep one")
        out["rope_theta"] = inner
    # transformers moves the top-level partial_rotary_factor into the RoPE dict (where one there wins); here it is
    # a top-level key (LlamaConfig.rotary_dim), and the two must agree
    inner = rope.pop("partial_rotary_factor", None)
    if inner is not None and d.get("partial_rotary_factor", inner) != inner:
        raise ValueError(f"config partial_rotary_factor = {d['partial_rotary_factor']!r} differs from the {inner!r} "
                         "inside rope_parameters / rope_scaling; keep one")
    family = FAMILIES.get(d.get("model_type"))
    if inner not in (None, 1) or (inner == 1 and family is not None and family.partial_rotary_factor != 1):
        d["partial_rotary_factor"] = inner  # (1 kept where the family's default is another: GLM-4's 0.5)
    if "max_position_embeddings" in rope:  # Ministral3Config writes the context there too; it must be the config's
        inner = rope.pop("max_position_embeddings")
        ctx = d.get("max_position_embeddings", LlamaConfig.__dataclass_fields__["max_position_embeddings"].default)
        if inner != ctx:
            raise ValueError(f"config max_position_embeddings = {ctx!r} differs from the {inner!r} inside "
                             "rope_parameters / rope_scaling; keep one")
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind in ("llama3", "yarn", "longrope") and "original_max_position_embeddings" in d:
        top = d.pop("original_max_position_embeddings")
        if rope.setdefault("original_max_position_embeddings", top) != top:
            raise ValueError(f"config original_max_position_embeddings = {top!r} differs from the "
                             f"{rope['original_max_position_embeddings']!r} inside rope_parameters / "
                             "rope_scaling; keep one")
    if kind in ("llama3", "yarn", "longrope") and "original_max_position_embeddings" not in rope:
        # transformers 5 fills it in from the context length (the scaling then acts from there on)
        ctx = d.get("max_position_embeddings", LlamaConfig.__dataclass_fields__["max_position_embeddings"].default)
        rope["original_max_position_embeddings"] = ctx
    out["rope_scaling"] = rope or None
    return out
