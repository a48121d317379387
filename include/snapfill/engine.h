// snapfill's engine, the public API: the chunk loop that reads an input of
// any length through a model in flat memory ("memorize step by step",
// docs/DESIGN.md §2), its configuration, what it reports per step, and what
// it will allocate. The input is a TokenSource (snapfill/token_source.h),
// read a chunk at a time, so it may stream from a file of any size.
//
// The input streams through the model chunk by chunk. In every layer the
// chunk attends over [memory; chunk]; right after that attention the layer's
// memory ∪ chunk is compressed to the step's budget by a pruner (SnapKV by
// default) and the chunk's own KV is dropped. Only the memory survives from
// one chunk to the next, so the live KV at any moment is Σ_l m_l plus one
// layer's chunk, whatever the input length.
//
// Positions (DESIGN.md §4): memory keeps keys before RoPE. At each step
// memory entry j is rotated to position j and chunk token t to m + t
// (re-encoded), so the largest position is m + c, never the input length;
// `keep_original_positions` rotates every entry at its position in the input
// instead, for comparison.
//
// Sliding-window layers (DESIGN.md §10): a local layer's memory is a ring of
// its last W entries, attended within the window and never compressed; the
// schedule, its budgets and the pruner are the global layers'.
#ifndef SNAPFILL_ENGINE_H_
#define SNAPFILL_ENGINE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "snapfill/backend.h"
#include "snapfill/pruner_config.h"
#include "snapfill/recall_format.h"
#include "snapfill/schedule.h"
#include "snapfill/token_source.h"

