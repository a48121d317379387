// Chunk attention on tensor cores: flash-attention's forward pass
// (FlashAttention-2's work split: a warp owns 16 query rows, the block's
// warps share each tile of keys and values) on the m16n8k16 bf16 MMA (sm_80
// and later). The arithmetic is the CPU's AMX attention's, whose twin is
// ref::AttentionBf16: q·scale, k and v rounded to bf16, the scores and the
// online softmax in f32, each weight rounded to bf16 before it weights v,
// the sum over the unrounded weights.
//
// Why a separate kernel: the f32 kernel (ops.cu) scores one key per lane
// with f32 FMAs and ran at about 1 TFLOP/s on an H200, so a 7B-shaped
// 1,024-token chunk over 2,048 keys spent about a second in attention
// alone; the products run on tensor cores, and so must this.
//
// Two launches. The first rounds each KV head's keys and values to bf16,
// once, into dense [kv_head][key][head_dim] rows in the caller's scratch:
// every query block of every head that shares a KV head reads each tile,
// and converting f32 in the block (a load, a conversion and a 2-byte
// store per value, per block) cost more instructions than the tile's MMAs.
// The second is the attention. Layout of one block: 4 warps × 16 rows = 64
// queries of one head. Shared memory holds the block's queries and, per
// stage, one tile of 64 keys and its 64 values, all as bf16 rows padded by
// 8 elements, so that the 8 rows an ldmatrix phase reads (a pitch of
// head_dim + 8 elements) fall in 32 distinct banks. Tiles come in by
// cp.async, 16 bytes a copy, without passing through registers; up to
// head_dim 128 two stages alternate, so the next tile loads while this one
// is multiplied (head_dim 256's two stages would not fit an A100's 163
// KiB: one). Fragments are read by ldmatrix, the values' transposed
// (.trans), so V stays in rows as it arrives. The scores S = Q·Kᵀ stay in
// the MMA's accumulators; their layout (row g = lane/4 and g + 8, columns
// 2·(lane%4) and +1 of each 8-column tile) is exactly the A operand's
// layout for P·V, so P goes from accumulators to operands in registers.
// The softmax's running maximum and sum are per row, shared by the 4 lanes
// of a row (two shuffles).
#include <cuda_bf16.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/ops.h"

namespace snapfill::cuda {
namespace {

constexpr unsigned kMask = 0xffffffffu;
constexpr int kRows = 16;                     // query rows per warp: the MMA's M
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kBlockRows = kRows * kWarps;    // queries per block
constexpr int kKeys = 64;                     // keys per tile
constexpr int kPad = 8;                       // bf16 elements of padding per shared row

template <int kHd>
constexpr int Stages() {
  return kHd <= 128 ? 2 : 1;
}

template <int kHd>
constexpr size_t SharedBytes() {
  return sizeof(__nv_bfloat16) * static_cast<size_t>(kBlockRows + 2 * Stages<kHd>() * kKeys) * (kHd + kPad);
}

__device__ __forceinline__ uint32_t PackBf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x (lo) in the low half
  return *reinterpret_cast<const uint32_t*>(&v);
}

__device__ __forceinline__ uint32_t SharedAddress(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// The sm_80 instructions below trap on older devices, which FlashAttention
// refuses (FlashAttentionSupports).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define SNAPFILL_SM80 1
#else
#define SNAPFILL_SM80 0
#endif

// 16 bytes from global to shared memory, asynchronously (L2 only: a tile
// is read once per block).
__device__ __forceinline__ void CopyAsync16(void* shared, const void* global) {
#if SNAPFILL_SM80
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(SharedAddress(shared)), "l"(global) : "memory");
#else
  __trap();
#endif
}
__device__ __forceinline__ void CommitAsync() {
#if SNAPFILL_SM80
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
// Until at most `kPending` of this thread's latest groups are in flight.
template <int kPending>
__device__ __forceinline__ void WaitAsync() {
#if SNAPFILL_SM80
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
#endif
}

// Four 8×8 bf16 matrices; lanes 8i..8i+7 give the rows of matrix i. Lane
// T receives (row T/4, columns 2·(T%4) and +1) of each, the lower column
// in the low half; kTransposed: the transposed, (rows 2·(T%4) and +1,
// column T/4), the lower row in the low half.
template <bool kTransposed>
__device__ __forceinline__ void LoadMatrices(uint32_t (&r)[4], const __nv_bfloat16* row) {
#if SNAPFILL_SM80
  if constexpr (kTransposed) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(SharedAddress(row)));
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(SharedAddress(row)));
  }
