#include "src/kv/kv_cache.h"

#include <algorithm>
#include <cstring>
#include <new>

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "snapfill/status.h"
#include "src/base/half.h"

namespace snapfill {

KvCache::KvCache(const KvCacheShape& shape)
    : shape_(shape),
      layer_start_(shape.num_layers, 0),
      sizes_(shape.num_layers, 0),
      half_sizes_(shape.num_layers, 0),
      released_(shape.num_layers, 0) {
  for (int64_t l = 1; l < shape.num_layers; ++l) {
    layer_start_[l] = layer_start_[l - 1] + shape.num_kv_heads * shape.CapacityOf(l - 1);
  }
}

absl::StatusOr<std::unique_ptr<KvCache>> KvCache::Create(const KvCacheShape& shape, Backend* storage) {
  if (shape.num_layers <= 0 || shape.num_kv_heads <= 0 || shape.head_dim <= 0 ||
      shape.capacity <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV cache shape must be positive: layers=", shape.num_layers, " kv_heads=",
        shape.num_kv_heads, " head_dim=", shape.head_dim, " capacity=", shape.capacity));
  }
  double entries = 0;  // per KV head, over the layers
  if (!shape.layer_capacity.empty()) {
    if (static_cast<int64_t>(shape.layer_capacity.size()) != shape.num_layers) {
      return absl::InvalidArgumentError(absl::StrCat("KV cache shape: ", shape.layer_capacity.size(),
                                                     " layer capacities for ", shape.num_layers, " layers"));
    }
    for (int64_t l = 0; l < shape.num_layers; ++l) {
      const int64_t c = shape.layer_capacity[l];
      if (c <= 0 || c > shape.capacity) {
        return absl::InvalidArgumentError(absl::StrCat("KV cache shape: layer ", l, " capacity ", c,
                                                       " is outside [1, ", shape.capacity, "]"));
      }
      entries += static_cast<double>(c);
    }
  } else {
    entries = static_cast<double>(shape.num_layers) * shape.capacity;
  }
  const double elems = entries * shape.num_kv_heads * shape.head_dim;
  if (elems * 2 * sizeof(float) > static_cast<double>(uint64_t{1} << 40)) {
    return absl::ResourceExhaustedError(absl::StrCat("KV cache of ", elems * 8 / (1 << 30),
                                                     " GiB is too large"));
  }
  std::unique_ptr<KvCache> cache(new KvCache(shape));
  if (!cache->pos_.Allocate(static_cast<size_t>(elems) / shape.head_dim)) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot allocate a KV cache's positions of ",
                                                     elems / shape.head_dim * 4 / (1 << 20), " MiB"));
  }
  if (storage != nullptr) {
    cache->storage_ = storage;
    for (std::unique_ptr<BackendBuffer>* b : {&cache->k_buf_, &cache->v_buf_}) {
      absl::StatusOr<std::unique_ptr<BackendBuffer>> made = storage->NewBuffer(static_cast<uint64_t>(elems) * 4);
      if (!made.ok()) {
        return absl::ResourceExhaustedError(absl::StrCat("cannot allocate a KV cache of ", elems * 8 / (1 << 20),
                                                         " MiB on the backend: ", made.status().message()));
      }
      *b = std::move(*made);
    }
    return cache;
  }
  if (!cache->k_.Allocate(static_cast<size_t>(elems)) || !cache->v_.Allocate(static_cast<size_t>(elems))) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot allocate a KV cache of ",
                                                     elems * 8 / (1 << 20), " MiB"));
  }
  return cache;
}

absl::StatusOr<std::unique_ptr<KvCache>> KvCache::CopyToBackend(Backend* storage) const {
  if (!on_host()) return absl::FailedPreconditionError("the KV cache is already in a backend's buffers");
  SNAPFILL_ASSIGN_OR_RETURN(std::unique_ptr<KvCache> to, Create(shape_, storage));
  if (has_scores()) SNAPFILL_RETURN_IF_ERROR(to->EnableScores());
  const int64_t d = shape_.head_dim;
  for (int64_t l = 0; l < shape_.num_layers; ++l) {
    const int64_t n = size(l);
    for (int64_t h = 0; h < shape_.num_kv_heads; ++h) {
      const uint64_t bytes = static_cast<uint64_t>(n * d) * sizeof(float);
      SNAPFILL_RETURN_IF_ERROR(storage->Upload(k(l, h), to->k(l, h), bytes));
      SNAPFILL_RETURN_IF_ERROR(storage->Upload(v(l, h), to->v(l, h), bytes));
      std::copy(pos(l, h), pos(l, h) + n, to->pos(l, h));
      if (has_scores()) std::copy(score(l, h), score(l, h) + n, to->score(l, h));
    }
    to->set_size(l, n);
  }
  return to;
}

absl::Status KvCache::EnableScores() {
  if (has_scores()) return absl::OkStatus();
  if (!score_.Allocate(pos_.size())) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate the KV cache's entry scores of ", pos_.size() * 4 / (1 << 20), " MiB"));
  }
  return absl::OkStatus();
}

