// snapfill batch's files: the manifest of documents (JSONL in), the answers
// (JSONL out, resumable), and the split of the documents into shards.
//
// A manifest line: {"id": "a", "input": "docs/a.txt", "questions": ["..."]},
// optionally with the input's "sha256" (checked as the document is taken),
// or with "task": "summarize" in place of the questions; optional settings
// "schedule" (fm|im|imdc), "memory", "chunk", "n", "seed" and "guided" (the
// question guides the compression: a prefill per question). A relative
// input path is taken from the manifest's folder.
#ifndef SNAPFILL_TOOLS_CLI_BATCH_MANIFEST_H_
#define SNAPFILL_TOOLS_CLI_BATCH_MANIFEST_H_

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace snapfill::cli {

// What `task: summarize` asks.
inline constexpr std::string_view kSummarizePrompt = "Summarize the text above in a few sentences.";

struct BatchSettings {
  std::string schedule = "imdc";
  int64_t memory = 1024;
  int64_t chunk = 1024;
  int64_t n = 64;
  uint64_t seed = 0;
  bool guided = false;
  // The job's own (flags, the same for every document).
  int64_t window = 32;
  std::string pruner = "auto";
  double temp = 0;
  int64_t top_k = 0;
  double top_p = 1;
  // The recall tier (--recall_dir): entries per layer and KV head each
  // question brings back; 0: none (and not recorded, so answers written
  // before the tier existed still match).
  int64_t recall = 0;
  // --original_positions (recorded only where set, as recall).
  bool original_positions = false;
  // --recall_rank=heads (recorded only where set: answers written when the
  // per-head ranking was the only one resume with the summed one).
  bool recall_heads = false;
  // --keep_last_chunk, for an unguided document (its questions are read
  // after the prefill); recorded only there and where set, so answers
  // written before it existed, or guided, still match.
  bool keep_last_chunk = false;
  // As recorded with every answer: {"schedule":"imdc","memory":1024,...}.
  std::string Json() const;
  bool operator==(const BatchSettings&) const = default;
};

struct BatchDocument {
  std::string id;
  std::string input;  // resolved against the manifest's folder
  std::string sha256;  // the input's SHA-256 in lowercase hex, if the line gives one
  std::vector<std::string> questions;
  BatchSettings settings;
  uint64_t bytes = 0;  // the input's size, for the shards
  int64_t line = 0;    // 1-based, in the manifest
};

// Every line checked before anything runs; InvalidArgument naming the line
// and what is wrong (not JSON, no id, a duplicate id, no questions, an
// unknown key or task, a bad setting), NotFound for a missing input,
// InvalidArgument for an input that is a directory. Blank lines are skipped.
absl::StatusOr<std::vector<BatchDocument>> ParseManifest(std::string_view text, const std::string& manifest_path,
                                                         const BatchSettings& defaults);

// The shard of each document (in [0, count)): by size, largest first, each
// to the shard with the fewest bytes so far (the lowest index on a tie), so
// that shards finish together. The same for every process that reads the
// same manifest.
std::vector<int> AssignShards(const std::vector<BatchDocument>& documents, int count);

// "--shard i/N", else SLURM_ARRAY_TASK_ID with SLURM_ARRAY_TASK_COUNT (or
// SLURM_ARRAY_TASK_MIN and _MAX), else 0/1. `getenv` is how variables are
// read (the command passes std::getenv). InvalidArgument for a malformed
// value, naming it.
absl::StatusOr<std::pair<int, int>> ResolveShard(const std::string& flag, const char* (*getenv)(const char*));

// What an output file holds for --resume: the (id, question) pairs already
// answered, and for each the settings and model it was answered with.
struct AnsweredSet {
  std::set<std::pair<std::string, std::string>> pairs;
  int64_t lines = 0;
  int64_t torn_bytes = 0;  // a last line without its newline, cut off
  // Each pair's line as first read (without its newline), and the pairs in
  // the order they were first read: what MergeAnswers writes.
  std::map<std::pair<std::string, std::string>, std::string> text;
  std::vector<std::pair<std::string, std::string>> order;
};
// Reads `path` (absent: nothing answered). A last line without a newline is
// torn (the job died while writing it): it is cut from the file and not
// counted. FailedPrecondition naming the line and the difference for an
// answer written with another model or with other settings than `documents`
// give that id now; DataLoss for a line that is not an answer.
absl::StatusOr<AnsweredSet> ReadAnswered(const std::string& path, const std::string& model_fingerprint,
                                         const std::vector<BatchDocument>& documents);
// The same over several files (`--out` and the ranks' files): their union,
// a pair answered in more than one counted once; torn bytes summed.
absl::StatusOr<AnsweredSet> ReadAnswered(const std::vector<std::string>& paths, const std::string& model_fingerprint,
                                         const std::vector<BatchDocument>& documents);

// The SHA-256 of a file's bytes, in lowercase hex (OpenSSL, streamed).
absl::StatusOr<std::string> FileSha256(const std::string& path);
// OK where the document gives no sha256 or its input has that one;
// DataLoss naming the manifest's line and both digests otherwise.
absl::Status CheckInputSha256(const BatchDocument& d, const std::string& manifest_path);

// The file each MPI rank writes its answers to: `out` + ".rank<r>".
std::string RankOutPath(const std::string& out, int rank);
// The rank files of `out` that exist (of any number of ranks), sorted.
std::vector<std::string> ExistingRankOuts(const std::string& out);

// Writes `answers` to `out` (replacing it, atomically): the manifest's
// pairs in its order (document by document, each document's questions in
// order), then any other pair in the order read. Each pair once.
absl::Status MergeAnswers(const std::string& out, const AnsweredSet& answers,
                          const std::vector<BatchDocument>& documents);

}  // namespace snapfill::cli

#endif  // SNAPFILL_TOOLS_CLI_BATCH_MANIFEST_H_
