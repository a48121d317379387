#include "src/model/llama_model.h"

#include <cmath>
#include <cstdlib>
#include <set>

#include "absl/strings/str_cat.h"
#include "snapfill/status.h"

namespace snapfill {
namespace {

// Architectures whose GGUF layout and math are the Llama ones, or those
// with the variations LlamaConfig names.
const std::set<std::string>& LlamaArchitectures() {
  static const std::set<std::string> kArchs = {"llama", "mistral", "qwen2", "qwen3", "gemma3"};
  return kArchs;
}

absl::StatusOr<int64_t> GetPositive(const GgufFile& f, const std::string& key) {
  auto v = f.GetUint(key);
  if (!v.ok()) {
    if (absl::IsNotFound(v.status())) {
      return absl::InvalidArgumentError(absl::StrCat("model metadata lacks ", key));
    }
    return v.status();
  }
  // Absurd sizes are refused here, before anything is allocated from them.
  if (*v == 0 || *v > (uint64_t{1} << 24)) {
    return absl::InvalidArgumentError(absl::StrCat(key, " = ", *v, " is out of range [1, 2^24]"));
  }
  return static_cast<int64_t>(*v);
}

// Binds a tensor as a matrix of `rows` × `cols` (GGUF ne = {cols, rows}).
absl::StatusOr<WeightView> BindMatrix(const GgufFile& f, const std::string& name, int64_t rows,
                                      int64_t cols) {
  const GgufTensorInfo* t = f.FindTensor(name);
  if (t == nullptr) return absl::InvalidArgumentError(absl::StrCat("missing tensor ", name));
  if (t->shape.size() != 2 || t->shape[0] != cols || t->shape[1] != rows) {
    std::string got;
    for (int64_t d : t->shape) absl::StrAppend(&got, got.empty() ? "" : ", ", d);
    return absl::InvalidArgumentError(absl::StrCat("tensor ", name, " has shape {", got,
                                                   "}, expected {", cols, ", ", rows, "}"));
  }
  if (!IsSupportedWeightType(t->type)) {
    const char* tn = GetTypeTraits(t->type).name;
    return absl::UnimplementedError(absl::StrCat("tensor ", name, " has type ", tn ? tn : "?",
                                                 ", which snapfill cannot compute with (supported: "
                                                 "F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K)"));
  }
  WeightView w;
  w.data = t->data;
  w.type = t->type;
  w.rows = rows;
  w.cols = cols;
  w.row_bytes = static_cast<size_t>(RowBytes(t->type, cols));
  w.fd = f.fd();
  w.file_offset = f.OffsetOf(t->data);
  return w;
}

// Binds an F32 vector (a norm's weights) as a copy read with pread into
// `owned`: these small tensors lie between the matrices in the file, and a
// read in place would map their neighbours' pages (a whole 2 MiB folio of
// the page cache, on some kernels) beside the backend's copies of them.
absl::StatusOr<const float*> BindVector(const GgufFile& f, const std::string& name, int64_t n,
                                        std::vector<std::vector<float>>* owned) {
  const GgufTensorInfo* t = f.FindTensor(name);
  if (t == nullptr) return absl::InvalidArgumentError(absl::StrCat("missing tensor ", name));
  if (t->type != GgmlType::kF32 || t->num_elements() != n) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", name, " must be F32 with ", n,
                                                   " elements, got ", t->num_elements()));
  }
  std::vector<float>& v = owned->emplace_back(static_cast<size_t>(n));
  SNAPFILL_RETURN_IF_ERROR(f.ReadAt(f.OffsetOf(t->data), v.data(), n * sizeof(float)));
  return v.data();  // moving `owned`'s vectors keeps their buffers
}

