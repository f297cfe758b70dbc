// Declarations of the launchers registered in torch_bindings.cpp. One section per op family; the
// same name serves CPU (csrc/cpu) and CUDA (csrc/cuda) through the dispatcher, so CUDA launchers are
// declared as <name>_cuda.
#pragma once
#include <ATen/ATen.h>

#include <functional>
#include <vector>

// ---- retrieval cache (docs/design.md 3.1) --------------------------------------------------------
at::Tensor chunk_mean_keys(const at::Tensor& k, int64_t chunk_size);
at::Tensor score_chunks(const at::Tensor& q, const at::Tensor& chunk_keys, const at::Tensor& num_chunks);
at::Tensor select_chunks(const at::Tensor& scores, const at::Tensor& num_chunks, int64_t budget_chunks,
                         int64_t sink_chunks, int64_t recent_chunks);
void gather_chunks(const at::Tensor& k, const at::Tensor& v, const at::Tensor& chunk_idx, int64_t chunk_size,
                   at::Tensor& out_k, at::Tensor& out_v);
at::Tensor build_retrieval_cache(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 const at::Tensor& chunk_keys, const at::Tensor& num_chunks, int64_t chunk_size,
                                 int64_t budget_chunks, at::Tensor& out_k, at::Tensor& out_v, int64_t sink_chunks,
                                 int64_t recent_chunks);

