#include "kernels/cuda/ops.h"

#include "src/base/half.h"
#include "src/base/int8_rows.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_radix_sort.cuh>

namespace snapfill::cuda {
namespace {

constexpr unsigned kFullMask = 0xffffffffu;

__device__ __forceinline__ float WarpSum(float x) {
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(kFullMask, x, o);
  return x;
}
__device__ __forceinline__ double WarpSum(double x) {
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(kFullMask, x, o);
  return x;
}
__device__ __forceinline__ float WarpMax(float x) {
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(kFullMask, x, o));
  return x;
}

__device__ __forceinline__ uint16_t Bf16Bits(float x) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(x));
}

int Blocks(int64_t n, int threads) { return static_cast<int>((n + threads - 1) / threads); }

// One block per row: the squares summed in double (as the CPU kernel and
// ggml do), the scale in f32, y = (x · scale) · weight in f32.
// (x and y not __restrict__: the forward pass normalizes in place.)
template <typename Out>
__global__ void RmsNormKernel(const float* x, int64_t x_stride, const float* __restrict__ weight, Out* y,
                              int64_t y_stride, int64_t dim, float eps) {
  const float* xr = x + blockIdx.x * x_stride;
  double sum = 0.0;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) sum += static_cast<double>(xr[i]) * xr[i];
  __shared__ double partial[32];
  sum = WarpSum(sum);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = sum;
  __syncthreads();
  if (threadIdx.x < 32) {
    double s = threadIdx.x < blockDim.x / 32 ? partial[threadIdx.x] : 0.0;
    s = WarpSum(s);
    if (threadIdx.x == 0) partial[0] = s;
  }
  __syncthreads();
  const float scale = 1.0f / sqrtf(static_cast<float>(partial[0] / static_cast<double>(dim)) + eps);
  Out* yr = y + blockIdx.x * y_stride;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    const float v = xr[i] * scale * weight[i];
    if constexpr (sizeof(Out) == 2) {
      yr[i] = Bf16Bits(v);
    } else {
      yr[i] = v;
    }
  }
}

__global__ void ToBf16Kernel(const float* __restrict__ x, int64_t rows, int64_t cols, int64_t x_stride,
                             uint16_t* __restrict__ y) {
  const int64_t n = rows * cols;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < n; e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = e / cols, c = e % cols;
    y[e] = Bf16Bits(x[r * x_stride + c]);
  }
}

// One thread per (token, head, pair): the pair's angle by ggml's f32
// recurrence (theta_0 = pos, theta_{i+1} = theta_i · theta_scale), the
// rotation in double as the twin does.
__global__ void RopeKernel(float* x, int64_t num_tokens, int64_t num_heads, int64_t token_stride, int64_t head_stride,
                           const int32_t* __restrict__ pos, int64_t pos_stride, int64_t half, float theta_scale,
                           float freq_scale, bool neox, const float* __restrict__ factors) {
  const int64_t n = num_tokens * num_heads * half;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < n; e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = e % half;
    const int64_t h = (e / half) % num_heads;
    const int64_t t = e / (half * num_heads);
    float theta = static_cast<float>(pos[h * pos_stride + t]);
    for (int64_t s = 0; s < i; ++s) theta *= theta_scale;
    if (factors != nullptr) theta = theta / factors[i];
    double sn, cs;
    sincos(static_cast<double>(freq_scale * theta), &sn, &cs);
    float* xh = x + t * token_stride + h * head_stride;
    const int64_t a = neox ? i : 2 * i;
    const int64_t b = neox ? i + half : 2 * i + 1;
    const double x0 = xh[a], x1 = xh[b];
    xh[a] = static_cast<float>(x0 * cs - x1 * sn);
    xh[b] = static_cast<float>(x0 * sn + x1 * cs);
  }
}

// (gate and out not __restrict__, here and in GeluGluKernel: the forward
// pass writes the product over the gate.)
template <typename Out>
__global__ void SwiGluKernel(const float* gate, const float* __restrict__ up, int64_t rows, int64_t cols,
                             int64_t stride, Out* out) {
  const int64_t n = rows * cols;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < n; e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = e / cols, c = e % cols;
    const float g = gate[r * stride + c];
    const float v = g / (1.0f + expf(-g)) * up[r * stride + c];
    if constexpr (sizeof(Out) == 2) {
      out[e] = Bf16Bits(v);
    } else {
      out[e] = v;
    }
  }
}

__global__ void GeluGluKernel(const float* gate, const float* __restrict__ up, int64_t n, float* out) {
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < n; e += int64_t{gridDim.x} * blockDim.x) {
    const float g = gate[e];
    // g / 2 · (1 + tanh(u)) = g · sigmoid(2u), u = √(2/π) · (g + 0.044715 g³)
    // (the form cpu::GeluGlu vectorizes; no tanh of a large u to overflow).
    const float u = 0.7978845608028654f * (g + 0.044715f * g * g * g);
    out[e] = g / (1.0f + expf(-2.0f * u)) * up[e];
  }
}

// The attention family's tiles: kTile keys of one KV head in shared memory
// (rows padded to head_dim + 1 floats, so that 32 lanes reading 32 keys hit
// 32 banks), shared by the kWarps queries of a block, one warp per (query,
// head). Each lane scores one key of the tile; the warp keeps the online
// softmax (max m, sum l) and, with V, lane-strided output dims.
constexpr int kTile = 32;
constexpr int kWarps = 8;

size_t AttentionSharedBytes(int64_t head_dim, bool with_v) {
  return sizeof(float) * (static_cast<size_t>(with_v ? 2 : 1) * kTile * (head_dim + 1) + kWarps * head_dim);
}

