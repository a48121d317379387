// snapfill batch: the manifest (every bad line named, nothing written), the
// shards (every document exactly once, balanced by size), the answers file
// (round trip, a torn last line cut, another model or settings refused),
// and the command end to end on the tiny model: a resumed job, a sharded
// one and one over three MPI ranks give the answers of one uninterrupted
// run.
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/cli_fixture.h"
#include "tests/testing/files.h"
#include "tests/testing/status_matchers.h"
#include "tools/cli/batch_manifest.h"
#include "tools/cli/batch_mpi.h"

namespace snapfill::cli {
namespace {

using Json = nlohmann::json;

class BatchManifestTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::MakeTempDir("batch");
    testing::WriteRaw(dir_ + "/a.txt", std::string(3000, 'a'));
    testing::WriteRaw(dir_ + "/b.txt", std::string(1000, 'b'));
    ASSERT_EQ(::mkdir((dir_ + "/sub").c_str(), 0755), 0);
    manifest_ = dir_ + "/m.jsonl";
  }
  absl::StatusOr<std::vector<BatchDocument>> Parse(const std::string& text) {
    return ParseManifest(text, manifest_, BatchSettings());
  }
  std::string dir_, manifest_;
};

TEST_F(BatchManifestTest, ReadsDocumentsQuestionsAndSettings) {
  auto docs = Parse(
      R"({"id": "a", "input": "a.txt", "questions": ["Q1?", "Q2?"], "memory": 512, "schedule": "fm"})"
      "\n\n"
      R"({"id": "b", "input": ")" + dir_ + R"(/b.txt", "task": "summarize", "guided": true, "n": 8, "seed": 3})" "\n");
  SNAPFILL_ASSERT_OK(docs);
  ASSERT_EQ(docs->size(), 2u);
  const BatchDocument& a = (*docs)[0];
  EXPECT_EQ(a.id, "a");
  EXPECT_EQ(a.input, dir_ + "/a.txt") << "relative to the manifest's folder";
  EXPECT_EQ(a.questions, (std::vector<std::string>{"Q1?", "Q2?"}));
  EXPECT_EQ(a.settings.memory, 512);
  EXPECT_EQ(a.settings.schedule, "fm");
  EXPECT_EQ(a.settings.chunk, BatchSettings().chunk);
  EXPECT_EQ(a.bytes, 3000u);
  EXPECT_EQ(a.line, 1);
  const BatchDocument& b = (*docs)[1];
  EXPECT_EQ(b.questions, (std::vector<std::string>{std::string(kSummarizePrompt)}));
  EXPECT_TRUE(b.settings.guided);
  EXPECT_EQ(b.settings.n, 8);
  EXPECT_EQ(b.settings.seed, 3u);
  EXPECT_EQ(b.line, 3);
  EXPECT_EQ(Json::parse(a.settings.Json())["memory"], 512);
  // The recall's keys only where set, in nlohmann's order (answers compare
  // the text as parsed).
  BatchSettings recall = a.settings;
  EXPECT_FALSE(Json::parse(recall.Json()).contains("recall_rank"));
  recall.recall = 64;
  recall.recall_heads = true;
  const Json parsed = Json::parse(recall.Json());
  EXPECT_EQ(parsed["recall"], 64);
  EXPECT_EQ(parsed["recall_rank"], "heads");
  EXPECT_EQ(parsed.dump(), recall.Json());
  // --keep_last_chunk only for an unguided document, whose questions come
  // after the prefill.
  BatchSettings kept = a.settings;
  EXPECT_FALSE(Json::parse(kept.Json()).contains("keep_last_chunk"));
  kept.keep_last_chunk = true;
  EXPECT_EQ(Json::parse(kept.Json())["keep_last_chunk"], true);
  EXPECT_EQ(Json::parse(kept.Json()).dump(), kept.Json());
  kept.guided = true;
  EXPECT_FALSE(Json::parse(kept.Json()).contains("keep_last_chunk"));
}

