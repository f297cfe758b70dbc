// The one file of TORCH_LIBRARY schemas: internal kernels as torch.ops.triforce_C.*, called by the
// `cpu` and `cuda` backends of the public ops (torch.ops.triforce.*, defined in Python).
#include <Python.h>
#include <torch/library.h>

#include "ops.h"

TORCH_LIBRARY(triforce_C, m) {
  // ---- retrieval cache (docs/design.md 3.1)
  m.def("chunk_mean_keys(Tensor k, int chunk_size) -> Tensor");
  m.def("score_chunks(Tensor q, Tensor chunk_keys, Tensor num_chunks) -> Tensor");
  m.def("select_chunks(Tensor scores, Tensor num_chunks, int budget_chunks, int sink_chunks, int recent_chunks) -> Tensor");
  m.def("gather_chunks(Tensor k, Tensor v, Tensor chunk_idx, int chunk_size, Tensor(a!) out_k, Tensor(b!) out_v) -> ()");
  m.def("build_retrieval_cache(Tensor q, Tensor k, Tensor v, Tensor chunk_keys, Tensor num_chunks, int chunk_size, "
        "int budget_chunks, Tensor(a!) out_k, Tensor(b!) out_v, int sink_chunks, int recent_chunks) -> Tensor");
  // ---- verification attention (docs/design.md 3.2)
  m.def("verify_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor cache_seqlens, Tensor? tree_mask, "
        "float softmax_scale, int num_splits, int window=0, float softcap=0.0, Tensor? cache_leftpad=None, "
        "Tensor? alibi_slopes=None) -> (Tensor, Tensor)");
  m.def("softcap(Tensor x, float cap) -> Tensor");
  // ---- accept / reject sampling (docs/design.md 3.3)
  m.def("chain_speculative_sample(Tensor draft_tokens, Tensor? draft_probs, Tensor target_probs, Tensor uniforms)"
        " -> (Tensor, Tensor)");
  m.def("chain_greedy_verify(Tensor draft_tokens, Tensor target_logits) -> (Tensor, Tensor)");
  m.def("rowwise_linear(Tensor x, Tensor w) -> Tensor");
  m.def("rowwise_linear_heads(Tensor x, Tensor w) -> Tensor");
  m.def("rowwise_linear_q8(Tensor x, Tensor q, Tensor scales) -> Tensor");
  m.def("rowwise_linear_fp8(Tensor x, Tensor q, Tensor scales) -> Tensor");
  m.def("rowwise_linear_q4_1(Tensor x, Tensor w) -> Tensor");
  m.def("rowwise_linear_i8(Tensor x, Tensor codes, Tensor scales) -> Tensor");
  m.def("ternary_linear(Tensor q, Tensor packed) -> Tensor");
  m.def("decoder_attn_in(Tensor h, Tensor norm_w, float eps, Tensor[] w, Tensor?[] scales, Tensor?[] bias, "
        "Tensor? q_norm_w, Tensor? k_norm_w, float qk_eps, Tensor cos, Tensor sin, int head_dim) "
        "-> (Tensor, Tensor, Tensor, Tensor)");
  m.def("decoder_attn_out_mlp(Tensor h, Tensor attn, Tensor norm_w, float eps, Tensor[] w, Tensor?[] scales, "
        "Tensor?[] bias) -> Tensor");
  m.def("decoder_attn_out(Tensor h, Tensor attn, Tensor norm_w, float eps, Tensor[] w, Tensor?[] scales, "
        "Tensor?[] bias) -> (Tensor, Tensor)");
  m.def("mla_qk(Tensor q, Tensor q_lat, Tensor kv, Tensor norm_w, float eps, Tensor cos, Tensor sin, Tensor layout, "
        "bool rope_f32) -> (Tensor, Tensor, Tensor)");
  m.def("rms_norm(Tensor x, Tensor w, float eps) -> Tensor");
  m.def("index_scores(Tensor q, Tensor k, Tensor w, float scale) -> Tensor");
  m.def("silu_mul(Tensor gate, Tensor up) -> Tensor");
  m.def("gelu_tanh_mul(Tensor gate, Tensor up) -> Tensor");
  m.def("gelu_mul(Tensor gate, Tensor up) -> Tensor");
  m.def("swiglu_clamped_mul(Tensor gate, Tensor up, float alpha, float limit) -> Tensor");
  m.def("moe_experts(Tensor x, Tensor index, Tensor weight, Tensor?[] gate_up, Tensor?[] gate_up_scales, "
        "Tensor?[] down, Tensor?[] down_scales, str activation, Tensor?[]? gate_up_bias=None, "
        "Tensor?[]? down_bias=None, float swiglu_alpha=0., float swiglu_limit=0.) -> Tensor");
  m.def("decoder_layers(Tensor h, Tensor cos, Tensor sin, int head_dim, Tensor[] norm_w, float[] eps, Tensor[] w, "
        "Tensor?[] scales, Tensor?[] bias, Tensor?[] qk_norm_w, float[] qk_eps, Tensor(a!)[] k_cache, "
        "Tensor(b!)[] v_cache, Tensor(c!)[] k_raw_cache, Tensor(d!)[] last_query, Tensor slots, "
        "Tensor cache_seqlens, Tensor? tree_mask, Tensor? query_index, Tensor? query_valid, Tensor? rows=None, "
        "int[]? windows=None, Tensor? window_leftpad=None, Tensor?[]? norm_bias=None, str mlp='silu', "
        "float? attention_scale=None, bool parallel=False, bool norm_after=False, Tensor? alibi_slopes=None, "
        "float clip_qkv=0.0, bool sandwich=False, str norm_kind='llama', float softcap=0.0, Tensor[]? ropes=None, "
        "int[]? rope_of=None, bool post_norms=False, bool qk_norm_full=False, float residual_multiplier=1.0, "
        "bool rope_float32=False, Tensor? query_scale=None, bool qk_norm_after_rope=False, Tensor[]? sinks=None, "
        "Tensor[]? xielu=None, str qk_norm_kind='', Tensor?[]? qk_norm_bias=None, bool mixture_last=False, "
        "Tensor?[]? attn_gate=None, str attn_gate_kind='') -> Tensor");
  m.def("tree_speculative_sample(Tensor tree_tokens, Tensor parents, Tensor? draft_probs, Tensor target_probs,"
        " Tensor uniforms) -> (Tensor, Tensor, Tensor)");
  m.def("tree_greedy_verify(Tensor tree_tokens, Tensor parents, Tensor target_logits) -> (Tensor, Tensor, Tensor)");
  // ---- caches: a StreamingLLM window shifted in place, its sinks rotated again (csrc/ops.h)
  m.def("shift_slots_(Tensor(a!) buf, Tensor shift, int lo, int hi) -> ()");
  m.def("rope_into_(Tensor(a!) out, Tensor x, Tensor cos, Tensor sin) -> ()");
  m.def("ssm_scan_(Tensor(a!) state, Tensor x, Tensor B, Tensor C, Tensor dt, Tensor decay, Tensor D, "
        "Tensor? counts=None) -> Tensor");
  m.def("delta_scan_(Tensor(a!) state, Tensor? q, Tensor k, Tensor v, Tensor beta, Tensor decay, "
        "Tensor? counts=None) -> Tensor");
  m.def("selective_scan_(Tensor(a!) state, Tensor x, Tensor dt, Tensor A, Tensor B, Tensor? C, "
        "Tensor? counts=None) -> Tensor");
  // decoder_layers' thread team (csrc/include/triforce/team.h): [forwards with a team, of them stalled, indices
  // the workers ran], since the process started
  m.def("forward_team_stats() -> int[]", &forward_team_stats);
  // rowwise_linear_i8 on the AMX tiles: allow / forbid them (enable), then whether they are used (csrc/ops.h)
  m.def("rowwise_linear_i8_tiles(bool? enable=None) -> bool", &rowwise_linear_i8_tiles);
}

