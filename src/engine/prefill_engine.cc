// The chunk loop (DESIGN.md §2-§4, §7, §8): each chunk through the layers,
// attending over memory + chunk, compressing right after each layer.
#include "src/engine/prefill_engine.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "snapfill/status.h"
#include "src/base/sys_stats.h"
#include "src/engine/prefill_internal.h"

namespace snapfill {

using prefill_internal::AdaptiveTail;
using prefill_internal::EvictedBufferBytes;
using prefill_internal::EvictedF32Offset;
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
using prefill_internal::StoresEvicted;

namespace {

uint64_t PhysicalMemoryBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * page : 0;
}

}  // namespace

PrefillEngineImpl::PrefillEngineImpl(const LlamaModel& model, Backend* backend, const PrefillConfig& config)
    : model_(model), backend_(backend), config_(config) {}

absl::StatusOr<std::unique_ptr<PrefillEngine>> PrefillEngine::Create(const LlamaModel& model,
                                                                     Backend* backend,
                                                                     const PrefillConfig& config,
                                                                     int64_t total_tokens) {
  const LlamaConfig& mc = model.config();
  SNAPFILL_ASSIGN_OR_RETURN(const PrefillConfig resolved, Resolve(mc, config, total_tokens));
  SNAPFILL_ASSIGN_OR_RETURN(PrefillFootprint fp, Footprint(mc, config, total_tokens));
  std::unique_ptr<PrefillEngineImpl> e(new PrefillEngineImpl(model, backend, resolved));
  e->plan_ = std::move(fp.plan);
  SNAPFILL_ASSIGN_OR_RETURN(e->pruner_, CreatePruner(e->config_.pruner, *backend));
  const bool full = e->config_.pruner.kind == PrunerKind::kFull;
  const int64_t capacity = fp.memory_capacity;
  // (On a device the memory's keys and values are the device's: the run
  // checks them against its free memory, before it starts.)
  const uint64_t phys = PhysicalMemoryBytes();
  if (phys > 0 && backend->HostReachesBuffers() && fp.memory_bytes > phys / 10 * 8) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "a memory of %d entries per layer and KV head needs %.1f GiB, more than this machine's "
        "%.1f GiB%s",
        capacity, fp.memory_bytes / double(1 << 30), phys / double(1 << 30),
        full ? "; the full pruner keeps every token: use --pruner=snapkv" : ""));
  }
  // Global layers: the schedule's memory, the recalled entries and the
  // decoder's; sliding-window layers: their window and the decoder's.
  const std::vector<int64_t> global = GlobalLayers(mc);
  e->global_index_.assign(mc.num_layers, -1);
  for (size_t g = 0; g < global.size(); ++g) e->global_index_[global[g]] = static_cast<int64_t>(g);
  e->window_capacity_ = fp.window_entries;
  KvCacheShape shape{mc.num_layers, mc.num_kv_heads, mc.head_dim,
                     capacity + e->config_.recall_budget + e->config_.decode_reserve};
  if (static_cast<int64_t>(global.size()) < mc.num_layers) {
    const int64_t window = std::max<int64_t>(1, fp.window_entries + e->config_.decode_reserve);
    for (int64_t l = 0; l < mc.num_layers; ++l) shape.layer_capacity.push_back(mc.IsLocal(l) ? window : shape.capacity);
    shape.capacity = std::max(shape.capacity, window);
  }
  // (On a device the memory's keys and values live there too.)
  SNAPFILL_ASSIGN_OR_RETURN(e->memory_, KvCache::Create(shape, backend->HostReachesBuffers() ? nullptr : backend));
  const bool reconstruct = e->config_.pruner.kind == PrunerKind::kReconstruct;
  e->query_rows_ = QueryRows(e->config_, e->plan_.max_chunk_tokens);
  if (KeepsEntryScores(e->config_.pruner.kind)) SNAPFILL_RETURN_IF_ERROR(e->memory_->EnableScores());
  if (reconstruct || (e->query_rows_ > 0 && e->config_.pruner.query_votes == QueryVotes::kMax)) {
    e->query_lse_.resize(mc.num_heads * e->query_rows_);
  }
  SNAPFILL_ASSIGN_OR_RETURN(e->forward_, LlamaForward::Create(model, backend,
                                                              e->plan_.max_chunk_tokens + e->query_rows_));
  // The question's rows, the chunk's, and the token past the chunk (what
  // its last position is scored against).
  e->batch_.resize(e->query_rows_ + e->plan_.max_chunk_tokens + 1);
  if (!reconstruct) std::copy(e->config_.query_tokens.begin(), e->config_.query_tokens.end(), e->batch_.begin());
  e->prefill_capacity_ = capacity;
  e->cand_capacity_ = std::max(capacity, fp.window_entries) + e->plan_.max_chunk_tokens + e->query_rows_;
  const int64_t cand = mc.num_kv_heads * e->cand_capacity_;
  for (std::unique_ptr<BackendBuffer>* b : {&e->cand_k_raw_, &e->cand_k_rot_, &e->cand_v_}) {
    absl::StatusOr<std::unique_ptr<BackendBuffer>> made =
        e->backend_->NewBuffer(static_cast<uint64_t>(cand * mc.head_dim) * sizeof(float));
    if (!made.ok()) {
      return absl::ResourceExhaustedError(absl::StrCat("cannot allocate the candidates of ", e->cand_capacity_,
                                                       " entries: ", made.status().message()));
    }
    *b = std::move(*made);
  }
  const bool on_device = !backend->HostReachesBuffers();
  if (SelectsInBackend(e->config_, on_device)) {
    e->keep_stride_ = KeepStride(capacity);
    const uint64_t keep_words = static_cast<uint64_t>(global.size()) * mc.num_kv_heads * e->keep_stride_;
    const int64_t vote_floats = SelectionVoteRows(e->config_, e->query_rows_) * cand;
    const int64_t lse_floats = SelectionLseFloats(e->config_, mc.num_heads, e->query_rows_);
    absl::StatusOr<std::unique_ptr<BackendBuffer>> votes =
        e->backend_->NewBuffer((vote_floats + lse_floats) * sizeof(float));
    absl::StatusOr<std::unique_ptr<BackendBuffer>> keep = e->backend_->NewBuffer(keep_words * sizeof(int32_t));
    if (!votes.ok() || !keep.ok()) {
      return absl::ResourceExhaustedError(absl::StrCat("cannot allocate the selection's votes and kept indices: ",
                                                       (votes.ok() ? keep.status() : votes.status()).message()));
    }
    e->sel_votes_ = std::move(*votes);
    e->sel_keep_ = std::move(*keep);
    if (lse_floats > 0) e->sel_lse_ = e->sel_votes_->f32() + vote_floats;
    if (ScoresInBackend(e->config_, on_device)) {
      // (Their scores are row 0 of the votes, where a question's would be:
      // Resolve refuses a question with the gate, and reconstruction's
      // extra rows are its repetition.)
      if (prefill_internal::AsksQuestion(e->config_, e->query_rows_)) {
        return absl::InternalError("a question with stored scores");
      }
      absl::StatusOr<std::unique_ptr<BackendBuffer>> scores = e->backend_->NewBuffer(keep_words * sizeof(float));
      if (!scores.ok()) {
        return absl::ResourceExhaustedError(
            absl::StrCat("cannot allocate the memory's stored scores: ", scores.status().message()));
      }
      e->sel_scores_ = std::move(*scores);
    }
  }
  if (EvictsInBackend(e->config_, on_device)) {
    // (Sized for every candidate: a step evicts at most all of them.)
    const int64_t cap = e->cand_capacity_;
    const RecallFormat format = e->config_.recall_format;
    const uint64_t bytes = EvictedHostBytes(mc.num_kv_heads, mc.head_dim, cap, format);
    absl::StatusOr<std::unique_ptr<BackendBuffer>> evicted =
        e->backend_->NewBuffer(EvictedBufferBytes(mc.num_kv_heads, mc.head_dim, cap, format));
    if (!evicted.ok()) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot allocate the recall tier's evicted rows: ", evicted.status().message()));
    }
    e->evicted_ = std::move(*evicted);
    for (auto& slot : e->evict_slots_) {
      absl::StatusOr<std::unique_ptr<BackendBuffer>> host = e->backend_->NewHostBuffer(bytes);
      if (!host.ok()) {
        return absl::ResourceExhaustedError(
            absl::StrCat("cannot allocate the host's copy of the evicted rows: ", host.status().message()));
      }
      slot.host = std::move(*host);
      slot.cand_pos.resize(cand);
    }
    e->evict_pos_.resize(cand);
  }
  if (const GateModel* gates = e->config_.gate; e->config_.pruner.kind == PrunerKind::kGate) {
    // Packed per layer and KV head as Backend::GateScores reads them, and
    // uploaded once.
    e->gate_param_floats_ = Backend::GateParamFloats(gates->head_dim(), gates->hidden());
    const std::vector<float> packed = gates->Packed();
    absl::StatusOr<std::unique_ptr<BackendBuffer>> params = e->backend_->NewBuffer(packed.size() * sizeof(float));
    if (!params.ok()) {
      return absl::ResourceExhaustedError(absl::StrCat("cannot allocate the gates: ", params.status().message()));
    }
    e->gate_params_ = std::move(*params);
    SNAPFILL_RETURN_IF_ERROR(
        e->backend_->Upload(packed.data(), e->gate_params_->data(), packed.size() * sizeof(float)));
  }
  e->pending_memory_.assign(mc.num_layers, -1);
  if (!e->cand_pos_.Allocate(cand) ||
      !e->votes_.Allocate(cand) || !e->rot_pos_.Allocate(e->cand_capacity_) ||
      (e->query_rows_ > 0 && !reconstruct && !e->query_votes_.Allocate(cand))) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate the candidates of ", e->cand_capacity_, " entries"));
  }
  e->last_logits_.resize(mc.vocab_size);
  if (e->config_.score_tokens) {
    e->score_rows_ = ScoreRows(mc.vocab_size, e->plan_.max_chunk_tokens);
    e->score_logits_.resize(e->score_rows_ * mc.vocab_size);
  }
  return e;
}