template <int kDimsPerLane, bool kWithV>
__global__ void __launch_bounds__(kWarps * 32)
    AttentionKernel(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                    AttentionShape s, float* __restrict__ out, int64_t out_stride, float* __restrict__ lse) {
  extern __shared__ float smem[];
  const int hd = static_cast<int>(s.head_dim);
  const int pad = hd + 1;
  float* ks = smem;
  float* vs = ks + kTile * pad;
  float* qs = vs + (kWithV ? kTile * pad : 0);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t h = blockIdx.y;
  const int64_t kvh = h / (s.num_heads / s.num_kv_heads);
  const int64_t i0 = static_cast<int64_t>(blockIdx.x) * kWarps;
  const int64_t i = i0 + warp;
  const bool active = i < s.num_q;
  const int64_t offset = s.num_keys - s.num_q;
  const int64_t block_keys = offset + min(i0 + kWarps, s.num_q);
  const int64_t my_keys = active ? offset + i + 1 : 0;
  // A sliding window: each query's first visible key, and the block's
  // tiles from its first query's.
  const int64_t my_first = s.window > 0 && my_keys > s.window ? my_keys - s.window : 0;
  const int64_t block_first = s.window > 0 && offset + i0 + 1 > s.window ? offset + i0 + 1 - s.window : 0;
  if (active) {
    for (int d = lane; d < hd; d += 32) qs[warp * hd + d] = q[i * s.q_stride + h * hd + d];
  }
  const float* kh = k + kvh * s.head_stride;
  const float* vh = v + kvh * s.head_stride;
  float m = -INFINITY, l = 0.0f;
  float acc[kDimsPerLane];
#pragma unroll
  for (int r = 0; r < kDimsPerLane; ++r) acc[r] = 0.0f;
  for (int64_t t = block_first; t < block_keys; t += kTile) {
    __syncthreads();  // the last tile is consumed (and the queries written)
    const int n = static_cast<int>(block_keys - t < kTile ? block_keys - t : kTile);
    for (int e = threadIdx.x; e < n * hd; e += blockDim.x) {
      const int r = e / hd, d = e % hd;
      ks[r * pad + d] = kh[(t + r) * s.key_stride + d];
      if constexpr (kWithV) vs[r * pad + d] = vh[(t + r) * s.key_stride + d];
    }
    __syncthreads();
    if (!active || t >= my_keys || t + n <= my_first) continue;
    float score = -INFINITY;
    if (lane < n && t + lane < my_keys && t + lane >= my_first) {
      float dot = 0.0f;
      const float* kr = ks + lane * pad;
      const float* qr = qs + warp * hd;
      for (int d = 0; d < hd; ++d) dot = fmaf(qr[d], kr[d], dot);
      score = dot * s.scale;
    }
    // The tile holds a visible key (t < my_keys, t + n > my_first), so its
    // maximum is finite.
    const float m_new = fmaxf(m, WarpMax(score));
    const float corr = expf(m - m_new);
    const float p = score == -INFINITY ? 0.0f : expf(score - m_new);
    l = l * corr + WarpSum(p);
    m = m_new;
    if constexpr (kWithV) {
#pragma unroll
      for (int r = 0; r < kDimsPerLane; ++r) acc[r] *= corr;
      for (int j = 0; j < n; ++j) {
        const float pj = __shfl_sync(kFullMask, p, j);
        const float* vr = vs + j * pad;
#pragma unroll
        for (int r = 0; r < kDimsPerLane; ++r) {
          const int d = lane + 32 * r;
          if (d < hd) acc[r] = fmaf(pj, vr[d], acc[r]);
        }
      }
    }
  }
  if (!active) return;
  if constexpr (kWithV) {
#pragma unroll
    for (int r = 0; r < kDimsPerLane; ++r) {
      const int d = lane + 32 * r;
      if (d < hd) out[i * out_stride + h * hd + d] = acc[r] / l;
    }
  } else {
    if (lane == 0) lse[h * s.num_q + i] = m + logf(l);
  }
}

template <bool kWithV>
cudaError_t LaunchAttention(const float* q, const float* k, const float* v, const AttentionShape& s, float* out,
                            int64_t out_stride, float* lse, cudaStream_t stream) {
  // (The heads are the grid's y: none would be an empty grid, and it holds
  // at most 65,535.)
  if (s.head_dim <= 0 || s.head_dim > kMaxHeadDim || s.num_kv_heads <= 0 || s.num_heads <= 0 || s.num_heads > 65535 ||
      s.num_heads % s.num_kv_heads != 0 || s.num_q > s.num_keys) {
    return cudaErrorInvalidValue;
  }
  if (s.num_q == 0) return cudaSuccess;
  const dim3 grid(Blocks(s.num_q, kWarps), static_cast<unsigned>(s.num_heads));
  const size_t shared = AttentionSharedBytes(s.head_dim, kWithV);
  auto launch = [&](auto kernel) {
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared));
    if (e != cudaSuccess) return e;
    kernel<<<grid, kWarps * 32, shared, stream>>>(q, k, v, s, out, out_stride, lse);
    return cudaGetLastError();
  };
  switch ((s.head_dim + 31) / 32) {
    case 1: return launch(AttentionKernel<1, kWithV>);
    case 2: return launch(AttentionKernel<2, kWithV>);
    case 3: return launch(AttentionKernel<3, kWithV>);
    case 4: return launch(AttentionKernel<4, kWithV>);
    case 5: return launch(AttentionKernel<5, kWithV>);
    case 6: return launch(AttentionKernel<6, kWithV>);
    case 7: return launch(AttentionKernel<7, kWithV>);
    default: return launch(AttentionKernel<8, kWithV>);
  }
}

// One warp per (KV head, key): each query row of the group's heads scores
// the key (lanes split head_dim), and the weights exp(score - lse) are
// summed in f32, then averaged over the group.
__global__ void KeyWeightsKernel(const float* __restrict__ q, const float* __restrict__ lse,
                                 const float* __restrict__ k, AttentionShape s, bool causal,
                                 float* __restrict__ scores, int64_t scores_stride, bool max_weight) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + warp;
  if (j >= s.num_keys) return;
  const int64_t kvh = blockIdx.y;
  const int64_t group = s.num_heads / s.num_kv_heads;
  const int64_t hd = s.head_dim;
  const float* kr = k + kvh * s.head_stride + j * s.key_stride;
  float kl[kMaxHeadDim / 32];
