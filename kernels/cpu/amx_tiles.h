// Internal to kernels/cpu: what the AMX kernels share (matmul_amx.cc,
// matmul_amx_bf16.cc, the attention in ops.cc). x86-64 with GCC/Clang only;
// include after <immintrin.h>. Nothing here checks that the CPU has AMX: the
// callers do (internal::AmxAvailable / AmxBf16Available).
#ifndef SNAPFILL_KERNELS_CPU_AMX_TILES_H_
#define SNAPFILL_KERNELS_CPU_AMX_TILES_H_

#if defined(__x86_64__) && defined(__GNUC__)

// GCC 12's AVX-512 intrinsics trip -Wuninitialized once inlined (GCC bug
// 105593); silenced around the include as in the kernels' sources.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <cstdint>

#include "kernels/quant_blocks.h"
#include "snapfill/dtype.h"

namespace snapfill::cpu::internal {

// The weight types the AMX paths take (AmxSupportsType), and their ggml
// block sizes in bytes (32 elements each).
enum class AmxWeightKind { kQ4_0, kQ4_1, kQ8_0 };

inline AmxWeightKind AmxWeightKindOf(GgmlType type) {
  return type == GgmlType::kQ4_0   ? AmxWeightKind::kQ4_0
         : type == GgmlType::kQ4_1 ? AmxWeightKind::kQ4_1
                                   : AmxWeightKind::kQ8_0;
}

constexpr int64_t AmxWeightBlockBytes(AmxWeightKind kind) {
  return kind == AmxWeightKind::kQ4_0   ? sizeof(BlockQ4_0)
         : kind == AmxWeightKind::kQ4_1 ? sizeof(BlockQ4_1)
                                        : sizeof(BlockQ8_0);
}

// ldtilecfg layout (palette 1).
struct alignas(64) TileConfig {
  uint8_t palette_id;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};
static_assert(sizeof(TileConfig) == 64, "tile config is 64 bytes");

// Tile loads and stores with a memory clobber (gcc's intrinsics have none),
// so the compiler orders them against the vector stores that fill, and the
// loads that drain, the buffers they touch.
#define SNAPFILL_TILE_LOAD(tmm, base, stride)                                   \
  __asm__ volatile("tileloadd\t(%0,%1,1), %%tmm" #tmm ::"r"((const void*)(base)), \
                   "r"((long)(stride))                                            \
                   : "memory")
// The same load with the non-temporal hint (tileloaddt1): for an operand that
// streams past once per use, so it does not push the reused one out of L1.
#define SNAPFILL_TILE_LOAD_STREAM(tmm, base, stride)                              \
  __asm__ volatile("tileloaddt1\t(%0,%1,1), %%tmm" #tmm ::"r"((const void*)(base)), \
                   "r"((long)(stride))                                              \
                   : "memory")
#define SNAPFILL_TILE_STORE(tmm, base, stride)                                    \
  __asm__ volatile("tilestored\t%%tmm" #tmm ", (%0,%1,1)" ::"r"((void*)(base)), \
                   "r"((long)(stride))                                              \
                   : "memory")

// out[c] lane i = v[i] lane c: a 16 × 16 transpose of dwords (how bf16 pairs
// of 16 rows become the rows of a VNNI-layout tile). Four levels: 32-bit and
// 64-bit unpacks within 128-bit lanes, then two 128-bit shuffles.
__attribute__((target("avx512f"))) inline void Transpose16x16Dwords(const __m512i* v, __m512i* out) {
  __m512i a[16], b[16];
  for (int i = 0; i < 8; ++i) {
    a[2 * i] = _mm512_unpacklo_epi32(v[2 * i], v[2 * i + 1]);
    a[2 * i + 1] = _mm512_unpackhi_epi32(v[2 * i], v[2 * i + 1]);
  }
  // b[4i + c], 128-bit lane L: element 4L + c of rows 4i..4i+3.
  for (int i = 0; i < 4; ++i) {
    b[4 * i + 0] = _mm512_unpacklo_epi64(a[4 * i], a[4 * i + 2]);
    b[4 * i + 1] = _mm512_unpackhi_epi64(a[4 * i], a[4 * i + 2]);
    b[4 * i + 2] = _mm512_unpacklo_epi64(a[4 * i + 1], a[4 * i + 3]);
    b[4 * i + 3] = _mm512_unpackhi_epi64(a[4 * i + 1], a[4 * i + 3]);
  }
  for (int c = 0; c < 4; ++c) {
    const __m512i p0 = _mm512_shuffle_i32x4(b[c], b[4 + c], 0x44);
    const __m512i p1 = _mm512_shuffle_i32x4(b[c], b[4 + c], 0xEE);
    const __m512i q0 = _mm512_shuffle_i32x4(b[8 + c], b[12 + c], 0x44);
    const __m512i q1 = _mm512_shuffle_i32x4(b[8 + c], b[12 + c], 0xEE);
    out[c] = _mm512_shuffle_i32x4(p0, q0, 0x88);
    out[4 + c] = _mm512_shuffle_i32x4(p0, q0, 0xDD);
    out[8 + c] = _mm512_shuffle_i32x4(p1, q1, 0x88);
    out[12 + c] = _mm512_shuffle_i32x4(p1, q1, 0xDD);
  }
}

}  // namespace snapfill::cpu::internal

#endif  // x86-64 GCC/Clang

#endif  // SNAPFILL_KERNELS_CPU_AMX_TILES_H_
