// The CPU backend's selection ops against their scalar twins, its checks of
// their arguments, and the kernels' process-wide choices it makes
// (ConfigureCpuKernels).
#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_variants.h"
#include "kernels/cpu/kernel_config.h"
#include "kernels/cpu/ops.h"
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
    ASSERT_TRUE(b.RopeHeads(x.data(), heads, head_stride, tokens, hd, pos.data(), pos_stride,
                            RopeSpec{hd, 10000.0f, 1.0f, false})
                    .ok());
    for (int64_t h = 0; h < heads; ++h) {
      ASSERT_TRUE(b.Rope(want.data() + h * head_stride, tokens, 1, hd, hd, pos.data() + h * pos_stride,
                         RopeSpec{hd, 10000.0f, 1.0f, false})
                      .ok());
    }
    EXPECT_EQ(x, want) << pos_stride;
  }
}

// The prefill attention's implementation: by measurement (the fastest, or
// f32 unless another is more than 10% faster), by name, or refused.
TEST(CpuBackendOps, AttentionIsChosenByMeasurementOrByName) {
  const std::vector<cpu::AttentionImpl> here = cpu::AvailableAttentionImpls();
  ASSERT_FALSE(here.empty());
  EXPECT_EQ(here.front(), cpu::AttentionImpl::kF32);
  const std::vector<cpu::AttentionRate> rates = cpu::MeasureAttentionImpls();
  ASSERT_EQ(rates.size(), here.size());
  for (size_t i = 0; i < rates.size(); ++i) {
    EXPECT_EQ(rates[i].impl, here[i]);
    EXPECT_GT(rates[i].gops, 0.0) << cpu::AttentionImplName(rates[i].impl);
  }
  BackendOptions o;
  o.attention_kernel = "measure";
  ASSERT_TRUE(ConfigureCpuKernels(o).ok());
  const cpu::AttentionImpl chosen = cpu::ActiveAttentionImpl();
  EXPECT_NE(std::find(here.begin(), here.end(), chosen), here.end()) << cpu::AttentionImplName(chosen);
  auto backend = CreateBackend(Device::kCpu, o);
  ASSERT_TRUE(backend.ok());
  // The rates are apart from the record (kernels()), which must not change
  // with timing noise.
  EXPECT_NE((*backend)->kernel_timings().find("prefill attention, GOP/s: f32"), std::string::npos)
      << (*backend)->kernel_timings();
  EXPECT_EQ((*backend)->kernels().find("GOP/s"), std::string::npos) << (*backend)->kernels();
  EXPECT_NE((*backend)->kernels().find(std::string("prefill attention ") + cpu::AttentionImplName(chosen)),
            std::string::npos)
      << (*backend)->kernels();

  o.attention_kernel = "f32";
  ASSERT_TRUE(ConfigureCpuKernels(o).ok());
  EXPECT_EQ(cpu::ActiveAttentionImpl(), cpu::AttentionImpl::kF32);
  EXPECT_FALSE(cpu::AttentionHasAvx512Bf16());
  EXPECT_FALSE(cpu::AttentionHasAmx());
  o.attention_kernel = "avx1024-fp4";
  EXPECT_EQ(ConfigureCpuKernels(o).code(), absl::StatusCode::kInvalidArgument);
  for (const char* name : {"avx512-bf16", "amx-bf16"}) {
    const cpu::AttentionImpl impl = *cpu::AttentionImplFromName(name);
    o.attention_kernel = name;
    const absl::Status s = ConfigureCpuKernels(o);
    if (std::find(here.begin(), here.end(), impl) != here.end()) {
      EXPECT_TRUE(s.ok()) << s;
      EXPECT_EQ(cpu::ActiveAttentionImpl(), impl);
    } else {
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << name;
      EXPECT_NE(s.message().find("it runs: f32"), absl::string_view::npos) << s;
    }
  }
  cpu::SetAttentionImpl(cpu::AttentionImpl::kAuto);  // as the other tests assume
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
