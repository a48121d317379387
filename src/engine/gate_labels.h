// Training data for SmartKV's gates (DESIGN.md §9, compress/gate.h): a text
// run through the model with full causal attention, and for every entry of
// every layer and KV head its key before RoPE and how long it lived.
//
// Lifespan of entry j: the largest t - j over the queries t (of the KV
// group's query heads) whose attention weight on j exceeds tau / (t + 1),
// tau times the weight of uniform attention over the t + 1 keys t sees, so
// that the threshold means the same at every length; 0 if none but j
// itself. The label is log4(1 + lifespan). An entry still attended above
// the threshold by one of the sequence's last `alive_margin` queries is
// censored: it might have lived longer than the sequence let it.
// The query heads of a group are pooled (the largest t over all of them):
// the entry serves the group, so it lives as long as any of its heads
// needs it.
#ifndef SNAPFILL_ENGINE_GATE_LABELS_H_
#define SNAPFILL_ENGINE_GATE_LABELS_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "snapfill/backend.h"
#include "src/compress/gate.h"
#include "src/model/llama_model.h"

namespace snapfill {

struct GateLabelOptions {
  float tau = 2.0f;
  int64_t alive_margin = 32;
  // Entries at positions below this are not sampled (the sinks, which the
  // pruners keep anyway).
  int64_t skip_first = 4;
};

// Appends the samples of `tokens` (n of them, at most the model's context)
// to samples[layer * num_kv_heads + kv_head] (resized to that count and
// given the head_dim on first use). InvalidArgument for an empty or
// too-long sequence or an option out of range.
absl::Status CollectGateSamples(const LlamaModel& model, Backend* backend, const int32_t* tokens, int64_t n,
                                const GateLabelOptions& options, std::vector<GateSamples>* samples);

}  // namespace snapfill

#endif  // SNAPFILL_ENGINE_GATE_LABELS_H_
