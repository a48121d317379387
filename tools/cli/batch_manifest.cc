#include "tools/cli/batch_manifest.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <numeric>
#include <sstream>
#include <vector>

#include <openssl/evp.h>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"
#include "snapfill/status.h"
#include "src/base/file_util.h"

namespace snapfill::cli {
namespace {

using Json = nlohmann::json;

absl::Status LineError(const std::string& manifest, int64_t line, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(manifest, ":", line, ": ", what));
}

// Reads the settings a line may give over the defaults.
absl::Status ReadSettings(const Json& j, BatchSettings* s, const std::string& manifest, int64_t line) {
  auto integer = [&](const char* key, int64_t* out, int64_t min) -> absl::Status {
    if (!j.contains(key)) return absl::OkStatus();
    if (!j[key].is_number_integer() || j[key].get<int64_t>() < min) {
      return LineError(manifest, line, absl::StrCat("\"", key, "\" must be an integer >= ", min));
    }
    *out = j[key].get<int64_t>();
    return absl::OkStatus();
  };
  if (j.contains("schedule")) {
    if (!j["schedule"].is_string() ||
        (j["schedule"] != "fm" && j["schedule"] != "im" && j["schedule"] != "imdc")) {
      return LineError(manifest, line, "\"schedule\" must be \"fm\", \"im\" or \"imdc\"");
    }
    s->schedule = j["schedule"].get<std::string>();
  }
  SNAPFILL_RETURN_IF_ERROR(integer("memory", &s->memory, 1));
  SNAPFILL_RETURN_IF_ERROR(integer("chunk", &s->chunk, 1));
  SNAPFILL_RETURN_IF_ERROR(integer("n", &s->n, 1));
  int64_t seed = static_cast<int64_t>(s->seed);
  SNAPFILL_RETURN_IF_ERROR(integer("seed", &seed, 0));
  s->seed = static_cast<uint64_t>(seed);
  if (j.contains("guided")) {
    if (!j["guided"].is_boolean()) return LineError(manifest, line, "\"guided\" must be true or false");
    s->guided = j["guided"].get<bool>();
  }
  return absl::OkStatus();
}

// The lines of a text (the last one may be empty).
std::vector<std::string_view> Lines(std::string_view text) {
  std::vector<std::string_view> lines;
  for (size_t at = 0; at <= text.size();) {
    const size_t nl = text.find('\n', at);
    const size_t end = nl == std::string_view::npos ? text.size() : nl;
    lines.push_back(text.substr(at, end - at));
    at = end + 1;
  }
  return lines;
}

bool ParseInt(std::string_view text, int* out) {
  const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), *out);
  return ec == std::errc() && ptr == text.data() + text.size() && !text.empty();
}

std::string Folder(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
}

}  // namespace

std::string BatchSettings::Json() const {
  // Keys in nlohmann's order (sorted), so that the text compares as parsed.
  return absl::StrFormat(
      R"({"chunk":%d,"guided":%s,%s"memory":%d,"n":%d,%s"pruner":"%s",%s%s"schedule":"%s","seed":%d,"temp":%s,"top_k":%d,"top_p":%s,"window":%d})",
      chunk, guided ? "true" : "false", !guided && keep_last_chunk ? R"("keep_last_chunk":true,)" : "", memory, n,
      original_positions ? R"("original_positions":true,)" : "", pruner,
      recall > 0 ? absl::StrFormat(R"("recall":%d,)", recall) : std::string(),
      recall > 0 && recall_heads ? R"("recall_rank":"heads",)" : "", schedule, seed, nlohmann::json(temp).dump(), top_k,
      nlohmann::json(top_p).dump(), window);
}

