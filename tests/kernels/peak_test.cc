// The peak loops (kernels/cpu/peak.h) against their scalar twin: every
// chain of every instruction this CPU runs ends where ref::PeakChains says,
// bit for bit, so each loop does run its instruction on its operands the
// number of times its rate counts. And the instructions named for the
// products and the attention are those of the active level (ctest runs
// this suite at each lower level too).
#include "kernels/cpu/peak.h"

#include <cstdint>
#include <string>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_variants.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/ops.h"
#include "kernels/ref/peak_ref.h"

namespace snapfill {
namespace {

constexpr PeakInstruction kAll[] = {PeakInstruction::kFmaYmm,    PeakInstruction::kFmaZmm,
                                    PeakInstruction::kMaddubsYmm, PeakInstruction::kDpbusdYmm,
                                    PeakInstruction::kDpbusdZmm,  PeakInstruction::kDpbf16Zmm};

class PeakChainsTest : public ::testing::TestWithParam<PeakInstruction> {};

TEST_P(PeakChainsTest, EqualTheTwinBitForBit) {
  const PeakInstruction instruction = GetParam();
  if (!cpu::PeakSupported(instruction)) GTEST_SKIP() << PeakInstructionName(instruction) << ": not on this CPU";
  // 1 step, a few, and enough for the integer chains to wrap or saturate
  // and the float chains to reach their fixed point.
  for (int64_t steps : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{100003}}) {
    uint32_t got[12], want[12];
    for (uint32_t& g : got) g = 0xDEADBEEF;
    cpu::PeakChains(instruction, steps, got);
    ref::PeakChains(instruction, steps, want);
    for (int c = 0; c < 12; ++c) {
      EXPECT_EQ(got[c], want[c]) << PeakInstructionName(instruction) << ", " << steps << " steps, chain " << c;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Instructions, PeakChainsTest, ::testing::ValuesIn(kAll),
                         [](const ::testing::TestParamInfo<PeakInstruction>& info) {
                           std::string name = PeakInstructionName(info.param);
                           for (char& ch : name) {
                             if (ch == ' ') ch = '_';
                           }
                           return name;
                         });

TEST(PeakTest, TheChainsDoNotStandStill) {
  // A twin equal to the loop only because both did nothing would prove
  // little: after one step every chain has moved, and chains start apart.
  for (PeakInstruction instruction : kAll) {
    uint32_t zero[12], one[12];
    ref::PeakChains(instruction, 0, zero);
    ref::PeakChains(instruction, 1, one);
    for (int c = 0; c < 12; ++c) {
      EXPECT_NE(zero[c], one[c]) << PeakInstructionName(instruction) << " chain " << c;
      if (c > 0) {
        EXPECT_NE(zero[c], zero[c - 1]) << PeakInstructionName(instruction) << " chain " << c;
      }
    }
  }
}

TEST(PeakTest, InstructionsOfTheActiveLevel) {
  const cpu::CpuLevel level = cpu::ActiveCpuLevel();
  const PeakInstruction f32 = cpu::F32Instruction();
  const PeakInstruction int8 = cpu::Int8ProductsInstruction();
  const PeakInstruction attention = cpu::PrefillAttentionInstruction();
  switch (level) {
    case cpu::CpuLevel::kGeneric:
      EXPECT_EQ(f32, PeakInstruction::kNone);
      EXPECT_EQ(int8, PeakInstruction::kNone);
      break;
    case cpu::CpuLevel::kAvx2:
      EXPECT_EQ(f32, PeakInstruction::kFmaYmm);
      EXPECT_EQ(int8, PeakInstruction::kMaddubsYmm);
      break;
    case cpu::CpuLevel::kAvxVnni:
      EXPECT_EQ(f32, PeakInstruction::kFmaYmm);
      EXPECT_EQ(int8, PeakInstruction::kDpbusdYmm);
      break;
    case cpu::CpuLevel::kAvx512:
      EXPECT_EQ(f32, PeakInstruction::kFmaZmm);
      EXPECT_EQ(int8, cpu::MatMulHasAmx() ? PeakInstruction::kNone : PeakInstruction::kDpbusdZmm);
      break;
  }
  if (cpu::AttentionHasAmx()) {
    EXPECT_EQ(attention, PeakInstruction::kNone);
  } else if (cpu::AttentionHasAvx512Bf16()) {
    EXPECT_EQ(attention, PeakInstruction::kDpbf16Zmm);
  } else {
    EXPECT_EQ(attention, f32);
  }
  // Whatever is named runs here, so its peak can be measured.
  for (PeakInstruction p : {f32, int8, attention}) {
    if (p != PeakInstruction::kNone) {
      EXPECT_TRUE(cpu::PeakSupported(p)) << PeakInstructionName(p);
    }
  }
}

TEST(PeakTest, NothingToMeasureIsZero) {
  EXPECT_EQ(cpu::MeasurePeak(PeakInstruction::kNone, 1, 0.001, 1), 0.0);
  for (PeakInstruction instruction : kAll) {
    if (!cpu::PeakSupported(instruction)) {
      EXPECT_EQ(cpu::MeasurePeak(instruction, 1, 0.001, 1), 0.0);
    }
  }
  EXPECT_EQ(PeakOpsPerInstruction(PeakInstruction::kNone), 0.0);
  EXPECT_STREQ(PeakInstructionName(PeakInstruction::kNone), "");
}

}  // namespace
}  // namespace snapfill
