#include "tools/cli/common.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <utility>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "snapfill/status.h"
#include "src/compress/gate.h"
#include "src/compress/pruner.h"
#include "src/gguf/fingerprint.h"
#include "src/tokenizer/unicode.h"
#include "tools/cli/flags.h"
#include "tools/cli/kernel_cache.h"

namespace snapfill::cli {

std::string HumanBytes(uint64_t b) {
  if (b >= (uint64_t{1} << 30)) return absl::StrFormat("%.2f GiB", b / double(uint64_t{1} << 30));
  if (b >= (uint64_t{1} << 20)) return absl::StrFormat("%.1f MiB", b / double(uint64_t{1} << 20));
  if (b >= 1024) return absl::StrFormat("%.1f KiB", b / 1024.0);
  return absl::StrCat(b, " B");
}

std::string HumanSeconds(double s) {
  if (!(s >= 0) || s > 1e8) return "?";
  const int64_t t = static_cast<int64_t>(s + 0.5);
  if (t >= 3600) return absl::StrFormat("%dh%02dm", t / 3600, (t % 3600) / 60);
  if (t >= 60) return absl::StrFormat("%dm%02ds", t / 60, t % 60);
  return absl::StrFormat("%.1fs", s);
}

absl::StatusOr<std::string> ReadInput(const std::string& path, const char* flag) {
  // InputFile refuses what cannot be read (missing, a directory, ...) as
  // the streamed inputs are refused.
  SNAPFILL_ASSIGN_OR_RETURN(std::unique_ptr<InputFile> file, InputFile::Open(path, flag));
  std::string text;
  // One string of the file's size: a stream copy would hold the text two or
  // three times at the peak.
  if (file->size() > 0) text.reserve(static_cast<size_t>(file->size()));
  char buffer[1 << 16];
  while (true) {
    SNAPFILL_ASSIGN_OR_RETURN(const size_t got, file->Read(buffer, sizeof(buffer)));
    if (got == 0) break;
    text.append(buffer, got);
  }
  return text;
}

absl::StatusOr<LoadedModel> LoadModelFromFlags() {
  LoadedModel m;
  m.path = ResolveModelPath(absl::GetFlag(FLAGS_model));
  SNAPFILL_ASSIGN_OR_RETURN(m.model, LlamaModel::Open(m.path));
  auto tok = Tokenizer::FromGguf(m.model->gguf());
  if (!tok.ok()) {
    return absl::Status(tok.status().code(),
                        absl::StrCat("tokenizer of ", m.path, ": ", tok.status().message()));
  }
  m.tokenizer = std::move(*tok);
  const std::string flag = absl::GetFlag(FLAGS_chat_template);
  auto own_text = m.model->gguf().GetString("tokenizer.chat_template");
  const ChatTemplate own = own_text.ok() ? DetectChatTemplate(*own_text) : ChatTemplate();
  if (flag == "auto") {
    m.chat_template = own;
  } else if (flag != "none") {
    m.chat_template = DetectChatTemplate(flag);
    if (m.chat_template.kind == ChatTemplateKind::kNone) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--chat_template=", flag,
          " is not one of auto, none, chatml, llama2, llama2-sys, llama3, zephyr"));
    }
    // The model's own template knows its default system prompt.
    if (own.kind == m.chat_template.kind) m.chat_template = own;
  }
  return m;
}