namespace snapfill {

// The model, its caches and scores (src/model, src/kv, src/compress).
struct LlamaConfig;
class LlamaModel;
class KvCache;
class RecallStore;
class GateModel;

struct PrefillConfig {
  // Chunk, memory, window, sinks and the schedule kind; total_tokens and
  // num_layers are filled in from the input and the model.
  ScheduleConfig schedule;
  PrunerConfig pruner;
  bool keep_original_positions = false;
  // SnapKV's selection as one backend op where it can be (SnapKV's rule,
  // its votes a window's, a question's or stored scores; with a recall
  // store only on a device, and not at the step that recalls): the votes
  // and the kept indices stay in the backend's memory, and each layer's
  // positions and telemetry follow once per chunk (DESIGN.md §14). The same
  // entries either way; false keeps every selection on the host (the tests
  // compare the two).
  bool select_in_backend = true;
  // Score every input token (`snapfill ppl`, DESIGN.md §7): its negative
  // log-likelihood given what precedes it as this run sees it (the memory
  // and the chunk so far), in StepTelemetry::nll_sum / token_nll. Costs the
  // LM head on every position (logits are made a few rows at a time, never
  // chunk x vocab at once).
  bool score_tokens = false;
  // Extra entries per layer allocated in the memory for the tokens a decoder
  // will append after the prefill (TakeDecoderCache), so the memory becomes
  // the decoder's cache without a copy.
  int64_t decode_reserve = 0;
  // Question-guided compression (DESIGN.md §7): the tokens that will follow
  // the input (the question as the prompt closes it). At every step they
  // run after the chunk as extra rows of the batch, at the positions after
  // it, attending over memory ∪ chunk and themselves; their queries vote
  // for what the memory keeps (PrunerConfig::query_share of it, picked as
  // PrunerConfig::query_select says), and their K/V are dropped after the
  // votes, never kept. At the input's last step, whose chunk ends with
  // these same tokens (the prompt closes with the question), the chunk's
  // own last rows vote (and recall) instead: the question in place. Empty:
  // SnapKV's own window alone votes. Used by the SnapKV pruner only (the
  // others do not read votes).
  std::vector<int32_t> query_tokens;
  // Context reconstruction (PrunerKind::kReconstruct, DESIGN.md §9): the
  // prompt that asks for the text again ("repeat the previous text", as
  // the chat template frames a user turn and opens the assistant's). At
  // every step the batch runs this prompt and then the chunk's tokens again
  // (every PrunerConfig::repeat_stride-th) after the chunk, at the
  // positions after it; the repetition sees memory ∪ chunk and itself, and
  // each chunk entry's score is the largest attention weight any repeated
  // token's query heads of its KV group pay it. An entry keeps that score
  // while it is kept (in the memory, checkpoints and caches). The
  // repetition's K/V are dropped.
  std::vector<int32_t> repeat_prompt;
  // SmartKV's gates (PrunerKind::kGate, DESIGN.md §9; not owned): each
  // chunk entry's score is its gate's prediction from its key before RoPE,
  // kept with the entry. Shaped for the model (layers, KV heads, head_dim).
  const GateModel* gate = nullptr;
  // The recall tier (DESIGN.md §8): at the input's last step the
  // question's queries score every entry of the recall store (the engine's
  // AttachRecallStore) in each layer and bring back the `recall_budget`
  // entries per layer and KV head they attend to most (spans around the
  // strongest, as PrunerConfig::query_select and span say), merged into the
  // memory by position. Needs query_tokens and the SnapKV pruner; 0: off.
  int64_t recall_budget = 0;
  RecallFormat recall_format = RecallFormat::kF16;  // for Footprint's disk figure
  // A recall store will be attached (AttachRecallStore) to take every
  // step's evicted entries, with or without a recall budget (which implies
  // it): planned here so that Footprint counts what carries them to the
  // host from a device. AttachRecallStore refuses a store otherwise.
  bool store_evicted = false;
};

// What happened at one step (one chunk), for progress and --telemetry.
struct StepTelemetry {
  int64_t step = 0;
  int64_t start_token = 0;
  int64_t chunk_tokens = 0;
  int64_t attention_length = 0;        // keys the chunk attended over (max over global layers)
  // The same over the sliding-window layers (their window and the chunk;
  // 0 for a model without such layers).
  int64_t window_attention_length = 0;
  int64_t query_rows = 0;              // the question's or the repetition's rows run after the chunk
  // Global layers whose selection was one backend op (Backend::SelectHeads,
  // PrefillConfig::select_in_backend): their votes and kept indices stayed
  // in the backend's memory.
  int64_t backend_selections = 0;
  double score_seconds = 0;           // scoring the chunk's entries (reconstruct's repetition, the gates)
  int64_t recalled = 0;                // entries per layer and KV head brought back (the last step)
  double recall_seconds = 0;           // scoring the store and bringing entries back
  // [num_layers] entries per KV head after compression (a sliding-window
  // layer's: its window's).
  std::vector<int64_t> memory;
  std::vector<double> retention;       // [num_layers] |M_{i-1} ∩ M_i| / |M_i|, mean over heads
  // [num_layers][step + 1]: memory entries (summed over KV heads) that came
  // from each chunk 0..step (the data behind the IMDC paper's Figure 6).
  std::vector<std::vector<int64_t>> origin;
  double seconds = 0;                  // wall time of this step
  double elapsed_seconds = 0;          // since the prefill started
  uint64_t rss_bytes = 0;              // resident set after the step
  uint64_t kernel_scratch_bytes = 0;   // the backend's kernels' buffers then (Backend::KernelScratchBytes)
  // With PrefillConfig::score_tokens (else 0 / empty). Step i scores the
  // tokens of its own chunk, tokens[start, start + chunk), except token 0 of
  // the input, which nothing predicts: token start_i is predicted by the
  // last position of chunk i-1 (that position saw memory M_{i-2} and chunk
  // i-1; its logits are made while chunk i-1 runs), every later token t of
  // the chunk by position t-1 (memory M_{i-1} and the chunk up to t-1).
  // So every token but the input's first is scored exactly once:
  // scored_tokens = chunk_tokens - (step == 0). A Run() that continues a
  // stopped or Restore()d run does not score the first token of its first
  // step (its predictor ran before; checkpoints do not keep its score), and
  // scored_tokens says so. NLL in nats.
  int64_t scored_tokens = 0;
  double nll_sum = 0;                  // Σ -log p(token), accumulated in double
  std::vector<float> token_nll;        // [scored_tokens] in input order
};

// What a prefill allocates, known before it starts (--dry_run, --max_memory).
struct PrefillFootprint {
  SchedulePlan plan;
  // The most keys one chunk's attention reads, in any layer, the question's
  // rows included: the plan's peak_attention_length where the memory keeps
  // to the linear budgets, more for the full pruner (everything read
  // before), adaptive growth (up to memory_capacity) and a sliding-window
  // layer's ring. Sizes the attention's and the votes' scratch.
  int64_t attention_keys = 0;
  int64_t memory_capacity = 0;     // entries per global layer and KV head
  // Entries per sliding-window layer and KV head: its window (or the whole
  // input where shorter); 0 for a model without such layers.
  int64_t window_entries = 0;
  int64_t final_entries = 0;       // at most this many per layer and head at the end (any layer)
  uint64_t memory_bytes = 0;       // the compressed memory
  uint64_t candidate_bytes = 0;    // one layer's memory ∪ chunk, rotated and not, and votes
  uint64_t activation_bytes = 0;   // the forward pass's activations for the largest chunk
  uint64_t recall_bytes = 0;       // the recall tier's blocks of stored keys and its picks
  // The host selection's own scratch, kept from chunk to chunk: per KV head
  // (SnapKV's, or a thread of Backend::SelectHeads', at most one per head)
  // the rest's indices, votes and pooled votes and the kept list.
  uint64_t selection_bytes = 0;
  // What the engine allocates through Backend::NewBuffer: the forward
  // pass's activations (every buffer, written or not) and the candidates'
  // keys and values, and with buffers_on_device the memory's keys and
  // values too. On a device this is its memory, none of it the host's.
  uint64_t buffer_bytes = 0;
  // The largest operands the prefill hands the backend's ops
  // (Backend::DeviceScratchBytes).
  OpSizes ops;
  // At most this many bytes of evicted entries in the recall store.
  uint64_t recall_disk_bytes = 0;
  // The plan the engine keeps (its steps and their per-layer budgets, about
  // 300 bytes a step for a 30-layer model: 72 MiB for the 250K steps of a
  // 1 GB input) and the batch of token ids a step reads.
  uint64_t plan_bytes = 0;
  // What is allocated (address space).
  uint64_t total() const {
    return memory_bytes + candidate_bytes + activation_bytes + recall_bytes + selection_bytes + plan_bytes;
  }
  // What is resident at the worst step: buffers are paged and written only
  // as far as each step uses them, and the activations past the current
  // chunk are given back, so step i holds the memory entries written so far,
  // the largest memory ∪ chunk so far, and its own chunk's activations;
  // and the plan. With buffers_on_device, the host's part only (positions,
  // votes, scores, the plan): the keys, values and activations are the
  // device's (buffer_bytes).
  uint64_t resident_peak = 0;
  // What stays resident once the prefill is over and the engine has given
  // its buffers back (TakeDecoderCache): the memory as the last step left
  // it, the recalled entries, and the plan.
  uint64_t kept_bytes = 0;
  // What each entry recalled per layer and KV head adds to kept_bytes (in
  // every global layer, on the host): for a recall after the prefill too,
  // which a caller adds itself.
  uint64_t recall_entry_bytes = 0;
};

class PrefillEngine {
 public:
  // Plans the schedule and sizes every buffer Create() would allocate,
  // without allocating; the same errors as Create() for impossible plans.
  // fused_layers: the backend runs the layers fused for chunks of the
  // configured size (LlamaForward::FusesLayers), so their activations leave
  // out the buffers that path never writes. buffers_on_device: the host
  // cannot reach the backend's buffers (!Backend::HostReachesBuffers(): a
  // device), so the memory's keys and values are buffers too, and none of
  // the buffers is host memory.
  static absl::StatusOr<PrefillFootprint> Footprint(const LlamaConfig& model,
                                                    const PrefillConfig& config,
                                                    int64_t total_tokens, bool fused_layers = false,
                                                    bool buffers_on_device = false);