// ---- model layer: x @ w^T for few rows, bitwise row-independent (csrc/cpu/linear.cpp) -------------
at::Tensor rowwise_linear(const at::Tensor& x, const at::Tensor& w);
// out [H, M, N], out[h] = x[h] @ w[h]^T (x [H, M, K], w [H, N, K]): each head's own matrix in one call, each
// head's rows bitwise rowwise_linear(x[h], w[h]) (DeepSeek's latent attention: W_UK^T and W_UV per head)
at::Tensor rowwise_linear_heads(const at::Tensor& x, const at::Tensor& w);
// weight-only int8: w[n, k] = scales[n, k / 32] * q[n, k] (a draft model's format, triforce/models/quant.py)
at::Tensor rowwise_linear_q8(const at::Tensor& x, const at::Tensor& q, const at::Tensor& scales);
at::Tensor rowwise_linear_q4_1(const at::Tensor& x, const at::Tensor& w);
// FP8 weights: w[n, k] = e4m3fn(q[n, k]) * scales[n, k / 64] (an FP8 checkpoint's own weights, its block scales
// repeated per row and chunk of 64 columns; triforce/models/quant.py, Fp8Linear), q packed (float8_e4m3fn [N, K padded
// to 64], quant.pack_fp8: linear.h's order), bitwise rowwise_linear on the dequantised weight
at::Tensor rowwise_linear_fp8(const at::Tensor& x, const at::Tensor& q, const at::Tensor& scales);
at::Tensor rowwise_linear_i8(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales);
// Whether rowwise_linear_i8 runs many rows on the AMX tiles (linear_i8.h; the bits are those of its other paths):
// enable given, first allows (true) or forbids (false) them for the process; then returns whether they are used
// (the CPU has them, Linux grants them, TRIFORCE_AMX is not 0, and they are allowed).
bool rowwise_linear_i8_tiles(std::optional<bool> enable);
// BitNet b1.58's ternary projection as integers: out int32 [M, N] = q int8 [M, K] @ w^T, w ternary, packed four output
// rows a byte as transformers packs them (packed uint8 [N / 4, K]; triforce/models/bitnet.py), each sum exact
at::Tensor ternary_linear(const at::Tensor& q, const at::Tensor& packed);
// rowwise_linear_i8 in two halves, so that projections of the same x round it once (csrc/cpu/decoder.cpp):
// x [M, K] float32 rounded to int8 blocks (linear_i8.h's quantize_rows) in one buffer, then the product.
struct I8Rows {
  at::Tensor buf;  // uint8: q [M, K] int8, then dx, sm [M, K / 32] float32, then sx, sx0 [M, K / 32] int32
  int64_t M, K;
  int8_t* q() const { return reinterpret_cast<int8_t*>(buf.data_ptr<uint8_t>()); }
  float* dx() const { return reinterpret_cast<float*>(q() + M * K); }
  float* sm() const { return dx() + M * (K / 32); }
  int32_t* sx() const { return reinterpret_cast<int32_t*>(sm() + M * (K / 32)); }
  int32_t* sx0() const { return sx() + M * (K / 32); }
};
I8Rows quantize_i8_rows(const at::Tensor& x);
at::Tensor rowwise_linear_i8_rows(const I8Rows& x, const at::Tensor& codes, const at::Tensor& scales);
// A product the ops above check and then run, cut into blocks of weight rows (csrc/cpu/linear.cpp): out [M, N] =
// x [M, K] @ w^T; blocks(out, m0, rows, b0, b1) computes rows [m0, m0 + rows) of out (row stride N, out of
// out_options' dtype) against weight blocks [b0, b1) of nr rows each (nb in all); w_bytes: a weight's bytes, for the
// work estimates. Each output's arithmetic is fixed whatever the rows, blocks and threads: run_product runs it as
// the ops do, moe_experts runs many in one parallel loop. keep: the (contiguous) tensors the blocks read.
struct RowwiseProduct {
  int64_t M, K, N, nb, nr, w_bytes;
  at::TensorOptions out_options;
  std::vector<at::Tensor> keep;
  std::function<void(void* out, int64_t m0, int64_t rows, int64_t b0, int64_t b1)> blocks;
};
at::Tensor run_product(const RowwiseProduct& p);
RowwiseProduct float_product(const at::Tensor& x, const at::Tensor& w);                         // rowwise_linear
RowwiseProduct q8_product(const at::Tensor& x, const at::Tensor& q, const at::Tensor& scales);   // rowwise_linear_q8
RowwiseProduct q4_1_product(const at::Tensor& x, const at::Tensor& w);                          // rowwise_linear_q4_1
RowwiseProduct fp8_product(const at::Tensor& x, const at::Tensor& q, const at::Tensor& scales);  // rowwise_linear_fp8
// rowwise_linear_i8 of rows [r0, r0 + M) of x
RowwiseProduct i8_product(const I8Rows& x, int64_t r0, int64_t M, const at::Tensor& codes, const at::Tensor& scales);
// The product of a model layer's projection by its weight's format: w float32 / bfloat16 / float16 like x
// (rowwise_linear), packed float8_e4m3fn codes with float32 scales (rowwise_linear_fp8), int8 with float32 scales
// (rowwise_linear_q8), uint8 Q4_1 blocks without scales
// (rowwise_linear_q4_1), or uint8 codes with scales (rowwise_linear_i8: x rounded to int8 blocks, or rows [r0, r0 +
// x.size(0)) of xq where the caller rounded them already).
RowwiseProduct product_of(const at::Tensor& x, const I8Rows* xq, int64_t r0, const at::Tensor& w,
                          const std::optional<at::Tensor>& scales);

// ---- model layer: a decoder layer in two calls around the KV cache, bitwise the Python modules' result
// (csrc/cpu/decoder.cpp). Projections: weights w[i] (float32/bfloat16 like h, or int8 with scales[i]),
// optional bias[i]; attn_in takes q, k, v, attn_out_mlp o, gate, up, down. The `Tensor?[]` arguments are
// c10::List, the dispatcher's own type for them. (They were std::vector; with torch 2.11 on a GPU machine
// the op's first argument check then crashed the process instead of raising: cause not confirmed.)
using OptionalTensorList = c10::List<std::optional<at::Tensor>>;
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> decoder_attn_in(
    const at::Tensor& h, const at::Tensor& norm_w, double eps, at::TensorList w,
    const OptionalTensorList& scales, const OptionalTensorList& bias, const std::optional<at::Tensor>& q_norm_w, const std::optional<at::Tensor>& k_norm_w, double qk_eps,
    const at::Tensor& cos, const at::Tensor& sin, int64_t head_dim);