absl::Status PrefillEngineImpl::AttachRecallStore(RecallStore* store) {
  const LlamaConfig& mc = model_.config();
  if (store != nullptr) {
    const RecallStoreInfo& info = store->info();
    if (info.num_layers != mc.num_layers || info.num_kv_heads != mc.num_kv_heads || info.head_dim != mc.head_dim) {
      return absl::InvalidArgumentError(absl::StrCat("the recall store in ", store->dir(), " is shaped ",
                                                     info.num_layers, " x ", info.num_kv_heads, " x ",
                                                     info.head_dim, "; the model is ", mc.num_layers, " x ",
                                                     mc.num_kv_heads, " x ", mc.head_dim));
    }
  }
  if (store != nullptr && !StoresEvicted(config_)) {
    return absl::FailedPreconditionError(
        "the engine was planned without a recall store: set PrefillConfig::store_evicted (or a recall budget)");
  }
  if (store != nullptr && evicted_ != nullptr && store->info().format != config_.recall_format) {
    // (The evicted rows reach the host in the planned store's format.)
    return absl::FailedPreconditionError(
        absl::StrCat("the recall store in ", store->dir(), " keeps ", RecallFormatName(store->info().format),
                     " entries; the engine was planned for ", RecallFormatName(config_.recall_format),
                     " (PrefillConfig::recall_format)"));
  }
  recall_store_ = store;
  if (store != nullptr) {
    // Whole blocks through the backend's vectorized conversions.
    store->SetConversions(RecallStore::BackendConversions(backend_));
  }
  return absl::OkStatus();
}

uint64_t PrefillEngineImpl::scratch_bytes() const {
  return (forward_ != nullptr ? forward_->scratch_bytes() : 0) +
         (cand_k_raw_ != nullptr ? cand_k_raw_->bytes() + cand_k_rot_->bytes() + cand_v_->bytes() : 0) +
         (sel_votes_ != nullptr ? sel_votes_->bytes() + sel_keep_->bytes() : 0) +
         (sel_scores_ != nullptr ? sel_scores_->bytes() : 0) + (gate_params_ != nullptr ? gate_params_->bytes() : 0) +
         host_scores_.capacity() * sizeof(float) + host_keep_.capacity() * sizeof(int32_t) +
         (evicted_ != nullptr ? evicted_->bytes() + evict_slots_[0].host->bytes() + evict_slots_[1].host->bytes() : 0) +
         (evict_slots_[0].cand_pos.size() + evict_slots_[1].cand_pos.size() + evict_pos_.size()) * sizeof(int32_t) +
         (votes_.size() + query_votes_.size() + query_lse_.size()) * sizeof(float) +
         (cand_pos_.size() + rot_pos_.size()) * sizeof(int32_t);
}

int64_t PrefillEngineImpl::ChunkOf(int32_t position) const {
  // The last step whose first token is at or before `position`.
  auto it = std::upper_bound(plan_.steps.begin(), plan_.steps.end(), position,
                             [](int32_t p, const ScheduleStep& s) { return p < s.start_token; });
  return std::max<int64_t>(0, (it - plan_.steps.begin()) - 1);
}

absl::Status PrefillEngine::Run(const std::vector<int32_t>& tokens,
                                const std::function<bool(const StepTelemetry&)>& on_step) {
  return Run(SpanTokenSource(tokens), on_step);
}

