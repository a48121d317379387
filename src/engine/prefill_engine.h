// The chunk loop's implementation of snapfill/engine.h's PrefillEngine:
// the memory, the per-layer candidate buffers and the steps' state.
#ifndef SNAPFILL_ENGINE_PREFILL_ENGINE_H_
#define SNAPFILL_ENGINE_PREFILL_ENGINE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "snapfill/backend.h"
#include "snapfill/engine.h"
#include "snapfill/schedule.h"
#include "snapfill/token_source.h"
#include "src/base/paged_array.h"
#include "src/compress/gate.h"
#include "src/compress/pruner.h"
#include "src/engine/recall.h"
#include "src/kv/kv_cache.h"
#include "src/kv/recall_store.h"
#include "src/model/llama_forward.h"

namespace snapfill {

class PrefillEngineImpl final : public PrefillEngine {
 public:
  PrefillEngineImpl(const LlamaModel& model, Backend* backend, const PrefillConfig& config);
  using PrefillEngine::Run;

  const SchedulePlan& plan() const override { return plan_; }
  const PrefillConfig& config() const override { return config_; }
  absl::Status AttachRecallStore(RecallStore* store) override;
  absl::Status Run(const TokenSource& tokens, const std::function<bool(const StepTelemetry&)>& on_step) override;
  int64_t steps_done() const override { return steps_done_; }
  const std::vector<double>& retention() const override { return retention_; }
  absl::Status Restore(int64_t steps_done, const std::vector<double>& retention, const KvCache& memory) override;
  const std::vector<float>& last_logits() const override { return last_logits_; }
  const KvCache& memory() const override { return *memory_; }
  absl::StatusOr<std::unique_ptr<KvCache>> MakeDecoderCache(int64_t extra_capacity) const override;
  absl::StatusOr<std::unique_ptr<KvCache>> TakeDecoderCache() override;
  int64_t next_position() const override;
  uint64_t memory_bytes() const override { return memory_->bytes(); }
  uint64_t scratch_bytes() const override;

 private:
  friend class PrefillEngine;  // Create() fills the plan and the buffers in

  // The chunk loop's attention step (LlamaForward::AttendFn) over a batch
  // of `rows` = query_rows_ question rows then the chunk's: attention
  // output of the batch's last out_rows rows, and the layer's memory
  // compressed from memory ∪ chunk.
  absl::Status AttendAndCompress(int64_t layer, float* q, int64_t q_stride, float* k, float* v,
                                 int64_t kv_stride, int64_t rows, int64_t out_rows, float* out);
  int64_t ChunkOf(int32_t position) const;
  // Each layer's entries of `from` into `to` (same layers and heads, room
  // for them), keys and values through the backend: either may be in its
  // buffers. Sets to's sizes.
  absl::Status CopyMemory(const KvCache& from, KvCache& to) const;
  // Frees every buffer the chunk loop writes (TakeDecoderCache).
  void ReleaseScratch();
  // The question's votes on a layer's num = view.num_keys candidates into
  // votes ([num_kv_heads][cand_capacity_]; PrunerConfig::query_votes, the
  // largest weights through the log-denominators in lse, [num_heads][num_q]):
  // its num_q queries q (rotated), which saw `seen`. At the last step the
  // queries are the chunk's own last rows, whose keys are the candidates'
  // last num_q. votes and lse are both host memory or both the backend's.
  absl::Status QuestionVotes(const LlamaConfig& c, const float* q, int64_t q_stride, int64_t num_q, const KvView& seen,
                             const KvView& view, bool final_step, float* votes, float* lse);
  // The recall tier at the last step, for `layer` (whose memory holds the
  // step's kept entries): scores the store with the question's num_q
  // queries q (rotated), which saw `seen`, and merges the best into the
  // memory.
  absl::Status Recall(int64_t layer, const float* q, int64_t q_stride, int64_t num_q, const KvView& seen);
  // Layer's rows of sel_keep_ and of sel_scores_ ([num_kv_heads][keep_stride_]).
  int32_t* KeepRows(int64_t layer) const;
  float* StoredScoreRows(int64_t layer) const;
  // The memory's stored scores into sel_scores_ (ScoresInBackend), where a
  // run starts: the memory a checkpoint restored, or none.
  absl::Status UploadScores();
  // The chunk's end for the layers whose selection was a backend op
  // (pending_memory_): their kept indices to the host in one copy, the memory's
  // positions (and stored scores, from sel_scores_), the retention and the
  // origin from them; Internal for a vote that was not finite.
  absl::Status ApplyBackendSelections();
  // The recall tier where the selection was a backend op (EvictsInBackend):
  // the layer's num - kept evicted candidates found by the kept indices
  // keep_rows and gathered where they are, and their copy to a host slot
  // queued (DownloadAsync), after the slot's earlier layer went to the
  // store; candidates [0, num) of cand_pos_ are the layer's.
  absl::Status QueueEvicted(int64_t layer, int64_t num, int64_t kept, const int32_t* keep_rows);
  // The slots' layers to the store, the older first (the chunk's end): each
  // waits for its copy.
  absl::Status StoreQueuedEvictions();
  // Layer's retention and origin telemetry, once its memory holds the kept
  // entries (their positions too): keep[h] is KV head h's kept candidate
  // indices, ascending; candidates [0, m) were the memory.
  void CountKept(int64_t layer, int64_t m, const int32_t* const* keep);
  // Fills telemetry_'s scores from the chunk just run (score_tokens).
  // The step's chunk and the token past it are in batch_ after the
  // question's rows; `total` is the input's length.
  absl::Status ScoreChunk(int64_t total, const ScheduleStep& step);

