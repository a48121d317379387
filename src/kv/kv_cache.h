// The KV cache: per layer and KV head, the keys and values that attention
// reads. This file owns the layout decision.
//
// Layout: head-major so that each KV head can hold its own set of entries
// (SnapKV keeps a different set per head, the same count for all heads):
//   k_, v_: [num_layers, num_kv_heads, capacity, head_dim] f32
//   pos_:   [num_layers, num_kv_heads, capacity] int32, each entry's
//           original position in the input (what SnapKV's selection and the
//           telemetry need; the rotation itself may use other positions)
//   score_: [num_layers, num_kv_heads, capacity] f32, only after
//           EnableScores(): a score the entry keeps for as long as it is
//           kept (context reconstruction's, DESIGN.md §9), carried by
//           checkpoints and cache files with the entry
// size(layer) entries are valid in every head of that layer.
//
// Where the keys and values live: host memory (paged), or a backend's
// buffers (Create with `storage`: the prefill engine's memory on a backend
// whose buffers the host cannot reach, a device's). Positions and scores
// are always in host memory. Stored on a backend, k() and v() are the
// backend's addresses, for its ops (Backend::Gather, the attention
// family); the host reads them with CopyOut; the fp16 decode copy is a
// host cache's only.
#ifndef SNAPFILL_KV_KV_CACHE_H_
#define SNAPFILL_KV_KV_CACHE_H_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/statusor.h"
#include "snapfill/backend.h"
#include "src/base/paged_array.h"

namespace snapfill {

struct KvCacheShape {
  int64_t num_layers = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t capacity = 0;  // entries per layer and head (the largest layer's)
  // Per layer, where layers differ (a sliding-window layer holds only its
  // window): each in [1, capacity]. Empty: `capacity` for every layer.
  std::vector<int64_t> layer_capacity = {};
  int64_t CapacityOf(int64_t layer) const { return layer_capacity.empty() ? capacity : layer_capacity[layer]; }
};

class KvCache {
 public:
  // Allocates capacity for every layer, in host memory or (storage given)
  // in storage's buffers; ResourceExhausted if it cannot.
  static absl::StatusOr<std::unique_ptr<KvCache>> Create(const KvCacheShape& shape, Backend* storage = nullptr);

  // The same cache with its keys and values in `storage`'s buffers (a
  // device's), copied through it; positions, scores and sizes as here.
  // This cache must be in host memory.
  absl::StatusOr<std::unique_ptr<KvCache>> CopyToBackend(Backend* storage) const;

  // Whether the keys and values are in host memory (else in storage()'s
  // buffers, which only its ops and CopyOut reach).
  bool on_host() const { return storage_ == nullptr; }
  Backend* storage() const { return storage_; }
  // The first n entries' keys and values of (layer, head) into host
  // memory (n × head_dim floats each), wherever they live.
  absl::Status CopyOut(int64_t layer, int64_t head, int64_t n, float* k, float* v) const;

  const KvCacheShape& shape() const { return shape_; }
  // The largest layer's capacity, and one layer's.
  int64_t capacity() const { return shape_.capacity; }
  int64_t capacity(int64_t layer) const { return shape_.CapacityOf(layer); }
  int64_t size(int64_t layer) const { return sizes_[layer]; }
  void set_size(int64_t layer, int64_t n) {
    sizes_[layer] = n;
    half_sizes_[layer] = std::min(half_sizes_[layer], n);
    released_[layer] = std::min(released_[layer], n);
  }
  // The largest size over layers (layers may hold different counts).
  int64_t max_size() const;
  // The entries every layer can still take: min over layers of capacity -
  // size (what a decoder appending to every layer may add).
  int64_t room() const;
  // Bytes allocated for keys, values, positions and scores (resident only once written).
  uint64_t bytes() const {
    return static_cast<uint64_t>(k_.size() + v_.size() + score_.size()) * sizeof(float) +
           pos_.size() * sizeof(int32_t) + (k16_.size() + v16_.size()) * sizeof(uint16_t) +
           (k_buf_ != nullptr ? k_buf_->bytes() + v_buf_->bytes() : 0);
  }

  // Per-entry scores (see the layout above): allocated by EnableScores
  // (ResourceExhausted if it cannot be; a no-op when there already), 0 for
  // entries written without one (Append).
  absl::Status EnableScores();
  bool has_scores() const { return score_.size() != 0; }
  float* score(int64_t layer, int64_t head) { return score_.data() + Offset(layer, head) / shape_.head_dim; }
  const float* score(int64_t layer, int64_t head) const {
    return score_.data() + Offset(layer, head) / shape_.head_dim;
  }

  int32_t* pos(int64_t layer, int64_t head) { return pos_.data() + Offset(layer, head) / shape_.head_dim; }
  const int32_t* pos(int64_t layer, int64_t head) const {
    return pos_.data() + Offset(layer, head) / shape_.head_dim;
  }
  // The f32 entries. Entries whose f32 pages SyncHalf released are first
  // widened back from the fp16 copy (RestoreF32). (Writable access may
  // change entries: the layer's fp16 copy is made again from scratch at
  // its next SyncHalf.)
  float* k(int64_t layer, int64_t head) {
    RestoreF32(layer);
    half_sizes_[layer] = 0;
    return KData() + Offset(layer, head);
  }
  float* v(int64_t layer, int64_t head) {
    RestoreF32(layer);
    half_sizes_[layer] = 0;
    return VData() + Offset(layer, head);
  }
  const float* k(int64_t layer, int64_t head) const {
    RestoreF32(layer);
    return KData() + Offset(layer, head);
  }
  const float* v(int64_t layer, int64_t head) const {
    RestoreF32(layer);
    return VData() + Offset(layer, head);
  }
  int64_t head_stride(int64_t layer) const { return capacity(layer) * shape_.head_dim; }
  int64_t key_stride() const { return shape_.head_dim; }

