// Quantized and float matrix products on the CPU.
//
// MatMul computes Y[m, n] = X[m, k] · W[n, k]ᵀ where X is f32 (m tokens of k
// features) and W is a weight matrix of n rows stored in a GGUF type. As in
// ggml, X is first quantized to the weight type's partner format (Q8_0 for
// Q4_0/Q8_0, Q8_1 for Q4_1, Q8_K for the K-quants) and the dot products run
// in integers with f32 block scales; F32/F16/BF16 weights use f32 FMA.
// Threads: the kernels' team (spin_team.h) over output columns / token blocks
// (as many as the team bound by the calling backend has; outside a backend,
// omp_get_max_threads()).
// Token blocks (m >= 16) use AMX tiles when the CPU has them (runtime
// check): AMX-BF16 where available, for Q4_0/Q4_1/Q8_0/F16/BF16/Q4_K/Q6_K
// weights (weights and activations rounded to bf16, products summed in f32:
// a different rounding from the int8 and f32 paths, of the same size as the
// int8 ones; F32 weights keep f32 FMA), else AMX-INT8 for Q4_0/Q4_1/Q8_0
// (the same result as the int8 kernels up to f32 summation order).
#ifndef SNAPFILL_KERNELS_CPU_MATMUL_H_
#define SNAPFILL_KERNELS_CPU_MATMUL_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "snapfill/dtype.h"