absl::StatusOr<LlamaConfig> ReadConfig(const GgufFile& f) {
  LlamaConfig c;
  auto arch = f.GetString("general.architecture");
  if (!arch.ok()) return absl::InvalidArgumentError("model metadata lacks general.architecture");
  c.architecture = *arch;
  if (!LlamaArchitectures().count(c.architecture)) {
    return absl::UnimplementedError(absl::StrCat("architecture \"", c.architecture,
                                                 "\" is not supported (supported: llama, mistral, qwen2, qwen3, gemma3)"));
  }
  const bool gemma3 = c.architecture == "gemma3";
  // llama.cpp's rope type of each (llama_model_rope_type): NeoX for Qwen
  // and Gemma.
  c.rope_neox = c.architecture == "qwen2" || c.architecture == "qwen3" || gemma3;
  c.qk_norm = c.architecture == "qwen3" || gemma3;
  c.post_norms = gemma3;
  c.gelu = gemma3;
  if (auto name = f.GetString("general.name"); name.ok()) c.name = *name;
  const std::string& a = c.architecture;
  SNAPFILL_ASSIGN_OR_RETURN(c.num_layers, GetPositive(f, a + ".block_count"));
  SNAPFILL_ASSIGN_OR_RETURN(c.model_dim, GetPositive(f, a + ".embedding_length"));
  SNAPFILL_ASSIGN_OR_RETURN(c.ffn_dim, GetPositive(f, a + ".feed_forward_length"));
  SNAPFILL_ASSIGN_OR_RETURN(c.num_heads, GetPositive(f, a + ".attention.head_count"));
  c.num_kv_heads = c.num_heads;
  if (f.Has(a + ".attention.head_count_kv")) {
    SNAPFILL_ASSIGN_OR_RETURN(c.num_kv_heads, GetPositive(f, a + ".attention.head_count_kv"));
  }
  if (c.num_heads % c.num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("head_count ", c.num_heads,
                                                   " is not a multiple of head_count_kv ",
                                                   c.num_kv_heads));
  }
  if (f.Has(a + ".attention.key_length")) {
    SNAPFILL_ASSIGN_OR_RETURN(c.head_dim, GetPositive(f, a + ".attention.key_length"));
  } else {
    if (c.model_dim % c.num_heads != 0) {
      return absl::InvalidArgumentError(absl::StrCat("embedding_length ", c.model_dim,
                                                     " is not a multiple of head_count ",
                                                     c.num_heads));
    }
    c.head_dim = c.model_dim / c.num_heads;
  }
  if (f.Has(a + ".attention.value_length")) {
    SNAPFILL_ASSIGN_OR_RETURN(int64_t vdim, GetPositive(f, a + ".attention.value_length"));
    if (vdim != c.head_dim) {
      return absl::UnimplementedError(absl::StrCat("value_length ", vdim, " != key_length ",
                                                   c.head_dim, " is not supported"));
    }
  }
  c.context_length = 4096;
  if (f.Has(a + ".context_length")) {
    SNAPFILL_ASSIGN_OR_RETURN(c.context_length, GetPositive(f, a + ".context_length"));
  }
  c.rope_dim = c.head_dim;
  if (f.Has(a + ".rope.dimension_count")) {
    SNAPFILL_ASSIGN_OR_RETURN(c.rope_dim, GetPositive(f, a + ".rope.dimension_count"));
  }
  if (c.rope_dim > c.head_dim || c.rope_dim % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("rope.dimension_count ", c.rope_dim,
                                                   " must be even and <= head size ", c.head_dim));
  }
  if (f.Has(a + ".rope.freq_base")) {
    SNAPFILL_ASSIGN_OR_RETURN(double base, f.GetFloat(a + ".rope.freq_base"));
    if (!(base > 1.0) || !std::isfinite(base)) {
      return absl::InvalidArgumentError(absl::StrCat("rope.freq_base ", base, " must be > 1"));
    }
    c.rope_freq_base = static_cast<float>(base);
  }
  if (f.Has(a + ".rope.scaling.type")) {
    SNAPFILL_ASSIGN_OR_RETURN(std::string type, f.GetString(a + ".rope.scaling.type"));
    if (type == "linear") {
      SNAPFILL_ASSIGN_OR_RETURN(double factor, f.GetFloat(a + ".rope.scaling.factor"));
      if (!(factor > 0)) return absl::InvalidArgumentError("rope.scaling.factor must be > 0");
      c.rope_freq_scale = static_cast<float>(1.0 / factor);
    } else if (type != "none") {
      return absl::UnimplementedError(absl::StrCat("RoPE scaling \"", type,
                                                   "\" is not supported (supported: none, linear)"));
    }
  } else if (f.Has(a + ".rope.scale_linear")) {
    SNAPFILL_ASSIGN_OR_RETURN(double factor, f.GetFloat(a + ".rope.scale_linear"));
    if (!(factor > 0)) return absl::InvalidArgumentError("rope.scale_linear must be > 0");
    c.rope_freq_scale = static_cast<float>(1.0 / factor);
  }
  if (const GgufTensorInfo* t = f.FindTensor("rope_freqs.weight"); t != nullptr) {
    // Llama 3.1's "llama3" scaling as the converter bakes it in: one factor
    // per rotated pair, dividing its angle (ggml_rope_ext's freq_factors).
    if (t->type != GgmlType::kF32 || t->num_elements() != c.rope_dim / 2) {
      return absl::InvalidArgumentError(absl::StrCat("tensor rope_freqs.weight must be F32 with ", c.rope_dim / 2,
                                                     " elements (rope dimensions / 2), got ", t->num_elements()));
    }
    c.rope_freq_factors.resize(c.rope_dim / 2);
    SNAPFILL_RETURN_IF_ERROR(f.ReadAt(f.OffsetOf(t->data), c.rope_freq_factors.data(),
                                      c.rope_freq_factors.size() * sizeof(float)));
    for (float x : c.rope_freq_factors) {
      if (!(x > 0) || !std::isfinite(x)) {
        return absl::InvalidArgumentError(absl::StrCat("tensor rope_freqs.weight holds ", x, "; factors must be > 0"));
      }
    }
  }
  if (gemma3) {
    // As llama.cpp 84f7129 reads the file (src/models/gemma3.cpp): local
    // layers only where it gives attention.sliding_window; then every
    // sixth layer global unless attention.sliding_window_pattern says
    // otherwise, the local ones at RoPE base 10000 unless
    // rope.freq_base_swa does.
    c.embedding_scale = std::sqrt(static_cast<float>(c.model_dim));
    if (f.Has(a + ".attention.sliding_window")) {
      SNAPFILL_ASSIGN_OR_RETURN(c.sliding_window, GetPositive(f, a + ".attention.sliding_window"));
      c.swa_pattern = 6;
      if (f.Has(a + ".attention.sliding_window_pattern")) {
        SNAPFILL_ASSIGN_OR_RETURN(c.swa_pattern, GetPositive(f, a + ".attention.sliding_window_pattern"));
      }
    }
    if (f.Has(a + ".rope.freq_base_swa")) {
      SNAPFILL_ASSIGN_OR_RETURN(double base, f.GetFloat(a + ".rope.freq_base_swa"));
      if (!(base > 1.0) || !std::isfinite(base)) {
        return absl::InvalidArgumentError(absl::StrCat("rope.freq_base_swa ", base, " must be > 1"));
      }
      c.rope_freq_base_local = static_cast<float>(base);
    }
  }
  if (f.Has(a + ".attention.layer_norm_rms_epsilon")) {
    SNAPFILL_ASSIGN_OR_RETURN(double eps, f.GetFloat(a + ".attention.layer_norm_rms_epsilon"));
    if (!(eps > 0) || eps > 1) {
      return absl::InvalidArgumentError(absl::StrCat("layer_norm_rms_epsilon ", eps,
                                                     " is out of range (0, 1]"));
    }
    c.rms_eps = static_cast<float>(eps);
  }
  return c;
}

}  // namespace

