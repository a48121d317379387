// snapfill run / prefill: a long input through the chunk loop.
#include <signal.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "snapfill/engine.h"
#include "snapfill/status.h"
#include "src/base/file_util.h"
#include "src/base/sys_stats.h"
#include "src/engine/generate.h"
#include "src/engine/prompt.h"
#include "src/engine/recall.h"
#include "src/gguf/fingerprint.h"
#include "src/kv/cache_file.h"
#include "src/kv/checkpoint_file.h"
#include "src/kv/kv_cache.h"
#include "src/kv/recall_store.h"
#include "src/model/llama_forward.h"
#include "tools/cli/commands.h"
#include "tools/cli/common.h"
#include "tools/cli/flags.h"
#include "tools/cli/memory_budget.h"
#include "tools/cli/roofline.h"

namespace snapfill::cli {
namespace {

// What a device needs beyond the backend's own count (the prediction):
// cuBLAS's workspace, the allocator's rounding of each allocation to its
// pages. A plan is refused unless this much is free besides.
constexpr uint64_t kDeviceReserve = uint64_t{512} << 20;

bool DeviceTooSmall(uint64_t predicted, uint64_t free) { return free > 0 && predicted + kDeviceReserve > free; }

struct Prepared {
  LoadedModel model;
  std::unique_ptr<Backend> backend;
  // The prompt's ids: the template's opening, the document, the question.
  std::unique_ptr<TokenSpool> tokens;
  int64_t total = 0;  // tokens->size()
  uint64_t input_bytes = 0;
  uint64_t tokenizing_peak = 0;  // peak RSS by the end of tokenizing (measured)
  PrefillConfig config;
  std::unique_ptr<PrefillEngine> engine;
  double tokenize_seconds = 0;
  PeakPrediction peak;
  DevicePrediction device;  // on a device (ComputesOnDevice): its memory
  std::string sizes_note;  // how --max_memory chose the sizes
  uint64_t weight_bytes = 0;       // what the weights hold resident during the prefill
  uint64_t decode_copy_bytes = 0;  // what the backend's decode copies add to that (run only)
  bool half_decode_kv = false;     // decode reads fp16 KV entries that replace the f32 ones (run only)
  // --recall_dir: the store (created here, or reopened by --resume) and the
  // most it may write.
  std::unique_ptr<RecallStore> recall;
  uint64_t recall_disk_bytes = 0;
  // run --recall_dir where the question does not guide the compression
  // (--query_aware=false, or a pruner that needs no question): the input is
  // read without the question (config.recall_budget 0: the chunk loop only
  // keeps the store), then the question (these tokens, as they close the
  // prompt) brings back recall_after entries per layer and KV head from the
  // store and is read as the answer's prompt, as `prefill --recall_dir` and
  // `generate --cache --recall_dir` do in two commands.
  std::vector<int32_t> ask_after;
  int64_t recall_after = 0;
  std::string fingerprint;  // the model's, once read (ModelFingerprint hashes the whole file)
  uint64_t kernel_scratch_peak = 0;  // the most the kernels' buffers held after a step (measured)
};

// With --verbosity 1, after the prefill: "the kernels' buffers: 7.9 MiB at
// most (predicted 8.4 MiB)".
void PrintKernelScratch(const Prepared& p) {
  if (absl::GetFlag(FLAGS_verbosity) < 1 || p.kernel_scratch_peak == 0) return;
  std::fprintf(stderr, "the kernels' buffers: %s at most (predicted %s)\n", HumanBytes(p.kernel_scratch_peak).c_str(),
               HumanBytes(p.peak.backend).c_str());
}

const std::string& Fingerprint(Prepared& p) {
  if (p.fingerprint.empty()) p.fingerprint = ModelFingerprint(p.model.model->gguf());
  return p.fingerprint;
}

// What the recall store records about the run: whose store it is.
RecallStoreInfo RecallInfo(Prepared& p) {
  RecallStoreInfo info = RecallShape(p.model.model->config(), p.config.recall_format);
  info.model_fingerprint = Fingerprint(p);
  info.input_digest = p.tokens->digest();
  info.input_tokens = p.total;
  info.plan_digest = p.engine->plan_digest();
  return info;
}

// Free bytes where the store goes (its directory, or the one it will be
// made in); 0 if that cannot be told.
uint64_t FreeDiskBytes(const std::string& dir) {
  struct statvfs st {};
  std::string at = dir;
  if (::statvfs(at.c_str(), &st) != 0) {
    const size_t slash = at.find_last_of('/');
    at = slash == std::string::npos ? "." : slash == 0 ? "/" : at.substr(0, slash);
    if (::statvfs(at.c_str(), &st) != 0) return 0;
  }
  return static_cast<uint64_t>(st.f_bavail) * st.f_frsize;
}

// The prefill's footprint on p's backend: its buffers where the backend
// keeps them.
absl::StatusOr<PrefillFootprint> FootprintOf(const Prepared& p, const PrefillConfig& c) {
  return PrefillEngine::Footprint(p.model.model->config(), c, p.total,
                                  LlamaForward::FusesLayers(*p.model.model, *p.backend, c.schedule.chunk),
                                  !p.backend->HostReachesBuffers());
}

// The peak of p's run with plan `fp`: PredictPeak, and with a recall after
// the prefill (Prepared::ask_after) the entries it brings into the cache
// (room the plan reserved, untouched until then) and what the question's
// pass over the cache holds before decoding (RecallForQuestion: its
// activations, each layer's keys and values with the question's, the
// recall's scratch), counted with decoding's.
PeakPrediction PredictRunPeak(const Prepared& p, const PrefillFootprint& fp, uint64_t process_bytes) {
  const LlamaConfig& mc = p.model.model->config();
  PeakPrediction peak =
      PredictPeak(mc, *p.backend, p.weight_bytes, fp, process_bytes, p.decode_copy_bytes, p.half_decode_kv);
  if (!p.ask_after.empty()) {
    const int64_t n = static_cast<int64_t>(p.ask_after.size());
    const uint64_t keys = static_cast<uint64_t>(std::max(fp.memory_capacity, fp.final_entries) + n);
    peak.kept += static_cast<uint64_t>(p.recall_after) * fp.recall_entry_bytes;
    peak.after += LlamaForward::ScratchBytes(mc, n) + 2 * keys * mc.num_kv_heads * mc.head_dim * sizeof(float) +
                  Recaller::QuestionScratchBytes(mc, n, RecallAfterOptions(p.config, p.recall_after));
  }
  return peak;
}

// --max_memory: the largest memory and chunk (those the user did not set)
// whose predicted peak fits (the host's resident set; on a device, the
// device's memory); a ResourceExhausted naming the prediction if none
// does, before anything runs.
absl::Status ChooseSizes(Prepared& p, uint64_t budget, uint64_t process_bytes) {
  const LlamaConfig& mc = p.model.model->config();
  const bool device = ComputesOnDevice(*p.backend);
  const bool fixed_memory = FlagGiven("memory");
  const bool fixed_chunk = FlagGiven("chunk");
  static constexpr int64_t kSizes[] = {8192, 6144, 4096, 3072, 2048, 1536, 1024, 768,
                                       512,  384,  256,  192,  128,  96,   64};
  absl::Status last_error = absl::OkStatus();
  std::string smallest;
  bool any = false;
  for (int64_t size : kSizes) {
    PrefillConfig c = p.config;
    if (!fixed_memory) c.schedule.memory = size;
    if (!fixed_chunk) c.schedule.chunk = size;
    if (fixed_memory && fixed_chunk && size != kSizes[0]) break;  // one candidate: the user's
    absl::StatusOr<PrefillFootprint> fp = FootprintOf(p, c);
    if (!fp.ok()) {
      last_error = fp.status();
      continue;
    }
    // Sizes of our choosing stay inside the model's trained context.
    if (!(fixed_memory && fixed_chunk) && mc.context_length > 0 &&
        fp->plan.peak_attention_length > mc.context_length) {
      continue;
    }
    PeakPrediction peak = PredictRunPeak(p, *fp, process_bytes);
    peak.tokenizing = p.tokenizing_peak;
    const DevicePrediction on_device = PredictDevicePeak(*p.model.model, *p.backend, *fp);
    smallest = device ? on_device.Format() : peak.Format();
    any = true;
    if ((device ? on_device.total() : peak.total()) <= budget) {
      p.config = c;
      p.sizes_note = absl::StrFormat("--max_memory %s%s: memory %d, chunk %d (%s)", HumanBytes(budget),
                                     device ? " of device memory" : "", c.schedule.memory, c.schedule.chunk, smallest);
      return absl::OkStatus();
    }
  }
  if (!any) return last_error;
  return absl::ResourceExhaustedError(absl::StrCat(
      "no memory and chunk size fits --max_memory ", HumanBytes(budget), device ? " of device memory" : "",
      ": the smallest ", fixed_memory && fixed_chunk ? "(the given sizes) " : "", "has a ", smallest,
      "; raise --max_memory", fixed_memory || fixed_chunk ? " or drop --memory/--chunk" : ""));
}

// Reads the input, tokenizes it inside the chat template and plans the
// schedule; everything that can be refused is refused here, before the
// prefill starts.
absl::StatusOr<Prepared> Prepare(bool with_question) {
  const std::string input_path = absl::GetFlag(FLAGS_input);
  if (input_path.empty()) return absl::InvalidArgumentError("--input FILE is required");
  const std::string checkpoint = absl::GetFlag(FLAGS_checkpoint);
  if (absl::GetFlag(FLAGS_resume) && checkpoint.empty()) {
    return absl::InvalidArgumentError("--resume needs --checkpoint FILE");
  }
  if (absl::GetFlag(FLAGS_checkpoint_every) < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--checkpoint_every=", absl::GetFlag(FLAGS_checkpoint_every), " must be >= 1"));
  }
  if (!checkpoint.empty() && !absl::GetFlag(FLAGS_resume) && !absl::GetFlag(FLAGS_force) &&
      !absl::GetFlag(FLAGS_dry_run) && access(checkpoint.c_str(), F_OK) == 0) {
    return absl::AlreadyExistsError(absl::StrCat(
        "--checkpoint ", checkpoint, " exists: add --resume to continue from it, or --force "
        "to start over and replace it"));
  }
  SNAPFILL_ASSIGN_OR_RETURN(PrefillConfig config, PrefillConfigFromFlags());
  SNAPFILL_ASSIGN_OR_RETURN(InputOptions input_options, InputOptionsFromFlags(/*with_suffix=*/with_question));
  SNAPFILL_ASSIGN_OR_RETURN(StreamedInput in, OpenStreamedInput(input_path));
  Prepared p;
  p.config = config;
  // run decodes -n tokens into the memory itself.
  p.config.decode_reserve = with_question ? absl::GetFlag(FLAGS_n) : 0;
  // prefill has no question to recall with: it keeps the store for
  // `generate --cache --recall_dir`.
  if (!with_question) p.config.recall_budget = 0;
  p.model = std::move(in.model);
  p.backend = std::move(in.backend);
  p.weight_bytes = LlamaForward::ResidentWeightBytes(*p.model.model, *p.backend, /*decode=*/false);
  if (with_question) {
    const uint64_t decode = LlamaForward::ResidentWeightBytes(*p.model.model, *p.backend, /*decode=*/true);
    p.decode_copy_bytes = decode > p.weight_bytes ? decode - p.weight_bytes : 0;
    p.half_decode_kv = p.backend->HalfDecodeKv();
  }
  const std::string question = with_question ? absl::GetFlag(FLAGS_question) : "";
  SNAPFILL_ASSIGN_OR_RETURN(PromptFrame frame, BuildPromptFrame(*p.model.tokenizer, p.model.chat_template, question,
                                                                absl::GetFlag(FLAGS_system)));
  SNAPFILL_RETURN_IF_ERROR(SetPrunerInputs(p.model, p.config,
                                           /*question_guided=*/!question.empty() && absl::GetFlag(FLAGS_query_aware)));
  if (with_question && !question.empty() && absl::GetFlag(FLAGS_query_aware) &&
      p.config.pruner.kind == PrunerKind::kSnapKv) {
    // The question as it closes the prompt guides every chunk's compression.
    SNAPFILL_ASSIGN_OR_RETURN(p.config.query_tokens,
                              BuildContinuation(*p.model.tokenizer, p.model.chat_template, question));
  } else if (with_question && !question.empty()) {
    p.recall_after = MoveRecallAfterPrefill(&p.config);
  }
  // prefill's later question, and one that recalls after the prefill,
  // read the input's last chunk whole.
  p.config.schedule.keep_last_chunk = KeepLastChunkFor(!with_question || p.recall_after > 0);
  if (p.recall_after > 0) {
    // The question recalls after the prefill (Prepared::ask_after).
    SNAPFILL_ASSIGN_OR_RETURN(p.ask_after, BuildContinuation(*p.model.tokenizer, p.model.chat_template, question));
    input_options.with_suffix = false;
    // The decoder's cache takes the recalled entries and the question too.
    p.config.decode_reserve += static_cast<int64_t>(p.ask_after.size()) + p.recall_after;
  }
  // The document is read and tokenized as a stream, only its first
  // --max_tokens where that is given; the template's opening and the
  // question stay whole.
  SNAPFILL_ASSIGN_OR_RETURN(InputTokens input, TokenizeInput(*in.file, *p.model.tokenizer, frame, input_options));
  WarnIfNotUtf8(input_path, input);
  p.tokenize_seconds = input.seconds;
  p.input_bytes = input.bytes_read;
  p.tokenizing_peak = PeakRssBytes();
  p.tokens = std::move(input.tokens);
  p.total = p.tokens->size();
  // The process as it stands: the ids the spool holds in memory are in it.
  const uint64_t process_bytes = CurrentRssBytes();
  const std::string max_memory = absl::GetFlag(FLAGS_max_memory);
  uint64_t budget = 0;
  if (!max_memory.empty()) {
    SNAPFILL_ASSIGN_OR_RETURN(budget, ParseByteSize(max_memory));
    SNAPFILL_RETURN_IF_ERROR(ChooseSizes(p, budget, process_bytes));
  }
  const int64_t total = p.total;
  {
    // Let go of this plan before the engine makes its own: a plan is
    // about 300 bytes a step.
    SNAPFILL_ASSIGN_OR_RETURN(PrefillFootprint fp, FootprintOf(p, p.config));
    p.peak = PredictRunPeak(p, fp, process_bytes);
    p.peak.tokenizing = p.tokenizing_peak;
    if (ComputesOnDevice(*p.backend)) p.device = PredictDevicePeak(*p.model.model, *p.backend, fp);
  }
  // A plan the device cannot hold is refused before anything is allocated
  // (a --dry_run prints it instead).
  if (const uint64_t free = p.backend->DeviceFreeBytes();
      DeviceTooSmall(p.device.total(), free) && !absl::GetFlag(FLAGS_dry_run)) {
    const uint64_t budget = free > kDeviceReserve ? free - kDeviceReserve : 0;
    return absl::ResourceExhaustedError(absl::StrCat(
        "the plan needs more device memory than is free: ", p.device.Format(), ", and ", HumanBytes(kDeviceReserve),
        " for cuBLAS and the allocator's rounding; the device has ", HumanBytes(free),
        " free. Lower --memory or --chunk, or give --max_memory ", HumanBytes(budget), " to choose sizes that fit"));
  }
  SNAPFILL_ASSIGN_OR_RETURN(p.engine, PrefillEngine::Create(*p.model.model, p.backend.get(),
                                                            p.config, total));
  const std::string recall_dir = absl::GetFlag(FLAGS_recall_dir);
  if (!recall_dir.empty()) {
    p.recall_disk_bytes = RecallStore::MaxBytes(RecallShape(p.model.model->config(), p.config.recall_format), total);
  }
  if (!recall_dir.empty() && !absl::GetFlag(FLAGS_dry_run)) {
    const uint64_t free = FreeDiskBytes(recall_dir);
    if (free > 0 && free < p.recall_disk_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "--recall_dir ", recall_dir, ": the store may take up to ", HumanBytes(p.recall_disk_bytes), " for ",
          total, " tokens and the filesystem has ", HumanBytes(free), " free",
          p.config.recall_format == RecallFormat::kF16 ? " (--recall_format q8 takes about half)" : ""));
    }
    // A resumed run reopens the store its checkpoint names (RunPrefillLoop).
    if (!absl::GetFlag(FLAGS_resume)) {
      SNAPFILL_ASSIGN_OR_RETURN(p.recall, RecallStore::Create(recall_dir, RecallInfo(p)));
      SNAPFILL_RETURN_IF_ERROR(p.engine->AttachRecallStore(p.recall.get()));
    }
  }
  return p;
}

