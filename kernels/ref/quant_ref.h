// Scalar reference for ggml's quantized formats and the matrix products of
// the linear layers: dequantization of every supported weight type, ggml's
// reference quantizers (activation formats Q8_0/Q8_1/Q8_K reproduce ggml's
// rounding exactly; Q4_0/Q4_1/Q8_0 weights are ggml's *_ref quantizers;
// Q4_K/Q6_K get simple quantizers meant for test data), and three matmuls:
//   MatMul                      exact: double accumulation over dequantized
//                               weights and unquantized f32 activations;
//   MatMulQuantizedActivations  ggml's arithmetic: activations quantized to
//                               the partner format, exact integer block dots,
//                               block scales combined in double;
//   MatMulBf16                  the AMX-BF16 arithmetic: bf16 operands,
//                               exact products, double accumulation.
// Plain loops for clarity; the source of truth for kernels/cpu/matmul.cc.
// Layouts: kernels/quant_blocks.h (ggml's ggml-common.h); formulas from
// ggml's ggml-quants.c and ggml-cpu/quants.c (*_generic).
#ifndef SNAPFILL_KERNELS_REF_QUANT_REF_H_
#define SNAPFILL_KERNELS_REF_QUANT_REF_H_

#include <cstddef>
#include <cstdint>

#include "kernels/quant_blocks.h"
#include "snapfill/dtype.h"

