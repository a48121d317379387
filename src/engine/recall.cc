#include "src/engine/recall.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "snapfill/status.h"
#include "src/model/llama_forward.h"

namespace snapfill {
namespace {

// Stored slots read and scored at a time (every KV head's key of a slot:
// 1.5 MiB of f32 keys at SmolLM2's 3 KV heads).
constexpr int64_t kBlock = 2048;
// The best-scored entries kept per KV head for every one brought back:
// enough peaks to fill the budget even when spans overlap.
constexpr int64_t kPeaksPerEntry = 2;

}  // namespace

RecallOptions RecallOptionsFor(const PrefillConfig& config, int64_t budget) {
  RecallOptions options;
  options.budget = budget;
  options.span = config.pruner.query_select == Selection::kSpan ? config.pruner.span : 0;
  options.original_positions = config.keep_original_positions;
  options.max_weight = config.pruner.query_votes == QueryVotes::kMax;
  return options;
}

RecallStoreInfo RecallShape(const LlamaConfig& config, RecallFormat format) {
  RecallStoreInfo info;
  info.num_layers = config.num_layers;
  info.num_kv_heads = config.num_kv_heads;
  info.head_dim = config.head_dim;
  info.format = format;
  return info;
}

int64_t Recaller::BlockEntries() { return kBlock; }

uint64_t Recaller::ScratchBytes(const LlamaConfig& c, int64_t num_q, int64_t budget, int64_t span) {
  const int64_t peaks = kPeaksPerEntry * budget;
  return kBlock * (c.num_kv_heads * (c.head_dim + 2) + 1) * sizeof(float) + c.num_heads * num_q * sizeof(float) +
         c.num_kv_heads * peaks * (span + 2) * 2 * sizeof(int64_t) +
         c.num_kv_heads * budget * (2 * c.head_dim + 1) * sizeof(float);
}

uint64_t Recaller::QuestionScratchBytes(const LlamaConfig& c, int64_t num_q, const RecallOptions& options) {
  uint64_t bytes = ScratchBytes(c, num_q, options.budget, options.span);
  if (options.summed) {
    // Every layer's peaks, their (position, mass) pairs ranked, and the
    // shared positions' spans in each head's selection.
    const uint64_t peaks = static_cast<uint64_t>(c.num_layers) * c.num_kv_heads * kPeaksPerEntry * options.budget;
    bytes += peaks * (sizeof(Peak) + sizeof(std::pair<int32_t, float>)) +
             c.num_kv_heads * kPeaksPerEntry * options.budget * (options.span + 1) * 2 * sizeof(int64_t);
  }
  return bytes;
}

absl::Status Recaller::ScoreLayer(RecallStore& store, int64_t layer, const float* q, int64_t q_stride, int64_t num_q,
                                  const KvView& seen, const RecallOptions& options, const KvCache& cache,
                                  HeadPeaks* out) {
  const LlamaConfig& c = config_;
  const int64_t d = c.head_dim, heads = c.num_kv_heads;
  const int64_t slots = store.slots(layer);
  const int64_t want = std::min(options.budget, slots);
  const int64_t kept = cache.size(layer);
  HeadPeaks& best = *out;
  best.assign(heads, {});
  if (want <= 0 || num_q <= 0) return absl::OkStatus();
  const bool original = options.original_positions;
  const Queries queries = LlamaQueries(c, q, q_stride, num_q);
  // The question's softmax denominators over what it saw (memory ∪ chunk ∪
  // itself): a stored key's score is the weight it would take among them.
  lse_.resize(c.num_heads * num_q);
  SNAPFILL_RETURN_IF_ERROR(backend_->QueryLogSumExp(queries, seen, lse_.data()));

  // Score every stored key; keep each head's best `peaks` (a min-heap on
  // score, then on higher position: the ranking the pruner uses).
  auto better = [](const Peak& a, const Peak& b) { return a.score > b.score || (a.score == b.score && a.pos < b.pos); };
  const int64_t peaks = std::min(slots, kPeaksPerEntry * want);
  k_.resize(heads * kBlock * d);
  pos_.resize(heads * kBlock);
  rot_.resize(kBlock);
  scores_.resize(heads * kBlock);
  for (int64_t first = 0; first < slots; first += kBlock) {
    const int64_t nb = std::min(kBlock, slots - first);
    SNAPFILL_RETURN_IF_ERROR(store.ReadKeys(layer, first, nb, k_.data(), pos_.data()));
    // (Slot-major: slot i's key of head h at (i * heads + h) * d.)
    for (int64_t h = 0; h < heads; ++h) {
      // Each key at the place it would take among the memory's entries (by
      // its input position), as the decoder will see it; or at its input
      // position where the run keeps those.
      const int32_t* mem_pos = cache.pos(layer, h);
      for (int64_t i = 0; i < nb; ++i) {
        const int32_t p = pos_[i * heads + h];
        rot_[i] = original ? p : static_cast<int32_t>(std::lower_bound(mem_pos, mem_pos + kept, p) - mem_pos);
      }
      SNAPFILL_RETURN_IF_ERROR(backend_->Rope(k_.data() + h * d, nb, 1, d, heads * d, rot_.data(),
                                              c.rope(layer)));
    }
    KvView keys;
    keys.k = k_.data();
    keys.head_stride = d;
    keys.key_stride = heads * d;
    keys.num_keys = nb;
    SNAPFILL_RETURN_IF_ERROR(backend_->RecallScores(queries, lse_.data(), keys, scores_.data(), nb,
                                                    options.max_weight));
    for (int64_t h = 0; h < heads; ++h) {
      std::vector<Peak>& b = best[h];
      for (int64_t i = 0; i < nb; ++i) {
        const Peak p{scores_[h * nb + i], pos_[i * heads + h], first + i};
        if (!std::isfinite(p.score)) {
          return absl::InternalError(absl::StrCat("recall: stored entry ", p.slot, " of layer ", layer,
                                                  " scores ", p.score));
        }
        if (static_cast<int64_t>(b.size()) < peaks) {
          b.push_back(p);
          std::push_heap(b.begin(), b.end(), better);
        } else if (better(p, b.front())) {
          std::pop_heap(b.begin(), b.end(), better);
          b.back() = p;
          std::push_heap(b.begin(), b.end(), better);
        }
      }
    }
  }
  for (std::vector<Peak>& b : best) std::sort(b.begin(), b.end(), better);
  return absl::OkStatus();
}

absl::StatusOr<int64_t> Recaller::MergeLayer(RecallStore& store, int64_t layer, const HeadPeaks& best,
                                             const std::vector<int32_t>& shared, const RecallOptions& options,
                                             KvCache& cache, bool rotated) {
  const LlamaConfig& c = config_;
  const int64_t d = c.head_dim, heads = c.num_kv_heads;
  const int64_t slots = store.slots(layer);
  const int64_t want = std::min(options.budget, slots);
  const int64_t kept = cache.size(layer);
  if (want <= 0 || static_cast<int64_t>(best.size()) != heads || best[0].empty()) return 0;
  if (kept + want > cache.capacity(layer)) {
    return absl::InternalError(absl::StrCat("recall: layer ", layer, " holds ", kept, " entries, ", want,
                                            " more pass its capacity of ", cache.capacity(layer)));
  }
  const bool original = options.original_positions;

  // 1. Spans (PrunerConfig::query_select): the positions within span/2 of
  //    every shared position and every peak, and which slot holds each of
  //    them (a pass over the positions alone). A position the store does
  //    not hold is in the memory already, or the question's.
  const int64_t half = options.span / 2;
  std::vector<std::vector<int32_t>> around(heads);    // sorted, unique
  std::vector<std::vector<int64_t>> slot_of(heads);  // parallel to around: the slot, or -1
  for (int64_t h = 0; h < heads; ++h) {
    std::vector<int32_t>& a = around[h];
    for (const int32_t p : shared) {
      for (int64_t o = -half; o <= half; ++o) a.push_back(static_cast<int32_t>(p + o));
    }
    for (const Peak& p : best[h]) {
      for (int64_t o = -half; o <= half; ++o) a.push_back(static_cast<int32_t>(p.pos + o));
    }
    std::sort(a.begin(), a.end());
    a.erase(std::unique(a.begin(), a.end()), a.end());
    slot_of[h].assign(a.size(), -1);
  }
  if (half > 0 || !shared.empty()) {
    pos_.resize(heads * kBlock);
    for (int64_t first = 0; first < slots; first += kBlock) {
      const int64_t nb = std::min(kBlock, slots - first);
      SNAPFILL_RETURN_IF_ERROR(store.ReadPositions(layer, first, nb, pos_.data()));
      for (int64_t h = 0; h < heads; ++h) {
        const std::vector<int32_t>& a = around[h];
        for (int64_t i = 0; i < nb; ++i) {
          const int32_t p = pos_[i * heads + h];
          const auto it = std::lower_bound(a.begin(), a.end(), p);
          if (it != a.end() && *it == p) slot_of[h][it - a.begin()] = first + i;
        }
      }
    }
  } else {
    for (int64_t h = 0; h < heads; ++h) {
      for (const Peak& p : best[h]) {
        slot_of[h][std::lower_bound(around[h].begin(), around[h].end(), p.pos) - around[h].begin()] = p.slot;
      }
    }
  }

  // 2. Pick: each shared position, then each peak, in order, with its
  //    stored neighbours nearest first, `want` entries per head (a head's
  //    peaks are at least `want` stored entries, so the quota always fills).
  std::vector<int64_t> chosen;
  std::vector<uint8_t> taken;
  std::vector<float> rk(want * d), rv(want * d);
  std::vector<int32_t> rp(want);
  std::vector<int64_t> order(want);
  for (int64_t h = 0; h < heads; ++h) {
    const std::vector<int32_t>& a = around[h];
    taken.assign(a.size(), 0);
    chosen.clear();
    auto take = [&](int32_t pos) {
      const auto it = std::lower_bound(a.begin(), a.end(), pos);
      if (it == a.end() || *it != pos) return;
      const int64_t i = it - a.begin();
      if (taken[i] || slot_of[h][i] < 0) return;
      taken[i] = 1;
      chosen.push_back(slot_of[h][i]);
    };
    auto take_span = [&](int32_t pos) {
      take(pos);
      for (int64_t o = 1; o <= half && static_cast<int64_t>(chosen.size()) < want; ++o) {
        take(static_cast<int32_t>(pos - o));
        if (static_cast<int64_t>(chosen.size()) < want) take(static_cast<int32_t>(pos + o));
      }
    };
    for (const int32_t p : shared) {
      if (static_cast<int64_t>(chosen.size()) >= want) break;
      take_span(p);
    }
    for (const Peak& p : best[h]) {
      if (static_cast<int64_t>(chosen.size()) >= want) break;
      take_span(p.pos);
    }
    if (static_cast<int64_t>(chosen.size()) != want) {
      return absl::InternalError(absl::StrCat("recall picked ", chosen.size(), " of ", want, " entries in layer ",
                                              layer, " head ", h));
    }
    // 3. Read them and merge them into the layer by input position.
    for (int64_t i = 0; i < want; ++i) {
      SNAPFILL_RETURN_IF_ERROR(store.ReadEntry(layer, h, chosen[i], rk.data() + i * d, rv.data() + i * d, &rp[i]));
    }
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int64_t x, int64_t y) { return rp[x] < rp[y]; });
    float* mk = cache.k(layer, h);
    float* mv = cache.v(layer, h);
    int32_t* mp = cache.pos(layer, h);
    if (!cache.on_host()) {
      // In a backend's buffers: the head's entries come out, merge here
      // and go back (once per layer and head, at the last step).
      merge_k_.resize((kept + want) * d);
      merge_v_.resize((kept + want) * d);
      SNAPFILL_RETURN_IF_ERROR(cache.CopyOut(layer, h, kept, merge_k_.data(), merge_v_.data()));
      mk = merge_k_.data();
      mv = merge_v_.data();
    }
    // From the back, so nothing is overwritten before it moves. In a
    // rotated cache each entry then turns by how far it moved (RoPE
    // composes: a rotation by a after one by b is one by a + b), and each
    // recalled key, stored before RoPE, by its index.
    rot_.assign(kept + want, 0);
    int64_t i = kept - 1, j = want - 1;
    for (int64_t o = kept + want - 1; j >= 0; --o) {
      if (i >= 0 && mp[i] > rp[order[j]]) {
        std::memmove(mk + o * d, mk + i * d, d * sizeof(float));
        std::memmove(mv + o * d, mv + i * d, d * sizeof(float));
        mp[o] = mp[i];
        rot_[o] = original ? 0 : static_cast<int32_t>(o - i);
        --i;
      } else {
        std::memcpy(mk + o * d, rk.data() + order[j] * d, d * sizeof(float));
        std::memcpy(mv + o * d, rv.data() + order[j] * d, d * sizeof(float));
        mp[o] = rp[order[j]];
        rot_[o] = original ? mp[o] : static_cast<int32_t>(o);
        --j;
      }
    }
    if (rotated) {
      // Entries [0, i] did not move (rotation 0 leaves them as they are).
      const int64_t first = i + 1;
      SNAPFILL_RETURN_IF_ERROR(backend_->Rope(mk + first * d, kept + want - first, 1, d, d, rot_.data() + first,
                                              c.rope(layer)));
    }
    if (!cache.on_host()) {
      const uint64_t bytes = static_cast<uint64_t>(kept + want) * d * sizeof(float);
      SNAPFILL_RETURN_IF_ERROR(cache.storage()->Upload(mk, cache.k(layer, h), bytes));
      SNAPFILL_RETURN_IF_ERROR(cache.storage()->Upload(mv, cache.v(layer, h), bytes));
    }
  }
  cache.set_size(layer, kept + want);
  return want;
}