absl::Status PrefillEngineImpl::Run(const TokenSource& tokens,
                                const std::function<bool(const StepTelemetry&)>& on_step) {
  if (tokens.size() != plan_.config.total_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("the plan is for ", plan_.config.total_tokens,
                                                   " tokens, got ", tokens.size()));
  }
  if (memory_ == nullptr) {
    return absl::FailedPreconditionError("the memory was taken (TakeDecoderCache): the engine cannot run again");
  }
  const LlamaConfig& mc = model_.config();
  const bool full = config_.pruner.kind == PrunerKind::kFull;
  if (config_.recall_budget > 0 && recall_store_ == nullptr) {
    return absl::FailedPreconditionError("recall_budget > 0 but no recall store is attached");
  }
  // A finished run starts over; a restored one goes on.
  if (steps_done_ >= static_cast<int64_t>(plan_.steps.size())) steps_done_ = 0;
  if (steps_done_ == 0) {
    memory_->Clear();
    retention_.assign(mc.num_layers, 0.0);
  }
  SNAPFILL_RETURN_IF_ERROR(UploadScores());
  // The first token of the first chunk run here has no score carried over
  // (the start of the input, or a run resumed after its predictor ran).
  has_carry_nll_ = false;
  // (A run that stopped on an error mid-chunk leaves nothing to apply.)
  std::fill(pending_memory_.begin(), pending_memory_.end(), -1);
  for (EvictSlot& slot : evict_slots_) slot.layer = -1;
  Stopwatch total;
  for (step_ = steps_done_; step_ < static_cast<int64_t>(plan_.steps.size()); ++step_) {
    const ScheduleStep& step = plan_.steps[step_];
    Stopwatch watch;
    // The plan's budgets are the global layers' (GlobalLayers' order).
    budgets_ = step.budget;
    if (full) {
      std::fill(budgets_.begin(), budgets_.end(), prefill_capacity_);
    } else if (plan_.adaptive && step_ > 0 && AdaptiveTail(plan_) > 0 &&
               step_ + 1 == static_cast<int64_t>(plan_.steps.size())) {
      // The last chunk kept whole: every layer's memory as it is, and the
      // chunk (the earlier budgets left it the room).
      std::fill(budgets_.begin(), budgets_.end(), prefill_capacity_ - plan_.config.sink_tokens);
    } else if (plan_.adaptive && step_ > 0) {
      std::vector<double> retention;
      for (int64_t l = 0; l < mc.num_layers; ++l) {
        if (global_index_[l] >= 0) retention.push_back(retention_[l]);
      }
      SNAPFILL_ASSIGN_OR_RETURN(budgets_,
                                AdaptiveBudgets(step.budget[0], retention, plan_.config.window,
                                                prefill_capacity_ - plan_.config.sink_tokens - AdaptiveTail(plan_)));
    }
    telemetry_ = StepTelemetry();
    telemetry_.step = step_;
    telemetry_.start_token = step.start_token;
    telemetry_.chunk_tokens = step.chunk_tokens;
    telemetry_.memory.assign(mc.num_layers, 0);
    telemetry_.retention.assign(mc.num_layers, 0.0);
    telemetry_.origin.assign(mc.num_layers, std::vector<int64_t>(step_ + 1, 0));
    const bool last = step_ + 1 == static_cast<int64_t>(plan_.steps.size());
    auto attend = [this](int64_t layer, float* q, int64_t q_stride, float* k, float* v,
                         int64_t kv_stride, int64_t n, int64_t out_rows, float* out) {
      return AttendAndCompress(layer, q, q_stride, k, v, kv_stride, n, out_rows, out);
    };
    // The final hidden states of every row when they are scored, else only
    // of the input's last token (its logits), after the last chunk.
    const int64_t logits_rows = last ? 1 : 0;
    // The question (or the repetition), then the chunk (see batch_), and
    // the token after it.
    const bool reconstruct = config_.pruner.kind == PrunerKind::kReconstruct;
    // A last step that keeps its chunk whole (--keep_last_chunk) evicts
    // nothing, so no score of it is ever compared: no repetition there; its
    // chunk's entries keep a score of 0.
    const bool scores_unread = last && plan_.config.keep_last_chunk;
    step_query_rows_ = reconstruct ? (scores_unread ? 0 : QueryRows(config_, step.chunk_tokens)) : query_rows_;
    const int64_t past = step.start_token + step.chunk_tokens < tokens.size() ? 1 : 0;
    SNAPFILL_RETURN_IF_ERROR(
        tokens.Read(step.start_token, step.chunk_tokens + past, batch_.data() + step_query_rows_));
    if (reconstruct && step_query_rows_ > 0) {  // the prompt, then every stride-th token of the chunk
      const std::vector<int32_t>& prompt = config_.repeat_prompt;
      std::copy(prompt.begin(), prompt.end(), batch_.begin());
      const int64_t stride = config_.pruner.repeat_stride;
      const int32_t* chunk = batch_.data() + step_query_rows_;
      for (int64_t i = 0, r = static_cast<int64_t>(prompt.size()); r < step_query_rows_; ++i, ++r) {
        batch_[r] = chunk[i * stride];
      }
    }
    const int32_t* batch = batch_.data();
    telemetry_.query_rows = step_query_rows_;
    SNAPFILL_RETURN_IF_ERROR(forward_->ForwardWithAttention(
        batch, step_query_rows_ + step.chunk_tokens, attend, logits_rows, last_logits_.data(),
        config_.score_tokens ? step.chunk_tokens : logits_rows));
    SNAPFILL_RETURN_IF_ERROR(StoreQueuedEvictions());
    SNAPFILL_RETURN_IF_ERROR(ApplyBackendSelections());
    if (config_.score_tokens) SNAPFILL_RETURN_IF_ERROR(ScoreChunk(tokens.size(), step));
    retention_ = telemetry_.retention;
    steps_done_ = step_ + 1;
    telemetry_.seconds = watch.Seconds();
    telemetry_.elapsed_seconds = total.Seconds();
    telemetry_.rss_bytes = CurrentRssBytes();
    telemetry_.kernel_scratch_bytes = backend_->KernelScratchBytes();
    if (on_step && !on_step(telemetry_)) {
      return absl::CancelledError(absl::StrCat("stopped after step ", step_));
    }
  }
  return absl::OkStatus();
}

