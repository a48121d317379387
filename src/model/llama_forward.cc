#include "src/model/llama_forward.h"

#include <algorithm>
#include <cmath>
#include <new>

#include "absl/strings/str_cat.h"
#include "snapfill/status.h"

namespace snapfill {
namespace {

uint64_t Bytes(const WeightView& w) { return static_cast<uint64_t>(w.rows) * w.row_bytes; }

}  // namespace

LlamaForward::LlamaForward(const LlamaModel& model, Backend* backend, int64_t max_tokens)
    : model_(model), backend_(backend), max_tokens_(max_tokens) {}

absl::StatusOr<std::unique_ptr<LlamaForward>> LlamaForward::Create(const LlamaModel& model,
                                                                   Backend* backend,
                                                                   int64_t max_tokens) {
  if (max_tokens <= 0 || max_tokens > (int64_t{1} << 20)) {
    return absl::InvalidArgumentError(absl::StrCat("batch size ", max_tokens,
                                                   " must be in [1, 2^20]"));
  }
  std::unique_ptr<LlamaForward> f(new LlamaForward(model, backend, max_tokens));
  const LlamaConfig& c = model.config();
  const int64_t qd = c.num_heads * c.head_dim, kvd = c.num_kv_heads * c.head_dim;
  // In the backend's memory (a device's, where it computes on one): only
  // the backend's ops touch them.
  const std::pair<std::unique_ptr<BackendBuffer>*, int64_t> buffers[] = {
      {&f->x_, c.model_dim}, {&f->xn_, c.model_dim}, {&f->q_, qd},         {&f->attn_, qd},
      {&f->k_, kvd},         {&f->v_, kvd},          {&f->gate_, c.ffn_dim}, {&f->up_, c.ffn_dim}};
  for (const auto& [buffer, width] : buffers) {
    absl::StatusOr<std::unique_ptr<BackendBuffer>> b =
        backend->NewBuffer(static_cast<uint64_t>(max_tokens * width) * sizeof(float));
    if (!b.ok()) {
      return absl::ResourceExhaustedError(absl::StrCat("cannot allocate activations for ", max_tokens,
                                                       " tokens: ", b.status().message()));
    }
    *buffer = std::move(*b);
  }
  return f;
}

uint64_t LlamaForward::ScratchBytes(const LlamaConfig& c, int64_t max_tokens, bool fused_layers,
                                    bool batch_logits) {
  const uint64_t xn = fused_layers && !batch_logits ? 0 : c.model_dim;
  const uint64_t ffn = fused_layers ? 0 : 2 * c.ffn_dim;
  const uint64_t per_token = c.model_dim + xn + 2 * c.num_heads * c.head_dim + 2 * c.num_kv_heads * c.head_dim + ffn;
  return per_token * max_tokens * sizeof(float);
}

bool LlamaForward::FusesLayers(const LlamaModel& model, const Backend& backend, int64_t m) {
  // Gemma's blocks run step by step (post-norms, GELU): they use the scratch.
  if (model.config().post_norms || model.config().gelu) return false;
  for (int64_t l = 0; l < model.config().num_layers; ++l) {
    const LlamaLayerWeights& w = model.layer(l);
    const Backend::LayerProducts p{&w.wq, &w.wk, &w.wv, &w.wo, &w.w_gate, &w.w_up, &w.w_down};
    if (!backend.FusesLayer(p, m)) return false;
  }
  return model.config().num_layers > 0;
}

void LlamaForward::ReleaseRowsFrom(int64_t rows) {
  if (rows >= touched_rows_) {
    touched_rows_ = rows;
    return;
  }
  const LlamaConfig& c = model_.config();
  const int64_t qd = c.num_heads * c.head_dim, kvd = c.num_kv_heads * c.head_dim;
  constexpr uint64_t f = sizeof(float);
  x_->ReleaseFrom(rows * c.model_dim * f);
  xn_->ReleaseFrom(rows * c.model_dim * f);
  q_->ReleaseFrom(rows * qd * f);
  attn_->ReleaseFrom(rows * qd * f);
  k_->ReleaseFrom(rows * kvd * f);
  v_->ReleaseFrom(rows * kvd * f);
  gate_->ReleaseFrom(rows * c.ffn_dim * f);
  up_->ReleaseFrom(rows * c.ffn_dim * f);
  touched_rows_ = rows;
}

uint64_t LlamaForward::scratch_bytes() const {
  return x_->bytes() + xn_->bytes() + q_->bytes() + attn_->bytes() + k_->bytes() + v_->bytes() + gate_->bytes() +
         up_->bytes();
}

absl::StatusOr<std::unique_ptr<KvCache>> LlamaForward::NewKvCache(int64_t capacity) const {
  const LlamaConfig& c = model_.config();
  return KvCache::Create({c.num_layers, c.num_kv_heads, c.head_dim, capacity});
}

void LlamaForward::PrepareDecode() {
  decode_prepared_ = true;
  SettleWeights(/*decode=*/true);
}

void LlamaForward::PrepareBatch() {
  batch_prepared_ = true;
  SettleWeights(/*decode=*/false);
}

std::vector<LlamaForward::Placement> LlamaForward::Placements(const LlamaModel& model,
                                                              const Backend& backend, bool decode) {
  const WeightView& embd = model.token_embd();
  const WeightUse use = decode ? WeightUse::kDecode : WeightUse::kBatch;
  // token_embd first: the lookups always read its rows in place.
  std::vector<Placement> out = {{&embd, WeightCopy{}, /*shares_embd=*/false}};
  for (const WeightView* w : model.DecodeMatrices()) {
    out.push_back({w, backend.CopyOf(*w, use), w->data == embd.data});
  }
  return out;
}

void LlamaForward::SettleWeights(bool decode) {
  const GgufFile& file = model_.gguf();
  const std::vector<Placement> placements = Placements(model_, *backend_, decode);
  // What is read in place is mapped whole first; the copies are then read
  // with pread and their ranges given back last, which also drops any page
  // of theirs that a neighbour's populate mapped.
  std::vector<const Placement*> copies;
  std::vector<const WeightView*> weights;
  for (const Placement& p : placements) {
    if (!p.copy.copied) {
      file.Populate(p.w->data, Bytes(*p.w));
    } else {
      copies.push_back(&p);
      weights.push_back(p.w);
    }
  }
  const std::vector<bool> made = backend_->PrepareWeights(
      weights, decode ? WeightUse::kDecode : WeightUse::kBatch, [&](size_t i, const void* data, size_t n) {
        // A tied output head's bytes are token_embd's, whose rows the
        // lookups keep reading in place.
        if (!copies[i]->shares_embd) file.ReleasePages(data, n);
      });
  for (size_t i = 0; i < weights.size(); ++i) {
    if (!made[i]) file.Populate(weights[i]->data, Bytes(*weights[i]));
  }
}

uint64_t LlamaForward::ResidentWeightBytes(const LlamaModel& model, const Backend& backend,
                                           bool decode) {
  uint64_t total = model.copied_vector_bytes();
  for (const Placement& p : Placements(model, backend, decode)) {
    if (p.copy.copied) {
      // A GPU's copies are in its own memory, not the host's.
      if (!p.copy.on_device) total += p.copy.bytes;
    } else if (!p.shares_embd) {
      total += Bytes(*p.w);
    }
  }
  return total;
}

uint64_t LlamaForward::DeviceWeightBytes(const LlamaModel& model, const Backend& backend) {
  // (A device's batches and one-token steps read the same copy.)
  uint64_t total = 0;
  for (const Placement& p : Placements(model, backend, /*decode=*/false)) {
    if (p.copy.on_device) total += p.copy.bytes;
  }
  return total == 0 ? 0 : total + model.copied_vector_bytes();
}

absl::Status LlamaForward::Forward(const int32_t* tokens, int64_t n, const int32_t* pos,
                                   KvCache& kv, int64_t num_logits, float* logits) {
  if (n <= 0) return absl::InvalidArgumentError("forward: no tokens");
  if (num_logits < 0 || num_logits > n) {
    return absl::InvalidArgumentError(absl::StrCat("forward: ", num_logits,
                                                   " logits asked for ", n, " tokens"));
  }
  if (n == 1 && !decode_prepared_) PrepareDecode();
  const int64_t vocab = model_.config().vocab_size;
  for (int64_t start = 0; start < n; start += max_tokens_) {
    const int64_t len = std::min(max_tokens_, n - start);
    // Logits rows of this piece: those among the last num_logits of the batch.
    const int64_t first_logit = n - num_logits;
    const int64_t piece_logits = std::max<int64_t>(0, start + len - std::max(first_logit, start));
    float* piece_out = piece_logits > 0
                           ? logits + (start + len - piece_logits - first_logit) * vocab
                           : nullptr;
    SNAPFILL_RETURN_IF_ERROR(
        ForwardBatch(tokens + start, len, pos + start, kv, piece_logits, piece_out));
  }
  return absl::OkStatus();
}

absl::Status LlamaForward::ForwardBatch(const int32_t* tokens, int64_t n, const int32_t* pos,
                                        KvCache& kv, int64_t num_logits, float* logits) {
  const LlamaConfig& c = model_.config();
  Backend& b = *backend_;
  // Plain causal attention over the cache: rotate, append, attend.
  auto attend = [&](int64_t l, float* q, int64_t q_stride, float* k, float* v, int64_t kv_stride,
                    int64_t n, int64_t out_rows, float* out) -> absl::Status {
    SNAPFILL_RETURN_IF_ERROR(b.Rope(q, n, c.num_heads, c.head_dim, q_stride, pos, c.rope(l)));
    SNAPFILL_RETURN_IF_ERROR(b.Rope(k, n, c.num_kv_heads, c.head_dim, kv_stride, pos, c.rope(l)));
    // The new entries' K and V, copied from the activations by the backend.
    SNAPFILL_ASSIGN_OR_RETURN(const KvCache::Slots slots, kv.AppendSlots(l, n, pos));
    const size_t row = c.head_dim * sizeof(float), stride = kv_stride * sizeof(float);
    std::vector<Backend::RowGather>& copies = kv_copies_;  // (its capacity kept from step to step)
    copies.clear();
    for (int64_t h = 0; h < c.num_kv_heads; ++h) {
      copies.push_back({k + h * c.head_dim, stride, nullptr, slots.k[h], row, n, row});
      copies.push_back({v + h * c.head_dim, stride, nullptr, slots.v[h], row, n, row});
    }
    SNAPFILL_RETURN_IF_ERROR(b.Gather(copies));
    bool half = false;
    if (n == 1 && b.HalfDecodeKv() && !kv.half_overflow() && kv.on_host()) {
      // Decode reads the fp16 copy, which replaces the f32 entries: the
      // whole layer at the first step, the token just appended after.
      // (A batch, or anything else that reads f32, widens them back.)
      SNAPFILL_RETURN_IF_ERROR(kv.SyncHalf(
          l, [&b](const float* x, uint16_t* y, int64_t count) { b.ToHalf(x, y, count); }, /*release_f32=*/true));
      // An entry too large for fp16: this and every later step read f32.
      half = !kv.half_overflow();
    }
    // The last out_rows queries (the cache's last positions, as the batch's).
    if (out_rows == 0) return absl::OkStatus();
    const int64_t skip = n - out_rows, size = kv.size(l);
    const KvView all = half ? kv.HalfView(l, size) : kv.View(l, size);
    // A local layer's query of entry a sees [a - w + 1, a] (the cache holds
    // consecutive positions in a local layer, as llama.cpp's SWA cache
    // does; its mask counts positions).
    Queries queries = LlamaQueries(c, q, q_stride, n);
    if (c.IsLocal(l)) queries.window = c.sliding_window;
    return b.Attention(queries.From(skip), all, out + skip * q_stride, q_stride);
  };
  // Final hidden states only for the rows whose logits are asked for.
  // (llama.cpp 84f7129's last layer drops the other rows after its
  // attention and Wo, before the feed-forward block; here before all three.)
  return RunLayers(tokens, n, attend, num_logits, logits, /*hidden_rows=*/num_logits);
}

absl::Status LlamaForward::ForwardWithAttention(const int32_t* tokens, int64_t n,
                                                const AttendFn& attend, int64_t num_logits,
                                                float* logits, int64_t hidden_rows) {
  if (n <= 0 || n > max_tokens_) {
    return absl::InvalidArgumentError(absl::StrCat("forward: ", n, " tokens, batch holds ",
                                                   max_tokens_));
  }
  if (num_logits < 0 || num_logits > n) {
    return absl::InvalidArgumentError(absl::StrCat("forward: ", num_logits,
                                                   " logits asked for ", n, " tokens"));
  }
  if (hidden_rows < num_logits || hidden_rows > n) {
    return absl::InvalidArgumentError(absl::StrCat("forward: final hidden states of ", hidden_rows,
                                                   " rows asked for ", n, " tokens and ",
                                                   num_logits, " logits"));
  }
  return RunLayers(tokens, n, attend, num_logits, logits, hidden_rows);
}

absl::Status LlamaForward::BatchLogits(int64_t first, int64_t rows, float* logits) {
  if (first < 0 || rows <= 0 || first + rows > last_batch_) {
    return absl::InvalidArgumentError(absl::StrCat("forward: logits of rows [", first, ", ",
                                                   first + rows, ") asked for a batch of ",
                                                   last_batch_));
  }
  if (first < hidden_first_) {
    return absl::InvalidArgumentError(absl::StrCat("forward: logits of row ", first,
                                                   ", but the batch kept the final hidden states of rows [",
                                                   hidden_first_, ", ", last_batch_, ") only"));
  }
  const LlamaConfig& c = model_.config();
  const int64_t dim = c.model_dim;
  Backend& b = *backend_;
  SNAPFILL_RETURN_IF_ERROR(b.RmsNorm(x_->f32() + first * dim, dim, model_.output_norm(),
                                     xn_->f32(), dim, rows, dim, c.rms_eps));
  return b.MatMul(xn_->f32(), rows, dim, model_.output(), logits, c.vocab_size);
}

template <typename Attend>
absl::Status LlamaForward::RunLayers(const int32_t* tokens, int64_t n, const Attend& attend,
                                     int64_t num_logits, float* logits, int64_t hidden_rows) {
  const LlamaConfig& c = model_.config();
  const int64_t dim = c.model_dim;
  const int64_t q_dim = c.num_heads * c.head_dim;
  const int64_t kv_dim = c.num_kv_heads * c.head_dim;
  Backend& b = *backend_;
  if (n > 1) {
    if (!batch_prepared_) PrepareBatch();
    decode_prepared_ = false;  // the batch may map the file's pages again
  }
  ReleaseRowsFrom(n);

  SNAPFILL_RETURN_IF_ERROR(b.GetRows(model_.token_embd(), tokens, n, x_->f32(), dim));
  if (c.embedding_scale > 0) SNAPFILL_RETURN_IF_ERROR(b.Scale(x_->f32(), n * dim, c.embedding_scale));

  for (int64_t l = 0; l < c.num_layers; ++l) {
    const LlamaLayerWeights& w = model_.layer(l);
    // Attention block. Layers run in order because each reads the residual
    // stream the previous one wrote.
    // Q, K and V of the normalized rows (the norm folded into the products'
    // reading of x where the backend does that; else through xn).
    const Backend::SharedOut qkv[3] = {{&w.wq, q_->f32(), q_dim}, {&w.wk, k_->f32(), kv_dim},
                                       {&w.wv, v_->f32(), kv_dim}};
    SNAPFILL_RETURN_IF_ERROR(
        b.NormMatMulShared(x_->f32(), n, dim, Backend::Norm{w.attn_norm, c.rms_eps, xn_->f32(), dim}, qkv, 3));
    // Qwen's and Gemma's variations, before RoPE (the attention step's
    // input): biases, then an RMSNorm over each head of Q and K (in place:
    // each row of head_dim floats, the heads of a token contiguous).
    if (c.qkv_bias) {
      SNAPFILL_RETURN_IF_ERROR(b.AddRows(q_->f32(), q_dim, w.bq, n, q_dim));
      SNAPFILL_RETURN_IF_ERROR(b.AddRows(k_->f32(), kv_dim, w.bk, n, kv_dim));
      SNAPFILL_RETURN_IF_ERROR(b.AddRows(v_->f32(), kv_dim, w.bv, n, kv_dim));
    }
    if (c.qk_norm) {
      SNAPFILL_RETURN_IF_ERROR(
          b.RmsNorm(q_->f32(), c.head_dim, w.q_norm, q_->f32(), c.head_dim, n * c.num_heads, c.head_dim, c.rms_eps));
      SNAPFILL_RETURN_IF_ERROR(b.RmsNorm(k_->f32(), c.head_dim, w.k_norm, k_->f32(), c.head_dim,
                                         n * c.num_kv_heads, c.head_dim, c.rms_eps));
    }
    // Every row's K and V (and the queries, which the attention step may
    // read for more than the outputs, e.g. SnapKV's window), but past this
    // point the last layer needs only the rows whose hidden states are kept.
    const int64_t r0 = l + 1 == c.num_layers ? n - hidden_rows : 0, rows = n - r0;
    SNAPFILL_RETURN_IF_ERROR(attend(l, q_->f32(), q_dim, k_->f32(), v_->f32(), kv_dim, n, rows, attn_->f32()));
    if (rows == 0) continue;
    float* x = x_->f32() + r0 * dim;
    float* xn = xn_->f32() + r0 * dim;
    // x += attn · Woᵀ: in the product's store where the backend fuses it;
    // Gemma normalizes the block's output first.
    if (c.post_norms) {
      SNAPFILL_RETURN_IF_ERROR(b.MatMul(attn_->f32() + r0 * q_dim, rows, q_dim, w.wo, xn, dim));
      SNAPFILL_RETURN_IF_ERROR(b.RmsNorm(xn, dim, w.attn_post_norm, xn, dim, rows, dim, c.rms_eps));
      SNAPFILL_RETURN_IF_ERROR(b.Add(x, xn, rows * dim));
    } else if (b.FusesResidualAdd(w.wo, rows)) {
      SNAPFILL_RETURN_IF_ERROR(b.MatMulAdd(attn_->f32() + r0 * q_dim, rows, q_dim, w.wo, x, dim));
    } else {
      SNAPFILL_RETURN_IF_ERROR(b.MatMul(attn_->f32() + r0 * q_dim, rows, q_dim, w.wo, xn, dim));
      SNAPFILL_RETURN_IF_ERROR(b.Add(x, xn, rows * dim));
    }

    if (c.gelu || c.post_norms) {
      // Gemma's feed-forward block step by step: GeGLU, and the output
      // normalized before it joins the residual stream.
      SNAPFILL_RETURN_IF_ERROR(b.RmsNorm(x, dim, w.ffn_norm, xn, dim, rows, dim, c.rms_eps));
      const Backend::SharedOut gate_up[2] = {{&w.w_gate, gate_->f32(), c.ffn_dim}, {&w.w_up, up_->f32(), c.ffn_dim}};
      SNAPFILL_RETURN_IF_ERROR(b.MatMulShared(xn, rows, dim, gate_up, 2));
      const int64_t values = rows * c.ffn_dim;
      SNAPFILL_RETURN_IF_ERROR(c.gelu ? b.GeluGlu(gate_->f32(), up_->f32(), gate_->f32(), values)
                                      : b.SwiGlu(gate_->f32(), up_->f32(), gate_->f32(), values));
      SNAPFILL_RETURN_IF_ERROR(b.MatMul(gate_->f32(), rows, c.ffn_dim, w.w_down, xn, dim));
      if (c.post_norms) {
        SNAPFILL_RETURN_IF_ERROR(b.RmsNorm(xn, dim, w.ffn_post_norm, xn, dim, rows, dim, c.rms_eps));
      }
      SNAPFILL_RETURN_IF_ERROR(b.Add(x, xn, rows * dim));
      continue;
    }
    // Feed-forward block (SwiGLU).
    // x += the block's output: in the down projection's store where the
    // backend fuses it, else through xn (which the block has read by then).
    const bool fused_add = b.FusesResidualAdd(w.w_down, rows);
    const Backend::FeedForwardBlock ffn{&w.w_gate, &w.w_up, &w.w_down, Backend::Norm{w.ffn_norm, c.rms_eps, xn, dim},
                                        gate_->f32(), up_->f32(), c.ffn_dim};
    SNAPFILL_RETURN_IF_ERROR(b.FeedForward(x, rows, dim, ffn, fused_add ? x : xn, dim, fused_add));
    if (!fused_add) SNAPFILL_RETURN_IF_ERROR(b.Add(x, xn, rows * dim));
  }

  last_batch_ = n;
  hidden_first_ = n - hidden_rows;
  if (num_logits > 0) {
    const float* last = x_->f32() + (n - num_logits) * dim;
    SNAPFILL_RETURN_IF_ERROR(
        b.RmsNorm(last, dim, model_.output_norm(), xn_->f32(), dim, num_logits, dim, c.rms_eps));
    SNAPFILL_RETURN_IF_ERROR(
        b.MatMul(xn_->f32(), num_logits, dim, model_.output(), logits, c.vocab_size));
  }
  return absl::OkStatus();
}

}  // namespace snapfill
