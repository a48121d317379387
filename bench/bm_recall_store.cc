// Google Benchmark of the recall tier's store (src/kv/recall_store.h): one
// layer's evicted rows appended, as the chunk loop does once per layer and
// chunk. The appends go to the page cache of a folder under $TMPDIR (or
// /tmp); the store is made afresh every few appends, outside the timing, so
// that the files stay small. What it tells: the host's share of a step with
// a store (the gather into slot order, the conversion, the write), beside
// what the step's kernels take.
//
// Arguments: KV heads, head_dim, rows evicted per head, format (0 f16, 1 q8),
// and where the rows come from: 0 the candidates (Append gathers and
// converts them, as on the CPU), 1 records already in slot order and format
// (AppendRecords: what a device that gathers and converts them sends, so
// the host only writes); and for Append the conversion: 1 the CPU
// backend's vector kernels, 0 the store's scalar twins, one value at a time
// (what a backend without its own conversions gives it). A 1,024-entry
// memory with 1,024-token chunks evicts 1,024 rows per head.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "benchmark/benchmark.h"
#include "snapfill/backend.h"
#include "src/base/half.h"
#include "src/base/int8_rows.h"
#include "src/kv/recall_store.h"

namespace snapfill {
namespace {

void BM_RecallAppend(benchmark::State& state) {
  const int64_t heads = state.range(0), d = state.range(1), n = state.range(2);
  RecallStoreInfo info;
  info.num_layers = 1;
  info.num_kv_heads = heads;
  info.head_dim = d;
  info.format = state.range(3) == 0 ? RecallFormat::kF16 : RecallFormat::kQ8;
  info.model_fingerprint = "bm_recall_store";
  info.input_tokens = 1;

  // The candidates as the engine holds them: per KV head 2n rows of keys
  // and values, every other row evicted (ascending, as the complement of
  // the kept ones is).
  const int64_t rows = 2 * n;
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> k(heads * rows * d), v(heads * rows * d);
  for (float& x : k) x = dist(rng);
  for (float& x : v) x = dist(rng);
  std::vector<int32_t> pos(heads * rows);
  for (int64_t i = 0; i < heads * rows; ++i) pos[i] = static_cast<int32_t>(i % rows);
  std::vector<std::vector<int32_t>> evicted(heads, std::vector<int32_t>(n));
  std::vector<const int32_t*> idx(heads);
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t i = 0; i < n; ++i) evicted[h][i] = static_cast<int32_t>(2 * i + 1);
    idx[h] = evicted[h].data();
  }
  // The same rows as records in slot order ([n][heads] records), for
  // AppendRecords.
  const bool records = state.range(4) != 0;
  const uint64_t vec = RecallVectorBytes(info.format, d);
  std::vector<uint8_t> record_k, record_v;
  std::vector<int32_t> slot_pos;
  if (records) {
    record_k.resize(n * heads * vec);
    record_v.resize(n * heads * vec);
    slot_pos.resize(n * heads);
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t r = evicted[h][i];
        for (auto [from, to] : {std::pair{k.data(), record_k.data()}, std::pair{v.data(), record_v.data()}}) {
          const float* x = from + (h * rows + r) * d;
          uint8_t* out = to + (i * heads + h) * vec;
          if (info.format == RecallFormat::kQ8) {
            EncodeInt8Row(x, d, out);
          } else {
            for (int64_t t = 0; t < d; ++t) {
              const uint16_t half = Fp32ToFp16(x[t]);
              std::memcpy(out + 2 * t, &half, sizeof(half));
            }
          }
        }
        slot_pos[i * heads + h] = pos[h * rows + r];
      }
    }
  }

  const char* tmp = std::getenv("TMPDIR");
  const std::string dir = std::string(tmp != nullptr ? tmp : "/tmp") + "/bm_recall_store." + std::to_string(getpid());
  auto made_backend = CreateBackend(Device::kCpu);
  if (!made_backend.ok()) {
    state.SkipWithError(std::string(made_backend.status().message()).c_str());
    return;
  }
  Backend* backend = made_backend->get();
  std::unique_ptr<RecallStore> store;
  auto fresh = [&]() -> bool {
    if (store != nullptr && !store->Remove().ok()) return false;
    auto made = RecallStore::Create(dir, info);
    if (!made.ok()) {
      state.SkipWithError(std::string(made.status().message()).c_str());
      return false;
    }
    store = std::move(*made);
    if (state.range(5) == 0) return true;
    store->SetConversions(RecallStore::BackendConversions(backend));
    return true;
  };
  if (!fresh()) return;
  int64_t appended = 0;
  for (auto _ : state) {
    if (appended == 16) {  // (at most 16 appends per file: 270 MB at the 7B shape)
      state.PauseTiming();
      const bool ok = fresh();
      state.ResumeTiming();
      if (!ok) break;
      appended = 0;
    }
    absl::Status s;
    if (records) {
      s = store->AppendRecords(0, n, slot_pos.data(), record_k.data(), record_v.data());
    } else {
      s = store->Append(0, n, idx.data(), k.data(), v.data(), rows * d, pos.data(), rows);
    }
    if (!s.ok()) {
      state.SkipWithError(std::string(s.message()).c_str());
      break;
    }
    ++appended;
  }
  if (store != nullptr) (void)store->Remove();
  const double bytes = static_cast<double>(RecallStore::SlotBytes(info)) * n;
  state.SetBytesProcessed(static_cast<int64_t>(bytes * state.iterations()));
  state.counters["f32_in_MB"] = 2.0 * heads * n * d * sizeof(float) / 1e6;
  state.counters["written_MB"] = bytes / 1e6;
}
// Llama-2-7B's 32 KV heads of 128 (a layer of a 7B model), SmolLM2-135M's 3 of 64.
BENCHMARK(BM_RecallAppend)
    ->ArgNames({"kv_heads", "head_dim", "rows", "q8", "records", "vector"})
    ->Args({32, 128, 1024, 0, 0, 1})
    ->Args({32, 128, 1024, 0, 0, 0})
    ->Args({32, 128, 1024, 0, 1, 1})
    ->Args({32, 128, 1024, 1, 0, 1})
    ->Args({32, 128, 1024, 1, 0, 0})
    ->Args({32, 128, 1024, 1, 1, 1})
    ->Args({3, 64, 1024, 0, 0, 1})
    ->Args({3, 64, 1024, 0, 1, 1})
    ->Args({3, 64, 1024, 1, 1, 1})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// The append's two parts apart, at the 7B layer's size: the conversion of
