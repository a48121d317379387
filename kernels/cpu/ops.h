// Element-wise and attention kernels on the CPU (f32).
// Layout conventions: a token's features are contiguous; multi-head tensors
// are [num_tokens, num_heads, head_dim] with a token stride in floats.
// The KV cache is head-major: K[kv_head][key][head_dim] with strides, so that
// each KV head can keep its own set of keys (SnapKV compaction).
#ifndef SNAPFILL_KERNELS_CPU_OPS_H_
#define SNAPFILL_KERNELS_CPU_OPS_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string_view>
#include <vector>
#include <string>

namespace snapfill::cpu {

// y[r, i] = x[r, i] / sqrt(mean_i(x[r, i]²) + eps) * weight[i], rows × dim,
// row strides in floats. y may alias x. As ggml: squares in f32, their sum in
// double (ggml_float), scale = 1.0f / sqrtf(mean + eps) in f32, then
// y = (x * scale) * weight in f32. Threads: the kernels' team over rows.
void RmsNorm(const float* x, int64_t x_stride, const float* weight, float* y, int64_t y_stride,
             int64_t rows, int64_t dim, float eps);

// f(i) for every i in [0, n), on the kernels' thread team (the threads of
// the decode step's and of the prefill kernels' parallel regions, which wait
// for work by spinning: kernels/cpu/spin_team.h), i handed out one at a
// time; returns when all are done. For loops of the callers above the
// kernels that run between the kernels' regions (SnapKV's selection per KV
// head, the prefill engine's copies), so that the same threads, still
// spinning, take them. From inside such a loop, runs on the calling thread.
void ParallelFor(int64_t n, const std::function<void(int64_t)>& f);

// How the kernels' threads wait between parallel regions, in words (for
// `snapfill info`).
std::string ThreadWaits();

// Rotary position embedding in place on x: [num_tokens, num_heads, head_dim],
// token stride `token_stride` floats, heads contiguous (head_dim apart).
// The first rot_dim dims of each head are rotated by angle
// freq_scale * (pos[t] * base^(-2i/rot_dim) / freq_factors[i]) for pair i
// (freq_factors: rot_dim / 2 of them, Llama 3.1's rope_freqs; null: 1).
//   neox=false (Llama, GGML_ROPE_TYPE_NORM): pairs are (2i, 2i+1).
//   neox=true  (GPT-NeoX, Qwen, Gemma):     pairs are (i, i + rot_dim/2).
void Rope(float* x, int64_t num_tokens, int64_t num_heads, int64_t head_dim, int64_t token_stride,
          const int32_t* pos, int64_t rot_dim, float freq_base, float freq_scale, bool neox,
          const float* freq_factors = nullptr);

// y[i] = x[i] as IEEE fp16, rounded to nearest even (F16C where the level
// has it; twin: Fp32ToFp16 of src/base/half.h, bit for bit but for NaNs,
// whose payload's top bits F16C keeps where the twin gives 0x7E00).
void ToFp16(const float* x, uint16_t* y, int64_t n);
// y[i] = x[i] widened from IEEE fp16 (exact; F16C where the level has it;
// twin: Fp16ToFp32 of src/base/half.h, bit for bit but that F16C returns a
// signaling NaN quiet).
void FromFp16(const uint16_t* x, float* y, int64_t n);
// Row-scaled int8 records (the recall store's q8), `rows` rows of `dim`
// floats to rows × (4 + dim) bytes and back; twins: EncodeInt8Row and
// DecodeInt8Row of src/base/int8_rows.h, bit for bit for finite values.
void ToInt8Rows(const float* x, uint8_t* y, int64_t rows, int64_t dim);
void FromInt8Rows(const uint8_t* y, float* x, int64_t rows, int64_t dim);

// out[i] = silu(gate[i]) * up[i], silu(g) = g / (1 + exp(-g)).
void SwiGlu(const float* gate, const float* up, float* out, int64_t n);

// out[i] = gelu(gate[i]) * up[i] with GELU's tanh form (ggml_gelu, Gemma's
// GeGLU): gelu(g) = g / 2 · (1 + tanh(√(2/π) · (g + 0.044715 g³))).
// ref::GeluGlu is the twin (ggml itself reads a table of the gelu of every
// f16, so llama.cpp's results differ from both by f16 rounding).
void GeluGlu(const float* gate, const float* up, float* out, int64_t n);

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
// Work: the kernels' team over (KV head × query block); each item runs the whole group
// of query heads of its KV head against 64-key tiles of K and V.
// With num_q > 1 and head_dim 64, 128 or 256, both products take bf16
// operands (q·scale, k, v and the probabilities; f32 sums): on AMX-BF16
// tiles where the CPU has them (AttentionHasAmx()), else with AVX512-BF16
// vdpbf16ps where it has that (AttentionHasAvx512Bf16()):
// ref::AttentionBf16's arithmetic, within about 2^-8 of the f32 result.
// Otherwise, and for one query (decode), f32 (AttentionF32).
//
// window > 0: a sliding window besides (Gemma's local layers): query i
// sees only keys j > (num_keys - num_q) + i - window, the last `window`
// positions up to its own. The kernels skip the blocks before a row
// group's windows and mask both ends.
//
// lse (optional, [num_heads][num_q]): each query's log softmax denominator
// over the keys it saw, log Σ_j e^(scale · q·k_j), from the pass's own
// running max and sum (so in the bf16 kernels, of the bf16 scores: within
// about 1e-3 of QueryLogSumExp's); context reconstruction takes it instead
// of a second pass over the keys.
void Attention(const float* q, int64_t q_stride, const float* k, const float* v, int64_t kv_head_stride,
               int64_t kv_key_stride, float* out, int64_t out_stride, int64_t num_q, int64_t num_keys,
               int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, float scale, int64_t window = 0,
               float* lse = nullptr);

// One query (decode) over K and V stored as IEEE fp16 (the decode copy of
// the KV cache: half the bytes each step streams), same layout and
// visibility as Attention with num_q = 1 (all num_keys keys visible); q,
// out f32 ([num_heads, head_dim]), products and sums in f32 (each element
// converted exactly). Twin: ref::Attention over the fp16 values.
void AttentionDecodeF16(const float* q, const uint16_t* k, const uint16_t* v, int64_t kv_head_stride,
                        int64_t kv_key_stride, float* out, int64_t num_keys, int64_t num_heads,
                        int64_t num_kv_heads, int64_t head_dim, float scale);

// Attention always in f32 (the path Attention takes without AMX-BF16 or
// AVX512-BF16, and for one query): for exact references.
void AttentionF32(const float* q, int64_t q_stride, const float* k, const float* v, int64_t kv_head_stride,
                  int64_t kv_key_stride, float* out, int64_t out_stride, int64_t num_q, int64_t num_keys,
                  int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, float scale, int64_t window = 0,
                  float* lse = nullptr);

// Which Attention implementation runs a chunk. kAuto: by the CPU's flags,
// AMX-BF16 where available, else AVX512-BF16 where available, else f32;
// kF32: always f32; kAvx512Bf16: the AVX512-BF16 kernel where the CPU has
// it (so AMX machines run it too), else f32; kAmxBf16: AMX-BF16 where
// available, else f32. Process-wide: the CPU backend sets it when it is
// made (BackendOptions::attention_kernel); tests and benchmarks set it too.
enum class AttentionImpl { kAuto, kF32, kAvx512Bf16, kAmxBf16 };
void SetAttentionImpl(AttentionImpl impl);
inline void SetAttentionImplForTesting(AttentionImpl impl) { SetAttentionImpl(impl); }
AttentionImpl ActiveAttentionImpl();
// "auto", "f32", "avx512-bf16", "amx-bf16"; and back (nullopt for another
// name).
const char* AttentionImplName(AttentionImpl impl);
std::optional<AttentionImpl> AttentionImplFromName(std::string_view name);
// The implementations that run a chunk here (at the active level, with the
// AMX choice in force): f32 always, then those the CPU has.
std::vector<AttentionImpl> AvailableAttentionImpls();
// The rate of each available implementation on a chunk of 512 queries
// over 1,536 keys, of num_heads heads of head_dim on num_kv_heads KV heads
// (by default the default model's: 9 heads of 64, 3 KV heads): the best of
// three runs, in GOP/s (attention's ops: Backend::Ops). About 0.1 s in all
// at the default (0.2 s at Gemma 3's 4 heads of 256). Leaves the
// implementation in force as it was.
struct AttentionRate {
  AttentionImpl impl;
  double gops = 0;
};
std::vector<AttentionRate> MeasureAttentionImpls(int64_t num_heads = 9, int64_t num_kv_heads = 3,
                                                 int64_t head_dim = 64);
// The best rate of `runs` timed calls of fn after one untimed warm-up, in
// GOP/s for `ops` operations a call (MeasureAttentionImpls and
// MeasureProductImpls time their candidates so).
double BestRateGops(double ops, const std::function<void()>& fn, int runs = 3);

// The most scores WindowScores keeps between its passes (by default
// kDefaultWindowScoresKeptFloats: 4 Mi floats, 16 MiB, 14,000 keys at
// SmolLM2's 9 heads and window 32; the predicted peak counts up to it). For
// tests, which set 0 to run the second pass's recomputation; < 0 restores
// the default. Process-wide.
inline constexpr int64_t kDefaultWindowScoresKeptFloats = int64_t{1} << 22;
int64_t WindowScoresKeptFloats();
void SetWindowScoresKeptFloatsForTesting(int64_t floats);

// Each query's log softmax denominator over the keys it sees (Attention's
// visibility), lse: [num_heads][num_q]; and the recall tier's scores of
// stored keys against those queries (every key visible to every query);
// max_weight: each key's largest weight over the queries and the group's
// heads instead (context reconstruction's score, DESIGN.md §9).
// Twins: ref::QueryLogSumExp and ref::RecallScores (see there). Threads:
// the kernels' team over KV heads, and over (KV head × 1,024-key chunks).
void QueryLogSumExp(const float* q, int64_t q_stride, const float* k, int64_t kv_head_stride,
                    int64_t kv_key_stride, int64_t num_q, int64_t num_keys, int64_t num_heads,
                    int64_t num_kv_heads, int64_t head_dim, float scale, float* lse);
void RecallScores(const float* q, int64_t q_stride, int64_t num_q, const float* lse, const float* k,
                  int64_t kv_head_stride, int64_t kv_key_stride, int64_t num_keys, float* scores,
                  int64_t scores_stride, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                  float scale, bool max_weight = false);

// RecallScores' max_weight (context reconstruction's score) on the bf16
// operands the chunk's attention takes where it takes them (AMX-BF16 tiles
// or AVX512-BF16 rows: AttentionHasAmx, AttentionHasAvx512Bf16; num_q > 1,
// head_dim 64, 128 or 256): q·scale and k rounded to bf16, f32 sums, so the
// scores are those whose denominators Attention keeps (its lse). Twin:
// ref::RecallMaxWeightsBf16. Returns false, writing nothing, where the
// attention takes f32 (then RecallScores computes them in f32).
bool RecallMaxWeightsBf16(const float* q, int64_t q_stride, int64_t num_q, const float* lse, const float* k,
                          int64_t kv_head_stride, int64_t kv_key_stride, int64_t num_keys, float* scores,
                          int64_t scores_stride, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                          float scale);

// True if Attention of a chunk (num_q > 1, head_dim 64, 128 or 256) runs on AMX-BF16
// tiles: the CPU and OS allow it (cpu::MatMulHasAmxBf16) and the impl is kAuto.
bool AttentionHasAmx();

// True if Attention of a chunk (num_q > 1, head_dim 64, 128 or 256) runs on the
// AVX512-BF16 kernel: the CPU has AVX512-BF16 and either the impl is
// kAvx512Bf16, or it is kAuto and AMX-BF16 is not there.
bool AttentionHasAvx512Bf16();

// Bytes Attention keeps between calls (the caller's thread scratch) after a
// chunk of num_q > 1 queries over num_keys keys: the bf16 kernels' K and V
// tiles, 4 · head_dim bytes per key (rounded up to 32) and KV head, where
// those kernels take the chunk (a window takes the same); 0 where the f32
// kernel does. The
// tiles grow to the largest chunk's and no further, so this of the largest
// is what they hold (memory predictions).
uint64_t AttentionScratchBytes(int64_t num_q, int64_t num_keys, int64_t num_kv_heads, int64_t head_dim,
                               int64_t window = 0);

// SnapKV observation-window votes. q holds the last `num_q` (= window)
// queries of the sequence ([num_q, num_heads, head_dim], token stride
// q_stride); k as in Attention. For each KV head h and key j < num_keys:
//   votes[h * votes_stride + j] =
//       (1/group) Σ_{query heads g of h} Σ_i softmax_i(scale · q_i·k)[j]
// where softmax_i runs over exactly the keys query i sees (j <= num_keys -
// num_q + i, as in Attention) and invisible keys contribute 0. So each KV
// head's votes sum to num_q (up to rounding). group = num_heads /
// num_kv_heads; query head g belongs to KV head g / group. Two passes over
// the keys (row max and sum, then normalized accumulation), f32 throughout.
// The first pass keeps the scores for the second (per calling thread, up
// to WindowScoresKeptFloats() floats: num_heads · num_q per key); past
// that the second pass computes them again, which gives the same bits.
void WindowScores(const float* q, int64_t q_stride, const float* k, int64_t kv_head_stride,
                  int64_t kv_key_stride, float* votes, int64_t votes_stride, int64_t num_q,
                  int64_t num_keys, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                  float scale);

// Stride-1 pooling of in[0..n) into out[0..n) with kernel/2 padding on both
// sides (kernel odd). AvgPool1d counts the pads as zeros and always divides
// by kernel (PyTorch avg_pool1d, count_include_pad=True); MaxPool1d ignores
// the pads. in and out must not alias. f32 sums of `kernel` terms.
void AvgPool1d(const float* in, float* out, int64_t n, int64_t kernel);
void MaxPool1d(const float* in, float* out, int64_t n, int64_t kernel);

// Writes the positions of the k highest scores of scores[0..n), sorted
// ascending, to out_sorted_positions[0..min(k, n)). Ranking: higher score
// first, equal scores broken by lower position (same rule on every backend).
void TopKIndices(const float* scores, int64_t n, int64_t k, int32_t* out_sorted_positions);

// The k entries of scores[0..n) taken as spans around the highest: walking
// the entries in TopKIndices' ranking, each one not yet taken is taken,
// then every entry within span/2 of it that is not, nearest first (the
// lower side first at equal distance), until k are taken; their positions
// ascending to out_sorted_positions[0..min(k, n)). span <= 1 is
// TopKIndices. Scores must not be NaN. No sort: the largest untaken score
// is found again for each peak over per-tile maxima, the CUDA kernel's
// walk (kernels/cuda/ops.h SelectHeads). Scalar, one copy for every level:
// it is a few passes over a few thousand keys.
void TopSpanIndices(const float* scores, int64_t n, int64_t k, int64_t span, int32_t* out_sorted_positions);

// SmartKV's gate on n keys (Backend::GateScores, one head; gate.cc):
// y[i] = w2 · relu(w1 ((k_i - mean) ⊙ inv_std) + b1) + b2 with the
// parameters packed at `params` (mean, inv_std, w1 [hidden][head_dim], b1,
// w2, b2) and k_i = keys[i * key_stride, + head_dim). Eigen's products, in
// the order src/compress/gate.cc predicts with, so that a pruner's scores
// are the gate's as it was fitted and evaluated. Twin: ref::GateForward.
void GateScores(const float* params, int64_t head_dim, int64_t hidden, const float* keys, int64_t key_stride, int64_t n,
                float* y);

// In place softmax over x[0..n): exp(x - max) / Σ, f32 with f32 sum.
void Softmax(float* x, int64_t n);

// Index of the first maximum of x[0..n) (n >= 1), e.g. greedy sampling.
int64_t Argmax(const float* x, int64_t n);

}  // namespace snapfill::cpu

#endif  // SNAPFILL_KERNELS_CPU_OPS_H_
