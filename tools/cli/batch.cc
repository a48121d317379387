// snapfill batch: many documents, each with its questions, through one
// loaded model; an answer per JSON line, appended and flushed as it comes;
// --resume goes on where a job stopped; --shard (or a Slurm array) splits
// the documents by size (batch_manifest.h).
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"
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
#include "tools/cli/batch_manifest.h"
#include "tools/cli/batch_mpi.h"
#include "tools/cli/commands.h"
#include "tools/cli/common.h"
#include "tools/cli/flags.h"
#include "tools/cli/input.h"

namespace snapfill::cli {
namespace {

using Json = nlohmann::json;

const char* Getenv(const char* name) { return std::getenv(name); }

std::string CachePath(const std::string& dir, const std::string& id) { return dir + "/" + id + ".kv"; }

// An id names its cache file in --cache_dir.
bool IsFileName(const std::string& id) {
  if (id == "." || id == "..") return false;
  for (const char c : id) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-')) return false;
  }
  return true;
}

// A folder whose files the documents' ids name (--cache_dir, --checkpoint_dir):
// it must exist, and every id must be a file name.
absl::Status CheckFolderForIds(const char* flag, const std::string& dir, const char* what,
                               const std::vector<BatchDocument>& docs, const std::string& manifest_path) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " ", dir, " is not a folder"));
  }
  for (const BatchDocument& d : docs) {
    if (!IsFileName(d.id)) {
      return absl::InvalidArgumentError(absl::StrCat(manifest_path, ":", d.line, ": id \"", d.id, "\" cannot name ",
                                                     what, " in ", flag, " (letters, digits, '.', '_' and '-' only)"));
    }
  }
  return absl::OkStatus();
}

struct Answer {
  std::string text;
  GenerateResult result;
  int64_t input_tokens = 0;
  double prefill_seconds = 0;  // the document's prefill (shared by its questions unless guided)
  double ttft_seconds = 0;     // prefill, the question, the first token
};

class BatchRunner {
 public:
  BatchRunner(LoadedModel& m, Backend* backend, const InputOptions& input, std::string fingerprint,
              std::string cache_dir, std::string checkpoint_dir, int64_t checkpoint_every, bool resume,
              std::string recall_dir)
      : m_(m),
        backend_(backend),
        input_(input),
        fingerprint_(std::move(fingerprint)),
        cache_dir_(std::move(cache_dir)),
        checkpoint_dir_(std::move(checkpoint_dir)),
        checkpoint_every_(checkpoint_every),
        resume_(resume),
        recall_dir_(std::move(recall_dir)) {}

