// The snapfill command on bad input: a clear message naming the problem, a
// non-zero exit (2 for bad usage), never a crash, and no file damaged. Runs
// the built binary on tiny models this test writes (no download).
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "snapfill/status.h"
#include "src/gguf/gguf_reader.h"
#include "src/tokenizer/tokenizer.h"
#include "tools/testmodel/tiny_llama.h"
#include "tests/testing/cli_fixture.h"
#include "tests/testing/files.h"
#include "tests/testing/status_matchers.h"

namespace snapfill {
namespace {

using testing::CliTest;
using testing::Result;

TEST_F(CliTest, TinyModelGenerates) {
  Result r = Run("generate --model " + tiny_ + " --prompt hello -n 5 --chat_template none");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("TTFT"), std::string::npos);
}

TEST_F(CliTest, NotAGgufFile) {
  testing::WriteRaw(dir_ + "/text.gguf", "this is not a model, just some text that is long enough\n");
  EXPECT_FAILS_WITH(Run("info --model " + dir_ + "/text.gguf"), 1, "magic");
}

TEST_F(CliTest, TruncatedFile) {
  testing::WriteRaw(dir_ + "/cut.gguf", tiny_bytes_.substr(0, tiny_bytes_.size() / 2));
  EXPECT_FAILS_WITH(Run("info --model " + dir_ + "/cut.gguf"), 1, "DATA_LOSS");
}

TEST_F(CliTest, TensorDataPastTheEnd) {
  // Drop the last 100 bytes: the last tensor's data now ends past the file.
  testing::WriteRaw(dir_ + "/short.gguf", tiny_bytes_.substr(0, tiny_bytes_.size() - 100));
  Result r = Run("info --model " + dir_ + "/short.gguf");
  EXPECT_FAILS_WITH(r, 1, "but file has");
}

TEST_F(CliTest, AbsurdDimensions) {
  // llama.embedding_length = 64 as a little-endian u32 after its key and type.
  std::string b = tiny_bytes_;
  const std::string key = "llama.embedding_length";
  const size_t at = b.find(key);
  ASSERT_NE(at, std::string::npos);
  const uint32_t huge = 0xFFFFFFF0u;
  std::memcpy(&b[at + key.size() + 4], &huge, 4);
  testing::WriteRaw(dir_ + "/huge.gguf", b);
  EXPECT_FAILS_WITH(Run("info --model " + dir_ + "/huge.gguf"), 2, "embedding_length");
}

TEST_F(CliTest, UnknownArchitecture) {
  // The architecture value is the string "llama" stored right after the key.
  std::string b = tiny_bytes_;
  const std::string key = "general.architecture";
  const size_t at = b.find(key);
  ASSERT_NE(at, std::string::npos);
  // key | u32 type (8 = string) | u64 length 5 | "llama"
  b.replace(at + key.size() + 4 + 8, 5, "qwen9");
  testing::WriteRaw(dir_ + "/qwen9.gguf", b);
  EXPECT_FAILS_WITH(Run("info --model " + dir_ + "/qwen9.gguf"), 1, "architecture \"qwen9\"");
}

TEST_F(CliTest, UnknownTensorType) {
  // blk.0.attn_q.weight | u32 n_dims = 2 | 2 × u64 ne | u32 type
  std::string b = tiny_bytes_;
  const std::string name = "blk.0.attn_q.weight";
  const size_t at = b.find(name);
  ASSERT_NE(at, std::string::npos);
  const uint32_t type = 99;
  std::memcpy(&b[at + name.size() + 4 + 16], &type, 4);
  testing::WriteRaw(dir_ + "/type.gguf", b);
  Result r = Run("info --model " + dir_ + "/type.gguf");
  EXPECT_FAILS_WITH(r, 1, "99");
  EXPECT_NE(r.err.find("UNIMPLEMENTED"), std::string::npos) << r.err;
}

// `info` names a hybrid model's sliding-window layers and counts the KV a
// full context takes with them holding their window only.
TEST_F(CliTest, InfoNamesTheSlidingWindowLayers) {
  Result r = Run("info --model " + testing::SourcePath("tests/data/arch/gemma3.gguf"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("sliding window:  8 positions in 2 of 4 layers (global: 1, 3), RoPE base 10000.0"),
            std::string::npos)
      << r.out;
  // 2 global layers × 1 KV head × 16 dims × K and V × 4 bytes = 256 bytes a
  // token over the 2,048-token context (512 KiB), and 2 windows of 8 (2 KiB).
  EXPECT_NE(r.out.find("KV per token:    256 B (f32, global layers), full 2048-token context: 514.0 KiB"),
            std::string::npos)
      << r.out;
  r = Run("info --model " + tiny_);
  EXPECT_EQ(r.out.find("sliding window:"), std::string::npos) << r.out;
}

// --kernels auto times the attention on the model's own heads and the
// products on its own gate, and keeps the rates in a file named by both, so
// that two models on one machine do not share a choice.
TEST_F(CliTest, KernelTimingsAreKeptPerModelShape) {
  const char* keep = std::getenv("XDG_CACHE_HOME");
  const std::string saved = keep ? keep : "";
  const char* keep_threads = std::getenv("OMP_NUM_THREADS");
  const std::string saved_threads = keep_threads ? keep_threads : "";
  const std::string cache = testing::MakeTempDir("cli_kernel_cache");
  setenv("XDG_CACHE_HOME", cache.c_str(), 1);
  setenv("OMP_NUM_THREADS", "1", 1);
  Result r = Run("info --kernels auto --model " + testing::SourcePath("tests/data/arch/gemma3.gguf"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // 4 heads of 16 on 1 KV head; its feed-forward gate F32, 32 columns × 64 rows.
  const std::string file = cache + "/snapfill/kernels-t1-F32-32x64-h4x1x16.txt";
  EXPECT_NE(r.out.find("kept in " + file), std::string::npos) << r.out;
  EXPECT_NE(testing::ReadAll(file).find("attention heads 4 on 1 of 16"), std::string::npos);
  unsetenv("XDG_CACHE_HOME");
  if (keep != nullptr) setenv("XDG_CACHE_HOME", saved.c_str(), 1);
  unsetenv("OMP_NUM_THREADS");
  if (keep_threads != nullptr) setenv("OMP_NUM_THREADS", saved_threads.c_str(), 1);
}

// The kernels' team spins a while, then sleeps (kernels/cpu/spin_team.h);
// OMP_WAIT_POLICY=passive, read by the command alone and passed down in
// the backend's options, makes it sleep at once; a value OpenMP does not
// know is bad usage naming the variable.
TEST_F(CliTest, ThreadWaitsFollowOmpWaitPolicy) {
  const char* keep_policy = std::getenv("OMP_WAIT_POLICY");
  const std::string saved_policy = keep_policy ? keep_policy : "";
  unsetenv("OMP_WAIT_POLICY");
  Result r = Run("info --model " + tiny_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("thread waits:    the kernels' team spins"), std::string::npos) << r.out;
  setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
  r = Run("info --model " + tiny_);
  EXPECT_NE(r.out.find("thread waits:    the kernels' team sleeps at once"), std::string::npos) << r.out;
  setenv("OMP_WAIT_POLICY", "sometimes", 1);
  r = Run("info --model " + tiny_);
  EXPECT_FAILS_WITH(r, 2, "OMP_WAIT_POLICY=sometimes");
  unsetenv("OMP_WAIT_POLICY");
  if (keep_policy != nullptr) setenv("OMP_WAIT_POLICY", saved_policy.c_str(), 1);
}

// SNAPFILL_CPU and SNAPFILL_AMX reach the kernels through the backend's
// options: a lower level is taken, an unknown one is bad usage.
TEST_F(CliTest, KernelLevelFromTheEnvironment) {
  const char* keep = std::getenv("SNAPFILL_CPU");
  const std::string saved = keep ? keep : "";
  setenv("SNAPFILL_CPU", "generic", 1);
  Result r = Run("info --model " + tiny_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("kernels:         x86-64 generic (of "), std::string::npos) << r.out;
  setenv("SNAPFILL_CPU", "avx1024", 1);
  r = Run("info --model " + tiny_);
  EXPECT_FAILS_WITH(r, 2, "SNAPFILL_CPU=avx1024");
  unsetenv("SNAPFILL_CPU");
  setenv("SNAPFILL_AMX", "maybe", 1);
  r = Run("info --model " + tiny_);
  EXPECT_FAILS_WITH(r, 2, "SNAPFILL_AMX=maybe");
  unsetenv("SNAPFILL_AMX");
  if (keep != nullptr) setenv("SNAPFILL_CPU", saved.c_str(), 1);
}

// With OMP_PROC_BIND set, libgomp binds the first thread to one CPU as the
// program loads; the command must not take that one CPU for all it has:
// `info` reports as many threads as without the setting. OMP_PLACES naming
// one CPU gives one thread, as the user asked.
TEST_F(CliTest, ThreadBindingKeepsEveryCpuOfThePlaces) {
  const char* keep_bind = std::getenv("OMP_PROC_BIND");
  const std::string saved_bind = keep_bind ? keep_bind : "";
  auto threads = [this] {
    Result r = Run("info --model " + tiny_);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    const size_t at = r.out.find(" threads (");
    size_t from = at;
    while (from > 0 && std::isdigit(static_cast<unsigned char>(r.out[from - 1]))) --from;
    return at == std::string::npos ? -1 : std::atoi(r.out.substr(from, at - from).c_str());
  };
  unsetenv("OMP_PROC_BIND");
  const int unbound = threads();
  ASSERT_GE(unbound, 1);
  for (const char* bind : {"true", "spread", "close"}) {
    setenv("OMP_PROC_BIND", bind, 1);
    EXPECT_EQ(threads(), unbound) << "OMP_PROC_BIND=" << bind;
  }
  setenv("OMP_PLACES", "{0}", 1);
  EXPECT_EQ(threads(), 1) << "OMP_PLACES={0}";
  unsetenv("OMP_PLACES");
  unsetenv("OMP_PROC_BIND");
  if (keep_bind != nullptr) setenv("OMP_PROC_BIND", saved_bind.c_str(), 1);
}

TEST_F(CliTest, MissingTokenizer) {
  const std::string path = Patched("notok.gguf", "tokenizer.ggml.model", "tokenizer.ggml.xxxxx");
  EXPECT_FAILS_WITH(Run("generate --model " + path + " --prompt hi -n 2"), 1, "tokenizer");
}

TEST_F(CliTest, EmptyPrompt) {
  EXPECT_FAILS_WITH(Run("generate --model " + tiny_ + " -n 2"), 2, "prompt is empty");
  testing::WriteRaw(dir_ + "/empty.txt", "");
  EXPECT_FAILS_WITH(Run("generate --model " + tiny_ + " --prompt-file " + dir_ + "/empty.txt"), 2,
                    "prompt is empty");
}

TEST_F(CliTest, InvalidUtf8IsEncodedAsBytes) {
  testing::WriteRaw(dir_ + "/bytes.txt", std::string("abc \xff\xfe\xc3 def \x80", 13));
  Result r = Run("generate --model " + tiny_ + " --prompt-file " + dir_ +
                 "/bytes.txt -n 3 --chat_template none");
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

TEST_F(CliTest, BadFlags) {
  EXPECT_FAILS_WITH(Run("generate --model " + tiny_ + " --prompt x --no_such_flag=3"), 2,
                    "unknown flag");
  EXPECT_FAILS_WITH(Run("frobnicate"), 2, "unknown command");
  EXPECT_FAILS_WITH(Run("generate --model " + tiny_ + " --prompt x --temp -1"), 2, "--temp");
  EXPECT_FAILS_WITH(Run("run --model " + tiny_ + " --input " + text_ + " --schedule xyz"), 2,
                    "xyz");
  Result help = Run("run --help");
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.out.find("--schedule"), std::string::npos);
}

TEST_F(CliTest, BadInputs) {
  testing::WriteRaw(dir_ + "/empty.txt", "");
  EXPECT_FAILS_WITH(Run("run --model " + tiny_ + " --input " + dir_ + "/empty.txt"), 2, "empty");
  EXPECT_FAILS_WITH(Run("run --model " + tiny_ + " --input " + dir_), 2, "directory");
  EXPECT_FAILS_WITH(Run("run --model " + tiny_ + " --input " + dir_ + "/missing.txt"), 1,
                    "no such file");
  EXPECT_FAILS_WITH(Run("run --model " + tiny_), 2, "--input");
}

TEST_F(CliTest, ImpossibleScheduleIsRefusedWithASuggestion) {
  Result r = Run("run --model " + tiny_ + " --input " + text_ +
                 " --schedule imdc --memory 512 --chunk 100 --window 32 --dry_run");
  EXPECT_FAILS_WITH(r, 2, "--chunk");
  r = Run("run --model " + tiny_ + " --input " + text_ + " --memory 16 --window 32");
  EXPECT_FAILS_WITH(r, 2, "--window");
}

TEST_F(CliTest, RunAnswersAndPrefillDoesNotOverwrite) {
  Result r = Run("run --model " + tiny_ + " --input " + text_ +
                 " --memory 64 --chunk 128 --window 8 -n 4 --question why --progress=false");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("TTFT"), std::string::npos) << r.err;
  const std::string out = dir_ + "/cache.kv";
  testing::WriteRaw(out, "precious");
  r = Run("prefill --model " + tiny_ + " --input " + text_ + " --memory 64 --chunk 128 --window 8 --out " + out);
  EXPECT_FAILS_WITH(r, 1, "--force");
  EXPECT_EQ(testing::ReadAll(out), "precious");
  r = Run("prefill --model " + tiny_ + " --input " + text_ +
          " --memory 64 --chunk 128 --window 8 --progress=false --force --out " + out);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  r = Run("generate --model " + tiny_ + " --cache " + out + " --prompt why -n 3");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  // A damaged cache is refused.
  std::string bytes = testing::ReadAll(out);
  bytes[bytes.size() / 2] ^= 0x40;
  testing::WriteRaw(out, bytes);
  EXPECT_FAILS_WITH(Run("generate --model " + tiny_ + " --cache " + out + " --prompt why -n 3"), 1,
                    "checksum");
}

// --keep_last_chunk applies where the question is read after the prefill:
// prefill, and run with a store its question does not guide; not where the
// question closes the chunk loop's input. The plan says so, and the saved
// cache holds the memory and the whole last chunk.
TEST_F(CliTest, TheLastChunkIsKeptWholeWhereTheQuestionComesAfter) {
  const std::string kept_line = "the last step keeps its chunk whole";
  const std::string common = " --model " + tiny_ + " --input " + text_ + " --memory 64 --chunk 128 --window 8 ";
  Result r = Run("prefill" + common + "--dry_run");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find(kept_line), std::string::npos) << r.out;
  r = Run("prefill" + common + "--dry_run --keep_last_chunk=false");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.find(kept_line), std::string::npos) << r.out;
  r = Run("run" + common + "--question why --dry_run");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.find(kept_line), std::string::npos) << "guided: the question closes the input\n" << r.out;
  r = Run("run" + common + "--question why --query_aware=false --dry_run");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.find(kept_line), std::string::npos) << "no store: the question closes the input\n" << r.out;
  r = Run("run" + common + "--question why --query_aware=false --recall_dir " + dir_ + "/store --dry_run");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find(kept_line), std::string::npos) << "asked after the prefill\n" << r.out;
  // Given where it has no effect, it says so; not where it applies.
  const std::string unused = "--keep_last_chunk has no effect here";
  r = Run("run" + common + "--question why --keep_last_chunk --dry_run");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find(unused), std::string::npos) << r.err;
  r = Run("run" + common + "--question why --query_aware=false --recall_dir " + dir_ +
          "/store --keep_last_chunk --dry_run");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err.find(unused), std::string::npos) << r.err;
  // The saved caches: the one that keeps the last chunk holds more entries
  // (the config records it), and both answer.
  const std::string kept = dir_ + "/kept.kv", compressed = dir_ + "/compressed.kv";
  r = Run("prefill" + common + "--progress=false --out " + kept);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = Run("prefill" + common + "--progress=false --keep_last_chunk=false --out " + compressed);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string kept_bytes = testing::ReadAll(kept);
  EXPECT_GT(kept_bytes.size(), testing::ReadAll(compressed).size());
  EXPECT_NE(kept_bytes.find("\"keep_last_chunk\":true"), std::string::npos);
  EXPECT_EQ(testing::ReadAll(compressed).find("keep_last_chunk"), std::string::npos);
  for (const std::string& cache : {kept, compressed}) {
    r = Run("generate --model " + tiny_ + " --cache " + cache + " --prompt why -n 3");
    EXPECT_EQ(r.exit_code, 0) << r.err;
  }
}