#pragma unroll
  for (int r = 0; r < kMaxHeadDim / 32; ++r) {
    const int64_t d = lane + 32 * r;
    kl[r] = d < hd ? kr[d] : 0.0f;
  }
  // Query i sees key j from i = j - offset on.
  const int64_t first = causal && j > s.num_keys - s.num_q ? j - (s.num_keys - s.num_q) : 0;
  float total = 0.0f;
  for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
    for (int64_t i = first; i < s.num_q; ++i) {
      const float* qr = q + i * s.q_stride + h * hd;
      float dot = 0.0f;
#pragma unroll
      for (int r = 0; r < kMaxHeadDim / 32; ++r) {
        const int64_t d = lane + 32 * r;
        if (d < hd) dot = fmaf(qr[d], kl[r], dot);
      }
      dot = WarpSum(dot);
      const float w = expf(dot * s.scale - lse[h * s.num_q + i]);
      total = max_weight ? fmaxf(total, w) : total + w;
    }
  }
  if (lane == 0) scores[kvh * scores_stride + j] = max_weight ? total : total / static_cast<float>(group);
}

// GroupQueries: one thread per element of out [num_kv_heads][group · num_q][head_dim].
__global__ void GroupQueriesKernel(const float* __restrict__ q, int64_t q_stride, int64_t num_q, int64_t num_heads,
                                   int64_t group, int64_t hd, float* __restrict__ out) {
  const int64_t n = num_heads * num_q * hd;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < n; e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t d = e % hd, row = e / hd;  // row = kvh · group · num_q + g · num_q + i
    const int64_t i = row % num_q, h = row / num_q;  // h = kvh · group + g: the query head
    out[e] = q[i * q_stride + h * hd + d];
  }
}

// VotesFromScores, first: each window row's log-sum-exp over the keys it
// sees (the causal rule), one warp per row. Rows are (kv head, g, i).
__global__ void RowLseKernel(const float* __restrict__ scores, int64_t rows, int64_t num_q, int64_t num_keys,
                             float scale, float* __restrict__ lse) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + warp;
  if (row >= rows) return;
  const int64_t i = row % num_q;
  const int64_t seen = num_keys - num_q + i + 1;  // keys 0..seen-1
  const float* sr = scores + row * num_keys;
  float m = -INFINITY;
  for (int64_t j = lane; j < seen; j += 32) m = fmaxf(m, sr[j] * scale);
  m = WarpMax(m);
  float l = 0.0f;
  for (int64_t j = lane; j < seen; j += 32) l += expf(sr[j] * scale - m);
  l = WarpSum(l);
  if (lane == 0) lse[row] = m + logf(l);
}

// Then each key's votes: one thread per (kv head, key), its column of the
// group's rows summed in row order.
__global__ void ColumnVotesKernel(const float* __restrict__ scores, const float* __restrict__ lse, int64_t group,
                                  int64_t num_q, int64_t num_keys, float scale, float* __restrict__ votes,
                                  int64_t votes_stride) {
  const int64_t j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (j >= num_keys) return;
  const int64_t kvh = blockIdx.y;
  const int64_t rows = group * num_q;
  // Query i sees key j from i = j - offset on.
  const int64_t offset = num_keys - num_q;
  const int64_t first = j > offset ? j - offset : 0;
  const float* sk = scores + kvh * rows * num_keys;
  const float* lk = lse + kvh * rows;
  float total = 0.0f;
  for (int64_t g = 0; g < group; ++g) {
    for (int64_t i = first; i < num_q; ++i) {
      const int64_t r = g * num_q + i;
      total += expf(sk[r * num_keys + j] * scale - lk[r]);
    }
  }
  votes[kvh * votes_stride + j] = total / static_cast<float>(group);
}

__global__ void DequantizeQ8_0Kernel(const uint8_t* __restrict__ raw, int64_t rows, int64_t cols, int64_t row_bytes,
                                     uint16_t* __restrict__ bf16_out, float* __restrict__ f32_out) {
  const int64_t n = rows * cols;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < n; e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = e / cols, c = e % cols;
    const uint8_t* block = raw + r * row_bytes + (c / 32) * 34;
    const float d = __half2float(__ushort_as_half(static_cast<unsigned short>(block[0] | (block[1] << 8))));
    const float v = static_cast<float>(static_cast<int8_t>(block[2 + c % 32])) * d;
    if (bf16_out != nullptr) {
      bf16_out[e] = Bf16Bits(v);
    } else {
      f32_out[e] = v;
    }
  }
}

// kernels/cpu's arithmetic (an f32 sum in index order times 1/kernel, no
// contraction), so that a selection over it keeps the CPU's entries.
__global__ void PoolKernel(const float* __restrict__ in, float* __restrict__ out, int64_t n, int64_t kernel,
                           bool max_pool) {
  const int64_t pad = kernel / 2;
  const float inv = __fdiv_rn(1.0f, static_cast<float>(kernel));
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t lo = i - pad < 0 ? 0 : i - pad;
    const int64_t hi = i + pad >= n ? n - 1 : i + pad;
    if (max_pool) {
      // std::max's rule, as cpu::MaxPool1d: a NaN first in the window
      // stays, and of equal values the first (-0 before +0).
      float m = in[lo];
      for (int64_t t = lo + 1; t <= hi; ++t) m = m < in[t] ? in[t] : m;
      out[i] = m;
    } else {
      float sum = 0.0f;
      for (int64_t t = lo; t <= hi; ++t) sum = __fadd_rn(sum, in[t]);
      out[i] = __fmul_rn(sum, inv);
    }
  }
}

__global__ void IotaKernel(int32_t* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    x[i] = static_cast<int32_t>(i);
  }
}

__global__ void AddKernel(float* __restrict__ y, const float* __restrict__ x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    y[i] += x[i];
  }
}

__global__ void AddRowsKernel(float* __restrict__ x, int64_t stride, const float* __restrict__ bias, int64_t rows,
                              int64_t dim) {
  const int64_t n = rows * dim;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / dim, c = i - r * dim;
    x[r * stride + c] += bias[c];
  }
}

__global__ void ScaleKernel(float* __restrict__ x, int64_t n, float s) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    x[i] *= s;
  }
}

__global__ void FillKernel(float* __restrict__ x, int64_t n, float value) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    x[i] = value;
  }
}