  // Plans the schedule for `total_tokens` and allocates the memory and the
  // scratch; InvalidArgument for a plan or pruner configuration that cannot
  // work, before any work starts.
  static absl::StatusOr<std::unique_ptr<PrefillEngine>> Create(const LlamaModel& model,
                                                               Backend* backend,
                                                               const PrefillConfig& config,
                                                               int64_t total_tokens);

  virtual ~PrefillEngine() = default;

  virtual const SchedulePlan& plan() const = 0;
  virtual const PrefillConfig& config() const = 0;

  // The recall store (not owned) that every entry a step evicts from now on
  // is appended to, and that config().recall_budget > 0 recalls from (Run
  // refuses to start without one then). A run resumed with Restore() takes
  // the store cut back to the checkpoint (RecallStore::Reopen).
  // InvalidArgument if it is shaped for another model; FailedPrecondition
  // for an engine planned without one (PrefillConfig::store_evicted).
  virtual absl::Status AttachRecallStore(RecallStore* store) = 0;

  // Streams `tokens` (exactly total_tokens) through the model, from step
  // steps_done() on (0 unless Restore() was called). `on_step` (optional)
  // sees each step's telemetry after that step's memory is complete;
  // returning false stops early with Cancelled (steps_done() then counts the
  // step just seen, so a checkpoint taken in on_step resumes after it).
  // Afterwards last_logits() holds the logits of the final token.
  // The ids are read a chunk (and one more) at a time.
  virtual absl::Status Run(const TokenSource& tokens,
                           const std::function<bool(const StepTelemetry&)>& on_step) = 0;
  absl::Status Run(const std::vector<int32_t>& tokens, const std::function<bool(const StepTelemetry&)>& on_step);