at::Tensor decoder_attn_out_mlp(const at::Tensor& h, const at::Tensor& attn, const at::Tensor& norm_w, double eps,
                                at::TensorList w, const OptionalTensorList& scales, const OptionalTensorList& bias);
// The layer after its attention up to its MLP, for a layer whose MLP runs in Python (a mixture of experts):
// (h2, x) = (h + o_proj(attn), RMSNorm(h2)), bitwise decoder_attn_out_mlp's first half (w, scales, bias: o's).
std::tuple<at::Tensor, at::Tensor> decoder_attn_out(const at::Tensor& h, const at::Tensor& attn,
                                                    const at::Tensor& norm_w, double eps, at::TensorList w,
                                                    const OptionalTensorList& scales, const OptionalTensorList& bias);
// triforce.models.llama.RMSNorm's forward (float32 statistics, the weight applied in the input dtype), bitwise its
// ATen ops (the sum of squares by at::sum, the rest by loops rounding as ATen's kernels): the module's on the CPU.
// x [..., H], w [H] of x's dtype (other dtypes or layouts: the ATen composite itself).
at::Tensor rms_norm_op(const at::Tensor& x, const at::Tensor& w, double eps);
// DeepSeek-V3.2's lightning indexer scores (csrc/cpu/dsa.cpp): q float32 [M, H, D], k [n, D] (float32, bfloat16 or
// float16), w float32 [M, H] -> float32 [M, n], out[m, s] = sum_h w[m, h] * relu(scale * (q[m, h] . k[s])), each
// output's arithmetic fixed whatever M, n and the threads.
at::Tensor index_scores(const at::Tensor& q, const at::Tensor& k, const at::Tensor& w, double scale);
// DeepSeek's latent attention between its products (triforce.models.llama.LatentAttention.project), bitwise its ATen
// ops: q [B, T, H, nope + r] (the query projection, its RoPE'd dims last), q_lat [B, T, H, R] (W_UK^T q_nope), kv
// [B, T, R + r] (kv_a_proj_with_mqa's output; R and r even), norm_w [R] / eps (kv_a_layernorm's RMSNorm of kv's
// first R dims, c), cos / sin [B, T, 1, R + r], layout int64 [R + r] (a cached key's dim d holds [pe, latent]'s dim
// layout[d]) -> (queries [B, T, H, R + r] = RoPE([q_pe, q_lat] by layout), keys [B, T, 1, R + r] = RoPE(k_raw),
// k_raw = [k_pe, c] by layout); RoPE in float32, rounded once, where rope_f32 and the tensors are 16-bit.
std::tuple<at::Tensor, at::Tensor, at::Tensor> mla_qk(const at::Tensor& q, const at::Tensor& q_lat,
                                                      const at::Tensor& kv, const at::Tensor& norm_w, double eps,
                                                      const at::Tensor& cos, const at::Tensor& sin,
                                                      const at::Tensor& layout, bool rope_f32);