absl::StatusOr<int64_t> Recaller::RecallLayer(RecallStore& store, int64_t layer, const float* q, int64_t q_stride,
                                              int64_t num_q, const KvView& seen, const RecallOptions& options,
                                              KvCache& cache, bool rotated) {
  HeadPeaks best;
  SNAPFILL_RETURN_IF_ERROR(ScoreLayer(store, layer, q, q_stride, num_q, seen, options, cache, &best));
  return MergeLayer(store, layer, best, {}, options, cache, rotated);
}

std::vector<int32_t> Recaller::RankAcrossLayers(const std::vector<HeadPeaks>& layers, int64_t count) {
  std::vector<std::pair<int32_t, float>> mass;
  for (const HeadPeaks& layer : layers) {
    for (const std::vector<Peak>& head : layer) {
      for (const Peak& p : head) mass.push_back({p.pos, p.score * p.score});
    }
  }
  // Each position's squared scores summed, then the best `count`.
  std::sort(mass.begin(), mass.end());
  size_t out = 0;
  for (size_t i = 0; i < mass.size(); ++i) {
    if (out > 0 && mass[out - 1].first == mass[i].first) {
      mass[out - 1].second += mass[i].second;
    } else {
      mass[out++] = mass[i];
    }
  }
  mass.resize(out);
  const size_t n = std::min(out, static_cast<size_t>(std::max<int64_t>(count, 0)));
  std::partial_sort(mass.begin(), mass.begin() + n, mass.end(), [](const auto& a, const auto& b) {
    return a.second > b.second || (a.second == b.second && a.first < b.first);
  });
  std::vector<int32_t> ranked(n);
  for (size_t i = 0; i < n; ++i) ranked[i] = mass[i].first;
  return ranked;
}