KvView KvCache::View(int64_t layer, int64_t num_keys) const {
  RestoreF32(layer);
  return ViewNoRestore(layer, num_keys);
}

absl::Status KvCache::CopyOut(int64_t layer, int64_t head, int64_t n, float* k_out, float* v_out) const {
  if (n < 0 || n > capacity(layer)) {
    return absl::OutOfRangeError(absl::StrCat("KV cache layer ", layer, ": ", n, " entries of ", capacity(layer)));
  }
  const size_t bytes = static_cast<size_t>(n) * shape_.head_dim * sizeof(float);
  if (on_host()) {
    if (bytes > 0) {
      std::memcpy(k_out, k(layer, head), bytes);
      std::memcpy(v_out, v(layer, head), bytes);
    }
    return absl::OkStatus();
  }
  SNAPFILL_RETURN_IF_ERROR(storage_->Download(k(layer, head), k_out, bytes));
  return storage_->Download(v(layer, head), v_out, bytes);
}

KvView KvCache::ViewNoRestore(int64_t layer, int64_t num_keys) const {
  KvView view;
  view.k = KData() + Offset(layer, 0);
  view.v = VData() + Offset(layer, 0);
  view.head_stride = head_stride(layer);
  view.key_stride = key_stride();
  view.num_keys = num_keys;
  return view;
}

namespace {

// Whether any of n fp16 values is infinite or NaN (exponent bits all set).
bool AnyNotFinite(const uint16_t* h, int64_t n) {
  uint16_t all = 0;
  for (int64_t i = 0; i < n; ++i) all |= static_cast<uint16_t>(((h[i] & 0x7C00) == 0x7C00) ? 1 : 0);
  return all != 0;
}

}  // namespace

absl::Status KvCache::SyncHalf(int64_t layer, const HalfFn& convert, bool release_f32) {
  if (!on_host()) return absl::FailedPreconditionError("the KV cache's fp16 copy is made in host memory only");
  if (k16_.size() == 0) {
    if (!k16_.Allocate(k_.size()) || !v16_.Allocate(v_.size())) {
      return absl::ResourceExhaustedError(absl::StrCat("cannot allocate the KV cache's fp16 copy of ",
                                                       k_.size() * 4 / (1 << 20), " MiB"));
    }
  }
  const int64_t d = shape_.head_dim;
  const int64_t first = half_sizes_[layer], n = sizes_[layer] - first;
  if (n > 0) {
    // (From f32 entries: none of [first, size) is released, as released_ <= first.)
    for (int64_t h = 0; h < shape_.num_kv_heads; ++h) {
      const int64_t off = Offset(layer, h) + first * d;
      const float* ks = k_.data() + off;
      const float* vs = v_.data() + off;
      uint16_t* kd = k16_.data() + off;
      uint16_t* vd = v16_.data() + off;
      if (convert) {
        convert(ks, kd, n * d);
        convert(vs, vd, n * d);
      } else {
        for (int64_t i = 0; i < n * d; ++i) {
          kd[i] = Fp32ToFp16(ks[i]);
          vd[i] = Fp32ToFp16(vs[i]);
        }
      }
      if (AnyNotFinite(kd, n * d) || AnyNotFinite(vd, n * d)) half_overflow_ = true;
    }
    half_sizes_[layer] = sizes_[layer];
  }
  // Entries decode appends go back in batches: each madvise costs the
  // other threads a TLB-shootdown interrupt (one call per page each step
  // cost 6% of decode's speed).
  constexpr int64_t kReleaseBatch = 256;
  const int64_t pending = half_sizes_[layer] - released_[layer];
  if (!release_f32 || half_overflow_ || pending == 0 || (released_[layer] > 0 && pending < kReleaseBatch)) {
    return absl::OkStatus();
  }
  // Hand back the whole pages of [0, half_size) past the page that held the
  // last released entry (those before it went back already).
  const int64_t page = static_cast<int64_t>(sysconf(_SC_PAGESIZE)) / static_cast<int64_t>(sizeof(float));
  for (int64_t h = 0; h < shape_.num_kv_heads; ++h) {
    const int64_t base = Offset(layer, h);
    const int64_t done = base + released_[layer] * d;
    const int64_t from = std::max(base, done - done % page);  // k_ and v_ are page aligned
    const int64_t count = base + half_sizes_[layer] * d - from;
    k_.Release(static_cast<size_t>(from), static_cast<size_t>(count));
    v_.Release(static_cast<size_t>(from), static_cast<size_t>(count));
  }
  released_[layer] = half_sizes_[layer];
  return absl::OkStatus();
}

void KvCache::WidenReleased(int64_t layer) const {
  const int64_t count = released_[layer] * shape_.head_dim;
  for (int64_t h = 0; h < shape_.num_kv_heads; ++h) {
    const int64_t off = Offset(layer, h);
    float* kd = k_.data() + off;
    float* vd = v_.data() + off;
    const uint16_t* ks = k16_.data() + off;
    const uint16_t* vs = v16_.data() + off;
    for (int64_t i = 0; i < count; ++i) {
      kd[i] = Fp16ToFp32(ks[i]);
      vd[i] = Fp16ToFp32(vs[i]);
    }
  }
  released_[layer] = 0;
}

