// The recall tier's read side (DESIGN.md §8): the entries of a recall store
// that a question's queries attend to most, merged into a layer of a KV
// cache by input position. The chunk loop calls it at the input's last step
// (the question's rows ran with the last chunk); `generate --cache` calls
// RecallForQuestion, which runs the question over a saved cache first.
#ifndef SNAPFILL_ENGINE_RECALL_H_
#define SNAPFILL_ENGINE_RECALL_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "snapfill/backend.h"
#include "snapfill/engine.h"
#include "src/kv/kv_cache.h"
#include "src/kv/recall_store.h"
#include "src/model/llama_model.h"

namespace snapfill {

struct RecallOptions {
  int64_t budget = 0;      // entries per layer and KV head brought back
  int64_t span = 0;        // each peak brings its stored neighbours within span/2 (0: single entries)
  bool original_positions = false;  // keys rotate at their input positions, not re-encoded
  bool max_weight = false;  // a key's score: the queries' largest weight, not their sum (--query_votes)
  // RecallForQuestion: every layer and KV head brings back the same input
  // positions first, those the question's queries put the most attention
  // on over all layers and KV heads, each head's squared and summed
  // (--recall_rank=summed); else each its own best (heads).
  bool summed = true;
};

// The options a prefill's settings give a recall of `budget` entries: the
// question's selection (spans or single entries) and votes, and the
// positions. The chunk loop's recall and a recall after a question-less
// prefill (run and needle with --query_aware=false) take the same.
RecallOptions RecallOptionsFor(const PrefillConfig& config, int64_t budget);

// A store's shape and format for `config` (whose store it is, the caller
// fills in).
RecallStoreInfo RecallShape(const LlamaConfig& config, RecallFormat format);

class Recaller {
 public:
  // A stored entry and its score in one KV head.
  struct Peak {
    float score;
    int32_t pos;
    int64_t slot;
  };
  // Per KV head, the best-scored entries, best first.
  using HeadPeaks = std::vector<std::vector<Peak>>;

  Recaller(Backend* backend, const LlamaConfig& config) : backend_(backend), config_(config) {}

  // Scores every stored entry of `layer` with the question's num_q queries
  // q (rotated, [num_q][num_heads][head_dim] with stride q_stride), whose
  // softmax ran over `seen`, and merges the best options.budget per KV head
  // (spans around the strongest) into `cache`'s layer by input position.
  // Each stored key is scored rotated at the index it will take there (or
  // at its input position). `rotated`: the cache's keys are rotated at
  // their indices (a decoder cache; the entries that move are rotated on to
  // their new index); else they are kept before RoPE (the chunk loop's
  // memory). Returns the entries added per KV head.
  absl::StatusOr<int64_t> RecallLayer(RecallStore& store, int64_t layer, const float* q, int64_t q_stride,
                                      int64_t num_q, const KvView& seen, const RecallOptions& options,
                                      KvCache& cache, bool rotated);

  // The two halves of RecallLayer, for a caller that ranks across layers
  // (RecallForQuestion). ScoreLayer: each KV head's best 2 * budget stored
  // entries of `layer`, best first. MergeLayer: brings back budget entries
  // per head into `cache`'s layer, the spans around the positions of
  // `shared` first (in its order; those a head does not hold in the store
  // are skipped), then the spans around the head's own peaks.
  absl::Status ScoreLayer(RecallStore& store, int64_t layer, const float* q, int64_t q_stride, int64_t num_q,
                          const KvView& seen, const RecallOptions& options, const KvCache& cache, HeadPeaks* best);
  absl::StatusOr<int64_t> MergeLayer(RecallStore& store, int64_t layer, const HeadPeaks& best,
                                     const std::vector<int32_t>& shared, const RecallOptions& options, KvCache& cache,
                                     bool rotated);

  // The `count` input positions with the most squared score summed over
  // every layer's and KV head's peaks, best first (ties: the lower
  // position).
  static std::vector<int32_t> RankAcrossLayers(const std::vector<HeadPeaks>& layers, int64_t count);

  // Resident bytes of the scratch for `budget` and `span`.
  static uint64_t ScratchBytes(const LlamaConfig& config, int64_t num_q, int64_t budget, int64_t span);
  // RecallForQuestion's: ScratchBytes, and with options.summed every
  // layer's peaks and the positions ranked across them.
  static uint64_t QuestionScratchBytes(const LlamaConfig& config, int64_t num_q, const RecallOptions& options);
  // Stored entries scored at once (per KV head): the most keys one of the
  // recall's score calls hands the backend.
  static int64_t BlockEntries();

 private:
  Backend* backend_;
  const LlamaConfig& config_;
  // A block of stored keys (slot-major), positions, rotation positions,
  // scores; the question's log-denominators.
  std::vector<float> k_, scores_, lse_;
  std::vector<float> merge_k_, merge_v_;  // a head's entries, merged on the host (a cache in a backend's buffers)
  std::vector<int32_t> pos_, rot_;
};

// `generate --cache` with a recall store: runs `question` (the tokens that
// follow the cached input) through the model over `cache` (a decoder cache,
// keys rotated; next_position where the question starts) and, in every
// layer, recalls into the cache what the question attends to most. The
// question's own K/V are dropped: the caller generates from the cache as
// usual, from *next_position (moved past the entries added when positions
// are re-encoded). The cache needs room for options.budget more entries.
// With options.summed, `ranked` (if given) gets the positions every layer
// brought back first (Recaller::RankAcrossLayers). Returns the entries
// added per layer and KV head.
absl::StatusOr<int64_t> RecallForQuestion(const LlamaModel& model, Backend* backend, KvCache& cache,
                                          int64_t* next_position, RecallStore& store,
                                          const std::vector<int32_t>& question, const RecallOptions& options,
                                          std::vector<int32_t>* ranked = nullptr);

}  // namespace snapfill

#endif  // SNAPFILL_ENGINE_RECALL_H_
