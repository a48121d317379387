// A Backend over the scalar reference kernels (kernels/ref): double
// accumulators, plain loops. Running LlamaForward on it gives the golden
// forward pass that the optimized CPU backend is compared with.
#ifndef SNAPFILL_TESTS_TESTING_REF_BACKEND_H_
#define SNAPFILL_TESTS_TESTING_REF_BACKEND_H_

#include <memory>

#include "snapfill/backend.h"

namespace snapfill::testing {

// quantized_activations: multiply like ggml (activations quantized to the
// weight type's Q8 partner, integer block dots); otherwise exact products
// of dequantized weights and f32 activations. bf16_products: where the CPU
// kernels take the AMX-BF16 path for a product (cpu::MatMulFuses: token
// blocks of its weight types on a CPU with AMX-BF16), ref::MatMulBf16 instead
// (both operands rounded to bf16, exact sums), so that the reference rounds
// where the optimized backend does. attention_keeps_lse: whether it says
// its AttentionWithLse keeps the denominators (Backend::AttentionKeepsLse;
// false takes the engine's path for a backend whose attention does not).
std::unique_ptr<Backend> CreateRefBackend(bool quantized_activations, bool bf16_products = false,
                                          bool attention_keeps_lse = true);

// One CPU backend with the default options for the whole test binary (the
// pruners' pooling and top-k, where a test has no backend of its own).
Backend& SharedCpuBackend();

}  // namespace snapfill::testing

#endif  // SNAPFILL_TESTS_TESTING_REF_BACKEND_H_
