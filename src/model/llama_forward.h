// The Llama forward pass, written against Backend and reading top to bottom
// like the math (llama2.c's forward(), gemma's TransformerLayer):
//   x = embed(tokens)
//   per layer: x += Wo · attend(rope(Wq·n(x)), kv ∪ rope(Wk·n(x)), Wv·n(x))
//              (Qwen: + biases on Q, K, V; RMSNorm of each head of Q and K)
//              x += Wdown · (silu(Wgate·n(x)) ⊙ Wup·n(x))
//   logits = Wout · norm(x)   (only for the rows asked for)
// Scratch activations are allocated once for the largest batch (llama2.c's
// RunState) and never inside the layer loop.
#ifndef SNAPFILL_MODEL_LLAMA_FORWARD_H_
#define SNAPFILL_MODEL_LLAMA_FORWARD_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "snapfill/backend.h"
#include "src/kv/kv_cache.h"
#include "src/model/llama_model.h"

namespace snapfill {

class LlamaForward {
 public:
  // Scratch for batches of up to `max_tokens` tokens.
  // Bytes of the activations Create() allocates for `max_tokens` tokens; of
  // those a batch writes (they become resident only then), leaving out the
  // feed-forward block's gate/up buffers where `fused_layers` (FusesLayers)
  // and also the normalized rows xn where `fused_layers` and no logits are
  // taken of a whole batch (the norms are folded into the products then).
  static uint64_t ScratchBytes(const LlamaConfig& c, int64_t max_tokens, bool fused_layers = false,
                               bool batch_logits = true);
  // Whether `backend` runs every layer of `model` fused for batches of m
  // rows (Backend::FusesLayer for each layer's weights).
  static bool FusesLayers(const LlamaModel& model, const Backend& backend, int64_t m);
  // Bytes the weights hold resident once a forward over `model` on
  // `backend` has prepared its batches (decode = false) or its one-token
  // steps (decode = true): token_embd and every matrix read in place, whole,
  // the backend's copies of the others (none on the host for a GPU's, which
  // live in its memory), and the norms' copies.
  static uint64_t ResidentWeightBytes(const LlamaModel& model, const Backend& backend, bool decode);
  // Bytes a device holds of the weights once they are uploaded: its copies
  // of the matrices (WeightCopy::on_device) and of the vectors (the norms'
  // weights and the biases, each uploaded once; counted whole, an upper
  // bound). 0 where no copy is the device's.
  static uint64_t DeviceWeightBytes(const LlamaModel& model, const Backend& backend);
  static absl::StatusOr<std::unique_ptr<LlamaForward>> Create(const LlamaModel& model,
                                                              Backend* backend,
                                                              int64_t max_tokens);

  // Runs n tokens (at positions pos[0..n)) through every layer, appending
  // their K/V to `kv` after the entries already there; attention of token t
  // sees every earlier cache entry and the batch causally. If num_logits > 0
  // writes the logits of the last num_logits tokens to
  // logits[num_logits, vocab_size]. n may exceed max_tokens: the batch is
  // split into max_tokens pieces, which gives the same result. The last
  // layer runs past the attention (Wo, the feed-forward block) only for the
  // rows whose logits are asked for, so BatchLogits() serves those rows.
  absl::Status Forward(const int32_t* tokens, int64_t n, const int32_t* pos, KvCache& kv,
                       int64_t num_logits, float* logits);

  // The attention step of one layer, supplied by the caller (the chunk loop
  // of snapfill's compressed prefill): given the batch's queries, keys and
  // values before RoPE, [n, num_heads | num_kv_heads, head_dim] with token
  // strides q_stride / kv_stride, write the attention output
  // [n, num_heads * head_dim] to `out`, at least its last out_rows rows
  // (out_rows <= n; the rows before them are not read). q, k and v may be
  // modified.
  using AttendFn =
      std::function<absl::Status(int64_t layer, float* q, int64_t q_stride, float* k, float* v,
                                 int64_t kv_stride, int64_t n, int64_t out_rows, float* out)>;

  // Runs n <= max_tokens tokens through every layer with `attend` as the
  // attention step; logits as in Forward. hidden_rows (num_logits <= it
  // <= n): the final hidden states are computed for the last hidden_rows
  // rows only. The last layer's output of the other rows feeds nothing but
  // the logits, so there `attend` is asked for those rows' outputs only and
  // the rest of the layer (Wo, the feed-forward block) runs on them alone:
  // a chunk loop that keeps only the KV cache passes 0, or 1 for the logits
  // of the input's last token (about 1/30 of the layers' work for this
  // model). BatchLogits() serves those rows.
  absl::Status ForwardWithAttention(const int32_t* tokens, int64_t n, const AttendFn& attend,
                                    int64_t num_logits, float* logits, int64_t hidden_rows);

