#include "src/kv/checkpoint_file.h"

#include <xxhash.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "snapfill/status.h"
#include "src/kv/kv_file_format.h"

namespace snapfill {
namespace {

constexpr internal::KvFileFormat kFormat{
    std::string_view(kCheckpointFileMagic, sizeof(kCheckpointFileMagic)), kCheckpointFileVersion,
    "checkpoint", "start the run again with --force instead of --resume"};
constexpr absl::string_view kFirstLine = "snapfill-checkpoint 1";
// Far above any model; bounds the text block's retention list.
constexpr int64_t kMaxLayers = 4096;

std::string TextBlock(const CheckpointState& s) {
  std::string text = absl::StrCat(kFirstLine, "\n", "config=", s.config, "\n");
  absl::StrAppendFormat(&text, "input_digest=%016x\nplan_digest=%016x\n", s.input_digest,
                        s.plan_digest);
  absl::StrAppend(&text, "threads=", s.threads, "\nsteps_done=", s.steps_done,
                  "\ntotal_steps=", s.total_steps, "\nretention=");
  for (size_t i = 0; i < s.retention.size(); ++i) {
    absl::StrAppendFormat(&text, "%s%a", i ? "," : "", s.retention[i]);
  }
  text += "\n";
  if (!s.recall_slots.empty()) absl::StrAppend(&text, "recall_slots=", absl::StrJoin(s.recall_slots, ","), "\n");
  return text;
}

// Strict integer parsing: the whole string, base 10 or 16, in [lo, hi].
bool ParseInt(std::string_view v, int base, int64_t lo, int64_t hi, int64_t* out) {
  if (v.empty() || v.size() > 20 || v[0] == '-' || v[0] == '+' || v[0] == ' ') return false;
  const std::string s(v);
  char* end = nullptr;
  errno = 0;
  const unsigned long long x = std::strtoull(s.c_str(), &end, base);
  if (errno != 0 || end != s.c_str() + s.size()) return false;
  if (base == 16) {
    *out = static_cast<int64_t>(x);  // digests use all 64 bits
    return true;
  }
  if (x > static_cast<unsigned long long>(hi) || static_cast<int64_t>(x) < lo) return false;
  *out = static_cast<int64_t>(x);
  return true;
}

}  // namespace

uint64_t TokenDigest(const int32_t* tokens, size_t n) {
  return XXH3_64bits(tokens, n * sizeof(int32_t));
}

absl::Status SaveCheckpointFile(const std::string& path, const CheckpointState& state,
                                const KvCache& memory) {
  const std::string what = absl::StrCat("cannot save checkpoint ", path);
  if (state.config.find('\n') != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": the configuration has a line break"));
  }
  if (static_cast<int64_t>(state.retention.size()) != memory.shape().num_layers ||
      (!state.recall_slots.empty() && static_cast<int64_t>(state.recall_slots.size()) != memory.shape().num_layers) ||
      state.steps_done < 1 || state.steps_done >= state.total_steps || state.threads < 1 ||
      state.next_token < 0 || state.next_token > state.input_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": inconsistent state (", state.retention.size(), " retention values for ",
        memory.shape().num_layers, " layers, step ", state.steps_done, " of ", state.total_steps,
        ", threads ", state.threads, ", next token ", state.next_token, " of ",
        state.input_tokens, ")"));
  }
  internal::KvFileHeader h;
  h.model_fingerprint = state.model_fingerprint;
  h.config = TextBlock(state);
  h.kernels = state.kernels;
  h.next_position = state.next_token;
  h.input_tokens = state.input_tokens;
  return internal::SaveKvFile(kFormat, path, h, memory, /*overwrite=*/true);
}