absl::StatusOr<std::unique_ptr<Backend>> BackendFromFlags(const LlamaModel* model, std::string* timings) {
  BackendOptions opts;
  opts.num_threads = absl::GetFlag(FLAGS_threads);
  opts.profile = absl::GetFlag(FLAGS_profile);
  opts.pack_decode_weights = absl::GetFlag(FLAGS_pack_decode);
  opts.half_decode_kv = absl::GetFlag(FLAGS_decode_kv_f16);
  if (opts.num_threads < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--threads=", opts.num_threads,
                                                   " must be >= 0"));
  }
  if (opts.num_threads == 0) {
    SNAPFILL_ASSIGN_OR_RETURN(opts.num_threads, DefaultThreads());
  }
  SNAPFILL_RETURN_IF_ERROR(KernelChoicesFromEnvironment(&opts));
  // SNAPFILL_GUARD_BUFFERS=1 (tests): the CPU stands in for a device, its
  // buffers unreachable from the host outside its ops (a host access
  // faults) and counted as device memory, so that the device's code paths
  // (memory kept in the backend's buffers, the device memory's prediction
  // and budget) run without one.
  if (const char* guard = std::getenv("SNAPFILL_GUARD_BUFFERS"); guard != nullptr && std::string(guard) == "1") {
    opts.guard_buffers = true;
  }
  // --kernels, else SNAPFILL_KERNELS, else auto.
  const char* env = std::getenv("SNAPFILL_KERNELS");
  const bool from_env = env != nullptr && !FlagGiven("kernels");
  absl::StatusOr<KernelsChoice> kernels = KernelsFromFlag(from_env ? env : absl::GetFlag(FLAGS_kernels));
  if (!kernels.ok() && from_env) {
    return absl::InvalidArgumentError(absl::StrCat("SNAPFILL_KERNELS: ", kernels.status().message()));
  }
  if (!kernels.ok()) return kernels.status();
  opts.attention_kernel = kernels->attention;
  opts.products_kernel = kernels->products;
  if (model != nullptr && model->config().num_layers > 0) {
    const WeightView& gate = model->layer(0).w_gate;
    opts.product_shape = {gate.type, gate.cols, gate.rows};
    const LlamaConfig& c = model->config();
    opts.attention_shape = {c.num_heads, c.num_kv_heads, c.head_dim};
  }
  absl::StatusOr<Device> device = ResolveDevice(absl::GetFlag(FLAGS_device));
  if (!device.ok()) return absl::InvalidArgumentError(absl::StrCat("--device: ", device.status().message()));
  // --device auto: the GPU where one is found and its backend starts (its
  // driver, cuBLAS), else the CPU, saying why.
  if (*device == Device::kCuda && absl::GetFlag(FLAGS_device) == "auto") {
    absl::StatusOr<std::unique_ptr<Backend>> cuda = CreateBackend(Device::kCuda, opts);
    if (cuda.ok()) return cuda;
    std::fprintf(stderr, "snapfill: --device auto: the GPU cannot be used (%s); running on the CPU\n",
                 std::string(cuda.status().message()).c_str());
    device = Device::kCpu;
  }
  if (*device == Device::kCpu && (opts.attention_kernel == "measure" || opts.products_kernel == "measure")) {
    std::string source;
    SNAPFILL_RETURN_IF_ERROR(LoadOrMeasureKernelRates(&opts, &source));
    if (timings != nullptr) *timings = source;
  }
  return CreateBackend(*device, opts);
}

namespace {

// The word after `key` in a kernels() record, or "".
std::string RecordedKernel(const std::string& kernels, std::string_view key) {
  const size_t at = kernels.find(key);
  if (at == std::string::npos) return "";
  const size_t from = at + key.size();
  const size_t end = kernels.find_first_of(" ,(", from);
  return kernels.substr(from, end == std::string::npos ? std::string::npos : end - from);
}

}  // namespace

std::string AttentionFromKernelsRecord(const std::string& kernels) {
  return RecordedKernel(kernels, "prefill attention ");
}

std::string ProductsFromKernelsRecord(const std::string& kernels) {
  return RecordedKernel(kernels, "products ");
}

absl::StatusOr<KernelsChoice> KernelsFromFlag(const std::string& value) {
  if (value == "auto") return KernelsChoice{"measure", "measure"};
  if (value == "flags") return KernelsChoice{"", ""};
  const auto bad = [&value] {
    return absl::InvalidArgumentError(
        absl::StrCat("--kernels=", value,
                     ": expected auto, flags, or attention=f32|avx512-bf16|amx-bf16|auto and/or "
                     "products=amx-bf16|amx-int8|avx512-vnni|avx-vnni|avx2|auto, separated by a comma"));
  };
  KernelsChoice c{"measure", "measure"};
  bool attention_named = false, products_named = false;
  for (absl::string_view item : absl::StrSplit(value, ',')) {
    const size_t eq = item.find('=');
    if (eq == absl::string_view::npos || eq + 1 == item.size()) return bad();
    const std::string key(item.substr(0, eq)), name(item.substr(eq + 1));
    if (key == "attention" && !attention_named &&
        (name == "auto" || name == "f32" || name == "avx512-bf16" || name == "amx-bf16")) {
      c.attention = name;
      attention_named = true;
    } else if (key == "products" && !products_named &&
               (name == "auto" || name == "amx-bf16" || name == "amx-int8" || name == "avx512-vnni" ||
                name == "avx-vnni" || name == "avx2")) {
      c.products = name;
      products_named = true;
    } else {
      return bad();
    }
  }
  return c;
}