TEST_F(BatchManifestTest, EveryBadLineIsNamed) {
  const std::string ok = R"({"id": "a", "input": "a.txt", "questions": ["Q?"]})";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"not json", ":2: not a JSON object"},
      {R"(["a"])", ":2: not a JSON object"},
      {R"({"input": "b.txt", "questions": ["Q?"]})", ":2: no \"id\""},
      {R"({"id": "a", "input": "b.txt", "questions": ["Q?"]})", ":2: duplicate id \"a\""},
      {R"({"id": "b", "questions": ["Q?"]})", ":2: no \"input\""},
      {R"({"id": "b", "input": "b.txt"})", ":2: no \"questions\" and no \"task\""},
      {R"({"id": "b", "input": "b.txt", "questions": []})", ":2: \"questions\" must be"},
      {R"({"id": "b", "input": "b.txt", "questions": ["Q?", "Q?"]})", ":2: question asked twice"},
      {R"({"id": "b", "input": "b.txt", "task": "translate"})", ":2: \"task\" must be \"summarize\""},
      {R"({"id": "b", "input": "b.txt", "questions": ["Q?"], "temperature": 1})", ":2: unknown key \"temperature\""},
      {R"({"id": "b", "input": "b.txt", "questions": ["Q?"], "memory": -4})", ":2: \"memory\" must be an integer"},
      {R"({"id": "b", "input": "b.txt", "questions": ["Q?"], "schedule": "xl"})", ":2: \"schedule\" must be"},
      {R"({"id": "b", "input": "b.txt", "questions": ["Q?"], "guided": "yes"})", ":2: \"guided\" must be"},
      {R"({"id": "b", "input": "none.txt", "questions": ["Q?"]})", ":2: input " + dir_ + "/none.txt"},
      {R"({"id": "b", "input": "sub", "questions": ["Q?"]})", ":2: input " + dir_ + "/sub is a directory"},
      {R"({"id": "b", "input": "b.txt", "questions": ["Q?"], "sha256": "abc"})", ":2: \"sha256\" must be 64"},
      {R"({"id": "b", "input": "b.txt", "questions": ["Q?"], "sha256": 7})", ":2: \"sha256\" must be 64"},
  };
  for (const auto& [line, message] : cases) {
    const auto docs = Parse(ok + "\n" + line + "\n");
    ASSERT_FALSE(docs.ok()) << line;
    EXPECT_NE(docs.status().message().find(manifest_ + message), std::string::npos)
        << line << " -> " << docs.status();
  }
  EXPECT_FALSE(Parse("\n\n").ok()) << "no documents";
}