KvView KvCache::HalfView(int64_t layer, int64_t num_keys) const {
  KvView view = ViewNoRestore(layer, num_keys);
  view.k16 = k16_.data() + Offset(layer, 0);
  view.v16 = v16_.data() + Offset(layer, 0);
  return view;
}

absl::StatusOr<KvCache::Slots> KvCache::AppendSlots(int64_t layer, int64_t n, const int32_t* positions) {
  const int64_t start = sizes_[layer];
  if (start + n > capacity(layer)) {
    return absl::OutOfRangeError(absl::StrCat("KV cache layer ", layer, ": ", start, " + ", n,
                                              " entries exceed capacity ", capacity(layer)));
  }
  const int64_t d = shape_.head_dim;
  Slots slots;
  for (int64_t h = 0; h < shape_.num_kv_heads; ++h) {
    // (Past the entries the fp16 copy holds: no need to drop it.)
    slots.k.push_back(KData() + Offset(layer, h) + start * d);
    slots.v.push_back(VData() + Offset(layer, h) + start * d);
    int32_t* pd = pos(layer, h) + start;
    for (int64_t t = 0; t < n; ++t) pd[t] = positions != nullptr ? positions[t] : static_cast<int32_t>(start + t);
    if (has_scores()) std::fill(score(layer, h) + start, score(layer, h) + start + n, 0.0f);
  }
  sizes_[layer] = start + n;
  return slots;
}

absl::Status KvCache::Append(int64_t layer, const float* k_rows, const float* v_rows, int64_t n,
                             int64_t stride, const int32_t* positions) {
  SNAPFILL_ASSIGN_OR_RETURN(const Slots slots, AppendSlots(layer, n, positions));
  const int64_t d = shape_.head_dim;
  if (!on_host()) {
    std::vector<Backend::RowGather> rows;
    const size_t row = d * sizeof(float), from = stride * sizeof(float);
    for (int64_t h = 0; h < shape_.num_kv_heads; ++h) {
      rows.push_back({k_rows + h * d, from, nullptr, slots.k[h], row, n, row});
      rows.push_back({v_rows + h * d, from, nullptr, slots.v[h], row, n, row});
    }
    return storage_->Gather(rows);
  }
  for (int64_t h = 0; h < shape_.num_kv_heads; ++h) {
    for (int64_t t = 0; t < n; ++t) {
      std::memcpy(slots.k[h] + t * d, k_rows + t * stride + h * d, d * sizeof(float));
      std::memcpy(slots.v[h] + t * d, v_rows + t * stride + h * d, d * sizeof(float));
    }
  }
  return absl::OkStatus();
}

std::unique_ptr<KvCache> KvCache::Clone() const {
  absl::StatusOr<std::unique_ptr<KvCache>> made = Create(shape_, storage_);
  if (!made.ok()) throw std::bad_alloc();
  std::unique_ptr<KvCache> c = std::move(*made);
  if (has_scores() && !c->score_.Allocate(score_.size())) throw std::bad_alloc();
  // Only the valid entries of each layer and head: the rest is zero anyway
  // and stays unwritten (not resident) in the copy too.
  const int64_t d = shape_.head_dim;
  std::vector<Backend::RowGather> rows;
  for (int64_t l = 0; l < shape_.num_layers; ++l) {
    for (int64_t h = 0; h < shape_.num_kv_heads; ++h) {
      const size_t bytes = sizes_[l] * d * sizeof(float);
      if (!on_host()) {
        rows.push_back({k(l, h), bytes, nullptr, c->k(l, h), bytes, 1, bytes});
        rows.push_back({v(l, h), bytes, nullptr, c->v(l, h), bytes, 1, bytes});
      } else {
        std::memcpy(c->k(l, h), k(l, h), bytes);
        std::memcpy(c->v(l, h), v(l, h), bytes);
      }
      std::memcpy(c->pos(l, h), pos(l, h), sizes_[l] * sizeof(int32_t));
      if (has_scores()) std::memcpy(c->score(l, h), score(l, h), sizes_[l] * sizeof(float));
    }
  }
  if (!rows.empty() && !storage_->Gather(rows).ok()) throw std::bad_alloc();
  c->sizes_ = sizes_;
  return c;
}

int64_t KvCache::max_size() const {
  int64_t m = 0;
  for (int64_t n : sizes_) m = std::max(m, n);
  return m;
}

int64_t KvCache::room() const {
  int64_t r = shape_.capacity;
  for (int64_t l = 0; l < shape_.num_layers; ++l) r = std::min(r, capacity(l) - sizes_[l]);
  return r;
}

void KvCache::Clear() {
  std::fill(sizes_.begin(), sizes_.end(), 0);
  std::fill(half_sizes_.begin(), half_sizes_.end(), 0);
  std::fill(released_.begin(), released_.end(), 0);
  half_overflow_ = false;
}

}  // namespace snapfill
