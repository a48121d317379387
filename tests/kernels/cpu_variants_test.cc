// The runtime dispatch of the CPU kernels (kernels/cpu/cpu_variants.h): the
// active level is the CPU's, or the one SNAPFILL_CPU names (read by the test
// main as by the snapfill command, tests/testing/test_main.cc), and the public functions
// do reach that level's copy. ctest runs this suite and the other kernel
// suites once more with SNAPFILL_CPU=generic, =avx2 and (where the CPU has
// AVX-VNNI) =avxvnni (tests/CMakeLists.txt), so every copy the dispatcher
// can pick is tested on one machine.
#include "kernels/cpu/cpu_variants.h"

#include <cstdlib>
#include <cstring>
#include <string>

#include "gtest/gtest.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/ops.h"

namespace snapfill::cpu {
namespace {

CpuLevel Expected() {
  const char* env = std::getenv("SNAPFILL_CPU");
  const CpuLevel max = MaxCpuLevel();
  if (env == nullptr) return max;
  for (CpuLevel l : {CpuLevel::kGeneric, CpuLevel::kAvx2, CpuLevel::kAvxVnni, CpuLevel::kAvx512}) {
    if (std::strcmp(env, CpuLevelName(l)) == 0) return l;  // (the test main refuses one the CPU lacks)
  }
  return max;
}

TEST(CpuVariantsTest, LevelsTheCpuSupports) {
  // Every x86-64 runs the portable copy; the maximum is supported, and no
  // level above it in the order of preference is.
  EXPECT_TRUE(CpuSupports(CpuLevel::kGeneric));
  const CpuLevel max = MaxCpuLevel();
  EXPECT_TRUE(CpuSupports(max));
  for (CpuLevel l : {CpuLevel::kAvx2, CpuLevel::kAvxVnni, CpuLevel::kAvx512}) {
    if (static_cast<int>(l) > static_cast<int>(max)) {
      EXPECT_FALSE(CpuSupports(l)) << CpuLevelName(l);
    }
  }
  // AVX-VNNI and AVX-512 both build on AVX2.
  if (CpuSupports(CpuLevel::kAvxVnni) || CpuSupports(CpuLevel::kAvx512)) {
    EXPECT_TRUE(CpuSupports(CpuLevel::kAvx2));
  }
}

TEST(CpuVariantsTest, EnvironmentCapsTheLevel) {
  EXPECT_EQ(ActiveCpuLevel(), Expected()) << "SNAPFILL_CPU=" << (std::getenv("SNAPFILL_CPU") ?: "(unset)")
                                          << ", CPU supports " << CpuLevelName(MaxCpuLevel());
  EXPECT_LE(static_cast<int>(ActiveCpuLevel()), static_cast<int>(MaxCpuLevel()));
  EXPECT_TRUE(CpuSupports(ActiveCpuLevel()));
}

TEST(CpuVariantsTest, CallsReachTheActiveLevelsCopy) {
  const CpuLevel level = ActiveCpuLevel();
  // What each copy reports of itself (compiled in, not asked of the CPU).
  EXPECT_EQ(MatMulHasSimd(), level == CpuLevel::kAvx512);
  EXPECT_EQ(MatMulHasAvx2(), level != CpuLevel::kGeneric);
  EXPECT_EQ(MatMulHasAvxVnni(), level == CpuLevel::kAvxVnni);
  EXPECT_EQ(MatMulHasDecodeLayout(), level != CpuLevel::kGeneric);
  if (level != CpuLevel::kAvx512) {
    EXPECT_FALSE(MatMulHasAmx());
    EXPECT_FALSE(AttentionHasAmx());
    EXPECT_FALSE(AttentionHasAvx512Bf16());
  }
}

TEST(CpuVariantsTest, LevelNames) {
  EXPECT_STREQ(CpuLevelName(CpuLevel::kGeneric), "generic");
  EXPECT_STREQ(CpuLevelName(CpuLevel::kAvx2), "avx2");
  EXPECT_STREQ(CpuLevelName(CpuLevel::kAvxVnni), "avxvnni");
  EXPECT_STREQ(CpuLevelName(CpuLevel::kAvx512), "avx512");
}

}  // namespace
}  // namespace snapfill::cpu
