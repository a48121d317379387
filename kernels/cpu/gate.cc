// SmartKV's gate on one head's keys (ops.h: GateScores).
#include <cstdint>

// (One thread: the backend runs the heads on its own; and Eigen's OpenMP
// products inside them would not be src/compress/gate.cc's serial ones.)
#define EIGEN_DONT_PARALLELIZE
#include "Eigen/Core"
#include "kernels/cpu/ops.h"

namespace snapfill::cpu {

void GateScores(const float* params, int64_t head_dim, int64_t hidden, const float* keys, int64_t key_stride, int64_t n,
                float* y) {
  if (n <= 0) return;
  using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  const int64_t d = head_dim, h = hidden;
  const Eigen::Map<const Eigen::RowVectorXf> mean(params, d), inv(params + d, d);
  const Eigen::Map<const RowMatrix> w1(params + 2 * d, h, d);
  const Eigen::Map<const Eigen::RowVectorXf> b1(params + 2 * d + h * d, h);
  const Eigen::Map<const Eigen::VectorXf> w2(params + 2 * d + h * d + h, h);
  const float b2 = params[2 * d + h * d + 2 * h];
  // (The expressions of src/compress/gate.cc's Normalize and PredictGate.)
  Eigen::Map<const RowMatrix, 0, Eigen::OuterStride<>> x(keys, n, d, Eigen::OuterStride<>(key_stride));
  const RowMatrix xn = ((x.rowwise() - mean).array().rowwise() * inv.array()).matrix();
  const RowMatrix a = ((xn * w1.transpose()).rowwise() + b1).cwiseMax(0.0f);
  Eigen::Map<Eigen::VectorXf> out(y, n);
  out = (a * w2).array() + b2;
}

}  // namespace snapfill::cpu