absl::StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::Load(std::unique_ptr<GgufFile> file) {
  std::unique_ptr<LlamaModel> m(new LlamaModel());
  SNAPFILL_ASSIGN_OR_RETURN(m->config_, ReadConfig(*file));
  LlamaConfig& c = m->config_;
  const GgufFile& f = *file;

  const GgufTensorInfo* embd = f.FindTensor("token_embd.weight");
  if (embd == nullptr) return absl::InvalidArgumentError("missing tensor token_embd.weight");
  if (embd->shape.size() != 2) {
    return absl::InvalidArgumentError("tensor token_embd.weight must be 2-D");
  }
  c.vocab_size = embd->shape[1];
  SNAPFILL_ASSIGN_OR_RETURN(m->token_embd_, BindMatrix(f, "token_embd.weight", c.vocab_size, c.model_dim));
  SNAPFILL_ASSIGN_OR_RETURN(m->output_norm_, BindVector(f, "output_norm.weight", c.model_dim, &m->vectors_));
  if (f.FindTensor("output.weight") != nullptr) {
    SNAPFILL_ASSIGN_OR_RETURN(m->output_, BindMatrix(f, "output.weight", c.vocab_size, c.model_dim));
  } else {
    c.tied_embeddings = true;
    m->output_ = m->token_embd_;
  }
  const int64_t q_dim = c.num_heads * c.head_dim;
  const int64_t kv_dim = c.num_kv_heads * c.head_dim;
  // Grown layer by layer as the tensors bind: block_count comes from the
  // file (up to 2^24) and must not size an allocation before the tensors
  // that back it are found.
  m->layers_.clear();
  for (int64_t i = 0; i < c.num_layers; ++i) {
    LlamaLayerWeights& l = m->layers_.emplace_back();
    const std::string p = absl::StrCat("blk.", i, ".");
    SNAPFILL_ASSIGN_OR_RETURN(l.attn_norm, BindVector(f, p + "attn_norm.weight", c.model_dim, &m->vectors_));
    SNAPFILL_ASSIGN_OR_RETURN(l.wq, BindMatrix(f, p + "attn_q.weight", q_dim, c.model_dim));
    SNAPFILL_ASSIGN_OR_RETURN(l.wk, BindMatrix(f, p + "attn_k.weight", kv_dim, c.model_dim));
    SNAPFILL_ASSIGN_OR_RETURN(l.wv, BindMatrix(f, p + "attn_v.weight", kv_dim, c.model_dim));
    SNAPFILL_ASSIGN_OR_RETURN(l.wo, BindMatrix(f, p + "attn_output.weight", c.model_dim, q_dim));
    // Biases: required by qwen2 (as llama.cpp requires them), taken where a
    // llama file has them, and then in every layer.
    const bool has_bias = f.FindTensor(p + "attn_q.bias") != nullptr;
    if (i == 0) c.qkv_bias = has_bias || c.architecture == "qwen2";
    if (c.qkv_bias && !has_bias) return absl::InvalidArgumentError(absl::StrCat("missing tensor ", p, "attn_q.bias"));
    if (!c.qkv_bias && has_bias) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor ", p, "attn_q.bias: layer 0 has no attention biases, layer ", i, " has"));
    }
    if (c.qkv_bias) {
      SNAPFILL_ASSIGN_OR_RETURN(l.bq, BindVector(f, p + "attn_q.bias", q_dim, &m->vectors_));
      SNAPFILL_ASSIGN_OR_RETURN(l.bk, BindVector(f, p + "attn_k.bias", kv_dim, &m->vectors_));
      SNAPFILL_ASSIGN_OR_RETURN(l.bv, BindVector(f, p + "attn_v.bias", kv_dim, &m->vectors_));
    }
    if (c.qk_norm) {
      SNAPFILL_ASSIGN_OR_RETURN(l.q_norm, BindVector(f, p + "attn_q_norm.weight", c.head_dim, &m->vectors_));
      SNAPFILL_ASSIGN_OR_RETURN(l.k_norm, BindVector(f, p + "attn_k_norm.weight", c.head_dim, &m->vectors_));
    }
    if (c.post_norms) {
      SNAPFILL_ASSIGN_OR_RETURN(l.attn_post_norm,
                                BindVector(f, p + "post_attention_norm.weight", c.model_dim, &m->vectors_));
      SNAPFILL_ASSIGN_OR_RETURN(l.ffn_post_norm, BindVector(f, p + "post_ffw_norm.weight", c.model_dim, &m->vectors_));
    }
    SNAPFILL_ASSIGN_OR_RETURN(l.ffn_norm, BindVector(f, p + "ffn_norm.weight", c.model_dim, &m->vectors_));
    SNAPFILL_ASSIGN_OR_RETURN(l.w_gate, BindMatrix(f, p + "ffn_gate.weight", c.ffn_dim, c.model_dim));
    SNAPFILL_ASSIGN_OR_RETURN(l.w_up, BindMatrix(f, p + "ffn_up.weight", c.ffn_dim, c.model_dim));
    SNAPFILL_ASSIGN_OR_RETURN(l.w_down, BindMatrix(f, p + "ffn_down.weight", c.model_dim, c.ffn_dim));
    if (f.FindTensor(p + "attn_output.bias") != nullptr || f.FindTensor(p + "ffn_gate_exps.weight") != nullptr) {
      return absl::UnimplementedError(absl::StrCat("layer ", i,
                                                   " has an output-projection bias or experts, which the "
                                                   "forward pass does not support"));
    }
  }
  for (const GgufTensorInfo& t : f.tensors()) m->weight_bytes_ += t.size_bytes;
  m->file_ = std::move(file);
  return m;
}

absl::StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::Open(const std::string& path) {
  SNAPFILL_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> file, GgufFile::Open(path));
  auto model = Load(std::move(file));
  if (!model.ok()) {
    return absl::Status(model.status().code(),
                        absl::StrCat("loading ", path, ": ", model.status().message()));
  }
  return model;
}

std::vector<const WeightView*> LlamaModel::DecodeMatrices() const {
  std::vector<const WeightView*> out;
  for (const LlamaLayerWeights& l : layers_) {
    for (const WeightView* w : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) out.push_back(w);
  }
  out.push_back(&output_);
  return out;
}

}  // namespace snapfill