// act(gate) * up as the modules round it (the activation in float32 rounded to the dtype, the product rounded),
// float32, bfloat16 or float16, every element by the same arithmetic whatever the shape and the threads
// (csrc/include/triforce/glu.h: ATen's SiLU and GELU are not): the model layer's MLP on the CPU. SiLU (SwiGLU);
// GELU's tanh form, gelu(approximate="tanh") (Gemma's GeGLU); the exact GELU, gelu() (GPT-NeoX's ungated MLP, with
// up = 1), within a few ulp of the exact value where ATen's 1 + erf loses the negative tail (glu.h).
at::Tensor silu_mul(const at::Tensor& gate, const at::Tensor& up);
at::Tensor gelu_tanh_mul(const at::Tensor& gate, const at::Tensor& up);
at::Tensor gelu_mul(const at::Tensor& gate, const at::Tensor& up);
// GPT-OSS's experts' clamped SwiGLU: (clamp(up, -limit, limit) + 1) * (g * sigmoid(g * alpha)), g = min(gate,
// limit), each step rounded to the dtype as transformers' ops round it, every element by the same arithmetic (glu.h);
// alpha finite, limit finite and > 0.
at::Tensor swiglu_clamped_mul(const at::Tensor& gate, const at::Tensor& up, double alpha, double limit);
// swiglu_clamped_mul's and moe_experts' check of alpha and limit
void check_swiglu_clamp(const char* name, double alpha, double limit);
// A mixture of experts' MLP for the rows of x [N, H] (csrc/cpu/moe.cpp): row t's k experts index[t] (int64 [N, k])
// and weights weight[t] (float32, or x's dtype); expert e's projections gate_up[e] (2I outputs: gate, then up) and
// down[e] (I inputs, H outputs) in any format of product_of (weights of x's dtype; int8 formats with their scales
// and a float32 x), None for an expert no row chose; optionally their biases (x's dtype; None for none);
// activation "silu", "gelu_tanh" or "swiglu_clamped" (GPT-OSS's, with swiglu_alpha and swiglu_limit). -> [N, H]:
// row t the sum, from zero and rounded to x's dtype at each add, of round(down(act(gate) * up) * weight) over its
// experts in increasing expert order: bitwise the experts run one by one through the row-wise ops (each bias added
// after its product, rounded) and silu_mul / gelu_tanh_mul / swiglu_clamped_mul, whatever N, the rows' places and
// the threads.
at::Tensor moe_experts(const at::Tensor& x, const at::Tensor& index, const at::Tensor& weight,
                       const OptionalTensorList& gate_up, const OptionalTensorList& gate_up_scales,
                       const OptionalTensorList& down, const OptionalTensorList& down_scales,
                       const std::string& activation, const std::optional<OptionalTensorList>& gate_up_bias,
                       const std::optional<OptionalTensorList>& down_bias, double swiglu_alpha, double swiglu_limit);
