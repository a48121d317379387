// The prefill's configuration as it runs, its footprint, and its plan's
// digest (checkpoints and caches name the plan they belong to).
#include <xxhash.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "snapfill/status.h"
#include "src/engine/prefill_engine.h"
#include "src/engine/prefill_internal.h"

namespace snapfill {
namespace prefill_internal {
namespace {

// The longest question that question-guided compression runs after every
// chunk (its rows cost as many chunk rows).
constexpr int64_t kMaxQueryTokens = 4096;

}  // namespace

std::vector<int64_t> GlobalLayers(const LlamaConfig& mc) {
  std::vector<int64_t> global;
  for (int64_t l = 0; l < mc.num_layers; ++l) {
    if (!mc.IsLocal(l)) global.push_back(l);
  }
  return global;
}

absl::StatusOr<PrefillConfig> Resolve(const LlamaConfig& mc, const PrefillConfig& config,
                                      int64_t total_tokens) {
  PrefillConfig c = config;
  ScheduleConfig& sc = c.schedule;
  sc.total_tokens = total_tokens;
  // The schedule's memory is the global layers' (IMDC's mean memory counts
  // them only); the sliding-window layers keep their windows.
  sc.num_layers = static_cast<int64_t>(GlobalLayers(mc).size());
  if (sc.num_layers == 0) {
    return absl::InvalidArgumentError(absl::StrCat("every one of the model's ", mc.num_layers, " layers has a sliding ",
                                                   "window: nothing for the schedule to compress"));
  }
  sc.max_position = mc.context_length;
  c.pruner.window = sc.window;
  c.pruner.sink_tokens = sc.sink_tokens;
  SNAPFILL_RETURN_IF_ERROR(ValidatePrunerConfig(c.pruner));
  if (c.pruner.kind == PrunerKind::kFull) {
    // The baseline keeps every entry: one memory of the whole input, read
    // in chunks of --chunk tokens. Memory sizes do not apply to a pruner
    // that evicts nothing, so its budgets are planned as a fixed memory that
    // fits (IMDC's shrinking chunks would otherwise refuse most sizes).
    sc.kind = ScheduleKind::kFixed;
    sc.memory = std::max<int64_t>(sc.window, std::min<int64_t>(sc.memory, total_tokens));
    sc.first_memory = 0;
  }
  if (static_cast<int64_t>(c.query_tokens.size()) > kMaxQueryTokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the question has ", c.query_tokens.size(), " tokens; question-guided compression runs it "
        "after every chunk and takes at most ", kMaxQueryTokens,
        " (--query_aware=false reads a longer one with the input only)"));
  }
  for (int32_t id : c.query_tokens) {
    if (id < 0 || id >= mc.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("the question holds token id ", id,
                                                     ", outside the vocabulary of ", mc.vocab_size));
    }
  }
  if (c.recall_budget < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--recall=", c.recall_budget, " must be >= 0"));
  }
  if (c.recall_budget > 0 && c.pruner.kind != PrunerKind::kSnapKv) {
    return absl::InvalidArgumentError(absl::StrCat("recall brings entries back by the question's votes, which "
                                                   "only the snapkv pruner reads (--pruner=",
                                                   PrunerKindName(c.pruner.kind), ")"));
  }
  if (c.pruner.kind == PrunerKind::kReconstruct) {
    if (!c.query_tokens.empty()) {
      return absl::InvalidArgumentError(
          "--pruner=reconstruct scores what the model needs to repeat the text, not the question: "
          "give --query_aware=false, or --pruner=snapkv for question-guided compression");
    }
    if (static_cast<int64_t>(c.repeat_prompt.size()) > kMaxQueryTokens) {
      return absl::InvalidArgumentError(absl::StrCat("the repeat prompt has ", c.repeat_prompt.size(),
                                                     " tokens; at most ", kMaxQueryTokens));
    }
    for (int32_t id : c.repeat_prompt) {
      if (id < 0 || id >= mc.vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat("the repeat prompt holds token id ", id,
                                                       ", outside the vocabulary of ", mc.vocab_size));
      }
    }
  }
  if (c.pruner.kind == PrunerKind::kGate) {
    if (c.gate == nullptr) return absl::InvalidArgumentError("--pruner=gate needs the gates: give --gates FILE");
    if (c.gate->num_layers() != mc.num_layers || c.gate->num_kv_heads() != mc.num_kv_heads ||
        c.gate->head_dim() != mc.head_dim) {
      return absl::InvalidArgumentError(absl::StrCat("the gates are shaped ", c.gate->num_layers(), " x ",
                                                     c.gate->num_kv_heads(), " x ", c.gate->head_dim(),
                                                     "; the model is ", mc.num_layers, " x ", mc.num_kv_heads,
                                                     " x ", mc.head_dim));
    }
    if (!c.query_tokens.empty()) {
      return absl::InvalidArgumentError(
          "--pruner=gate predicts lifespans without the question: give --query_aware=false, or --pruner=snapkv "
          "for question-guided compression");
    }
  }
  if (c.recall_budget > 0 && c.query_tokens.empty()) {
    return absl::InvalidArgumentError(
        "recall needs the question: give --question (with --query_aware, the default)");
  }
  return c;
}