  // Checkpoint state: the steps completed, the last step's retention per
  // layer (adaptive growth's input) and memory(). Together with the plan they
  // determine the rest of the run, so a run restored from them finishes with
  // the same memory, bit for bit, as one never stopped (same thread count).
  virtual int64_t steps_done() const = 0;
  virtual const std::vector<double>& retention() const = 0;
  // Digest of the plan (every step's start, chunk and budgets): a checkpoint
  // resumes only into the same plan.
  uint64_t plan_digest() const { return PlanDigest(plan()); }
  static uint64_t PlanDigest(const SchedulePlan& plan);
  // Puts the engine in the state of a run stopped after `steps_done` steps.
  // InvalidArgument (naming the field) if the memory's shape differs from
  // this engine's, a layer holds more than its capacity, steps_done is not
  // in [0, steps) or retention is not one value in [0, 1] per layer.
  virtual absl::Status Restore(int64_t steps_done, const std::vector<double>& retention,
                               const KvCache& memory) = 0;

  virtual const std::vector<float>& last_logits() const = 0;
  // The compressed memory: un-rotated keys, values, original positions.
  virtual const KvCache& memory() const = 0;

  // Returns the memory as a decoder cache: keys rotated at the positions the
  // decoder will continue from, each layer with room for `extra_capacity`
  // more tokens; its keys and values where the memory's are (a device's
  // buffers, read on the host with KvCache::CopyOut).
  // next_position() is where the first appended token goes.
  virtual absl::StatusOr<std::unique_ptr<KvCache>> MakeDecoderCache(int64_t extra_capacity) const = 0;
  // The same without a copy: rotates the memory's keys in place and hands
  // the memory over (room for config().decode_reserve more tokens). The
  // engine has no memory afterwards, and gives its scratch (candidates,
  // activations) back: call it last; last_logits(), next_position() and
  // plan() still answer.
  virtual absl::StatusOr<std::unique_ptr<KvCache>> TakeDecoderCache() = 0;
  virtual int64_t next_position() const = 0;

  // Bytes of the memory, the per-layer candidate buffers and activations.
  virtual uint64_t memory_bytes() const = 0;
  virtual uint64_t scratch_bytes() const = 0;
};

}  // namespace snapfill

#endif  // SNAPFILL_ENGINE_H_