// Layers one after another in one call, each with its KV cache's side in between (the caches whose attend
// is "write the step's rows, then verify_attention over the buffers": triforce/models/cache.py): per layer
// 2 norms and eps (input, post-attention), 7 projections (q, k, v, o, gate, up, down), 2 optional q/k
// norms and 1 q/k eps; the step's rows written to k_cache, v_cache and, when given, k_raw_cache at
// slots [B, T]; last_query (when given) recorded as FullCache.attend does. -> h after the last layer.
// rows (int64 [N], increasing, in [0, B * T)): a ragged step's real tokens, b * T + t, each row's first ones (the
// others are padding): every projection, norm and MLP runs on those rows only, packed; the attention's side takes
// the step's [B, T] layout with zero keys and values at the padding (written to the caches as zeros), and computes
// the real queries only (verify_attention_ragged).
// -> h of the rows, [1, N, H] (bitwise those rows of the unpacked forward: every row is computed on its own).
// windows (one per layer, or none): each layer's sliding window for verify_attention (0: none); window_leftpad
// (int32 [B], or none): verify_attention's cache_leftpad on the layers with a window (the first slot they see).
// norm_bias (two per layer, each a bias or none; or none): given, the norms are torch's LayerNorm with those biases
// (StarCoder 2's, StableLM's, GPT-2's, OPT's; DBRX's without), else RMSNorm. mlp: "silu" (Llama's gated SwiGLU:
// gate, up, down) or an ungated down(act(up(x))) of "gelu_tanh", "gelu", "relu", "relu2" (the gate's projection
// slot then not read). attention_scale: the scores' scale (none: 1 / sqrt(head_dim)). parallel: each layer's MLP on
// its second norm of the layer's input, h + attn + mlp(norm(h)) (GPT-NeoX's, Phi-2's, Falcon's block; a block of one
// norm passes it twice), not on h + attn. norm_after (opt-350m's, GPT-1's layer): the attention on h itself and each
// norm after its block's residual add, h2 = norm_in(h + attn), then norm_out(h2 + mlp(h2)). alibi_slopes (float32
// [Hq], or none): every layer's verify_attention adds ALiBi's bias with them (BLOOM's, MPT's, Falcon-RW's layers).
// clip_qkv > 0: q, k and v clamped to [-clip_qkv, clip_qkv] after the q/k norms, before RoPE (OLMo's, MPT's); 0: none.
// sandwich (Gemma 2 / 3's, GLM-4's layer): four norms a layer, [input, post_attention, pre_feedforward,
// post_feedforward], h2 = h + norm_1(attn), then h2 + norm_3(mlp(norm_2(h2))). post_norms (OLMo 2 / 3's, EXAONE 4's
// layer): two norms a layer, [post_attention, post_feedforward], none before the blocks: h2 = h + norm_0(attn(h)),
// then h2 + norm_1(mlp(h2)). norm_kind (without norm_bias): every norm's kind, the q/k norms' too: "llama"
// (triforce.models.llama.RMSNorm), "gemma" (GemmaRMSNorm: the weight applied as 1 + w in float32), "float32"
// (Float32RMSNorm: the weight applied in float32), "cohere" (Cohere's LayerNorm without a bias, in float32; its q/k
// norms' weights [heads, head_dim]). qk_norm_full: the q/k norms over each token's whole q and k projections (OLMo
// 2's), not per head. residual_multiplier (Granite's, HyperCLOVA X's; sequential and sandwich layers only): each
// block's output times it before its residual add. rope_float32: RoPE on 16-bit q and k in float32, rounded once
// (Cohere's, GPT-J's, ERNIE 4.5's). query_scale ([B, T] in h's dtype, or none): the RoPE'd queries times each
// token's scale (Ministral 3's query temperature). qk_norm_after_rope (Hunyuan's, NanoChat's order): the cached key
// rope(k / rms(k)) and the query k_norm_w * q_norm(rope(q)) (Attention._norms_after_rope: the same scores). sinks (one
// [Hq] tensor a layer, or none): GPT-OSS's attention sinks, each query's output times sigmoid(lse - sink) in float32
// (the caches' attention). mlp "xielu" (ungated, Apertus's) with xielu: each layer's [alpha_p, alpha_n, beta, eps] as
// XIELU.forward computes them (the softplus of its parameters). qk_norm_kind: the q/k norms' kind where it is not the
// layers' ("" by default: RMSNorms of the layers' kind, Llama's for LayerNorm layers): norm_kind's names, or "layer"
// (torch's LayerNorm, with qk_norm_bias: two a layer, each a bias or none; Persimmon's); "cohere" takes StableLM 2
// 12B's per-head weights [heads, head_dim]. mixture_last: the last layer's MLP is a mixture of experts, which the
// caller runs: the call stops after that layer's attention and returns [h2, the mixture's input] stacked ([2, B, T,
// H]), h2 = h + o_proj(attn) * residual_multiplier (sandwich, post_norms: h + norm(o_proj(attn)) * residual_multiplier)
// and the input norm(h2) (sandwich: its third norm; parallel: the MLP's norm of h; post_norms: h2 itself), not with
// norm_after; the caller adds the mixture's output (sandwich, post_norms: normed) to h2; gate/up/down placeholders. mlp
// "gelu_tanh_glu": Gemma's gated GeGLU, GELU's tanh form of the gate times up ("gelu_glu": the exact GELU's; ModernBERT
// decoder's). softcap > 0: every layer's verify_attention caps its scores (Gemma 2's); 0: none. ropes and rope_of
// (together, or neither): more RoPE tables, [cos_1, sin_1, cos_2, sin_2, ...], and each layer's, an index into
// [(cos, sin), (cos_1, sin_1), ...] (Gemma 3's local and global layers). attn_gate_kind with attn_gate ([weight,
// scales, bias] a layer): the heads' output times a gate of a projection of the attention's input before o_proj,
// "sigmoid" (AFMoE's), "softplus_head" / "softplus_dim" (Laguna's, in float32 rounded: one a head or a dim).
at::Tensor decoder_layers(const at::Tensor& h, const at::Tensor& cos, const at::Tensor& sin, int64_t head_dim,
                          at::TensorList norm_w, at::ArrayRef<double> eps, at::TensorList w,
                          const OptionalTensorList& scales, const OptionalTensorList& bias,
                          const OptionalTensorList& qk_norm_w, at::ArrayRef<double> qk_eps, at::TensorList k_cache,
                          at::TensorList v_cache, at::TensorList k_raw_cache, at::TensorList last_query,
                          const at::Tensor& slots, const at::Tensor& cache_seqlens,
                          const std::optional<at::Tensor>& tree_mask, const std::optional<at::Tensor>& query_index,
                          const std::optional<at::Tensor>& query_valid, const std::optional<at::Tensor>& rows,
                          at::OptionalIntArrayRef windows, const std::optional<at::Tensor>& window_leftpad,
                          const std::optional<OptionalTensorList>& norm_bias, const std::string& mlp,
                          std::optional<double> attention_scale, bool parallel, bool norm_after,
                          const std::optional<at::Tensor>& alibi_slopes, double clip_qkv, bool sandwich,
                          const std::string& norm_kind, double softcap, std::optional<at::TensorList> ropes,
                          at::OptionalIntArrayRef rope_of, bool post_norms, bool qk_norm_full,
                          double residual_multiplier, bool rope_float32, const std::optional<at::Tensor>& query_scale,
                          bool qk_norm_after_rope, std::optional<at::TensorList> sinks,
                          std::optional<at::TensorList> xielu, const std::string& qk_norm_kind,
                          const std::optional<OptionalTensorList>& qk_norm_bias, bool mixture_last,
                          const std::optional<OptionalTensorList>& attn_gate, const std::string& attn_gate_kind);
