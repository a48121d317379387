// Internal to kernels/cpu: the AMX tile paths of cpu::MatMul for token
// blocks (prefill, m >= 16): AMX-BF16 where the CPU has it (weights of
// Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 / F16 / BF16 / Q4_K / Q5_K / Q6_K
// unpacked to bf16 per panel),
// else AMX-INT8 (Q4_0 / Q4_1 / Q8_0). matmul.cc
// dispatches here; nothing else should call it (use cpu::MatMul).
//
// Owns: runtime detection of AMX (CPUID leaf 7 EDX bits 24/25 plus the
// AVX-512 subsets the kernel uses, then the Linux arch_prctl request for the
// XTILEDATA state, once per process), per-thread tile configuration, and the
// tile kernel. The code is compiled with function target attributes, so the
// binary runs on any x86-64 and only calls it when the CPU and kernel allow.
#ifndef SNAPFILL_KERNELS_CPU_MATMUL_AMX_H_
#define SNAPFILL_KERNELS_CPU_MATMUL_AMX_H_

#include <cstddef>
#include <cstdint>

#include "snapfill/dtype.h"

namespace snapfill::cpu::internal {

// True once the CPU has AMX-TILE + AMX-INT8 (and AVX-512 F/BW/VL/DQ, FMA,
// F16C), the OS granted the tile-data state, and the kernels' AMX mode is
// not off (kernel_config.h). Computed once per process (thread-safe).
bool AmxAvailable();

// True if MatMulAmx handles `type` (Q4_0, Q4_1, Q8_0).
bool AmxSupportsType(GgmlType type);

// Smallest token count worth the tile path (one 16-token tile).
inline constexpr int64_t kAmxMinTokens = 16;

// Same contract as cpu::MatMul, for a type AmxSupportsType accepts, k a
// positive multiple of 32 and m >= 1. Caller must have checked AmxAvailable().
void MatMulAmx(const float* x, int64_t m, int64_t k, int64_t x_stride, const uint8_t* w, GgmlType type,
               int64_t n, size_t w_row_bytes, float* y, int64_t y_stride);

// True once AmxAvailable() holds and the CPU also has AMX-BF16 and
// AVX512_BF16, and the kernels' AMX mode is kAll (kInt8Only keeps the
// AMX-INT8 path). Computed once per process.
bool AmxBf16Available();

// True if the AMX-BF16 path takes weights of `type`: Q4_0, Q4_1, Q5_0, Q5_1,
// Q8_0, F16, BF16, Q4_K, Q5_K and Q6_K (not F32: its weights would lose 16 bits each; it
// keeps the f32 products).
bool AmxBf16SupportsType(GgmlType type);

// The AMX-BF16 path (matmul_amx_bf16.cc): same contract as MatMulAmx, for a
// type AmxBf16SupportsType accepts and k a multiple of 32, but
// the result is Σ bf16(x)·bf16(w) in f32, where w is ref::DequantizeRow's f32
// value and bf16() is Fp32ToBf16Rne (vcvtneps2bf16). Requires
// AmxBf16Available().
void MatMulAmxBf16(const float* x, int64_t m, int64_t k, int64_t x_stride, const uint8_t* w, GgmlType type,
                   int64_t n, size_t w_row_bytes, float* y, int64_t y_stride);

// Bytes MatMulAmxBf16Shared and FeedForwardAmxBf16 keep between calls
// for blocks of up to m tokens whose inputs are at most `widest` values wide
// (the feed-forward block's h ffn of them), on a team of `threads`: the
// caller's X and h in tiles (m rounded up to 32 tokens, bf16), and each
// thread's weight panel, norm or SwiGLU row and the C tiles between parts
// of K. An upper bound, for memory predictions.
uint64_t AmxBf16ScratchBytes(int64_t m, int64_t widest, int64_t ffn, int threads);

// One product of MatMulAmxBf16Shared: Y[m, n] (row stride y_stride floats)
// = X · Wᵀ with W's rows w_row_bytes apart.
struct AmxBf16Out {
  const uint8_t* w;
  int64_t n;
  size_t w_row_bytes;
  float* y;
  int64_t y_stride;
};

// MatMulAmxBf16 for `count` weights of one type that share X (Q, K and V;
// gate and up): X is converted to bf16 once, and every product's units run
// in one parallel region (8 products at a time). Each output equals MatMulAmxBf16's for that
// weight bit for bit. With `up` (same shape and stride as x), X is
// silu(x) ⊙ up instead, computed by cpu::SwiGlu row by row into a
// per-thread buffer as the rows are converted (the feed-forward block's down
// projection, cpu::MatMulSwiGlu). With `add`, each product is added to what
// its Y holds (y + c in f32 per output, what MatMulAmxBf16 then a separate
// f32 add give). With `norm` (k floats; not with `up`), X is cpu::RmsNorm(X;
// norm, eps) instead, row by row the same way: the layers' norm in front of
// Q/K/V and of the feed-forward block, with no [m, k] pass of its own.
void MatMulAmxBf16Shared(const float* x, int64_t m, int64_t k, int64_t x_stride, GgmlType type,
                         const AmxBf16Out* outs, int count, const float* up = nullptr, bool add = false,
                         const float* norm = nullptr, float eps = 0.0f);

// The feed-forward block on AMX-BF16 tiles: Y (+)= (silu(X·Gᵀ) ⊙ X·Uᵀ) · Dᵀ
// for X [m, k] (row stride x_stride), gate and up n_ff rows of gu_type and
// down n rows of n_ff elements of d_type. Each gate/up (token pair, row pair)
// goes from the tiles to an L1 buffer, through cpu::SwiGlu and straight into
// the down projection's bf16 A tiles: neither [m, n_ff] product nor their
// SwiGLU is written in f32. Bit for bit MatMulAmxBf16Shared over gate and up,
// then MatMulAmxBf16Shared(up = ...) with `add` for down. Requires
// AmxBf16Available(), both types AmxBf16SupportsType and k, n_ff multiples of 32.
// Y may overlap X (X is read in full before Y is written). With `norm`, X is
// cpu::RmsNorm(X; norm, eps), as in MatMulAmxBf16Shared.
void FeedForwardAmxBf16(const float* x, int64_t m, int64_t k, int64_t x_stride, GgmlType gu_type,
                        const uint8_t* gate, const uint8_t* up, int64_t n_ff, size_t gu_row_bytes, GgmlType d_type,
                        const uint8_t* down, int64_t n, size_t d_row_bytes, float* y, int64_t y_stride, bool add,
                        const float* norm = nullptr, float eps = 0.0f);

// Loads the tile configuration of the AMX-BF16 kernels on the calling thread
// (palette 1, all eight tiles 16 rows × 64 bytes) / releases the tile state.
// Every thread that issues tile ops configures first and releases before it
// leaves the parallel region. Require AmxBf16Available().
void ConfigureBf16Tiles();
void ReleaseBf16Tiles();

// For tests: the B tiles MatMulAmxBf16 builds for one group of `rows` (<= 16)
// weight rows of k elements: out[b * 1024 + r * 64 + 4 * j + 2 * p] holds the
// bf16 bits of element 32·b + 2·r + p of row j (zero for j >= rows); and its
// conversion of one activation row to bf16. Require AmxBf16Available().
void UnpackBf16TilesForTesting(const uint8_t* w, GgmlType type, size_t w_row_bytes, int rows, int64_t k,
                               uint8_t* out);
void ConvertRowBf16ForTesting(const float* x, int64_t k, uint16_t* out);

// The activation quantizer of MatMulAmx, exposed for tests: row x of k
// elements (k a multiple of 32) as ggml Q8_0 / Q8_1 blocks, bit-identical to
// ref::QuantizeRowQ8_0 / Q8_1: block b's 32 s8 values at q + b * q_stride,
// its scale Fp16ToFp32(d) at dx[b * s_stride] and, if sx is not null,
// Q8_1's Fp16ToFp32(s) at sx[b * s_stride]. Requires AmxAvailable().
void QuantizeRowQ8Tiles(const float* x, int64_t k, uint8_t* q, int64_t q_stride, float* dx, float* sx,
                        int64_t s_stride);

}  // namespace snapfill::cpu::internal

#endif  // SNAPFILL_KERNELS_CPU_MATMUL_AMX_H_