absl::Status PrefillEngineImpl::AttendAndCompress(int64_t layer, float* q, int64_t q_stride, float* k,
                                              float* v, int64_t kv_stride, int64_t rows, int64_t out_rows,
                                              float* out) {
  const LlamaConfig& c = model_.config();
  const int64_t d = c.head_dim;
  const int64_t m = memory_->size(layer);
  // The batch: the question's (or the repetition's) qn rows, then the
  // chunk's n (see batch_).
  const int64_t qn = step_query_rows_;
  // A sliding-window layer (DESIGN.md §10) attends within its window and
  // keeps its last W entries, a ring: no votes, no pruner, no recall.
  const bool local = global_index_[layer] < 0;
  const bool reconstruct = !local && config_.pruner.kind == PrunerKind::kReconstruct;
  const bool stored_scores = KeepsEntryScores(config_.pruner.kind);
  const bool question = !local && qn > 0 && config_.pruner.kind != PrunerKind::kReconstruct;
  // A global layer's candidates' stored scores as the backend's op reads
  // them (ScoresInBackend): the votes buffer's row, the memory's from
  // sel_scores_, the chunk's made there.
  float* const scores_row = !local && sel_scores_ != nullptr ? sel_votes_->f32() : nullptr;
  const int64_t n = rows - qn;
  const int64_t num = m + n;  // candidates: memory first, in original order, then the chunk
  // The question's keys follow the candidates, at rows [num, num + qn).
  const int64_t total = num + qn;
  const int64_t start = plan_.steps[step_].start_token;
  const int64_t head_stride = cand_capacity_ * d;
  const bool original = config_.keep_original_positions;

  // 1. Gather memory ∪ chunk (∪ question) per KV head (keys before RoPE),
  //    and a copy of the keys to rotate, through the backend (its threads
  //    share the rows: the copies were 1.5% of the main thread's samples in
  //    a 64K prefill, with the other thread waiting).
  // The memory's rows are looked up first: KvCache's accessors may write
  // (k() and v() restore released entries and mark the layer's fp16 copy
  // stale), so they are not for concurrent callers.
  mem_k_.resize(c.num_kv_heads);
  mem_v_.resize(c.num_kv_heads);
  mem_pos_.resize(c.num_kv_heads);
  mem_score_.resize(c.num_kv_heads);
  for (int64_t h = 0; h < c.num_kv_heads; ++h) {
    mem_k_[h] = memory_->k(layer, h);
    mem_v_[h] = memory_->v(layer, h);
    mem_pos_[h] = memory_->pos(layer, h);
    mem_score_[h] = stored_scores ? memory_->score(layer, h) : nullptr;
  }
  const size_t row = d * sizeof(float), batch_row = kv_stride * sizeof(float);
  std::vector<Backend::RowGather>& gathers = gathers_;  // (its capacity kept from layer to layer)
  gathers.clear();
  for (int64_t h = 0; h < c.num_kv_heads; ++h) {
    float* kr = cand_k_raw_->f32() + h * head_stride;
    float* vv = cand_v_->f32() + h * head_stride;
    int32_t* pp = cand_pos_.data() + h * cand_capacity_;
    // The memory, rows [0, m); its stored scores beside (reconstruct, gate:
    // from the backend's copy into the op's row; the host selection reads
    // the host's, select() below).
    gathers.push_back({mem_k_[h], row, nullptr, kr, row, m, row});
    gathers.push_back({mem_v_[h], row, nullptr, vv, row, m, row});
    gathers.push_back({mem_pos_[h], sizeof(int32_t), nullptr, pp, sizeof(int32_t), m, sizeof(int32_t)});
    if (scores_row != nullptr) {
      gathers.push_back({StoredScoreRows(layer) + h * keep_stride_, sizeof(float), nullptr,
                         scores_row + h * cand_capacity_, sizeof(float), m, sizeof(float)});
    }
    // Chunk token t (batch row qn + t) at m + t; question token i (batch
    // row i, at the input position after the chunk's) at num + i.
    gathers.push_back({k + qn * kv_stride + h * d, batch_row, nullptr, kr + m * d, row, n, row});
    gathers.push_back({v + qn * kv_stride + h * d, batch_row, nullptr, vv + m * d, row, n, row});
    gathers.push_back({k + h * d, batch_row, nullptr, kr + num * d, row, qn, row});
    gathers.push_back({v + h * d, batch_row, nullptr, vv + num * d, row, qn, row});
    std::iota(pp + m, pp + total, static_cast<int32_t>(start));
  }
  SNAPFILL_RETURN_IF_ERROR(backend_->Gather(gathers));
  gathers.clear();
  for (int64_t h = 0; h < c.num_kv_heads; ++h) {  // (the candidates only, not the capacity)
    gathers.push_back({cand_k_raw_->f32() + h * head_stride, row, nullptr, cand_k_rot_->f32() + h * head_stride, row,
                       total, row});
  }
  SNAPFILL_RETURN_IF_ERROR(backend_->Gather(gathers));
  // 2. Rotate: re-encoded positions put candidate j at j (DESIGN.md §4), so
  //    the largest position is m + c (+ the question); or each entry at its
  //    input position.
  std::iota(rot_pos_.begin(), rot_pos_.begin() + total, 0);
  SNAPFILL_RETURN_IF_ERROR(backend_->RopeHeads(cand_k_rot_->f32(), c.num_kv_heads, head_stride, total, d,
                                               original ? cand_pos_.data() : rot_pos_.data(),
                                               original ? cand_capacity_ : 0, c.rope(layer)));
  // Chunk queries sit after the memory: position m + t (or start + t); the
  // question's after the chunk, at num + i (or start + n + i).
  const int32_t* qpos = original ? cand_pos_.data() : rot_pos_.data();
  float* chunk_q = q + qn * q_stride;
  SNAPFILL_RETURN_IF_ERROR(backend_->Rope(chunk_q, n, c.num_heads, d, q_stride, qpos + m, c.rope(layer)));
  if (qn > 0) {
    SNAPFILL_RETURN_IF_ERROR(backend_->Rope(q, qn, c.num_heads, d, q_stride, qpos + num, c.rope(layer)));
  }

  // 3. Attention of the chunk over memory ∪ chunk (causal inside the chunk),
  //    for the last out_rows queries, those whose outputs are read: every
  //    one but in the last layer, where only the rows whose logits are
  //    wanted. Query i of them sees the keys up to num - out_rows + i, as
  //    row n - out_rows + i of the chunk. The question's rows (those of
  //    them among the last out_rows) attend over memory ∪ chunk and the
  //    question causally; the chunk never sees the question.
  KvView view;
  view.k = cand_k_rot_->f32();
  view.v = cand_v_->f32();
  view.head_stride = head_stride;
  view.key_stride = d;
  view.num_keys = num;
  KvView with_question = view;
  with_question.num_keys = total;
  const int64_t chunk_out = std::min(out_rows, n);
  const int64_t question_out = out_rows - chunk_out;
  // (Entries are consecutive positions in a local layer, so its window is
  // the last W entries up to each query's own.)
  auto attending = [&](int64_t count) {
    Queries queries = LlamaQueries(c, q, q_stride, count);
    if (local) queries.window = c.sliding_window;
    return queries;
  };
  if (chunk_out > 0) {
    const int64_t skip = rows - chunk_out;
    SNAPFILL_RETURN_IF_ERROR(backend_->Attention(attending(rows).From(skip), view, out + skip * q_stride, q_stride));
  }
  // Context reconstruction weighs the chunk's keys by the repetition's
  // softmax denominators: they come with the repetition's attention, into
  // query_lse_ ([num_heads][qn]), rather than from a second pass over the
  // keys (QueryLogSumExp, which took two thirds of the scoring), and of the
  // same scores as RecallScores' (bf16 where the attention's are). In the
  // last layer, whose repetition rows are not read, they are attended for
  // that alone (on bf16 tiles a third of QueryLogSumExp's f32 pass), where
  // the backend's attention keeps them (else QueryLogSumExp, below).
  const int64_t prompt_rows = reconstruct ? static_cast<int64_t>(config_.repeat_prompt.size()) : 0;
  const bool lse_with_attention =
      reconstruct && qn > prompt_rows && backend_->HostReachesBuffers() && backend_->AttentionKeepsLse();
  if (question_out > 0 || lse_with_attention) {
    const int64_t skip = lse_with_attention ? 0 : qn - question_out;
    const Queries rows_out = attending(qn).From(skip);
    SNAPFILL_RETURN_IF_ERROR(
        lse_with_attention
            ? backend_->AttentionWithLse(rows_out, with_question, out + skip * q_stride, q_stride, query_lse_.data())
            : backend_->Attention(rows_out, with_question, out + skip * q_stride, q_stride));
  }

  // 4. Compress right away: this layer's chunk KV is not needed any more.
  //    A sliding-window layer keeps its last W entries (the window of the
  //    next chunk's first token and on); a global layer what the pruner
  //    selects.
  const bool final_step = step_ + 1 == static_cast<int64_t>(plan_.steps.size());
  // The question's queries that vote (and recall): its rows after the
  // chunk, over memory ∪ chunk ∪ question; at the input's last step the
  // chunk's own last rows instead, which are the same tokens in place (the
  // input ends with the question as the prompt closes it), where they ask
  // it as the decoder will: after the text, not after a second copy.
  const float* voter_q = q;
  int64_t voters = qn;
  KvView voter_seen = with_question;
  if (question && final_step) {
    voters = std::min(qn, n);
    voter_q = chunk_q + (n - voters) * q_stride;
    voter_seen = view;
  }
  SelectionInput in;
  in.num_kv_heads = c.num_kv_heads;
  in.num_candidates = num;
  in.num_memory = m;
  in.budget = local ? 0 : budgets_[global_index_[layer]];
  in.final_step = final_step;
  in.positions = cand_pos_.data();
  in.positions_stride = cand_capacity_;
  if (question) {  // (computed in select(), or into sel_votes_ for the backend's op)
    in.query_votes = query_votes_.data();
    in.query_votes_stride = cand_capacity_;
  }
  // SnapKV's votes, [num_kv_heads][cand_capacity_] from `votes` on: a
  // separate small pass over the chunk's last w queries only.
  auto window_votes = [&](float* votes) {
    const int64_t w = std::min<int64_t>(plan_.config.window, n);
    return backend_->WindowScores(LlamaQueries(c, chunk_q, q_stride, n).From(n - w), view, votes, cand_capacity_);
  };
  // The chunk entries' stored scores (reconstruct, gate) after the
  // memory's in each head's row of `scores` ([num_kv_heads][cand_capacity_]),
  // through the backend wherever the rows are; lse: the repetition's
  // log-denominators ([num_heads][qn]). host_rows: scores is the host's
  // votes_, not the backend's op rows (which a device holds).
  auto chunk_scores = [&](float* scores, float* lse, bool host_rows) -> absl::Status {
    Stopwatch watch;
    if (reconstruct) {
      // Context reconstruction (DESIGN.md §9): each chunk entry's largest
      // weight from the repeated tokens' queries (not the prompt's), over
      // every key they see (the real denominators). They are the batch's
      // last rows of with_question.
      if (qn == 0) {  // (no repetition: a last step that keeps its chunk whole)
        for (int64_t h = 0; h < c.num_kv_heads; ++h) {
          float* row = scores + h * cand_capacity_ + m;
          if (host_rows) {
            std::fill(row, row + n, 0.0f);
          } else {
            SNAPFILL_RETURN_IF_ERROR(backend_->Fill(row, n, 0.0f));
          }
        }
        telemetry_.score_seconds += watch.Seconds();
        return absl::OkStatus();
      }
      const Queries repeat = LlamaQueries(c, q, q_stride, qn).From(prompt_rows);
      if (lse_with_attention) {
        // Each head's rows [prompt_rows, qn) of the attention's, in
        // QueryLogSumExp's layout ([num_heads][repeat.count]). lse may be
        // query_lse_ itself: a head's row moves down, to before the next
        // head's source, so memmove in head order.
        for (int64_t h = 0; h < c.num_heads; ++h) {
          std::memmove(lse + h * repeat.count, query_lse_.data() + h * qn + prompt_rows, repeat.count * sizeof(float));
        }
      } else {
        SNAPFILL_RETURN_IF_ERROR(backend_->QueryLogSumExp(repeat, with_question, lse));
      }
      KvView chunk_keys = view;
      chunk_keys.k += m * d;
      chunk_keys.v += m * d;
      chunk_keys.num_keys = n;
      SNAPFILL_RETURN_IF_ERROR(
          backend_->RecallScores(repeat, lse, chunk_keys, scores + m, cand_capacity_, /*max_weight=*/true));
    } else {
      // SmartKV: each chunk entry's predicted lifespan from its key before
      // RoPE, every head in one op where the keys are.
      Backend::GateScoring g;
      g.num_heads = c.num_kv_heads;
      g.head_dim = d;
      g.hidden = config_.gate->hidden();
      g.n = n;
      g.params = gate_params_->f32() + layer * c.num_kv_heads * gate_param_floats_;
      g.params_stride = gate_param_floats_;
      g.keys = cand_k_raw_->f32() + m * d;
      g.keys_head_stride = head_stride;
      g.key_stride = d;
      g.y = scores + m;
      g.y_stride = cand_capacity_;
      SNAPFILL_RETURN_IF_ERROR(backend_->GateScores(g));
    }
    telemetry_.score_seconds += watch.Seconds();
    return absl::OkStatus();
  };
  auto select = [&]() -> absl::Status {
    if (question) {
      SNAPFILL_RETURN_IF_ERROR(QuestionVotes(c, voter_q, q_stride, voters, voter_seen, view, final_step,
                                             query_votes_.data(), query_lse_.data()));
    }
    if (stored_scores) {  // the memory's stored scores, then the chunk's
      gathers.clear();
      for (int64_t h = 0; h < c.num_kv_heads; ++h) {
        gathers.push_back({mem_score_[h], sizeof(float), nullptr, votes_.data() + h * cand_capacity_, sizeof(float), m,
                           sizeof(float)});
      }
      SNAPFILL_RETURN_IF_ERROR(backend_->Gather(gathers));
      SNAPFILL_RETURN_IF_ERROR(chunk_scores(votes_.data(), query_lse_.data(), /*host_rows=*/true));
      in.votes = votes_.data();
      in.votes_stride = cand_capacity_;
    } else if (pruner_->needs_votes() && !(question && config_.pruner.query_share >= 1.0)) {
      SNAPFILL_RETURN_IF_ERROR(window_votes(votes_.data()));
      in.votes = votes_.data();
      in.votes_stride = cand_capacity_;
    }
    SNAPFILL_RETURN_IF_ERROR(pruner_->Select(in, &keep_));
    return absl::OkStatus();
  };
  // SnapKV's rule as one backend op where it is one (DESIGN.md §14): the
  // votes and the kept indices stay in the backend's memory, the kept rows
  // are gathered by them there, and the positions and the telemetry follow
  // at the chunk's end (ApplyBackendSelections). Not at the step that
  // recalls: Recall reads this layer's memory on the host.
  Backend::HeadSelection op;
  const bool recalls = final_step && config_.recall_budget > 0;
  const bool in_backend = !local && sel_keep_ != nullptr && !recalls && pruner_->PlanInBackend(in, &op);
  int32_t* const keep_rows = in_backend ? KeepRows(layer) : nullptr;
  if (local) {
    const int64_t keep = std::min(window_capacity_, num);
    keep_.resize(c.num_kv_heads);
    for (std::vector<int32_t>& k : keep_) {
      k.resize(keep);
      std::iota(k.begin(), k.end(), static_cast<int32_t>(num - keep));
    }
  } else if (!in_backend) {
    SNAPFILL_RETURN_IF_ERROR(select());
  }
  const int64_t kept = in_backend ? op.count() : static_cast<int64_t>(keep_[0].size());
  if (kept > (local ? window_capacity_ : prefill_capacity_)) {
    return absl::InternalError(absl::StrCat("layer ", layer, " keeps ", kept, " entries, memory holds ",
                                            local ? window_capacity_ : prefill_capacity_));
  }
  if (in_backend) {  // (its rows hold prefill_capacity_ indices, checked above)
    // The question's votes where it asks one (the window's after them where
    // they pick second), the stored scores (the memory's gathered above)
    // for gate and reconstruct, else the window's.
    SNAPFILL_RETURN_IF_ERROR(question        ? QuestionVotes(c, voter_q, q_stride, voters, voter_seen, view, final_step,
                                                             sel_votes_->f32(), sel_lse_)
                             : stored_scores ? chunk_scores(sel_votes_->f32(), sel_lse_, /*host_rows=*/false)
                                             : window_votes(sel_votes_->f32()));
    if (op.then_pick > 0) {  // (the buffer's second row: SelectionVoteRows)
      float* const then_votes = sel_votes_->f32() + c.num_kv_heads * cand_capacity_;
      SNAPFILL_RETURN_IF_ERROR(window_votes(then_votes));
      op.then_votes = then_votes;
      op.then_votes_stride = cand_capacity_;
    }
    op.votes = sel_votes_->f32();
    op.votes_stride = cand_capacity_;
    if (question && config_.pruner.shared_query_votes && c.num_kv_heads > 1) {
      // (--query_heads shared: head 0's row becomes the heads' sum, in
      // head order as the pruner sums them, and every head reads it.)
      for (int64_t h = 1; h < c.num_kv_heads; ++h) {
        SNAPFILL_RETURN_IF_ERROR(backend_->Add(sel_votes_->f32(), sel_votes_->f32() + h * cand_capacity_, num));
      }
      op.votes_stride = 0;
    }
    op.keep = keep_rows;
    op.keep_stride = keep_stride_;
    SNAPFILL_RETURN_IF_ERROR(backend_->SelectHeads(op));
  } else {
    for (int64_t h = 0; h < c.num_kv_heads; ++h) SNAPFILL_CHECK(static_cast<int64_t>(keep_[h].size()) == kept);
  }
  // The kept entries into the memory, through the backend as in step 1
  // (the candidates are a separate buffer).
  gathers.clear();
  for (int64_t h = 0; h < c.num_kv_heads; ++h) {
    const int32_t* keep = in_backend ? keep_rows + h * keep_stride_ : keep_[h].data();
    gathers.push_back({cand_k_raw_->f32() + h * head_stride, row, keep, mem_k_[h], row, kept, row});
    gathers.push_back({cand_v_->f32() + h * head_stride, row, keep, mem_v_[h], row, kept, row});
    // The kept entries' scores into the backend's copy of the memory's
    // (their host copy follows at the chunk's end), or from the host's votes.
    if (scores_row != nullptr) {
      gathers.push_back({in_backend ? scores_row + h * cand_capacity_ : votes_.data() + h * cand_capacity_,
                         sizeof(float), keep, StoredScoreRows(layer) + h * keep_stride_, sizeof(float), kept,
                         sizeof(float)});
    }
    if (in_backend) continue;
    gathers.push_back({cand_pos_.data() + h * cand_capacity_, sizeof(int32_t), keep, mem_pos_[h], sizeof(int32_t),
                       kept, sizeof(int32_t)});
    if (mem_score_[h] == nullptr) continue;
    if (local) {
      // (A local layer's entries have no scores: nothing ranks them.)
      std::fill(mem_score_[h], mem_score_[h] + kept, 0.0f);
    } else {
      gathers.push_back({votes_.data() + h * cand_capacity_, sizeof(float), keep, mem_score_[h], sizeof(float), kept,
                         sizeof(float)});
    }
  }
  SNAPFILL_RETURN_IF_ERROR(backend_->Gather(gathers));
  memory_->set_size(layer, kept);
  telemetry_.memory[layer] = kept;
  int64_t& length = local ? telemetry_.window_attention_length : telemetry_.attention_length;
  length = std::max(length, num);
  if (in_backend) {
    pending_memory_[layer] = m;
    ++telemetry_.backend_selections;
    // The recall tier: the evicted rows go to the store a layer behind.
    if (recall_store_ != nullptr && kept < num) SNAPFILL_RETURN_IF_ERROR(QueueEvicted(layer, num, kept, keep_rows));
    return absl::OkStatus();
  }
  kept_rows_.resize(c.num_kv_heads);
  for (int64_t h = 0; h < c.num_kv_heads; ++h) kept_rows_[h] = keep_[h].data();
  CountKept(layer, m, kept_rows_.data());

  // 5. The recall tier: what this step evicted goes to the store, and at
  //    the last step the question brings back what it attends to most.
  if (RecallStore* store = recall_store_; store != nullptr && kept < num && !local) {
    evict_.resize(c.num_kv_heads);
    std::vector<const int32_t*> lists(c.num_kv_heads);
    for (int64_t h = 0; h < c.num_kv_heads; ++h) {
      std::vector<int32_t>& e = evict_[h];
      e.clear();
      int64_t t = 0;
      for (int32_t j = 0; j < num; ++j) {
        if (t < kept && keep_[h][t] == j) {
          ++t;
        } else {
          e.push_back(j);
        }
      }
      lists[h] = e.data();
    }
    // (Every head's candidates, [0, num) of each, where the host reads a copy.)
    const int64_t span = (c.num_kv_heads - 1) * head_stride + num * d;
    SNAPFILL_ASSIGN_OR_RETURN(const float* k_all, HostFloats(*cand_k_raw_, 0, span, host_k_));
    SNAPFILL_ASSIGN_OR_RETURN(const float* v_all, HostFloats(*cand_v_, 0, span, host_v_));
    SNAPFILL_RETURN_IF_ERROR(store->Append(layer, num - kept, lists.data(), k_all, v_all, head_stride,
                                           cand_pos_.data(), cand_capacity_));
  }
  if (final_step && config_.recall_budget > 0 && question) {
    SNAPFILL_RETURN_IF_ERROR(Recall(layer, voter_q, q_stride, voters, voter_seen));
  }
  return absl::OkStatus();
}