std::string DevicePeakNote(const Backend& backend, uint64_t predicted) {
  const uint64_t bytes = backend.DevicePeakBytes();
  if (bytes == 0) return "";
  return absl::StrCat(" | peak device memory ", HumanBytes(bytes),
                      predicted > 0 ? absl::StrCat(" (predicted ", HumanBytes(predicted), ")") : "");
}

absl::StatusOr<LongInput> OpenLongInput(const std::string& path) {
  LongInput in;
  SNAPFILL_ASSIGN_OR_RETURN(in.text, ReadInput(path, "--input"));
  if (in.text.empty()) return absl::InvalidArgumentError(absl::StrCat("--input ", path, " is empty"));
  if (const std::vector<size_t> bad = InvalidUtf8Positions(in.text); !bad.empty()) {
    // Byte-level vocabularies encode any bytes; say so, since a wrong
    // encoding (Latin-1, UTF-16) is more often a mistake than intended.
    std::fprintf(stderr,
                 "snapfill: warning: --input %s is not valid UTF-8 (%zu bytes, the first at byte "
                 "%zu); they are read as raw bytes\n",
                 path.c_str(), bad.size(), bad[0]);
  }
  SNAPFILL_ASSIGN_OR_RETURN(in.model, LoadModelFromFlags());
  SNAPFILL_ASSIGN_OR_RETURN(in.backend, BackendFromFlags(in.model.model.get()));
  return in;
}

absl::StatusOr<StreamedInput> OpenStreamedInput(const std::string& path) {
  StreamedInput in;
  SNAPFILL_ASSIGN_OR_RETURN(in.file, InputFile::Open(path, "--input"));
  SNAPFILL_ASSIGN_OR_RETURN(in.model, LoadModelFromFlags());
  SNAPFILL_ASSIGN_OR_RETURN(in.backend, BackendFromFlags(in.model.model.get()));
  return in;
}

absl::StatusOr<InputOptions> InputOptionsFromFlags(bool with_suffix) {
  InputOptions o;
  o.max_tokens = absl::GetFlag(FLAGS_max_tokens);
  if (o.max_tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--max_tokens=", o.max_tokens, " must be >= 0"));
  }
  o.with_suffix = with_suffix;
  o.spool.dir = absl::GetFlag(FLAGS_spool_dir).empty() ? DefaultSpoolDir() : absl::GetFlag(FLAGS_spool_dir);
  o.spool.memory_ids = absl::GetFlag(FLAGS_spool_after);
  if (o.spool.memory_ids < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--spool_after=", o.spool.memory_ids, " must be >= 0"));
  }
  o.progress = absl::GetFlag(FLAGS_progress);
  return o;
}

void WarnIfNotUtf8(const std::string& path, const InputTokens& tokens) {
  if (tokens.invalid_utf8 == 0) return;
  // Byte-level vocabularies encode any bytes; say so, since a wrong
  // encoding (Latin-1, UTF-16) is more often a mistake than intended.
  std::fprintf(stderr,
               "snapfill: warning: --input %s is not valid UTF-8 (%llu bytes, the first at byte "
               "%llu); they are read as raw bytes\n",
               path.c_str(), (unsigned long long)tokens.invalid_utf8, (unsigned long long)tokens.first_invalid_utf8);
}

ChunkProgress::ChunkProgress(const char* tag, int64_t total_tokens, int64_t steps, bool on)
    : tag_(tag), total_(total_tokens), steps_(steps), on_(on), tty_(isatty(fileno(stderr)) != 0) {}

