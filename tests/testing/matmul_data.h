// Test data for the matrix-product tests (tests/kernels/matmul*_test.cc):
// random weights quantized with the ref quantizers, and activations shaped
// like a normed hidden state.
#ifndef SNAPFILL_TESTS_TESTING_MATMUL_DATA_H_
#define SNAPFILL_TESTS_TESTING_MATMUL_DATA_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "snapfill/backend.h"
#include "snapfill/dtype.h"

namespace snapfill::testing {

// Weights of shape [n, k]: row j is N(0, (0.02 · (1 + j % 7))²) plus `shift`
// on every third row (so Q4_1's mins and Q4_0's offsets matter), quantized
// with ref::QuantizeRow; rows are `row_bytes` apart (>= RowBytes, to test
// padded strides), padding bytes 0xEE.
std::vector<uint8_t> QuantizedWeights(GgmlType type, int64_t n, int64_t k, size_t row_bytes, uint32_t seed,
                                      float shift);

// `bytes` (as QuantizedWeights makes them) as an [n, k] matrix of `type`.
WeightView ViewOf(const std::vector<uint8_t>& bytes, GgmlType type, int64_t n, int64_t k, size_t row_bytes);

// Activations [m, k] with row stride `stride`: N(0, 1) with outlier features
// (every 97th, x20) and an all-zero first block on every 5th row; the stride
// padding is NaN (it must not be read).
std::vector<float> HiddenStates(int64_t m, int64_t k, int64_t stride, uint32_t seed);

// Runs cpu::MatMul(x [m, k] contiguous, w [n rows of `type`], y [m, n]) with
// one OpenMP thread and then two; true if the two results are bit-identical.
bool MatMulSameOnOneAndTwoThreads(const float* x, int64_t m, int64_t k, const uint8_t* w, GgmlType type,
                                  int64_t n, size_t row_bytes);

}  // namespace snapfill::testing

#endif  // SNAPFILL_TESTS_TESTING_MATMUL_DATA_H_
