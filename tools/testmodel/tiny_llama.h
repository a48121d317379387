// Tiny random-weight Llama models in GGUF, for tests and the golden
// end-to-end check (llama2.c's stories260K idea, without downloads).
//
// The file looks exactly like a llama.cpp Llama GGUF: the `llama.*` hparams,
// a byte-level GPT-2 BPE vocabulary (`tokenizer.ggml.model` = "gpt2") and
// tensors named and shaped as llama.cpp expects (ne[0] first):
//   token_embd.weight         [model_dim, vocab_size]
//   blk.N.attn_norm.weight    [model_dim]
//   blk.N.attn_q.weight       [model_dim, num_heads * head_dim]
//   blk.N.attn_k.weight       [model_dim, num_kv_heads * head_dim]
//   blk.N.attn_v.weight       [model_dim, num_kv_heads * head_dim]
//   blk.N.attn_output.weight  [num_heads * head_dim, model_dim]
//   blk.N.ffn_norm.weight     [model_dim]
//   blk.N.ffn_gate.weight     [model_dim, ffn_dim]
//   blk.N.ffn_up.weight       [model_dim, ffn_dim]
//   blk.N.ffn_down.weight     [ffn_dim, model_dim]
//   output_norm.weight        [model_dim]
//   output.weight             [model_dim, vocab_size]  (only when untied)
// Norms are F32; the 2-D tensors are F32, or F16 with `f16_matrices`, or of
// `matrix_type` (and ffn_down of `ffn_down_type`).
//
// Weights are a pure function of the options. Two generators make them:
//  - the original one (models of up to kTinyLlamaMaxOriginalWeights weights,
//    unless fast_weights): each tensor draws from its own std::mt19937 seeded
//    by seed_seq{seed, tensor index}, and normal variates are Irwin-Hall sums
//    of 12 uniforms computed exactly in double, so the bytes do not depend on
//    the standard library's distributions or on libm. The goldens pin it.
//  - the fast one (larger models, up to kTinyLlamaMaxWeights, or any model
//    with fast_weights): element i of tensor t comes from a counter-based
//    hash, splitmix64's finalizer of (seed, t, i); a normal variate is the
//    Irwin-Hall sum of the hash's four 16-bit parts, scaled to the same
//    standard deviation as the original (one exact int-to-float conversion
//    and one multiply); a norm gain is uniform in [0.9, 1.1) on a 2^-24
//    grid, computed in integers. Rows are generated and quantized on
//    num_threads threads; each row is computed the same way whichever thread
//    takes it, so the bytes do not depend on the thread count. Its Q8_0,
//    Q4_0 and F16 rows are byte for byte ref::QuantizeRow's (faster copies).
//    Generated tensors are produced one at a time while the file is
//    written, so WriteTinyLlamaGguf holds about two tensors in memory (one
//    filled while the previous one is written), not the file.
#ifndef SNAPFILL_TOOLS_TESTMODEL_TINY_LLAMA_H_
#define SNAPFILL_TOOLS_TESTMODEL_TINY_LLAMA_H_

#include <cstdint>
#include <string>
#include <vector>

#include "snapfill/dtype.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace snapfill {

struct TinyLlamaOptions {
  uint64_t seed = 1;
  // general.architecture: llama, or qwen2 (adds attn_{q,k,v}.bias, N(0,
  // 0.3^2)) or qwen3 (adds attn_{q,k}_norm.weight, gains as the norms'),
  // or gemma3 (Q/K norms, post_attention_norm and post_ffw_norm, and the
  // sliding window below), with the keys under that name.
  std::string architecture = "llama";
  // gemma3 only, written where > 0: attention.sliding_window (without it
  // every layer is global, as llama.cpp reads the file) and
  // attention.sliding_window_pattern (every pattern-th layer global; 6
  // where not written).
  int sliding_window = 0;
  int swa_pattern = 0;
  int num_layers = 2;
  int model_dim = 64;
  int num_heads = 4;
  int num_kv_heads = 2;
  int head_dim = 0;  // 0: model_dim / num_heads (16 by default)
  int ffn_dim = 128;
  int context_length = 512;
  int num_merges = -1;         // BPE merges to include; -1: all TinyLlamaMaxMerges()
  bool tie_embeddings = true;  // true: no output.weight (logits use token_embd)
  bool f16_matrices = false;   // store 2-D tensors as F16
  // The 2-D tensors' type where f16_matrices is false: F32, or any type
  // ref::QuantizeRow writes (its test quantizers; a K-quant needs every
  // matrix's row length, model_dim and ffn_dim, a multiple of 256).
  GgmlType matrix_type = GgmlType::kF32;
  // ffn_down's type where it is not F32 (else matrix_type's): a file of mixed
  // types, as llama.cpp's Q4_K_M and the like are.
  GgmlType ffn_down_type = GgmlType::kF32;
  float rope_freq_base = 10000.0f;
  float rms_norm_eps = 1e-5f;
  // Use the fast generator even where the original one would be used (a
  // model of at most kTinyLlamaMaxOriginalWeights weights). Larger models
  // always use it.
  bool fast_weights = false;
  // Threads of the fast generator, 0..1024; 0: hardware_concurrency(). The
  // bytes do not depend on it.
  int num_threads = 0;
};

