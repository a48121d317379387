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
// Weights are a pure function of the options: each tensor draws from its own
// std::mt19937 seeded by seed_seq{seed, tensor index}, and normal variates are
// Irwin-Hall sums of 12 uniforms computed exactly in double, so the bytes do
// not depend on the standard library's distributions or on libm.
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
};

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

// Returns InvalidArgument naming the first bad field (non-positive sizes,
// num_heads not a multiple of num_kv_heads, model_dim not divisible by
// num_heads when head_dim is 0, odd head_dim, a model too large to build).
absl::Status ValidateTinyLlamaOptions(const TinyLlamaOptions& opts);

// Returns the bytes of a tiny Llama GGUF v3 file built from `opts`.
absl::StatusOr<std::string> MakeTinyLlamaGguf(const TinyLlamaOptions& opts);

// Writes MakeTinyLlamaGguf(opts) to `path` atomically (overwriting it).
absl::Status WriteTinyLlamaGguf(const std::string& path, const TinyLlamaOptions& opts);

namespace tiny_llama {

// Returns the IEEE binary16 bits nearest to `x`, ties to even. Overflow gives
// infinity, values below half the smallest subnormal give signed zero, NaN
// stays NaN (quiet, sign and top payload bits kept).
uint16_t FloatToHalf(float x);

// Returns the float equal to the binary16 `h` (exact: every half is a float).
float HalfToFloat(uint16_t h);

}  // namespace tiny_llama
}  // namespace snapfill

#endif  // SNAPFILL_TOOLS_TESTMODEL_TINY_LLAMA_H_