bool ChunkProgress::Due(const StepTelemetry& t) {
  if (!on_) return false;
  const double now = watch_.Seconds();
  if (t.step + 1 != steps_ && now - last_print_ < (tty_ ? 0.5 : 10.0)) return false;
  last_print_ = now;
  return true;
}

void ChunkProgress::Print(const StepTelemetry& t, const std::string& detail) const {
  const int64_t done = t.start_token + t.chunk_tokens;
  const double rate = done / std::max(watch_.Seconds(), 1e-9);
  std::fprintf(stderr, "%s%s %lld/%lld tokens (%.1f%%) | %.0f tokens/s | ETA %s%s%s", tty_ ? "\r" : "", tag_,
               (long long)done, (long long)total_, 100.0 * done / std::max<int64_t>(total_, 1), rate,
               HumanSeconds((total_ - done) / std::max(rate, 1e-9)).c_str(), detail.c_str(), tty_ ? "   " : "\n");
  if (tty_ && t.step + 1 == steps_) std::fputc('\n', stderr);
}

void WriteTelemetry(std::ostream& out, const StepTelemetry& t, int64_t steps) {
  const int64_t origin_every = std::max<int64_t>(1, (steps + 255) / 256);
  out << TelemetryJson(t, t.step % origin_every == 0 || t.step + 1 == steps);
}

absl::StatusOr<SamplingParams> SamplingFromFlags() {
  SamplingParams s;
  s.temperature = static_cast<float>(absl::GetFlag(FLAGS_temp));
  s.top_k = absl::GetFlag(FLAGS_top_k);
  s.top_p = static_cast<float>(absl::GetFlag(FLAGS_top_p));
  s.seed = absl::GetFlag(FLAGS_seed);
  SNAPFILL_RETURN_IF_ERROR(ValidateSamplingParams(s));
  return s;
}

absl::StatusOr<PrefillConfig> PrefillConfigFromFlags() {
  PrefillConfig c;
  SNAPFILL_ASSIGN_OR_RETURN(c.schedule.kind, ParseScheduleKind(absl::GetFlag(FLAGS_schedule)));
  SNAPFILL_ASSIGN_OR_RETURN(c.schedule.growth, ParseGrowth(absl::GetFlag(FLAGS_growth)));
  c.schedule.memory = absl::GetFlag(FLAGS_memory);
  c.schedule.chunk = absl::GetFlag(FLAGS_chunk);
  c.schedule.first_memory = absl::GetFlag(FLAGS_first_memory);
  c.schedule.window = absl::GetFlag(FLAGS_window);
  c.schedule.sink_tokens = absl::GetFlag(FLAGS_sinks);
  // auto is settled by SetPrunerInputs, which knows the model and whether a
  // question guides.
  if (absl::GetFlag(FLAGS_pruner) != "auto") {
    SNAPFILL_ASSIGN_OR_RETURN(c.pruner.kind, ParsePrunerKind(absl::GetFlag(FLAGS_pruner)));
  }
  SNAPFILL_ASSIGN_OR_RETURN(c.pruner.pooling, ParsePooling(absl::GetFlag(FLAGS_pooling)));
  c.pruner.pool_kernel = absl::GetFlag(FLAGS_pool_kernel);
  c.pruner.query_share = absl::GetFlag(FLAGS_query_share);
  SNAPFILL_ASSIGN_OR_RETURN(c.pruner.query_select, ParseSelection(absl::GetFlag(FLAGS_select)));
  c.pruner.span = absl::GetFlag(FLAGS_span);
  c.pruner.repeat_stride = absl::GetFlag(FLAGS_repeat_stride);
  c.pruner.score_span = absl::GetFlag(FLAGS_score_span);
  const std::string heads = absl::GetFlag(FLAGS_query_heads);
  if (heads != "shared" && heads != "each") {
    return absl::InvalidArgumentError(
        absl::StrCat("--query_heads=", heads, ": expected shared or each"));
  }
  c.pruner.shared_query_votes = heads == "shared";
  SNAPFILL_ASSIGN_OR_RETURN(c.pruner.query_votes, ParseQueryVotes(absl::GetFlag(FLAGS_query_votes)));
  c.keep_original_positions = absl::GetFlag(FLAGS_original_positions);
  if (!absl::GetFlag(FLAGS_recall_dir).empty()) {
    c.store_evicted = true;
    c.recall_budget = absl::GetFlag(FLAGS_recall);
    if (c.recall_budget < 1) {
      return absl::InvalidArgumentError(absl::StrCat("--recall=", c.recall_budget, " must be >= 1"));
    }
    SNAPFILL_ASSIGN_OR_RETURN(c.recall_format, ParseRecallFormat(absl::GetFlag(FLAGS_recall_format)));
    SNAPFILL_RETURN_IF_ERROR(RecallRankSummed().status());
  }
  return c;
}