absl::StatusOr<std::vector<BatchDocument>> ParseManifest(std::string_view text, const std::string& manifest_path,
                                                         const BatchSettings& defaults) {
  static const std::set<std::string> kKeys = {"id",     "input", "sha256", "questions", "task", "schedule",
                                              "memory", "chunk", "n",      "seed",      "guided"};
  std::vector<BatchDocument> docs;
  std::set<std::string> ids;
  int64_t line_no = 0;
  for (const std::string_view line : Lines(text)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    const Json j = Json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) return LineError(manifest_path, line_no, "not a JSON object");
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (!kKeys.count(it.key())) {
        return LineError(manifest_path, line_no,
                         absl::StrCat("unknown key \"", it.key(),
                                      "\" (known: id, input, sha256, questions, task, schedule, memory, chunk, n, "
                                      "seed, guided)"));
      }
    }
    BatchDocument d;
    d.line = line_no;
    if (!j.contains("id") || !j["id"].is_string() || j["id"].get<std::string>().empty()) {
      return LineError(manifest_path, line_no, "no \"id\" (a non-empty string)");
    }
    d.id = j["id"].get<std::string>();
    if (!ids.insert(d.id).second) return LineError(manifest_path, line_no, absl::StrCat("duplicate id \"", d.id, "\""));
    if (!j.contains("input") || !j["input"].is_string() || j["input"].get<std::string>().empty()) {
      return LineError(manifest_path, line_no, "no \"input\" (a file's path)");
    }
    d.input = j["input"].get<std::string>();
    if (d.input[0] != '/') d.input = Folder(manifest_path) + "/" + d.input;
    if (j.contains("sha256")) {
      const bool hex = j["sha256"].is_string() && j["sha256"].get<std::string>().size() == 64 &&
                       j["sha256"].get<std::string>().find_first_not_of("0123456789abcdefABCDEF") == std::string::npos;
      if (!hex) return LineError(manifest_path, line_no, "\"sha256\" must be 64 hexadecimal digits");
      d.sha256 = absl::AsciiStrToLower(j["sha256"].get<std::string>());
    }
    if (j.contains("questions")) {
      if (!j["questions"].is_array() || j["questions"].empty()) {
        return LineError(manifest_path, line_no, "\"questions\" must be a non-empty list of strings");
      }
      for (const Json& q : j["questions"]) {
        if (!q.is_string() || q.get<std::string>().empty()) {
          return LineError(manifest_path, line_no, "\"questions\" must be a non-empty list of strings");
        }
        d.questions.push_back(q.get<std::string>());
      }
    }
    if (j.contains("task")) {
      if (j["task"] != "summarize") return LineError(manifest_path, line_no, "\"task\" must be \"summarize\"");
      d.questions.emplace_back(kSummarizePrompt);
    }
    if (d.questions.empty()) return LineError(manifest_path, line_no, "no \"questions\" and no \"task\"");
    std::set<std::string> asked;
    for (const std::string& q : d.questions) {
      if (!asked.insert(q).second) return LineError(manifest_path, line_no, absl::StrCat("question asked twice: ", q));
    }
    d.settings = defaults;
    SNAPFILL_RETURN_IF_ERROR(ReadSettings(j, &d.settings, manifest_path, line_no));
    struct stat st {};
    if (::stat(d.input.c_str(), &st) != 0) {
      const int err = errno;
      const std::string what = absl::StrCat(manifest_path, ":", line_no, ": input ", d.input, ": ", std::strerror(err));
      return err == ENOENT ? absl::NotFoundError(what) : absl::PermissionDeniedError(what);
    }
    if (S_ISDIR(st.st_mode)) return LineError(manifest_path, line_no, absl::StrCat("input ", d.input, " is a directory"));
    d.bytes = static_cast<uint64_t>(st.st_size);
    docs.push_back(std::move(d));
  }
  if (docs.empty()) return absl::InvalidArgumentError(absl::StrCat(manifest_path, ": no documents"));
  return docs;
}

std::vector<int> AssignShards(const std::vector<BatchDocument>& documents, int count) {
  std::vector<size_t> order(documents.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return documents[a].bytes > documents[b].bytes; });
  std::vector<uint64_t> load(std::max(count, 1), 0);
  std::vector<int> shard(documents.size(), 0);
  for (const size_t d : order) {
    const int s = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    shard[d] = s;
    load[s] += documents[d].bytes + 1;  // + 1: empty files spread too
  }
  return shard;
}

