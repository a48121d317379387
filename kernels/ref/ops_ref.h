// Scalar reference twins of the element-wise and attention kernels in
// kernels/cpu/ops.h: plain loops, double accumulators, no SIMD, no threads.
// They are the source of truth the optimized kernels are tested against, so
// they are written for clarity (llama2.c style), not speed. Same names, same
// arguments and same layouts as snapfill::cpu.
#ifndef SNAPFILL_KERNELS_REF_OPS_REF_H_
#define SNAPFILL_KERNELS_REF_OPS_REF_H_

#include <cstdint>

namespace snapfill::ref {

// y[r, i] = x[r, i] * (1 / sqrt(mean_i(x[r, i]²) + eps)) * weight[i].
// Sum of squares in double (ggml sums the f32 squares in ggml_float = double).
void RmsNorm(const float* x, int64_t x_stride, const float* weight, float* y, int64_t y_stride,
             int64_t rows, int64_t dim, float eps);

// Rotary embedding, in place; see cpu::Rope. The angle of pair i is ggml's
// schedule, which is part of the definition: theta_0 = (float)pos,
// theta_{i+1} = theta_i * powf(base, -2/rot_dim) in f32, divided by
// freq_factors[i] where given, times freq_scale. The rotation itself is
// done in double.
void Rope(float* x, int64_t num_tokens, int64_t num_heads, int64_t head_dim, int64_t token_stride,
          const int32_t* pos, int64_t rot_dim, float freq_base, float freq_scale, bool neox,
          const float* freq_factors = nullptr);

// out[i] = gate[i] / (1 + exp(-gate[i])) * up[i], in double.
void SwiGlu(const float* gate, const float* up, float* out, int64_t n);

// out[i] = gelu(gate[i]) * up[i], GELU's tanh form, in double (cpu::GeluGlu).
void GeluGlu(const float* gate, const float* up, float* out, int64_t n);

// Naive attention: for each query and head, s_j = scale · q·k_j over the
// visible keys j <= num_keys - num_q + i (and, with window > 0, j >
// num_keys - num_q + i - window: a sliding window), p = softmax(s), out =
// Σ_j p_j v_j, all in double. Layouts as cpu::Attention; lse (optional,
// [num_heads][num_q]): log Σ_j e^(s_j) over the visible keys.
void Attention(const float* q, int64_t q_stride, const float* k, const float* v, int64_t kv_head_stride,
               int64_t kv_key_stride, float* out, int64_t out_stride, int64_t num_q, int64_t num_keys,
               int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, float scale, int64_t window = 0,
               float* lse = nullptr);

// The AMX-BF16 attention's arithmetic (cpu::Attention of a chunk where
// cpu::AttentionHasAmx(), and cuda::FlashAttention): q·scale, k and v rounded to bf16 (Fp32ToBf16Rne),
// scores and the softmax in double, each probability rounded to bf16 before
// it weights v, the sum over the unrounded ones. If abs_out is not null it
// receives Σ|p̂·v̂| / Σp per output (same layout as out), the scale for
// tolerances. Layouts, window and lse (of the bf16 scores) as cpu::Attention.
void AttentionBf16(const float* q, int64_t q_stride, const float* k, const float* v, int64_t kv_head_stride,
                   int64_t kv_key_stride, float* out, int64_t out_stride, int64_t num_q, int64_t num_keys,
                   int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, float scale, float* abs_out = nullptr,
                   int64_t window = 0, float* lse = nullptr);

// SnapKV votes: votes[h][j] = (1/group) Σ_{query heads g of h} Σ_i
// softmax_i(scale · q_i·k)[j], invisible keys contributing 0; in double.
// Layouts as cpu::WindowScores.
void WindowScores(const float* q, int64_t q_stride, const float* k, int64_t kv_head_stride,
                  int64_t kv_key_stride, float* votes, int64_t votes_stride, int64_t num_q,
                  int64_t num_keys, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                  float scale);

// The log of each query's softmax denominator over the keys it sees, with
// Attention's visibility (query i of num_q sees keys j <= num_keys - num_q
// + i): lse[h * num_q + i] = log Σ_j exp(scale · q_{i,h} · k_{kvh(h),j}),
// [num_heads][num_q]. In double, rounded to f32 at the end.
void QueryLogSumExp(const float* q, int64_t q_stride, const float* k, int64_t kv_head_stride,
                    int64_t kv_key_stride, int64_t num_q, int64_t num_keys, int64_t num_heads,
                    int64_t num_kv_heads, int64_t head_dim, float scale, float* lse);

// What the recall tier ranks stored keys by: the attention weight each of
// num_keys keys (every one visible to every query) would take from the
// queries if it joined the keys that gave them `lse` (QueryLogSumExp),
// summed over the queries and averaged over the KV group's query heads:
// scores[kvh * scores_stride + j] = (1 / group) Σ_{h of kvh} Σ_i
// exp(scale · q_{i,h} · k_{kvh,j} - lse[h * num_q + i]).
// max_weight: the largest of those weights over i and the group's h
// instead of the average of the sums (context reconstruction, DESIGN.md §9).
void RecallScores(const float* q, int64_t q_stride, int64_t num_q, const float* lse, const float* k,
                  int64_t kv_head_stride, int64_t kv_key_stride, int64_t num_keys, float* scores,
                  int64_t scores_stride, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                  float scale, bool max_weight = false);

// cpu::RecallMaxWeightsBf16's arithmetic: RecallScores' max_weight over
// q·scale and k rounded to bf16 (Fp32ToBf16Rne), in double.
void RecallMaxWeightsBf16(const float* q, int64_t q_stride, int64_t num_q, const float* lse, const float* k,
                          int64_t kv_head_stride, int64_t kv_key_stride, int64_t num_keys, float* scores,
                          int64_t scores_stride, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                          float scale);

// Stride-1 pooling with kernel/2 padding on both sides; output length n.
// Avg: pads count as zeros, always divided by kernel (PyTorch avg_pool1d
// count_include_pad=True). Max: pads ignored. kernel must be odd.
void AvgPool1d(const float* in, float* out, int64_t n, int64_t kernel);
void MaxPool1d(const float* in, float* out, int64_t n, int64_t kernel);

// Positions of the k highest scores, sorted ascending. Order: higher score
// first, ties broken by lower position. Full sort. k is clamped to n.
void TopKIndices(const float* scores, int64_t n, int64_t k, int32_t* out_sorted_positions);

// The k entries taken as spans around the highest scores (cpu::TopSpanIndices'
// rule), ascending: while fewer than k are taken, the highest score not
// taken (the lower position among equals) and then its untaken neighbours
// within span/2, nearest first, the lower side first. A search of every
// entry per peak, no sort; span <= 1 is TopKIndices.
void TopSpanIndices(const float* scores, int64_t n, int64_t k, int64_t span, int32_t* out_sorted_positions);

// SnapKV's selection of one layer, every KV head (Backend::SelectHeads):
// for head h, R = candidates [rest_begin, window_begin), pooled over R
// alone (the mean or the largest of each entry's kernel/2 neighbours on
// either side, the mean's pads counted as zeros, in f32 as kernels/cpu
// pools; kernel odd); keep[h] =
// [0, rest_begin), the `pick` of R taken by TopSpanIndices(pooled, span)
// (with span 1: the highest pooled votes, higher, then lower index) and
// [window_begin, num_candidates), ascending, then one word: -1, or the
// first candidate of R with a non-finite vote (the row then [0, count)).
// With then_pick > 0, then_pick more of R, ascending among the others: the
// highest of then_votes' pooled votes among the entries the first pick
// did not take (higher, then lower index); a vote of either row checked.
void SelectHeads(const float* votes, int64_t votes_stride, int64_t num_heads, int64_t num_candidates,
                 int64_t rest_begin, int64_t window_begin, int64_t pick, int64_t pool_kernel, bool max_pool,
                 int64_t span, const float* then_votes, int64_t then_votes_stride, int64_t then_pick, int32_t* keep,
                 int64_t keep_stride);

// The candidates a selection left (Backend::Complement): for head h, the
// indices of [0, num_candidates) that keep[h * keep_stride, + kept) does
// not hold, ascending, into out + h * out_stride. A mark per candidate, then
// the unmarked ones in order.
void Complement(const int32_t* keep, int64_t keep_stride, int64_t kept, int64_t num_heads, int64_t num_candidates,
                int32_t* out, int64_t out_stride);

// In place softmax over x[0..n), in double.
void Softmax(float* x, int64_t n);

// Index of the first maximum of x[0..n) (n >= 1).
int64_t Argmax(const float* x, int64_t n);

// SmartKV's gate on n keys before RoPE (src/compress/gate.h), in double:
// y[i] = w2 · relu(w1 ((k_i - mean) ⊙ inv_std) + b1) + b2, with w1
// [hidden][head_dim] and k_i = keys[i * key_stride, + head_dim).
void GateForward(const float* mean, const float* inv_std, const float* w1, const float* b1, const float* w2, float b2,
                 int64_t head_dim, int64_t hidden, const float* keys, int64_t key_stride, int64_t n, float* y);

}  // namespace snapfill::ref

#endif  // SNAPFILL_KERNELS_REF_OPS_REF_H_