  // One document: a prefill shared by its questions, or one per question
  // with the question guiding it; `on_answer` sees each.
  absl::Status Document(const BatchDocument& d, const std::vector<std::string>& questions,
                        const std::function<absl::Status(const std::string&, const Answer&)>& on_answer) {
    SNAPFILL_ASSIGN_OR_RETURN(PrefillConfig config, PrefillConfigFromFlags());
    SNAPFILL_ASSIGN_OR_RETURN(config.schedule.kind, ParseScheduleKind(d.settings.schedule));
    config.schedule.memory = d.settings.memory;
    config.schedule.chunk = d.settings.chunk;
    config.recall_budget = 0;
    config.store_evicted = !recall_dir_.empty();
    SNAPFILL_RETURN_IF_ERROR(SetPrunerInputs(m_, config, /*question_guided=*/d.settings.guided));
    const int64_t recall = d.settings.recall;
    // An unguided document's questions recall after its prefill, ranked as its answers record.
    RecallOptions options = RecallOptionsFor(config, recall);
    options.summed = !d.settings.recall_heads;
    GenerateOptions gopts;
    gopts.max_new_tokens = d.settings.n;
    SNAPFILL_ASSIGN_OR_RETURN(gopts.sampling, SamplingFromFlags());
    gopts.sampling.seed = d.settings.seed;
    gopts.is_eog = [&](int32_t id) { return m_.tokenizer->IsEndOfGeneration(id); };
    if (d.settings.guided) {
      for (const std::string& q : questions) {
        Stopwatch watch;
        SNAPFILL_ASSIGN_OR_RETURN(PromptFrame frame, BuildPromptFrame(*m_.tokenizer, m_.chat_template, q,
                                                                            absl::GetFlag(FLAGS_system)));
        InputOptions o = input_;
        o.with_suffix = true;
        SNAPFILL_ASSIGN_OR_RETURN(InputTokens in, Tokenize(d, frame, o));
        PrefillConfig c = config;
        c.decode_reserve = d.settings.n;
        c.recall_budget = recall;  // at the last step, from the question in place
        SNAPFILL_ASSIGN_OR_RETURN(c.query_tokens, BuildContinuation(*m_.tokenizer, m_.chat_template, q));
        SNAPFILL_ASSIGN_OR_RETURN(auto engine, PrefillEngine::Create(*m_.model, backend_, c, in.tokens->size()));
        const std::string checkpoint = CheckpointPath(d, &q);
        SNAPFILL_ASSIGN_OR_RETURN(
            Started started,
            Start(d, absl::StrCat(".q", std::find(d.questions.begin(), d.questions.end(), q) - d.questions.begin()),
                  *engine, in, checkpoint));
        std::unique_ptr<RecallStore>& store = started.store;
        const absl::Status prefilled = Prefill(*engine, in, checkpoint, store.get(), started.first_step);
        // (A stopped prefill's store stays with its checkpoint, for --resume.)
        if (store != nullptr && !absl::IsCancelled(prefilled)) SNAPFILL_RETURN_IF_ERROR(store->Remove());
        SNAPFILL_RETURN_IF_ERROR(prefilled);
        Answer a;
        a.input_tokens = in.tokens->size();
        a.prefill_seconds = watch.Seconds();
        SNAPFILL_ASSIGN_OR_RETURN(auto kv, engine->TakeDecoderCache());
        SNAPFILL_ASSIGN_OR_RETURN(auto forward, LlamaForward::Create(*m_.model, backend_, 1));
        SNAPFILL_ASSIGN_OR_RETURN(a.result, GenerateFromLogits(*forward, *kv, engine->next_position(),
                                                              engine->last_logits(), gopts, Collect(&a.text)));
        a.ttft_seconds = a.prefill_seconds + a.result.ttft_seconds;
        SNAPFILL_RETURN_IF_ERROR(on_answer(q, a));
        SNAPFILL_RETURN_IF_ERROR(RemoveCheckpoint(checkpoint));
      }
      return absl::OkStatus();
    }
    Stopwatch watch;
    SNAPFILL_ASSIGN_OR_RETURN(PromptFrame frame, BuildPromptFrame(*m_.tokenizer, m_.chat_template, "",
                                                                            absl::GetFlag(FLAGS_system)));
    InputOptions o = input_;
    o.with_suffix = false;
    SNAPFILL_ASSIGN_OR_RETURN(InputTokens in, Tokenize(d, frame, o));
    std::vector<std::vector<int32_t>> question_ids;
    int64_t longest = 0;
    for (const std::string& q : questions) {
      SNAPFILL_ASSIGN_OR_RETURN(question_ids.emplace_back(), BuildContinuation(*m_.tokenizer, m_.chat_template, q));
      longest = std::max<int64_t>(longest, question_ids.back().size());
    }
    // Room in the memory itself for the last question, what it recalls and
    // its answer: that one takes the memory over instead of a copy. The
    // questions come after the prefill: they read its last chunk whole.
    config.decode_reserve = longest + recall + d.settings.n;
    config.schedule.keep_last_chunk = d.settings.keep_last_chunk;
    SNAPFILL_ASSIGN_OR_RETURN(auto engine, PrefillEngine::Create(*m_.model, backend_, config, in.tokens->size()));
    const std::string checkpoint = CheckpointPath(d, nullptr);
    // --recall_dir: the document's store, which each question reads after
    // the prefill (as generate --cache --recall_dir does), removed after its
    // answers unless --cache_dir keeps it beside the cache.
    SNAPFILL_ASSIGN_OR_RETURN(Started started, Start(d, "", *engine, in, checkpoint));
    std::unique_ptr<RecallStore>& store = started.store;
    if (const absl::Status prefilled = Prefill(*engine, in, checkpoint, store.get(), started.first_step);
        !prefilled.ok()) {
      if (store != nullptr && !absl::IsCancelled(prefilled)) SNAPFILL_RETURN_IF_ERROR(store->Remove());
      return prefilled;
    }
    const double prefill_seconds = watch.Seconds();
    if (!cache_dir_.empty()) {
      // For later questions: generate --cache DIR/ID.kv --prompt "...".
      PromptCache cache;
      cache.model_fingerprint = fingerprint_;
      cache.config = ConfigJson(engine->config(), m_.path, in.tokens->size());
      cache.kernels = backend_->kernels();
      cache.input_tokens = in.tokens->size();
      if (store != nullptr) {
        // Whose store answers this cache's questions (generate --recall_dir).
        AddRecallDigests(store->info().input_digest, store->info().plan_digest, &cache.config);
      }
      SNAPFILL_ASSIGN_OR_RETURN(cache.kv, engine->MakeDecoderCache(0));
      cache.next_position = engine->next_position();
      SNAPFILL_RETURN_IF_ERROR(SaveCacheFile(CachePath(cache_dir_, d.id), cache, /*overwrite=*/true));
      if (store != nullptr) SNAPFILL_RETURN_IF_ERROR(store->MarkComplete());
    }
    SNAPFILL_ASSIGN_OR_RETURN(auto forward, LlamaForward::Create(*m_.model, backend_, kQuestionBatch));
    const int64_t document_end = engine->next_position();
    auto answer = [&](size_t i) -> absl::Status {
      const std::string& q = questions[i];
      const std::vector<int32_t>& ids = question_ids[i];
      // Each question but the last continues a copy of the document's cache.
      std::unique_ptr<KvCache> kv;
      if (i + 1 < questions.size()) {
        SNAPFILL_ASSIGN_OR_RETURN(kv,
                                  engine->MakeDecoderCache(static_cast<int64_t>(ids.size()) + recall + d.settings.n));
      } else {
        SNAPFILL_ASSIGN_OR_RETURN(kv, engine->TakeDecoderCache());
      }
      Answer a;
      a.input_tokens = in.tokens->size() + static_cast<int64_t>(ids.size());
      a.prefill_seconds = prefill_seconds;
      Stopwatch recalling;
      int64_t next_position = document_end;
      if (store != nullptr) {
        SNAPFILL_RETURN_IF_ERROR(
            RecallForQuestion(*m_.model, backend_, *kv, &next_position, *store, ids, options)
                .status());
      }
      const double recall_seconds = recalling.Seconds();
      SNAPFILL_ASSIGN_OR_RETURN(a.result, Generate(*forward, *kv, next_position, ids, gopts, Collect(&a.text)));
      a.ttft_seconds = prefill_seconds + recall_seconds + a.result.ttft_seconds;
      return on_answer(q, a);
    };
    absl::Status answered = absl::OkStatus();
    for (size_t i = 0; i < questions.size() && answered.ok(); ++i) answered = answer(i);
    if (store != nullptr && (cache_dir_.empty() || !answered.ok())) {
      const absl::Status removed = store->Remove();
      if (answered.ok()) answered = removed;
    }
    SNAPFILL_RETURN_IF_ERROR(answered);
    return RemoveCheckpoint(checkpoint);
  }