#else
  __trap();
#endif
}

// d += a·b, a 16×16 (row-major fragment), b 16×8 (column-major), f32 sums.
__device__ __forceinline__ void Mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if SNAPFILL_SM80
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
  __trap();
#endif
}

// k and v (f32 at the shape's strides) into dense bf16 rows, kb and vb
// [num_kv_heads][num_keys][head_dim], two values a thread a step.
__global__ void KvToBf16Kernel(const float* __restrict__ k, const float* __restrict__ v, AttentionShape s,
                               __nv_bfloat162* __restrict__ kb, __nv_bfloat162* __restrict__ vb) {
  const int64_t h = blockIdx.y;
  const int64_t pairs = s.num_keys * s.head_dim / 2;
  const float* kh = k + h * s.head_stride;
  const float* vh = v + h * s.head_stride;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < pairs;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t j = 2 * i / s.head_dim, d = 2 * i % s.head_dim;
    const int64_t at = j * s.key_stride + d;
    kb[h * pairs + i] = __floats2bfloat162_rn(kh[at], kh[at + 1]);
    vb[h * pairs + i] = __floats2bfloat162_rn(vh[at], vh[at + 1]);
  }
}

template <int kHd>
__global__ void __launch_bounds__(kThreads)
    FlashAttentionKernel(const float* __restrict__ q, const __nv_bfloat16* __restrict__ kb,
                         const __nv_bfloat16* __restrict__ vb, AttentionShape s, float* __restrict__ out,
                         int64_t out_stride) {
  static_assert(kHd % 16 == 0 && kHd <= kMaxHeadDim, "head_dim: a multiple of 16, at most 256");
  constexpr int kP = kHd + kPad;
  constexpr int kStages = Stages<kHd>();
  extern __shared__ __align__(16) unsigned char flash_smem[];
  __nv_bfloat16* qs = reinterpret_cast<__nv_bfloat16*>(flash_smem);  // [kBlockRows][kP]
  __nv_bfloat16* ks = qs + kBlockRows * kP;                          // [kStages][kKeys][kP]
  __nv_bfloat16* vs = ks + kStages * kKeys * kP;                     // [kStages][kKeys][kP]

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, tq = lane % 4;
  const int64_t h = blockIdx.y;
  const int64_t kvh = h / (s.num_heads / s.num_kv_heads);
  // The last query blocks see the most keys: launched first (the grid's
  // x runs first), so that the longest blocks do not make the tail.
  const int64_t q0 = static_cast<int64_t>(gridDim.x - 1 - blockIdx.x) * kBlockRows;
  const int64_t offset = s.num_keys - s.num_q;  // query i sees keys j <= offset + i
  const int64_t rows_here = min(static_cast<int64_t>(kBlockRows), s.num_q - q0);
  // The keys any of the block's queries sees: [block_first, block_end).
  const int64_t block_end = offset + q0 + rows_here;
  const int64_t block_first = s.window > 0 ? max(int64_t{0}, offset + q0 + 1 - s.window) : 0;
  const int64_t tiles = (block_end - block_first + kKeys - 1) / kKeys;

  const __nv_bfloat16* kh = kb + kvh * s.num_keys * kHd;
  const __nv_bfloat16* vh = vb + kvh * s.num_keys * kHd;
  // Tile `i`'s keys and values into `stage`, one commit group. Rows past
  // the tile's keys are zeros: their weights are 0, and 0 times an
  // uninitialized NaN would not be.
  auto load_tile = [&](int64_t i, int stage) {
    const int64_t t = block_first + i * kKeys;
    const int n = static_cast<int>(min(static_cast<int64_t>(kKeys), block_end - t));
    constexpr int kPieces = kHd / 8;  // 16-byte pieces of a row
    for (int c = threadIdx.x; c < kKeys * kPieces; c += kThreads) {
      const int r = c / kPieces, col = (c % kPieces) * 8;
      __nv_bfloat16* kd = ks + (stage * kKeys + r) * kP + col;
      __nv_bfloat16* vd = vs + (stage * kKeys + r) * kP + col;
      if (r < n) {
        CopyAsync16(kd, kh + (t + r) * kHd + col);
        CopyAsync16(vd, vh + (t + r) * kHd + col);
      } else {
        *reinterpret_cast<uint4*>(kd) = make_uint4(0, 0, 0, 0);
        *reinterpret_cast<uint4*>(vd) = make_uint4(0, 0, 0, 0);
      }
    }
    CommitAsync();
  };
  load_tile(0, 0);  // (every block sees at least one key: tiles >= 1)

  for (int e = threadIdx.x; e < kBlockRows * kHd; e += kThreads) {
    const int r = e / kHd, d = e % kHd;
    qs[r * kP + d] = __float2bfloat16_rn(r < rows_here ? q[(q0 + r) * s.q_stride + h * kHd + d] * s.scale : 0.0f);
  }

  // This warp's rows, and this lane's two of them (the accumulators' g and g + 8).
  const int64_t w0 = q0 + warp * kRows;
  const bool warp_active = w0 < s.num_q;
  const int64_t warp_last = min(w0 + kRows, s.num_q) - 1;
  const int64_t row_a = w0 + g, row_b = w0 + g + 8;
  constexpr float kLog2e = 1.4426950408889634f;  // scores in base 2: exp2f
  // The rows this lane gives ldmatrix: of Q's 16 × 16 A operand (matrices:
  // rows 0-7 and 8-15 at columns 0, then at 8), of two key tiles' B operands
  // (keys 0-7 at columns 0 and 8, then keys 8-15), of V's 16 keys for two
  // 8-column B operands (keys 0-7 and 8-15 at columns 0, then at 8).
  const __nv_bfloat16* q_row = qs + (warp * kRows + (lane & 15)) * kP + (lane >> 4) * 8;
  const int k_row = (lane >> 4) * 8 + (lane & 7), k_col = ((lane >> 3) & 1) * 8;
  const int v_row = lane & 15, v_col = (lane >> 4) * 8;

  float o[kHd / 8][4];
#pragma unroll
  for (int n = 0; n < kHd / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m_a = -INFINITY, m_b = -INFINITY;  // running maxima (base 2)
  float l_a = 0.0f, l_b = 0.0f;            // this lane's part of the running sums

  for (int64_t i = 0; i < tiles; ++i) {
    const int stage = kStages == 2 ? static_cast<int>(i & 1) : 0;
    if (kStages == 2 && i + 1 < tiles) {
      load_tile(i + 1, (stage + 1) & 1);  // into the stage the last step read
      WaitAsync<1>();
    } else {
      WaitAsync<0>();
    }
    __syncthreads();  // tile i is in (the first time: the queries are written)
    const int64_t t = block_first + i * kKeys;
    const int n = static_cast<int>(min(static_cast<int64_t>(kKeys), block_end - t));
    // Tiles none of the warp's rows sees (warp-uniform, so the shuffles
    // below always run on full warps).
    const bool skip = !warp_active || t > offset + warp_last || (s.window > 0 && t + n <= offset + w0 + 1 - s.window);
    if (!skip) {
      const __nv_bfloat16* kt = ks + stage * kKeys * kP;
      const __nv_bfloat16* vt = vs + stage * kKeys * kP;
      // S = Q·Kᵀ for the warp's 16 rows and the tile's 64 keys.
      float sc[kKeys / 8][4];
#pragma unroll
      for (int j = 0; j < kKeys / 8; ++j) sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < kHd / 16; ++kk) {
        uint32_t a[4];
        LoadMatrices<false>(a, q_row + kk * 16);
#pragma unroll
        for (int j = 0; j < kKeys / 8; j += 2) {
          uint32_t b[4];
          LoadMatrices<false>(b, kt + (j * 8 + k_row) * kP + kk * 16 + k_col);
          Mma(sc[j], a, b[0], b[1]);
          Mma(sc[j + 1], a, b[2], b[3]);
        }
      }

      // The causal mask (and the window's), in base-2 units; each row's
      // maximum. Most tiles (the memory's, before the diagonal) are seen
      // whole by all the warp's rows and need no mask (warp-uniform).
      const bool whole = n == kKeys && w0 + kRows <= s.num_q && t + kKeys - 1 <= offset + w0 &&
                         (s.window <= 0 || t > offset + warp_last - s.window);
      float tile_a = -INFINITY, tile_b = -INFINITY;
      if (whole) {
#pragma unroll
        for (int j = 0; j < kKeys / 8; ++j) {
#pragma unroll
          for (int c = 0; c < 4; ++c) sc[j][c] *= kLog2e;
          tile_a = fmaxf(tile_a, fmaxf(sc[j][0], sc[j][1]));
          tile_b = fmaxf(tile_b, fmaxf(sc[j][2], sc[j][3]));
        }
      } else {
#pragma unroll
        for (int j = 0; j < kKeys / 8; ++j) {
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            const int64_t key = t + j * 8 + 2 * tq + (c & 1);
            const int64_t row = c < 2 ? row_a : row_b;
            const int64_t last = offset + row;  // the row's last visible key
            bool visible = key < t + n && key <= last && row < s.num_q;
            if (s.window > 0) visible = visible && key > last - s.window;
            const float x = visible ? sc[j][c] * kLog2e : -INFINITY;
            sc[j][c] = x;
            if (c < 2) {
              tile_a = fmaxf(tile_a, x);
            } else {
              tile_b = fmaxf(tile_b, x);
            }
          }
        }
      }
      tile_a = fmaxf(tile_a, __shfl_xor_sync(kMask, tile_a, 1));
      tile_a = fmaxf(tile_a, __shfl_xor_sync(kMask, tile_a, 2));
      tile_b = fmaxf(tile_b, __shfl_xor_sync(kMask, tile_b, 1));
      tile_b = fmaxf(tile_b, __shfl_xor_sync(kMask, tile_b, 2));
      const float new_a = fmaxf(m_a, tile_a), new_b = fmaxf(m_b, tile_b);
      // A row that has seen no visible key yet keeps m = -inf: its weights
      // are exp2(-inf) = 0 against base 0, and its (zero) sums are left as
      // they are.
      const float base_a = new_a == -INFINITY ? 0.0f : new_a;
      const float base_b = new_b == -INFINITY ? 0.0f : new_b;
      const float corr_a = exp2f(m_a - base_a), corr_b = exp2f(m_b - base_b);
      m_a = new_a;
      m_b = new_b;

      // P = exp2(S - m) as the A operand of P·V: accumulator tiles 2kk and
      // 2kk + 1 are the 16 keys of step kk.
      uint32_t p[kKeys / 8][2];
      float sum_a = 0.0f, sum_b = 0.0f;
#pragma unroll
      for (int j = 0; j < kKeys / 8; ++j) {
        const float p0 = exp2f(sc[j][0] - base_a), p1 = exp2f(sc[j][1] - base_a);
        const float p2 = exp2f(sc[j][2] - base_b), p3 = exp2f(sc[j][3] - base_b);
        sum_a += p0 + p1;
        sum_b += p2 + p3;
        p[j][0] = PackBf16(p0, p1);
        p[j][1] = PackBf16(p2, p3);
      }
      l_a = l_a * corr_a + sum_a;
      l_b = l_b * corr_b + sum_b;
#pragma unroll
      for (int nd = 0; nd < kHd / 8; ++nd) {
        o[nd][0] *= corr_a;
        o[nd][1] *= corr_a;
        o[nd][2] *= corr_b;
        o[nd][3] *= corr_b;
      }
#pragma unroll
      for (int kk = 0; kk < kKeys / 16; ++kk) {
        const uint32_t a[4] = {p[2 * kk][0], p[2 * kk][1], p[2 * kk + 1][0], p[2 * kk + 1][1]};
#pragma unroll
        for (int nd = 0; nd < kHd / 8; nd += 2) {
          uint32_t b[4];
          LoadMatrices<true>(b, vt + (kk * 16 + v_row) * kP + nd * 8 + v_col);
          Mma(o[nd], a, b[0], b[1]);
          Mma(o[nd + 1], a, b[2], b[3]);
        }
      }
    }
    __syncthreads();  // tile i is consumed before its stage is loaded again
    if (kStages == 1 && i + 1 < tiles) load_tile(i + 1, 0);
  }

  if (!warp_active) return;
  l_a += __shfl_xor_sync(kMask, l_a, 1);
  l_a += __shfl_xor_sync(kMask, l_a, 2);
  l_b += __shfl_xor_sync(kMask, l_b, 1);
  l_b += __shfl_xor_sync(kMask, l_b, 2);
  // Every query sees at least its own key, so l > 0 on the rows written.
  const float inv_a = l_a > 0.0f ? 1.0f / l_a : 0.0f, inv_b = l_b > 0.0f ? 1.0f / l_b : 0.0f;
