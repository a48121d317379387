// The quality harness commands (snapfill ppl, needle, plot) on a tiny random
// model this test writes: the JSON they write holds what it should (every
// token but the first scored once, the grid's shape, one key per trial), the
// full-attention loss does not depend on the chunk size, bad flags are bad
// usage (exit 2) with a message naming the flag, and the plots are PNGs.
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <set>
#include <string>

#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "snapfill/status.h"
#include "src/model/tiny_llama.h"
#include "tests/testing/files.h"
#include "tests/testing/status_matchers.h"

namespace snapfill {
namespace {

using Json = nlohmann::json;

struct Result {
  int exit_code = -1;
  std::string out;
  std::string err;
};

bool HaveGnuplot() { return std::system("command -v gnuplot >/dev/null 2>&1") == 0; }

class QualityCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/snapfill_quality_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name() + "_" +
           std::to_string(getpid());
    std::system(("rm -rf " + dir_ + " && mkdir -p " + dir_).c_str());
    TinyLlamaOptions opts;
    opts.context_length = 2048;
    tiny_ = dir_ + "/tiny.gguf";
    SNAPFILL_ASSERT_OK(WriteTinyLlamaGguf(tiny_, opts));
    text_ = dir_ + "/input.txt";
    std::string text;
    for (int i = 0; i < 60; ++i) {
      text += "Sentence " + std::to_string(i) + " of the haystack says little. ";
      text += "The quick brown fox jumps over the lazy dog.\n";
    }
    testing::WriteRaw(text_, text);
  }
  void TearDown() override { std::system(("rm -rf " + dir_).c_str()); }

  Result Run(const std::string& args) {
    const std::string out = dir_ + "/stdout", err = dir_ + "/stderr";
    // One thread: the tiny model gains nothing from more, and ctest runs
    // cases side by side. (plot runs no model.)
    const std::string threads = args.rfind("plot", 0) == 0 ? "" : " --threads 1";
    const std::string cmd = std::string(SNAPFILL_BINARY_DIR) + "/bin/snapfill " + args +
                            threads + " >" + out + " 2>" + err + " </dev/null";
    const int status = std::system(cmd.c_str());
    Result r;
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.out = testing::ReadAll(out);
    r.err = testing::ReadAll(err);
    return r;
  }

  Json ReadJson(const std::string& path) {
    Json j = Json::parse(testing::ReadAll(path), nullptr, /*allow_exceptions=*/false);
    EXPECT_FALSE(j.is_discarded()) << path;
    return j;
  }

  std::string Ppl(const std::string& flags) {
    return "ppl --model " + tiny_ + " --input " + text_ + " --window 8 --progress=false " + flags;
  }

  std::string dir_, tiny_, text_;
};

#define EXPECT_FAILS_WITH(r, code, text)                                        \
  do {                                                                         \
    EXPECT_EQ((r).exit_code, code) << (r).err;                                 \
    EXPECT_NE((r).err.find(text), std::string::npos) << "stderr: " << (r).err; \
  } while (0)