// "sha256": read as given (any case), and the input checked against it.
TEST_F(BatchManifestTest, Sha256NamesTheInputsBytes) {
  testing::WriteRaw(dir_ + "/abc.txt", "abc");
  const std::string abc = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";  // FIPS 180-2's example
  auto digest = FileSha256(dir_ + "/abc.txt");
  SNAPFILL_ASSERT_OK(digest);
  EXPECT_EQ(*digest, abc);
  std::string upper = abc;
  std::transform(upper.begin(), upper.end(), upper.begin(), ::toupper);
  auto docs = Parse(R"({"id": "x", "input": "abc.txt", "questions": ["Q?"], "sha256": ")" + upper + "\"}\n" +
                    R"({"id": "y", "input": "a.txt", "questions": ["Q?"], "sha256": ")" + abc + "\"}\n" +
                    R"({"id": "z", "input": "b.txt", "questions": ["Q?"]})" "\n");
  SNAPFILL_ASSERT_OK(docs);
  EXPECT_EQ((*docs)[0].sha256, abc);
  SNAPFILL_EXPECT_OK(CheckInputSha256((*docs)[0], manifest_));
  SNAPFILL_EXPECT_OK(CheckInputSha256((*docs)[2], manifest_)) << "no sha256: nothing to check";
  const absl::Status wrong = CheckInputSha256((*docs)[1], manifest_);
  EXPECT_EQ(wrong.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(wrong.message().find(manifest_ + ":2: input " + dir_ + "/a.txt has SHA-256 "), std::string::npos)
      << wrong;
  EXPECT_NE(wrong.message().find("the manifest gives " + abc), std::string::npos) << wrong;
  EXPECT_EQ(FileSha256(dir_ + "/none.txt").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(BatchManifestTest, ShardsCoverEveryDocumentOnceAndBalanceBytes) {
  std::vector<BatchDocument> docs(23);
  for (size_t i = 0; i < docs.size(); ++i) docs[i].bytes = (i * 7919) % 1000 + 1;
  for (int n = 1; n <= 8; ++n) {
    const std::vector<int> shard = AssignShards(docs, n);
    ASSERT_EQ(shard.size(), docs.size());
    std::vector<uint64_t> load(n, 0);
    for (size_t i = 0; i < docs.size(); ++i) {
      ASSERT_GE(shard[i], 0);
      ASSERT_LT(shard[i], n);
      load[shard[i]] += docs[i].bytes;
    }
    // Largest first, each to the lightest: no shard is more than the
    // largest document above another.
    EXPECT_LE(*std::max_element(load.begin(), load.end()) - *std::min_element(load.begin(), load.end()), 1000u)
        << n << " shards";
    EXPECT_EQ(AssignShards(docs, n), shard) << "the same for every process";
  }
}

const char* NoEnv(const char*) { return nullptr; }
const char* SlurmCount(const char* name) {
  const std::string n = name;
  return n == "SLURM_ARRAY_TASK_ID" ? "2" : n == "SLURM_ARRAY_TASK_COUNT" ? "4" : nullptr;
}
const char* SlurmMinMax(const char* name) {
  const std::string n = name;
  return n == "SLURM_ARRAY_TASK_ID" ? "7" : n == "SLURM_ARRAY_TASK_MIN" ? "5" : n == "SLURM_ARRAY_TASK_MAX" ? "8" : nullptr;
}
const char* SlurmIdOnly(const char* name) { return std::string(name) == "SLURM_ARRAY_TASK_ID" ? "1" : nullptr; }

TEST(BatchShardTest, FromTheFlagOrSlurm) {
  EXPECT_EQ(*ResolveShard("", NoEnv), std::make_pair(0, 1));
  EXPECT_EQ(*ResolveShard("3/5", NoEnv), std::make_pair(3, 5));
  EXPECT_EQ(*ResolveShard("1/2", SlurmCount), std::make_pair(1, 2)) << "the flag wins";
  EXPECT_EQ(*ResolveShard("", SlurmCount), std::make_pair(2, 4));
  EXPECT_EQ(*ResolveShard("", SlurmMinMax), std::make_pair(2, 4));
  for (const char* bad : {"5/5", "-1/2", "1", "a/b", "1/0", "1/2/3"}) {
    EXPECT_EQ(ResolveShard(bad, NoEnv).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_EQ(ResolveShard("", SlurmIdOnly).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(BatchManifestTest, AnswersResumeAndTornLinesAreCut) {
  auto docs = Parse(R"({"id": "a", "input": "a.txt", "questions": ["Q1?", "Q2?"]})" "\n");
  SNAPFILL_ASSERT_OK(docs);
  const std::string out = dir_ + "/out.jsonl";
  auto answer = [&](const std::string& q, const std::string& model, const std::string& settings) {
    Json j;
    j["id"] = "a";
    j["question"] = q;
    j["answer"] = "x";
    j["model"] = model;
    j["settings"] = Json::parse(settings);
    return j.dump() + "\n";
  };
  const std::string settings = (*docs)[0].settings.Json();
  auto none = ReadAnswered(out, "m1", *docs);
  SNAPFILL_ASSERT_OK(none);
  EXPECT_TRUE(none->pairs.empty()) << "no output yet";
  const std::string first = answer("Q1?", "m1", settings);
  testing::WriteRaw(out, first + answer("Q2?", "m1", settings).substr(0, 30));
  auto done = ReadAnswered(out, "m1", *docs);
  SNAPFILL_ASSERT_OK(done);
  EXPECT_EQ(done->pairs, (std::set<std::pair<std::string, std::string>>{{"a", "Q1?"}}));
  EXPECT_EQ(done->torn_bytes, 30);
  EXPECT_EQ(testing::ReadAll(out), first) << "the torn line is cut from the file";
  // Another model, other settings, a line that is not an answer.
  EXPECT_EQ(ReadAnswered(out, "m2", *docs).status().code(), absl::StatusCode::kFailedPrecondition);
  BatchSettings other = (*docs)[0].settings;
  other.memory = 7;
  testing::WriteRaw(out, answer("Q1?", "m1", other.Json()));
  const auto refused = ReadAnswered(out, "m1", *docs);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("\"memory\":7"), std::string::npos) << refused.status();
  testing::WriteRaw(out, "{\"hello\": 1}\n");
  EXPECT_EQ(ReadAnswered(out, "m1", *docs).status().code(), absl::StatusCode::kDataLoss);
}

// The command on the tiny model.
class BatchCliTest : public testing::CliTest {
 protected:
  void SetUp() override {
    CliTest::SetUp();
    std::string manifest;
    for (int d = 0; d < 5; ++d) {
      std::string text;
      for (int i = 0; i < 60 * (d + 1); ++i) text += "Document " + std::to_string(d) + " says line " + std::to_string(i) + ".\n";
      testing::WriteRaw(dir_ + "/d" + std::to_string(d) + ".txt", text);
      manifest += "{\"id\": \"doc" + std::to_string(d) + "\", \"input\": \"d" + std::to_string(d) +
                  ".txt\", \"questions\": [\"What is said?\", \"Which document?\"]" +
                  (d == 3 ? ", \"guided\": true" : "") + (d == 4 ? ", \"memory\": 96" : "") + "}\n";
    }
    manifest_ = dir_ + "/m.jsonl";
    testing::WriteRaw(manifest_, manifest);
    // Sampled (the same seed, so repeatable): the tiny random model's greedy
    // answers are all line breaks, which would not tell two caches apart.
    job_ = "batch --model " + tiny_ + " --manifest " + manifest_ + " --memory 128 --chunk 128 --window 8 -n 4" +
           kSampling;
  }
  // (id, question) -> answer.
  std::map<std::pair<std::string, std::string>, std::string> Answers(const std::string& path) {
    std::map<std::pair<std::string, std::string>, std::string> m;
    std::istringstream in(testing::ReadAll(path));
    for (std::string line; std::getline(in, line);) {
      const Json j = Json::parse(line);
      EXPECT_TRUE(m.emplace(std::make_pair(j["id"], j["question"]), j["answer"]).second) << "answered twice: " << line;
    }
    return m;
  }
  // Documents doc0.. (d0.txt..) of one question each, "What is said?".
  static std::string OneQuestionEach(int docs) {
    std::string manifest;
    for (int d = 0; d < docs; ++d) {
      manifest += "{\"id\": \"doc" + std::to_string(d) + "\", \"input\": \"d" + std::to_string(d) +
                  ".txt\", \"questions\": [\"What is said?\"]}\n";
    }
    return manifest;
  }
  static constexpr const char* kSampling = " --temp 1.5 --top_k 0 --top_p 1 --seed 5";
  std::string manifest_, job_;
};

// Text as a JSON line holds it: bytes that are not UTF-8 become U+FFFD.
std::string AsJsonText(const std::string& raw) {
  return Json::parse(Json(raw).dump(-1, ' ', false, Json::error_handler_t::replace)).get<std::string>();
}

TEST_F(BatchCliTest, ResumedAndShardedJobsGiveTheAnswersOfOneRun) {
  testing::Result r = Run(job_ + " --out " + dir_ + "/all.jsonl");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto all = Answers(dir_ + "/all.jsonl");
  ASSERT_EQ(all.size(), 10u);
  std::set<std::string> distinct;
  for (const auto& [key, answer] : all) distinct.insert(answer);
  EXPECT_GT(distinct.size(), 5u) << "the answers should tell the documents and questions apart";
  {
    const Json first = Json::parse(testing::ReadAll(dir_ + "/all.jsonl").substr(0, testing::ReadAll(dir_ + "/all.jsonl").find('\n')));
    for (const char* key : {"id", "question", "answer", "input_tokens", "ttft_seconds", "decode_tokens_per_second",
                            "peak_rss_bytes", "settings", "model", "snapfill"}) {
      EXPECT_TRUE(first.contains(key)) << key;
    }
  }
  // A job that died while writing its fourth answer: resumed, it answers
  // the rest, and nothing twice.
  const std::string text = testing::ReadAll(dir_ + "/all.jsonl");
  size_t cut = 0;
  for (int i = 0; i < 3; ++i) cut = text.find('\n', cut) + 1;
  testing::WriteRaw(dir_ + "/resumed.jsonl", text.substr(0, cut + 25));
  EXPECT_FAILS_WITH(Run(job_ + " --out " + dir_ + "/resumed.jsonl"), 1, "add --resume");
  r = Run(job_ + " --out " + dir_ + "/resumed.jsonl --resume");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("torn line"), std::string::npos) << r.err;
  EXPECT_EQ(Answers(dir_ + "/resumed.jsonl"), all);
  // Three shards, one through Slurm's variables.
  std::map<std::pair<std::string, std::string>, std::string> merged;
  for (int s = 0; s < 3; ++s) {
    const std::string out = dir_ + "/shard" + std::to_string(s) + ".jsonl";
    r = s == 2 ? Run("--help >/dev/null; SLURM_ARRAY_TASK_ID=2 SLURM_ARRAY_TASK_COUNT=3 " + std::string(SNAPFILL_BINARY_DIR) +
                     "/bin/snapfill " + job_ + " --out " + out)
               : Run(job_ + " --shard " + std::to_string(s) + "/3 --out " + out);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    for (const auto& [key, answer] : Answers(out)) EXPECT_TRUE(merged.emplace(key, answer).second);
  }
  EXPECT_EQ(merged, all);
  // Resuming with other settings is refused, naming them.
  r = Run(job_ + " --window 16 --out " + dir_ + "/all.jsonl --resume");
  EXPECT_FAILS_WITH(r, 1, "\"window\":8");
  EXPECT_FAILS_WITH(Run("batch --model " + tiny_ + " --out " + dir_ + "/x.jsonl"), 2, "--manifest");
  EXPECT_FALSE(access((dir_ + "/x.jsonl").c_str(), F_OK) == 0);
}

// A document whose input is not the file its sha256 names is refused as it
// is taken: nothing is answered for it.
TEST_F(BatchCliTest, AnInputWithAnotherSha256IsRefused) {
  testing::WriteRaw(manifest_, R"({"id": "doc0", "input": "d0.txt", "questions": ["Q?"], "sha256": ")" +
                                   std::string(64, '0') + "\"}\n");
  const testing::Result r = Run(job_ + " --out " + dir_ + "/a.jsonl");
  EXPECT_FAILS_WITH(r, 1, ":1: input " + dir_ + "/d0.txt has SHA-256 ");
  EXPECT_EQ(testing::ReadAll(dir_ + "/a.jsonl"), "") << "nothing answered";
}

// A document stopped by SIGTERM in its prefill saves its checkpoint and the
// job stops (exit 130); --resume goes on from the checkpoint and gives the
// answer of an uninterrupted run, bit for bit, and the checkpoint is gone
// once the answer is written.
TEST_F(BatchCliTest, AStoppedDocumentResumesFromItsCheckpoint) {
  std::string text;
  for (int i = 0; i < 6000; ++i) text += "Line " + std::to_string(i) + " of the long document.\n";
  testing::WriteRaw(dir_ + "/long.txt", text);
  testing::WriteRaw(manifest_, R"({"id": "long", "input": "long.txt", "questions": ["What is said?"]})" "\n");
  // FM chunks of 32: some 4,000 steps, so the signal finds the prefill running.
  const std::string job = "batch --model " + tiny_ + " --manifest " + manifest_ +
                          " --schedule fm --memory 64 --chunk 32 --window 8 -n 4 --threads 1" + kSampling;
  testing::Result r = Run(job + " --out " + dir_ + "/ref.jsonl");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto ref = Answers(dir_ + "/ref.jsonl");
  ASSERT_EQ(ref.size(), 1u);
  const std::string ck = dir_ + "/ck";
  ASSERT_EQ(::mkdir(ck.c_str(), 0755), 0);
  const std::string out = dir_ + "/a.jsonl";
  const pid_t pid = Spawn(job + " --out " + out + " --checkpoint_dir " + ck + " --checkpoint_every 1");
  for (int i = 0; i < 20000 && access((ck + "/long.ck").c_str(), F_OK) != 0; ++i) ::usleep(500);
  ASSERT_EQ(::kill(pid, SIGTERM), 0);
  const int status = Wait(pid);
  ASSERT_TRUE(WIFEXITED(status)) << status;
  ASSERT_EQ(WEXITSTATUS(status), 130) << testing::ReadAll(dir_ + "/stderr");
  EXPECT_NE(testing::ReadAll(dir_ + "/stderr").find("its checkpoint " + ck + "/long.ck is saved"), std::string::npos)
      << testing::ReadAll(dir_ + "/stderr");
  EXPECT_EQ(testing::ReadAll(out), "") << "no answer yet";
  r = Run(job + " --out " + out + " --checkpoint_dir " + ck + " --resume");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("[batch] long: resuming from " + ck + "/long.ck after step "), std::string::npos) << r.err;
  EXPECT_EQ(Answers(out), ref);
  EXPECT_NE(access((ck + "/long.ck").c_str(), F_OK), 0) << "the checkpoint outlived its answer";
  EXPECT_FAILS_WITH(Run(job + " --out " + dir_ + "/b.jsonl --checkpoint_dir " + dir_ + "/none"), 2, "is not a folder");
}

// With --recall_dir, a stopped document keeps its store beside its
// checkpoint, and --resume cuts it back to what the checkpoint counted (the
// steps after it wrote more): the answers are an uninterrupted run's, for a
// document read once and for a guided one, and the stores go with them.
TEST_F(BatchCliTest, AStoppedDocumentResumesWithItsRecallStore) {
  std::string text;
  for (int i = 0; i < 6000; ++i) text += "Line " + std::to_string(i) + " of the long document.\n";
  testing::WriteRaw(dir_ + "/long.txt", text);
  const std::string stores = dir_ + "/stores", ck = dir_ + "/ck";
  ASSERT_EQ(::mkdir(stores.c_str(), 0755), 0);
  ASSERT_EQ(::mkdir(ck.c_str(), 0755), 0);
  for (const bool guided : {false, true}) {
    SCOPED_TRACE(guided ? "guided" : "read once");
    testing::WriteRaw(manifest_, std::string(R"({"id": "long", "input": "long.txt", "questions": ["What is said?"])") +
                                     (guided ? R"(, "guided": true)" : "") + "}\n");
    const std::string job = "batch --model " + tiny_ + " --manifest " + manifest_ +
                            " --schedule fm --memory 64 --chunk 32 --window 8 -n 4 --threads 1 --recall 16 --recall_dir " +
                            stores + kSampling;
    const std::string tag = guided ? "g" : "u";
    testing::Result r = Run(job + " --out " + dir_ + "/ref" + tag + ".jsonl");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto ref = Answers(dir_ + "/ref" + tag + ".jsonl");
    ASSERT_EQ(ref.size(), 1u);
    const std::string checkpoint = ck + (guided ? "/long.q0.ck" : "/long.ck");
    const std::string store = stores + (guided ? "/long.q0" : "/long");
    // Stopped (its last checkpoint counts the whole store), and killed
    // (steps after the checkpoint wrote more).
    for (const int signo : {SIGTERM, SIGKILL}) {
      const std::string out = dir_ + "/a" + tag + std::to_string(signo) + ".jsonl";
      const pid_t pid = Spawn(job + " --out " + out + " --checkpoint_dir " + ck + " --checkpoint_every 50");
      for (int i = 0; i < 40000 && access(checkpoint.c_str(), F_OK) != 0; ++i) ::usleep(500);
      ::usleep(20000);
      ASSERT_EQ(::kill(pid, signo), 0);
      const int status = Wait(pid);
      if (signo == SIGTERM) {
        ASSERT_TRUE(WIFEXITED(status)) << status;
        ASSERT_EQ(WEXITSTATUS(status), 130) << testing::ReadAll(dir_ + "/stderr");
      }
      EXPECT_EQ(access(store.c_str(), F_OK), 0) << "the stopped document's store stays for --resume";
      r = Run(job + " --out " + out + " --checkpoint_dir " + ck + " --resume");
      ASSERT_EQ(r.exit_code, 0) << r.err;
      EXPECT_NE(r.err.find("[batch] long: resuming from " + checkpoint + " after step "), std::string::npos) << r.err;
      EXPECT_EQ(Answers(out), ref) << "signal " << signo;
      EXPECT_NE(access(checkpoint.c_str(), F_OK), 0) << "the checkpoint outlived its answer";
      EXPECT_TRUE(testing::ListDir(stores).empty()) << "the stores go with the answers";
    }
  }
  // A checkpoint of a job without the store cannot resume one with it: the
  // document starts over.
  testing::WriteRaw(manifest_, R"({"id": "long", "input": "long.txt", "questions": ["What is said?"]})"
                               "\n");
  const std::string plain = "batch --model " + tiny_ + " --manifest " + manifest_ +
                            " --schedule fm --memory 64 --chunk 32 --window 8 -n 4 --threads 1" + kSampling;
  const pid_t pid = Spawn(plain + " --out " + dir_ + "/p.jsonl --checkpoint_dir " + ck + " --checkpoint_every 1");
  for (int i = 0; i < 20000 && access((ck + "/long.ck").c_str(), F_OK) != 0; ++i) ::usleep(500);
  ASSERT_EQ(::kill(pid, SIGTERM), 0);
  ASSERT_EQ(WEXITSTATUS(Wait(pid)), 130);
  const testing::Result r = Run(plain + " --recall 16 --recall_dir " + stores + " --out " + dir_ + "/p.jsonl" +
                                " --checkpoint_dir " + ck + " --resume");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("it counted no recall store"), std::string::npos) << r.err;
  EXPECT_EQ(Answers(dir_ + "/p.jsonl"), Answers(dir_ + "/refu.jsonl"));
}

// --cache_dir keeps each document's cache: a later generate --cache with
// the same question gives the batch's answer.
TEST_F(BatchCliTest, CacheDirKeepsCachesForLaterQuestions) {
  const std::string manifest = OneQuestionEach(3);
  testing::WriteRaw(manifest_, manifest);
  const std::string caches = dir_ + "/caches";
  ASSERT_EQ(::mkdir(caches.c_str(), 0755), 0);
  testing::Result r = Run(job_ + " --cache_dir " + caches + " --out " + dir_ + "/a.jsonl");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto answers = Answers(dir_ + "/a.jsonl");
  ASSERT_EQ(answers.size(), 3u);
  for (int d = 0; d < 3; ++d) {
    const std::string id = "doc" + std::to_string(d);
    r = Run("generate --model " + tiny_ + " --cache " + caches + "/" + id + ".kv --prompt 'What is said?' -n 4 --batch 64" +
            kSampling);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    ASSERT_FALSE(r.out.empty());
    EXPECT_EQ(AsJsonText(r.out.substr(0, r.out.size() - 1)), answers.at({id, "What is said?"})) << id;
  }
  testing::WriteRaw(manifest_, R"({"id": "a/b", "input": "d0.txt", "questions": ["Q?"]})" "\n");
  EXPECT_FAILS_WITH(Run(job_ + " --cache_dir " + caches + " --out " + dir_ + "/b.jsonl"), 2, "cannot name a cache file");
  EXPECT_FAILS_WITH(Run(job_ + " --cache_dir " + dir_ + "/none --out " + dir_ + "/b.jsonl"), 2, "is not a folder");
}

// --recall_dir: each document's store takes what its prefill evicts, and
// each question brings back what it attends to most before it is read. With
// --cache_dir the store stays beside the cache, and generate --cache
// --recall_dir gives the batch's answer (at the input's positions, where
// neither moves the question); without, the stores go with the answers. A
// guided document recalls at its last step. Each answer records the recall.
TEST_F(BatchCliTest, RecallDirBringsBackWhatEachQuestionNeeds) {
  const std::string manifest = OneQuestionEach(3);
  testing::WriteRaw(manifest_, manifest);
  const std::string caches = dir_ + "/caches", stores = dir_ + "/stores";
  ASSERT_EQ(::mkdir(caches.c_str(), 0755), 0);
  ASSERT_EQ(::mkdir(stores.c_str(), 0755), 0);
  const std::string recall = job_ + " --original_positions --recall 16 --recall_dir " + stores;
  testing::Result r = Run(recall + " --cache_dir " + caches + " --out " + dir_ + "/a.jsonl");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto answers = Answers(dir_ + "/a.jsonl");
  ASSERT_EQ(answers.size(), 3u);
  std::istringstream lines(testing::ReadAll(dir_ + "/a.jsonl"));
  for (std::string line; std::getline(lines, line);) {
    EXPECT_EQ(Json::parse(line)["settings"]["recall"], 16) << line;
  }
  for (int d = 0; d < 3; ++d) {
    const std::string id = "doc" + std::to_string(d);
    r = Run("generate --model " + tiny_ + " --cache " + caches + "/" + id + ".kv --recall_dir " + stores + "/" + id +
            " --recall 16 --prompt 'What is said?' -n 4 --batch 64" + kSampling);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.err.find("recall: 16 entries per layer and KV head brought back"), std::string::npos) << r.err;
    ASSERT_FALSE(r.out.empty());
    EXPECT_EQ(AsJsonText(r.out.substr(0, r.out.size() - 1)), answers.at({id, "What is said?"})) << id;
  }

  // Without --cache_dir, and a guided document: every store goes.
  testing::WriteRaw(manifest_, manifest + R"({"id": "g", "input": "d1.txt", "questions": ["Q?"], "guided": true})"
                                          "\n");
  const std::string others = dir_ + "/others";
  ASSERT_EQ(::mkdir(others.c_str(), 0755), 0);
  r = Run(job_ + " --recall 16 --recall_dir " + others + " --out " + dir_ + "/b.jsonl");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(Answers(dir_ + "/b.jsonl").size(), 4u);
  EXPECT_TRUE(testing::ListDir(others).empty()) << "the stores go with the answers";

  // Answers given without the recall are not resumed with it; refusals.
  r = Run(job_ + " --out " + dir_ + "/c.jsonl");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FAILS_WITH(Run(job_ + " --recall_dir " + others + " --out " + dir_ + "/c.jsonl --resume"), 1,
                    "was answered with the settings");
  EXPECT_FAILS_WITH(Run(job_ + " --recall_dir " + dir_ + "/none --out " + dir_ + "/d.jsonl"), 2, "is not a folder");
}