void PrintPlan(const Prepared& p) {
  const SchedulePlan& plan = p.engine->plan();
  std::printf("%s", FormatPlan(plan).c_str());
  std::printf("input: %lld tokens from %s (tokenized in %.2f s); the ids %s\n", (long long)p.total,
              HumanBytes(p.input_bytes).c_str(), p.tokenize_seconds,
              p.tokens->on_disk() ? absl::StrCat("spooled to a temporary file in ", p.tokens->dir()).c_str()
                                  : absl::StrCat("in memory (", HumanBytes(p.tokens->resident_bytes()), ")").c_str());
  std::printf("memory: %s for the compressed KV, %s scratch, weights %s resident (%s in the file)\n",
              HumanBytes(p.engine->memory_bytes()).c_str(),
              HumanBytes(p.engine->scratch_bytes()).c_str(), HumanBytes(p.weight_bytes).c_str(),
              HumanBytes(p.model.model->weight_bytes()).c_str());
  if (!p.sizes_note.empty()) std::printf("%s\n", p.sizes_note.c_str());
  if (const LlamaConfig& mc = p.model.model->config(); mc.sliding_window > 0) {
    int64_t local = 0;
    for (int64_t l = 0; l < mc.num_layers; ++l) local += mc.IsLocal(l);
    std::printf("sliding-window layers: %lld of %lld keep their last %lld entries (the window, exact); the "
                "schedule's memory is the other %lld layers'\n",
                (long long)local, (long long)mc.num_layers,
                (long long)std::min<int64_t>(mc.sliding_window, p.total), (long long)(mc.num_layers - local));
  }
  const PrefillConfig& c = p.engine->config();
  if (!c.query_tokens.empty() && c.pruner.kind == PrunerKind::kSnapKv) {
    // What question-guided compression adds: its rows in every batch.
    const int64_t q = c.query_tokens.size();
    const int64_t steps = p.engine->plan().steps.size();
    std::printf("question-guided: the question's %lld tokens vote after each of the %lld chunks "
                "(%lld more rows, +%.1f%%; %s)\n",
                (long long)q, (long long)steps, (long long)(q * steps),
                100.0 * q * steps / std::max<double>(1, p.total),
                QuestionSelectionLabel(c.pruner).c_str());
  }
  if (c.pruner.kind == PrunerKind::kReconstruct) {
    // What context reconstruction adds: the prompt and the repetition in every batch.
    int64_t rows = 0;
    for (const ScheduleStep& s : p.engine->plan().steps) {
      rows += static_cast<int64_t>(c.repeat_prompt.size()) + (s.chunk_tokens + c.pruner.repeat_stride - 1) /
                                                                  c.pruner.repeat_stride;
    }
    std::printf("context reconstruction: each chunk repeated after a %lld-token prompt%s (%lld more rows, +%.1f%%; "
                "the scoring's time is in --telemetry's score_seconds and --profile's window_scores)\n",
                (long long)c.repeat_prompt.size(),
                c.pruner.repeat_stride > 1 ? absl::StrCat(", one token in ", c.pruner.repeat_stride).c_str() : "",
                (long long)rows, 100.0 * rows / std::max<double>(1, p.total));
  }
  if (const std::string dir = absl::GetFlag(FLAGS_recall_dir); !dir.empty()) {
    const uint64_t free = FreeDiskBytes(dir);
    std::printf("recall: up to %s of evicted entries (%s) in %s%s; %s\n", HumanBytes(p.recall_disk_bytes).c_str(),
                RecallFormatName(c.recall_format), dir.c_str(),
                free > 0 ? absl::StrCat(", ", HumanBytes(free), " free there").c_str() : "",
                c.recall_budget > 0
                    ? absl::StrCat("the question brings back ", c.recall_budget, " per layer and KV head").c_str()
                : p.recall_after > 0 ? absl::StrCat("the question, read after the input, brings back ", p.recall_after,
                                                    " per layer and KV head")
                                           .c_str()
                                     : "kept for generate --cache --recall_dir");
  }
  std::printf("%s\n", p.peak.Format().c_str());
  if (ComputesOnDevice(*p.backend)) {
    const uint64_t free = p.backend->DeviceFreeBytes();
    std::printf("%s%s\n", p.device.Format().c_str(),
                free > 0 ? absl::StrCat("; ", HumanBytes(free), " free on the device",
                                        DeviceTooSmall(p.device.total(), free)
                                            ? absl::StrCat(": too little with ", HumanBytes(kDeviceReserve),
                                                           " kept besides, the run would be refused")
                                            : "")
                               .c_str()
                         : "");
  }
}