#pragma unroll
  for (int nd = 0; nd < kHd / 8; ++nd) {
    const int64_t d = h * kHd + nd * 8 + 2 * tq;
    if (row_a < s.num_q) {
      out[row_a * out_stride + d] = o[nd][0] * inv_a;
      out[row_a * out_stride + d + 1] = o[nd][1] * inv_a;
    }
    if (row_b < s.num_q) {
      out[row_b * out_stride + d] = o[nd][2] * inv_b;
      out[row_b * out_stride + d + 1] = o[nd][3] * inv_b;
    }
  }
}

template <int kHd>
cudaError_t Launch(const float* q, const float* k, const float* v, const AttentionShape& s, float* out,
                   int64_t out_stride, uint16_t* scratch, cudaStream_t stream) {
  auto* kb = reinterpret_cast<__nv_bfloat16*>(scratch);
  auto* vb = kb + s.num_kv_heads * s.num_keys * kHd;
  const int64_t pairs = s.num_keys * kHd / 2;
  constexpr int kConvertThreads = 256;
  const dim3 convert_grid(static_cast<unsigned>(min(int64_t{4096}, (pairs + kConvertThreads - 1) / kConvertThreads)),
                          static_cast<unsigned>(s.num_kv_heads));
  KvToBf16Kernel<<<convert_grid, kConvertThreads, 0, stream>>>(k, v, s, reinterpret_cast<__nv_bfloat162*>(kb),
                                                               reinterpret_cast<__nv_bfloat162*>(vb));
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  constexpr size_t shared = SharedBytes<kHd>();
  e = cudaFuncSetAttribute(FlashAttentionKernel<kHd>, cudaFuncAttributeMaxDynamicSharedMemorySize, int{shared});
  if (e != cudaSuccess) return e;
  const dim3 grid(static_cast<unsigned>((s.num_q + kBlockRows - 1) / kBlockRows), static_cast<unsigned>(s.num_heads));
  FlashAttentionKernel<kHd><<<grid, kThreads, shared, stream>>>(q, kb, vb, s, out, out_stride);
  return cudaGetLastError();
}

