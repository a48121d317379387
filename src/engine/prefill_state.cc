// The memory in and out of the loop: restoring a checkpoint's memory, and
// handing the memory to the decoder (rotated for decoding).
#include <algorithm>
#include <cstring>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "snapfill/status.h"
#include "src/engine/prefill_engine.h"

namespace snapfill {

absl::Status PrefillEngineImpl::Restore(int64_t steps_done, const std::vector<double>& retention,
                                    const KvCache& memory) {
  const LlamaConfig& c = model_.config();
  const int64_t steps = static_cast<int64_t>(plan_.steps.size());
  if (steps_done < 0 || steps_done >= steps) {
    return absl::InvalidArgumentError(absl::StrCat("cannot resume after step ", steps_done,
                                                   ": the plan has ", steps, " steps"));
  }
  const KvCacheShape& s = memory.shape();
  if (s.num_layers != c.num_layers || s.num_kv_heads != c.num_kv_heads ||
      s.head_dim != c.head_dim) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the saved memory has ", s.num_layers, " layers x ", s.num_kv_heads, " KV heads x ",
        s.head_dim, " dims; the model has ", c.num_layers, " x ", c.num_kv_heads, " x ",
        c.head_dim));
  }
  if (static_cast<int64_t>(retention.size()) != c.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat("the saved retention has ", retention.size(),
                                                   " values for ", c.num_layers, " layers"));
  }
  for (double r : retention) {
    if (!(r >= 0.0 && r <= 1.0)) {
      return absl::InvalidArgumentError(absl::StrCat("saved retention ", r, " is not in [0, 1]"));
    }
  }
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const int64_t holds = global_index_[l] >= 0 ? prefill_capacity_ : window_capacity_;
    if (memory.size(l) < 0 || memory.size(l) > holds) {
      return absl::InvalidArgumentError(absl::StrCat("the saved memory of layer ", l, " holds ", memory.size(l),
                                                     " entries; this plan's ",
                                                     global_index_[l] >= 0 ? "memory" : "sliding window",
                                                     " holds ", holds));
    }
  }
  // A pruner that ranks by the entries' own scores resumes only with them.
  if (memory_->has_scores() && !memory.has_scores()) {
    return absl::InvalidArgumentError(absl::StrCat("the saved memory has no entry scores, which --pruner=",
                                                   PrunerKindName(config_.pruner.kind), " ranks by"));
  }
  memory_->Clear();
  SNAPFILL_RETURN_IF_ERROR(CopyMemory(memory, *memory_));
  steps_done_ = steps_done;
  retention_ = retention;
  return absl::OkStatus();
}

absl::Status PrefillEngineImpl::CopyMemory(const KvCache& from, KvCache& to) const {
  const LlamaConfig& c = model_.config();
  const size_t row = c.head_dim * sizeof(float);
  // The keys and values through the backend (either cache may be in its
  // buffers), the rest on the host.
  std::vector<Backend::RowGather> rows;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const int64_t m = from.size(l);
    for (int64_t h = 0; h < c.num_kv_heads; ++h) {
      rows.push_back({from.k(l, h), row, nullptr, to.k(l, h), row, m, row});
      rows.push_back({from.v(l, h), row, nullptr, to.v(l, h), row, m, row});
      std::memcpy(to.pos(l, h), from.pos(l, h), m * sizeof(int32_t));
      if (to.has_scores()) std::memcpy(to.score(l, h), from.score(l, h), m * sizeof(float));
    }
    to.set_size(l, m);
  }
  return backend_->Gather(rows);
}

namespace {

// Re-encoded positions for the decoder: every layer's entries end right
// before next_position (its own frame, as in the chunk loop, where a
// layer's m entries sit at 0..m-1 and the next token at m): entry j of a
// layer holding m at next - m + j, so the distances from the next token
// are the loop's whatever each layer holds (a sliding-window layer its
// window, the others their memories).
const int32_t* DecoderPositions(const std::vector<int32_t>& rot, int64_t m) {
  return rot.data() + (static_cast<int64_t>(rot.size()) - m);
}

}  // namespace