  const LlamaModel& model_;
  Backend* backend_;
  PrefillConfig config_;
  SchedulePlan plan_;
  std::unique_ptr<Pruner> pruner_;
  std::unique_ptr<LlamaForward> forward_;
  std::unique_ptr<KvCache> memory_;  // [layers, kv_heads, capacity, head_dim], keys un-rotated

  // The step being run, the steps completed and the last one's retention.
  int64_t step_ = 0;
  int64_t steps_done_ = 0;
  std::vector<double> retention_;
  std::vector<int64_t> budgets_;      // [global layers] for this step
  // Per layer: its index among the global layers (the plan's budgets), -1
  // for a sliding-window layer; and the entries such a layer keeps.
  std::vector<int64_t> global_index_;
  int64_t window_capacity_ = 0;
  StepTelemetry telemetry_;

  // Candidates of one layer (memory then chunk), reused across layers:
  // Paged: each KV head's region is resident only as far as memory ∪ chunk
  // has reached, so IMDC (whose attention length stays at m̂ + c̄) does not
  // pay for the largest memory plus the largest chunk.
  // The backend's buffers (a device's, where it computes on one): only its
  // ops touch them, and the host reads them through HostFloats.
  std::unique_ptr<BackendBuffer> cand_k_raw_;  // [num_kv_heads, cand_capacity, head_dim] before RoPE
  std::unique_ptr<BackendBuffer> cand_k_rot_;  // [num_kv_heads, cand_capacity, head_dim] rotated
  std::unique_ptr<BackendBuffer> cand_v_;      // [num_kv_heads, cand_capacity, head_dim]
  // Floats [first, first + count) of a backend buffer for the host to
  // read: in place where the host can address it, else copied into
  // `staging` (the entries the recall store keeps).
  absl::StatusOr<const float*> HostFloats(BackendBuffer& b, int64_t first, int64_t count,
                                          std::vector<float>& staging);
  std::vector<float> host_k_, host_v_;  // HostFloats' copies (a device's buffers only)
  PagedArray<int32_t> cand_pos_;     // [num_kv_heads, cand_capacity] original positions
  PagedArray<int32_t> rot_pos_;      // [cand_capacity] rotation positions
  // [num_kv_heads, cand_capacity]: the window's votes; for reconstruct,
  // the candidates' scores (the memory's stored ones, the chunk's new).
  PagedArray<float> votes_;
  PagedArray<float> query_votes_;    // [num_kv_heads, cand_capacity] the question's votes
  std::vector<std::vector<int32_t>> keep_;
  // The selection as a backend op (PrefillConfig::select_in_backend): the
  // votes [SelectionVoteRows][num_kv_heads, cand_capacity] (the window's or
  // the question's; the window's second where they pick after it) with a
  // question's log-denominators after them (sel_lse_, or null), and every
  // global layer's kept indices [global layers][num_kv_heads][keep_stride_]
  // (each row followed by SelectHeads' status word), backend buffers; the
  // latter's copy on the host where it cannot read them in place; and per
  // layer whose positions wait for the chunk's end, its memory's size
  // before the step (its candidates [0, m) are that memory; -1: nothing
  // pending).
  std::unique_ptr<BackendBuffer> sel_votes_, sel_keep_;
  float* sel_lse_ = nullptr;
  int64_t keep_stride_ = 0;
  std::vector<int32_t> host_keep_;
  // For gate and reconstruct (ScoresInBackend): the memory's stored scores
  // as the op's votes read them, [global layers][num_kv_heads][keep_stride_],
  // a backend buffer kept equal to KvCache's (the host's, which follow at
  // the chunk's end); and its copy on the host where it cannot read it.
  std::unique_ptr<BackendBuffer> sel_scores_;
  std::vector<float> host_scores_;
  // The gates' parameters, [num_layers][num_kv_heads][GateParamFloats],
  // a backend buffer for Backend::GateScores (the gate pruner).
  std::unique_ptr<BackendBuffer> gate_params_;
  int64_t gate_param_floats_ = 0;
  std::vector<int64_t> pending_memory_;
  std::vector<const int32_t*> kept_rows_;    // CountKept's rows, per KV head
  std::vector<Backend::RowGather> gathers_;  // the backend's copies of a step, reused
  // Recall: the store, each head's evicted candidates of a step, and what
  // scores the store at the last step.
  RecallStore* recall_store_ = nullptr;
  std::vector<std::vector<int32_t>> evict_;
  std::unique_ptr<Recaller> recaller_;
  // EvictsInBackend: a layer's evicted candidates as the backend gathers
  // them (EvictedHostBytes: indices [num_kv_heads][e], keys and values in
  // the store's slot order and format, [e][num_kv_heads] records, e
  // evicted, converted by the backend), and two
  // host slots that its copies fill a layer behind the kernels, each with
  // its layer's candidate positions ([num_kv_heads][num]); the positions of
  // the entries being stored, in slot order.
  struct EvictSlot {
    std::unique_ptr<BackendBuffer> host;
    std::vector<int32_t> cand_pos;
    int64_t layer = -1;  // -1: empty
    int64_t num = 0, count = 0;
    uint64_t fence = 0;
  };
  std::unique_ptr<BackendBuffer> evicted_;
  EvictSlot evict_slots_[2];
  int next_evict_slot_ = 0;  // the older slot, filled next
  std::vector<int32_t> evict_pos_;
  // A slot's layer to the store, once its copy is the host's; the slot is
  // empty after.
  absl::Status StoreSlot(EvictSlot& slot);
  // Question-guided: the question's rows per batch (0 without one), and the
  // batch of a step: the question's tokens, then the chunk's (and the token
  // after the chunk, read with it for ScoreChunk). The question
  // goes first so that the rows whose final hidden states the forward
  // keeps (the last ones) stay the chunk's.
  int64_t query_rows_ = 0;       // the most (the batch's room)
  int64_t step_query_rows_ = 0;  // this step's
  std::vector<int32_t> batch_;
  // [num_heads, query_rows_] the log-denominators of the repetition's
  // queries (reconstruct) or the question's (--query_votes max).
  std::vector<float> query_lse_;
  // A layer's memory rows per KV head, for AttendAndCompress's threads.
  std::vector<float*> mem_k_, mem_v_;
  std::vector<int32_t*> mem_pos_;
  std::vector<float*> mem_score_;  // null without scores
  int64_t cand_capacity_ = 0;
  int64_t prefill_capacity_ = 0;  // memory entries the prefill may use (no decode reserve)
  int64_t taken_max_size_ = 0;    // memory_->max_size() when TakeDecoderCache() took it
  std::vector<float> last_logits_;
  // score_tokens: logits of score_rows_ positions at a time, and the NLL
  // of the next chunk's first token, predicted by this chunk's last position.
  int64_t score_rows_ = 0;
  std::vector<float> score_logits_;   // [score_rows_, vocab_size]
  bool has_carry_nll_ = false;
  double carry_nll_ = 0;
};


}  // namespace snapfill

#endif  // SNAPFILL_ENGINE_PREFILL_ENGINE_H_
