// The recall tier's store (DESIGN.md §8): every entry the chunk loop evicts,
// kept on disk so that the question, once it is known, can bring back the
// entries it attends to most.
//
// Layout: a directory with a text header `recall.meta` and, per layer,
// three append-only files written sequentially, one record per eviction
// slot in each:
//   layer-LL.pos     each KV head's entry's original position (int32)
//   layer-LL.keys    each KV head's key before RoPE
//   layer-LL.values  each KV head's value
// (positions apart, so that a pass over them reads 4 bytes per entry).
// Every step evicts the same count in every KV head of a layer, so the
// heads advance in lockstep and record i holds each head's i-th eviction.
// A key or value is stored as
//   f16  head_dim IEEE halves (round to nearest even; exact back to f32)
//   q8   an f32 scale = max|x| / 127, then head_dim int8 = round(x / scale):
//        each element within max|x| / 254 of the original (half a step)
// Reads use pread in blocks, never a mapping, so the store's pages stay
// out of the process's resident set (they live in the page cache, which
// the kernel reclaims as it needs).
//
// The store knows whose it is: the model's fingerprint, the input's token
// digest and the plan's digest are in the header, and Reopen refuses a
// store of another run. Nothing the user had is touched: Create wants a
// directory that is absent or empty; Remove deletes only the store's files,
// and the directory when Create made it.
#ifndef SNAPFILL_KV_RECALL_STORE_H_
#define SNAPFILL_KV_RECALL_STORE_H_

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "snapfill/recall_format.h"

namespace snapfill {

class Backend;

// What a store holds and whose it is.
struct RecallStoreInfo {
  int64_t num_layers = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  RecallFormat format = RecallFormat::kF16;
  std::string model_fingerprint;
  uint64_t input_digest = 0;
  int64_t input_tokens = 0;
  uint64_t plan_digest = 0;
};

class RecallStore {
 public:
  // Bytes one eviction slot of one layer takes on disk (every KV head's
  // position, key and value).
  static uint64_t SlotBytes(const RecallStoreInfo& info);
  // The most a store of `tokens` input tokens can take: every token is
  // evicted at most once, in every layer.
  static uint64_t MaxBytes(const RecallStoreInfo& info, int64_t tokens) {
    return static_cast<uint64_t>(info.num_layers) * tokens * SlotBytes(info);
  }

  // A new, empty store in `dir` (created if absent; an existing directory
  // must be empty). InvalidArgument for a bad shape, FailedPrecondition for
  // a directory that is not empty (naming a store found there),
  // PermissionDenied / NotFound / ResourceExhausted from the filesystem,
  // each naming the path.
  static absl::StatusOr<std::unique_ptr<RecallStore>> Create(const std::string& dir,
                                                             const RecallStoreInfo& info);
  // The store of a run stopped at a checkpoint, cut back to the `slots`
  // each layer had then ([num_layers]): FailedPrecondition if the header
  // names another model, input, plan, shape or format, DataLoss if a file
  // holds fewer slots than the checkpoint recorded.
  static absl::StatusOr<std::unique_ptr<RecallStore>> Reopen(const std::string& dir,
                                                             const RecallStoreInfo& info,
                                                             const std::vector<int64_t>& slots);
  // A complete store (MarkComplete) for reading: the one `prefill --out`
  // kept for `generate --cache`. `info` names whose it must be; its format
  // is read from the header. FailedPrecondition for another model, input or
  // plan, or an incomplete store; DataLoss if its files disagree.
  static absl::StatusOr<std::unique_ptr<RecallStore>> Open(const std::string& dir, const RecallStoreInfo& info);
  ~RecallStore();
  RecallStore(const RecallStore&) = delete;
  RecallStore& operator=(const RecallStore&) = delete;

  const RecallStoreInfo& info() const { return info_; }
  // The conversions of whole blocks, f16 and q8 (a backend's vector
  // kernels); the portable scalar twins until set (a member left empty keeps
  // its twin). Bit-identical either way for finite values.
  struct Conversions {
    std::function<void(const float* x, uint16_t* y, int64_t n)> to_half;
    std::function<void(const uint16_t* x, float* y, int64_t n)> from_half;
    std::function<void(const float* x, uint8_t* y, int64_t rows, int64_t dim)> to_int8;
    std::function<void(const uint8_t* y, float* x, int64_t rows, int64_t dim)> from_int8;
  };
  void SetConversions(Conversions conversions);
  // `backend`'s (ToHalf, FromHalf, ToInt8Rows, FromInt8Rows); it must
  // outlive the store.
  static Conversions BackendConversions(Backend* backend);
  const std::string& dir() const { return dir_; }
  // Eviction slots written to `layer` so far (entries per KV head).
  int64_t slots(int64_t layer) const { return slots_[layer]; }
  const std::vector<int64_t>& all_slots() const { return slots_; }
  // Bytes on disk (header aside).
  uint64_t bytes() const;