// One thread per (head, key), heads on the grid's y: each hidden unit
// reads the key again and normalizes it on the way (head_dim registers
// would not fit at 256), and a warp's threads read every parameter at the
// same address at once (one broadcast).
__global__ void GateScoresKernel(const float* __restrict__ params, int64_t params_stride,
                                 const float* __restrict__ keys, int64_t keys_head_stride, int64_t key_stride,
                                 int64_t n, int head_dim, int hidden, float* __restrict__ y, int64_t y_stride) {
  const int64_t h = blockIdx.y;
  const float* mean = params + h * params_stride;
  const float* inv_std = mean + head_dim;
  const float* w1 = inv_std + head_dim;
  const float* b1 = w1 + int64_t{hidden} * head_dim;
  const float* w2 = b1 + hidden;
  const float b2 = w2[hidden];
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const float* k = keys + h * keys_head_stride + i * key_stride;
    float out = b2;
    for (int j = 0; j < hidden; ++j) {
      const float* w = w1 + int64_t{j} * head_dim;
      float z = b1[j];
      for (int t = 0; t < head_dim; ++t) z = fmaf(w[t], (k[t] - mean[t]) * inv_std[t], z);
      out = fmaf(w2[j], fmaxf(z, 0.0f), out);
    }
    y[h * y_stride + i] = out;
  }
}

__global__ void ToFp16Kernel(const float* __restrict__ x, uint16_t* __restrict__ y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    y[i] = Fp32ToFp16(x[i]);
  }
}

// A warp a row: its maximum by shuffles (exact in any order), then the
// twin's scale, inverse and rounding per element (int8_rows.h), so the bits
// are the twin's. The loop's row is the same for a warp's 32 lanes.
__global__ void ToInt8RowsKernel(const float* __restrict__ x, uint8_t* __restrict__ y, int64_t rows, int64_t dim) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = int64_t{gridDim.x} * (blockDim.x / 32);
  for (int64_t r = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) / 32; r < rows; r += warps) {
    const float* xr = x + r * dim;
    float amax = 0.0f;
    bool not_finite = false;
    for (int64_t i = lane; i < dim; i += 32) {
      const float a = fabsf(xr[i]);
      amax = fmaxf(amax, a);
      not_finite |= Int8NotFinite(a);
    }
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(kFullMask, amax, o));
    uint8_t* out = y + r * Int8RowBytes(dim);
    int8_t* q = reinterpret_cast<int8_t*>(out + sizeof(float));
    if (__any_sync(kFullMask, not_finite)) {
      // A NaN or an infinity: the twin's record for it, scale NaN, every q 0.
      if (lane == 0) EncodeInt8NotFiniteScale(out);
      for (int64_t i = lane; i < dim; i += 32) q[i] = 0;
      continue;
    }
    const float scale = Int8RowScale(amax);
    const float inverse = Int8RowInverse(scale);
    if (lane == 0) std::memcpy(out, &scale, sizeof(float));  // (4 + dim bytes apart: maybe unaligned)
    for (int64_t i = lane; i < dim; i += 32) q[i] = Int8Quantize(xr[i], inverse);
  }
}

// Block row y copies copy y of the batch, the row's threads over its
// rows × words (gather_copy.h).
__global__ void GatherBatchKernel(const GatherBatch batch) {
  GatherCopyThread(batch.copies[blockIdx.y], uint64_t{blockIdx.x} * blockDim.x + threadIdx.x,
                   uint64_t{gridDim.x} * blockDim.x);
}

// The selection's order: larger floats give larger keys; -0 ranks with +0,
// as the CPU's comparisons have it.
__device__ __forceinline__ uint32_t OrderedKey(float v) {
  const uint32_t u = v == 0.0f ? 0u : __float_as_uint(v);
  return (u & 0x80000000u) != 0 ? ~u : (u | 0x80000000u);
}

constexpr int kSelectThreads = 256;

// A block's sum of one value per thread (every thread gets it).
__device__ __forceinline__ unsigned BlockCount(unsigned local, unsigned* shared) {
  if (threadIdx.x == 0) *shared = 0;
  __syncthreads();
  for (int o = 16; o > 0; o >>= 1) local += __shfl_xor_sync(kFullMask, local, o);
  if (threadIdx.x % 32 == 0) atomicAdd(shared, local);
  __syncthreads();
  const unsigned total = *shared;
  __syncthreads();  // (read by all before the next call resets it)
  return total;
}

// The most tiles TakeSpans keeps a maximum of (8 KiB of shared memory).
constexpr int64_t kSpanTiles = 2048;
// Up to this many candidates a head's keys are in shared memory (32 KiB;
// with the tiles and the scan, within the 48 KiB a block has without
// opting in): the spans' walk is a chain of dependent reads, and the
// radix select reads them 33 times. Past it, the scratch in device memory.
constexpr int64_t kSharedSelectKeys = 8192;