namespace snapfill::cpu {

// Returns true if MatMul and DequantizeRow accept `type`.
bool MatMulSupports(GgmlType type);

// Returns true if the products of `type` quantize their activations to
// int8 and run on integer dots (Q4_0, Q4_1, Q8_0, Q4_K, Q6_K, and Q5_0 in
// batches of 4 tokens and more, as Q8_0 blocks: ggml's arithmetic); false
// for the types whose rows are widened to f32 (F32, F16, BF16, Q5_1, Q5_K,
// and Q5_0 below 4 tokens: f32 FMA, or bf16 on AMX). The same at every
// level. Without m: for batches (a prefill's products).
bool MatMulQuantizesActivations(GgmlType type);
bool MatMulQuantizesActivations(GgmlType type, int64_t m);

// Y[i, j] = Σ_t X[i, t] · W[j, t].
//   x: [m, k] f32, row stride x_stride floats
//   w: [n rows] of k elements of `w_type`, row j at w + j * w_row_bytes
//   y: [m, n] f32, row stride y_stride floats
// k must be a multiple of the type's block size. Accumulation: int32 per
// block, f32 across blocks (quantized); f32 FMA (float types).
void MatMul(const float* x, int64_t m, int64_t k, int64_t x_stride, const void* w,
            GgmlType w_type, int64_t n, size_t w_row_bytes, float* y, int64_t y_stride);

// One weight of MatMulShared: y[m, n] = x · Wᵀ.
struct MatMulOut {
  const void* w;       // n rows of k elements, row j at w + j * w_row_bytes
  int64_t n;
  size_t w_row_bytes;
  float* y;            // [m, n], row stride y_stride floats
  int64_t y_stride;
  // Optional: the same matrix in the decode layout (PackForDecode), which
  // the AVX-512 Q4_0 / Q4_1 token-block kernels read instead of packing the
  // rows on every call; the result is the same bit for bit. nullptr: none.
  const void* packed = nullptr;
};

// Y_c = X · W_cᵀ for `count` weights of one type (Q, K and V; gate and up):
// bit for bit `count` calls of MatMul, with X quantized once for all and
// one parallel region instead of `count`.
void MatMulShared(const float* x, int64_t m, int64_t k, int64_t x_stride, GgmlType w_type, const MatMulOut* outs,
                  int count);

// The feed-forward block's down projection with its SwiGLU in front:
// Y = (silu(G) ⊙ U) · Wᵀ for G (gate) and U (up), both [m, k] with row
// stride x_stride. Bit for bit cpu::SwiGlu over each row of G and U followed
// by MatMul. Where MatMulFuses says so (the AMX-BF16 path), the SwiGLU
// runs row by row inside the product's conversion of X to bf16 and no
// [m, k] intermediate is written; elsewhere G is overwritten with
// silu(G) ⊙ U first. Either way G's contents are unspecified afterwards.
// With `add`, Y += that product, as MatMulAdd.
void MatMulSwiGlu(float* gate, const float* up, int64_t m, int64_t k, int64_t x_stride, const void* w,
                  GgmlType w_type, int64_t n, size_t w_row_bytes, float* y, int64_t y_stride, bool add = false);
// Y += X · Wᵀ (a product and the residual add after it): bit for bit MatMul
// into a temporary, then y + t in f32 per output. Where MatMulFuses says so,
// each output tile is added to Y as it leaves the tiles (no temporary);
// elsewhere through an [m, n] temporary of its own.
void MatMulAdd(const float* x, int64_t m, int64_t k, int64_t x_stride, const void* w, GgmlType w_type, int64_t n,
               size_t w_row_bytes, float* y, int64_t y_stride);
// Whether MatMulSwiGlu and MatMulAdd fuse for these arguments (AMX-BF16
// available and taken for this type and shape).
bool MatMulFuses(GgmlType w_type, int64_t m, int64_t k, size_t w_row_bytes);

// The whole feed-forward block after its RMSNorm:
// Y = (silu(X · Gᵀ) ⊙ (X · Uᵀ)) · Dᵀ, with `add` Y += it. X [m, k] at row
// stride x_stride; gate and up n_ff rows of k elements of gu_type; down n
// rows of n_ff elements of d_type. Bit for bit MatMulShared over gate and up
// followed by MatMulSwiGlu(add). Where FeedForwardFuses says so (the
// AMX-BF16 path) the gate/up outputs go through the SwiGLU and into the
// down projection's bf16 input while still in L1, and nothing of n_ff
// columns is written in f32; elsewhere through [m, n_ff] temporaries of its
// own. Y may overlap X.
//
// With norm (a RowNorm whose weight is set), X is first cpu::RmsNorm(X;
// weight, eps): where the block fuses, row by row inside the conversion of X
// (norm.xn untouched); elsewhere into norm.xn, which then holds it.
struct RowNorm {
  const float* weight = nullptr;  // k floats; nullptr: no norm
  float eps = 0.0f;
  float* xn = nullptr;            // [m, xn_stride]: the normalized rows where the norm does not fuse
  int64_t xn_stride = 0;
};
void FeedForward(const float* x, int64_t m, int64_t k, int64_t x_stride, const void* gate, const void* up,
                 GgmlType gu_type, int64_t n_ff, size_t gu_row_bytes, const void* down, GgmlType d_type, int64_t n,
                 size_t d_row_bytes, float* y, int64_t y_stride, bool add, const RowNorm& norm = RowNorm());
// MatMulShared of cpu::RmsNorm(X; norm.weight, norm.eps), bit for bit
// RmsNorm into norm.xn then MatMulShared over it. Where every product fuses
// (MatMulFuses: AMX-BF16) the norm runs row by row inside their one
// conversion of X, and norm.xn is not written; elsewhere it holds the
// normalized rows afterwards.
void NormMatMulShared(const float* x, int64_t m, int64_t k, int64_t x_stride, const RowNorm& norm, GgmlType w_type,
                      const MatMulOut* outs, int count);
bool FeedForwardFuses(GgmlType gu_type, GgmlType d_type, int64_t m, int64_t k, int64_t n_ff, size_t gu_row_bytes,
                      size_t d_row_bytes);

// dst[0..k) = the k elements of one row of `type` at `src` (embedding lookup).
// Bit-identical to ref::DequantizeRow (same f32 formulas, fmaf where ggml
// writes a*b + c).
void DequantizeRow(GgmlType type, const void* src, float* dst, int64_t k);

// Activation quantizers that MatMul uses internally, writing ggml blocks
// (BlockQ8_0 / BlockQ8_1 / BlockQ8_K of kernels/quant_blocks.h) so that tests
// can compare them bit for bit with ref::QuantizeRowQ8_*. k must be a
// multiple of 32 (Q8_0, Q8_1) or 256 (Q8_K).
void QuantizeRowQ8_0(const float* x, void* y, int64_t k);
void QuantizeRowQ8_1(const float* x, void* y, int64_t k);
void QuantizeRowQ8_K(const float* x, void* y, int64_t k);

// The token-block products' own activation quantizer (the one MatMul runs
// for m > 1 with Q4_0 / Q4_1 / Q8_0 weights), for the same comparison: one
// row x[k] (k a multiple of 32) into q[k] (ggml's int8 quants; u8 + 128 for
// Q8_0 weights), s[k / 32] (each block's d rounded to fp16, as floats) and
// aux[k / 32] (what the weight's offset term multiplies: -8 Σq · d for Q4_0,
// fp16(Σq · d) for Q4_1 (ggml's Q8_1 s), -128 d for Q8_0).
void QuantizeActivationsForTesting(GgmlType w_type, const float* x, int64_t k, uint8_t* q, float* s, float* aux);

// Which implementation MatMul and the quantizers use. kAuto: the fastest
// available (AMX-BF16 tiles for m >= 16 with the weight types above, else
// AMX-INT8 tiles with Q4_0/Q4_1/Q8_0 weights, when the CPU and OS allow, else the SIMD kernels compiled in (AVX-512 VNNI, else
// AVX2), else the portable path); kNoAmx: as kAuto without AMX; kGeneric
// forces the portable path; kAmxInt8 as kAuto with AMX-INT8 where AMX-BF16
// would be used; kAvx2: token blocks (and float weights) on the AVX2 kernels
// even where AVX-512 is compiled in (falls back to the portable path where
// AVX2 is not). Process-wide: the CPU backend sets it where its options
// name one (BackendOptions::products_kernel); tests and benchmarks too.
enum class MatMulImpl { kAuto, kGeneric, kNoAmx, kAmxInt8, kAvx2 };
void SetMatMulImpl(MatMulImpl impl);
inline void SetMatMulImplForTesting(MatMulImpl impl) { SetMatMulImpl(impl); }
MatMulImpl ActiveMatMulImpl();

// The path token blocks take under `impl` here, as Backend::kernels() names
// it: "amx-bf16", "amx-int8", "avx512-vnni", "avx-vnni", "avx2" or
// "portable".
const char* ProductPathName(MatMulImpl impl);
// The implementations worth timing here, each taking another path: kAuto
// (the path the CPU's flags choose) first, then AMX-INT8 where kAuto takes
// AMX-BF16, AVX-512 VNNI where it takes AMX, AVX2 where it takes AVX-512;
// never the portable path where a SIMD one runs.
std::vector<MatMulImpl> AvailableProductImpls();
// Each available implementation's rate on a token block of m tokens times a
// `type` matrix of n rows of k elements (synthetic finite values: the
// kernels' speed does not depend on them; k a multiple of the type's block):
// the best of three runs after a warm-up, in GOP/s (2·m·n·k a product).
// Leaves the implementation in force as it was.
struct ProductRate {
  MatMulImpl impl;
  double gops = 0;
};
std::vector<ProductRate> MeasureProductImpls(GgmlType type, int64_t m, int64_t k, int64_t n);

// A bound on the bytes the products' token blocks keep between calls where
// they run on AMX-BF16 tiles (m >= 16 under kAuto; else 0: the int8 paths'
// quantized activations and packed tiles are left to the caller's fit), for
// blocks of up to m tokens whose inputs are at most `widest` values wide,
// ffn_dim of them the feed-forward block's hidden width, on a team of
// `threads` (internal::AmxBf16ScratchBytes).
uint64_t ProductScratchBytes(int64_t m, int64_t widest, int64_t ffn_dim, int threads);

// Returns true if SIMD kernels were compiled in (kAuto then uses them).
bool MatMulHasSimd();

// Returns true if the AVX2 kernels of token blocks were compiled in
// (MatMulImpl::kAvx2 then uses them; kAuto does where AVX-512 is not).
bool MatMulHasAvx2();

// Returns true if those AVX2 kernels (token blocks and the decode layout) use
// AVX-VNNI's 256-bit vpdpbusd / vpdpwssd (the avxvnni level's copy).
bool MatMulHasAvxVnni();

// Returns true if the decode layout (PackForDecode, MatMulDecodePacked) has a
// kernel here: AVX-512 VNNI, or AVX2 (which kAvx2 also forces), and the
// implementation is not kGeneric; DecodePackedBytes is 0 otherwise.
bool MatMulHasDecodeLayout();

// Returns true if kAuto uses the AMX-INT8 tile path: the CPU has AMX-TILE and
// AMX-INT8, the OS granted the tile state (asked once per process), and the
// kernels' AMX mode is not off (kernel_config.h).
bool MatMulHasAmx();

// Returns true if kAuto uses the AMX-BF16 tile path for those token blocks:
// MatMulHasAmx(), the CPU has AMX-BF16 and AVX512_BF16, and the kernels'
// AMX mode is kAll.
bool MatMulHasAmxBf16();

// ---- One-token products over weights repacked for decode.
// Decode multiplies one token by every weight matrix, reading each weight
// byte once: it is bound by how fast the weights stream from memory, and the
// row-major product does too much work per byte to keep up once the weights
// no longer fit in the caches. PackForDecode rewrites a Q4_0 / Q4_1 / Q5_0 /
// Q8_0 matrix in the decode layout of kernels/quant_blocks.h (16 rows
// interleaved); MatMulDecodePacked then multiplies one token by it with the
// arithmetic of MatMul (X quantized to the partner format, exact integer block
// dots, f32 sums; only the f32 summation order differs).
//
// The packed size in bytes, or 0 when the packed path does not handle the
// matrix here (another type, k not a multiple of 32, !MatMulHasDecodeLayout(),
// or Q5_0 where the AVX-512 kernels run: its records have an AVX2 kernel only).
size_t DecodePackedBytes(GgmlType type, int64_t n, int64_t k);
// Returns true if the token-block products (m > 3) of a `type` matrix read
// its decode-layout copy when MatMulOut::packed gives one (AVX-512 VNNI with
// Q4_0 / Q4_1, where AMX does not take the token blocks); elsewhere they read
// the GGUF rows and ignore the copy.
bool MatMulReadsDecodeLayout(GgmlType type);
// out: DecodePackedBytes(type, n, k) bytes (call only when that is not 0).
void PackForDecode(const void* w, GgmlType type, int64_t n, int64_t k, size_t w_row_bytes, void* out);
// y[0, n) = x[0, k) · Wᵀ for one token; `packed` from PackForDecode.
void MatMulDecodePacked(const float* x, int64_t k, const void* packed, GgmlType type, int64_t n, float* y);
// One weight of MatMulDecodePackedShared: y[0, n) = x · Wᵀ, W packed by
// PackForDecode.
struct DecodeOut {
  const void* packed;
  int64_t n;
  float* y;
};
// y_c = x · W_cᵀ for `count` packed weights of one type and k (Q, K and V;
// gate and up): bit for bit `count` calls of MatMulDecodePacked, with x
// quantized once for all and one parallel region instead of `count`, the
// threads' spans running across the matrices without a barrier between
// them.
void MatMulDecodePackedShared(const float* x, int64_t k, GgmlType type, const DecodeOut* outs, int count);

}  // namespace snapfill::cpu

#endif  // SNAPFILL_KERNELS_CPU_MATMUL_H_
