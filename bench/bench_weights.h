// Random inputs for the product benchmarks. Weights: n rows of k values
// drawn from N(0, 0.05²) (a trained layer's scale), quantized to `type` by the
// scalar reference quantizer. Speed does not depend on the values.
#ifndef SNAPFILL_BENCH_BENCH_WEIGHTS_H_
#define SNAPFILL_BENCH_BENCH_WEIGHTS_H_

#include <cstdint>
#include <random>
#include <vector>

#include "kernels/quant_blocks.h"
#include "kernels/ref/quant_ref.h"

namespace snapfill::bench {

inline std::vector<uint8_t> RandomWeights(GgmlType type, int64_t n, int64_t k) {
  const int64_t row_bytes = RowBytes(type, k);
  std::vector<uint8_t> w(n * row_bytes);
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.0f, 0.05f);
  std::vector<float> row(k);
  for (int64_t j = 0; j < n; ++j) {
    for (auto& v : row) v = nd(rng);
    ref::QuantizeRow(type, row.data(), w.data() + j * row_bytes, k);
  }
  return w;
}

// n activations drawn from N(0, 1), the same for every benchmark.
inline std::vector<float> RandomActivations(int64_t n) {
  std::vector<float> x(n);
  std::mt19937 rng(2);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (auto& v : x) v = nd(rng);
  return x;
}

}  // namespace snapfill::bench

#endif  // SNAPFILL_BENCH_BENCH_WEIGHTS_H_