// cpu::TopSpanIndices' walk over one head's n keys (OrderedKey, none 0),
// by the calling block: the taken ones become 0. Walking the ranking and
// skipping what is taken is taking, again and again, the largest key not
// taken (the lowest index among equals), so no sort is needed: the keys
// are cut into at most kSpanTiles tiles of a multiple of 32, each tile's
// largest key kept in shared memory (tile_max), and one warp repeats
// (the others wait at the caller's barrier):
//   the best tile (the largest maximum, the lowest tile among equals), its
//   lowest entry with that key (the peak), then the peak and its untaken
//   neighbours within span/2 in the walk's order, up to what is left (a
//   ballot over the slots peak, -1, +1, -2, +2, ...), then the maxima of
//   the tiles those touched again.
// kernels/cpu's TopSpanIndices walks the same tiles one entry at a time.
__device__ void TakeSpans(uint32_t* keys, int64_t n, int64_t pick, int64_t span, uint32_t* tile_max) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  const int64_t words = (n + 31) / 32;
  const int64_t tile = 32 * ((words + kSpanTiles - 1) / kSpanTiles);
  const int64_t tiles = (n + tile - 1) / tile;
  // (By a whole warp; every lane gets it.)
  auto tile_best = [&](int64_t t) {
    uint32_t m = 0;
    const int64_t end = (t + 1) * tile < n ? (t + 1) * tile : n;
    for (int64_t i = t * tile + lane; i < end; i += 32) m = max(m, keys[i]);
    for (int o = 16; o > 0; o >>= 1) m = max(m, __shfl_xor_sync(kFullMask, m, o));
    return m;
  };
  for (int64_t t = warp; t < tiles; t += warps) {
    const uint32_t m = tile_best(t);
    if (lane == 0) tile_max[t] = m;
  }
  __syncthreads();
  if (warp != 0) return;
  const int64_t half = span / 2;
  for (int64_t left = pick; left > 0;) {
    unsigned long long best = 0;
    for (int64_t t = lane; t < tiles; t += 32) {
      const unsigned long long v =
          (static_cast<unsigned long long>(tile_max[t]) << 32) | (0xffffffffull - static_cast<unsigned long long>(t));
      best = v > best ? v : best;
    }
    for (int o = 16; o > 0; o >>= 1) {
      const unsigned long long other = __shfl_xor_sync(kFullMask, best, o);
      best = other > best ? other : best;
    }
    const uint32_t key = static_cast<uint32_t>(best >> 32);
    if (key == 0) break;  // nothing left to take (the same in every lane)
    const int64_t t = static_cast<int64_t>(0xffffffffull - (best & 0xffffffffull));
    int64_t peak = -1;
    for (int64_t base = t * tile; peak < 0; base += 32) {
      const int64_t i = base + lane;
      const unsigned hit = __ballot_sync(kFullMask, i < n && keys[i] == key);
      if (hit != 0) peak = base + __ffs(hit) - 1;
    }
    // Slot s: the peak (0), then peak - (s + 1)/2 (odd s), peak + s/2 (even s).
    int64_t taken = 0;
    for (int64_t base = 0; base <= 2 * half && taken < left; base += 32) {
      const int64_t s = base + lane;
      const int64_t j = s == 0 ? peak : (s % 2 == 1 ? peak - (s + 1) / 2 : peak + s / 2);
      const bool open = s <= 2 * half && j >= 0 && j < n && keys[j] != 0;
      const unsigned ballot = __ballot_sync(kFullMask, open);
      if (open && taken + __popc(ballot & ((1u << lane) - 1)) < left) keys[j] = 0;
      taken += __popc(ballot);
    }
    left -= taken < left ? taken : left;
    __syncwarp();
    const int64_t lo = peak - half > 0 ? peak - half : 0, hi = peak + half < n - 1 ? peak + half : n - 1;
    for (int64_t u = lo / tile; u <= hi / tile; ++u) {
      const uint32_t m = tile_best(u);
      if (lane == 0) tile_max[u] = m;
    }
    __syncwarp();
  }
}

using SelectScan = cub::BlockScan<int, kSelectThreads>;

// keys[i] = OrderedKey of rest[0, num_rest)'s pooled vote i, by the block,
// pooled as kernels/cpu pools: an f32 sum in index order times 1/kernel,
// or the largest (no contraction, no reordering: the same bits).
__device__ void PoolKeys(const float* rest, int64_t num_rest, int64_t kernel, bool max_pool, uint32_t* keys) {
  const int64_t pad = kernel / 2;
  const float inv = __fdiv_rn(1.0f, static_cast<float>(kernel));
  for (int64_t i = threadIdx.x; i < num_rest; i += blockDim.x) {
    const int64_t lo = i - pad < 0 ? 0 : i - pad;
    const int64_t hi = i + pad >= num_rest ? num_rest - 1 : i + pad;
    float acc = max_pool ? rest[lo] : 0.0f;
    for (int64_t t = max_pool ? lo + 1 : lo; t <= hi; ++t) {
      acc = max_pool ? fmaxf(acc, rest[t]) : __fadd_rn(acc, rest[t]);
    }
    keys[i] = OrderedKey(max_pool ? acc : __fmul_rn(acc, inv));
  }
}

// The pick largest keys that are not 0 (higher, then lower index) become
// 0, by the block: the pick-th largest found a bit at a time from the top
// (the largest t with at least `pick` keys >= t; the keys already 0 never
// count, as t >= 1), then every key above it and, of those equal to it,
// the lowest indices, as many as are left. At least `pick` keys are not 0.
__device__ void TakeHighest(uint32_t* keys, int64_t n, int64_t pick, unsigned* counter,
                            typename SelectScan::TempStorage& scan) {
  uint32_t kth = 0;
  for (int bit = 31; bit >= 0; --bit) {
    const uint32_t t = kth | (1u << bit);
    unsigned local = 0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) local += keys[i] >= t;
    if (BlockCount(local, counter) >= pick) kth = t;
  }
  unsigned local = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) local += keys[i] > kth;
  const int64_t ties = pick - static_cast<int64_t>(BlockCount(local, counter));
  int64_t ties_before = 0;
  for (int64_t base = 0; base < n; base += blockDim.x) {
    const int64_t i = base + threadIdx.x;
    const uint32_t key = i < n ? keys[i] : 0u;
    const int tie = i < n && key == kth;
    int tie_rank = 0, tie_total = 0;
    SelectScan(scan).ExclusiveSum(tie, tie_rank, tie_total);
    __syncthreads();
    if (i < n && (key > kth || (tie && ties_before + tie_rank < ties))) keys[i] = 0u;
    ties_before += tie_total;
  }
}

// The entries whose key is 0 (taken), in index order, to out[rest_begin,
// ...) as candidate indices (rest_begin + i), by the block (a scan).
__device__ void WriteTaken(const uint32_t* keys, int64_t n, int64_t rest_begin, int32_t* out,
                           typename SelectScan::TempStorage& scan) {
  int64_t written = 0;
  for (int64_t base = 0; base < n; base += blockDim.x) {
    const int64_t i = base + threadIdx.x;
    const int take = i < n && keys[i] == 0u;
    int rank = 0, total = 0;
    SelectScan(scan).ExclusiveSum(take, rank, total);
    __syncthreads();
    if (take) out[rest_begin + written + rank] = static_cast<int32_t>(rest_begin + i);
    written += total;
  }
}