TORCH_LIBRARY_IMPL(triforce_C, CPU, m) {
  // ---- retrieval cache
  m.impl("chunk_mean_keys", &chunk_mean_keys);
  m.impl("score_chunks", &score_chunks);
  m.impl("select_chunks", &select_chunks);
  m.impl("gather_chunks", &gather_chunks);
  m.impl("build_retrieval_cache", &build_retrieval_cache);
  // ---- verification attention
  m.impl("verify_attention", &verify_attention);
  m.impl("softcap", &softcap);
  // ---- accept / reject sampling
  m.impl("chain_speculative_sample", &chain_speculative_sample);
  m.impl("chain_greedy_verify", &chain_greedy_verify);
  m.impl("rowwise_linear", &rowwise_linear);
  m.impl("rowwise_linear_heads", &rowwise_linear_heads);
  m.impl("rowwise_linear_q8", &rowwise_linear_q8);
  m.impl("rowwise_linear_fp8", &rowwise_linear_fp8);
  m.impl("rowwise_linear_q4_1", &rowwise_linear_q4_1);
  m.impl("rowwise_linear_i8", &rowwise_linear_i8);
  m.impl("ternary_linear", &ternary_linear);
  m.impl("decoder_attn_in", &decoder_attn_in);
  m.impl("mla_qk", &mla_qk);
  m.impl("rms_norm", &rms_norm_op);
  m.impl("index_scores", &index_scores);
  m.impl("decoder_attn_out_mlp", &decoder_attn_out_mlp);
  m.impl("decoder_attn_out", &decoder_attn_out);
  m.impl("silu_mul", &silu_mul);
  m.impl("gelu_tanh_mul", &gelu_tanh_mul);
  m.impl("gelu_mul", &gelu_mul);
  m.impl("swiglu_clamped_mul", &swiglu_clamped_mul);
  m.impl("moe_experts", &moe_experts);
  m.impl("decoder_layers", &decoder_layers);
  m.impl("tree_speculative_sample", &tree_speculative_sample);
  m.impl("tree_greedy_verify", &tree_greedy_verify);
  m.impl("shift_slots_", &shift_slots_);
  m.impl("rope_into_", &rope_into_);
  m.impl("ssm_scan_", &ssm_scan_);
  m.impl("delta_scan_", &delta_scan_);
  m.impl("selective_scan_", &selective_scan_);
}

#ifdef TRIFORCE_WITH_CUDA
TORCH_LIBRARY_IMPL(triforce_C, CUDA, m) {
  // ---- retrieval cache
  // ---- verification attention
  // ---- accept / reject sampling
  m.impl("chain_speculative_sample", &chain_speculative_sample_cuda);
  m.impl("chain_greedy_verify", &chain_greedy_verify_cuda);
  m.impl("tree_speculative_sample", &tree_speculative_sample_cuda);
  m.impl("tree_greedy_verify", &tree_greedy_verify_cuda);
}
#endif

// `import triforce_kernels._C` loads this library (registering the ops above) and exposes WITH_CUDA.
static struct PyModuleDef triforce_c_module = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};

PyMODINIT_FUNC PyInit__C(void) {
  PyObject* m = PyModule_Create(&triforce_c_module);
  if (m == nullptr) return nullptr;
#ifdef TRIFORCE_WITH_CUDA
  Py_INCREF(Py_True);  // PyModule_AddObject steals a reference
  PyModule_AddObject(m, "WITH_CUDA", Py_True);
#else
  Py_INCREF(Py_False);
  PyModule_AddObject(m, "WITH_CUDA", Py_False);
#endif
  return m;
}