// What `run --report` writes, for `snapfill bench`.
struct RunReport {
  int64_t input_tokens = 0, steps = 0, peak_attention_length = 0, decode_tokens = 0;
  int64_t cache_entries = 0;
  double mean_memory = 0, prefill_seconds = 0, ttft_seconds = 0, decode_seconds = 0;
  double first_step_seconds = 0;
  uint64_t peak_rss_bytes = 0, predicted_peak_bytes = 0;
  uint64_t kernel_scratch_bytes = 0, predicted_kernel_scratch_bytes = 0;
  uint64_t device_peak_bytes = 0;  // the backend's own device allocations at their peak (0 on the CPU)
  uint64_t predicted_device_peak_bytes = 0;  // DevicePrediction (0 on the CPU)
  std::vector<std::pair<std::string, double>> profile;
  Work prefill_work;      // the prefill's ops and seconds (--profile)
  BackendProfile::Peaks peaks;   // measured after the run (--profile)
};

std::string RunReportJson(const RunReport& r) {
  std::string s = absl::StrFormat(
      "{\"input_tokens\":%d,\"steps\":%d,\"mean_memory\":%.3f,\"peak_attention_length\":%d,"
      "\"prefill_seconds\":%.6f,\"ttft_seconds\":%.6f,\"decode_tokens\":%d,"
      "\"decode_seconds\":%.6f,\"first_step_seconds\":%.6f,\"cache_entries\":%d,"
      "\"peak_rss_bytes\":%d,\"predicted_peak_bytes\":%d,\"kernel_scratch_bytes\":%d,"
      "\"predicted_kernel_scratch_bytes\":%d,\"device_peak_bytes\":%d,\"predicted_device_peak_bytes\":%d,"
      "\"profile\":{",
      r.input_tokens, r.steps, r.mean_memory, r.peak_attention_length, r.prefill_seconds,
      r.ttft_seconds, r.decode_tokens, r.decode_seconds, r.first_step_seconds, r.cache_entries,
      r.peak_rss_bytes, r.predicted_peak_bytes, r.kernel_scratch_bytes, r.predicted_kernel_scratch_bytes,
      r.device_peak_bytes, r.predicted_device_peak_bytes);
  for (size_t i = 0; i < r.profile.size(); ++i) {
    absl::StrAppendFormat(&s, "%s\"%s\":%.6f", i ? "," : "", r.profile[i].first,
                          r.profile[i].second);
  }
  const Work& w = r.prefill_work;
  absl::StrAppendFormat(&s,
                        "},\"prefill_work\":{\"matmul_ops\":%.17g,\"int8_matmul_ops\":%.17g,\"attention_ops\":%.17g,"
                        "\"window_ops\":%.17g,\"matmul_seconds\":%.6f,\"attention_seconds\":%.6f,"
                        "\"window_seconds\":%.6f},\"peaks\":{\"threads\":%d",
                        w.matmul_ops, w.int8_matmul_ops, w.attention_ops, w.window_ops, w.matmul_seconds,
                        w.attention_seconds, w.window_seconds, r.peaks.threads);
  for (const auto& [name, peak] : {std::pair<const char*, const BackendProfile::Peak*>{"int8_products", &r.peaks.int8_products},
                                   {"f32", &r.peaks.f32},
                                   {"prefill_attention", &r.peaks.prefill_attention}}) {
    absl::StrAppendFormat(&s, ",\"%s\":{\"instruction\":\"%s\",\"ops_per_second\":%.6g}", name, peak->instruction,
                          peak->ops_per_second);
  }
  return s + "}}\n";
}