absl::StatusOr<PrefillCheckpoint> ParseCheckpointFile(std::string_view bytes,
                                                      std::string_view name) {
  SNAPFILL_ASSIGN_OR_RETURN(internal::KvFileContents c,
                            internal::ParseKvFile(kFormat, bytes, name, "", 0));
  auto damaged = [&](std::string_view why) { return internal::Damaged(kFormat, name, why); };
  const std::string& text = c.header.config;
  if (text.size() < kFirstLine.size() + 1 || text.compare(0, kFirstLine.size(), kFirstLine.data(), kFirstLine.size()) != 0 ||
      text[kFirstLine.size()] != '\n' || text.back() != '\n') {
    return damaged(absl::StrCat("its state block does not start with \"", kFirstLine, "\""));
  }
  std::map<std::string, std::string> fields;
  const std::string body = text.substr(kFirstLine.size() + 1, text.size() - kFirstLine.size() - 2);
  for (absl::string_view line : absl::StrSplit(body, '\n')) {
    const size_t eq = line.find('=');
    if (eq == absl::string_view::npos) {
      return damaged(absl::StrCat("state line \"", line.substr(0, 40), "\" has no '='"));
    }
    const std::string key(line.substr(0, eq));
    if (!fields.emplace(key, std::string(line.substr(eq + 1))).second) {
      return damaged(absl::StrCat("state key \"", key, "\" appears twice"));
    }
  }
  PrefillCheckpoint out;
  CheckpointState& s = out.state;
  const int64_t layers = c.kv->shape().num_layers;
  const std::pair<const char*, int64_t*> ints[] = {
      {"threads", nullptr}, {"steps_done", &s.steps_done}, {"total_steps", &s.total_steps}};
  for (const char* key : {"config", "input_digest", "plan_digest", "threads", "steps_done",
                          "total_steps", "retention"}) {
    if (!fields.count(key)) return damaged(absl::StrCat("state key \"", key, "\" is missing"));
  }
  // recall_slots: only a run with a recall store writes it.
  if (fields.size() != 7 + fields.count("recall_slots")) return damaged("its state block has unknown keys");
  s.config = fields["config"];
  int64_t v = 0;
  if (!ParseInt(fields["input_digest"], 16, 0, 0, &v)) return damaged("bad input_digest");
  s.input_digest = static_cast<uint64_t>(v);
  if (!ParseInt(fields["plan_digest"], 16, 0, 0, &v)) return damaged("bad plan_digest");
  s.plan_digest = static_cast<uint64_t>(v);
  if (!ParseInt(fields["threads"], 10, 1, 1 << 16, &v)) return damaged("bad threads");
  s.threads = static_cast<int32_t>(v);
  for (const auto& [key, dst] : ints) {
    if (dst == nullptr) continue;
    if (!ParseInt(fields[key], 10, 0, int64_t{1} << 40, dst)) {
      return damaged(absl::StrCat("bad ", key, " \"", fields[key].substr(0, 40), "\""));
    }
  }
  if (s.steps_done < 1 || s.steps_done >= s.total_steps) {
    return damaged(absl::StrCat("step ", s.steps_done, " of ", s.total_steps,
                                " is not between the first and the last"));
  }
  const std::vector<std::string> values = absl::StrSplit(fields["retention"], ',');
  if (layers > kMaxLayers || static_cast<int64_t>(values.size()) != layers) {
    return damaged(absl::StrCat(values.size(), " retention values for ", layers, " layers"));
  }
  for (const std::string& r : values) {
    char* end = nullptr;
    const double x = std::strtod(r.c_str(), &end);
    if (r.empty() || end != r.c_str() + r.size() || !(x >= 0.0 && x <= 1.0)) {
      return damaged(absl::StrCat("retention value \"", r.substr(0, 40), "\" is not in [0, 1]"));
    }
    s.retention.push_back(x);
  }
  if (fields.count("recall_slots")) {
    const std::vector<std::string> slots = absl::StrSplit(fields["recall_slots"], ',');
    if (static_cast<int64_t>(slots.size()) != layers) {
      return damaged(absl::StrCat(slots.size(), " recall_slots values for ", layers, " layers"));
    }
    for (const std::string& x : slots) {
      if (!ParseInt(x, 10, 0, int64_t{1} << 40, &v)) return damaged(absl::StrCat("bad recall_slots \"", x.substr(0, 40), "\""));
      s.recall_slots.push_back(v);
    }
  }
  s.model_fingerprint = std::move(c.header.model_fingerprint);
  s.kernels = std::move(c.header.kernels);
  s.input_tokens = c.header.input_tokens;
  s.next_token = c.header.next_position;
  if (s.next_token > s.input_tokens) {
    return damaged(absl::StrCat("next token ", s.next_token, " is past the input's ",
                                s.input_tokens, " tokens"));
  }
  out.memory = std::move(c.kv);
  return out;
}

absl::StatusOr<PrefillCheckpoint> LoadCheckpointFile(const std::string& path) {
  absl::StatusOr<PrefillCheckpoint> checkpoint = absl::InternalError("not read");
  SNAPFILL_RETURN_IF_ERROR(internal::MapKvFile(kFormat, path, [&](std::string_view bytes) {
    checkpoint = ParseCheckpointFile(bytes, path);
  }));
  return checkpoint;
}

absl::Status CheckpointMismatch(const CheckpointState& saved, const CheckpointState& run,
                                std::string_view path, std::string* warning) {
  const std::string p(path);
  if (saved.model_fingerprint != run.model_fingerprint) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint ", p, " was written for model ", saved.model_fingerprint,
        ", not the loaded model ", run.model_fingerprint));
  }
  if (saved.input_tokens != run.input_tokens || saved.input_digest != run.input_digest) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "checkpoint %s was written for another input (%d tokens, digest %016x); this input has "
        "%d tokens, digest %016x",
        p, saved.input_tokens, saved.input_digest, run.input_tokens, run.input_digest));
  }
  if (saved.config != run.config) {
    return absl::FailedPreconditionError(absl::StrCat("checkpoint ", p,
                                                      " was written with another configuration:\n"
                                                      "  checkpoint: ", saved.config,
                                                      "\n  this run:   ", run.config));
  }
  if (saved.plan_digest != run.plan_digest || saved.total_steps != run.total_steps) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "checkpoint %s was written for another plan (%d steps, digest %016x; this run plans %d "
        "steps, digest %016x)",
        p, saved.total_steps, saved.plan_digest, run.total_steps, run.plan_digest));
  }
  if (warning != nullptr) {
    warning->clear();
    std::vector<std::string> differ;
    if (saved.threads != run.threads) {
      differ.push_back(absl::StrCat(saved.threads, " threads, this run uses ", run.threads));
    }
    if (saved.kernels != run.kernels) {
      differ.push_back(absl::StrCat("kernels \"", saved.kernels, "\", this run's are \"", run.kernels, "\""));
    }
    if (!differ.empty()) {
      *warning = absl::StrCat("checkpoint ", p, " was written with ", absl::StrJoin(differ, "; with "),
                              ": the result may differ from an uninterrupted run in rounding");
    }
  }
  return absl::OkStatus();
}

}  // namespace snapfill