TEST_F(QualityCliTest, PplJsonScoresEveryTokenOnce) {
  const std::string json = dir_ + "/ppl.json", tel = dir_ + "/tel.jsonl";
  Result r = Run(Ppl("--schedule fm --memory 64 --chunk 100 --max_tokens 900 --json " + json +
                     " --telemetry " + tel));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("overall: loss"), std::string::npos) << r.out;
  const Json j = ReadJson(json);
  ASSERT_TRUE(j.is_object());
  for (const char* key : {"command", "model", "input", "input_tokens", "tokens", "config",
                          "context_length", "within_context", "scored_tokens", "nll_sum", "loss",
                          "ppl", "seconds", "steps"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
  EXPECT_EQ(j["tokens"], 900);
  EXPECT_GT(j["input_tokens"].get<int64_t>(), 900);
  EXPECT_EQ(j["scored_tokens"], 899);
  EXPECT_EQ(j["config"]["schedule"], "fm");
  EXPECT_EQ(j["config"]["memory"], 64);
  int64_t chunk_sum = 0, scored_sum = 0, next = 0;
  double nll = 0;
  for (const Json& s : j["steps"]) {
    EXPECT_EQ(s["start"], next);
    next += s["chunk"].get<int64_t>();
    chunk_sum += s["chunk"].get<int64_t>();
    scored_sum += s["scored"].get<int64_t>();
    EXPECT_EQ(s["scored"].get<int64_t>(), s["chunk"].get<int64_t>() - (s["step"] == 0 ? 1 : 0));
    nll += s["nll_sum"].get<double>();
    EXPECT_NEAR(s["loss"].get<double>(), s["nll_sum"].get<double>() / s["scored"].get<double>(),
                1e-9);
  }
  EXPECT_EQ(j["steps"].size(), 9u);
  EXPECT_EQ(chunk_sum, 900);
  EXPECT_EQ(scored_sum, 899);
  EXPECT_NEAR(j["nll_sum"].get<double>(), nll, 1e-6 * nll);
  EXPECT_NEAR(j["loss"].get<double>(), nll / 899, 1e-9);
  EXPECT_NEAR(j["ppl"].get<double>(), std::exp(nll / 899), 1e-6 * j["ppl"].get<double>());
  // The telemetry carries the same scores, one record per step.
  const std::vector<std::string> lines =
      absl::StrSplit(testing::ReadAll(tel), '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 9u);
  const Json last = Json::parse(lines.back(), nullptr, false);
  ASSERT_FALSE(last.is_discarded());
  EXPECT_EQ(last["scored"], j["steps"][8]["scored"]);
}

// Full attention's loss is that of one-shot prefill whatever the chunk size:
// chunks of 100 against one chunk of the whole input (the engine test
// compares each token's loss with a plain forward pass).
TEST_F(QualityCliTest, FullPrunerLossDoesNotDependOnChunks) {
  const std::string a = dir_ + "/a.json", b = dir_ + "/b.json";
  ASSERT_EQ(Run(Ppl("--pruner full --chunk 100 --max_tokens 1000 --json " + a)).exit_code, 0);
  ASSERT_EQ(Run(Ppl("--pruner full --chunk 1000 --max_tokens 1000 --json " + b)).exit_code, 0);
  const Json ja = ReadJson(a), jb = ReadJson(b);
  EXPECT_EQ(ja["steps"].size(), 10u);
  EXPECT_EQ(jb["steps"].size(), 1u);
  EXPECT_EQ(ja["within_context"], true);
  EXPECT_EQ(ja["scored_tokens"], 999);
  EXPECT_EQ(jb["scored_tokens"], 999);
  // F32 tiny model: only the attention's summation order differs.
  EXPECT_NEAR(ja["loss"].get<double>(), jb["loss"].get<double>(), 1e-4);
}

TEST_F(QualityCliTest, PplBadFlags) {
  EXPECT_FAILS_WITH(Run(Ppl("--max_tokens -3")), 2, "--max_tokens");
  EXPECT_FAILS_WITH(Run(Ppl("--max_tokens 1")), 2, "--max_tokens");
  EXPECT_FAILS_WITH(Run("ppl --model " + tiny_), 2, "--input");
  EXPECT_FAILS_WITH(Run(Ppl("--pruner nope")), 2, "nope");
  EXPECT_FAILS_WITH(Run(Ppl("--lengths 5")), 2, "unknown flag");
}

TEST_F(QualityCliTest, NeedleGridJson) {
  const std::string json = dir_ + "/needle.json";
  Result r = Run("needle --model " + tiny_ + " --input " + text_ +
                 " --lengths 160,240 --depths 0,0.5,1 --seeds 2 --memory 48 --chunk 64 "
                 "--window 8 --progress=false --json " + json);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("depth \\ length"), std::string::npos) << r.out;
  const Json j = ReadJson(json);
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(j["lengths"], Json({160, 240}));
  EXPECT_EQ(j["depths"], Json({0.0, 0.5, 1.0}));
  EXPECT_EQ(j["seeds"], 2);
  ASSERT_EQ(j["cells"].size(), 6u);
  std::set<std::string> keys;
  for (const Json& c : j["cells"]) {
    ASSERT_EQ(c["runs"].size(), 2u);
    int found = 0, base_found = 0;
    for (const Json& t : c["runs"]) {
      const std::string key = t["key"];
      EXPECT_EQ(key.size(), 7u);
      keys.insert(key);
      // The prompt is the cell's length (the joins may tokenize a token off).
      EXPECT_NEAR(t["tokens"].get<double>(), c["length"].get<double>(), 2);
      EXPECT_NEAR(t["needle_depth"].get<double>(), c["depth"].get<double>(), 0.35);
      EXPECT_EQ(t["found"].get<bool>(), t["answer"].get<std::string>().find(key) != std::string::npos);
      found += t["found"].get<bool>();
      ASSERT_TRUE(t.contains("baseline_found"));  // 240 tokens fit the 2048 context
      base_found += t["baseline_found"].get<bool>();
    }
    EXPECT_DOUBLE_EQ(c["accuracy"].get<double>(), found / 2.0);
    EXPECT_DOUBLE_EQ(c["baseline_accuracy"].get<double>(), base_found / 2.0);
  }
  EXPECT_EQ(keys.size(), 12u);  // a key per trial
  // Depth 0 puts the needle first, depth 1 last.
  EXPECT_EQ(j["cells"][0]["runs"][0]["needle_depth"], 0.0);
  EXPECT_EQ(j["cells"][2]["runs"][0]["needle_depth"], 1.0);
}

TEST_F(QualityCliTest, NeedleBadFlags) {
  const std::string base = "needle --model " + tiny_ + " --input " + text_ + " --progress=false ";
  EXPECT_FAILS_WITH(Run(base + "--depths 1.5"), 2, "--depths: \"1.5\"");
  EXPECT_FAILS_WITH(Run(base + "--depths -0.1"), 2, "--depths");
  EXPECT_FAILS_WITH(Run(base + "--lengths 0"), 2, "--lengths: \"0\"");
  EXPECT_FAILS_WITH(Run(base + "--lengths 1024,abc"), 2, "--lengths: \"abc\"");
  EXPECT_FAILS_WITH(Run(base + "--lengths 20"), 2, "too short");
  EXPECT_FAILS_WITH(Run(base + "--seeds 0"), 2, "--seeds");
  EXPECT_FAILS_WITH(Run("needle --model " + tiny_), 2, "--input");
}

bool IsPng(const std::string& path) { return testing::ReadAll(path).rfind("\x89PNG", 0) == 0; }

TEST_F(QualityCliTest, PlotsArePngs) {
  if (!HaveGnuplot()) GTEST_SKIP() << "gnuplot not installed (Debian gnuplot-nox)";
  const std::string a = dir_ + "/a.json", b = dir_ + "/b.json", tel = dir_ + "/t.jsonl";
  ASSERT_EQ(Run(Ppl("--schedule imdc --memory 64 --chunk 128 --max_tokens 1200 --json " + a +
                    " --telemetry " + tel))
                .exit_code,
            0);
  ASSERT_EQ(Run(Ppl("--pruner full --chunk 128 --max_tokens 1200 --json " + b)).exit_code, 0);
  const std::string out = dir_ + "/plots";
  Result r = Run("plot --telemetry " + tel + " --ppl " + a + "," + b + " --out_dir " + out);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* name : {"memory_chunk.png", "origin.png", "retention.png", "loss.png"}) {
    EXPECT_TRUE(IsPng(out + "/" + name)) << name;
    EXPECT_NE(r.out.find(name), std::string::npos) << r.out;
  }
  const std::string needle = dir_ + "/n.json", png = dir_ + "/n.png";
  r = Run("needle --model " + tiny_ + " --input " + text_ +
          " --lengths 160 --depths 0,1 --seeds 1 --memory 48 --chunk 64 --window 8 "
          "--progress=false --json " + needle + " --png " + png);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(IsPng(png));
  r = Run("plot --needle " + needle + " --out_dir " + out);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(IsPng(out + "/needle.png"));
}

TEST_F(QualityCliTest, PlotBadInputs) {
  EXPECT_FAILS_WITH(Run("plot"), 2, "nothing to plot");
  if (!HaveGnuplot()) GTEST_SKIP() << "gnuplot not installed (Debian gnuplot-nox)";
  testing::WriteRaw(dir_ + "/bad.jsonl", "{\"step\":0,\"start\":0,\"chunk\":5,\"memory\":[1]}\nnot json\n");
  EXPECT_FAILS_WITH(Run("plot --telemetry " + dir_ + "/bad.jsonl --out_dir " + dir_ + "/p"), 2,
                    "line 2");
  testing::WriteRaw(dir_ + "/x.json", "{\"a\":1}");
  EXPECT_FAILS_WITH(Run("plot --ppl " + dir_ + "/x.json --out_dir " + dir_ + "/p"), 2, "steps");
  EXPECT_FAILS_WITH(Run("plot --needle " + dir_ + "/x.json --out_dir " + dir_ + "/p"), 2,
                    "lengths");
}

}  // namespace
}  // namespace snapfill