absl::StatusOr<std::unique_ptr<KvCache>> PrefillEngineImpl::TakeDecoderCache() {
  if (memory_ == nullptr) return absl::FailedPreconditionError("the memory was already taken");
  const LlamaConfig& c = model_.config();
  // Where the memory is in the backend's buffers (a device's), it stays
  // there: the decoder appends and attends through the backend's ops, and
  // the cache writer reads it with CopyOut.
  std::vector<int32_t> rot(memory_->max_size());
  std::iota(rot.begin(), rot.end(), 0);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const int64_t m = memory_->size(l);
    for (int64_t h = 0; h < c.num_kv_heads; ++h) {
      const int32_t* pos = config_.keep_original_positions ? memory_->pos(l, h) : DecoderPositions(rot, m);
      SNAPFILL_RETURN_IF_ERROR(backend_->Rope(memory_->k(l, h), m, 1, c.head_dim, c.head_dim, pos,
                                              c.rope(l)));
    }
  }
  // (A device's RoPE copies its positions from `rot` on its stream: done
  // before `rot` goes.)
  SNAPFILL_RETURN_IF_ERROR(backend_->Synchronize());
  taken_max_size_ = memory_->max_size();
  ReleaseScratch();
  return std::move(memory_);
}

void PrefillEngineImpl::ReleaseScratch() {
  // Unmapped, so the pages leave the resident set before decoding adds its
  // own (the decode copy of the weights, the fp16 cache): the run's peak is
  // then the larger of the two phases, not their sum.
  forward_.reset();
  recaller_.reset();
  for (std::unique_ptr<BackendBuffer>* b :
       {&cand_k_raw_, &cand_k_rot_, &cand_v_, &sel_votes_, &sel_keep_, &sel_scores_, &gate_params_}) {
    b->reset();
  }
  sel_lse_ = nullptr;
  host_keep_ = {};
  host_scores_ = {};
  host_k_ = {};
  host_v_ = {};
  for (PagedArray<float>* a : {&votes_, &query_votes_}) *a = {};
  cand_pos_ = {};
  rot_pos_ = {};
  query_lse_ = {};
  score_logits_ = {};
  batch_ = {};
  gathers_ = {};
  // The kernels' buffers sized for a chunk's rows (packed activations, the
  // votes' kept scores) go too; decoding's one-token products make their
  // own, smaller ones.
  backend_->ReleaseKernelScratch();
}

int64_t PrefillEngineImpl::next_position() const {
  if (config_.keep_original_positions) return plan_.config.total_tokens;
  return memory_ != nullptr ? memory_->max_size() : taken_max_size_;
}

absl::StatusOr<std::unique_ptr<KvCache>> PrefillEngineImpl::MakeDecoderCache(
    int64_t extra_capacity) const {
  const LlamaConfig& c = model_.config();
  const int64_t max_size = memory_->max_size();
  // Each layer holds its entries and room for extra_capacity more (a
  // sliding-window layer its window's).
  KvCacheShape shape{c.num_layers, c.num_kv_heads, c.head_dim, std::max<int64_t>(1, max_size + extra_capacity)};
  for (int64_t l = 0; l < c.num_layers; ++l) {
    shape.layer_capacity.push_back(std::max<int64_t>(1, memory_->size(l) + extra_capacity));
  }
  // Where the memory is (a device's buffers, or the host's).
  SNAPFILL_ASSIGN_OR_RETURN(auto cache, KvCache::Create(shape, memory_->storage()));
  if (memory_->has_scores()) SNAPFILL_RETURN_IF_ERROR(cache->EnableScores());
  std::vector<int32_t> rot(max_size);
  std::iota(rot.begin(), rot.end(), 0);
  const int64_t d = c.head_dim;
  SNAPFILL_RETURN_IF_ERROR(CopyMemory(*memory_, *cache));
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const int64_t m = memory_->size(l);
    for (int64_t h = 0; h < c.num_kv_heads; ++h) {
      const int32_t* pos = config_.keep_original_positions ? memory_->pos(l, h) : DecoderPositions(rot, m);
      SNAPFILL_RETURN_IF_ERROR(backend_->Rope(cache->k(l, h), m, 1, d, d, pos, c.rope(l)));
    }
  }
  SNAPFILL_RETURN_IF_ERROR(backend_->Synchronize());  // (as in TakeDecoderCache)
  return cache;
}

}  // namespace snapfill
