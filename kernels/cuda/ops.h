// CUDA kernels of the backend's operations, on device memory, queued on a
// stream (nothing here synchronizes). Same names, arguments and layouts as
// the CPU kernels (kernels/cpu/ops.h) and their scalar twins
// (kernels/ref/ops_ref.h), which the tests compare them with
// (tests/backend/cuda_backend_test.cc). Each launcher returns the launch's
// cudaError_t (cudaGetLastError), so a bad configuration is reported where
// it happens rather than at the next synchronization.
//
// Arithmetic: f32 throughout, with these differences from the twins (which
// sum in double; RmsNorm sums its squares in double as they do): Rope takes
// ggml's f32 angle recurrence as the twin does and rotates with double sines
// and cosines; the attention family keeps an online softmax in f32
// (flash-attention's rescaling), never a score matrix; FlashAttention rounds
// its operands to bf16 (below).
// bf16 values are IEEE bfloat16 bit patterns (uint16_t here, so that host
// code needs no CUDA headers to call these).
#ifndef SNAPFILL_KERNELS_CUDA_OPS_H_
#define SNAPFILL_KERNELS_CUDA_OPS_H_

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "kernels/cuda/gather_copy.h"

namespace snapfill::cuda {

// y[r, i] = x[r, i] / sqrt(mean_i(x[r, i]²) + eps) * weight[i]; y may alias x.
cudaError_t RmsNorm(const float* x, int64_t x_stride, const float* weight, float* y, int64_t y_stride,
                    int64_t rows, int64_t dim, float eps, cudaStream_t stream);
// The same, written as bf16 (rounded to nearest even), y [rows, dim] dense:
// the input of a bf16 product.
cudaError_t RmsNormBf16(const float* x, int64_t x_stride, const float* weight, uint16_t* y, int64_t rows,
                        int64_t dim, float eps, cudaStream_t stream);
// y[r, c] = bf16(x[r * x_stride + c]), y [rows, cols] dense.
cudaError_t ToBf16(const float* x, int64_t rows, int64_t cols, int64_t x_stride, uint16_t* y,
                   cudaStream_t stream);
// Rotary embedding in place (cpu::Rope's rule); pos on the device. Head h
// of token t at x + t * token_stride + h * head_stride, its position at
// pos[h * pos_stride + t] (Rope: head_stride = head_dim, pos_stride = 0);
// freq_factors (rot_dim / 2, on the device) or null.
cudaError_t Rope(float* x, int64_t num_tokens, int64_t num_heads, int64_t head_dim, int64_t token_stride,
                 int64_t head_stride, const int32_t* pos, int64_t pos_stride, int64_t rot_dim, float freq_base,
                 float freq_scale, bool neox, const float* freq_factors, cudaStream_t stream);
// out[i] = silu(gate[i]) * up[i] over n values.
cudaError_t SwiGlu(const float* gate, const float* up, float* out, int64_t n, cudaStream_t stream);
// out[i] = gelu(gate[i]) * up[i] over n values, GELU's tanh form
// (cpu::GeluGlu: g / 2 · (1 + tanh(√(2/π) · (g + 0.044715 g³)))).
cudaError_t GeluGlu(const float* gate, const float* up, float* out, int64_t n, cudaStream_t stream);
// out[r, c] = silu(gate[r, c]) * up[r, c] for rows × cols at row stride
// `stride` (gate and up), out [rows, cols] dense, in f32 or as bf16.
cudaError_t SwiGluRows(const float* gate, const float* up, int64_t rows, int64_t cols, int64_t stride,
                       float* out, cudaStream_t stream);
cudaError_t SwiGluRowsBf16(const float* gate, const float* up, int64_t rows, int64_t cols, int64_t stride,
                           uint16_t* out, cudaStream_t stream);

// The attention family's operands: q [num_q, num_heads, head_dim] at token
// stride q_stride; k, v element (h, j, d) at h * head_stride + j * key_stride
// + d; query i of num_q sees keys j <= num_keys - num_q + i.
struct AttentionShape {
  int64_t q_stride = 0;
  int64_t head_stride = 0;
  int64_t key_stride = 0;
  int64_t num_q = 0;
  int64_t num_keys = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  float scale = 0.0f;
  int64_t window = 0;  // > 0: query i sees only its last `window` keys (cpu::Attention's window)
};
// The largest head_dim the attention family takes.
constexpr int64_t kMaxHeadDim = 256;

// out [num_q, num_heads * head_dim] at out_stride: cpu::Attention.
cudaError_t Attention(const float* q, const float* k, const float* v, const AttentionShape& s, float* out,
                      int64_t out_stride, cudaStream_t stream);
// The same on tensor cores (flash_attention.cu), in ref::AttentionBf16's
// arithmetic: q·scale, k and v rounded to bf16, the scores and the online
// softmax in f32, the weights rounded to bf16 for P·V. For head_dim 16, 32, 64,
// 96, 128 or 256 on compute capability 8.0 and later, where the binary holds
// the kernel's sm_80 code (not a JIT of older PTX, where its MMA traps) and
// its tile fits the device's shared memory per block (shared_optin:
// cudaDeviceProp::sharedMemPerBlockOptin; head_dim 256 takes 99 KiB, all
// that sm_86/89/120 allow) (FlashAttentionSupports); cudaErrorInvalidValue
// otherwise. `scratch` (FlashAttentionScratchBytes, 16-byte aligned) takes
// k and v rounded to bf16 in dense rows, which the tiles are copied from.
bool FlashAttentionSupports(int64_t head_dim, int compute_major, size_t shared_optin);
size_t FlashAttentionScratchBytes(const AttentionShape& s);
cudaError_t FlashAttention(const float* q, const float* k, const float* v, const AttentionShape& s, float* out,
                           int64_t out_stride, uint16_t* scratch, cudaStream_t stream);
// lse [num_heads][num_q]: each query's log softmax denominator over the keys
// it sees (cpu::QueryLogSumExp).
cudaError_t QueryLogSumExp(const float* q, const float* k, const AttentionShape& s, float* lse,
                           cudaStream_t stream);
// scores [num_kv_heads][scores_stride]: for each KV head and key j, the
// softmax weight exp(scale · q·k_j - lse) summed over the queries (those that
// see j where `causal`, else all) and averaged over the group's query heads.
// causal with the lse of QueryLogSumExp over the same keys: SnapKV's votes
// (cpu::WindowScores); not causal: the recall tier's RecallScores.
// max_weight: the largest weight over the queries and the group's heads
// instead (cpu::RecallScores' max_weight).
cudaError_t KeyWeights(const float* q, const float* lse, const float* k, const AttentionShape& s, bool causal,
                       float* scores, int64_t scores_stride, cudaStream_t stream, bool max_weight = false);

// SnapKV's votes (cpu::WindowScores) with the scores made by a product:
// GroupQueries lays q [num_q, num_heads, head_dim] (q_stride) out as
// [num_kv_heads][group · num_q][head_dim], row g · num_q + i holding query i
// of the group's head g, so that one strided-batched product per KV head
// gives scores [num_kv_heads][group · num_q][num_keys] (unscaled q·k; query
// i sees keys j <= num_keys - num_q + i). VotesFromScores takes each row's
// log-sum-exp over the keys it sees (lse: num_heads · num_q floats of
// scratch), then per key sums exp(scale · s - lse) over the rows that see it,
// in f32, averaged over the group: votes [num_kv_heads] at votes_stride.
cudaError_t GroupQueries(const float* q, int64_t q_stride, int64_t num_q, int64_t num_heads, int64_t num_kv_heads,
                         int64_t head_dim, float* out, cudaStream_t stream);
cudaError_t VotesFromScores(const float* scores, int64_t num_q, int64_t num_keys, int64_t num_heads,
                            int64_t num_kv_heads, float scale, float* lse, float* votes, int64_t votes_stride,
                            cudaStream_t stream);

// Stride-1 pooling with kernel/2 padding (ref::AvgPool1d / ref::MaxPool1d),
// the average in kernels/cpu's f32 arithmetic: the CPU's bits.
cudaError_t Pool1d(const float* in, float* out, int64_t n, int64_t kernel, bool max, cudaStream_t stream);

// The k largest of scores[0, n): their positions, higher score first, ties
// to the lower position (a stable descending radix sort of (score,
// position) pairs, CUB), into order[0, n) (all n positions sorted). scratch
// of TopKScratchBytes(n) bytes.
size_t TopKScratchBytes(int64_t n);
cudaError_t SortDescending(const float* scores, int64_t n, int32_t* order, void* scratch, size_t scratch_bytes,
                           cudaStream_t stream);

// SnapKV's selection for num_heads KV heads at once, one block each
// (Backend::SelectHeads; twin ref::SelectHeads): R = [rest_begin,
// window_begin) of each head's votes, pooled over R alone in f32 as the
// CPU pools; with span 1 the pick-th largest pooled vote found by a radix
// select over their order-preserving bits, then every entry above it and
// the lowest indices equal to it, in index order (a block scan); with a
// larger span, the spans' walk (cpu::TopSpanIndices' rule) by one warp
// over per-tile maxima; between the sinks [0, rest_begin) and the window
// [window_begin, num_candidates); with then_pick > 0, then_pick more of R
// by the radix select over then_votes' pooled keys, those the first pick
// took set to 0, both picks merged in index order; then -1, or the first
// candidate of R with a non-finite vote in either row (the row then [0,
// count)). scratch: SelectHeadsScratchBytes(num_heads, window_begin -
// rest_begin) bytes.
size_t SelectHeadsScratchBytes(int64_t num_heads, int64_t num_rest);
cudaError_t SelectHeads(const float* votes, int64_t votes_stride, int64_t num_heads, int64_t num_candidates,
                        int64_t rest_begin, int64_t window_begin, int64_t pick, int64_t pool_kernel, bool max_pool,
                        int64_t span, const float* then_votes, int64_t then_votes_stride, int64_t then_pick,
                        void* scratch, int32_t* keep, int64_t keep_stride, cudaStream_t stream);

// The candidates a selection left (Backend::Complement; twin
// ref::Complement), on the device: for head h < num_heads (grid y), each
// candidate j finds by a binary search how many kept indices lie below it
// and, where it is not one of them, writes itself there: out[h * out_stride
// + j - below] = j. keep's rows ascending, distinct, below num_candidates.
cudaError_t Complement(const int32_t* keep, int64_t keep_stride, int64_t kept, int64_t num_heads,
                       int64_t num_candidates, int32_t* out, int64_t out_stride, cudaStream_t stream);

// SmartKV's gates (Backend::GateScores) for every head h < num_heads and
// key i < n, all operands on the device: params + h * params_stride packed
// as mean, inv_std, w1 [hidden][head_dim], b1, w2, b2; the key at keys +
// h * keys_head_stride + i * key_stride; the score to y[h * y_stride + i].
// f32 with fused multiply-adds (the twin, ref::GateForward, sums in double).
cudaError_t GateScores(const float* params, int64_t params_stride, int64_t num_heads, int64_t head_dim, int64_t hidden,
                       const float* keys, int64_t keys_head_stride, int64_t key_stride, int64_t n, float* y,
                       int64_t y_stride, cudaStream_t stream);

// y[i] += x[i] over n values.
cudaError_t AddInPlace(float* y, const float* x, int64_t n, cudaStream_t stream);
// x[r * stride + i] += bias[i] for r < rows, i < dim (Qwen's Q/K/V biases).
cudaError_t AddRows(float* x, int64_t stride, const float* bias, int64_t rows, int64_t dim, cudaStream_t stream);
// x[i] *= s over n values (Gemma's embedding scale).
cudaError_t Scale(float* x, int64_t n, float s, cudaStream_t stream);
// x[i] = value over n values.
cudaError_t Fill(float* x, int64_t n, float value, cudaStream_t stream);
// Backend::Gather's copies within the device (gather_copy.h: each
// dst + i * dst_stride <- src + rows[i] * src_stride, or row i where rows is
// null), kGatherBatch of them a launch, in the widest words every address
// and size allows. The copies must not overlap one another's destinations.
cudaError_t GatherRows(const GatherCopy* copies, int num_copies, cudaStream_t stream);
// Q8_0 rows (ggml's blocks of 32: an fp16 scale d, then 32 int8 q), rows ×
// cols values at row_bytes apart, to dense bf16 (bf16_out) or f32 (f32_out,
// where bf16_out is null): q · d in f32 as cpu::DequantizeRow, then rounded
// to nearest even for bf16. A weight upload's.
cudaError_t DequantizeQ8_0(const void* raw, int64_t rows, int64_t cols, int64_t row_bytes, uint16_t* bf16_out,
                           float* f32_out, cudaStream_t stream);
// y[i] = x[i] as IEEE fp16, rounded to nearest even: src/base/half.h's
// Fp32ToFp16 itself (cpu::ToFp16's twin), so the bits are the CPU's but for
// NaNs' payloads (every NaN becomes 0x7E00 with its sign; F16C keeps the
// payload's top bits). The recall tier's evicted rows.
cudaError_t ToFp16(const float* x, uint16_t* y, int64_t n, cudaStream_t stream);
// Row-scaled int8 records (src/base/int8_rows.h), a warp a row, with the
// scalar twin's own functions: the bits are cpu::ToInt8Rows'. The recall
// tier's evicted rows for a q8 store.
cudaError_t ToInt8Rows(const float* x, uint8_t* y, int64_t rows, int64_t dim, cudaStream_t stream);
// y[i] = bf16(x[i]) for a weight upload.
cudaError_t F32ToBf16(const float* x, uint16_t* y, int64_t n, cudaStream_t stream);

}  // namespace snapfill::cuda

#endif  // SNAPFILL_KERNELS_CUDA_OPS_H_
