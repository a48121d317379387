// The quality harness commands (snapfill ppl, needle, plot) on a tiny random
// model this test writes: the JSON they write holds what it should (every
// token but the first scored once, the grid's shape, one key per trial, each
// task's planted values), the full-attention loss does not depend on the
// chunk size, bad flags are bad usage (exit 2) with a message naming the
// flag, and the plots are PNGs.
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "snapfill/status.h"
#include "tools/testmodel/tiny_llama.h"
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

// Each needle's tokens and the share of them the final cache holds, per
// trial, and the asked needle's over the task: all of it with every entry
// kept (--pruner full); with the sinks and the last 96 entries (streaming),
// none of a needle at the start and all of one at the end (its 30 tokens
// and the question's 45 after it). --resume takes them from the records.
TEST_F(QualityCliTest, NeedleReportsTheShareOfTheNeedleTheCacheHolds) {
  const std::string base = "needle --model " + tiny_ + " --input " + text_ +
                           " --lengths 240 --depths 0,1 --seeds 2 --memory 100 --chunk 64 --window 8 "
                           "--baseline=false --progress=false ";
  for (const std::string pruner : {"full", "streaming"}) {
    SCOPED_TRACE(pruner);
    const std::string json = dir_ + "/" + pruner + ".json";
    const Result r = Run(base + "--pruner " + pruner + " --json " + json);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("the asked needle's tokens in the final cache: "), std::string::npos) << r.out;
    const Json j = ReadJson(json);
    ASSERT_EQ(j["cells"].size(), 2u);
    for (size_t c = 0; c < 2; ++c) {
      for (const Json& t : j["cells"][c]["runs"]) {
        ASSERT_EQ(t["needles"].size(), 1u);
        const Json& n = t["needles"][0];
        ASSERT_TRUE(n.contains("kept")) << n.dump();
        ASSERT_EQ(n["tokens"].size(), 2u);
        EXPECT_GT(n["tokens"][1].get<int64_t>(), n["tokens"][0].get<int64_t>() + 3);
        const double want = pruner == "full" || c == 1 ? 1.0 : 0.0;
        EXPECT_DOUBLE_EQ(n["kept"].get<double>(), want) << "depth " << c << ": " << t.dump();
        // The key's own tokens, inside the needle's.
        ASSERT_EQ(t["expected_kept"].size(), 1u);
        EXPECT_DOUBLE_EQ(t["expected_kept"][0].get<double>(), want);
      }
    }
    EXPECT_DOUBLE_EQ(j["tasks"][0]["asked_kept"].get<double>(), pruner == "full" ? 1.0 : 0.5);
    EXPECT_DOUBLE_EQ(j["tasks"][0]["expected_kept"].get<double>(), pruner == "full" ? 1.0 : 0.5);
    EXPECT_NE(r.out.find(", the answer's "), std::string::npos) << r.out;
    // A resumed grid keeps the recorded shares.
    const Result resumed = Run(base + "--pruner " + pruner + " --json " + json + " --resume");
    ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
    EXPECT_EQ(ReadJson(json)["cells"], j["cells"]);
  }
}

// --first_seed runs the later trials of a grid as the whole grid runs them:
// the same keys and answers, so a long grid can be split over runs.
TEST_F(QualityCliTest, NeedleFirstSeedRunsTheGridsLaterTrials) {
  const std::string base = "needle --model " + tiny_ + " --input " + text_ +
                           " --lengths 160 --depths 0,1 --seeds 3 --memory 48 --chunk 64 --window 8 "
                           "--baseline=false --progress=false --json ";
  ASSERT_EQ(Run(base + dir_ + "/all.json").exit_code, 0);
  const Result r = Run(base + dir_ + "/later.json --first_seed 1");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const Json all = ReadJson(dir_ + "/all.json"), later = ReadJson(dir_ + "/later.json");
  EXPECT_EQ(later["first_seed"], 1);
  ASSERT_EQ(later["cells"].size(), 2u);
  for (size_t c = 0; c < 2; ++c) {
    ASSERT_EQ(all["cells"][c]["runs"].size(), 3u);
    ASSERT_EQ(later["cells"][c]["runs"].size(), 2u);
    for (size_t t = 0; t < 2; ++t) {
      const Json &a = all["cells"][c]["runs"][t + 1], &b = later["cells"][c]["runs"][t];
      EXPECT_EQ(b["seed"], a["seed"]);
      EXPECT_EQ(b["key"], a["key"]);
      EXPECT_EQ(b["answer"], a["answer"]);
    }
  }
  EXPECT_FAILS_WITH(Run(base + dir_ + "/x.json --first_seed 3"), 2, "--first_seed=3");
}