// A question guides every chunk unless --query_aware=false: the plan says
// so and counts its rows; telemetry records them (and the layers whose
// selection was a backend op: all but with the recall tier); bad settings
// name the flag.
TEST_F(CliTest, AQuestionGuidesTheCompression) {
  const std::string base = "run --model " + tiny_ + " --input " + text_ +
                           " --memory 64 --chunk 128 --window 8 -n 2 --progress=false ";
  Result r = Run(base + "--question 'what is it' --dry_run");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("question-guided: the question's"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("span 32"), std::string::npos) << r.out;
  r = Run(base + "--question 'what is it' --dry_run --query_aware=false");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.find("question-guided"), std::string::npos) << r.out;
  const std::string telemetry = dir_ + "/guided.jsonl";
  r = Run(base + "--question 'what is it' --select token --query_share 0.5 --telemetry " + telemetry);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  const std::string records = testing::ReadAll(telemetry);
  EXPECT_NE(records.find("\"query_rows\":"), std::string::npos) << records;
  // (A question's selection is one backend op per layer, as SnapKV's
  // without one, whatever its rule, and telemetry counts the layers; with
  // the recall tier, whose store takes what each step evicts, the host's.)
  EXPECT_NE(records.find("\"backend_selections\":"), std::string::npos) << records;
  const std::string alone = dir_ + "/alone.jsonl";
  r = Run(base + "--question 'what is it' --telemetry " + alone);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(testing::ReadAll(alone).find("\"backend_selections\":"), std::string::npos);
  const std::string largest = dir_ + "/largest.jsonl";
  r = Run(base + "--question 'what is it' --query_votes max --query_heads shared --telemetry " + largest);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(testing::ReadAll(largest).find("\"backend_selections\":"), std::string::npos);
  const std::string recalled = dir_ + "/recalled.jsonl";
  r = Run(base + "--question 'what is it' --recall_dir " + dir_ + "/store --recall 16 --telemetry " + recalled);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(testing::ReadAll(recalled).find("\"recalled\":"), std::string::npos);
  EXPECT_EQ(testing::ReadAll(recalled).find("\"backend_selections\":"), std::string::npos);
  const std::string unguided = dir_ + "/unguided.jsonl";
  r = Run(base + "--question 'what is it' --query_aware=false --telemetry " + unguided);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(testing::ReadAll(unguided).find("\"backend_selections\":"), std::string::npos);
  EXPECT_FAILS_WITH(Run(base + "--question why --query_share 1.5"), 2, "--query_share=1.5");
  EXPECT_FAILS_WITH(Run(base + "--question why --select sentence"), 2, "--select=sentence");
  EXPECT_FAILS_WITH(Run(base + "--question why --span 0"), 2, "--span=0");
  EXPECT_FAILS_WITH(Run(base + "--question why --query_heads both"), 2, "--query_heads=both");
  EXPECT_FAILS_WITH(Run(base + "--question why --query_votes mean"), 2, "--query_votes=mean");
  r = Run(base + "--question 'what is it' --query_votes max --dry_run");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("votes max"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace snapfill

namespace snapfill {
namespace {

std::vector<int32_t> ParseIdList(const std::string& line) {
  std::vector<int32_t> ids;
  std::string digits;
  for (const char c : line) {
    if (std::isdigit(static_cast<unsigned char>(c))) {
      digits += c;
    } else if (!digits.empty()) {
      ids.push_back(std::stoi(digits));
      digits.clear();
    }
  }
  return ids;
}

// snapfill tokenize prints the tokenizer's ids (as llama-tokenize does),
// for a prompt and for a file streamed through it, and refuses what is
// ambiguous.
TEST_F(CliTest, TokenizePrintsTheTokenizersIds) {
  auto gguf = GgufFile::FromBytes(tiny_bytes_);
  SNAPFILL_ASSERT_OK(gguf);
  auto tok = Tokenizer::FromGguf(**gguf);
  SNAPFILL_ASSERT_OK(tok);
  const std::string prompt = "The quick brown fox, 12345 times.";
  Result r = Run("tokenize --model " + tiny_ + " --prompt '" + prompt + "' --ids");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::vector<int32_t> expected = (*tok)->Encode(prompt, true, false);
  ASSERT_FALSE(expected.empty());
  EXPECT_EQ(ParseIdList(r.out), expected) << r.out;
  EXPECT_EQ(r.out.front(), '[');
  // A file, read as a stream, and the default "id -> 'piece'" lines.
  const std::string text = testing::ReadAll(text_);
  r = Run("tokenize --model " + tiny_ + " --input " + text_ + " --ids");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(ParseIdList(r.out), (*tok)->Encode(text, true, false));
  r = Run("tokenize --model " + tiny_ + " --prompt '" + prompt + "' --add_special=false");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::istringstream lines(r.out);
  std::string line, joined;
  int count = 0;
  for (; std::getline(lines, line); ++count) {
    const size_t arrow = line.find(" -> '");
    ASSERT_NE(arrow, std::string::npos) << line;
    EXPECT_EQ(std::stoi(line.substr(0, arrow)), (*tok)->Encode(prompt, false, false)[count]) << line;
    joined += line.substr(arrow + 5, line.size() - arrow - 6);
  }
  EXPECT_EQ(joined, prompt);
  r = Run("tokenize --model " + tiny_ + " --prompt '" + prompt + "' --pieces --add_special=false");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::string pieces;
  for (std::istringstream in(r.out); std::getline(in, line);) pieces += line;
  EXPECT_EQ(pieces, prompt);

  EXPECT_FAILS_WITH(Run("tokenize --model " + tiny_), 2, "--prompt TEXT or --input FILE");
  EXPECT_FAILS_WITH(Run("tokenize --model " + tiny_ + " --prompt x --input " + text_), 2, "one of them");
  EXPECT_FAILS_WITH(Run("tokenize --model " + tiny_ + " --prompt x --ids --pieces"), 2, "give one");
  EXPECT_FAILS_WITH(Run("tokenize --model " + dir_ + "/none.gguf --prompt x"), 1, "none.gguf");
  EXPECT_FAILS_WITH(Run("tokenize --model " + tiny_ + " --input " + dir_ + "/none.txt"), 1, "none.txt");
}

}  // namespace
}  // namespace snapfill