  // Appends n slots to `layer`: for KV head h, its entries idx[h][0..n)
  // of the candidate buffers k / v (row r of head h at k + h * head_stride
  // + r * head_dim) with positions pos + h * pos_stride. ResourceExhausted
  // when the disk is full (or a file-size limit is reached), naming the
  // store; the store is then unusable.
  absl::Status Append(int64_t layer, int64_t n, const int32_t* const* idx, const float* k, const float* v,
                      int64_t head_stride, const int32_t* pos, int64_t pos_stride);
  // The same for slots already in the store's order and format (what a
  // device gathers in that order and converts where it gathered them):
  // positions pos [n][num_kv_heads], keys k and values v [n][num_kv_heads]
  // records of RecallVectorBytes each, written as they are.
  absl::Status AppendRecords(int64_t layer, int64_t n, const int32_t* pos, const uint8_t* k, const uint8_t* v);

  // Slots [first, first + n) of `layer`, slot-major as stored: keys as f32
  // into k ([n][num_kv_heads][head_dim]) and positions into pos
  // ([n][num_kv_heads]).
  absl::Status ReadKeys(int64_t layer, int64_t first, int64_t n, float* k, int32_t* pos);
  // Slots [first, first + n) of `layer`: positions only ([n][num_kv_heads]).
  absl::Status ReadPositions(int64_t layer, int64_t first, int64_t n, int32_t* pos);
  // KV head `head`'s key, value and position at slot `slot` of `layer`.
  absl::Status ReadEntry(int64_t layer, int64_t head, int64_t slot, float* k, float* v, int32_t* pos);

  // Makes what was written durable (before a checkpoint records the slots).
  absl::Status Sync();
  // Syncs and marks the store complete (every entry of its input written),
  // so that Open accepts it.
  absl::Status MarkComplete();
  // Deletes the store's files (and the directory if Create made it).
  absl::Status Remove();

 private:
  RecallStore(std::string dir, const RecallStoreInfo& info);
  absl::Status OpenFiles(bool create);
  uint64_t VectorBytes() const;  // one key or value as stored
  uint64_t PosSlotBytes() const;
  uint64_t KeySlotBytes() const;
  absl::Status CheckRange(int64_t layer, int64_t first, int64_t n) const;
  absl::Status CheckAppend(int64_t layer, int64_t n) const;
  uint64_t ValueSlotBytes() const;
  absl::Status WriteAll(int fd, const uint8_t* data, uint64_t n, uint64_t offset, const char* what,
                        int64_t layer);
  // n slots' positions ([n][num_kv_heads]) written at the layer's end.
  absl::Status WritePositions(int64_t layer, int64_t n, const int32_t* pos);
  // n slots' keys or values (x [n][num_kv_heads][head_dim]) converted and
  // written at the layer's end (Append's).
  absl::Status WriteVectors(int64_t layer, int64_t n, const float* x, int fd, const char* what);
  // n slots' keys or values already as stored, written at the layer's end.
  absl::Status WriteRecords(int64_t layer, int64_t n, const uint8_t* records, int fd, const char* what);
  absl::Status ReadAll(int fd, uint8_t* data, uint64_t n, uint64_t offset, const char* what, int64_t layer);
  // `vectors` keys or values of head_dim floats, as stored.
  void Encode(const float* x, int64_t vectors, uint8_t* out) const;
  void Decode(const uint8_t* in, int64_t vectors, float* x) const;
  std::string FilePath(int64_t layer, const char* kind) const;
  // A layer's three files: its descriptor, one slot's bytes in it, its name.
  struct LayerFile {
    int* fd;
    uint64_t slot_bytes;
    const char* kind;
  };
  std::array<LayerFile, 3> LayerFiles(int64_t layer);
  absl::StatusOr<uint64_t> FileBytes(int64_t layer, const LayerFile& f) const;

  std::string dir_;
  RecallStoreInfo info_;
  bool made_dir_ = false;
  std::vector<int> pos_fds_, key_fds_, value_fds_;  // [num_layers]
  std::vector<int64_t> slots_;            // [num_layers]
  std::vector<uint8_t> buffer_;           // one Append's or read's records
  std::vector<float> staging_;            // one Append's keys or values, gathered
  std::vector<int32_t> pos_staging_;      // one Append's positions
  Conversions conversions_;
};

}  // namespace snapfill

#endif  // SNAPFILL_KV_RECALL_STORE_H_