// What a checkpoint of this run records about it, to refuse resuming
// another run's checkpoint.
CheckpointState RunState(Prepared& p) {
  return PrefillCheckpointState(*p.engine, *p.backend, Fingerprint(p), p.tokens->digest(), p.total);
}

// --resume: loads the checkpoint, checks it belongs to this run, restores
// the engine. Returns the step to continue from.
absl::StatusOr<int64_t> ResumeFromCheckpoint(Prepared& p, const std::string& path, CheckpointState& run) {
  if (access(path.c_str(), F_OK) != 0) {
    return absl::NotFoundError(absl::StrCat("--resume: checkpoint ", path,
                                            " does not exist (start without --resume)"));
  }
  SNAPFILL_ASSIGN_OR_RETURN(PrefillCheckpoint ck, LoadCheckpointFile(path));
  // The remaining chunks are computed as the stopped run's were (bit for
  // bit), with the prefill attention its record names, whatever a new
  // timing would pick; only --kernels given here overrides it.
  if (!FlagGiven("kernels") && p.backend->device() == Device::kCpu) {
    const std::string attention = AttentionFromKernelsRecord(ck.state.kernels);
    const std::string products = ProductsFromKernelsRecord(ck.state.kernels);
    for (const bool is_attention : {true, false}) {
      const std::string& recorded = is_attention ? attention : products;
      if (recorded.empty() || recorded == "portable") continue;
      BackendOptions o;
      (is_attention ? o.attention_kernel : o.products_kernel) = recorded;
      if (const absl::Status s = ConfigureCpuKernels(o); !s.ok()) {
        std::fprintf(stderr, "snapfill: warning: the checkpoint's %s cannot run here (%s)\n",
                     is_attention ? "prefill attention" : "products", std::string(s.message()).c_str());
      }
    }
    if (!attention.empty() || !products.empty()) run.kernels = p.backend->kernels();  // the next checkpoints record it
  }
  std::string warning;
  SNAPFILL_RETURN_IF_ERROR(CheckpointMismatch(ck.state, run, path, &warning));
  if (!warning.empty()) std::fprintf(stderr, "snapfill: warning: %s\n", warning.c_str());
  const std::vector<ScheduleStep>& steps = p.engine->plan().steps;
  if (steps[ck.state.steps_done].start_token != ck.state.next_token) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint ", path, " continues at token ", ck.state.next_token, " but step ",
        ck.state.steps_done, " of this plan starts at ", steps[ck.state.steps_done].start_token));
  }
  SNAPFILL_RETURN_IF_ERROR(
      p.engine->Restore(ck.state.steps_done, ck.state.retention, *ck.memory));
  if (!absl::GetFlag(FLAGS_recall_dir).empty()) {
    // The store as it was at the checkpoint (what later steps wrote is cut).
    SNAPFILL_ASSIGN_OR_RETURN(p.recall, RecallStore::Reopen(absl::GetFlag(FLAGS_recall_dir), RecallInfo(p),
                                                            ck.state.recall_slots));
    SNAPFILL_RETURN_IF_ERROR(p.engine->AttachRecallStore(p.recall.get()));
  }
  std::fprintf(stderr, "snapfill: resuming from %s after step %lld/%zu (token %lld/%lld)\n",
               path.c_str(), (long long)ck.state.steps_done, steps.size(),
               (long long)ck.state.next_token, (long long)p.total);
  return ck.state.steps_done;
}