absl::Status PrefillEngineImpl::QueueEvicted(int64_t layer, int64_t num, int64_t kept, const int32_t* keep_rows) {
  const LlamaConfig& c = model_.config();
  const int64_t heads = c.num_kv_heads, d = c.head_dim, e = num - kept;
  const size_t row = d * sizeof(float);
  // Packed by e: every head's indices ([heads][e]), then the keys and the
  // values in the store's slot order ([e][heads] records: slot i holds each
  // head's i-th evicted row), so that the host writes them where they land,
  // with no gather or conversion of its own. The rows are gathered as f32
  // further on and converted into the store's format here.
  const RecallFormat format = config_.recall_format;
  int32_t* rows = static_cast<int32_t*>(evicted_->data());
  float* k = reinterpret_cast<float*>(static_cast<char*>(evicted_->data()) +
                                      EvictedF32Offset(heads, d, cand_capacity_, format));
  float* v = k + heads * e * d;
  SNAPFILL_RETURN_IF_ERROR(backend_->Complement(keep_rows, keep_stride_, kept, heads, num, rows, e));
  gathers_.clear();
  for (int64_t h = 0; h < heads; ++h) {
    const int64_t from = h * cand_capacity_ * d;
    gathers_.push_back({cand_k_raw_->f32() + from, row, rows + h * e, k + h * d, heads * row, e, row});
    gathers_.push_back({cand_v_->f32() + from, row, rows + h * e, v + h * d, heads * row, e, row});
  }
  SNAPFILL_RETURN_IF_ERROR(backend_->Gather(gathers_));
  // (The keys and then the values, heads · e vectors each, lie one after
  // the other as their records do: one call converts both.)
  auto* records = reinterpret_cast<uint8_t*>(rows + heads * e);
  if (format == RecallFormat::kF16) {
    SNAPFILL_RETURN_IF_ERROR(backend_->ToHalfInBuffers(k, reinterpret_cast<uint16_t*>(records), 2 * heads * e * d));
  } else {
    SNAPFILL_RETURN_IF_ERROR(backend_->ToInt8RowsInBuffers(k, records, 2 * heads * e, d));
  }
  // The older slot's layer to the store first (its copy was queued a layer
  // ago, so this waits for little); the backend's queue orders this
  // layer's gathers after that copy's reads.
  EvictSlot& slot = evict_slots_[next_evict_slot_];
  next_evict_slot_ ^= 1;
  SNAPFILL_RETURN_IF_ERROR(StoreSlot(slot));
  slot.layer = layer;
  slot.num = num;
  slot.count = e;
  for (int64_t h = 0; h < heads; ++h) {
    std::copy(cand_pos_.data() + h * cand_capacity_, cand_pos_.data() + h * cand_capacity_ + num,
              slot.cand_pos.data() + h * num);
  }
  SNAPFILL_ASSIGN_OR_RETURN(
      slot.fence, backend_->DownloadAsync(evicted_->data(), slot.host->host(), EvictedHostBytes(heads, d, e, format)));
  return absl::OkStatus();
}