 private:
  // The checkpoint of a document's prefill (`question` null) or of a guided
  // one's for `question`; "" without --checkpoint_dir.
  std::string CheckpointPath(const BatchDocument& d, const std::string* question) const {
    if (checkpoint_dir_.empty()) return "";
    if (question == nullptr) return absl::StrCat(checkpoint_dir_, "/", d.id, ".ck");
    const auto k = std::find(d.questions.begin(), d.questions.end(), *question) - d.questions.begin();
    return absl::StrCat(checkpoint_dir_, "/", d.id, ".q", k, ".ck");
  }

  static absl::Status RemoveCheckpoint(const std::string& path) {
    if (path.empty() || ::unlink(path.c_str()) == 0 || errno == ENOENT) return absl::OkStatus();
    return FileErrnoStatus(errno, "cannot remove", path);
  }

  // What a document's prefill starts from: with --resume, the checkpoint
  // at `path` if it is this prefill's (model, input, settings, plan; with
  // --recall_dir one that counted its store), restored into `engine`; and
  // with --recall_dir the store in RECALL_DIR/ID<suffix> (a guided
  // document's k-th question's: ".q<k>") attached to `engine`: the one the
  // checkpoint counted, cut back to it, else a new or emptied one. A
  // checkpoint or store that does not fit is said and the document starts
  // over.
  struct Started {
    std::unique_ptr<RecallStore> store;
    int64_t first_step = 0;
  };
  absl::StatusOr<Started> Start(const BatchDocument& d, const std::string& suffix, PrefillEngine& engine,
                                const InputTokens& in, const std::string& path) {
    Started started;
    std::optional<PrefillCheckpoint> ck;
    const auto over = [&](const absl::Status& why) {
      std::fprintf(stderr, "snapfill: warning: %s: not this prefill's checkpoint (%s): starting the document over\n",
                   path.c_str(), std::string(why.message()).c_str());
      ck.reset();
    };
    if (!path.empty() && resume_ && access(path.c_str(), F_OK) == 0) {
      const int64_t total = static_cast<int64_t>(in.tokens->size());
      const CheckpointState run = PrefillCheckpointState(engine, *backend_, fingerprint_, in.tokens->digest(), total);
      absl::StatusOr<PrefillCheckpoint> loaded = LoadCheckpointFile(path);
      std::string warning;
      absl::Status fits = loaded.ok() ? CheckpointMismatch(loaded->state, run, path, &warning) : loaded.status();
      if (fits.ok() && engine.plan().steps[loaded->state.steps_done].start_token != loaded->state.next_token) {
        fits = absl::FailedPreconditionError("its next token is not where this plan's step starts");
      }
      if (fits.ok() && !recall_dir_.empty() && loaded->state.recall_slots.empty()) {
        fits = absl::FailedPreconditionError("it counted no recall store, and --recall_dir keeps one");
      }
      if (fits.ok()) {
        if (!warning.empty()) std::fprintf(stderr, "snapfill: warning: %s\n", warning.c_str());
        ck = *std::move(loaded);
      } else {
        over(fits);
      }
    }
    RecallStoreInfo info = RecallShape(m_.model->config(), engine.config().recall_format);
    info.model_fingerprint = fingerprint_;
    info.input_digest = in.tokens->digest();
    info.input_tokens = static_cast<int64_t>(in.tokens->size());
    info.plan_digest = engine.plan_digest();
    const std::string dir = absl::StrCat(recall_dir_, "/", d.id, suffix);
    if (!recall_dir_.empty() && ck) {
      // The store as it was at the checkpoint (what later steps wrote is cut).
      absl::StatusOr<std::unique_ptr<RecallStore>> kept = RecallStore::Reopen(dir, info, ck->state.recall_slots);
      if (kept.ok()) {
        started.store = *std::move(kept);
      } else {
        over(absl::FailedPreconditionError(absl::StrCat("its recall store: ", kept.status().message())));
      }
    }
    if (ck) {
      // (Restore checks everything before it changes the engine.)
      if (const absl::Status restored = engine.Restore(ck->state.steps_done, ck->state.retention, *ck->memory);
          !restored.ok()) {
        over(restored);
        started.store.reset();  // cut back to a checkpoint the document does not resume from
      }
    }
    if (!recall_dir_.empty() && started.store == nullptr) {
      // A store a stopped job left for the same model, input and plan is
      // emptied and used.
      SNAPFILL_ASSIGN_OR_RETURN(
          started.store, resume_ && access(dir.c_str(), F_OK) == 0
                             ? RecallStore::Reopen(dir, info, std::vector<int64_t>(m_.model->config().num_layers, 0))
                             : RecallStore::Create(dir, info));
    }
    if (ck) {
      started.first_step = ck->state.steps_done;
      std::fprintf(stderr, "[batch] %s: resuming from %s after step %lld/%zu\n", d.id.c_str(), path.c_str(),
                   (long long)started.first_step, engine.plan().steps.size());
    }
    if (started.store != nullptr) SNAPFILL_RETURN_IF_ERROR(engine.AttachRecallStore(started.store.get()));
    return started;
  }

