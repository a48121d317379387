// Element-wise and attention kernels on the CPU (f32).
// Layout conventions: a token's features are contiguous; multi-head tensors
// are [num_tokens, num_heads, head_dim] with a token stride in floats.
// The KV cache is head-major: K[kv_head][key][head_dim] with strides, so that
// each KV head can keep its own set of keys (SnapKV compaction).
#ifndef SNAPFILL_KERNELS_CPU_OPS_H_
#define SNAPFILL_KERNELS_CPU_OPS_H_

#include <cstdint>

namespace snapfill::cpu {

// y[r, i] = x[r, i] / sqrt(mean_i(x[r, i]²) + eps) * weight[i], rows × dim,
// row strides in floats. y may alias x. Accumulation in f32 (as ggml).
void RmsNorm(const float* x, int64_t x_stride, const float* weight, float* y, int64_t y_stride,
             int64_t rows, int64_t dim, float eps);

// Rotary position embedding in place on x: [num_tokens, num_heads, head_dim],
// token stride `token_stride` floats, heads contiguous (head_dim apart).
// The first rot_dim dims of each head are rotated by angle
// pos[t] * freq_scale * base^(-2i/rot_dim) for pair i.
//   neox=false (Llama, GGML_ROPE_TYPE_NORM): pairs are (2i, 2i+1).
//   neox=true  (GPT-NeoX, Gemma):           pairs are (i, i + rot_dim/2).
void Rope(float* x, int64_t num_tokens, int64_t num_heads, int64_t head_dim, int64_t token_stride,
          const int32_t* pos, int64_t rot_dim, float freq_base, float freq_scale, bool neox);

// out[i] = silu(gate[i]) * up[i], silu(g) = g / (1 + exp(-g)).
void SwiGlu(const float* gate, const float* up, float* out, int64_t n);

// Attention of a chunk of queries over keys, grouped-query, causal with an
// offset, tiled with an online softmax (never materializes the score matrix).
//   q:   [num_q, num_heads, head_dim], token stride q_stride floats
//   k,v: [num_kv_heads][num_keys][head_dim]: element (h, j, d) at
//        k + h * kv_head_stride + j * kv_key_stride + d (same strides for v)
//   out: [num_q, num_heads, head_dim], token stride out_stride floats
// Query head h uses KV head h / (num_heads / num_kv_heads).
// Query i sees keys j <= (num_keys - num_q) + i: the keys before the chunk
// (memory) are all visible, and the chunk's own keys causally.
// scale multiplies q·k (usually 1/sqrt(head_dim)). Accumulation in f32.
void Attention(const float* q, int64_t q_stride, const float* k, const float* v,
               int64_t kv_head_stride, int64_t kv_key_stride, float* out, int64_t out_stride,
               int64_t num_q, int64_t num_keys, int64_t num_heads, int64_t num_kv_heads,
               int64_t head_dim, float scale);

}  // namespace snapfill::cpu

#endif  // SNAPFILL_KERNELS_CPU_OPS_H_