// One block per KV head (SelectHeads in ops.h). keys: [heads][num_rest],
// unless the launch gives num_rest keys of shared memory. What a pick
// takes is marked by key 0 (which no vote has) and written in index order
// after it.
__global__ void __launch_bounds__(kSelectThreads)
    SelectHeadsKernel(const float* __restrict__ votes, int64_t votes_stride, int64_t num_candidates, int64_t rest_begin,
                      int64_t window_begin, int64_t pick, int64_t kernel, bool max_pool, int64_t span,
                      const float* __restrict__ then_votes, int64_t then_votes_stride, int64_t then_pick,
                      uint32_t* __restrict__ keys_all, int32_t* __restrict__ keep, int64_t keep_stride) {
  __shared__ typename SelectScan::TempStorage scan;
  __shared__ unsigned long long bad;
  __shared__ unsigned counter;
  __shared__ uint32_t tile_max[kSpanTiles];
  extern __shared__ uint32_t shared_keys[];
  const int64_t h = blockIdx.x;
  const int64_t num_rest = window_begin - rest_begin;
  const int64_t picked = pick + then_pick;
  const int64_t count = rest_begin + picked + (num_candidates - window_begin);
  const float* rest = votes + h * votes_stride + rest_begin;
  const float* then_rest = then_pick > 0 ? then_votes + h * then_votes_stride + rest_begin : nullptr;
  uint32_t* keys = num_rest <= kSharedSelectKeys ? shared_keys : keys_all + h * num_rest;
  int32_t* out = keep + h * keep_stride;
  if (threadIdx.x == 0) bad = ~0ull;
  __syncthreads();
  // Every vote of R checked (of both rows).
  for (int64_t i = threadIdx.x; i < num_rest; i += blockDim.x) {
    if (!isfinite(rest[i]) || (then_rest != nullptr && !isfinite(then_rest[i]))) {
      atomicMin(&bad, static_cast<unsigned long long>(i));
    }
  }
  __syncthreads();
  if (bad != ~0ull) {
    for (int64_t j = threadIdx.x; j < count; j += blockDim.x) out[j] = static_cast<int32_t>(j);
    if (threadIdx.x == 0) out[count] = static_cast<int32_t>(rest_begin + static_cast<int64_t>(bad));
    return;
  }
  if (pick > 0) {
    PoolKeys(rest, num_rest, kernel, max_pool, keys);
    __syncthreads();
    if (span > 1) {
      TakeSpans(keys, num_rest, pick, span, tile_max);
    } else {
      TakeHighest(keys, num_rest, pick, &counter, scan);
    }
    __syncthreads();
  }
  if (then_pick > 0) {
    // The first pick's entries (in out for now), then the second votes'
    // keys with those 0, so that the second takes among the others.
    if (pick > 0) WriteTaken(keys, num_rest, rest_begin, out, scan);
    __syncthreads();
    PoolKeys(then_rest, num_rest, kernel, max_pool, keys);
    __syncthreads();
    for (int64_t t = threadIdx.x; t < pick; t += blockDim.x) keys[out[rest_begin + t] - rest_begin] = 0u;
    __syncthreads();
    TakeHighest(keys, num_rest, then_pick, &counter, scan);
    __syncthreads();
  }
  if (picked > 0) WriteTaken(keys, num_rest, rest_begin, out, scan);
  for (int64_t j = threadIdx.x; j < rest_begin; j += blockDim.x) out[j] = static_cast<int32_t>(j);
  for (int64_t j = window_begin + threadIdx.x; j < num_candidates; j += blockDim.x) {
    out[rest_begin + picked + (j - window_begin)] = static_cast<int32_t>(j);
  }
  if (threadIdx.x == 0) out[count] = -1;
}

// Grid-stride launches: enough blocks to fill the GPU, no more.
int StrideBlocks(int64_t n) { return static_cast<int>(std::min<int64_t>(Blocks(n, 256), 65536)); }

size_t Align(size_t n) { return (n + 255) & ~size_t{255}; }

}  // namespace

cudaError_t RmsNorm(const float* x, int64_t x_stride, const float* weight, float* y, int64_t y_stride, int64_t rows,
                    int64_t dim, float eps, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  RmsNormKernel<float><<<static_cast<unsigned>(rows), 256, 0, stream>>>(x, x_stride, weight, y, y_stride, dim, eps);
  return cudaGetLastError();
}

cudaError_t RmsNormBf16(const float* x, int64_t x_stride, const float* weight, uint16_t* y, int64_t rows,
                        int64_t dim, float eps, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  RmsNormKernel<uint16_t><<<static_cast<unsigned>(rows), 256, 0, stream>>>(x, x_stride, weight, y, dim, dim, eps);
  return cudaGetLastError();
}

cudaError_t ToBf16(const float* x, int64_t rows, int64_t cols, int64_t x_stride, uint16_t* y, cudaStream_t stream) {
  if (rows * cols <= 0) return cudaSuccess;
  ToBf16Kernel<<<StrideBlocks(rows * cols), 256, 0, stream>>>(x, rows, cols, x_stride, y);
  return cudaGetLastError();
}

cudaError_t Rope(float* x, int64_t num_tokens, int64_t num_heads, int64_t head_dim, int64_t token_stride,
                 int64_t head_stride, const int32_t* pos, int64_t pos_stride, int64_t rot_dim, float freq_base,
                 float freq_scale, bool neox, const float* freq_factors, cudaStream_t stream) {
  if (rot_dim % 2 != 0 || rot_dim > head_dim) return cudaErrorInvalidValue;
  const int64_t half = rot_dim / 2;
  const int64_t n = num_tokens * num_heads * half;
  if (n <= 0) return cudaSuccess;
  // The twin's theta scale, computed the same way on the host.
  const float theta_scale = std::pow(freq_base, -2.0f / static_cast<float>(rot_dim));
  RopeKernel<<<StrideBlocks(n), 256, 0, stream>>>(x, num_tokens, num_heads, token_stride, head_stride, pos,
                                                   pos_stride, half, theta_scale, freq_scale, neox, freq_factors);
  return cudaGetLastError();
}

cudaError_t SwiGlu(const float* gate, const float* up, float* out, int64_t n, cudaStream_t stream) {
  return SwiGluRows(gate, up, 1, n, n, out, stream);
}

cudaError_t GeluGlu(const float* gate, const float* up, float* out, int64_t n, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  GeluGluKernel<<<StrideBlocks(n), 256, 0, stream>>>(gate, up, n, out);
  return cudaGetLastError();
}

cudaError_t SwiGluRows(const float* gate, const float* up, int64_t rows, int64_t cols, int64_t stride, float* out,
                       cudaStream_t stream) {
  if (rows * cols <= 0) return cudaSuccess;
  SwiGluKernel<float><<<StrideBlocks(rows * cols), 256, 0, stream>>>(gate, up, rows, cols, stride, out);
  return cudaGetLastError();
}

