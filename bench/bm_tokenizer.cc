// Tokenizer throughput on tests/data/tokenizer_corpus.txt with the real
// SmolLM2 vocabulary (skipped when the model or corpus is missing). Reports
// bytes/s (MB/s) and tokens/s for Encode and Decode.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "src/gguf/gguf_reader.h"
#include "src/tokenizer/tokenizer.h"

namespace snapfill {
namespace {

// The source tree root, from this file's path (bench/ defines no macro).
std::string Path(const char* rel) {
  std::string root = __FILE__;
  root = root.substr(0, root.rfind("bench/"));
  return (root.empty() ? "./" : root) + rel;
}

struct Fixture {
  std::unique_ptr<GgufFile> file;
  std::unique_ptr<Tokenizer> tokenizer;
  std::string corpus;
  std::string error;
};

const Fixture& Get() {
  static const Fixture* fixture = [] {
    auto* f = new Fixture();
    const char* env = std::getenv("SNAPFILL_MODEL");
    const std::string model = env != nullptr ? env : Path("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    auto file = GgufFile::Open(model);
    if (!file.ok()) {
      f->error = "model not found: " + model;
      return f;
    }
    f->file = *std::move(file);
    auto tok = Tokenizer::FromGguf(*f->file);
    if (!tok.ok()) {
      f->error = std::string(tok.status().message());
      return f;
    }
    f->tokenizer = *std::move(tok);
    std::ifstream in(Path("tests/data/tokenizer_corpus.txt"), std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    f->corpus = ss.str();
    if (f->corpus.empty()) f->error = "tests/data/tokenizer_corpus.txt missing";
    return f;
  }();
  return *fixture;
}

void BM_Encode(benchmark::State& state) {
  const Fixture& f = Get();
  if (!f.error.empty()) {
    state.SkipWithError(f.error.c_str());
    return;
  }
  size_t tokens = 0;
  for (auto _ : state) {
    auto ids = f.tokenizer->Encode(f.corpus, false, false);
    tokens += ids.size();
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * f.corpus.size()));
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(tokens), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_Encode)->Unit(benchmark::kMillisecond);

void BM_Decode(benchmark::State& state) {
  const Fixture& f = Get();
  if (!f.error.empty()) {
    state.SkipWithError(f.error.c_str());
    return;
  }
  const auto ids = f.tokenizer->Encode(f.corpus, false, false);
  for (auto _ : state) {
    std::string text = f.tokenizer->Decode(ids);
    benchmark::DoNotOptimize(text.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * f.corpus.size()));
  state.counters["tokens/s"] = benchmark::Counter(
      static_cast<double>(state.iterations() * ids.size()), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_Decode)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace snapfill

BENCHMARK_MAIN();