absl::Status PrefillEngineImpl::StoreSlot(EvictSlot& slot) {
  if (slot.layer < 0) return absl::OkStatus();
  const int64_t layer = slot.layer;
  slot.layer = -1;
  SNAPFILL_RETURN_IF_ERROR(backend_->WaitDownload(slot.fence));
  const LlamaConfig& c = model_.config();
  const int64_t heads = c.num_kv_heads, d = c.head_dim, e = slot.count, num = slot.num;
  const auto* rows = static_cast<const int32_t*>(slot.host->host());
  // The positions in the store's slot order, as the keys and values are.
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t i = 0; i < e; ++i) {
      const int32_t r = rows[h * e + i];
      if (r < 0 || r >= num) {
        return absl::InternalError(
            absl::StrCat("layer ", layer, " evicted candidate ", r, " of ", num, " (KV head ", h, ")"));
      }
      evict_pos_[i * heads + h] = slot.cand_pos[h * num + r];
    }
  }
  const auto* k = reinterpret_cast<const uint8_t*>(rows + heads * e);
  return recall_store_->AppendRecords(layer, e, evict_pos_.data(), k,
                                      k + heads * e * RecallVectorBytes(config_.recall_format, d));
}

absl::Status PrefillEngineImpl::StoreQueuedEvictions() {
  SNAPFILL_RETURN_IF_ERROR(StoreSlot(evict_slots_[next_evict_slot_]));
  return StoreSlot(evict_slots_[next_evict_slot_ ^ 1]);
}

