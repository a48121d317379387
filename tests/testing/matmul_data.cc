#include "tests/testing/matmul_data.h"

#include <omp.h>

#include <cmath>
#include <cstring>
#include <random>

#include "kernels/cpu/matmul.h"
#include "kernels/ref/quant_ref.h"

namespace snapfill::testing {

std::vector<uint8_t> QuantizedWeights(GgmlType type, int64_t n, int64_t k, size_t row_bytes, uint32_t seed,
                                      float shift) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<uint8_t> w(n * row_bytes, 0xEE);
  std::vector<float> row(k);
  for (int64_t j = 0; j < n; ++j) {
    const float scale = 0.02f * (1 + j % 7);
    for (int64_t i = 0; i < k; ++i) row[i] = scale * nd(rng) + (j % 3 == 0 ? shift : 0.0f);
    ref::QuantizeRow(type, row.data(), w.data() + j * row_bytes, k);
  }
  return w;
}

WeightView ViewOf(const std::vector<uint8_t>& bytes, GgmlType type, int64_t n, int64_t k, size_t row_bytes) {
  WeightView w;
  w.data = bytes.data();
  w.type = type;
  w.rows = n;
  w.cols = k;
  w.row_bytes = row_bytes;
  return w;
}

std::vector<float> HiddenStates(int64_t m, int64_t k, int64_t stride, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(m * stride, std::nanf(""));
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t t = 0; t < k; ++t) x[i * stride + t] = nd(rng) * (t % 97 == 5 ? 20.0f : 1.0f);
    if (i % 5 == 2 && k >= 32) {
      for (int t = 0; t < 32; ++t) x[i * stride + t] = 0.0f;
    }
  }
  return x;
}

bool MatMulSameOnOneAndTwoThreads(const float* x, int64_t m, int64_t k, const uint8_t* w, GgmlType type,
                                  int64_t n, size_t row_bytes) {
  std::vector<float> y1(m * n), y2(m * n);
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  cpu::MatMul(x, m, k, k, w, type, n, row_bytes, y1.data(), n);
  omp_set_num_threads(2);
  cpu::MatMul(x, m, k, k, w, type, n, row_bytes, y2.data(), n);
  omp_set_num_threads(saved);
  return std::memcmp(y1.data(), y2.data(), y1.size() * sizeof(float)) == 0;
}

}  // namespace snapfill::testing