// Models of at most this many weights use the original generator (unless
// fast_weights); larger ones the fast one, up to kTinyLlamaMaxWeights (a
// Llama-2-7B shape has about 2^32.6).
inline constexpr int64_t kTinyLlamaMaxOriginalWeights = int64_t{1} << 28;
inline constexpr int64_t kTinyLlamaMaxWeights = int64_t{1} << 34;

// Returns the model's weight count (every tensor's elements), or -1 where
// ValidateTinyLlamaOptions fails.
int64_t TinyLlamaWeightCount(const TinyLlamaOptions& opts);

// Returns whether the fast generator makes the model's weights.
bool TinyLlamaUsesFastWeights(const TinyLlamaOptions& opts);

// Shapes of real models, for measuring speed with synthetic weights (the
// vocabulary stays the tiny built-in one):
//   smollm2-135m  30 layers, dim 576, 9/3 heads, ffn 1536, context 8192, tied
//   llama2-7b     32 layers, dim 4096, 32/32 heads, ffn 11008, context 4096,
//                 untied (output.weight present)
// TinyLlamaPresetNames() lists them; ApplyTinyLlamaPreset sets num_layers,
// model_dim, num_heads, num_kv_heads, head_dim (0), ffn_dim, context_length
// and tie_embeddings, leaving every other field as it was. An unknown name
// is InvalidArgument listing the known ones.
std::vector<std::string> TinyLlamaPresetNames();
absl::Status ApplyTinyLlamaPreset(const std::string& name, TinyLlamaOptions* opts);

// The tokenizer stored in the tiny model. Token ids: 0..255 are the bytes
// (id == byte value, text via GPT-2's bytes_to_unicode, so ' ' is "Ġ"), then
// one token per merge in rank order, then <|endoftext|> (bos and eos),
// <|im_start|>, <|im_end|> as control tokens (type 3; all others type 1).
struct TinyLlamaVocab {
  std::vector<std::string> tokens;
  std::vector<int32_t> token_types;
  std::vector<std::string> merges;  // "Ġ t": the two parts, space-separated
  int32_t bos_id = 0;
  int32_t eos_id = 0;
  int32_t im_start_id = 0;
  int32_t im_end_id = 0;
};

// Returns the number of merges in the built-in merge table.
int TinyLlamaMaxMerges();

// Returns the vocabulary with the first `num_merges` merges (-1: all);
// InvalidArgument if num_merges is outside -1..TinyLlamaMaxMerges().
absl::StatusOr<TinyLlamaVocab> MakeTinyLlamaVocab(int num_merges);

// Returns InvalidArgument naming the first bad field (an unknown
// architecture, non-positive sizes,
// num_heads not a multiple of num_kv_heads, model_dim not divisible by
// num_heads when head_dim is 0, odd head_dim, a model of more than
// kTinyLlamaMaxWeights weights, a negative num_threads).
absl::Status ValidateTinyLlamaOptions(const TinyLlamaOptions& opts);

// Returns the bytes of a tiny Llama GGUF v3 file built from `opts` (the
// whole file in memory: for large models use WriteTinyLlamaGguf).
absl::StatusOr<std::string> MakeTinyLlamaGguf(const TinyLlamaOptions& opts);

// Writes the bytes of MakeTinyLlamaGguf(opts) to `path` atomically
// (AtomicFileWriter: a temporary beside it, renamed over it; overwriting
// it). Fast-generator tensors are streamed one at a time.
absl::Status WriteTinyLlamaGguf(const std::string& path, const TinyLlamaOptions& opts);

namespace tiny_llama {

// Returns the IEEE binary16 bits nearest to `x`, ties to even. Overflow gives
// infinity, values below half the smallest subnormal give signed zero, NaN
// stays NaN (quiet, sign and top payload bits kept).
uint16_t FloatToHalf(float x);

// out[i] = FloatToHalf(x[i]) for every non-NaN x[i] (a NaN gives an
// infinity), branch-free so that it vectorizes: the fast generator's F16.
void FloatToHalfRow(const float* x, uint16_t* out, int64_t n);

// Returns the float equal to the binary16 `h` (exact: every half is a float).
float HalfToFloat(uint16_t h);

}  // namespace tiny_llama
}  // namespace snapfill

#endif  // SNAPFILL_TOOLS_TESTMODEL_TINY_LLAMA_H_