  // Runs the prefill from `first_step` (Start); with a checkpoint path,
  // saves its state there every checkpoint_every_ steps and on
  // SIGINT/SIGTERM (then stops: Cancelled), with `store`'s slots synced to
  // disk and counted.
  absl::Status Prefill(PrefillEngine& engine, const InputTokens& in, const std::string& path, RecallStore* store,
                       int64_t first_step) {
    if (path.empty()) return engine.Run(*in.tokens, nullptr);
    const int64_t total = static_cast<int64_t>(in.tokens->size());
    const std::vector<ScheduleStep>& steps = engine.plan().steps;
    const CheckpointState run = PrefillCheckpointState(engine, *backend_, fingerprint_, in.tokens->digest(), total);
    ResetStopSignal();
    StopSignals signals;
    absl::Status stopped;
    const int64_t n = static_cast<int64_t>(steps.size());
    const absl::Status s = engine.Run(*in.tokens, [&](const StepTelemetry& t) {
      if (t.step + 1 == n) return true;
      const int signo = StopSignal();
      if (signo == 0 && (t.step + 1 - first_step) % checkpoint_every_ != 0) return true;
      CheckpointState state = run;
      state.steps_done = engine.steps_done();
      state.next_token = t.start_token + t.chunk_tokens;
      state.retention = engine.retention();
      if (store != nullptr) {
        // The store's entries are on disk before the checkpoint counts them.
        stopped = store->Sync();
        if (!stopped.ok()) return false;
        state.recall_slots = store->all_slots();
      }
      stopped = SaveCheckpointFile(path, state, engine.memory());
      if (!stopped.ok()) return false;
      if (signo == 0) return true;
      stopped = absl::CancelledError(absl::StrFormat(
          "stopped by %s after step %d/%d; its checkpoint %s is saved: the same command with --resume goes on "
          "from it",
          signo == SIGINT ? "SIGINT" : "SIGTERM", t.step + 1, n, path));
      return false;
    });
    if (!stopped.ok()) return stopped;
    return s;
  }