std::string DefaultGatesPath(const std::string& model_path) {
  constexpr std::string_view kExt = ".gguf";
  if (model_path.size() > kExt.size() && model_path.compare(model_path.size() - kExt.size(), kExt.size(),
                                                            kExt) == 0) {
    return model_path.substr(0, model_path.size() - kExt.size()) + ".gates";
  }
  return model_path + ".gates";
}

std::string GatesPath(const std::string& model_path) {
  std::string path = absl::GetFlag(FLAGS_gates);
  if (path.empty() && !model_path.empty() && access(DefaultGatesPath(model_path).c_str(), F_OK) == 0) {
    path = DefaultGatesPath(model_path);
  }
  return path;
}

PrunerKind AutoPruner(const std::string& gates_path, bool question_guided) {
  // What keeps most of what a later question needs (docs/RESULTS.md): the
  // question's own votes where it guides; without it the gates (16 of 30
  // needles at 32K against SnapKV's 3, at the same loss and speed).
  return !question_guided && !gates_path.empty() ? PrunerKind::kGate : PrunerKind::kSnapKv;
}

absl::Status SetPrunerInputs(const LoadedModel& m, PrefillConfig& c, bool question_guided) {
  c.repeat_prompt.clear();
  c.gate = nullptr;
  const std::string path = GatesPath(m.path);
  if (absl::GetFlag(FLAGS_pruner) == "auto") {
    c.pruner.kind = AutoPruner(path, question_guided);
    static bool said = false;
    if (!question_guided && path.empty() && !said) {
      said = true;
      std::fprintf(stderr,
                   "snapfill: no gates for this model (%s; tools/train_gates.sh makes the default model's): "
                   "compressing with SnapKV's window votes, which keep fewer facts for a later question\n",
                   DefaultGatesPath(m.path).c_str());
    }
  }
  if (c.pruner.kind == PrunerKind::kGate) {
    if (path.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--pruner=gate needs --gates FILE (made by snapfill train-gate, or tools/train_gates.sh for the "
          "default model), or gates at ", DefaultGatesPath(m.path)));
    }
    // The process's gates, loaded at first use (every command runs one model).
    static std::string* loaded_path = new std::string;
    static GateModel* gates = nullptr;
    if (gates == nullptr || *loaded_path != path) {
      SNAPFILL_ASSIGN_OR_RETURN(GateModel g, GateModel::Load(path, ModelFingerprint(m.model->gguf())));
      delete gates;
      gates = new GateModel(std::move(g));
      *loaded_path = path;
    }
    c.gate = gates;
    return absl::OkStatus();
  }
  if (c.pruner.kind != PrunerKind::kReconstruct) return absl::OkStatus();
  const std::string prompt = absl::GetFlag(FLAGS_repeat_prompt);
  if (prompt.empty()) return absl::InvalidArgumentError("--repeat_prompt must not be empty");
  SNAPFILL_ASSIGN_OR_RETURN(c.repeat_prompt, BuildContinuation(*m.tokenizer, m.chat_template, prompt));
  return absl::OkStatus();
}

std::string QuestionSelectionLabel(const PrunerConfig& p) {
  return absl::StrCat("share ", p.query_share, ", ", SelectionName(p.query_select),
                      p.query_select == Selection::kSpan ? absl::StrCat(" ", p.span) : "", ", votes ",
                      QueryVotesName(p.query_votes));
}