absl::Status PrefillEngineImpl::QuestionVotes(const LlamaConfig& c, const float* q, int64_t q_stride, int64_t num_q,
                                              const KvView& seen, const KvView& view, bool final_step, float* votes,
                                              float* lse) {
  const Queries queries = LlamaQueries(c, q, q_stride, num_q);
  if (config_.pruner.query_votes == QueryVotes::kSum) {
    return backend_->WindowScores(queries, seen, votes, cand_capacity_);
  }
  // The largest softmax weight: each query's denominator over what it saw,
  // then every candidate all the queries see. After the chunk that is every
  // candidate; at the last step the queries' own keys (the candidates' last
  // num_q) are not seen by the queries before them, and get the largest
  // vote there is, 1, so the question the decoder goes on from stays whole.
  SNAPFILL_RETURN_IF_ERROR(backend_->QueryLogSumExp(queries, seen, lse));
  KvView keys = view;
  if (final_step) keys.num_keys -= num_q;
  SNAPFILL_RETURN_IF_ERROR(backend_->RecallScores(queries, lse, keys, votes, cand_capacity_, /*max_weight=*/true));
  if (final_step) {
    for (int64_t h = 0; h < c.num_kv_heads; ++h) {
      SNAPFILL_RETURN_IF_ERROR(backend_->Fill(votes + h * cand_capacity_ + keys.num_keys, num_q, 1.0f));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<const float*> PrefillEngineImpl::HostFloats(BackendBuffer& b, int64_t first, int64_t count,
                                                           std::vector<float>& staging) {
  if (const void* host = b.host(); host != nullptr) return static_cast<const float*>(host) + first;
  if (static_cast<int64_t>(staging.size()) < count) staging.resize(count);
  SNAPFILL_RETURN_IF_ERROR(backend_->Download(b.f32() + first, staging.data(), count * sizeof(float)));
  return staging.data();
}

int32_t* PrefillEngineImpl::KeepRows(int64_t layer) const {
  return static_cast<int32_t*>(sel_keep_->data()) + global_index_[layer] * model_.config().num_kv_heads * keep_stride_;
}

float* PrefillEngineImpl::StoredScoreRows(int64_t layer) const {
  return sel_scores_->f32() + global_index_[layer] * model_.config().num_kv_heads * keep_stride_;
}

absl::Status PrefillEngineImpl::UploadScores() {
  if (sel_scores_ == nullptr) return absl::OkStatus();
  const LlamaConfig& c = model_.config();
  gathers_.clear();
  for (int64_t l = 0; l < c.num_layers; ++l) {
    if (global_index_[l] < 0) continue;
    const int64_t size = memory_->size(l);
    if (size >= keep_stride_) {
      return absl::InternalError(
          absl::StrCat("layer ", l, " holds ", size, " entries, the prefill keeps at most ", keep_stride_ - 1));
    }
    for (int64_t h = 0; h < c.num_kv_heads; ++h) {
      gathers_.push_back({memory_->score(l, h), sizeof(float), nullptr, StoredScoreRows(l) + h * keep_stride_,
                          sizeof(float), size, sizeof(float)});
    }
  }
  return backend_->Gather(gathers_);
}

absl::Status PrefillEngineImpl::ApplyBackendSelections() {
  const LlamaConfig& c = model_.config();
  // The global layers whose selection the backend made this chunk: their
  // kept indices come to the host in one copy (one wait for a device).
  int64_t first = -1, last = -1;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    if (pending_memory_[l] < 0) continue;
    if (first < 0) first = global_index_[l];
    last = global_index_[l];
  }
  if (first < 0) return absl::OkStatus();
  const int64_t layer_words = c.num_kv_heads * keep_stride_;
  const int64_t words = (last - first + 1) * layer_words;
  const int32_t* rows = nullptr;
  if (const void* host = sel_keep_->host(); host != nullptr) {
    rows = static_cast<const int32_t*>(host) + first * layer_words;
  } else {
    host_keep_.resize(words);
    SNAPFILL_RETURN_IF_ERROR(backend_->Download(static_cast<const int32_t*>(sel_keep_->data()) + first * layer_words,
                                                host_keep_.data(), words * sizeof(int32_t)));
    rows = host_keep_.data();
  }
  // The kept entries' stored scores likewise (gate, reconstruct).
  const float* scores = nullptr;
  if (sel_scores_ != nullptr) {
    const float* first_row = sel_scores_->f32() + first * layer_words;
    if (sel_scores_->host() != nullptr) {
      scores = first_row;
    } else {
      host_scores_.resize(words);
      SNAPFILL_RETURN_IF_ERROR(backend_->Download(first_row, host_scores_.data(), words * sizeof(float)));
      scores = host_scores_.data();
    }
  }
  const int64_t start = plan_.steps[step_].start_token;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const int64_t m = pending_memory_[l], kept = memory_->size(l);
    if (m < 0) continue;
    pending_memory_[l] = -1;
    kept_rows_.resize(c.num_kv_heads);
    for (int64_t h = 0; h < c.num_kv_heads; ++h) {
      const int32_t* keep = rows + (global_index_[l] - first) * layer_words + h * keep_stride_;
      kept_rows_[h] = keep;
      if (keep[kept] >= 0) {
        return absl::InternalError(absl::StrCat("SnapKV: the vote of layer ", l, ", KV head ", h, ", candidate ",
                                                keep[kept], " is not finite"));
      }
      // The kept entries' positions, in place: candidate j < m is memory
      // entry j, later ones the chunk's; ascending indices never read an
      // entry this loop has written.
      int32_t* pos = memory_->pos(l, h);
      for (int64_t t = 0; t < kept; ++t) {
        const int32_t j = keep[t];
        pos[t] = j < m ? pos[j] : static_cast<int32_t>(start + (j - m));
      }
      if (scores != nullptr) {
        const float* row = scores + (global_index_[l] - first) * layer_words + h * keep_stride_;
        std::copy(row, row + kept, memory_->score(l, h));
      }
    }
    CountKept(l, m, kept_rows_.data());
  }
  return absl::OkStatus();
}

void PrefillEngineImpl::CountKept(int64_t layer, int64_t m, const int32_t* const* keep) {
  const int64_t kept = memory_->size(layer);
  double retained = 0;
  std::vector<int64_t>& origin = telemetry_.origin[layer];
  for (int64_t h = 0; h < model_.config().num_kv_heads; ++h) {
    const int32_t* pos = memory_->pos(layer, h);
    int64_t from_memory = 0;
    for (int64_t t = 0; t < kept; ++t) {
      from_memory += keep[h][t] < m;
      origin[ChunkOf(pos[t])]++;
    }
    retained += kept > 0 ? static_cast<double>(from_memory) / kept : 0.0;
  }
  telemetry_.retention[layer] = retained / model_.config().num_kv_heads;
}

absl::Status PrefillEngineImpl::Recall(int64_t layer, const float* q, int64_t q_stride, int64_t num_q,
                                   const KvView& seen) {
  Stopwatch watch;
  if (recaller_ == nullptr) recaller_ = std::make_unique<Recaller>(backend_, model_.config());
  const RecallOptions options = RecallOptionsFor(config_, config_.recall_budget);
  SNAPFILL_ASSIGN_OR_RETURN(const int64_t added, recaller_->RecallLayer(*recall_store_, layer, q, q_stride,
                                                                        num_q, seen, options, *memory_,
                                                                        /*rotated=*/false));
  telemetry_.memory[layer] = memory_->size(layer);
  telemetry_.recalled = std::max(telemetry_.recalled, added);
  telemetry_.recall_seconds += watch.Seconds();
  return absl::OkStatus();
}

}  // namespace snapfill