  // A view of layer `layer`'s first `num_keys` entries (f32: restores
  // released entries first, like k()).
  KvView View(int64_t layer, int64_t num_keys) const;

  // The fp16 copy of the entries that decode attention reads
  // (BackendOptions::half_decode_kv): [num_layers, num_kv_heads, capacity,
  // head_dim] like k_ and v_, allocated at the first call and resident
  // only where written. SyncHalf(layer) converts the entries the copy does
  // not hold yet (round to nearest even; all of them the first time, the
  // appended ones after). Entries reached through writable k() / v() or
  // cut by set_size() are copied again. `convert` turns n floats into fp16
  // (Backend::ToHalf); empty: the portable Fp32ToFp16. ResourceExhausted if
  // the copy cannot be allocated; FailedPrecondition on a backend's storage.
  // release_f32: the copy replaces the f32 entries it holds: their whole
  // pages go back to the operating system (so decoding over the copy holds
  // 2 bytes per element instead of 4, not 6), and any later f32 access
  // widens them back from the copy (RestoreF32: the values rounded to
  // fp16, as llama.cpp's default cache holds them).
  // An element too large for fp16 (|x| >= 65520, or not finite) sets
  // half_overflow(): the copy is not fit to read, nothing more is released,
  // and decode must read the f32 entries.
  using HalfFn = std::function<void(const float* x, uint16_t* y, int64_t n)>;
  absl::Status SyncHalf(int64_t layer, const HalfFn& convert = {}, bool release_f32 = false);
  // View() with k16 / v16 set; num_keys <= the entries SyncHalf copied.
  // Leaves the f32 entries as they are (released or not).
  KvView HalfView(int64_t layer, int64_t num_keys) const;
  // Entries of `layer` the fp16 copy holds.
  int64_t half_size(int64_t layer) const { return half_sizes_[layer]; }
  // Entries of `layer` whose f32 pages were released (0 once restored).
  int64_t f32_released(int64_t layer) const { return released_[layer]; }
  bool half_overflow() const { return half_overflow_; }
  // Widens the released entries of `layer` back from the fp16 copy (exact:
  // every fp16 value is an f32). Const: the entries' values do not change.
  void RestoreF32(int64_t layer) const {
    if (released_[layer] > 0) WidenReleased(layer);
  }

  // Takes entries [size, size + n) of `layer` for n new tokens: writes their
  // positions (positions[t], or size + t where null) and zero scores, grows
  // the size, and returns where each KV head's first new key and value go
  // (num_kv_heads of each; head_dim floats an entry), for the caller to
  // write (LlamaForward copies them from its activations through the
  // backend). OutOfRange if that passes capacity.
  struct Slots {
    absl::InlinedVector<float*, 8> k, v;  // (no allocation for up to 8 KV heads: decode appends every step)
  };
  absl::StatusOr<Slots> AppendSlots(int64_t layer, int64_t n, const int32_t* positions);
  // AppendSlots, then the K and V copied there from token-major rows
  // ([n, num_kv_heads, head_dim], token stride `stride` floats) in host
  // memory (through storage()'s Gather where the entries live there).
  absl::Status Append(int64_t layer, const float* k_rows, const float* v_rows, int64_t n,
                      int64_t stride, const int32_t* positions);

  // Makes a deep copy (costly: the whole cache), in the same place.
  std::unique_ptr<KvCache> Clone() const;
  void Clear();

 private:
  explicit KvCache(const KvCacheShape& shape);
  void WidenReleased(int64_t layer) const;
  KvView ViewNoRestore(int64_t layer, int64_t num_keys) const;
  float* KData() const { return k_buf_ != nullptr ? k_buf_->f32() : k_.data(); }
  float* VData() const { return v_buf_ != nullptr ? v_buf_->f32() : v_.data(); }
  int64_t Offset(int64_t layer, int64_t head) const {
    return (layer_start_[layer] + head * capacity(layer)) * shape_.head_dim;
  }
  KvCacheShape shape_;
  // Per layer: its first entry slot, Σ over the layers before of
  // num_kv_heads × their capacity.
  std::vector<int64_t> layer_start_;
  // Paged: an entry costs resident memory once written, so a memory that
  // grows step by step (IM, IMDC) holds only what it has used so far.
  // (mutable: RestoreF32 refills released pages with the same values.)
  mutable PagedArray<float> k_;  // [num_layers, num_kv_heads, capacity, head_dim]
  mutable PagedArray<float> v_;  // [num_layers, num_kv_heads, capacity, head_dim]
  // Or k_ and v_ in a backend's buffers (then k_ and v_ are empty).
  Backend* storage_ = nullptr;
  std::unique_ptr<BackendBuffer> k_buf_, v_buf_;
  PagedArray<int32_t> pos_;  // [num_layers, num_kv_heads, capacity]
  PagedArray<float> score_;  // [num_layers, num_kv_heads, capacity] or empty
  std::vector<int64_t> sizes_;  // [num_layers]
  // The fp16 copy (SyncHalf) and the valid prefix of each layer in it.
  PagedArray<uint16_t> k16_, v16_;
  std::vector<int64_t> half_sizes_;  // [num_layers]
  // Per layer: entries [0, released_) hold no f32 (SyncHalf release_f32);
  // always <= half_sizes_.
  mutable std::vector<int64_t> released_;  // [num_layers]
  bool half_overflow_ = false;
};

}  // namespace snapfill

#endif  // SNAPFILL_KV_KV_CACHE_H_