int64_t AdaptiveTail(const SchedulePlan& plan) {
  return plan.adaptive && plan.config.keep_last_chunk && !plan.steps.empty() ? plan.steps.back().chunk_tokens : 0;
}

int64_t QueryRows(const PrefillConfig& c, int64_t chunk_tokens) {
  if (c.pruner.kind == PrunerKind::kReconstruct) {
    const int64_t stride = c.pruner.repeat_stride;
    return static_cast<int64_t>(c.repeat_prompt.size()) + (chunk_tokens + stride - 1) / stride;
  }
  return c.pruner.kind == PrunerKind::kSnapKv ? static_cast<int64_t>(c.query_tokens.size()) : 0;
}

}  // namespace prefill_internal

using prefill_internal::AdaptiveTail;
using prefill_internal::EvictedBufferBytes;
using prefill_internal::EvictedHostBytes;
using prefill_internal::EvictsInBackend;
using prefill_internal::GlobalLayers;
using prefill_internal::KeepStride;
using prefill_internal::QueryRows;
using prefill_internal::Resolve;
using prefill_internal::ScoreRows;
using prefill_internal::ScoresInBackend;
using prefill_internal::SelectionLseFloats;
using prefill_internal::SelectionVoteRows;
using prefill_internal::SelectsInBackend;