// f(std::integral_constant<int, head_dim>{}) for the head sizes the kernel
// is built for, `otherwise` for any other: the one list of them.
template <typename R, typename F>
R ByHeadDim(int64_t head_dim, R otherwise, F f) {
  switch (head_dim) {
    case 16: return f(std::integral_constant<int, 16>{});
    case 32: return f(std::integral_constant<int, 32>{});
    case 64: return f(std::integral_constant<int, 64>{});
    case 96: return f(std::integral_constant<int, 96>{});
    case 128: return f(std::integral_constant<int, 128>{});
    case 256: return f(std::integral_constant<int, 256>{});
    default: return otherwise;
  }
}

}  // namespace

bool FlashAttentionSupports(int64_t head_dim, int compute_major, size_t shared_optin) {
  if (compute_major < 8) return false;
  // (Built without an sm_80 target, the driver would JIT older PTX, whose
  // Mma is a trap that kills the context.)
  // The virtual architecture the code was made from (a JIT for an sm_90
  // device from compute_75 PTX has binaryVersion 90 and still traps), asked
  // once it has an answer: the chunk loop asks per layer. A query that
  // fails is not kept (the next call asks again), so that one failure does
  // not turn the tensor cores off for the process.
  static std::atomic<int> has_mma{0};  // 0: not known yet, 1: yes, 2: no
  int known = has_mma.load(std::memory_order_relaxed);
  if (known == 0) {
    cudaFuncAttributes attributes;
    if (cudaFuncGetAttributes(&attributes, FlashAttentionKernel<64>) != cudaSuccess) {
      cudaGetLastError();  // (the query's own error, not an op's)
      return false;
    }
    known = attributes.ptxVersion >= 80 ? 1 : 2;
    has_mma.store(known, std::memory_order_relaxed);
  }
  if (known != 1) return false;
  const size_t shared = ByHeadDim(head_dim, size_t{0}, [](auto hd) { return SharedBytes<decltype(hd)::value>(); });
  return shared > 0 && shared <= shared_optin;
}

size_t FlashAttentionScratchBytes(const AttentionShape& s) {
  return 2 * sizeof(__nv_bfloat16) * static_cast<size_t>(s.num_kv_heads) * static_cast<size_t>(s.num_keys) *
         static_cast<size_t>(s.head_dim);
}

cudaError_t FlashAttention(const float* q, const float* k, const float* v, const AttentionShape& s, float* out,
                           int64_t out_stride, uint16_t* scratch, cudaStream_t stream) {
  if (s.num_kv_heads <= 0 || s.num_heads % s.num_kv_heads != 0 || s.num_q > s.num_keys || s.num_heads > 65535 ||
      s.num_kv_heads > 65535 || reinterpret_cast<uintptr_t>(scratch) % 16 != 0) {
    return cudaErrorInvalidValue;
  }
  if (s.num_q == 0) return cudaSuccess;
  return ByHeadDim(s.head_dim, cudaErrorInvalidValue, [&](auto hd) {
    return Launch<decltype(hd)::value>(q, k, v, s, out, out_stride, scratch, stream);
  });
}

}  // namespace snapfill::cuda
