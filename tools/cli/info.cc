// snapfill info: what a model file holds.
#include <algorithm>
#include <cstdio>
#include <map>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "snapfill/status.h"
#include "tools/cli/commands.h"
#include "tools/cli/common.h"
#include "tools/cli/roofline.h"
#include "tools/cli/flags.h"

namespace snapfill::cli {

absl::Status RunInfo() {
  const std::string path = ResolveModelPath(absl::GetFlag(FLAGS_model));
  SNAPFILL_ASSIGN_OR_RETURN(auto model, LlamaModel::Open(path));
  const LlamaConfig& c = model->config();
  const GgufFile& f = model->gguf();
  std::printf("file:            %s (GGUF v%u, %s)\n", path.c_str(), f.version(),
              HumanBytes(f.file_size()).c_str());
  std::printf("name:            %s\n", c.name.c_str());
  std::printf("architecture:    %s\n", c.architecture.c_str());
  std::printf("layers:          %lld\n", (long long)c.num_layers);
  std::printf("model_dim:       %lld\n", (long long)c.model_dim);
  std::printf("ffn_dim:         %lld\n", (long long)c.ffn_dim);
  std::printf("heads:           %lld (KV heads %lld, grouped-query %lldx)\n", (long long)c.num_heads,
              (long long)c.num_kv_heads, (long long)(c.num_heads / c.num_kv_heads));
  std::printf("head_dim:        %lld\n", (long long)c.head_dim);
  std::printf("vocab_size:      %lld\n", (long long)c.vocab_size);
  std::printf("context_length:  %lld (training)\n", (long long)c.context_length);
  std::string factors;
  if (!c.rope_freq_factors.empty()) {
    const auto [lo, hi] = std::minmax_element(c.rope_freq_factors.begin(), c.rope_freq_factors.end());
    factors = absl::StrFormat(", frequency factors %g..%g (rope_freqs)", *lo, *hi);
  }
  std::printf("rope:            %s, base %.1f, dims %lld, freq_scale %g%s\n",
              c.rope_neox ? "neox" : "norm", c.rope_freq_base, (long long)c.rope_dim,
              c.rope_freq_scale, factors.c_str());
  std::printf("rms_eps:         %g\n", c.rms_eps);
  std::vector<std::string> variations;
  if (c.qkv_bias) variations.push_back("biases on Q, K, V");
  if (c.qk_norm) variations.push_back("RMSNorm of each Q and K head");
  if (!variations.empty()) std::printf("attention:       %s\n", absl::StrJoin(variations, "; ").c_str());
  int64_t local = 0;
  std::vector<int64_t> global;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    local += c.IsLocal(l);
    if (!c.IsLocal(l)) global.push_back(l);
  }
  if (local > 0) {
    std::printf("sliding window:  %lld positions in %lld of %lld layers (global: %s), RoPE base %.1f; the chunk "
                "loop keeps exactly that window in them\n",
                (long long)c.sliding_window, (long long)local, (long long)c.num_layers,
                absl::StrJoin(global, ", ").c_str(), c.rope_freq_base_local);
  }
  std::printf("tied embeddings: %s\n", c.tied_embeddings ? "yes" : "no");
  std::map<std::string, std::pair<int, uint64_t>> types;
  uint64_t params = 0;
  for (const GgufTensorInfo& t : f.tensors()) {
    const char* tn = GetTypeTraits(t.type).name;
    auto& e = types[tn ? tn : "?"];
    e.first++;
    e.second += t.size_bytes;
    params += t.num_elements();
  }
  std::printf("parameters:      %.1f M\n", params / 1e6);
  std::printf("weights:         %s in %zu tensors\n", HumanBytes(model->weight_bytes()).c_str(),
              f.tensors().size());
  for (const auto& [name, e] : types) {
    std::printf("  %-6s %4d tensors, %s\n", name.c_str(), e.first, HumanBytes(e.second).c_str());
  }
  // KV bytes per token, the figure that decides how much a full cache costs
  // (a sliding-window layer holds its window whatever the length).
  const uint64_t layer_entry = 2ull * c.num_kv_heads * c.head_dim * sizeof(float);
  const uint64_t kv_per_token = (c.num_layers - local) * layer_entry;
  const uint64_t full = kv_per_token * c.context_length +
                        local * layer_entry * std::min<int64_t>(c.sliding_window, c.context_length);
  std::printf("KV per token:    %s (f32%s), full %lld-token context: %s\n", HumanBytes(kv_per_token).c_str(),
              local > 0 ? ", global layers" : "", (long long)c.context_length, HumanBytes(full).c_str());
  const absl::StatusOr<std::string> gpu = DescribeCudaDevice();
  std::printf("GPU:             %s\n", gpu.ok() ? gpu->c_str() : std::string(gpu.status().message()).c_str());
  std::string timings_source;
  SNAPFILL_ASSIGN_OR_RETURN(auto backend, BackendFromFlags(model.get(), &timings_source));
  std::printf("kernels:         %s, %d threads (SNAPFILL_CPU=generic|avx2|avxvnni|avx512 picks a lower level)\n",
              backend->kernels().c_str(), backend->num_threads());
  if (const std::string timed = backend->kernel_timings(); !timed.empty()) {
    std::printf("kernels timed:   %s (the fastest is taken; --kernels; %s)\n", timed.c_str(),
                timings_source.empty() ? "timed now" : timings_source.c_str());
  }
  std::printf("thread waits:    %s\n", backend->thread_waits().c_str());
  // The instructions' peaks here, and what they allow the products of a
  // token of prefill (tools/cli/roofline.h).
  const BackendProfile::Peaks peaks =
      backend->profile() != nullptr ? backend->profile()->MeasurePeaks() : BackendProfile::Peaks{};
  if (const std::string line = PeaksLine(peaks); !line.empty()) {
    std::printf("peaks:           %s\n", line.substr(line.find(':') + 2).c_str());
    const double qd = static_cast<double>(c.num_heads * c.head_dim), kvd = static_cast<double>(c.num_kv_heads * c.head_dim);
    const double dim = static_cast<double>(c.model_dim);
    const double ops = 2.0 * c.num_layers * (dim * (qd + 2 * kvd) + qd * dim + 3.0 * dim * c.ffn_dim);
    // (The feed-forward matrices' type: most of the work.)
    const bool int8 = backend->QuantizesActivations(model->layer(0).w_gate.type);
    const BackendProfile::Peak& products = int8 ? peaks.int8_products : peaks.f32;
    if (products.ops_per_second > 0) {
      std::printf("prefill ceiling: %.0f tokens/s for the layers' products alone (%.1f MOP a token at %s's "
                  "peak; the attention adds %.1f kOP a token per key it sees)\n",
                  products.ops_per_second / ops, ops * 1e-6, products.instruction.c_str(),
                  4.0 * c.num_layers * c.num_heads * c.head_dim * 1e-3);
    }
  }
  auto tok = Tokenizer::FromGguf(f);
  if (tok.ok()) {
    std::printf("tokenizer:       %s (pre-tokenizer %s), %d tokens\n",
                f.GetString("tokenizer.ggml.model").value_or("?").c_str(),
                f.GetString("tokenizer.ggml.pre").value_or("default").c_str(),
                (*tok)->vocab_size());
  } else {
    std::printf("tokenizer:       unusable: %s\n", tok.status().ToString().c_str());
  }
  auto tmpl = f.GetString("tokenizer.chat_template");
  std::printf("chat template:   %s\n",
              tmpl.ok() ? ChatTemplateKindName(DetectChatTemplate(*tmpl).kind) : "none");
  if (absl::GetFlag(FLAGS_verbosity) >= 1) {
    std::printf("metadata:\n");
    for (const GgufKv& kv : f.metadata()) {
      std::printf("  %-40s %s[%llu]\n", kv.key.c_str(), GgufValueTypeName(kv.value.type),
                  (unsigned long long)kv.value.size());
    }
  }
  return absl::OkStatus();
}

}  // namespace snapfill::cli