absl::StatusOr<int64_t> RecallForQuestion(const LlamaModel& model, Backend* backend, KvCache& cache,
                                          int64_t* next_position, RecallStore& store,
                                          const std::vector<int32_t>& question, const RecallOptions& options,
                                          std::vector<int32_t>* ranked) {
  const LlamaConfig& c = model.config();
  const int64_t n = static_cast<int64_t>(question.size());
  if (n == 0 || options.budget <= 0) return 0;
  const RecallStoreInfo& info = store.info();
  if (info.num_layers != c.num_layers || info.num_kv_heads != c.num_kv_heads || info.head_dim != c.head_dim) {
    return absl::InvalidArgumentError(absl::StrCat("the recall store in ", store.dir(), " is shaped for another model"));
  }
  SNAPFILL_ASSIGN_OR_RETURN(std::unique_ptr<LlamaForward> forward, LlamaForward::Create(model, backend, n));
  const int64_t d = c.head_dim, heads = c.num_kv_heads;
  const int64_t start = *next_position;
  std::vector<int32_t> qpos(n);
  std::iota(qpos.begin(), qpos.end(), static_cast<int32_t>(start));
  Recaller recaller(backend, c);
  std::vector<float> tk, tv;  // [heads][m + n][d]: the layer's cache, then the question's keys
  std::vector<Backend::RowGather> copies;
  // Each layer's peaks, kept for the ranking across layers (options.summed).
  std::vector<Recaller::HeadPeaks> peaks(options.summed ? c.num_layers : 0);
  Recaller::HeadPeaks best;
  int64_t added = 0;
  // Each layer: the question's queries and keys at the positions after the
  // cache, attention over cache ∪ question (its outputs feed the next
  // layer), then the scores of the layer's stored keys, and the recall into
  // the layer (or, ranked across layers, into every layer after the pass).
  // The question's K/V are dropped.
  auto attend = [&](int64_t layer, float* q, int64_t q_stride, float* k, float* v, int64_t kv_stride, int64_t rows,
                    int64_t out_rows, float* out) -> absl::Status {
    const int64_t m = cache.size(layer);
    const int64_t total = m + rows;
    SNAPFILL_RETURN_IF_ERROR(backend->Rope(q, rows, c.num_heads, d, q_stride, qpos.data(), c.rope(layer)));
    SNAPFILL_RETURN_IF_ERROR(backend->Rope(k, rows, heads, d, kv_stride, qpos.data(), c.rope(layer)));
    tk.resize(heads * total * d);
    tv.resize(heads * total * d);
    // The cache's entries and the question's (in the forward pass's
    // buffers: copied by the backend).
    const size_t row = d * sizeof(float), batch_row = kv_stride * sizeof(float);
    copies.clear();
    for (int64_t h = 0; h < heads; ++h) {
      copies.push_back({cache.k(layer, h), row, nullptr, tk.data() + h * total * d, row, m, row});
      copies.push_back({cache.v(layer, h), row, nullptr, tv.data() + h * total * d, row, m, row});
      copies.push_back({k + h * d, batch_row, nullptr, tk.data() + (h * total + m) * d, row, rows, row});
      copies.push_back({v + h * d, batch_row, nullptr, tv.data() + (h * total + m) * d, row, rows, row});
    }
    SNAPFILL_RETURN_IF_ERROR(backend->Gather(copies));
    KvView view;
    view.k = tk.data();
    view.v = tv.data();
    view.head_stride = total * d;
    view.key_stride = d;
    view.num_keys = total;
    if (out_rows > 0) {
      const int64_t skip = rows - out_rows;
      SNAPFILL_RETURN_IF_ERROR(
          backend->Attention(LlamaQueries(c, q, q_stride, rows).From(skip), view, out + skip * q_stride, q_stride));
    }
    Recaller::HeadPeaks& scored = options.summed ? peaks[layer] : best;
    SNAPFILL_RETURN_IF_ERROR(recaller.ScoreLayer(store, layer, q, q_stride, rows, view, options, cache, &scored));
    if (!options.summed) {
      SNAPFILL_ASSIGN_OR_RETURN(const int64_t got, recaller.MergeLayer(store, layer, best, {}, options, cache, true));
      added = std::max(added, got);
    }
    return absl::OkStatus();
  };
  SNAPFILL_RETURN_IF_ERROR(forward->ForwardWithAttention(question.data(), n, attend, 0, nullptr, 0));
  if (options.summed) {
    // The attention the question's queries put on each input position,
    // squared and summed over every layer and KV head that ranks it among
    // its peaks, and every layer brings back the spans around the best: a
    // few heads rank what the question asks about first, with most of
    // their attention, where the rest rank it in their hundreds, behind
    // what every question attends to. At 1M tokens each head's own ranking
    // brought a needle back into 5 of SmolLM2's 90 layers and KV heads, too
    // few for the answer to read it. Squared, a few heads' strong attention
    // outweighs many heads' weak attention: in another 1M trial the
    // needle's tokens had 4 heads' peaks each (scores up to 5) where the
    // passages around them had 22-26 heads' (about 0.3 each); summed they
    // ranked 21st and 29th, behind more passages than the budget's spans
    // hold, squared 5th and 7th (docs/RESULTS.md).
    const std::vector<int32_t> shared = Recaller::RankAcrossLayers(peaks, kPeaksPerEntry * options.budget);
    for (int64_t layer = 0; layer < c.num_layers; ++layer) {
      SNAPFILL_ASSIGN_OR_RETURN(const int64_t got,
                                recaller.MergeLayer(store, layer, peaks[layer], shared, options, cache, true));
      added = std::max(added, got);
    }
    if (ranked != nullptr) *ranked = shared;
  }
  if (!options.original_positions) *next_position = cache.max_size();
  return added;
}

}  // namespace snapfill
