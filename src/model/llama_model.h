// A Llama-family model loaded from GGUF: hyper-parameters from the metadata
// (llama.cpp's key names) and a table of weight views into the mapped file.
// Nothing is copied: weights live as long as the GgufFile.
#ifndef SNAPFILL_MODEL_LLAMA_MODEL_H_
#define SNAPFILL_MODEL_LLAMA_MODEL_H_

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "snapfill/backend.h"
#include "src/gguf/gguf_reader.h"

namespace snapfill {

// The architectures are configurations of one forward pass (llama.cpp's
// llm_build_llama / _qwen2 / _qwen3): llama and mistral as they are; qwen2
// adds biases to Q, K and V; qwen3 an RMSNorm over each head of Q and K
// (before RoPE); both rotate NeoX pairs; gemma3 (llama.cpp's
// llm_build_gemma3_iswa) scales the embeddings by √model_dim, normalizes
// each block's output as well as its input, gates the feed-forward block
// with GELU, norms Q and K per head, and makes all but every
// swa_pattern-th layer local: a sliding window over the last
// sliding_window positions, with its own RoPE base.
struct LlamaConfig {
  std::string architecture;   // general.architecture ("llama", "mistral", "qwen2", "qwen3", "gemma3")
  std::string name;           // general.name, if any
  int64_t num_layers = 0;     // {arch}.block_count
  int64_t model_dim = 0;      // {arch}.embedding_length
  int64_t ffn_dim = 0;        // {arch}.feed_forward_length
  int64_t num_heads = 0;      // {arch}.attention.head_count
  int64_t num_kv_heads = 0;   // {arch}.attention.head_count_kv (defaults to num_heads)
  int64_t head_dim = 0;       // {arch}.attention.key_length, else model_dim / num_heads
  int64_t vocab_size = 0;     // rows of token_embd
  int64_t context_length = 0; // {arch}.context_length (training context)
  int64_t rope_dim = 0;       // {arch}.rope.dimension_count (defaults to head_dim)
  float rope_freq_base = 10000.0f;
  float rope_freq_scale = 1.0f;  // 1 / {arch}.rope.scaling.factor for linear scaling
  bool rope_neox = false;        // false: Llama's adjacent-pair rotation
  // rope_freqs.weight (Llama 3.1 and later: each pair's wavelength
  // stretched by its factor), rope_dim / 2 values; empty for none.
  std::vector<float> rope_freq_factors;
  float rms_eps = 1e-5f;
  bool tied_embeddings = false;  // no output.weight: logits use token_embd
  bool qkv_bias = false;         // attn_{q,k,v}.bias in every layer (qwen2; optional for llama)
  bool qk_norm = false;          // attn_{q,k}_norm.weight [head_dim] in every layer (qwen3, gemma3)
  float embedding_scale = 0.0f;  // token embeddings times this (gemma3: √model_dim); 0: none
  bool post_norms = false;       // post_attention_norm / post_ffw_norm after each block (gemma3)
  bool gelu = false;             // the feed-forward gate is GELU (tanh form), not SiLU (gemma3)
  // Local layers (gemma3): a query at position p sees keys at p' with
  // p - p' < sliding_window; layer l is local where l % swa_pattern <
  // swa_pattern - 1. 0: every layer global.
  int64_t sliding_window = 0;
  int64_t swa_pattern = 0;
  float rope_freq_base_local = 10000.0f;  // the local layers' RoPE base (scale 1, no factors)

  bool IsLocal(int64_t layer) const {
    return sliding_window > 0 && swa_pattern > 0 && layer % swa_pattern < swa_pattern - 1;
  }
  // The rotation of `layer` (the factors point into this config).
  RopeSpec rope(int64_t layer) const {
    if (IsLocal(layer)) return {rope_dim, rope_freq_base_local, 1.0f, rope_neox, nullptr};
    return {rope_dim, rope_freq_base, rope_freq_scale, rope_neox,
            rope_freq_factors.empty() ? nullptr : rope_freq_factors.data()};
  }
};

// `count` query rows of the model's heads at q, `stride` floats apart,
// scaled by 1/sqrt(head_dim) (the attention-family ops' Queries).
inline Queries LlamaQueries(const LlamaConfig& c, const float* q, int64_t stride, int64_t count) {
  return {q, stride, count, c.num_heads, c.num_kv_heads, c.head_dim, 1.0f / std::sqrt(static_cast<float>(c.head_dim))};
}

struct LlamaLayerWeights {
  const float* attn_norm = nullptr;  // [model_dim] (copies owned by the model)
  WeightView wq;                     // [num_heads * head_dim, model_dim]
  WeightView wk;                     // [num_kv_heads * head_dim, model_dim]
  WeightView wv;                     // [num_kv_heads * head_dim, model_dim]
  WeightView wo;                     // [model_dim, num_heads * head_dim]
  const float* bq = nullptr;         // [num_heads * head_dim] where qkv_bias
  const float* bk = nullptr;         // [num_kv_heads * head_dim] where qkv_bias
  const float* bv = nullptr;         // [num_kv_heads * head_dim] where qkv_bias
  const float* q_norm = nullptr;     // [head_dim] where qk_norm
  const float* k_norm = nullptr;     // [head_dim] where qk_norm
  const float* attn_post_norm = nullptr;  // [model_dim] where post_norms
  const float* ffn_post_norm = nullptr;   // [model_dim] where post_norms
  const float* ffn_norm = nullptr;   // [model_dim]
  WeightView w_gate;                 // [ffn_dim, model_dim]
  WeightView w_up;                   // [ffn_dim, model_dim]
  WeightView w_down;                 // [model_dim, ffn_dim]
};

class LlamaModel {
 public:
  // Reads the config and binds every weight, checking names, shapes and
  // types. Unimplemented names an unsupported architecture, tensor type or
  // RoPE variant; InvalidArgument/DataLoss a missing or misshapen tensor.
  static absl::StatusOr<std::unique_ptr<LlamaModel>> Load(std::unique_ptr<GgufFile> file);
  static absl::StatusOr<std::unique_ptr<LlamaModel>> Open(const std::string& path);

  const LlamaConfig& config() const { return config_; }
  const GgufFile& gguf() const { return *file_; }
  const WeightView& token_embd() const { return token_embd_; }  // [vocab, model_dim]
  const WeightView& output() const { return output_; }          // [vocab, model_dim]
  const float* output_norm() const { return output_norm_; }     // [model_dim]
  const LlamaLayerWeights& layer(int64_t i) const { return layers_[i]; }
  // Bytes of tensor data in the file.
  uint64_t weight_bytes() const { return weight_bytes_; }
  // The matrices one decode step multiplies a token by, each once: every
  // layer's seven and the output head (which may share token_embd's data,
  // never a layer's).
  std::vector<const WeightView*> DecodeMatrices() const;
  // Bytes of the vectors (the norms' weights) the model copied at load.
  uint64_t copied_vector_bytes() const {
    uint64_t n = 0;
    for (const std::vector<float>& v : vectors_) n += v.size() * sizeof(float);
    return n;
  }

 private:
  LlamaModel() = default;
  std::unique_ptr<GgufFile> file_;
  LlamaConfig config_;
  WeightView token_embd_;
  WeightView output_;
  const float* output_norm_ = nullptr;
  std::vector<LlamaLayerWeights> layers_;
  std::vector<std::vector<float>> vectors_;  // the norms' weights, copied (BindVector)
  uint64_t weight_bytes_ = 0;
};

}  // namespace snapfill

#endif  // SNAPFILL_MODEL_LLAMA_MODEL_H_
