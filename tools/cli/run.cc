// snapfill run / prefill: a long input through the chunk loop.
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "snapfill/status.h"
#include "src/base/sys_stats.h"
#include "src/engine/generate.h"
#include "src/engine/prefill_engine.h"
#include "src/engine/prompt.h"
#include "src/gguf/fingerprint.h"
#include "src/kv/cache_file.h"
#include "tools/cli/commands.h"
#include "tools/cli/common.h"
#include "tools/cli/flags.h"

namespace snapfill::cli {
namespace {

absl::StatusOr<PrefillConfig> PrefillConfigFromFlags() {
  PrefillConfig c;
  SNAPFILL_ASSIGN_OR_RETURN(c.schedule.kind, ParseScheduleKind(absl::GetFlag(FLAGS_schedule)));
  SNAPFILL_ASSIGN_OR_RETURN(c.schedule.growth, ParseGrowth(absl::GetFlag(FLAGS_growth)));
  c.schedule.memory = absl::GetFlag(FLAGS_memory);
  c.schedule.chunk = absl::GetFlag(FLAGS_chunk);
  c.schedule.first_memory = absl::GetFlag(FLAGS_first_memory);
  c.schedule.window = absl::GetFlag(FLAGS_window);
  c.schedule.sink_tokens = absl::GetFlag(FLAGS_sinks);
  SNAPFILL_ASSIGN_OR_RETURN(c.pruner.kind, ParsePrunerKind(absl::GetFlag(FLAGS_pruner)));
  SNAPFILL_ASSIGN_OR_RETURN(c.pruner.pooling, ParsePooling(absl::GetFlag(FLAGS_pooling)));
  c.pruner.pool_kernel = absl::GetFlag(FLAGS_pool_kernel);
  c.keep_original_positions = absl::GetFlag(FLAGS_original_positions);
  return c;
}

// The configuration as one JSON object, stored in cache files and printed
// with --verbosity=1.
std::string ConfigJson(const PrefillConfig& c, const std::string& model_path,
                       int64_t input_tokens) {
  return absl::StrFormat(
      "{\"model\":\"%s\",\"input_tokens\":%d,\"schedule\":\"%s\",\"growth\":\"%s\","
      "\"memory\":%d,\"chunk\":%d,\"first_memory\":%d,\"window\":%d,\"pruner\":\"%s\","
      "\"pool_kernel\":%d,\"pooling\":\"%s\",\"sinks\":%d,\"positions\":\"%s\"}",
      model_path, input_tokens, std::string(ScheduleKindName(c.schedule.kind)),
      std::string(GrowthName(c.schedule.growth)), c.schedule.memory, c.schedule.chunk,
      c.schedule.first_memory, c.schedule.window, PrunerKindName(c.pruner.kind),
      c.pruner.pool_kernel, PoolingName(c.pruner.pooling), c.schedule.sink_tokens,
      c.keep_original_positions ? "original" : "re-encoded");
}

// One JSON record per step (--telemetry). The origin map is written sparse
// ([chunk, entries] pairs) and, for plans of more than 256 steps, only every
// ⌈steps/256⌉-th step and the last, to keep 1M-token runs' files small.
std::string TelemetryJson(const StepTelemetry& t, bool with_origin) {
  std::string s = absl::StrFormat(
      "{\"step\":%d,\"start\":%d,\"chunk\":%d,\"attention_length\":%d,\"seconds\":%.6f,"
      "\"elapsed\":%.3f,\"rss_bytes\":%d,\"memory\":[%s],\"retention\":[",
      t.step, t.start_token, t.chunk_tokens, t.attention_length, t.seconds, t.elapsed_seconds,
      t.rss_bytes, absl::StrJoin(t.memory, ","));
  for (size_t i = 0; i < t.retention.size(); ++i) {
    absl::StrAppendFormat(&s, "%s%.4f", i ? "," : "", t.retention[i]);
  }
  s += "]";
  if (with_origin) {
    s += ",\"origin\":[";
    for (size_t l = 0; l < t.origin.size(); ++l) {
      s += l ? ",[" : "[";
      bool first = true;
      for (size_t c = 0; c < t.origin[l].size(); ++c) {
        if (t.origin[l][c] == 0) continue;
        absl::StrAppendFormat(&s, "%s[%d,%d]", first ? "" : ",", c, t.origin[l][c]);
        first = false;
      }
      s += "]";
    }
    s += "]";
  }
  s += "}\n";
  return s;
}

struct Prepared {
  LoadedModel model;
  std::unique_ptr<Backend> backend;
  std::vector<int32_t> tokens;
  PrefillConfig config;
  std::unique_ptr<PrefillEngine> engine;
  double tokenize_seconds = 0;
};

// Reads the input, tokenizes it inside the chat template and plans the
// schedule; everything that can be refused is refused here, before the
// prefill starts.
absl::StatusOr<Prepared> Prepare(bool with_question) {
  const std::string input_path = absl::GetFlag(FLAGS_input);
  if (input_path.empty()) return absl::InvalidArgumentError("--input FILE is required");
  SNAPFILL_ASSIGN_OR_RETURN(PrefillConfig config, PrefillConfigFromFlags());
  SNAPFILL_ASSIGN_OR_RETURN(std::string text, ReadInput(input_path, "--input"));
  if (text.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--input ", input_path, " is empty"));
  }
  Prepared p;
  p.config = config;
  SNAPFILL_ASSIGN_OR_RETURN(p.model, LoadModelFromFlags());
  SNAPFILL_ASSIGN_OR_RETURN(p.backend, BackendFromFlags());
  Stopwatch tok;
  const std::string question = with_question ? absl::GetFlag(FLAGS_question) : "";
  SNAPFILL_ASSIGN_OR_RETURN(
      DocumentPrompt prompt, BuildDocumentPrompt(*p.model.tokenizer, p.model.chat_template, text,
                                                 question, absl::GetFlag(FLAGS_system)));
  p.tokenize_seconds = tok.Seconds();
  p.tokens = std::move(prompt.tokens);
  if (!with_question) p.tokens.resize(prompt.document_end);
  text.clear();
  text.shrink_to_fit();
  SNAPFILL_ASSIGN_OR_RETURN(p.engine,
                            PrefillEngine::Create(*p.model.model, p.backend.get(), p.config,
                                                  static_cast<int64_t>(p.tokens.size())));
  return p;
}

void PrintPlan(const Prepared& p) {
  const SchedulePlan& plan = p.engine->plan();
  std::printf("%s", FormatPlan(plan).c_str());
  std::printf("input: %zu tokens (tokenized in %.2f s)\n", p.tokens.size(), p.tokenize_seconds);
  std::printf("memory: %s for the compressed KV, %s scratch, weights %s (mapped)\n",
              HumanBytes(p.engine->memory_bytes()).c_str(),
              HumanBytes(p.engine->scratch_bytes()).c_str(),
              HumanBytes(p.model.model->weight_bytes()).c_str());
}

// The prefill with a progress line and telemetry records.
absl::Status RunPrefillLoop(Prepared& p, double* seconds) {
  const SchedulePlan& plan = p.engine->plan();
  for (const std::string& w : plan.warnings) std::fprintf(stderr, "snapfill: warning: %s\n", w.c_str());
  std::unique_ptr<std::ofstream> telemetry;
  const std::string telemetry_path = absl::GetFlag(FLAGS_telemetry);
  if (!telemetry_path.empty()) {
    telemetry = std::make_unique<std::ofstream>(telemetry_path, std::ios::trunc);
    if (!*telemetry) {
      return absl::PermissionDeniedError(absl::StrCat("--telemetry ", telemetry_path,
                                                      ": cannot open for writing"));
    }
  }
  const bool progress = absl::GetFlag(FLAGS_progress);
  const bool tty = isatty(fileno(stderr));
  const int64_t total = plan.config.total_tokens;
  const int64_t steps = plan.steps.size();
  const int64_t origin_every = std::max<int64_t>(1, (steps + 255) / 256);
  double last_print = -1e9;
  Stopwatch watch;
  auto on_step = [&](const StepTelemetry& t) {
    if (telemetry) {
      const bool origin = t.step % origin_every == 0 || t.step + 1 == steps;
      *telemetry << TelemetryJson(t, origin);
    }
    if (progress) {
      const double now = watch.Seconds();
      const bool last = t.step + 1 == steps;
      if (last || now - last_print >= (tty ? 0.5 : 10.0)) {
        last_print = now;
        const int64_t done = t.start_token + t.chunk_tokens;
        const double rate = done / std::max(now, 1e-9);
        int64_t mem = 0;
        for (int64_t m : t.memory) mem += m;
        mem /= std::max<size_t>(1, t.memory.size());
        std::fprintf(stderr,
                     "%s[snapfill] %lld/%lld tokens (%.1f%%) | %.0f tokens/s | ETA %s | step "
                     "%lld/%lld memory %lld chunk %lld | RSS %s%s",
                     tty ? "\r" : "", (long long)done, (long long)total, 100.0 * done / total,
                     rate, HumanSeconds((total - done) / std::max(rate, 1e-9)).c_str(),
                     (long long)t.step + 1, (long long)steps, (long long)mem,
                     (long long)t.chunk_tokens, HumanBytes(t.rss_bytes).c_str(),
                     tty ? "   " : "\n");
        if (tty && last) std::fputc('\n', stderr);
      }
    }
    return true;
  };
  SNAPFILL_RETURN_IF_ERROR(p.engine->Run(p.tokens, on_step));
  *seconds = watch.Seconds();
  if (telemetry) {
    telemetry->flush();
    if (!*telemetry) return absl::DataLossError(absl::StrCat("error writing ", telemetry_path));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RunRun() {
  const int64_t n = absl::GetFlag(FLAGS_n);
  if (n < 1) return absl::InvalidArgumentError(absl::StrCat("-n=", n, " must be >= 1"));
  SNAPFILL_ASSIGN_OR_RETURN(SamplingParams sampling, SamplingFromFlags());
  SNAPFILL_ASSIGN_OR_RETURN(Prepared p, Prepare(/*with_question=*/true));
  if (absl::GetFlag(FLAGS_verbosity) >= 1 || absl::GetFlag(FLAGS_dry_run)) PrintPlan(p);
  if (absl::GetFlag(FLAGS_dry_run)) return absl::OkStatus();

  Stopwatch ttft;  // from the first token read to the first token generated
  double prefill_seconds = 0;
  SNAPFILL_RETURN_IF_ERROR(RunPrefillLoop(p, &prefill_seconds));
  SNAPFILL_ASSIGN_OR_RETURN(auto kv, p.engine->MakeDecoderCache(n));
  SNAPFILL_ASSIGN_OR_RETURN(auto forward, LlamaForward::Create(*p.model.model, p.backend.get(), 1));
  GenerateOptions gopts;
  gopts.max_new_tokens = n;
  gopts.sampling = sampling;
  gopts.is_eog = [&](int32_t id) { return p.model.tokenizer->IsEndOfGeneration(id); };
  double first_token_at = 0;
  const bool tty = isatty(fileno(stdout));
  const Tokenizer& tokenizer = *p.model.tokenizer;
  SNAPFILL_ASSIGN_OR_RETURN(
      GenerateResult r,
      GenerateFromLogits(*forward, *kv, p.engine->next_position(), p.engine->last_logits(), gopts,
                         [&](int32_t id) {
                           if (first_token_at == 0) first_token_at = ttft.Seconds();
                           const std::string piece = tokenizer.TokenToPiece(id);
                           std::fwrite(piece.data(), 1, piece.size(), stdout);
                           if (tty) std::fflush(stdout);
                           return true;
                         }));
  std::fputc('\n', stdout);
  std::fflush(stdout);
  if (first_token_at == 0) first_token_at = ttft.Seconds();
  if (absl::GetFlag(FLAGS_timing)) {
    const SchedulePlan& plan = p.engine->plan();
    const double decode_tps = r.tokens.size() > 1 ? (r.tokens.size() - 1) / r.decode_seconds : 0;
    std::fprintf(stderr,
                 "prefill: %zu tokens in %lld chunks, %.1f s (%.0f tokens/s), schedule %s, "
                 "memory %lld\nTTFT %.2f s | decode %zu tokens, %.1f tokens/s | peak RSS %s\n",
                 p.tokens.size(), (long long)plan.steps.size(), prefill_seconds,
                 p.tokens.size() / std::max(prefill_seconds, 1e-9),
                 std::string(ScheduleKindName(plan.config.kind)).c_str(),
                 (long long)plan.config.memory, first_token_at, r.tokens.size(), decode_tps,
                 HumanBytes(PeakRssBytes()).c_str());
  }
  std::fprintf(stderr, "%s", p.backend->ProfileReport().c_str());
  return absl::OkStatus();
}

absl::Status RunPrefill() {
  const std::string out = absl::GetFlag(FLAGS_out);
  const bool dry_run = absl::GetFlag(FLAGS_dry_run);
  if (out.empty() && !dry_run) return absl::InvalidArgumentError("--out CACHE is required");
  if (!out.empty() && !absl::GetFlag(FLAGS_force) && access(out.c_str(), F_OK) == 0) {
    return absl::AlreadyExistsError(absl::StrCat("--out ", out,
                                                 " exists; use --force to overwrite it"));
  }
  SNAPFILL_ASSIGN_OR_RETURN(Prepared p, Prepare(/*with_question=*/false));
  if (absl::GetFlag(FLAGS_verbosity) >= 1 || dry_run) PrintPlan(p);
  if (dry_run) return absl::OkStatus();
  double seconds = 0;
  SNAPFILL_RETURN_IF_ERROR(RunPrefillLoop(p, &seconds));
  PromptCache cache;
  cache.model_fingerprint = ModelFingerprint(p.model.model->gguf());
  cache.config = ConfigJson(p.config, p.model.path, static_cast<int64_t>(p.tokens.size()));
  cache.next_position = p.engine->next_position();
  cache.input_tokens = static_cast<int64_t>(p.tokens.size());
  SNAPFILL_ASSIGN_OR_RETURN(cache.kv, p.engine->MakeDecoderCache(0));
  SNAPFILL_RETURN_IF_ERROR(SaveCacheFile(out, cache, absl::GetFlag(FLAGS_force)));
  if (absl::GetFlag(FLAGS_timing)) {
    std::fprintf(stderr, "prefill: %zu tokens, %.1f s (%.0f tokens/s) | cache %s (%s) | peak RSS %s\n",
                 p.tokens.size(), seconds, p.tokens.size() / std::max(seconds, 1e-9), out.c_str(),
                 HumanBytes(cache.kv->bytes()).c_str(), HumanBytes(PeakRssBytes()).c_str());
  }
  std::fprintf(stderr, "%s", p.backend->ProfileReport().c_str());
  return absl::OkStatus();
}

}  // namespace snapfill::cli