// The launchers' variables, and a build without MPI refusing to be one of
// several ranks.
const char* OpenMpiThree(const char* name) { return std::string(name) == "OMPI_COMM_WORLD_SIZE" ? "3" : nullptr; }
const char* PmiTwo(const char* name) { return std::string(name) == "PMI_SIZE" ? "2" : nullptr; }
const char* PmiBad(const char* name) { return std::string(name) == "PMI_SIZE" ? "two" : nullptr; }

TEST(BatchMpiTest, RanksFromTheLauncherAndRefusedWithoutMpi) {
  EXPECT_EQ(*LaunchedRanks(NoEnv), 1);
  EXPECT_EQ(*LaunchedRanks(OpenMpiThree), 3);
  EXPECT_EQ(*LaunchedRanks(PmiTwo), 2);
  const auto bad = LaunchedRanks(PmiBad);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("PMI_SIZE=two"), std::string::npos) << bad.status();
  SNAPFILL_EXPECT_OK(RanksSupported(1, /*with_mpi=*/false));
  SNAPFILL_EXPECT_OK(RanksSupported(3, /*with_mpi=*/true));
  const absl::Status refused = RanksSupported(3, /*with_mpi=*/false);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.message().find("one of 3 MPI ranks"), std::string::npos) << refused;
  EXPECT_NE(refused.message().find("built without MPI"), std::string::npos) << refused;
}