// its keys and values (8.4M values) to the format (0 f16, 1 q8) or back from
// it (what recall's reads of the store do), with the CPU backend's vector
// kernels (1) or the scalar twins one value at a time (0); and the write of
// its 16.9 MB (f16) or 8.8 MB (q8) into pages of the page cache that are
// already there (a file overwritten in place: an append into new pages
// costs their allocation too, which the appends above pay one time in 16).
void BM_RecallConvert(benchmark::State& state) {
  const int64_t d = 128, rows = 2 * 32 * 1024, n = rows * d;
  const bool q8 = state.range(0) != 0, vector = state.range(1) != 0, decode = state.range(2) != 0;
  std::mt19937 rng(2);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(n);
  for (float& v : x) v = dist(rng);
  std::vector<uint8_t> y(rows * RecallVectorBytes(q8 ? RecallFormat::kQ8 : RecallFormat::kF16, d));
  auto* half = reinterpret_cast<uint16_t*>(y.data());
  auto backend = CreateBackend(Device::kCpu);
  if (!backend.ok()) {
    state.SkipWithError(std::string(backend.status().message()).c_str());
    return;
  }
  Backend& b = **backend;
  if (q8) {
    b.ToInt8Rows(x.data(), y.data(), rows, d);
  } else {
    b.ToHalf(x.data(), half, n);
  }
  for (auto _ : state) {
    if (decode) {
      if (q8 && vector) b.FromInt8Rows(y.data(), x.data(), rows, d);
      if (q8 && !vector) {
        DecodeInt8Rows(y.data(), rows, d, x.data());
      }
      if (!q8 && vector) b.FromHalf(half, x.data(), n);
      if (!q8 && !vector) {
        for (int64_t i = 0; i < n; ++i) x[i] = Fp16ToFp32(half[i]);
      }
      benchmark::DoNotOptimize(x.data());
    } else {
      if (q8 && vector) b.ToInt8Rows(x.data(), y.data(), rows, d);
      if (q8 && !vector) {
        EncodeInt8Rows(x.data(), rows, d, y.data());
      }
      if (!q8 && vector) b.ToHalf(x.data(), half, n);
      if (!q8 && !vector) {
        for (int64_t i = 0; i < n; ++i) half[i] = Fp32ToFp16(x[i]);
      }
      benchmark::DoNotOptimize(y.data());
    }
  }
}
BENCHMARK(BM_RecallConvert)
    ->ArgNames({"q8", "vector", "decode"})
    ->ArgsProduct({{0, 1}, {1, 0}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

void BM_PageCacheWrite(benchmark::State& state) {
  const size_t bytes = 1024 * RecallStore::SlotBytes(RecallStoreInfo{
                                  .num_layers = 1,
                                  .num_kv_heads = 32,
                                  .head_dim = 128,
                                  .format = state.range(0) != 0 ? RecallFormat::kQ8 : RecallFormat::kF16});
  const char* tmp = std::getenv("TMPDIR");
  const std::string path = std::string(tmp != nullptr ? tmp : "/tmp") + "/bm_page_cache." + std::to_string(getpid());
  const int fd = ::open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0600);
  if (fd < 0) {
    state.SkipWithError(("cannot create " + path).c_str());
    return;
  }
  const std::vector<uint8_t> data(bytes, 0x5a);
  auto write_all = [&]() {
    for (size_t done = 0; done < bytes;) {
      const ssize_t w = ::pwrite(fd, data.data() + done, bytes - done, static_cast<off_t>(done));
      if (w <= 0) return false;
      done += static_cast<size_t>(w);
    }
    return true;
  };
  if (write_all()) {  // (the pages made, outside the timing)
    for (auto _ : state) {
      if (!write_all()) {
        state.SkipWithError("write failed");
        break;
      }
    }
  } else {
    state.SkipWithError("write failed");
  }
  ::close(fd);
  ::unlink(path.c_str());
  state.SetBytesProcessed(static_cast<int64_t>(bytes) * state.iterations());
}
BENCHMARK(BM_PageCacheWrite)->ArgName("q8")->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace snapfill

BENCHMARK_MAIN();