const char* QueryHeadsName(const PrunerConfig& p) { return p.shared_query_votes ? "shared" : "each"; }

absl::StatusOr<bool> RecallRankSummed() {
  const std::string rank = absl::GetFlag(FLAGS_recall_rank);
  if (rank != "summed" && rank != "heads") {
    return absl::InvalidArgumentError(absl::StrCat("--recall_rank=", rank, ": expected summed or heads"));
  }
  return rank == "summed";
}

RecallOptions RecallAfterOptions(const PrefillConfig& c, int64_t budget) {
  RecallOptions options = RecallOptionsFor(c, budget);
  options.summed = absl::GetFlag(FLAGS_recall_rank) == "summed";
  return options;
}

void WarnKeepLastChunkUnused() {
  if (!FlagGiven("keep_last_chunk")) return;
  std::fprintf(stderr,
               "snapfill: warning: --keep_last_chunk has no effect here: it applies where a question is read after "
               "the prefill (prefill, or --query_aware=false with --recall_dir), not where the input the chunk loop "
               "reads ends with the question itself\n");
}

bool KeepLastChunkFor(bool question_after) {
  if (question_after) return absl::GetFlag(FLAGS_keep_last_chunk);
  WarnKeepLastChunkUnused();
  return false;
}

int64_t MoveRecallAfterPrefill(PrefillConfig* c) {
  if (c->recall_budget <= 0 || (absl::GetFlag(FLAGS_query_aware) && c->pruner.kind == PrunerKind::kSnapKv)) return 0;
  return std::exchange(c->recall_budget, 0);
}

void AddRecallDigests(uint64_t input_digest, uint64_t plan_digest, std::string* config_json) {
  config_json->pop_back();  // the object's closing brace
  absl::StrAppendFormat(config_json, ",\"recall_input_digest\":\"%016x\",\"recall_plan_digest\":\"%016x\"}",
                        input_digest, plan_digest);
}

std::string ConfigJson(const PrefillConfig& c, const std::string& model_path,
                       int64_t input_tokens) {
  // Question-guided compression's settings, only where a question guides
  // (so the configuration of a run without one reads as before).
  std::string query;
  if (!c.query_tokens.empty()) {
    query = absl::StrFormat(
        ",\"query_tokens\":%d,\"query_share\":%g,\"select\":\"%s\",\"span\":%d,\"query_heads\":\"%s\"",
        c.query_tokens.size(), c.pruner.query_share, SelectionName(c.pruner.query_select), c.pruner.span,
        QueryHeadsName(c.pruner));
    // Only where it is not the default, so that checkpoints written before
    // the setting existed still resume.
    if (c.pruner.query_votes != QueryVotes::kSum) {
      absl::StrAppendFormat(&query, ",\"query_votes\":\"%s\"", QueryVotesName(c.pruner.query_votes));
    }
  }
  if (c.pruner.kind == PrunerKind::kReconstruct) {
    absl::StrAppendFormat(&query, ",\"repeat_stride\":%d,\"repeat_prompt_tokens\":%d", c.pruner.repeat_stride,
                          c.repeat_prompt.size());
  }
  if (KeepsEntryScores(c.pruner.kind)) absl::StrAppendFormat(&query, ",\"score_span\":%d", c.pruner.score_span);
  // The gates' checksum: a resume with other gates would rank the rest of
  // the input by other predictions than the checkpoint's scores.
  if (c.pruner.kind == PrunerKind::kGate && c.gate != nullptr) {
    absl::StrAppendFormat(&query, ",\"gates\":\"%016x\"", c.gate->Digest());
  }
  if (c.recall_budget > 0) {
    absl::StrAppendFormat(&query, ",\"recall\":%d,\"recall_format\":\"%s\"", c.recall_budget,
                          RecallFormatName(c.recall_format));
  }
  // Only where it is set (a configuration without it reads as before).
  if (c.schedule.keep_last_chunk) absl::StrAppend(&query, ",\"keep_last_chunk\":true");
  return absl::StrFormat(
      "{%s\"input_tokens\":%d,\"schedule\":\"%s\",\"growth\":\"%s\","
      "\"memory\":%d,\"chunk\":%d,\"first_memory\":%d,\"window\":%d,\"pruner\":\"%s\","
      "\"pool_kernel\":%d,\"pooling\":\"%s\",\"sinks\":%d,\"positions\":\"%s\"%s}",
      model_path.empty() ? "" : absl::StrCat("\"model\":\"", model_path, "\","),
      input_tokens, std::string(ScheduleKindName(c.schedule.kind)),
      std::string(GrowthName(c.schedule.growth)), c.schedule.memory, c.schedule.chunk,
      c.schedule.first_memory, c.schedule.window, PrunerKindName(c.pruner.kind),
      c.pruner.pool_kernel, PoolingName(c.pruner.pooling), c.schedule.sink_tokens,
      c.keep_original_positions ? "original" : "re-encoded", query);
}