TEST(BatchMpiTest, RankFilesAreFoundByName) {
  const std::string dir = testing::MakeTempDir("rankfiles");
  const std::string out = dir + "/answers.jsonl";
  EXPECT_EQ(RankOutPath(out, 2), out + ".rank2");
  for (const char* name : {"answers.jsonl.rank0", "answers.jsonl.rank12", "answers.jsonl.rankx", "answers.jsonl.rank",
                           "other.jsonl.rank1", "answers.jsonl"}) {
    testing::WriteRaw(dir + "/" + name, "");
  }
  EXPECT_EQ(ExistingRankOuts(out), (std::vector<std::string>{out + ".rank0", out + ".rank12"}));
}

// mpirun's ranks on this machine, as root where the tests run as root.
std::string Mpirun(int ranks) {
  return "--help >/dev/null; OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 "
         "OMPI_MCA_btl_vader_single_copy_mechanism=none mpirun -np " +
         std::to_string(ranks) + " " + std::string(SNAPFILL_BINARY_DIR) + "/bin/snapfill ";
}

// Three ranks take the documents as they become free; rank 0 merges their
// files into --out. The answers are one process's, bit for bit (the same
// settings and one thread each), each once; the rank files are gone. A job
// whose ranks stopped (their files left, one ending in a torn line) is
// refused without --resume, and resumed answers exactly what they lack.
TEST_F(BatchCliTest, MpiRanksGiveTheAnswersOfOneProcess) {
  if (!BuiltWithMpi()) GTEST_SKIP() << "built without MPI (tools/install_deps.sh installs OpenMPI)";
  // 12 small documents of 4 sizes, two questions each.
  std::string manifest;
  for (int d = 0; d < 12; ++d) {
    std::string text;
    for (int i = 0; i < 40 * (d % 4 + 1); ++i) text += "Paper " + std::to_string(d) + " line " + std::to_string(i) + ".\n";
    const std::string id = (d < 10 ? "doc0" : "doc") + std::to_string(d);
    testing::WriteRaw(dir_ + "/" + id + ".txt", text);
    manifest += "{\"id\": \"" + id + "\", \"input\": \"" + id + ".txt\", \"questions\": [\"What is said?\", \"Which paper?\"]}\n";
  }
  testing::WriteRaw(manifest_, manifest);
  const std::string job = job_ + " --threads 1";
  testing::Result r = Run(job + " --out " + dir_ + "/one.jsonl");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto one = Answers(dir_ + "/one.jsonl");
  ASSERT_EQ(one.size(), 24u);
  r = Run(Mpirun(3) + job + " --out " + dir_ + "/three.jsonl");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("over 3 MPI ranks"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("merged from 3 rank files"), std::string::npos) << r.err;
  EXPECT_EQ(Answers(dir_ + "/three.jsonl"), one);
  EXPECT_TRUE(ExistingRankOuts(dir_ + "/three.jsonl").empty());
  // The merged file is in the manifest's order.
  {
    std::istringstream in(testing::ReadAll(dir_ + "/three.jsonl"));
    std::vector<std::string> ids;
    for (std::string line; std::getline(in, line);) ids.push_back(Json::parse(line)["id"]);
    EXPECT_TRUE(std::is_sorted(ids.begin(), ids.end())) << "doc00 .. doc11, each document's questions together";
  }
  // Stopped ranks: rank 1 wrote two answers and died inside a third; rank 0
  // wrote one.
  std::vector<std::string> lines;
  {
    std::istringstream in(testing::ReadAll(dir_ + "/one.jsonl"));
    for (std::string line; std::getline(in, line);) lines.push_back(line + "\n");
  }
  const std::string out = dir_ + "/stopped.jsonl";
  testing::WriteRaw(RankOutPath(out, 1), lines[4] + lines[9] + lines[2].substr(0, 40));
  testing::WriteRaw(RankOutPath(out, 0), lines[0]);
  EXPECT_FAILS_WITH(Run(Mpirun(3) + job + " --out " + out), 1, "rank that stopped");
  r = Run(Mpirun(3) + job + " --out " + out + " --resume");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("21 answers to give (3 already"), std::string::npos) << r.err;
  EXPECT_EQ(Answers(out), one) << "every answer once, none lost";
  EXPECT_TRUE(ExistingRankOuts(out).empty());
  // One process resuming what ranks left merges their files as well.
  const std::string solo = dir_ + "/solo.jsonl";
  testing::WriteRaw(solo, lines[1]);
  testing::WriteRaw(RankOutPath(solo, 2), lines[3] + lines[5]);
  r = Run(job + " --out " + solo + " --resume");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(Answers(solo), one);
  EXPECT_TRUE(ExistingRankOuts(solo).empty());
}

}  // namespace
}  // namespace snapfill::cli