cudaError_t SwiGluRowsBf16(const float* gate, const float* up, int64_t rows, int64_t cols, int64_t stride,
                           uint16_t* out, cudaStream_t stream) {
  if (rows * cols <= 0) return cudaSuccess;
  SwiGluKernel<uint16_t><<<StrideBlocks(rows * cols), 256, 0, stream>>>(gate, up, rows, cols, stride, out);
  return cudaGetLastError();
}

cudaError_t Attention(const float* q, const float* k, const float* v, const AttentionShape& s, float* out,
                      int64_t out_stride, cudaStream_t stream) {
  return LaunchAttention<true>(q, k, v, s, out, out_stride, nullptr, stream);
}

cudaError_t QueryLogSumExp(const float* q, const float* k, const AttentionShape& s, float* lse, cudaStream_t stream) {
  // Every key the causal rule lets a query see, as the twins: only Attention
  // reads a window.
  AttentionShape all_keys = s;
  all_keys.window = 0;
  return LaunchAttention<false>(q, k, nullptr, all_keys, nullptr, 0, lse, stream);
}

cudaError_t KeyWeights(const float* q, const float* lse, const float* k, const AttentionShape& s, bool causal,
                       float* scores, int64_t scores_stride, cudaStream_t stream, bool max_weight) {
  if (s.head_dim <= 0 || s.head_dim > kMaxHeadDim || s.num_kv_heads <= 0 || s.num_kv_heads > 65535 ||
      s.num_heads < s.num_kv_heads || s.num_heads % s.num_kv_heads != 0) {
    return cudaErrorInvalidValue;
  }
  if (s.num_keys <= 0) return cudaSuccess;
  constexpr int kKeysPerBlock = 8;
  const dim3 grid(Blocks(s.num_keys, kKeysPerBlock), static_cast<unsigned>(s.num_kv_heads));
  KeyWeightsKernel<<<grid, kKeysPerBlock * 32, 0, stream>>>(q, lse, k, s, causal, scores, scores_stride,
                                                            max_weight);
  return cudaGetLastError();
}

cudaError_t GroupQueries(const float* q, int64_t q_stride, int64_t num_q, int64_t num_heads, int64_t num_kv_heads,
                         int64_t head_dim, float* out, cudaStream_t stream) {
  if (num_kv_heads <= 0 || num_heads <= 0 || num_heads % num_kv_heads != 0 || head_dim <= 0) {
    return cudaErrorInvalidValue;
  }
  if (num_q <= 0) return cudaSuccess;
  GroupQueriesKernel<<<StrideBlocks(num_heads * num_q * head_dim), 256, 0, stream>>>(
      q, q_stride, num_q, num_heads, num_heads / num_kv_heads, head_dim, out);
  return cudaGetLastError();
}

cudaError_t VotesFromScores(const float* scores, int64_t num_q, int64_t num_keys, int64_t num_heads,
                            int64_t num_kv_heads, float scale, float* lse, float* votes, int64_t votes_stride,
                            cudaStream_t stream) {
  if (num_kv_heads <= 0 || num_heads <= 0 || num_heads % num_kv_heads != 0 || num_q > num_keys ||
      votes_stride < num_keys) {
    return cudaErrorInvalidValue;
  }
  if (num_keys <= 0 || num_q <= 0) return cudaSuccess;
  const int64_t rows = num_heads * num_q;
  constexpr int kRowsPerBlock = 8;
  RowLseKernel<<<Blocks(rows, kRowsPerBlock), kRowsPerBlock * 32, 0, stream>>>(scores, rows, num_q, num_keys, scale,
                                                                               lse);
  const dim3 grid(Blocks(num_keys, 256), static_cast<unsigned>(num_kv_heads));
  ColumnVotesKernel<<<grid, 256, 0, stream>>>(scores, lse, num_heads / num_kv_heads, num_q, num_keys, scale, votes,
                                              votes_stride);
  return cudaGetLastError();
}

cudaError_t DequantizeQ8_0(const void* raw, int64_t rows, int64_t cols, int64_t row_bytes, uint16_t* bf16_out,
                           float* f32_out, cudaStream_t stream) {
  if (cols % 32 != 0 || row_bytes < cols / 32 * 34 || (bf16_out == nullptr && f32_out == nullptr)) {
    return cudaErrorInvalidValue;
  }
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  DequantizeQ8_0Kernel<<<StrideBlocks(rows * cols), 256, 0, stream>>>(static_cast<const uint8_t*>(raw), rows, cols,
                                                                      row_bytes, bf16_out, f32_out);
  return cudaGetLastError();
}

cudaError_t Pool1d(const float* in, float* out, int64_t n, int64_t kernel, bool max, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  if (kernel % 2 != 1) return cudaErrorInvalidValue;
  PoolKernel<<<StrideBlocks(n), 256, 0, stream>>>(in, out, n, kernel, max);
  return cudaGetLastError();
}

size_t TopKScratchBytes(int64_t n) {
  size_t cub_bytes = 0;
  cub::DeviceRadixSort::SortPairsDescending(nullptr, cub_bytes, static_cast<const float*>(nullptr),
                                            static_cast<float*>(nullptr), static_cast<const int32_t*>(nullptr),
                                            static_cast<int32_t*>(nullptr), static_cast<int>(n));
  return Align(n * sizeof(float)) + Align(n * sizeof(int32_t)) + Align(cub_bytes);
}

cudaError_t SortDescending(const float* scores, int64_t n, int32_t* order, void* scratch, size_t scratch_bytes,
                           cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  if (n > INT32_MAX || scratch_bytes < TopKScratchBytes(n)) return cudaErrorInvalidValue;
  char* p = static_cast<char*>(scratch);
  float* keys_out = reinterpret_cast<float*>(p);
  int32_t* positions = reinterpret_cast<int32_t*>(p + Align(n * sizeof(float)));
  void* temp = p + Align(n * sizeof(float)) + Align(n * sizeof(int32_t));
  size_t temp_bytes = scratch_bytes - Align(n * sizeof(float)) - Align(n * sizeof(int32_t));
  IotaKernel<<<StrideBlocks(n), 256, 0, stream>>>(positions, n);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  return cub::DeviceRadixSort::SortPairsDescending(temp, temp_bytes, scores, keys_out, positions, order,
                                                   static_cast<int>(n), 0, 32, stream);
}

size_t SelectHeadsScratchBytes(int64_t num_heads, int64_t num_rest) {
  return Align(static_cast<size_t>(std::max<int64_t>(num_heads * num_rest, 1)) * sizeof(uint32_t));
}