absl::StatusOr<std::pair<int, int>> ResolveShard(const std::string& flag, const char* (*getenv)(const char*)) {
  auto number = [](std::string_view text, int* out) { return ParseInt(text, out); };
  int index = 0, count = 1;
  if (!flag.empty()) {
    const size_t slash = flag.find('/');
    const std::string_view f(flag);
    if (slash == std::string::npos || !number(f.substr(0, slash), &index) || !number(f.substr(slash + 1), &count) ||
        count < 1 || index < 0 ||
        index >= count) {
      return absl::InvalidArgumentError(absl::StrCat("--shard=", flag, ": expected i/N with 0 <= i < N"));
    }
    return std::make_pair(index, count);
  }
  const char* id = getenv("SLURM_ARRAY_TASK_ID");
  if (id == nullptr) return std::make_pair(0, 1);
  int task = 0;
  if (!number(id, &task)) return absl::InvalidArgumentError(absl::StrCat("SLURM_ARRAY_TASK_ID=", id, ": not a number"));
  const char* n = getenv("SLURM_ARRAY_TASK_COUNT");
  const char* min = getenv("SLURM_ARRAY_TASK_MIN");
  const char* max = getenv("SLURM_ARRAY_TASK_MAX");
  int lo = 0, hi = 0;
  if (min != nullptr && max != nullptr && number(min, &lo) && number(max, &hi) && hi >= lo) {
    index = task - lo;
    count = hi - lo + 1;
  } else if (n != nullptr && number(n, &count)) {
    index = task;
  } else {
    return absl::InvalidArgumentError(
        "SLURM_ARRAY_TASK_ID is set without SLURM_ARRAY_TASK_COUNT or SLURM_ARRAY_TASK_MIN/MAX: give --shard i/N");
  }
  if (count < 1 || index < 0 || index >= count) {
    return absl::InvalidArgumentError(
        absl::StrCat("the Slurm array task ", task, " is not one of ", count, " tasks: give --shard i/N"));
  }
  return std::make_pair(index, count);
}

absl::StatusOr<AnsweredSet> ReadAnswered(const std::string& path, const std::string& model_fingerprint,
                                         const std::vector<BatchDocument>& documents) {
  AnsweredSet done;
  std::ifstream in(path, std::ios::binary);
  if (!in) return done;
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  in.close();
  // Up to the last newline: what follows it is a line the job did not finish.
  const size_t last_newline = text.rfind('\n');
  const size_t complete = last_newline == std::string::npos ? 0 : last_newline + 1;
  if (complete < text.size()) {
    done.torn_bytes = static_cast<int64_t>(text.size() - complete);
    if (::truncate(path.c_str(), static_cast<off_t>(complete)) != 0) {
      return absl::PermissionDeniedError(absl::StrCat("cannot cut the torn last line of ", path, ": ",
                                                      std::strerror(errno)));
    }
  }
  std::map<std::string, const BatchDocument*> by_id;
  for (const BatchDocument& d : documents) by_id[d.id] = &d;
  int64_t line_no = 0;
  for (const std::string_view line : Lines(std::string_view(text).substr(0, complete))) {
    ++line_no;
    if (line.empty()) continue;
    const Json j = Json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("id") || !j.contains("question") ||
        !j.contains("model") || !j.contains("settings")) {
      return absl::DataLossError(absl::StrCat(path, ":", line_no, ": not an answer of snapfill batch"));
    }
    if (j["model"] != model_fingerprint) {
      return absl::FailedPreconditionError(absl::StrCat(
          path, ":", line_no, ": answered with another model (", j["model"].dump(), ", this one is \"",
          model_fingerprint, "\"): give another --out, or the same model"));
    }
    const std::string id = j["id"].get<std::string>();
    const auto it = by_id.find(id);
    if (it != by_id.end() && j["settings"] != Json::parse(it->second->settings.Json())) {
      return absl::FailedPreconditionError(absl::StrCat(
          path, ":", line_no, ": document \"", id, "\" was answered with the settings ", j["settings"].dump(),
          " and the manifest now gives ", it->second->settings.Json(), ": give another --out, or the same settings"));
    }
    const std::pair<std::string, std::string> key = {id, j["question"].get<std::string>()};
    if (done.pairs.insert(key).second) {
      done.text.emplace(key, std::string(line));
      done.order.push_back(key);
    }
    ++done.lines;
  }
  return done;
}