absl::StatusOr<PrefillFootprint> PrefillEngine::Footprint(const LlamaConfig& mc,
                                                          const PrefillConfig& config,
                                                          int64_t total_tokens, bool fused_layers,
                                                          bool buffers_on_device) {
  SNAPFILL_ASSIGN_OR_RETURN(const PrefillConfig c, Resolve(mc, config, total_tokens));
  PrefillFootprint f;
  SNAPFILL_ASSIGN_OR_RETURN(f.plan, PlanSchedule(c.schedule));
  // Adaptive growth may give a layer more than the linear budget; cap it at
  // twice that so the memory can be allocated up front, and a last chunk
  // kept whole beside it (AdaptiveTail).
  const int64_t tail = AdaptiveTail(f.plan);
  int64_t max_budget = 0;
  for (size_t i = 0; i < f.plan.steps.size(); ++i) {
    for (int64_t b : f.plan.steps[i].budget) {
      max_budget = std::max(max_budget, i + 1 == f.plan.steps.size() ? b - tail : b);
    }
  }
  if (f.plan.adaptive) max_budget = 2 * max_budget + tail;
  f.memory_capacity = max_budget + c.schedule.sink_tokens;
  if (c.pruner.kind == PrunerKind::kFull) f.memory_capacity = total_tokens;
  f.final_entries = f.memory_capacity;
  if (c.pruner.kind != PrunerKind::kFull && !f.plan.adaptive) {
    int64_t last = 0;
    for (int64_t b : f.plan.steps.back().budget) last = std::max(last, b);
    f.final_entries = std::min(f.memory_capacity, last + c.schedule.sink_tokens);
  }
  // Keys, values and positions of one entry in one layer (all its KV
  // heads); and a score per entry for reconstruct and the gate.
  const uint64_t layer_entry_bytes = static_cast<uint64_t>(mc.num_kv_heads) *
                                     (2 * mc.head_dim * sizeof(float) + sizeof(int32_t) +
                                      (KeepsEntryScores(c.pruner.kind) ? sizeof(float) : 0));
  // The entry's keys and values, where a device holds them rather than the host.
  const uint64_t layer_kv_bytes = static_cast<uint64_t>(mc.num_kv_heads) * 2 * mc.head_dim * sizeof(float);
  const uint64_t layer_host_bytes = buffers_on_device ? layer_entry_bytes - layer_kv_bytes : layer_entry_bytes;
  const std::vector<int64_t> global = GlobalLayers(mc);
  const int64_t num_global = static_cast<int64_t>(global.size());
  const int64_t num_local = mc.num_layers - num_global;
  if (c.decode_reserve < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("decode_reserve=", c.decode_reserve, " must be >= 0"));
  }
  // A sliding-window layer keeps its window (a ring), whatever the schedule.
  f.window_entries = num_local > 0 ? std::min<int64_t>(mc.sliding_window, total_tokens) : 0;
  // Recalled entries join the memory at the last step, beyond the budget;
  // a sliding-window layer ends with its window.
  f.final_entries = std::max(f.final_entries + c.recall_budget, f.window_entries);
  f.memory_bytes = layer_entry_bytes * (num_global * (f.memory_capacity + c.recall_budget + c.decode_reserve) +
                                        num_local * (f.window_entries + c.decode_reserve));
  // The question's rows follow the chunk in the candidates and the batch.
  const int64_t query_rows = QueryRows(c, f.plan.max_chunk_tokens);
  const uint64_t cand = std::max(f.memory_capacity, f.window_entries) + f.plan.max_chunk_tokens + query_rows;
  // Raw and rotated keys, values, votes (and the question's votes, or the
  // entries' reconstruction scores) as floats; positions per head and
  // rotation positions (int32).
  const bool reconstruct = c.pruner.kind == PrunerKind::kReconstruct;
  // The selection as a backend op (SelectsInBackend): the votes again, in
  // a backend buffer, and each global layer's kept indices, which the host
  // reads once per chunk (in place, or a copy of them from a device).
  const bool in_backend = SelectsInBackend(c, buffers_on_device);
  const int64_t vote_floats = query_rows > 0 && !reconstruct ? 2 : 1;
  const int64_t backend_votes = in_backend ? SelectionVoteRows(c, query_rows) : 0;
  const uint64_t cand_entry_bytes = mc.num_kv_heads * (3 * mc.head_dim + vote_floats + backend_votes) * sizeof(float) +
                                    (mc.num_kv_heads + 1) * sizeof(int32_t);
  const uint64_t cand_kv_bytes = mc.num_kv_heads * (3 * mc.head_dim + backend_votes) * sizeof(float);
  const uint64_t cand_host_bytes = buffers_on_device ? cand_entry_bytes - cand_kv_bytes : cand_entry_bytes;
  // (With a question's log-denominators where its largest weights vote.)
  const uint64_t keep_words =
      in_backend ? static_cast<uint64_t>(num_global) * mc.num_kv_heads * KeepStride(f.memory_capacity) : 0;
  // (For gate and reconstruct a float beside each index: the memory's
  // stored scores, ScoresInBackend; and the gate's parameters, a backend
  // buffer whichever way it selects.)
  const uint64_t gate_bytes = c.pruner.kind == PrunerKind::kGate && c.gate != nullptr
                                  ? static_cast<uint64_t>(mc.num_layers) * mc.num_kv_heads *
                                        Backend::GateParamFloats(c.gate->head_dim(), c.gate->hidden()) * sizeof(float)
                                  : 0;
  const uint64_t keep_bytes =
      keep_words * sizeof(int32_t) + (ScoresInBackend(c, buffers_on_device) ? keep_words * sizeof(float) : 0) +
      (in_backend ? SelectionLseFloats(c, mc.num_heads, query_rows) : 0) * sizeof(float) + gate_bytes;
  // The recall tier from a device (EvictsInBackend): a layer's evicted rows
  // in a backend buffer, two host slots for their copies with the layer's
  // candidate positions, and the positions of an append.
  const bool evicts = EvictsInBackend(c, buffers_on_device);
  const uint64_t evict_bytes = evicts ? EvictedBufferBytes(mc.num_kv_heads, mc.head_dim, cand, c.recall_format) : 0;
  const uint64_t evict_host_bytes = evicts
                                        ? 2 * (EvictedHostBytes(mc.num_kv_heads, mc.head_dim, cand, c.recall_format) +
                                               mc.num_kv_heads * cand * sizeof(int32_t)) +
                                              mc.num_kv_heads * cand * sizeof(int32_t)
                                        : 0;
  f.candidate_bytes = cand * cand_entry_bytes + keep_bytes + evict_bytes + evict_host_bytes;
  if (c.pruner.kind != PrunerKind::kFull) {
    // (SnapKV's per head: the rest's candidate indices, gathered and pooled
    // votes and a taken flag each; SelectHeads' per thread: the pooled votes
    // and the two picks. Both: the kept list. A step that recalls selects
    // on the host with SnapKV's even where the others select in the
    // backend, so then both.)
    const uint64_t snapkv = 3 * sizeof(float) + 1;
    const uint64_t per_candidate = in_backend ? sizeof(float) + (c.recall_budget > 0 ? snapkv : 0) : snapkv;
    f.selection_bytes = mc.num_kv_heads * (cand * per_candidate + 2 * f.memory_capacity * sizeof(int32_t));
  }
  // The repetition's log-denominators, or the question's for its largest weights.
  if (reconstruct || (query_rows > 0 && c.pruner.query_votes == QueryVotes::kMax)) {
    f.candidate_bytes += mc.num_heads * query_rows * sizeof(float);
  }
  // (Scored chunks take logits of whole batches, through xn.)
  f.activation_bytes = LlamaForward::ScratchBytes(mc, f.plan.max_chunk_tokens + query_rows, fused_layers,
                                                  c.score_tokens);
  const uint64_t score_bytes =
      c.score_tokens ? ScoreRows(mc.vocab_size, f.plan.max_chunk_tokens) * mc.vocab_size * sizeof(float)
                     : 0;
  f.activation_bytes += score_bytes;
  // The backend's buffers: LlamaForward::Create's eight, the candidates'
  // three (and the selection's two), KvCache::Create's two.
  const int64_t batch_rows = f.plan.max_chunk_tokens + query_rows;
  f.buffer_bytes =
      static_cast<uint64_t>(batch_rows) *
          (2 * mc.model_dim + 2 * mc.num_heads * mc.head_dim + 2 * mc.num_kv_heads * mc.head_dim + 2 * mc.ffn_dim) *
          sizeof(float) +
      cand * cand_kv_bytes + keep_bytes + evict_bytes;
  if (buffers_on_device) f.buffer_bytes += f.memory_bytes / layer_entry_bytes * layer_kv_bytes;
  f.ops.tokens = batch_rows;
  f.ops.model_dim = mc.model_dim;
  f.ops.ffn_dim = mc.ffn_dim;
  f.ops.num_heads = mc.num_heads;
  f.ops.num_kv_heads = mc.num_kv_heads;
  f.ops.head_dim = mc.head_dim;
  // (The recall tier scores the store's entries a block at a time.)
  f.ops.keys = std::max<int64_t>(static_cast<int64_t>(cand), c.recall_budget > 0 ? Recaller::BlockEntries() : 0);
  f.ops.voters = std::max<int64_t>(c.schedule.window, query_rows);
  f.ops.logit_rows = c.score_tokens ? ScoreRows(mc.vocab_size, f.plan.max_chunk_tokens) : 1;
  f.ops.vocab = mc.vocab_size;
  f.ops.largest_matrix = mc.model_dim * std::max({mc.vocab_size, mc.ffn_dim, mc.num_heads * mc.head_dim});
  if (c.recall_budget > 0) {
    // A block of stored keys (f32, with positions, rotation positions and
    // scores), the question's log-denominators, and per KV head the peaks
    // and the span positions around them.
    f.recall_bytes = Recaller::ScratchBytes(mc, query_rows, c.recall_budget, c.pruner.span);
    f.recall_disk_bytes = RecallStore::MaxBytes(RecallShape(mc, c.recall_format), total_tokens);
  }

  // Resident peak, step by step (see PrefillFootprint::resident_peak). Per
  // global layer the memory holds s + min(budget, tokens read so far)
  // entries after a step (everything read so far for the full pruner), per
  // sliding-window layer min(W, tokens read so far); adaptive growth moves
  // budget between layers with the same total, counted here as the linear
  // budget of every layer.
  const int64_t sinks = c.schedule.sink_tokens;
  // The keys a step's attention reads in any layer (its memory ∪ chunk):
  // the plan's length where the memory keeps to its linear budgets; all
  // that was read before for the full pruner; up to the memory's capacity
  // with adaptive growth; a sliding-window layer's ring and the chunk.
  auto step_keys = [&](const ScheduleStep& s) {
    int64_t keys = s.attention_length;
    if (c.pruner.kind == PrunerKind::kFull || f.plan.adaptive) {
      keys = std::max(keys, std::min(s.start_token, f.memory_capacity) + s.chunk_tokens);
    }
    if (num_local > 0) keys = std::max(keys, std::min(f.window_entries, s.start_token) + s.chunk_tokens);
    return keys;
  };
  std::vector<int64_t> written(num_global, 0);  // memory entries written per global layer so far
  uint64_t last_memory = 0;
  for (const ScheduleStep& s : f.plan.steps) {
    const int64_t read = s.start_token + s.chunk_tokens;
    // The candidates written so far: the most keys an attention read yet
    // (the question's rows follow the chunk).
    f.attention_keys = std::max(f.attention_keys, step_keys(s) + query_rows);
    uint64_t memory = num_local * std::min(f.window_entries, read) * layer_host_bytes;
    for (int64_t g = 0; g < num_global; ++g) {
      const int64_t b = static_cast<size_t>(g) < s.budget.size() ? s.budget[g] : s.budget.back();
      const int64_t held = c.pruner.kind == PrunerKind::kFull ? read : std::min(sinks + b, read);
      written[g] = std::min(f.memory_capacity, std::max(written[g], held));
      memory += written[g] * layer_host_bytes;
    }
    const uint64_t activations =
        buffers_on_device ? 0
                          : LlamaForward::ScratchBytes(mc, s.chunk_tokens + query_rows, fused_layers, c.score_tokens);
    const uint64_t step = memory + std::min<uint64_t>(f.attention_keys, cand) * cand_host_bytes + keep_bytes +
                          f.selection_bytes + activations + score_bytes;
    f.resident_peak = std::max(f.resident_peak, step);
    last_memory = memory;
  }
  // The last step's recall: its scratch and the entries it adds (global
  // layers only).
  f.resident_peak += f.recall_bytes + c.recall_budget * num_global * layer_host_bytes + evict_host_bytes;
  // The plan as the engine keeps it: the steps, and each step's budgets in
  // an allocation of their own (glibc: 8 bytes of header, 16-byte granules,
  // 32 at least).
  auto heap_bytes = [](uint64_t bytes) { return bytes == 0 ? 0 : std::max<uint64_t>(32, (bytes + 8 + 15) / 16 * 16); };
  f.plan_bytes = heap_bytes(f.plan.steps.size() * sizeof(ScheduleStep)) +
                 (query_rows + f.plan.max_chunk_tokens + 1) * sizeof(int32_t);
  for (const ScheduleStep& s : f.plan.steps) f.plan_bytes += heap_bytes(s.budget.size() * sizeof(int64_t));
  f.resident_peak += f.plan_bytes;
  // (On a device the decoder's cache is the memory where it is: the host
  // keeps its positions.)
  f.recall_entry_bytes = num_global * layer_host_bytes;
  f.kept_bytes = last_memory + c.recall_budget * f.recall_entry_bytes + f.plan_bytes;
  return f;
}

uint64_t PrefillEngine::PlanDigest(const SchedulePlan& plan) {
  XXH3_state_t* state = XXH3_createState();
  SNAPFILL_CHECK(state != nullptr);
  XXH3_64bits_reset(state);
  for (const ScheduleStep& s : plan.steps) {
    const int64_t head[2] = {s.start_token, s.chunk_tokens};
    XXH3_64bits_update(state, head, sizeof(head));
    XXH3_64bits_update(state, s.budget.data(), s.budget.size() * sizeof(int64_t));
  }
  const uint64_t digest = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  return digest;
}

}  // namespace snapfill
