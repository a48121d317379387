#include "tests/testing/tiny_model.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <utility>

#include "gtest/gtest.h"
#include "snapfill/status.h"
#include "src/gguf/gguf_reader.h"
#include "src/model/llama_forward.h"

namespace snapfill::testing {

std::unique_ptr<LlamaModel> LoadTinyModel(const TinyLlamaOptions& options) {
  auto bytes = MakeTinyLlamaGguf(options);
  SNAPFILL_CHECK(bytes.ok()) << bytes.status();
  auto file = GgufFile::FromBytes(std::move(*bytes));
  SNAPFILL_CHECK(file.ok()) << file.status();
  auto model = LlamaModel::Load(std::move(*file));
  SNAPFILL_CHECK(model.ok()) << model.status();
  return std::move(*model);
}

std::vector<float> OneShotLogits(const LlamaModel& model, Backend* backend, const std::vector<int32_t>& ids,
                                 int64_t batch) {
  auto fwd = LlamaForward::Create(model, backend, batch);
  SNAPFILL_CHECK(fwd.ok()) << fwd.status();
  auto kv = (*fwd)->NewKvCache(ids.size());
  SNAPFILL_CHECK(kv.ok()) << kv.status();
  std::vector<int32_t> pos(ids.size());
  std::iota(pos.begin(), pos.end(), 0);
  std::vector<float> logits(model.config().vocab_size);
  const absl::Status s = (*fwd)->Forward(ids.data(), ids.size(), pos.data(), **kv, 1, logits.data());
  SNAPFILL_CHECK(s.ok()) << s;
  return logits;
}

TinyLlamaOptions TinyHybridOptions(int window) {
  TinyLlamaOptions opts;
  opts.architecture = "gemma3";
  opts.num_layers = 4;
  opts.sliding_window = window;
  opts.swa_pattern = 2;
  opts.context_length = 4096;
  return opts;
}

void ExpectLogitsClose(const std::vector<float>& a, const std::vector<float>& b, double rel) {
  ASSERT_EQ(a.size(), b.size());
  double scale = 0;
  for (float x : b) scale = std::max(scale, std::fabs(double(x)));
  for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], rel * scale) << "logit " << i;
}

std::vector<int32_t> TestTokens(int n, int vocab) {
  std::vector<int32_t> ids(n);
  for (int i = 0; i < n; ++i) ids[i] = (i * 37 + (i * i) % 11 + 5) % vocab;
  return ids;
}

}  // namespace snapfill::testing