std::string TelemetryJson(const StepTelemetry& t, bool with_origin) {
  std::string s = absl::StrFormat(
      "{\"step\":%d,\"start\":%d,\"chunk\":%d,\"attention_length\":%d,\"seconds\":%.6f,"
      "\"elapsed\":%.3f,\"rss_bytes\":%d,\"kernel_scratch_bytes\":%d,\"memory\":[%s],\"retention\":[",
      t.step, t.start_token, t.chunk_tokens, t.attention_length, t.seconds, t.elapsed_seconds,
      t.rss_bytes, t.kernel_scratch_bytes, absl::StrJoin(t.memory, ","));
  for (size_t i = 0; i < t.retention.size(); ++i) {
    absl::StrAppendFormat(&s, "%s%.4f", i ? "," : "", t.retention[i]);
  }
  s += "]";
  // A hybrid model's sliding-window layers (their entries are in `memory`
  // too, each layer's window).
  if (t.window_attention_length > 0) {
    absl::StrAppendFormat(&s, ",\"window_attention_length\":%d", t.window_attention_length);
  }
  if (t.query_rows > 0) absl::StrAppendFormat(&s, ",\"query_rows\":%d", t.query_rows);
  // Layers whose selection stayed in the backend's memory (one op, its
  // indices read at the chunk's end).
  if (t.backend_selections > 0) absl::StrAppendFormat(&s, ",\"backend_selections\":%d", t.backend_selections);
  if (t.score_seconds > 0) absl::StrAppendFormat(&s, ",\"score_seconds\":%.6f", t.score_seconds);
  if (t.recalled > 0) {
    absl::StrAppendFormat(&s, ",\"recalled\":%d,\"recall_seconds\":%.6f", t.recalled, t.recall_seconds);
  }
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
  if (t.scored_tokens > 0) {
    absl::StrAppendFormat(&s, ",\"scored\":%d,\"nll_sum\":%.6f", t.scored_tokens, t.nll_sum);
  }
  s += "}\n";
  return s;
}

CheckpointState PrefillCheckpointState(const PrefillEngine& engine, const Backend& backend,
                                       const std::string& fingerprint, uint64_t input_digest, int64_t total) {
  CheckpointState s;
  s.model_fingerprint = fingerprint;
  s.config = ConfigJson(engine.config(), "", total);
  s.input_digest = input_digest;
  s.input_tokens = total;
  s.plan_digest = engine.plan_digest();
  s.threads = backend.num_threads();
  s.kernels = backend.kernels();
  s.total_steps = static_cast<int64_t>(engine.plan().steps.size());
  return s;
}

namespace {
std::atomic<int> g_stop_signal{0};
void OnStopSignal(int signo) { g_stop_signal.store(signo); }
}  // namespace

int StopSignal() { return g_stop_signal.load(); }
void ResetStopSignal() { g_stop_signal.store(0); }

StopSignals::StopSignals() {
  struct sigaction sa {};
  sa.sa_handler = OnStopSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESETHAND;
  sigaction(SIGINT, &sa, &old_int_);
  sigaction(SIGTERM, &sa, &old_term_);
}

StopSignals::~StopSignals() {
  sigaction(SIGINT, &old_int_, nullptr);
  sigaction(SIGTERM, &old_term_, nullptr);
}

}  // namespace snapfill::cli