// The prefill with a progress line and telemetry records.
absl::Status RunPrefillLoop(Prepared& p, double* seconds, double* recall_seconds = nullptr,
                            int64_t* recalled = nullptr) {
  const SchedulePlan& plan = p.engine->plan();
  for (const std::string& w : plan.warnings) std::fprintf(stderr, "snapfill: warning: %s\n", w.c_str());
  std::unique_ptr<std::ofstream> telemetry;
  const std::string telemetry_path = absl::GetFlag(FLAGS_telemetry);
  if (!telemetry_path.empty()) {
    // A resumed run appends to the records of the steps before the checkpoint.
    telemetry = std::make_unique<std::ofstream>(
        telemetry_path, absl::GetFlag(FLAGS_resume) ? std::ios::app : std::ios::trunc);
    if (!*telemetry) {
      return absl::PermissionDeniedError(absl::StrCat("--telemetry ", telemetry_path,
                                                      ": cannot open for writing"));
    }
  }
  const int64_t total = plan.config.total_tokens;
  const int64_t steps = plan.steps.size();
  const std::string checkpoint = absl::GetFlag(FLAGS_checkpoint);
  const int64_t checkpoint_every = absl::GetFlag(FLAGS_checkpoint_every);
  std::optional<StopSignals> signals;
  CheckpointState run_state;
  int64_t first_step = 0;
  if (!checkpoint.empty()) {
    run_state = RunState(p);
    if (absl::GetFlag(FLAGS_resume)) {
      SNAPFILL_ASSIGN_OR_RETURN(first_step, ResumeFromCheckpoint(p, checkpoint, run_state));
    }
    ResetStopSignal();
    signals.emplace();
  }
  absl::Status checkpoint_status;
  ChunkProgress progress("[snapfill]", total, steps, absl::GetFlag(FLAGS_progress));
  Stopwatch watch;
  auto on_step = [&](const StepTelemetry& t) {
    p.kernel_scratch_peak = std::max(p.kernel_scratch_peak, t.kernel_scratch_bytes);
    if (recall_seconds != nullptr) *recall_seconds += t.recall_seconds;
    if (recalled != nullptr) *recalled = std::max(*recalled, t.recalled);
    if (telemetry) WriteTelemetry(*telemetry, t, steps);
    progress.Step(t, [&] {
      int64_t mem = 0;
      for (int64_t m : t.memory) mem += m;
      mem /= std::max<size_t>(1, t.memory.size());
      return absl::StrFormat(" | step %d/%d memory %d chunk %d | RSS %s", t.step + 1, steps, mem, t.chunk_tokens,
                             HumanBytes(t.rss_bytes));
    });
    if (checkpoint.empty() || t.step + 1 == steps) return true;
    const int signo = StopSignal();
    if (signo != 0 || (t.step + 1 - first_step) % checkpoint_every == 0) {
      CheckpointState s = run_state;
      s.steps_done = p.engine->steps_done();
      s.next_token = t.start_token + t.chunk_tokens;
      s.retention = p.engine->retention();
      if (p.recall != nullptr) {
        // The store's entries are on disk before the checkpoint counts them.
        checkpoint_status = p.recall->Sync();
        if (!checkpoint_status.ok()) return false;
        s.recall_slots = p.recall->all_slots();
      }
      checkpoint_status = SaveCheckpointFile(checkpoint, s, p.engine->memory());
      if (!checkpoint_status.ok()) return false;
    }
    if (signo != 0) {
      checkpoint_status = absl::CancelledError(absl::StrFormat(
          "stopped by %s after step %d/%d (token %d/%d); the checkpoint %s is saved: run the same "
          "command with --resume to continue",
          signo == SIGINT ? "SIGINT" : "SIGTERM", t.step + 1, steps,
          t.start_token + t.chunk_tokens, total, checkpoint));
      return false;
    }
    return true;
  };
  const absl::Status run = p.engine->Run(*p.tokens, on_step);
  if (!checkpoint_status.ok()) return checkpoint_status;
  SNAPFILL_RETURN_IF_ERROR(run);
  *seconds = watch.Seconds();
  if (telemetry) {
    telemetry->flush();
    if (!*telemetry) return absl::DataLossError(absl::StrCat("error writing ", telemetry_path));
  }
  return absl::OkStatus();
}