  // Logits of rows [first, first + rows) of the batch the last
  // ForwardWithAttention() or Forward() call ran, among its last
  // hidden_rows (for Forward, among the rows of its last piece of at most
  // max_tokens whose logits it made), written to logits[rows, vocab_size]. The
  // batch's final hidden states stay in the scratch until the next call, so
  // a caller can score every token of a long batch a few rows at a time
  // instead of materializing n x vocab logits (the chunk loop's ppl).
  absl::Status BatchLogits(int64_t first, int64_t rows, float* logits);

  int64_t max_tokens() const { return max_tokens_; }
  const LlamaModel& model() const { return model_; }
  // Bytes of scratch activations.
  uint64_t scratch_bytes() const;

  // A KV cache shaped for this model with `capacity` entries per head.
  absl::StatusOr<std::unique_ptr<KvCache>> NewKvCache(int64_t capacity) const;

 private:
  LlamaForward(const LlamaModel& model, Backend* backend, int64_t max_tokens);
  absl::Status ForwardBatch(const int32_t* tokens, int64_t n, const int32_t* pos, KvCache& kv,
                            int64_t num_logits, float* logits);
  template <typename Attend>
  absl::Status RunLayers(const int32_t* tokens, int64_t n, const Attend& attend, int64_t num_logits,
                         float* logits, int64_t hidden_rows);

  // At the first one-token forward after a batch (decoding starts): the
  // backend makes its decode copy of each weight matrix (if it keeps one)
  // and the file's pages it copied are given back as it goes, so the copy
  // takes their place in memory instead of adding to it. A later batch maps
  // them again from the page cache.
  void PrepareDecode();
  bool decode_prepared_ = false;
  // Before the first batch: the copies that batch products read as well
  // (Backend::CopyOf with WeightUse::kBatch), made the same way, so prefill
  // reads them instead of the file's pages, which go back then. Once per
  // forward object (Backend::PrepareWeights: the backend reads those copies
  // without checking the matrices' bytes again).
  void PrepareBatch();
  bool batch_prepared_ = false;
  // Both: every matrix the backend reads in place (and token_embd, whose
  // rows the lookups read) has its pages populated, and every other is
  // copied with pread and its pages given back, so what the weights hold
  // resident is ResidentWeightBytes, whatever the page cache held.
  void SettleWeights(bool decode);
  // Where each matrix is read in the batches (decode = false) or the
  // one-token steps: in place, or through the backend's copy. token_embd
  // comes first and is always read in place; `shares_embd` marks a tied
  // output head. SettleWeights acts on it, ResidentWeightBytes counts it.
  struct Placement {
    const WeightView* w;
    WeightCopy copy;
    bool shares_embd;
  };
  static std::vector<Placement> Placements(const LlamaModel& model, const Backend& backend, bool decode);

  const LlamaModel& model_;
  Backend* backend_;
  int64_t max_tokens_;
  int64_t last_batch_ = 0;    // rows of the last batch (BatchLogits)
  int64_t hidden_first_ = 0;  // its first row whose final hidden state is in x_
  // Rows of the scratch that may be resident: a batch smaller than this
  // gives the pages of the rows past it back first (ReleaseRowsFrom), so a
  // chunk loop whose chunks shrink (IMDC) holds only its current chunk's
  // activations, not its largest's.
  int64_t touched_rows_ = 0;
  void ReleaseRowsFrom(int64_t rows);
  // The backend's buffers (on the host, paged: rows cost resident memory
  // once written). [max_tokens, model_dim] each
  std::unique_ptr<BackendBuffer> x_, xn_;
  // [max_tokens, num_heads * head_dim]
  std::unique_ptr<BackendBuffer> q_, attn_;
  // [max_tokens, num_kv_heads * head_dim]
  std::unique_ptr<BackendBuffer> k_, v_;
  // [max_tokens, ffn_dim]
  std::unique_ptr<BackendBuffer> gate_, up_;
  std::vector<Backend::RowGather> kv_copies_;  // Forward's copies into the cache
};

}  // namespace snapfill

#endif  // SNAPFILL_MODEL_LLAMA_FORWARD_H_
