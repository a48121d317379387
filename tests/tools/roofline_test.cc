// The profile's work against the machine's peaks (tools/cli/roofline.h):
// the floor puts each kind of op at the peak of the instruction it runs on
// and adds them up; what was not measured gives no floor rather than a
// wrong one; the lines say which instruction each share is of.
#include "tools/cli/roofline.h"

#include <string>

#include "gtest/gtest.h"

namespace snapfill::cli {
namespace {

BackendProfile::Peaks Avx2Peaks() {
  BackendProfile::Peaks p;
  p.threads = 2;
  p.int8_products = {"vpmaddubsw ymm", 400e9};
  p.f32 = {"vfmadd231ps ymm", 200e9};
  p.prefill_attention = p.f32;
  return p;
}

Work SomeWork() {
  Work w;
  w.matmul_ops = 800e9;
  w.int8_matmul_ops = 800e9;
  w.attention_ops = 300e9;
  w.window_ops = 20e9;
  w.matmul_seconds = 4;
  w.attention_seconds = 3;
  w.window_seconds = 0.5;
  return w;
}

TEST(RooflineTest, WorkFromTheProfilesPairs) {
  const Work w = WorkFromProfile({{"matmul", 4}, {"rms_norm", 1}, {"attention", 3}, {"window_scores", 0.5}},
                                 {{"matmul", 800e9}, {"rms_norm", 0}, {"attention", 300e9}, {"window_scores", 20e9}},
                                 900e9);
  EXPECT_EQ(w.matmul_ops, 800e9);
  EXPECT_EQ(w.int8_matmul_ops, 800e9);  // never more than all the products
  EXPECT_EQ(w.attention_ops, 300e9);
  EXPECT_EQ(w.window_ops, 20e9);
  EXPECT_EQ(w.matmul_seconds, 4);
  EXPECT_EQ(w.attention_seconds, 3);
  EXPECT_EQ(w.window_seconds, 0.5);
}

TEST(RooflineTest, FloorPutsEachOpAtItsInstructionsPeak) {
  const BackendProfile::Peaks p = Avx2Peaks();
  Work w = SomeWork();
  // 800 G int8 ops at 400 G/s, 300 G at 200 G/s, 20 G at 200 G/s.
  EXPECT_DOUBLE_EQ(FloorSeconds(w, p), 2.0 + 1.5 + 0.1);
  // Half the products on a float type: those at the f32 peak.
  w.int8_matmul_ops = 400e9;
  EXPECT_DOUBLE_EQ(FloorSeconds(w, p), 1.0 + 2.0 + 1.5 + 0.1);
  // A prefill attention on bf16 dots has its own peak; decode's is f32.
  BackendProfile::Peaks bf16 = p;
  bf16.prefill_attention = {"vdpbf16ps zmm", 600e9};
  w.int8_matmul_ops = 800e9;
  EXPECT_DOUBLE_EQ(FloorSeconds(w, bf16, /*prefill=*/true), 2.0 + 0.5 + 0.1);
  EXPECT_DOUBLE_EQ(FloorSeconds(w, bf16, /*prefill=*/false), 2.0 + 1.5 + 0.1);
}

TEST(RooflineTest, NoFloorWithoutThePeaksTheWorkNeeds) {
  BackendProfile::Peaks amx = Avx2Peaks();
  amx.int8_products = {};  // products on AMX tiles: not measured
  EXPECT_EQ(FloorSeconds(SomeWork(), amx), 0.0);
  // ...unless no product ran on int8 dots.
  Work f32_only = SomeWork();
  f32_only.int8_matmul_ops = 0;
  EXPECT_DOUBLE_EQ(FloorSeconds(f32_only, amx), 4.0 + 1.5 + 0.1);
  EXPECT_EQ(FloorSeconds(SomeWork(), BackendProfile::Peaks{}), 0.0);
  EXPECT_EQ(FloorSeconds(Work{}, BackendProfile::Peaks{}), 0.0);
}

// generate --profile's attention: the prefill kernel's peak where the
// prompt's query-key pairs outnumber the decoding's.
TEST(RooflineTest, GenerateAttentionIsThePromptsWhereItHasMostPairs) {
  EXPECT_TRUE(AttentionMostlyPrefill(0, 562, 1));
  EXPECT_TRUE(AttentionMostlyPrefill(0, 512, 128));  // 131,072 pairs against 73,728
  EXPECT_FALSE(AttentionMostlyPrefill(0, 4, 32));
  EXPECT_FALSE(AttentionMostlyPrefill(0, 100, 200));   // 5,000 against 40,000
  EXPECT_FALSE(AttentionMostlyPrefill(1155, 16, 64));  // a question after a saved cache, then an answer
  EXPECT_TRUE(AttentionMostlyPrefill(1155, 200, 64));
  EXPECT_TRUE(AttentionMostlyPrefill(0, 0, 0));
}

TEST(RooflineTest, LinesNameTheInstructionOfEachShare) {
  const BackendProfile::Peaks p = Avx2Peaks();
  EXPECT_EQ(PeaksLine(p),
            "peaks here (2 threads): int8 products vpmaddubsw ymm 400.0 GOP/s, f32 vfmadd231ps ymm 200.0 GOP/s, "
            "prefill attention on the f32 FMA");
  const std::string s = WorkAgainstPeaks(SomeWork(), p, /*prefill=*/true);
  // 200 GOP/s of products is half the int8 peak; 100 GOP/s of attention half the f32 one.
  EXPECT_NE(s.find("matmul 200.0 GOP/s = 50% of vpmaddubsw ymm"), std::string::npos) << s;
  EXPECT_NE(s.find("attention 100.0 GOP/s = 50% of vfmadd231ps ymm"), std::string::npos) << s;
  EXPECT_NE(s.find("window_scores 40.0 GOP/s = 20% of vfmadd231ps ymm"), std::string::npos) << s;
  EXPECT_NE(s.find("these ops took 7.500 s; at the peaks above they need 3.600 s (48% of the time)"),
            std::string::npos)
      << s;
  // Products of both kinds: no single peak to compare with.
  Work mixed = SomeWork();
  mixed.int8_matmul_ops = 400e9;
  const std::string m = WorkAgainstPeaks(mixed, p, true);
  EXPECT_NE(m.find("matmul 200.0 GOP/s (50% of its ops on int8 types)"), std::string::npos) << m;
  EXPECT_EQ(WorkAgainstPeaks(SomeWork(), BackendProfile::Peaks{}, true), "");
}

}  // namespace
}  // namespace snapfill::cli