// --json is rewritten after every trial; --resume runs only the trials the
// file lacks and ends with the grid an uninterrupted run writes, and
// refuses a file of another grid, naming what differs.
TEST_F(QualityCliTest, NeedleResumeRunsOnlyTheTrialsTheJsonLacks) {
  const std::string base = "needle --model " + tiny_ + " --input " + text_ +
                           " --lengths 160 --depths 0,1 --seeds 2 --memory 48 --chunk 64 --window 8 "
                           "--baseline=false --json ";
  const std::string all_path = dir_ + "/all.json", part_path = dir_ + "/part.json";
  ASSERT_EQ(Run(base + all_path + " --progress=false").exit_code, 0);
  const Json all = ReadJson(all_path);
  EXPECT_EQ(all["complete"], true);
  ASSERT_EQ(all["cells"].size(), 2u);
  // As a grid stopped after its third trial leaves the file.
  Json part = all;
  part["complete"] = false;
  part["cells"][1]["runs"].erase(1);
  part["cells"][1]["runs"][0]["answer"] = "a recorded answer";  // (taken as recorded, not run again)
  {
    std::ofstream out(part_path);
    out << part.dump();
  }
  const Result r = Run(base + part_path + " --resume --progress=true");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  size_t recorded = 0;
  for (size_t at = r.err.find(", recorded)"); at != std::string::npos; at = r.err.find(", recorded)", at + 1)) {
    ++recorded;
  }
  EXPECT_EQ(recorded, 3u) << r.err;
  const Json done = ReadJson(part_path);
  EXPECT_EQ(done["complete"], true);
  ASSERT_EQ(done["cells"].size(), 2u);
  for (size_t c = 0; c < 2; ++c) {
    ASSERT_EQ(done["cells"][c]["runs"].size(), 2u);
    for (size_t t = 0; t < 2; ++t) {
      const Json &a = all["cells"][c]["runs"][t], &b = done["cells"][c]["runs"][t];
      EXPECT_EQ(b["seed"], a["seed"]);
      EXPECT_EQ(b["key"], a["key"]);
      EXPECT_EQ(b["answer"], c == 1 && t == 0 ? Json("a recorded answer") : a["answer"]) << c << " " << t;
    }
  }
  EXPECT_FAILS_WITH(Run(base + part_path + " --resume --progress=false --memory 40"), 2, "another config");
  EXPECT_FAILS_WITH(Run(base + part_path + " --resume --progress=false --seeds 3"), 2, "another seeds");
  EXPECT_FAILS_WITH(Run("needle --model " + tiny_ + " --input " + text_ + " --resume"), 2, "--json");
  // An unwritable --json stops the grid before its first trial.
  const Result unwritable = Run(base + dir_ + "/no/such/dir/x.json --progress=true");
  EXPECT_FAILS_WITH(unwritable, 1, "no/such/dir/x.json");
  EXPECT_EQ(unwritable.err.find("[snapfill needle]"), std::string::npos) << unwritable.err;
}

