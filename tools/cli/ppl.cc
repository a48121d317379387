// snapfill ppl: the loss of a text read chunk by chunk (DESIGN.md §7).
//
// The input is scored as plain text (no chat template; BOS if the model's
// tokenizer adds one). Every token but the first is scored exactly once,
// given what the run has of its past: a chunk's first token is predicted by
// the previous chunk's last position, every other token by the position
// before it in its chunk, which attends over the memory and the chunk so far
// (StepTelemetry::token_nll documents it exactly). With --pruner full and an
// input inside the model's context this is the loss of one-shot prefill: the
// baseline the compressed runs are compared against.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"
#include "snapfill/engine.h"
#include "src/model/llama_forward.h"
#include "snapfill/status.h"
#include "src/base/sys_stats.h"
#include "tools/cli/commands.h"
#include "tools/cli/common.h"
#include "tools/cli/flags.h"

namespace snapfill::cli {
namespace {

using Json = nlohmann::json;

// One step's figures, kept for the table and the JSON.
struct StepScore {
  int64_t step = 0;
  int64_t start = 0;
  int64_t chunk = 0;
  int64_t attention_length = 0;
  double memory_before = 0;  // what the chunk attended over: the last step's memory
  double memory_mean = 0;    // after this step's compression
  int64_t scored = 0;
  double nll_sum = 0;
  double seconds = 0;
};

double MeanMemory(const std::vector<int64_t>& memory) {
  double sum = 0;
  for (int64_t m : memory) sum += m;
  return memory.empty() ? 0 : sum / memory.size();
}

// The table: every step for short plans, else ~16 rows of consecutive steps.
// "saw" is the memory the chunk attended over (entries per layer and KV head,
// mean over layers): the previous step's memory after compression.
void PrintTable(const std::vector<StepScore>& steps) {
  const size_t n = steps.size();
  const size_t group = n <= 32 ? 1 : (n + 15) / 16;
  std::printf("%13s %10s %8s %8s %8s %9s %10s\n", group == 1 ? "step" : "steps", "start", "tokens",
              "saw", "scored", "loss", "ppl");
  for (size_t i = 0; i < n; i += group) {
    const size_t end = std::min(n, i + group);
    StepScore g;
    double memory = 0;
    for (size_t k = i; k < end; ++k) {
      g.chunk += steps[k].chunk;
      g.scored += steps[k].scored;
      g.nll_sum += steps[k].nll_sum;
      memory += steps[k].memory_before;
    }
    memory /= end - i;
    const std::string label = group == 1 ? absl::StrCat(steps[i].step)
                                         : absl::StrCat(steps[i].step, "-", steps[end - 1].step);
    const double loss = g.scored > 0 ? g.nll_sum / g.scored : NAN;
    std::printf("%13s %10lld %8lld %8.1f %8lld %9.4f %10.2f\n", label.c_str(),
                (long long)steps[i].start, (long long)g.chunk, memory, (long long)g.scored, loss,
                std::exp(loss));
  }
}

}  // namespace

absl::Status RunPpl() {
  const std::string input_path = absl::GetFlag(FLAGS_input);
  if (input_path.empty()) return absl::InvalidArgumentError("--input FILE is required");
  const int64_t max_tokens = absl::GetFlag(FLAGS_max_tokens);
  if (max_tokens < 0 || max_tokens == 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_tokens=", max_tokens, " must be 0 (all) or at least 2"));
  }
  const std::string json_path = absl::GetFlag(FLAGS_json);
  SNAPFILL_ASSIGN_OR_RETURN(PrefillConfig config, PrefillConfigFromFlags());
  config.score_tokens = true;
  // The full pruner evicts nothing, so memory sizes do not apply; its
  // chunks are --chunk tokens each (an IMDC plan of the whole input as
  // memory would refuse most chunk sizes).
  if (config.pruner.kind == PrunerKind::kFull) config.schedule.kind = ScheduleKind::kFixed;
  SNAPFILL_ASSIGN_OR_RETURN(InputOptions input_options, InputOptionsFromFlags(/*with_suffix=*/false));
  input_options.progress_tag = "[snapfill ppl]";
  SNAPFILL_ASSIGN_OR_RETURN(StreamedInput in, OpenStreamedInput(input_path));
  LoadedModel& model = in.model;
  std::unique_ptr<Backend>& backend = in.backend;
  SNAPFILL_RETURN_IF_ERROR(SetPrunerInputs(model, config, /*question_guided=*/false));
  // Plain text, BOS as the model's tokenizer wants it; the first
  // --max_tokens only where that is given.
  PromptFrame plain;
  plain.document_add_special = true;
  SNAPFILL_ASSIGN_OR_RETURN(InputTokens input, TokenizeInput(*in.file, *model.tokenizer, plain, input_options));
  WarnIfNotUtf8(input_path, input);
  const TokenSpool& tokens = *input.tokens;
  const int64_t total = tokens.size();
  const int64_t input_tokens = input.document_tokens_seen;
  if (total < 2) {
    return absl::InvalidArgumentError(absl::StrCat("--input ", input_path, " has ", total,
                                                   " token; ppl needs at least 2"));
  }
  const LlamaConfig& mc = model.model->config();
  SNAPFILL_ASSIGN_OR_RETURN(std::unique_ptr<PrefillEngine> engine,
                            PrefillEngine::Create(*model.model, backend.get(), config, total));
  const SchedulePlan& plan = engine->plan();
  const PrefillConfig& ran = engine->config();
  for (const std::string& w : plan.warnings) std::fprintf(stderr, "snapfill: warning: %s\n", w.c_str());
  const bool full = ran.pruner.kind == PrunerKind::kFull;
  if (full && total > mc.context_length) {
    std::fprintf(stderr,
                 "snapfill: warning: full attention over %lld tokens goes beyond the model's "
                 "context of %lld: its loss is not a baseline\n",
                 (long long)total, (long long)mc.context_length);
  }

  std::unique_ptr<std::ofstream> telemetry;
  const std::string telemetry_path = absl::GetFlag(FLAGS_telemetry);
  if (!telemetry_path.empty()) {
    telemetry = std::make_unique<std::ofstream>(telemetry_path, std::ios::trunc);
    if (!*telemetry) {
      return absl::PermissionDeniedError(absl::StrCat("--telemetry ", telemetry_path,
                                                      ": cannot open for writing"));
    }
  }
  const int64_t steps = static_cast<int64_t>(plan.steps.size());
  ChunkProgress progress("[snapfill ppl]", total, steps, absl::GetFlag(FLAGS_progress));
  std::vector<StepScore> scores;
  scores.reserve(steps);
  double nll_sum = 0;
  int64_t scored = 0;
  Stopwatch watch;
  const absl::Status run = engine->Run(tokens, [&](const StepTelemetry& t) {
    StepScore s;
    s.step = t.step;
    s.start = t.start_token;
    s.chunk = t.chunk_tokens;
    s.attention_length = t.attention_length;
    s.memory_before = scores.empty() ? 0 : scores.back().memory_mean;
    s.memory_mean = MeanMemory(t.memory);
    s.scored = t.scored_tokens;
    s.nll_sum = t.nll_sum;
    s.seconds = t.seconds;
    scores.push_back(s);
    nll_sum += t.nll_sum;
    scored += t.scored_tokens;
    if (telemetry) WriteTelemetry(*telemetry, t, steps);
    progress.Step(t, [&] { return absl::StrFormat(" | loss so far %.4f", scored > 0 ? nll_sum / scored : 0.0); });
    return true;
  });
  SNAPFILL_RETURN_IF_ERROR(run);
  const double seconds = watch.Seconds();
  if (telemetry) {
    telemetry->flush();
    if (!*telemetry) return absl::DataLossError(absl::StrCat("error writing ", telemetry_path));
  }
  const double loss = nll_sum / scored;

  std::printf("ppl: %s, %lld tokens%s | schedule %s (growth %s), pruner %s, memory %lld, chunk "
              "%lld, window %lld, positions %s, %lld steps\n",
              input_path.c_str(), (long long)total,
              total < input_tokens ? absl::StrCat(" (the first of ", input.read_to_end ? "" : "more than ",
                                                  input.read_to_end ? input_tokens : total, ")").c_str()
                                   : "",
              std::string(ScheduleKindName(ran.schedule.kind)).c_str(),
              std::string(GrowthName(ran.schedule.growth)).c_str(), PrunerKindName(ran.pruner.kind),
              (long long)ran.schedule.memory, (long long)ran.schedule.chunk,
              (long long)ran.schedule.window,
              ran.keep_original_positions ? "original" : "re-encoded", (long long)steps);
  PrintTable(scores);
  std::printf("overall: loss %.4f nats/token | ppl %.3f | %lld tokens scored | %.1f s (%.0f "
              "tokens/s) | peak RSS %s\n",
              loss, std::exp(loss), (long long)scored, seconds, total / std::max(seconds, 1e-9),
              HumanBytes(PeakRssBytes()).c_str());

  if (!json_path.empty()) {
    Json j;
    j["command"] = "ppl";
    j["model"] = model.path;
    j["input"] = input_path;
    j["input_tokens"] = input_tokens;
    j["input_read_to_end"] = input.read_to_end;
    j["tokens"] = total;
    Json cfg = Json::parse(ConfigJson(ran, "", total), nullptr, /*allow_exceptions=*/false);
    j["config"] = cfg.is_discarded() ? Json::object() : cfg;
    j["context_length"] = mc.context_length;
    j["within_context"] = total <= mc.context_length;
    j["scored_tokens"] = scored;
    j["nll_sum"] = nll_sum;
    j["loss"] = loss;
    j["ppl"] = std::exp(loss);
    j["seconds"] = seconds;
    j["peak_rss_bytes"] = PeakRssBytes();
    Json steps_json = Json::array();
    for (const StepScore& s : scores) {
      Json js;
      js["step"] = s.step;
      js["start"] = s.start;
      js["chunk"] = s.chunk;
      js["attention_length"] = s.attention_length;
      js["memory_before"] = s.memory_before;
      js["memory_mean"] = s.memory_mean;
      js["scored"] = s.scored;
      js["nll_sum"] = s.nll_sum;
      if (s.scored > 0) {
        js["loss"] = s.nll_sum / s.scored;
      } else {
        js["loss"] = nullptr;
      }
      js["seconds"] = s.seconds;
      steps_json.push_back(std::move(js));
    }
    j["steps"] = std::move(steps_json);
    std::ofstream out(json_path, std::ios::trunc);
    out << j.dump(1, ' ', false, Json::error_handler_t::replace) << "\n";
    out.close();
    if (!out) return absl::PermissionDeniedError(absl::StrCat("--json ", json_path, ": cannot write"));
  }
  return absl::OkStatus();
}

}  // namespace snapfill::cli