cudaError_t SelectHeads(const float* votes, int64_t votes_stride, int64_t num_heads, int64_t num_candidates,
                        int64_t rest_begin, int64_t window_begin, int64_t pick, int64_t pool_kernel, bool max_pool,
                        int64_t span, const float* then_votes, int64_t then_votes_stride, int64_t then_pick,
                        void* scratch, int32_t* keep, int64_t keep_stride, cudaStream_t stream) {
  if (num_heads <= 0) return cudaSuccess;
  // (The backend checks these too; a pick beyond the range would keep the
  // span walk looking for entries that are not there.)
  if (num_heads > INT32_MAX || pool_kernel % 2 != 1 || span < 1 || window_begin - rest_begin > INT32_MAX ||
      rest_begin < 0 || window_begin < rest_begin || num_candidates < window_begin || pick < 0 || then_pick < 0 ||
      pick + then_pick > window_begin - rest_begin || (window_begin > rest_begin && votes == nullptr) ||
      (then_pick > 0 && then_votes == nullptr)) {
    return cudaErrorInvalidValue;
  }
  const int64_t num_rest = window_begin - rest_begin;
  const size_t shared = num_rest <= kSharedSelectKeys ? static_cast<size_t>(num_rest) * sizeof(uint32_t) : 0;
  SelectHeadsKernel<<<static_cast<unsigned>(num_heads), kSelectThreads, shared, stream>>>(
      votes, votes_stride, num_candidates, rest_begin, window_begin, pick, pool_kernel, max_pool, span, then_votes,
      then_votes_stride, then_pick, static_cast<uint32_t*>(scratch), keep, keep_stride);
  return cudaGetLastError();
}

cudaError_t AddInPlace(float* y, const float* x, int64_t n, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  AddKernel<<<StrideBlocks(n), 256, 0, stream>>>(y, x, n);
  return cudaGetLastError();
}

cudaError_t AddRows(float* x, int64_t stride, const float* bias, int64_t rows, int64_t dim, cudaStream_t stream) {
  if (rows <= 0 || dim <= 0) return cudaSuccess;
  AddRowsKernel<<<StrideBlocks(rows * dim), 256, 0, stream>>>(x, stride, bias, rows, dim);
  return cudaGetLastError();
}

cudaError_t Scale(float* x, int64_t n, float s, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  ScaleKernel<<<StrideBlocks(n), 256, 0, stream>>>(x, n, s);
  return cudaGetLastError();
}

cudaError_t Fill(float* x, int64_t n, float value, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  FillKernel<<<StrideBlocks(n), 256, 0, stream>>>(x, n, value);
  return cudaGetLastError();
}

cudaError_t GateScores(const float* params, int64_t params_stride, int64_t num_heads, int64_t head_dim, int64_t hidden,
                       const float* keys, int64_t keys_head_stride, int64_t key_stride, int64_t n, float* y,
                       int64_t y_stride, cudaStream_t stream) {
  if (num_heads <= 0 || n <= 0) return cudaSuccess;
  if (num_heads > 65535 || head_dim > INT32_MAX || hidden > INT32_MAX) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>(Blocks(n, 128), 65536)), static_cast<unsigned>(num_heads));
  GateScoresKernel<<<grid, 128, 0, stream>>>(params, params_stride, keys, keys_head_stride, key_stride, n,
                                             static_cast<int>(head_dim), static_cast<int>(hidden), y, y_stride);
  return cudaGetLastError();
}

__global__ void ComplementKernel(const int32_t* __restrict__ keep, int64_t keep_stride, int64_t kept,
                                 int64_t num_candidates, int32_t* __restrict__ out, int64_t out_stride) {
  const int32_t* k = keep + blockIdx.y * keep_stride;
  int32_t* o = out + blockIdx.y * out_stride;
  const int64_t left = num_candidates - kept;
  for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < num_candidates;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t lo = 0, hi = kept;  // below: the kept indices less than j
    while (lo < hi) {
      const int64_t mid = (lo + hi) / 2;
      if (k[mid] < j) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    if (lo < kept && k[lo] == j) continue;
    // (In bounds whatever the rows hold.)
    const int64_t at = j - lo;
    if (at >= 0 && at < left) o[at] = static_cast<int32_t>(j);
  }
}

cudaError_t Complement(const int32_t* keep, int64_t keep_stride, int64_t kept, int64_t num_heads,
                       int64_t num_candidates, int32_t* out, int64_t out_stride, cudaStream_t stream) {
  if (num_heads <= 0 || num_candidates <= kept) return cudaSuccess;
  if (num_heads > 65535) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>(Blocks(num_candidates, 256), 1024)),
                  static_cast<unsigned>(num_heads));
  ComplementKernel<<<grid, 256, 0, stream>>>(keep, keep_stride, kept, num_candidates, out, out_stride);
  return cudaGetLastError();
}

cudaError_t GatherRows(const GatherCopy* copies, int num_copies, cudaStream_t stream) {
  GatherBatch batch;
  for (int next = 0; next < num_copies;) {
    next = PackGatherBatch(copies, next, num_copies, &batch);
    if (batch.num_copies == 0) continue;
    GatherBatchKernel<<<dim3(GatherBatchBlocks(batch), static_cast<unsigned>(batch.num_copies)), kGatherThreads, 0,
                        stream>>>(batch);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

cudaError_t ToFp16(const float* x, uint16_t* y, int64_t n, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  ToFp16Kernel<<<static_cast<int>(std::min<int64_t>(Blocks(n, 256), 4096)), 256, 0, stream>>>(x, y, n);
  return cudaGetLastError();
}

cudaError_t ToInt8Rows(const float* x, uint8_t* y, int64_t rows, int64_t dim, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  constexpr int kThreads = 256;  // 8 rows at a time
  ToInt8RowsKernel<<<static_cast<int>(std::min<int64_t>(Blocks(rows, kThreads / 32), 4096)), kThreads, 0, stream>>>(
      x, y, rows, dim);
  return cudaGetLastError();
}

cudaError_t F32ToBf16(const float* x, uint16_t* y, int64_t n, cudaStream_t stream) {
  return ToBf16(x, 1, n, n, y, stream);
}

}  // namespace snapfill::cuda
