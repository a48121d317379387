// --kernels and the record a checkpoint keeps of the kernels: what a value
// asks the backend for, and which prefill attention a record names (a
// resumed run asks for that one again).
#include <string>

#include "gtest/gtest.h"
#include "tools/cli/common.h"

namespace snapfill::cli {
namespace {

TEST(KernelsFlag, ValuesMapToTheBackendsChoice) {
  auto both = [](const std::string& v) {
    const absl::StatusOr<KernelsChoice> c = KernelsFromFlag(v);
    EXPECT_TRUE(c.ok()) << v << ": " << c.status();
    return c.ok() ? c->attention + "|" + c->products : std::string("error");
  };
  EXPECT_EQ(both("auto"), "measure|measure");
  EXPECT_EQ(both("flags"), "|");
  EXPECT_EQ(both("attention=f32"), "f32|measure");
  EXPECT_EQ(both("attention=avx512-bf16"), "avx512-bf16|measure");
  EXPECT_EQ(both("attention=amx-bf16"), "amx-bf16|measure");
  EXPECT_EQ(both("products=avx2"), "measure|avx2");
  EXPECT_EQ(both("products=amx-int8,attention=f32"), "f32|amx-int8");
  EXPECT_EQ(both("attention=auto,products=auto"), "auto|auto");
  for (const char* bad : {"", "fast", "attention=", "attention=f16", "matmul=f32", "products=avx1024",
                          "attention=f32,", "attention=f32,attention=amx-bf16", "products=avx2;attention=f32"}) {
    const absl::StatusOr<KernelsChoice> r = KernelsFromFlag(bad);
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
  EXPECT_EQ(ProductsFromKernelsRecord("x86-64 avx512 (of avx512): products avx512-vnni, prefill attention f32"),
            "avx512-vnni");
  EXPECT_EQ(ProductsFromKernelsRecord("x86-64 avx2 (of avx2): products avx2, prefill attention f32"), "avx2");
  EXPECT_EQ(ProductsFromKernelsRecord("x86-64 avx512, exact (f32 activations)"), "");
}

}  // namespace
}  // namespace snapfill::cli
