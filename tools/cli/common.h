// Helpers shared by the snapfill subcommands.
#ifndef SNAPFILL_TOOLS_CLI_COMMON_H_
#define SNAPFILL_TOOLS_CLI_COMMON_H_

#include <signal.h>

#include <cstdint>
#include <memory>
#include <ostream>
#include <string>

#include "absl/status/statusor.h"
#include "snapfill/backend.h"
#include "snapfill/engine.h"
#include "src/base/sys_stats.h"
#include "src/engine/recall.h"
#include "src/engine/sampler.h"
#include "src/kv/checkpoint_file.h"
#include "src/model/llama_model.h"
#include "src/tokenizer/chat_template.h"
#include "src/tokenizer/tokenizer.h"
#include "tools/cli/environment.h"
#include "tools/cli/input.h"

namespace snapfill::cli {

// "93.8 MiB", "1.21 GiB".
std::string HumanBytes(uint64_t bytes);
// "3m07s", "1h02m".
std::string HumanSeconds(double seconds);

// Reads a whole text file, or stdin for "-". NotFound / InvalidArgument
// (a directory) / PermissionDenied with the path in the message.
absl::StatusOr<std::string> ReadInput(const std::string& path, const char* flag);

struct LoadedModel {
  std::string path;
  std::unique_ptr<LlamaModel> model;
  std::unique_ptr<Tokenizer> tokenizer;
  ChatTemplate chat_template;  // resolved from --chat_template and the model
};
// Loads --model (or its default), its tokenizer and chat template.
absl::StatusOr<LoadedModel> LoadModelFromFlags();

// The backend of --device, --threads, --pack_decode and --kernels. With
// --kernels auto, the kernels are chosen by their rates on this machine,
// kept in the user's cache folder (kernel_cache.h); `model`, where given,
// is what the products are timed on (its feed-forward gate); *timings, where
// given, says where the rates came from ("" where none were used).
absl::StatusOr<std::unique_ptr<Backend>> BackendFromFlags(const LlamaModel* model = nullptr,
                                                          std::string* timings = nullptr);
// The prefill attention ("f32", "avx512-bf16", "amx-bf16") and the products'
// path ("amx-bf16", "amx-int8", "avx512-vnni", "avx-vnni", "avx2",
// "portable") that a Backend::kernels() record names, or "" where it names
// none.
std::string AttentionFromKernelsRecord(const std::string& kernels);
std::string ProductsFromKernelsRecord(const std::string& kernels);
// BackendOptions::attention_kernel and products_kernel for a --kernels
// value: "auto" measures both, "flags" leaves the CPU's flags to decide,
// and a comma-separated list of attention=NAME and products=NAME names
// those (an op it does not name is measured).
struct KernelsChoice {
  std::string attention;
  std::string products;
};
absl::StatusOr<KernelsChoice> KernelsFromFlag(const std::string& value);

// " | peak device memory X (predicted Y)" where the backend holds device
// memory; "" on the CPU.
std::string DevicePeakNote(const Backend& backend, uint64_t predicted = 0);

// The prologue of needle, which cuts its haystacks from --input's text:
// the text, which must not be empty (a warning where it is not UTF-8: it
// is read as raw bytes), then the model and the backend. The commands that
// read a whole long input stream it instead (OpenStreamedInput).
struct LongInput {
  std::string text;
  LoadedModel model;
  std::unique_ptr<Backend> backend;
};
// `path`: --input's value, which the command checked is given.
absl::StatusOr<LongInput> OpenLongInput(const std::string& path);

// The prologue of the commands that stream a long input (run, prefill,
// ppl): --input opened (and refused first where it cannot be read), then
// the model and the backend; TokenizeInput reads it.
struct StreamedInput {
  std::unique_ptr<InputFile> file;
  LoadedModel model;
  std::unique_ptr<Backend> backend;
};
absl::StatusOr<StreamedInput> OpenStreamedInput(const std::string& path);
// --max_tokens, --spool_dir (or its default), --progress.
absl::StatusOr<InputOptions> InputOptionsFromFlags(bool with_suffix);
// The warning for an input that is not UTF-8.
void WarnIfNotUtf8(const std::string& path, const InputTokens& tokens);

// The progress line of a chunked run on stderr (--progress): tokens done,
// rate, time left, and what the command adds; redrawn in place every 0.5 s
// on a terminal, a line every 10 s otherwise, and always after the last step.
class ChunkProgress {
 public:
  // `tag`: "[snapfill]", "[snapfill ppl]"; off: Step prints nothing.
  ChunkProgress(const char* tag, int64_t total_tokens, int64_t steps, bool on);
  // After step t; `detail` (" | step 3/10 ...") is asked for only when the
  // line is printed.
  template <typename Detail>
  void Step(const StepTelemetry& t, const Detail& detail) {
    if (Due(t)) Print(t, detail());
  }