// decoder_layers' thread team (csrc/include/triforce/team.h), since the process started: forwards run with a
// team, those of them that stalled, indices of the kernels' loops that the workers ran.
std::vector<int64_t> forward_team_stats();

// ---- verification attention (docs/design.md 3.2) --------------------------------------------------
// (out [B, T, Hq, D], lse float [B, Hq, T]); num_splits: 0 cuts each query's keys into parts at fixed
// multiples of 512 (a row's result is then independent of T); 1..64 cuts the longest prefix into that
// many parts (tests and benchmarks). window > 0: each query sees only the last `window` keys it would see
// (a sliding window; docs/design.md 3.2), 0: all. softcap > 0: every scaled score s becomes
// softcap * tanh(s / softcap) (Gemma 2), 0: none. cache_leftpad (int32 [B], or none): row b's prefix starts at
// cache_leftpad[b] (clamped to [0, cache_seqlens[b] - T]): no query sees a key below it, a window counts from it.
// alibi_slopes (float32 [Hq] or [B, Hq], or none): query head h of row b adds -slope * d to the score of a key it
// sees (after the soft cap), d = how many of the positions it sees lie after that key (ALiBi).
std::tuple<at::Tensor, at::Tensor> verify_attention(const at::Tensor& q, const at::Tensor& k_cache,
                                                    const at::Tensor& v_cache, const at::Tensor& cache_seqlens,
                                                    const std::optional<at::Tensor>& tree_mask, double softmax_scale,
                                                    int64_t num_splits, int64_t window, double softcap,
                                                    const std::optional<at::Tensor>& cache_leftpad,
                                                    const std::optional<at::Tensor>& alibi_slopes);
