// --max_memory and the peak-memory prediction printed by --dry_run.
//
// The peak resident memory of `snapfill run` / `prefill` is predicted as
//   the process as it stands when the plan is made (measured: code,
//     libraries, the tokenizer's vocabulary, the input's token ids where
//     they are kept in memory: up to 16 MiB, the rest is spooled to a file)
//   + the model's tensor bytes (mapped; every page is read by the first chunk)
//   + the prefill's own buffers (PrefillEngine::Footprint: memory with room
//     for the -n tokens `run` generates, candidates, activations)
//   + the backend's per-chunk work buffers (quantized activations and packed
//     weight tiles, per thread)
//   + what comes after the prefill: the memory becomes the decoder's cache
//     in place, so only one-token activations, the logits, and what the
//     backend's decode copy of the weights adds (BackendOptions::
//     pack_decode_weights: the copy replaces the file's pages, so only its
//     layout's padding; 0 when off or for a command that does not decode;
//     the copies made before the prefill of the matrices its batch products
//     read (Backend::CopyOf) replace the pages the same way),
//     and the cache's fp16 entries that decode attention reads (BackendOptions::
//     half_decode_kv: they replace the f32 entries layer by layer, so one
//     layer's fp16 bytes of the memory's capacity; only for a command that
//     decodes).
// or, where larger, the peak while the input was tokenized (measured).
// The backend term is a fit to measured peaks (docs/RELIABILITY.md), the
// rest is exact arithmetic on the allocations.
#ifndef SNAPFILL_TOOLS_CLI_MEMORY_BUDGET_H_
#define SNAPFILL_TOOLS_CLI_MEMORY_BUDGET_H_

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "snapfill/backend.h"
#include "snapfill/engine.h"
#include "src/kv/kv_cache.h"
#include "src/model/llama_model.h"

namespace snapfill::cli {

// "800M", "1.5G", "1GiB", "512MB", "123456" (bytes). Binary units: K, M, G,
// T, with or without "i"/"iB"/"B". InvalidArgument naming the text.
absl::StatusOr<uint64_t> ParseByteSize(std::string_view text);

struct PeakPrediction {
  uint64_t process = 0;   // measured when the plan was made
  uint64_t weights = 0;
  uint64_t prefill = 0;   // PrefillFootprint::resident_peak
  // The kernels' buffers for a chunk (fit; Backend::KernelScratchBytes
  // measures them), given back before decoding (TakeDecoderCache).
  uint64_t backend = 0;
  // Decoding: the cache the prefill leaves (PrefillFootprint::kept_bytes;
  // the engine gives its other buffers back first, TakeDecoderCache), and
  // what decoding adds to it: one-token activations, logits, the decode
  // copy's growth and the fp16 cache.
  uint64_t kept = 0;
  uint64_t after = 0;
  // The peak while the input was read and tokenized (measured: it is past
  // when the plan is made). Tokenizing streams, so this is the process
  // then, a block of text, its words and the ids kept in memory.
  uint64_t tokenizing = 0;
  // After tokenizing: the two phases do not overlap, so the larger one counts.
  uint64_t running() const { return process + weights + std::max(prefill + backend, kept + after); }
  uint64_t total() const { return std::max(tokenizing, running()); }
  // "predicted peak RSS 251.3 MiB = process 21.0 MiB + weights 98.2 MiB + ..."
  std::string Format() const;
};

// `process_bytes`: the resident set now.
// `weight_bytes`: what the weights hold resident (LlamaForward::
// ResidentWeightBytes), `decode_copy_bytes` what decoding adds to it.
// `backend`: the one the prefill runs on (its scratch for the votes).
PeakPrediction PredictPeak(const LlamaConfig& model, const Backend& backend, uint64_t weight_bytes,
                           const PrefillFootprint& footprint, uint64_t process_bytes,
                           uint64_t decode_copy_bytes = 0, bool half_decode_kv = false);

// On a device (--device cuda), the peak of the backend's own allocations
// (Backend::DevicePeakBytes), predicted as
//   the weights' device copies (LlamaForward::DeviceWeightBytes)
//   + the engine's buffers (PrefillFootprint::buffer_bytes, with
//     buffers_on_device: activations, candidates, the memory's keys and values)
//   + the ops' scratch (Backend::DeviceScratchBytes of PrefillFootprint::ops,
//     an upper bound).
// Not counted, as the backend does not count them: the CUDA context and
// cuBLAS's workspace (the free figure the plan is checked against is taken
// after both exist). The weights and buffers are exact; the scratch is the
// bound.
struct DevicePrediction {
  uint64_t weights = 0;
  uint64_t buffers = 0;
  uint64_t scratch = 0;
  uint64_t total() const { return weights + buffers + scratch; }
  // "predicted peak device memory 14.2 GiB = weights 12.6 GiB + buffers ... + the ops' scratch ..."
  std::string Format() const;
};

// Whether the backend computes in a device's memory, so that --max_memory
// and the prediction that matters are the device's (a GPU; the CPU under
// guard_buffers, which stands in for one).
inline bool ComputesOnDevice(const Backend& backend) {
  return backend.device() != Device::kCpu || !backend.HostReachesBuffers();
}

DevicePrediction PredictDevicePeak(const LlamaModel& model, const Backend& backend, const PrefillFootprint& footprint);

}  // namespace snapfill::cli

#endif  // SNAPFILL_TOOLS_CLI_MEMORY_BUDGET_H_
