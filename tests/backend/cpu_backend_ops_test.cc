// The CPU backend's selection ops against their scalar twins, its checks of
// their arguments, and the kernels' process-wide choices it makes
// (ConfigureCpuKernels).
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_variants.h"
#include "kernels/cpu/kernel_config.h"
#include "kernels/ref/ops_ref.h"
#include "snapfill/backend.h"
#include "tests/testing/ref_backend.h"

namespace snapfill {
namespace {

std::vector<float> Votes(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> unif(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = unif(rng);
  // Ties, which the top-k breaks towards the lower position.
  for (int64_t i = 0; i + 7 < n; i += 7) v[i + 7] = v[i];
  return v;
}

TEST(CpuBackendOps, PoolAndTopKMatchTheTwins) {
  Backend& b = testing::SharedCpuBackend();
  for (int64_t n : {1, 5, 33, 1000}) {
    const std::vector<float> votes = Votes(n, static_cast<uint32_t>(n));
    for (int64_t kernel : {1, 3, 7}) {
      for (Backend::PoolOp op : {Backend::PoolOp::kAvg, Backend::PoolOp::kMax}) {
        std::vector<float> got(n), want(n);
        ASSERT_TRUE(b.Pool1d(votes.data(), got.data(), n, kernel, op).ok());
        if (kernel <= 1) {
          want = votes;
        } else if (op == Backend::PoolOp::kAvg) {
          ref::AvgPool1d(votes.data(), want.data(), n, kernel);
        } else {
          ref::MaxPool1d(votes.data(), want.data(), n, kernel);
        }
        for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(got[i], want[i], 1e-6f) << n << " " << kernel << " " << i;
      }
    }
    for (int64_t k : {int64_t{0}, int64_t{1}, n / 2, n}) {
      std::vector<int32_t> got(k), want(k);
      ASSERT_TRUE(b.TopK(votes.data(), n, k, got.data()).ok());
      ref::TopKIndices(votes.data(), n, k, want.data());
      EXPECT_EQ(got, want) << n << " " << k;
    }
  }
}

// RopeHeads (the base class's loop over the heads): each head's run as
// Rope of that head alone, with shared and with per-head positions.
TEST(CpuBackendOps, RopeHeadsRotatesEachHeadsRun) {
  Backend& b = testing::SharedCpuBackend();
  const int64_t heads = 3, tokens = 21, hd = 16, head_stride = 30 * hd;
  for (int64_t pos_stride : {0, 30}) {
    std::mt19937 rng(static_cast<uint32_t>(pos_stride));
    std::normal_distribution<float> normal;
    std::vector<float> x(heads * head_stride), want;
    for (float& v : x) v = normal(rng);
    want = x;
    std::vector<int32_t> pos(heads * 30);
    for (size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<int32_t>(5 * i + 1);
    ASSERT_TRUE(b.RopeHeads(x.data(), heads, head_stride, tokens, hd, pos.data(), pos_stride, hd, 10000.0f, 1.0f,
                            false)
                    .ok());
    for (int64_t h = 0; h < heads; ++h) {
      ASSERT_TRUE(b.Rope(want.data() + h * head_stride, tokens, 1, hd, hd, pos.data() + h * pos_stride, hd, 10000.0f,
                         1.0f, false)
                      .ok());
    }
    EXPECT_EQ(x, want) << pos_stride;
  }
}

TEST(CpuBackendOps, BadArgumentsAreRefused) {
  Backend& b = testing::SharedCpuBackend();
  std::vector<float> v(8, 1.0f), out(8);
  std::vector<int32_t> pos(9);
  EXPECT_EQ(b.Pool1d(v.data(), out.data(), 8, 4, Backend::PoolOp::kAvg).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(b.TopK(v.data(), 8, 9, pos.data()).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(b.TopK(v.data(), 8, -1, pos.data()).code(), absl::StatusCode::kInvalidArgument);
}

// The kernels decide once: before, a backend's choices are taken; after,
// the same choices (or none) are, and others are refused, naming what runs.
TEST(CpuBackendOps, KernelChoicesHoldForTheProcess) {
  BackendOptions bogus;
  bogus.kernel_level = "avx1024";
  EXPECT_EQ(ConfigureCpuKernels(bogus).code(), absl::StatusCode::kInvalidArgument);
  const cpu::CpuLevel active = cpu::ActiveCpuLevel();  // decided from here on
  BackendOptions same;
  same.kernel_level = cpu::CpuLevelName(active);
  EXPECT_TRUE(ConfigureCpuKernels(same).ok());
  EXPECT_TRUE(ConfigureCpuKernels(BackendOptions{}).ok());
  if (active != cpu::CpuLevel::kGeneric) {
    BackendOptions lower;
    lower.kernel_level = "generic";
    const absl::Status s = ConfigureCpuKernels(lower);
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_NE(std::string(s.message()).find("cannot change now"), std::string::npos) << s;
  }
  BackendOptions other_waits;
  other_waits.thread_waits = cpu::ActiveKernelConfig().passive_waits ? BackendOptions::Waits::kSpin
                                                                     : BackendOptions::Waits::kPassive;
  EXPECT_EQ(ConfigureCpuKernels(other_waits).code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace snapfill
