#include "tests/testing/tiny_model.h"

#include <utility>

#include "snapfill/status.h"
#include "src/gguf/gguf_reader.h"

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

std::vector<int32_t> TestTokens(int n, int vocab) {
  std::vector<int32_t> ids(n);
  for (int i = 0; i < n; ++i) ids[i] = (i * 37 + (i * i) % 11 + 5) % vocab;
  return ids;
}

}  // namespace snapfill::testing