// Every task over a grid: prompts of the cell's length, the planted values
// recorded with the needles that hold them, the needle the question asks
// about at the cell's depth, a grid and an accuracy line per task; the
// passkey trials are those of a passkey-only run.
TEST_F(QualityCliTest, NeedleTasksJson) {
  const std::string json = dir_ + "/tasks.json", passkey = dir_ + "/passkey.json";
  const std::string grid = " --lengths 500,700 --depths 0,0.5,1 --seeds 2 --memory 48 --chunk 64 "
                           "--window 8 --progress=false --json ";
  const std::string base = "needle --model " + tiny_ + " --input " + text_;
  Result r = Run(base + " --tasks passkey,multikey,multivalue,vartrack,fact" + grid + json);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::vector<std::string> names = {"passkey", "multikey", "multivalue", "vartrack", "fact"};
  const std::vector<size_t> needles = {1, 4, 4, 10, 1};
  size_t grids = 0;
  for (size_t at = r.out.find("depth \\ length"); at != std::string::npos;
       at = r.out.find("depth \\ length", at + 1)) {
    ++grids;
  }
  EXPECT_EQ(grids, names.size()) << r.out;
  const Json j = ReadJson(json);
  ASSERT_TRUE(j.is_object());
  EXPECT_FALSE(j.contains("question"));  // one per task
  ASSERT_EQ(j["tasks"].size(), names.size());
  ASSERT_EQ(j["cells"].size(), names.size() * 6);
  for (size_t ti = 0; ti < names.size(); ++ti) {
    SCOPED_TRACE(names[ti]);
    const Json& task = j["tasks"][ti];
    EXPECT_EQ(task["task"], names[ti]);
    EXPECT_EQ(task["trials"], 12);
    EXPECT_NE(r.out.find("accuracy " + names[ti] + ": "), std::string::npos) << r.out;
    int found = 0;
    for (size_t ci = ti * 6; ci < ti * 6 + 6; ++ci) {
      const Json& c = j["cells"][ci];
      EXPECT_EQ(c["task"], names[ti]);
      ASSERT_EQ(c["runs"].size(), 2u);
      for (const Json& t : c["runs"]) {
        EXPECT_NEAR(t["tokens"].get<double>(), c["length"].get<double>(), 2);
        ASSERT_EQ(t["needles"].size(), needles[ti]);
        const Json& first = t["needles"][0];
        // The needle at the cell's depth is the one asked about, snapped
        // back to a sentence end (the haystack's sentences are short).
        EXPECT_TRUE(first["asked"].get<bool>());
        EXPECT_EQ(t["needle_depth"], first["depth"]);
        EXPECT_LE(first["depth"].get<double>(), c["depth"].get<double>() + 0.01);
        EXPECT_GE(first["depth"].get<double>(), c["depth"].get<double>() - 0.2);
        const std::string question = t["question"];
        std::string asked_text, other_text;
        for (const Json& n : t["needles"]) {
          EXPECT_GE(n["depth"].get<double>(), 0.0);
          EXPECT_LE(n["depth"].get<double>(), 1.0);
          EXPECT_GE(n["offset"].get<int64_t>(), 0);
          (n["asked"].get<bool>() ? asked_text : other_text) += n["text"].get<std::string>() + "\n";
        }
        // Every value to answer is planted in an asked needle, every
        // distractor's in another.
        const std::vector<std::string> expected = t["expected"];
        ASSERT_FALSE(expected.empty());
        for (const std::string& v : expected) {
          EXPECT_NE(asked_text.find(v), std::string::npos) << v << " in " << asked_text;
        }
        for (const std::string& v : t.value("distractors", std::vector<std::string>())) {
          EXPECT_NE(other_text.find(v), std::string::npos) << v << " in " << other_text;
          EXPECT_EQ(asked_text.find(v), std::string::npos) << v;
        }
        const std::string first_text = first["text"];
        if (names[ti] == "passkey") {
          EXPECT_EQ(t["key"], expected[0]);
          EXPECT_EQ(first_text, "The special magic number is " + expected[0] + ".");
        } else if (names[ti] == "multikey" || names[ti] == "multivalue") {
          // "... for <name> is <number>.": the question names the name.
          const size_t for_at = first_text.find(" for ") + 5;
          const std::string name = first_text.substr(for_at, first_text.find(" is ") - for_at);
          EXPECT_NE(question.find(" for " + name + " "), std::string::npos) << question;
          EXPECT_EQ(expected.size(), names[ti] == "multikey" ? 1u : 4u);
          EXPECT_NE(first_text.find(expected[0]), std::string::npos);
        } else if (names[ti] == "vartrack") {
          // "VAR <X1> = <value>.": the question asks for the value.
          const std::string value = first_text.substr(first_text.find("= ") + 2, 5);
          EXPECT_NE(question.find(value), std::string::npos) << question;
          EXPECT_EQ(expected.size(), 5u);
        }
        EXPECT_EQ(t["found"].get<bool>(), t["matched"].get<int>() == static_cast<int>(expected.size()));
        found += t["found"].get<bool>();
      }
      EXPECT_DOUBLE_EQ(c["accuracy"].get<double>(),
                       (c["runs"][0]["found"].get<bool>() + c["runs"][1]["found"].get<bool>()) / 2.0);
    }
    EXPECT_EQ(task["found"], found);
  }
  // The passkey trials are those of a passkey-only run of the grid.
  ASSERT_EQ(Run(base + grid + passkey).exit_code, 0);
  const Json p = ReadJson(passkey);
  ASSERT_EQ(p["cells"].size(), 6u);
  EXPECT_EQ(p["question"], "What is the special magic number mentioned in the text?");
  for (size_t ci = 0; ci < 6; ++ci) {
    for (size_t ri = 0; ri < 2; ++ri) {
      const Json& a = p["cells"][ci]["runs"][ri];
      const Json& b = j["cells"][ci]["runs"][ri];
      for (const char* field : {"key", "tokens", "needle_depth", "answer", "found"}) {
        EXPECT_EQ(a[field], b[field]) << field;
      }
    }
  }
}