// After the prefill loop: a failed run's store is removed unless a
// checkpoint can resume it; a finished one's too, unless `keep_if_ok`
// (prefill keeps it for generate --cache).
void DropRecallStore(Prepared& p, const absl::Status& prefill, bool keep_if_ok) {
  if (p.recall == nullptr) return;
  if (prefill.ok() ? keep_if_ok : !absl::GetFlag(FLAGS_checkpoint).empty()) return;
  const absl::Status removed = p.recall->Remove();
  if (!removed.ok()) std::fprintf(stderr, "snapfill: warning: %s\n", std::string(removed.message()).c_str());
}

// The prefill is complete (and, for prefill --out, saved): its checkpoint
// is no longer needed.
void RemoveCheckpoint() {
  const std::string checkpoint = absl::GetFlag(FLAGS_checkpoint);
  if (!checkpoint.empty()) std::remove(checkpoint.c_str());
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
  double recall_seconds = 0;
  int64_t recalled = 0;
  absl::Status prefill = RunPrefillLoop(p, &prefill_seconds, &recall_seconds, &recalled);
  // The prefill's own work (the profile goes on through the decode).
  BackendProfile* const profiler = p.backend->profile();
  const Work prefill_work = WorkFromProfile(profiler);
  std::unique_ptr<KvCache> kv;
  int64_t next_position = 0;
  if (prefill.ok()) {
    absl::StatusOr<std::unique_ptr<KvCache>> taken = p.engine->TakeDecoderCache();
    if (taken.ok()) {
      kv = *std::move(taken);
      next_position = p.engine->next_position();
    } else {
      prefill = taken.status();
    }
  }
  if (prefill.ok() && !p.ask_after.empty()) {
    // The question, read after the input, brings back what it attends to
    // most, then is read again as the prompt (Prepared::ask_after).
    Stopwatch watch;
    absl::StatusOr<int64_t> added = RecallForQuestion(*p.model.model, p.backend.get(), *kv, &next_position, *p.recall,
                                                      p.ask_after, RecallAfterOptions(p.config, p.recall_after));
    if (added.ok()) {
      recalled = *added;
      recall_seconds = watch.Seconds();
    } else {
      prefill = added.status();
    }
  }
  if (p.recall != nullptr && prefill.ok()) {
    std::fprintf(stderr,
                 "recall: %lld entries per layer and KV head brought back from %s of evicted entries "
                 "(%s) in %.1f s%s; the store is removed\n",
                 (long long)recalled, HumanBytes(p.recall->bytes()).c_str(), RecallFormatName(p.config.recall_format),
                 recall_seconds, p.ask_after.empty() ? "" : " by the question read after the input");
  }
  DropRecallStore(p, prefill, /*keep_if_ok=*/false);
  SNAPFILL_RETURN_IF_ERROR(prefill);
  RemoveCheckpoint();
  SNAPFILL_ASSIGN_OR_RETURN(
      auto forward, LlamaForward::Create(*p.model.model, p.backend.get(), std::max<int64_t>(1, p.ask_after.size())));
  GenerateOptions gopts;
  gopts.max_new_tokens = n;
  gopts.sampling = sampling;
  if (!absl::GetFlag(FLAGS_ignore_eos)) {
    gopts.is_eog = [&](int32_t id) { return p.model.tokenizer->IsEndOfGeneration(id); };
  }
  double first_token_at = 0;
  const bool tty = isatty(fileno(stdout));
  const Tokenizer& tokenizer = *p.model.tokenizer;
  auto print = [&](int32_t id) {
    if (first_token_at == 0) first_token_at = ttft.Seconds();
    const std::string piece = tokenizer.TokenToPiece(id);
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    if (tty) std::fflush(stdout);
    return true;
  };
  SNAPFILL_ASSIGN_OR_RETURN(
      GenerateResult r, p.ask_after.empty()
                            ? GenerateFromLogits(*forward, *kv, next_position, p.engine->last_logits(), gopts, print)
                            : Generate(*forward, *kv, next_position, p.ask_after, gopts, print));
  std::fputc('\n', stdout);
  std::fflush(stdout);
  if (first_token_at == 0) first_token_at = ttft.Seconds();
  if (absl::GetFlag(FLAGS_timing)) {
    const SchedulePlan& plan = p.engine->plan();
    const double decode_tps = r.tokens.size() > 1 ? (r.tokens.size() - 1) / r.decode_seconds : 0;
    std::fprintf(stderr,
                 "prefill: %lld tokens in %lld chunks, %.1f s (%.0f tokens/s), schedule %s, "
                 "pruner %s, memory %lld\nTTFT %.2f s | decode %zu tokens, %.1f tokens/s | peak RSS %s%s\n",
                 (long long)p.total, (long long)plan.steps.size(), prefill_seconds,
                 p.total / std::max(prefill_seconds, 1e-9),
                 std::string(ScheduleKindName(plan.config.kind)).c_str(),
                 PrunerKindName(p.config.pruner.kind), (long long)plan.config.memory, first_token_at,
                 r.tokens.size(), decode_tps,
                 HumanBytes(PeakRssBytes()).c_str(), DevicePeakNote(*p.backend, p.device.total()).c_str());
  }
  PrintKernelScratch(p);
  // With --profile: the table, then the prefill's work against the peaks
  // of this machine's instructions, measured now.
  const std::string profile = profiler != nullptr ? profiler->Report() : "";
  BackendProfile::Peaks peaks;
  if (!profile.empty()) {
    peaks = profiler->MeasurePeaks();
    std::fprintf(stderr, "%sprefill: %s", profile.c_str(), WorkAgainstPeaks(prefill_work, peaks, /*prefill=*/true).c_str());
  }
  if (const std::string report = absl::GetFlag(FLAGS_report); !report.empty()) {
    const SchedulePlan& plan = p.engine->plan();
    RunReport rr;
    rr.input_tokens = p.total;
    rr.steps = static_cast<int64_t>(plan.steps.size());
    rr.mean_memory = plan.mean_memory;
    rr.peak_attention_length = plan.peak_attention_length;
    rr.prefill_seconds = prefill_seconds;
    rr.ttft_seconds = first_token_at;
    rr.decode_tokens = static_cast<int64_t>(r.tokens.size());
    rr.decode_seconds = r.decode_seconds;
    rr.first_step_seconds = r.first_step_seconds;
    rr.cache_entries = kv->max_size();
    rr.peak_rss_bytes = PeakRssBytes();
    rr.predicted_peak_bytes = p.peak.total();
    rr.kernel_scratch_bytes = p.kernel_scratch_peak;
    rr.predicted_kernel_scratch_bytes = p.peak.backend;
    rr.device_peak_bytes = p.backend->DevicePeakBytes();
    rr.predicted_device_peak_bytes = p.device.total();
    if (profiler != nullptr) rr.profile = profiler->Seconds();
    rr.prefill_work = prefill_work;
    rr.peaks = peaks;
    SNAPFILL_RETURN_IF_ERROR(
        WriteFileAtomically(report, RunReportJson(rr), /*overwrite=*/true));
  }
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
  // Hashed before the prefill, which gives back the file's pages of the
  // matrices it reads from decode-layout copies: hashing the file after it
  // would map them all again beside the copies.
  PromptCache cache;
  cache.model_fingerprint = Fingerprint(p);
  double seconds = 0;
  const absl::Status prefill = RunPrefillLoop(p, &seconds);
  // After the loop: a resume computes with the kernels its checkpoint names.
  cache.kernels = p.backend->kernels();
  DropRecallStore(p, prefill, /*keep_if_ok=*/true);
  SNAPFILL_RETURN_IF_ERROR(prefill);
  cache.config = ConfigJson(p.config, p.model.path, p.total);
  if (p.recall != nullptr) {
    // Whose store answers this cache's questions (generate --recall_dir).
    AddRecallDigests(p.recall->info().input_digest, p.recall->info().plan_digest, &cache.config);
  }
  cache.input_tokens = p.total;
  SNAPFILL_ASSIGN_OR_RETURN(cache.kv, p.engine->TakeDecoderCache());
  cache.next_position = p.engine->next_position();
  if (const absl::Status saved = SaveCacheFile(out, cache, absl::GetFlag(FLAGS_force)); !saved.ok()) {
    DropRecallStore(p, saved, /*keep_if_ok=*/true);
    return saved;
  }
  RemoveCheckpoint();
  if (p.recall != nullptr) {
    SNAPFILL_RETURN_IF_ERROR(p.recall->MarkComplete());
    std::fprintf(stderr, "recall: %s of evicted entries (%s) kept in %s: ask with generate --cache %s --recall_dir %s\n",
                 HumanBytes(p.recall->bytes()).c_str(), RecallFormatName(p.recall->info().format),
                 p.recall->dir().c_str(), out.c_str(), p.recall->dir().c_str());
  }
  if (absl::GetFlag(FLAGS_timing)) {
    std::fprintf(stderr,
                 "prefill: %lld tokens, pruner %s, %.1f s (%.0f tokens/s) | cache %s (%s) | peak RSS %s%s\n",
                 (long long)p.total, PrunerKindName(p.config.pruner.kind), seconds,
                 p.total / std::max(seconds, 1e-9), out.c_str(),
                 HumanBytes(cache.kv->bytes()).c_str(), HumanBytes(PeakRssBytes()).c_str(),
                 DevicePeakNote(*p.backend, p.device.total()).c_str());
  }
  PrintKernelScratch(p);
  std::fprintf(stderr, "%s", ProfileReportWithPeaks(*p.backend, /*prefill=*/true).c_str());
  return absl::OkStatus();
}

}  // namespace snapfill::cli
