#include "tools/cli/memory_budget.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "src/model/llama_forward.h"
#include "tools/cli/common.h"

namespace snapfill::cli {

absl::StatusOr<uint64_t> ParseByteSize(std::string_view text) {
  const std::string s(text);
  auto bad = [&] {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max_memory=\"", s, "\" is not a size: use bytes or a number with K, M, G or T "
                              "(binary units), e.g. 800M or 1.5G"));
  };
  if (s.empty() || !(std::isdigit(static_cast<unsigned char>(s[0])) || s[0] == '.')) return bad();
  char* end = nullptr;
  const double value = std::strtod(s.c_str(), &end);
  std::string unit = absl::AsciiStrToUpper(std::string(end));
  if (!unit.empty() && unit.back() == 'B') unit.pop_back();
  if (!unit.empty() && unit.back() == 'I') unit.pop_back();
  double scale = 1;
  if (unit == "K") {
    scale = 1024.0;
  } else if (unit == "M") {
    scale = 1024.0 * 1024;
  } else if (unit == "G") {
    scale = 1024.0 * 1024 * 1024;
  } else if (unit == "T") {
    scale = 1024.0 * 1024 * 1024 * 1024;
  } else if (!unit.empty()) {
    return bad();
  }
  const double bytes = value * scale;
  if (!std::isfinite(bytes) || bytes < 1 || bytes > 1e18) return bad();
  return static_cast<uint64_t>(bytes);
}

std::string PeakPrediction::Format() const {
  const uint64_t decoding = kept + after;
  std::string s = absl::StrCat("predicted peak RSS ", HumanBytes(total()), " = ",
                               tokenizing > running() ? "tokenizing, else " : "",
                               "process ", HumanBytes(process), " + weights ", HumanBytes(weights),
                               " + the larger of prefill ", HumanBytes(prefill), " (+ the kernels' buffers ",
                               HumanBytes(backend), ") and decoding ", HumanBytes(decoding), " (the cache ", HumanBytes(kept), " + ",
                               HumanBytes(after), ")");
  if (tokenizing > 0) absl::StrAppend(&s, " (tokenizing peaked at ", HumanBytes(tokenizing), ")");
  return s;
}

PeakPrediction PredictPeak(const LlamaConfig& c, const Backend& backend, uint64_t weight_bytes,
                           const PrefillFootprint& fp, uint64_t process_bytes,
                           uint64_t decode_copy_bytes, bool half_decode_kv) {
  PeakPrediction p;
  p.process = process_bytes;
  p.weights = weight_bytes;
  p.prefill = fp.resident_peak;
  p.kept = fp.kept_bytes;
  // The products quantize each chunk's activations (int8 with block scales
  // and sums) and pack weight tiles per thread; both scale with the FFN
  // width. A fit to measured peaks (SmolLM2-135M, chunks 256-2048, and a
  // tiny model, docs/RELIABILITY.md): about 3 bytes per FFN value of the
  // chunk plus 1700 rows' worth of packed tiles.
  const uint64_t chunk = static_cast<uint64_t>(fp.plan.max_chunk_tokens);
  // Where the backend bounds its products' scratch itself (the AMX-BF16
  // tiles' bf16 copies of the batch's rows and of the feed-forward block's
  // h, about 4 bytes per FFN value of the batch), the larger of the two.
  const int64_t widest = std::max({c.model_dim, c.num_heads * c.head_dim, c.ffn_dim});
  p.backend = std::max<uint64_t>(static_cast<uint64_t>(c.ffn_dim) * (3 * chunk + 1700),
                                 backend.ProductScratchBytes(fp.ops.tokens, widest, c.ffn_dim));
  // SnapKV's votes may keep the window queries' scores of every key of the
  // longest attention for a second pass (the CPU backend: num_heads · window
  // floats per key, 1.7 MiB for SmolLM2 at IMDC 1024 / 1024, up to 16 MiB).
  p.backend += backend.WindowScoresScratchBytes(c.num_heads, fp.plan.config.window, fp.attention_keys);
  // The bf16 attention kernels' K and V tiles of the longest attention
  // (exact; none where the f32 kernel runs).
  p.backend += backend.AttentionScratchBytes(fp.plan.max_chunk_tokens, fp.attention_keys, c.num_kv_heads, c.head_dim);
  // After the prefill the memory itself becomes the decoder's cache (room
  // for the generated tokens is part of the prefill's memory); decoding
  // adds one-token activations, the logits, and the decode copy's growth.
  p.after = LlamaForward::ScratchBytes(c, 1) + static_cast<uint64_t>(c.vocab_size) * sizeof(float) +
            decode_copy_bytes;
  if (half_decode_kv) {
    // The fp16 entries replace the f32 ones layer by layer (KvCache::
    // SyncHalf with release_f32): at most one layer holds both.
    // (final_entries counts what the recall tier adds, and a sliding-window
    // layer's window.)
    const uint64_t entries = static_cast<uint64_t>(std::max(fp.memory_capacity, fp.final_entries));
    p.after += entries * c.num_kv_heads * c.head_dim * 2 * sizeof(uint16_t);
  }
  return p;
}

std::string DevicePrediction::Format() const {
  return absl::StrCat("predicted peak device memory ", HumanBytes(total()), " = weights ", HumanBytes(weights),
                      " + buffers ", HumanBytes(buffers), " (activations, candidates, the memory) + the ops' scratch ",
                      HumanBytes(scratch), " (at most)");
}

DevicePrediction PredictDevicePeak(const LlamaModel& model, const Backend& backend, const PrefillFootprint& fp) {
  DevicePrediction d;
  d.weights = LlamaForward::DeviceWeightBytes(model, backend);
  d.buffers = fp.buffer_bytes;
  d.scratch = backend.DeviceScratchBytes(fp.ops);
  return d;
}

}  // namespace snapfill::cli
