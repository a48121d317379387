// make_tiny_gguf, the tool that writes random-weight Llama GGUF files for
// benchmarks and peers: --type / --down_type give the matrices llama.cpp's
// types (a Q4_K_M-like file: Q4_K with a Q6_K ffn_down), the file loads and
// decodes with snapfill, and bad flags are refused by name without touching
// an existing file.
#include <sys/wait.h>

#include <cstdlib>
#include <string>

#include "gtest/gtest.h"
#include "src/gguf/gguf_reader.h"
#include "tests/testing/cli_fixture.h"
#include "tests/testing/files.h"

namespace snapfill {
namespace {

class MakeTinyGgufTest : public testing::CliTest {
 protected:
  // Runs make_tiny_gguf with `args`; stderr in *err.
  int MakeTiny(const std::string& args, std::string* err) {
    const std::string err_path = dir_ + "/make_err";
    const std::string cmd = std::string(SNAPFILL_BINARY_DIR) + "/bin/make_tiny_gguf " + args + " >/dev/null 2>" +
                            err_path + " </dev/null";
    const int status = std::system(cmd.c_str());
    *err = testing::ReadAll(err_path);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  // K-quant widths (multiples of 256), two layers.
  const std::string shape_ = " --dim 256 --ffn 512 --heads 4 --kv_heads 2 --layers 2";
};

TEST_F(MakeTinyGgufTest, MixedK4FileHasTheTypesAndDecodes) {
  const std::string path = dir_ + "/q4km.gguf";
  std::string err;
  ASSERT_EQ(MakeTiny("--out " + path + shape_ + " --type Q4_K --down_type Q6_K", &err), 0) << err;
  auto file = GgufFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  for (const char* name : {"blk.0.attn_q.weight", "blk.1.attn_output.weight", "blk.1.ffn_gate.weight",
                           "blk.0.ffn_up.weight"}) {
    const GgufTensorInfo* t = (*file)->FindTensor(name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_EQ(t->type, GgmlType::kQ4_K) << name;
  }
  for (const char* name : {"blk.0.ffn_down.weight", "blk.1.ffn_down.weight"}) {
    const GgufTensorInfo* t = (*file)->FindTensor(name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_EQ(t->type, GgmlType::kQ6_K) << name;
  }
  auto ftype = (*file)->GetUint("general.file_type");
  ASSERT_TRUE(ftype.ok());
  EXPECT_EQ(*ftype, 15u) << "llama.cpp's LLAMA_FTYPE_MOSTLY_Q4_K_M";
  // One token at a time through the Q4_K and Q6_K matrices.
  testing::Result r = Run("generate --model " + path + " --prompt hello -n 6 --chat_template none");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("generated 6 tokens"), std::string::npos) << r.err;
}

TEST_F(MakeTinyGgufTest, BadTypesAreRefusedByName) {
  const std::string path = dir_ + "/keep.gguf";
  testing::WriteRaw(path, "the user's file");
  std::string err;
  EXPECT_EQ(MakeTiny("--out " + dir_ + "/a.gguf" + shape_ + " --type Q4_X", &err), 2);
  EXPECT_NE(err.find("--type=Q4_X"), std::string::npos) << err;
  EXPECT_EQ(MakeTiny("--out " + dir_ + "/a.gguf" + shape_ + " --type Q4_K --down_type nope", &err), 2);
  EXPECT_NE(err.find("--down_type=nope"), std::string::npos) << err;
  EXPECT_EQ(MakeTiny("--out " + dir_ + "/a.gguf" + shape_ + " --f16 --type Q8_0", &err), 2);
  EXPECT_NE(err.find("--f16"), std::string::npos) << err;
  // A width that is no multiple of the K-quants' 256: refused, naming it.
  EXPECT_EQ(MakeTiny("--out " + dir_ + "/a.gguf --dim 64 --ffn 512 --heads 4 --kv_heads 2 --type Q4_K", &err), 2);
  EXPECT_NE(err.find("rows of 64 elements"), std::string::npos) << err;
  // An existing file is not overwritten without --force.
  EXPECT_NE(MakeTiny("--out " + path + shape_ + " --type Q4_K", &err), 0);
  EXPECT_NE(err.find("exists"), std::string::npos) << err;
  EXPECT_EQ(testing::ReadAll(path), "the user's file");
}

// --preset sets a real model's shape; each shape flag given explicitly wins.
TEST_F(MakeTinyGgufTest, PresetIsAppliedAndOverridable) {
  std::string err;
  // smollm2-135m with one layer instead of 30, on the fast generator.
  const std::string small = dir_ + "/smollm2.gguf";
  ASSERT_EQ(MakeTiny("--out " + small + " --preset smollm2-135m --layers 1 --type Q8_0 --fast_weights --threads 2",
                     &err), 0) << err;
  auto file = GgufFile::Open(small);
  ASSERT_TRUE(file.ok()) << file.status();
  auto u = [&](const char* key) { return (*file)->GetUint(key).value(); };
  EXPECT_EQ(u("llama.block_count"), 1u);
  EXPECT_EQ(u("llama.embedding_length"), 576u);
  EXPECT_EQ(u("llama.attention.head_count"), 9u);
  EXPECT_EQ(u("llama.attention.head_count_kv"), 3u);
  EXPECT_EQ(u("llama.feed_forward_length"), 1536u);
  EXPECT_EQ(u("llama.context_length"), 8192u);
  EXPECT_EQ((*file)->FindTensor("output.weight"), nullptr) << "smollm2-135m ties its embeddings";
  EXPECT_EQ((*file)->FindTensor("blk.0.attn_q.weight")->type, GgmlType::kQ8_0);
  // llama2-7b shrunk by explicit flags: its untied output and context stay.
  const std::string big = dir_ + "/llama2.gguf";
  ASSERT_EQ(MakeTiny("--out " + big + " --preset llama2-7b --layers 2 --dim 256 --heads 4 --kv_heads 4 --ffn 512 "
                     "--type Q4_0 --context 2048",
                     &err), 0) << err;
  file = GgufFile::Open(big);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(u("llama.block_count"), 2u);
  EXPECT_EQ(u("llama.embedding_length"), 256u);
  EXPECT_EQ(u("llama.attention.head_count"), 4u);
  EXPECT_EQ(u("llama.attention.head_count_kv"), 4u);
  EXPECT_EQ(u("llama.feed_forward_length"), 512u);
  EXPECT_EQ(u("llama.context_length"), 2048u);
  ASSERT_NE((*file)->FindTensor("output.weight"), nullptr) << "llama2-7b is untied";
  EXPECT_EQ((*file)->FindTensor("output.weight")->type, GgmlType::kQ4_0);
  // --notie_embeddings given explicitly beats the preset's tie.
  const std::string untied = dir_ + "/untied.gguf";
  ASSERT_EQ(MakeTiny("--out " + untied + " --preset smollm2-135m --layers 1 --dim 64 --heads 2 --kv_heads 1 --ffn 128 "
                     "--notie_embeddings",
                     &err), 0) << err;
  file = GgufFile::Open(untied);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_NE((*file)->FindTensor("output.weight"), nullptr);
  EXPECT_EQ(u("llama.context_length"), 8192u);
  // Without a preset the defaults stand as before.
  const std::string plain = dir_ + "/plain.gguf";
  ASSERT_EQ(MakeTiny("--out " + plain, &err), 0) << err;
  file = GgufFile::Open(plain);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(u("llama.block_count"), 2u);
  EXPECT_EQ(u("llama.embedding_length"), 64u);
}

TEST_F(MakeTinyGgufTest, FastWeightsAreTheSameForAnyThreadCount) {
  std::string err;
  const std::string a = dir_ + "/t1.gguf", b = dir_ + "/t3.gguf";
  const std::string args = shape_ + " --type Q8_0 --fast_weights --seed 9";
  ASSERT_EQ(MakeTiny("--out " + a + args + " --threads 1", &err), 0) << err;
  ASSERT_EQ(MakeTiny("--out " + b + args + " --threads 3", &err), 0) << err;
  const std::string bytes = testing::ReadAll(a);
  EXPECT_GT(bytes.size(), 1000u);
  EXPECT_TRUE(bytes == testing::ReadAll(b));
  EXPECT_EQ(MakeTiny("--out " + b + args + " --threads -1 --force", &err), 2);
  EXPECT_NE(err.find("num_threads"), std::string::npos) << err;
}

TEST_F(MakeTinyGgufTest, UnknownPresetIsRefusedListingTheKnownOnes) {
  std::string err;
  const std::string path = dir_ + "/p.gguf";
  EXPECT_EQ(MakeTiny("--out " + path + " --preset llama3-8b", &err), 2);
  EXPECT_NE(err.find("llama3-8b"), std::string::npos) << err;
  EXPECT_NE(err.find("smollm2-135m"), std::string::npos) << err;
  EXPECT_NE(err.find("llama2-7b"), std::string::npos) << err;
  EXPECT_FALSE(testing::ReadAll(path).size() > 0);
}

}  // namespace
}  // namespace snapfill