TEST_F(QualityCliTest, NeedleHelpNamesEveryTask) {
  const Result r = Run("needle --help");
  EXPECT_EQ(r.exit_code, 0);
  const size_t at = r.out.find("--tasks");
  ASSERT_NE(at, std::string::npos) << r.out;
  const std::string line = r.out.substr(at, r.out.find('\n', at) - at);
  for (const char* task : {"passkey", "multikey", "multivalue", "vartrack", "fact"}) {
    EXPECT_NE(line.find(task), std::string::npos) << task << " in " << line;
  }
}

TEST_F(QualityCliTest, NeedleBadFlags) {
  const std::string base = "needle --model " + tiny_ + " --input " + text_ + " --progress=false ";
  EXPECT_FAILS_WITH(Run(base + "--depths 1.5"), 2, "--depths: \"1.5\"");
  EXPECT_FAILS_WITH(Run(base + "--depths -0.1"), 2, "--depths");
  EXPECT_FAILS_WITH(Run(base + "--lengths 0"), 2, "--lengths: \"0\"");
  EXPECT_FAILS_WITH(Run(base + "--lengths 1024,abc"), 2, "--lengths: \"abc\"");
  EXPECT_FAILS_WITH(Run(base + "--lengths 20"), 2, "too short");
  EXPECT_FAILS_WITH(Run(base + "--seeds 0"), 2, "--seeds");
  EXPECT_FAILS_WITH(Run(base + "--tasks passkey,needles"), 2, "--tasks: \"needles\"");
  EXPECT_FAILS_WITH(Run(base + "--tasks ,"), 2, "--tasks");
  // 160 tokens hold the passkey (NeedleGridJson) but not multivalue's four
  // needles: refused before any trial runs.
  const Result r = Run(base + "--tasks passkey,multivalue --lengths 160,240");
  EXPECT_FAILS_WITH(r, 2, "--lengths 160 is too short for task multivalue");
  EXPECT_EQ(r.out, "");
  EXPECT_FAILS_WITH(Run("needle --model " + tiny_), 2, "--input");
}

// A recall after the prefill names its ranking in the grid's label where
// it is not the default (a grid resumes only with the settings it names),
// and runs with either.
TEST_F(QualityCliTest, NeedleLabelNamesTheRecallRanking) {
  const std::string base = "needle --model " + tiny_ + " --input " + text_ +
                           " --lengths 160 --depths 0.5 --seeds 1 --memory 48 --chunk 64 --window 8 --progress=false"
                           " --baseline=false --query_aware=false --recall 8 --recall_dir " +
                           dir_ + "/store --json ";
  for (const std::string rank : {"summed", "heads"}) {
    const std::string json = dir_ + "/" + rank + ".json";
    const Result r = Run(base + json + " --recall_rank " + rank);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const std::string label = ReadJson(json)["label"];
    EXPECT_NE(label.find("recall 8 q8 after the prefill"), std::string::npos) << label;
    EXPECT_EQ(label.find("ranked by heads") != std::string::npos, rank == "heads") << label;
  }
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
  // Several tasks: a heat map per task, named after it.
  const std::string tasks = dir_ + "/t.json";
  r = Run("needle --model " + tiny_ + " --input " + text_ +
          " --tasks passkey,fact --lengths 160 --depths 0,1 --seeds 1 --memory 48 --chunk 64 "
          "--window 8 --progress=false --json " + tasks + " --png " + dir_ + "/t.png");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(IsPng(dir_ + "/t_passkey.png"));
  EXPECT_TRUE(IsPng(dir_ + "/t_fact.png"));
  r = Run("plot --needle " + tasks + " --out_dir " + out);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* name : {"needle_passkey.png", "needle_fact.png"}) {
    EXPECT_TRUE(IsPng(out + "/" + name)) << name;
    EXPECT_NE(r.out.find(name), std::string::npos) << r.out;
  }
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