namespace snapfill::ref {

// ---- Dequantization: y[0..k) from one row of k elements. k must be a
// multiple of the type's block size. Products are f32 in ggml's order; where
// ggml writes a*b + c we use fmaf so that every kernel rounds identically.
void DequantizeRowF32(const float* x, float* y, int64_t k);
void DequantizeRowF16(const uint16_t* x, float* y, int64_t k);
void DequantizeRowBF16(const uint16_t* x, float* y, int64_t k);
void DequantizeRowQ4_0(const BlockQ4_0* x, float* y, int64_t k);  // (q - 8) * d
void DequantizeRowQ4_1(const BlockQ4_1* x, float* y, int64_t k);  // fmaf(q, d, m)
void DequantizeRowQ5_0(const BlockQ5_0* x, float* y, int64_t k);  // (q - 16) * d
void DequantizeRowQ5_1(const BlockQ5_1* x, float* y, int64_t k);  // fmaf(q, d, m)
void DequantizeRowQ8_0(const BlockQ8_0* x, float* y, int64_t k);  // q * d
void DequantizeRowQ4_K(const BlockQ4_K* x, float* y, int64_t k);  // fmaf(d*sc, q, -(dmin*m))
void DequantizeRowQ5_K(const BlockQ5_K* x, float* y, int64_t k);  // fmaf(d*sc, q, -(dmin*m))
void DequantizeRowQ6_K(const BlockQ6_K* x, float* y, int64_t k);  // (d*sc) * (q - 32)
void DequantizeRowQ8_1(const BlockQ8_1* x, float* y, int64_t k);  // q * d
void DequantizeRowQ8_K(const BlockQ8_K* x, float* y, int64_t k);  // q * d

// Dispatches on `type` (the 11 weight types of IsSupportedWeightType plus
// Q8_1/Q8_K). Returns false, writing nothing, for any other type.
bool DequantizeRow(GgmlType type, const void* x, float* y, int64_t k);

// ---- Activation quantizers (exactly ggml's quantize_row_*_ref).
// Q8_0: d = amax / 127, q = roundf(x * (1/d)) (ties away from zero).
void QuantizeRowQ8_0(const float* x, BlockQ8_0* y, int64_t k);
// Q8_1: as Q8_0, plus s = fp16(d * Σq) with the unrounded f32 d.
void QuantizeRowQ8_1(const float* x, BlockQ8_1* y, int64_t k);
// Q8_K: iscale = -127 / x_maxabs (signed), q = min(127, nearest_int(iscale*x))
// (ties to even), d = 1 / iscale (f32), bsums per 16.
void QuantizeRowQ8_K(const float* x, BlockQ8_K* y, int64_t k);

// ---- Weight quantizers for making test data.
// Q4_0 (ggml): d = max / -8 where max is the signed value of largest |x|,
// q = min(15, (int8)(x / d + 8.5)).
void QuantizeRowQ4_0(const float* x, BlockQ4_0* y, int64_t k);
// Q4_1 (ggml): d = (max - min) / 15, m = min, q = min(15, (int8)((x - min) / d + 0.5)).
void QuantizeRowQ4_1(const float* x, BlockQ4_1* y, int64_t k);
// Simple Q4_K (not ggml's iterative search): the 6-bit mins are rounded up and
// the 6-bit scales chosen so that [-dmin*m, -dmin*m + 15*d*sc] covers every
// sub-block, hence nothing clamps. Budget: |x - x̂| <= d*sc/2 per element
// (+ f32 rounding), where d*sc is the decoded sub-block step.
void QuantizeRowQ4_K(const float* x, BlockQ4_K* y, int64_t k);
// Q5_K the same way with 32 levels (the fifth bit in qh).
void QuantizeRowQ5_K(const float* x, BlockQ5_K* y, int64_t k);
// Q5_0 / Q5_1 (ggml's): d = max / -16, q = min(31, (int8)(x / d + 16.5));
// d = (max - min) / 31, m = min, q = min(31, (uint8)((x - min) / d + 0.5)).
void QuantizeRowQ5_0(const float* x, BlockQ5_0* y, int64_t k);
void QuantizeRowQ5_1(const float* x, BlockQ5_1* y, int64_t k);
// Simple Q6_K: per 16-group step s_g = amax_g / 31.5 (so q - 32 spans
// -32..31 with no clamping beyond half a step), d = max s_g / 127 and
// sc = ceil(s_g / d). Budget: |x - x̂| <= d*sc/2 per element (+ rounding).
void QuantizeRowQ6_K(const float* x, BlockQ6_K* y, int64_t k);

// Writes one row of `type` from f32 (tests and benchmarks make weights with
// it): F32 copied, F16/BF16 rounded to nearest even, the quantized types by
// the quantizers above. Returns false, writing nothing, for any other type.
bool QuantizeRow(GgmlType type, const float* x, void* y, int64_t k);

// ---- Matrix products. Shapes and strides as cpu::MatMul:
//   x: [m, k] f32 (row stride x_stride), w: n rows of `w_type`, row j at
//   w + j * w_row_bytes, y: [m, n] (row stride y_stride).
// Y[i, j] = Σ_t X[i, t] · dequant(W)[j, t], accumulated in double.
// Returns false for a type DequantizeRow does not accept.
bool MatMul(const float* x, int64_t m, int64_t k, int64_t x_stride, const void* w,
            GgmlType w_type, int64_t n, size_t w_row_bytes, float* y, int64_t y_stride);

// ggml's quantized product: each X row is quantized to the partner format
// (Q8_0 for Q4_0/Q8_0, Q8_1 for Q4_1, Q8_K for Q4_K/Q6_K); each block's dot
// is an exact integer; block terms are scaled and summed in double:
//   Q4_0: Σ_b dw·dx·Σ(q-8)·qx            Q8_0: Σ_b dw·dx·Σ qw·qx
//   Q4_1: Σ_b dw·dx·Σ q·qx + mw·sx
//   Q4_K: Σ_B d·dx·Σ_j sc_j·Σ q·qx − dmin·dx·Σ_j m_j·(bsum_2j + bsum_2j+1)
//   Q6_K: Σ_B d·dx·Σ_g sc_g·Σ (q-32)·qx
// Float types (F32/F16/BF16) are not quantized: as MatMul; nor are
// Q5_1/Q5_K, whose rows the CPU kernels dequantize to f32 and multiply
// with f32 FMA (cpu::MatMul's token blocks on AMX-BF16 aside). Q5_0 takes
// Q8_0 activations, as ggml's (cpu::MatMul's batches of 4 tokens and more;
// fewer take the f32 rows: ref::MatMul's arithmetic).
// If abs_terms is not null it receives (same layout as y) the sum of the
// magnitudes of the terms, with every integer dot split as a fast kernel may
// split it (|dw·dx|·(Σ|q·qx| + offset·|Σqx|) plus |correction|), the scale for
// summation-order tolerances. Returns false for an unsupported type.
bool MatMulQuantizedActivations(const float* x, int64_t m, int64_t k, int64_t x_stride,
                                const void* w, GgmlType w_type, int64_t n, size_t w_row_bytes,
                                float* y, int64_t y_stride, double* abs_terms = nullptr);

// The AMX-BF16 product: X and the dequantized W (DequantizeRow's f32 values)
// each rounded by Fp32ToBf16Rne (vcvtneps2bf16: nearest even, subnormals to
// zero), their exact products summed in double. abs_terms, if not null,
// receives Σ|products| ([m, n], row stride n). Returns false for an
// unsupported type.
bool MatMulBf16(const float* x, int64_t m, int64_t k, int64_t x_stride, const void* w, GgmlType w_type,
                int64_t n, size_t w_row_bytes, float* y, int64_t y_stride, double* abs_terms = nullptr);

// Returns the partner activation format of a weight type (kQ8_0, kQ8_1,
// kQ8_K), or kF32 for float weights (not quantized).
GgmlType ActivationType(GgmlType w_type);

// ---- The decode layout of kernels/quant_blocks.h (cpu::PackForDecode).
// Writes the n rows of a Q4_0 / Q4_1 / Q5_0 / Q8_0 matrix in the decode layout back
// as ggml rows (row j at rows + j * row_bytes; bytes past RowBytes are left
// alone). Returns false for a type the layout does not cover.
bool UnpackDecodeLayout(const void* packed, GgmlType type, int64_t n, int64_t k, void* rows, size_t row_bytes);
// The scalar twin of cpu::MatMulDecodePacked: one token x[0, k) times the
// packed matrix, by reading the layout back into ggml rows and taking
// MatMulQuantizedActivations' arithmetic (so a correct packing gives its
// result bit for bit). abs_terms as there.
bool MatMulDecodePacked(const float* x, int64_t k, const void* packed, GgmlType type, int64_t n, float* y,
                        double* abs_terms = nullptr);

}  // namespace snapfill::ref

#endif  // SNAPFILL_KERNELS_REF_QUANT_REF_H_