absl::StatusOr<AnsweredSet> ReadAnswered(const std::vector<std::string>& paths, const std::string& model_fingerprint,
                                         const std::vector<BatchDocument>& documents) {
  AnsweredSet all;
  for (const std::string& path : paths) {
    SNAPFILL_ASSIGN_OR_RETURN(AnsweredSet one, ReadAnswered(path, model_fingerprint, documents));
    all.lines += one.lines;
    all.torn_bytes += one.torn_bytes;
    for (const auto& key : one.order) {
      if (all.pairs.insert(key).second) {
        all.text.emplace(key, one.text.at(key));
        all.order.push_back(key);
      }
    }
  }
  return all;
}

std::string RankOutPath(const std::string& out, int rank) { return absl::StrCat(out, ".rank", rank); }

std::vector<std::string> ExistingRankOuts(const std::string& out) {
  const size_t slash = out.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : out.substr(0, slash));
  const std::string prefix = absl::StrCat(slash == std::string::npos ? out : out.substr(slash + 1), ".rank");
  std::vector<std::string> found;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return found;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string digits = name.substr(prefix.size());
    if (digits.find_first_not_of("0123456789") != std::string::npos) continue;
    found.push_back(slash == std::string::npos ? name : absl::StrCat(dir == "/" ? "" : dir, "/", name));
  }
  ::closedir(d);
  std::sort(found.begin(), found.end());
  return found;
}

absl::Status MergeAnswers(const std::string& out, const AnsweredSet& answers,
                          const std::vector<BatchDocument>& documents) {
  SNAPFILL_ASSIGN_OR_RETURN(auto writer, AtomicFileWriter::Create(out, /*overwrite=*/true));
  std::set<std::pair<std::string, std::string>> written;
  auto write = [&](const std::pair<std::string, std::string>& key) -> absl::Status {
    const auto it = answers.text.find(key);
    if (it == answers.text.end() || !written.insert(key).second) return absl::OkStatus();
    SNAPFILL_RETURN_IF_ERROR(writer->Write(it->second));
    return writer->Write("\n");
  };
  for (const BatchDocument& d : documents) {
    for (const std::string& q : d.questions) SNAPFILL_RETURN_IF_ERROR(write({d.id, q}));
  }
  for (const auto& key : answers.order) SNAPFILL_RETURN_IF_ERROR(write(key));
  return writer->Commit();
}

absl::StatusOr<std::string> FileSha256(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return FileErrnoStatus(errno, "cannot open", path);
  std::unique_ptr<EVP_MD_CTX, void (*)(EVP_MD_CTX*)> ctx(EVP_MD_CTX_new(), &EVP_MD_CTX_free);
  if (ctx == nullptr || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1) {
    return absl::InternalError("OpenSSL: cannot start a SHA-256");
  }
  std::vector<char> block(1 << 20);
  while (in) {
    in.read(block.data(), static_cast<std::streamsize>(block.size()));
    if (in.gcount() > 0 && EVP_DigestUpdate(ctx.get(), block.data(), static_cast<size_t>(in.gcount())) != 1) {
      return absl::InternalError("OpenSSL: SHA-256 update failed");
    }
  }
  if (in.bad()) return FileErrnoStatus(errno, "error reading", path);
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_DigestFinal_ex(ctx.get(), digest, &len) != 1) return absl::InternalError("OpenSSL: SHA-256 final failed");
  std::string hex;
  for (unsigned int i = 0; i < len; ++i) absl::StrAppendFormat(&hex, "%02x", digest[i]);
  return hex;
}

absl::Status CheckInputSha256(const BatchDocument& d, const std::string& manifest_path) {
  if (d.sha256.empty()) return absl::OkStatus();
  SNAPFILL_ASSIGN_OR_RETURN(const std::string got, FileSha256(d.input));
  if (got == d.sha256) return absl::OkStatus();
  return absl::DataLossError(absl::StrCat(manifest_path, ":", d.line, ": input ", d.input, " has SHA-256 ", got,
                                          ", the manifest gives ", d.sha256, ": the file is not the one named"));
}

}  // namespace snapfill::cli