// cap * tanh(x / cap) for a float32 tensor, elementwise, each element by the same instructions wherever it
// lies (csrc/include/triforce/softcap.h): Gemma 2's soft-capped logits, whose rows must not depend on the batch.
at::Tensor softcap(const at::Tensor& x, double cap);
// verify_attention with query_lens (int32 [B] on the CPU, or none): row b computes its first query_lens[b]
// queries only, each bitwise as when all are computed; the others' output is 0 and lse -inf (a ragged step:
// decoder_layers' rows). Internal: not a torch op.
std::tuple<at::Tensor, at::Tensor> verify_attention_ragged(const at::Tensor& q, const at::Tensor& k_cache,
                                                           const at::Tensor& v_cache, const at::Tensor& cache_seqlens,
                                                           const std::optional<at::Tensor>& tree_mask,
                                                           double softmax_scale, int64_t num_splits,
                                                           const std::optional<at::Tensor>& query_lens,
                                                           int64_t window = 0, double softcap = 0.0,
                                                           const std::optional<at::Tensor>& cache_leftpad = {},
                                                           const std::optional<at::Tensor>& alibi_slopes = {});

// ---- caches (triforce/models/cache.py) -------------------------------------------------------------
// In place, buf [N, B, S, R] contiguous (any dtype), shift int64 [B] on the CPU: for every n and every b with
// shift[b] != 0, slots [lo, hi) of buf[n, b] take what slots [lo + shift[b], hi + shift[b]) held (one memmove,
// the ranges may overlap); every other slot keeps its bytes. Needs 0 <= lo <= hi <= S and
// 0 <= lo + shift[b], hi + shift[b] <= S. A StreamingLLM cache's window shifted down by what an eviction drops
// (csrc/include/triforce/slots.h).
void shift_slots_(at::Tensor& buf, const at::Tensor& shift, int64_t lo, int64_t hi);
// out [G, B, n, H, D] = x [G, B, n, H, D] rotated by cos, sin [B, n, 1, D] (RoPE's half-split pairs), all float32,
// bitwise triforce/models/rope.py's apply_rope but for a NaN's sign; x and out of one shape, any strides with the
// last dimension contiguous, not overlapping; cos / sin contiguous. A float32 StreamingLLM cache's sinks rotated
// again at their new positions (csrc/include/triforce/slots.h).
void rope_into_(at::Tensor& out, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);
// Mamba-2's state space model over T tokens (csrc/cpu/ssm.cpp), all float32 contiguous CPU tensors: state
// [b, H, P, N] updated in place over each row's first counts[b] tokens (default T; the others leave it), x
// [b, T, H, P], B and C [b, T, G, N] (head h reads group h / (H / G)), dt and decay [b, T, H], D [H]; per state row
// and token s = s * decay + (dt * B) * x and y = s . C + D x (the dot in 16 lanes of the dims n % 16, each in order,
// summed in order) -> y [b, T, H, P]. Each state row is one thread's: the bits never depend on the threads or on T.
at::Tensor ssm_scan_(at::Tensor& state, const at::Tensor& x, const at::Tensor& B, const at::Tensor& C,
                     const at::Tensor& dt, const at::Tensor& decay, const at::Tensor& D,
                     const std::optional<at::Tensor>& counts);
