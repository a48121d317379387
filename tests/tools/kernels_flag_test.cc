// --kernels and the record a checkpoint keeps of the kernels: what a value
// asks the backend for, and which prefill attention a record names (a
// resumed run asks for that one again).
#include <string>

#include "gtest/gtest.h"
#include "tools/cli/common.h"

namespace snapfill::cli {
namespace {

TEST(KernelsFlag, ValuesMapToTheBackendsChoice) {
  EXPECT_EQ(*AttentionKernelFromFlag("auto"), "measure");
  EXPECT_EQ(*AttentionKernelFromFlag("flags"), "");
  EXPECT_EQ(*AttentionKernelFromFlag("attention=f32"), "f32");
  EXPECT_EQ(*AttentionKernelFromFlag("attention=avx512-bf16"), "avx512-bf16");
  EXPECT_EQ(*AttentionKernelFromFlag("attention=amx-bf16"), "amx-bf16");
  for (const char* bad : {"", "fast", "attention=", "attention=f16", "matmul=f32"}) {
    const absl::StatusOr<std::string> r = AttentionKernelFromFlag(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("--kernels="), absl::string_view::npos);
  }
}

TEST(KernelsFlag, TheRecordNamesTheAttention) {
  EXPECT_EQ(AttentionFromKernelsRecord("x86-64 avx512 (of avx512): products avx512-vnni, prefill attention f32, "
                                       "decode layout yes, decode KV fp16"),
            "f32");
  EXPECT_EQ(AttentionFromKernelsRecord("x86-64 avx512 (of avx512): products amx-int8, prefill attention amx-bf16, "
                                       "decode layout yes"),
            "amx-bf16");
  EXPECT_EQ(AttentionFromKernelsRecord("... prefill attention avx512-bf16"), "avx512-bf16");
  // Exact backends, GPUs and files older than the record: none.
  EXPECT_EQ(AttentionFromKernelsRecord("x86-64 avx512, exact (f32 activations)"), "");
  EXPECT_EQ(AttentionFromKernelsRecord(""), "");
}

}  // namespace
}  // namespace snapfill::cli