 private:
  bool Due(const StepTelemetry& t);
  void Print(const StepTelemetry& t, const std::string& detail) const;
  const char* tag_;
  int64_t total_, steps_;
  bool on_, tty_;
  double last_print_ = -1e9;
  Stopwatch watch_;
};


// --temp, --top_k, --top_p, --seed, validated.
absl::StatusOr<SamplingParams> SamplingFromFlags();

// The schedule and pruner flags (--schedule, --growth, --memory, --chunk,
// --first_memory, --window, --sinks, --pruner, --pooling, --pool_kernel,
// --original_positions) as a PrefillConfig; InvalidArgument for a name that
// is not one.
absl::StatusOr<PrefillConfig> PrefillConfigFromFlags();
// What the pruner reads beside the input: for --pruner=reconstruct its
// prompt, --repeat_prompt as the model's chat template closes a user turn
// and opens the assistant's (the chunk is repeated after it); for
// --pruner=gate the gates of --gates (else DefaultGatesPath's file where it
// exists), loaded once per process and checked against the model. Nothing
// for another pruner. Settles --pruner=auto first: snapkv where
// `question_guided` (the question's votes guide every chunk), else gate
// where gates are found, else snapkv (saying so once on stderr).
absl::Status SetPrunerInputs(const LoadedModel& m, PrefillConfig& c, bool question_guided);
// Where a model's gates are looked for when --gates is not given: its path
// with .gates for .gguf (models/X.gguf -> models/X.gates).
std::string DefaultGatesPath(const std::string& model_path);
// The gates a gate pruner reads: --gates, else DefaultGatesPath's file where
// it exists, else "".
std::string GatesPath(const std::string& model_path);
// What --pruner=auto means given the gates GatesPath found ("" for none):
// snapkv where a question guides, else gate where there are gates, else
// snapkv.
PrunerKind AutoPruner(const std::string& gates_path, bool question_guided);

// The configuration as one JSON object, stored in cache files and printed
// with --verbosity=1.
// How the question picks under question-guided compression, for labels:
// "share 1, span 32, votes sum" or "share 0.5, token, votes max".
std::string QuestionSelectionLabel(const PrunerConfig& p);
// "shared" | "each" (--query_heads).
const char* QueryHeadsName(const PrunerConfig& p);

std::string ConfigJson(const PrefillConfig& c, const std::string& model_path,
                       int64_t input_tokens);
// A warning if --keep_last_chunk was given where it does not apply.
void WarnKeepLastChunkUnused();
// ScheduleConfig::keep_last_chunk for a prefill whose question is read
// after it (question_after: prefill; run, needle and batch where the
// question neither guides nor closes the chunk loop's input): the flag;
// elsewhere false, with WarnKeepLastChunkUnused.
bool KeepLastChunkFor(bool question_after);
// --recall_dir where the question does not guide the compression
// (--query_aware=false, or a pruner that needs no question): the question
// recalls after the prefill rather than at its last step. Returns that
// recall's budget and leaves the chunk loop only keeping the store
// (recall_budget 0); 0, and `c` as it was, otherwise.
int64_t MoveRecallAfterPrefill(PrefillConfig* c);
// --recall_rank: summed (true) or heads.
absl::StatusOr<bool> RecallRankSummed();
// The options of a recall after the prefill of `budget` entries: the
// chunk loop's (RecallOptionsFor) and --recall_rank (checked by the
// config's parse).
RecallOptions RecallAfterOptions(const PrefillConfig& c, int64_t budget);
// Adds to a cache's ConfigJson the digests that name the recall store its
// later questions read (generate --cache --recall_dir checks them).
void AddRecallDigests(uint64_t input_digest, uint64_t plan_digest, std::string* config_json);

// One JSON record per step (--telemetry), ending in a newline. The origin
// map is written sparse ([chunk, entries] pairs) when `with_origin`; callers
// write it for every ⌈steps/256⌉-th step and the last, to keep 1M-token
// runs' files small. Steps that scored their tokens (snapfill ppl) also
// carry "scored" and "nll_sum".
std::string TelemetryJson(const StepTelemetry& t, bool with_origin);
// Writes step t's record of a run of `steps` steps to `out`, with the origin
// map where it is due.
void WriteTelemetry(std::ostream& out, const StepTelemetry& t, int64_t steps);

// What a checkpoint of a prefill records about it, to refuse resuming
// another's (model, configuration, input, plan, threads, kernels); the
// steps done and the retention are filled in when it is saved.
CheckpointState PrefillCheckpointState(const PrefillEngine& engine, const Backend& backend,
                                       const std::string& fingerprint, uint64_t input_digest, int64_t total);

// SIGINT / SIGTERM while a checkpointed prefill runs (run --checkpoint,
// batch --checkpoint_dir): the loop saves a checkpoint after the step in
// progress and stops. StopSignal() is the signal caught since the last
// ResetStopSignal() (0: none).
int StopSignal();
void ResetStopSignal();

// Catches SIGINT and SIGTERM for its lifetime (StopSignal). A second
// signal takes the default action (SA_RESETHAND), so a user who does not
// want to wait for the step in progress can press Ctrl-C again.
class StopSignals {
 public:
  StopSignals();
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

 private:
  struct sigaction old_int_ {};
  struct sigaction old_term_ {};
};

}  // namespace snapfill::cli

#endif  // SNAPFILL_TOOLS_CLI_COMMON_H_
