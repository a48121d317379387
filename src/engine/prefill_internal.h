// The prefill engine's pieces shared by its files (prefill_engine.cc holds
// the loop; prefill_plan.cc the configuration, footprint and plan digest;
// prefill_score.cc the loss of each chunk's tokens; prefill_state.cc the
// memory in and out: checkpoint restore and the decoder's cache). Not a
// public API.
#ifndef SNAPFILL_ENGINE_PREFILL_INTERNAL_H_
#define SNAPFILL_ENGINE_PREFILL_INTERNAL_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "snapfill/backend.h"
#include "snapfill/recall_format.h"
#include "src/compress/pruner.h"
#include "src/engine/prefill_engine.h"
#include "src/model/llama_model.h"

namespace snapfill::prefill_internal {

// The configuration as the engine runs it: window and sinks shared by the
// planner and the pruner; the full pruner planned as one fixed memory;
// InvalidArgument for a question or recall budget it cannot run.
absl::StatusOr<PrefillConfig> Resolve(const LlamaConfig& mc, const PrefillConfig& config, int64_t total_tokens);

// The layers the schedule plans and the pruner compresses: every layer but
// the sliding-window ones (a local layer keeps its last W entries, a ring,
// DESIGN.md §10). The plan's budgets are indexed as this list is: step
// budget g is layer GlobalLayers()[g]'s.
std::vector<int64_t> GlobalLayers(const LlamaConfig& mc);

// The extra rows a batch runs before the chunk's: the question's (SnapKV
// alone reads its votes), or context reconstruction's prompt and
// repetition of the chunk's `chunk_tokens` tokens (every
// PrunerConfig::repeat_stride-th one).
int64_t QueryRows(const PrefillConfig& c, int64_t chunk_tokens);

// The room a plan of adaptive growth leaves in each layer's memory for a
// last chunk kept whole (ScheduleConfig::keep_last_chunk): that chunk's
// tokens; 0 otherwise. The memory holds twice the linear budget plus it, the
// budgets before the last step are capped at twice the linear one, and the
// last step keeps every layer's memory and the chunk.
int64_t AdaptiveTail(const SchedulePlan& plan);

// Whether a recall store takes every step's evicted entries
// (PrefillConfig::store_evicted, or a recall budget).
inline bool StoresEvicted(const PrefillConfig& c) { return c.store_evicted || c.recall_budget > 0; }
// Whether the engine makes SnapKV's selection a backend op where it can
// (PrefillConfig::select_in_backend, a pruner with SnapKV's rule: snapkv,
// gate, reconstruct): it then holds the votes and each global layer's kept
// indices in backend buffers, and for gate and reconstruct a copy of the
// memory's stored scores (ScoresInBackend). With a recall store, only where
// the backend's buffers are a device's (buffers_on_device): the evicted
// rows are then found and gathered there, and reach the host a layer
// behind the kernels (EvictsInBackend); on the CPU the host's selection
// hands the store its rows in place. (The input's last step recalls on the
// host: Recall reads the host's memory.)
inline bool SelectsInBackend(const PrefillConfig& c, bool buffers_on_device) {
  return c.select_in_backend && RanksByScores(c.pruner.kind) && (!StoresEvicted(c) || buffers_on_device);
}
inline bool ScoresInBackend(const PrefillConfig& c, bool buffers_on_device) {
  return SelectsInBackend(c, buffers_on_device) && KeepsEntryScores(c.pruner.kind);
}
inline bool EvictsInBackend(const PrefillConfig& c, bool buffers_on_device) {
  return SelectsInBackend(c, buffers_on_device) && StoresEvicted(c);
}
// One layer's evicted rows as EvictsInBackend carries them to the host, n
// evicted per KV head: every KV head's indices ([num_kv_heads][n]), then the
// keys, then the values, in the recall store's slot order and format
// ([n][num_kv_heads] records of RecallVectorBytes: the device converts them,
// so that half the f32 bytes travel for f16, under a third for q8). Their
// bytes:
inline uint64_t EvictedHostBytes(int64_t num_kv_heads, int64_t head_dim, int64_t n, RecallFormat format) {
  return static_cast<uint64_t>(num_kv_heads) * n * (sizeof(int32_t) + 2 * RecallVectorBytes(format, head_dim));
}
// Where the rows are gathered as f32 in the backend's buffer, for
// candidates of `cand` entries: after the bytes that travel, sized for
// every candidate (a step evicts at most all of them).
inline uint64_t EvictedF32Offset(int64_t num_kv_heads, int64_t head_dim, int64_t cand, RecallFormat format) {
  constexpr uint64_t kAlign = 256;
  return (EvictedHostBytes(num_kv_heads, head_dim, cand, format) + kAlign - 1) / kAlign * kAlign;
}
// The backend buffer's bytes.
inline uint64_t EvictedBufferBytes(int64_t num_kv_heads, int64_t head_dim, int64_t cand, RecallFormat format) {
  return EvictedF32Offset(num_kv_heads, head_dim, cand, format) +
         static_cast<uint64_t>(num_kv_heads) * cand * 2 * head_dim * sizeof(float);
}
// Whether the batch's extra rows are a question's (else, for reconstruct,
// the repetition's).
inline bool AsksQuestion(const PrefillConfig& c, int64_t query_rows) {
  return query_rows > 0 && c.pruner.kind != PrunerKind::kReconstruct;
}
// Rows of votes of that op's buffer, per KV head: the window's, the
// stored scores or a question's, and where a question leaves the window's
// votes a share (--query_share < 1), the window's after the question's.
inline int64_t SelectionVoteRows(const PrefillConfig& c, int64_t query_rows) {
  return AsksQuestion(c, query_rows) && c.pruner.query_share < 1.0 ? 2 : 1;
}
// Floats after those rows: log-denominators (one per extra row and head)
// of a question's queries where its largest weights vote (--query_votes
// max), or of the repetition's (reconstruct).
inline int64_t SelectionLseFloats(const PrefillConfig& c, int64_t num_heads, int64_t query_rows) {
  const bool max_votes = AsksQuestion(c, query_rows) && c.pruner.query_votes == QueryVotes::kMax;
  return max_votes || (query_rows > 0 && c.pruner.kind == PrunerKind::kReconstruct) ? num_heads * query_rows : 0;
}
// Words of those kept indices per global layer and KV head: the most a
// layer keeps, and the op's status word.
inline int64_t KeepStride(int64_t memory_capacity) { return memory_capacity + 1; }
// Positions whose logits score_tokens makes at once: about 16 MiB of
// logits (64 rows for a 49K vocabulary), at most the largest chunk.
inline int64_t ScoreRows(int64_t vocab_size, int64_t max_chunk) {
  return std::max<int64_t>(1, std::min<int64_t>({64, (int64_t{1} << 22) / vocab_size, max_chunk}));
}

// f(item) for every item in [0, n): on the backend's threads where
// `parallel` (the CPU backend's are those of its kernels, still spinning
// from the operation before), else in order on this thread.
template <typename F>
void RunItems(Backend& backend, int64_t n, bool parallel, const F& f) {
  if (parallel) {
    backend.ParallelFor(n, f);
  } else {
    for (int64_t i = 0; i < n; ++i) f(i);
  }
}

}  // namespace snapfill::prefill_internal

#endif  // SNAPFILL_ENGINE_PREFILL_INTERNAL_H_