// The gated DeltaNet recurrence over T tokens (csrc/cpu/delta.cpp), all float32 contiguous CPU tensors: state
// [b, Hv, K, V] updated in place over each row's first counts[b] tokens (default T; the others leave it), k [b, T, Hk,
// K] (value head h reads key head h / (Hv / Hk)), v [b, T, Hv, V], beta [b, T, Hv], decay [b, T, Hv] (one per head)
// or [b, T, Hv, K] (one per key channel: S's row k times decay[k], Kimi's KDA); per head and token
// S = S * decay, then the delta rule S += k (beta (v - S^T k))^T (S^T k over k in order, every multiply-add fused
// where the CPU has FMA); with q (k's shape) the readout S^T q (k in order, after the update; a token past its row's
// count reads the state as it is) -> [b, T, Hv, V], without (a replay) an empty tensor. Each head is one thread's:
// the bits never depend on the threads or on T.
at::Tensor delta_scan_(at::Tensor& state, const std::optional<at::Tensor>& q, const at::Tensor& k,
                       const at::Tensor& v, const at::Tensor& beta, const at::Tensor& decay,
                       const std::optional<at::Tensor>& counts);
// Mamba(-1)'s selective state space model over T tokens (csrc/cpu/selective.cpp), all float32 contiguous CPU tensors:
// state [b, D, N] updated in place over each row's first counts[b] tokens (default T; the others leave it), x and dt
// [b, T, D], A [D, N], B [b, T, N]; per channel d and token s = s * exp(dt A[d]) + (dt B) x (exp: triforce's exp_f32,
// on 16 lanes where N is a multiple of 16 and the build has AVX-512; every multiply-add fused where the CPU has FMA);
// with C (B's shape) the readout y = s . C (after the update; in 16 lanes of the dims n % 16, each in order, summed
// per quad (l0 + l2) + (l1 + l3), then (q0 + q1) + (q2 + q3); a token past its row's count reads the state as it is)
// -> [b, T, D], without (a replay) an empty tensor. Each channel is one thread's: the bits never depend on the
// threads or on T.
at::Tensor selective_scan_(at::Tensor& state, const at::Tensor& x, const at::Tensor& dt, const at::Tensor& A,
                           const at::Tensor& B, const std::optional<at::Tensor>& C,
                           const std::optional<at::Tensor>& counts);

// ---- accept / reject sampling (docs/design.md 3.3) ------------------------------------------------
std::tuple<at::Tensor, at::Tensor> chain_speculative_sample(const at::Tensor& draft_tokens,
                                                            const std::optional<at::Tensor>& draft_probs,
                                                            const at::Tensor& target_probs, const at::Tensor& uniforms);
std::tuple<at::Tensor, at::Tensor> chain_greedy_verify(const at::Tensor& draft_tokens, const at::Tensor& target_logits);
std::tuple<at::Tensor, at::Tensor, at::Tensor> tree_speculative_sample(const at::Tensor& tree_tokens,
                                                                       const at::Tensor& parents,
                                                                       const std::optional<at::Tensor>& draft_probs,
                                                                       const at::Tensor& target_probs,
                                                                       const at::Tensor& uniforms);
std::tuple<at::Tensor, at::Tensor, at::Tensor> tree_greedy_verify(const at::Tensor& tree_tokens, const at::Tensor& parents,
                                                                  const at::Tensor& target_logits);
#ifdef TRIFORCE_WITH_CUDA
std::tuple<at::Tensor, at::Tensor> chain_speculative_sample_cuda(const at::Tensor& draft_tokens,
                                                                 const std::optional<at::Tensor>& draft_probs,
                                                                 const at::Tensor& target_probs, const at::Tensor& uniforms);
std::tuple<at::Tensor, at::Tensor> chain_greedy_verify_cuda(const at::Tensor& draft_tokens, const at::Tensor& target_logits);
std::tuple<at::Tensor, at::Tensor, at::Tensor> tree_speculative_sample_cuda(const at::Tensor& tree_tokens,
                                                                            const at::Tensor& parents,
                                                                            const std::optional<at::Tensor>& draft_probs,
                                                                            const at::Tensor& target_probs,
                                                                            const at::Tensor& uniforms);
std::tuple<at::Tensor, at::Tensor, at::Tensor> tree_greedy_verify_cuda(const at::Tensor& tree_tokens,
                                                                       const at::Tensor& parents,
                                                                       const at::Tensor& target_logits);
#endif