  static constexpr int64_t kQuestionBatch = 64;  // question tokens run at once

  absl::StatusOr<InputTokens> Tokenize(const BatchDocument& d, const PromptFrame& frame, const InputOptions& o) {
    SNAPFILL_ASSIGN_OR_RETURN(auto file, InputFile::Open(d.input, "input"));
    return TokenizeInput(*file, *m_.tokenizer, frame, o);
  }

  std::function<bool(int32_t)> Collect(std::string* text) {
    return [this, text](int32_t id) {
      *text += m_.tokenizer->TokenToPiece(id);
      return true;
    };
  }

  LoadedModel& m_;
  Backend* backend_;
  const InputOptions& input_;
  const std::string fingerprint_;
  const std::string cache_dir_;
  const std::string checkpoint_dir_;
  const int64_t checkpoint_every_;
  const bool resume_;
  const std::string recall_dir_;
};

}  // namespace

namespace {

// The job in one world of ranks (one process without MPI).
absl::Status RunBatchIn(BatchWorld& world) {
  const std::string manifest_path = absl::GetFlag(FLAGS_manifest);
  const std::string out = absl::GetFlag(FLAGS_out);
  if (manifest_path.empty()) return absl::InvalidArgumentError("--manifest FILE (JSONL, a document a line) is required");
  if (out.empty()) return absl::InvalidArgumentError("--out FILE (the answers, JSONL) is required");
  const bool resume = absl::GetFlag(FLAGS_resume);
  const bool force = absl::GetFlag(FLAGS_force);
  if (resume && force) return absl::InvalidArgumentError("--resume goes on with --out, --force replaces it: give one");
  const bool ranks = world.size() > 1;
  const bool lead = world.rank() == 0;  // prints the job's lines, merges the ranks' files
  // The ranks' files of a job that stopped count as its output too.
  const std::vector<std::string> stopped_ranks = ExistingRankOuts(out);
  if (!resume && !force) {
    if (access(out.c_str(), F_OK) == 0) {
      return absl::AlreadyExistsError(absl::StrCat(
          "--out ", out, " exists: add --resume to answer what it lacks, or --force to start over"));
    }
    if (!stopped_ranks.empty()) {
      return absl::AlreadyExistsError(absl::StrCat(
          stopped_ranks.front(), " exists (the answers of a job's MPI rank that stopped): add --resume to answer what "
          "it lacks, or --force to start over"));
    }
  }
  BatchSettings defaults;
  defaults.schedule = absl::GetFlag(FLAGS_schedule);
  defaults.memory = absl::GetFlag(FLAGS_memory);
  defaults.chunk = absl::GetFlag(FLAGS_chunk);
  defaults.n = absl::GetFlag(FLAGS_n);
  defaults.seed = absl::GetFlag(FLAGS_seed);
  defaults.guided = absl::GetFlag(FLAGS_guided);
  defaults.window = absl::GetFlag(FLAGS_window);
  defaults.pruner = absl::GetFlag(FLAGS_pruner);
  defaults.temp = absl::GetFlag(FLAGS_temp);
  defaults.top_k = absl::GetFlag(FLAGS_top_k);
  defaults.top_p = absl::GetFlag(FLAGS_top_p);
  defaults.original_positions = absl::GetFlag(FLAGS_original_positions);
  defaults.keep_last_chunk = absl::GetFlag(FLAGS_keep_last_chunk);
  const std::string recall_dir = absl::GetFlag(FLAGS_recall_dir);
  if (!recall_dir.empty()) {
    defaults.recall = absl::GetFlag(FLAGS_recall);
    if (defaults.recall < 1) {
      return absl::InvalidArgumentError(absl::StrCat("--recall=", defaults.recall, " must be >= 1"));
    }
    SNAPFILL_ASSIGN_OR_RETURN(const bool summed, RecallRankSummed());
    defaults.recall_heads = !summed;
  }
  SNAPFILL_ASSIGN_OR_RETURN(const std::string manifest, ReadInput(manifest_path, "--manifest"));
  SNAPFILL_ASSIGN_OR_RETURN(std::vector<BatchDocument> docs, ParseManifest(manifest, manifest_path, defaults));
  if (std::all_of(docs.begin(), docs.end(), [](const BatchDocument& d) { return d.settings.guided; })) {
    WarnKeepLastChunkUnused();
  }
  const std::string cache_dir = absl::GetFlag(FLAGS_cache_dir);
  if (!cache_dir.empty()) {
    SNAPFILL_RETURN_IF_ERROR(CheckFolderForIds("--cache_dir", cache_dir, "a cache file", docs, manifest_path));
    for (const BatchDocument& d : docs) {
      if (d.settings.guided) {
        return absl::InvalidArgumentError(absl::StrCat(manifest_path, ":", d.line, ": a guided document's caches are "
                                                       "its questions'; --cache_dir keeps unguided ones only"));
      }
    }
  }
  const std::string checkpoint_dir = absl::GetFlag(FLAGS_checkpoint_dir);
  const int64_t checkpoint_every = absl::GetFlag(FLAGS_checkpoint_every);
  if (!checkpoint_dir.empty()) {
    SNAPFILL_RETURN_IF_ERROR(
        CheckFolderForIds("--checkpoint_dir", checkpoint_dir, "a checkpoint", docs, manifest_path));
    if (checkpoint_every < 1) {
      return absl::InvalidArgumentError(absl::StrCat("--checkpoint_every=", checkpoint_every, " must be >= 1"));
    }
  }
  if (!recall_dir.empty()) {
    SNAPFILL_RETURN_IF_ERROR(CheckFolderForIds("--recall_dir", recall_dir, "a recall store", docs, manifest_path));
  }
  SNAPFILL_ASSIGN_OR_RETURN(const auto shard, ResolveShard(absl::GetFlag(FLAGS_shard), Getenv));
  const std::vector<int> assigned = AssignShards(docs, shard.second);
  SNAPFILL_ASSIGN_OR_RETURN(InputOptions input, InputOptionsFromFlags(/*with_suffix=*/false));
  input.progress = false;
  SNAPFILL_ASSIGN_OR_RETURN(LoadedModel m, LoadModelFromFlags());
  SNAPFILL_ASSIGN_OR_RETURN(auto backend, BackendFromFlags(m.model.get()));
  const std::string fingerprint = ModelFingerprint(m.model->gguf());
  // Each answer records the pruner that made its memory, not "auto".
  const std::string gates = GatesPath(m.path);
  for (BatchDocument& d : docs) {
    if (d.settings.pruner == "auto") d.settings.pruner = PrunerKindName(AutoPruner(gates, d.settings.guided));
  }
  // What is answered already: --out and the stopped ranks' files. Rank 0
  // reads them first (cutting a torn last line); the others read them once
  // nothing changes them any more, and only then does any rank write.
  std::vector<std::string> answered_files = {out};
  answered_files.insert(answered_files.end(), stopped_ranks.begin(), stopped_ranks.end());
  AnsweredSet done;
  if (force && lead) {
    for (const std::string& path : stopped_ranks) {
      if (::unlink(path.c_str()) != 0 && errno != ENOENT) return FileErrnoStatus(errno, "cannot remove", path);
    }
  }
  for (int pass = 0; pass < 2; ++pass) {
    if (resume && (pass == 0) == lead) {
      SNAPFILL_ASSIGN_OR_RETURN(done, ReadAnswered(answered_files, fingerprint, docs));
    }
    SNAPFILL_RETURN_IF_ERROR(world.Barrier());
  }
  if (done.torn_bytes > 0 && lead) {
    std::fprintf(stderr, "snapfill: %s ended in a torn line (%lld bytes): cut off, its answer is done again\n",
                 out.c_str(), (long long)done.torn_bytes);
  }
  const std::string write_to = ranks ? RankOutPath(out, world.rank()) : out;
  FILE* f = std::fopen(write_to.c_str(), resume || ranks ? "a" : "w");
  if (f == nullptr) return FileErrnoStatus(errno, "cannot open", write_to);
  std::unique_ptr<FILE, int (*)(FILE*)> closer(f, &std::fclose);

  // This shard's documents with questions not yet answered, largest first.
  int64_t todo_docs = 0, todo_answers = 0, skipped = 0;
  std::vector<int> order;
  for (size_t i = 0; i < docs.size(); ++i) {
    if (assigned[i] != shard.first) continue;
    int64_t left = 0;
    for (const std::string& q : docs[i].questions) {
      if (done.pairs.count({docs[i].id, q})) {
        ++skipped;
      } else {
        ++left;
      }
    }
    todo_answers += left;
    todo_docs += left > 0;
    if (left > 0) order.push_back(static_cast<int>(i));
  }
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return docs[a].bytes > docs[b].bytes; });
  if (lead) {
    std::fprintf(stderr, "[batch] shard %d/%d: %lld documents, %lld answers to give (%lld already in %s)%s\n",
                 shard.first, shard.second, (long long)todo_docs, (long long)todo_answers, (long long)skipped,
                 out.c_str(), ranks ? absl::StrCat(", over ", world.size(), " MPI ranks").c_str() : "");
  }
  BatchRunner runner(m, backend.get(), input, fingerprint, cache_dir, checkpoint_dir, checkpoint_every, resume,
                     recall_dir);
  Stopwatch job;
  int64_t answers = 0, docs_done = 0, tokens = 0;
  world.Start(order);
  for (;;) {
    SNAPFILL_ASSIGN_OR_RETURN(const int i, world.Next());
    if (i < 0) break;
    const BatchDocument& d = docs[i];
    SNAPFILL_RETURN_IF_ERROR(CheckInputSha256(d, manifest_path));
    std::vector<std::string> questions;
    for (const std::string& q : d.questions) {
      if (!done.pairs.count({d.id, q})) questions.push_back(q);
    }
    const absl::Status s = runner.Document(d, questions, [&](const std::string& q, const Answer& a) {
      Json j;
      j["id"] = d.id;
      j["question"] = q;
      j["answer"] = a.text;
      j["input_tokens"] = a.input_tokens;
      j["generated_tokens"] = a.result.tokens.size();
      j["stopped_at_eog"] = a.result.stopped_at_eog;
      j["prefill_seconds"] = a.prefill_seconds;
      j["ttft_seconds"] = a.ttft_seconds;
      const double decode_tps =
          a.result.tokens.size() > 1 ? (a.result.tokens.size() - 1) / std::max(a.result.decode_seconds, 1e-9) : 0.0;
      j["decode_tokens_per_second"] = decode_tps;
      j["peak_rss_bytes"] = PeakRssBytes();
      j["settings"] = Json::parse(d.settings.Json());
      j["model"] = fingerprint;
      j["snapfill"] = SNAPFILL_VERSION;
      // A piece may end inside a UTF-8 sequence: JSON takes U+FFFD for such bytes.
      const std::string line = j.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n";
      if (std::fwrite(line.data(), 1, line.size(), f) != line.size() || std::fflush(f) != 0) {
        return FileErrnoStatus(errno, "error writing", write_to);
      }
      ++answers;
      tokens += a.input_tokens;
      const double t = job.Seconds();
      if (ranks) {
        // Each rank knows only its own share: no ETA.
        std::fprintf(stderr, "[batch] rank %d: %lld answers | %s | %.0f tokens/s\n", world.rank(),
                     (long long)answers, d.id.c_str(), tokens / std::max(t, 1e-9));
      } else {
        std::fprintf(stderr, "[batch] %lld/%lld answers | %s | %.0f tokens/s | ETA %s\n", (long long)answers,
                     (long long)todo_answers, d.id.c_str(), tokens / std::max(t, 1e-9),
                     HumanSeconds(t / answers * (todo_answers - answers)).c_str());
      }
      return absl::OkStatus();
    });
    if (!s.ok()) return absl::Status(s.code(), absl::StrCat("document \"", d.id, "\" (", d.input, "): ", s.message()));
    ++docs_done;
  }
  closer.reset();
  if (ranks) {
    std::fprintf(stderr, "batch: rank %d: %lld answers for %lld documents in %.1f s | peak RSS %s\n", world.rank(),
                 (long long)answers, (long long)docs_done, job.Seconds(), HumanBytes(PeakRssBytes()).c_str());
  }
  // Every rank's file is complete: rank 0 merges them (and a stopped job's)
  // into --out, in the manifest's order, and removes them.
  SNAPFILL_RETURN_IF_ERROR(world.Barrier());
  if (lead && (ranks || !stopped_ranks.empty())) {
    std::vector<std::string> files = {out};
    for (const std::string& path : ExistingRankOuts(out)) files.push_back(path);
    SNAPFILL_ASSIGN_OR_RETURN(const AnsweredSet all, ReadAnswered(files, fingerprint, docs));
    SNAPFILL_RETURN_IF_ERROR(MergeAnswers(out, all, docs));
    for (size_t k = 1; k < files.size(); ++k) {
      if (::unlink(files[k].c_str()) != 0) return FileErrnoStatus(errno, "cannot remove", files[k]);
    }
    std::fprintf(stderr, "batch: %lld answers in %s, merged from %zu rank files\n", (long long)all.pairs.size(),
                 out.c_str(), files.size() - 1);
  }
  if (!ranks) {
    std::fprintf(stderr, "batch: %lld answers for %lld documents in %.1f s (%lld were already there) | peak RSS %s\n",
                 (long long)answers, (long long)docs_done, job.Seconds(), (long long)skipped,
                 HumanBytes(PeakRssBytes()).c_str());
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RunBatch() {
  SNAPFILL_ASSIGN_OR_RETURN(const int launched, LaunchedRanks(Getenv));
  SNAPFILL_ASSIGN_OR_RETURN(std::unique_ptr<BatchWorld> world, BatchWorld::Create(launched));
  const absl::Status s = RunBatchIn(*world);
  // (A rank stopped by SIGINT/SIGTERM has saved its checkpoint: mpirun,
  // which sent the signal to every rank, ends the job.)
  if (!s.ok() && !absl::IsCancelled(s) && world->size() > 1) {
    // The other ranks would wait for this one forever: end them all.
    std::fprintf(stderr, "snapfill: batch: rank %d of %d: %s\n", world->rank(), world->size(),
                 std::string(s.message()).c_str());
    world->Abort(s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1);
  }
  return s;
}

}  // namespace snapfill::cli
