// CPU backend: checks shapes, then calls kernels/cpu.
#include <cpuid.h>
#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "src/base/file_util.h"
#include "src/base/int8_rows.h"
#include "src/base/paged_array.h"
#include "src/base/sys_stats.h"
#include "src/backend/backend_common.h"
#include "kernels/cpu/cpu_variants.h"
#include "kernels/cpu/kernel_config.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/peak.h"
#include "kernels/cpu/thread_team.h"
#include "kernels/quant_blocks.h"
#include "snapfill/backend.h"
#include "snapfill/status.h"
#ifdef SNAPFILL_WITH_CUDA
#include "src/backend/cuda/cuda_backend.h"
#endif

namespace snapfill {
namespace {

enum Op { kMatMul, kGetRows, kRmsNorm, kRope, kSwiGlu, kAttention, kWindowScores, kNumOps };
constexpr const char* kOpNames[kNumOps] = {"matmul",   "get_rows",  "rms_norm",     "rope",
                                           "swiglu",   "attention", "window_scores"};

std::vector<KernelRates>& ChosenRates();
std::mutex& ChoiceMutex();

// `bytes` of zeroed host pages, or ResourceExhausted.
absl::StatusOr<PagedArray<uint8_t>> MapPages(uint64_t bytes) {
  PagedArray<uint8_t> pages;
  if (!pages.Allocate(bytes)) return absl::ResourceExhaustedError(absl::StrCat("cannot map ", bytes, " bytes for a buffer"));
  return pages;
}

// Host pages (the base class's buffers).
struct HostBuffer final : BackendBuffer {
  PagedArray<uint8_t> pages;
  void* data() override { return pages.data(); }
  void* host() override { return pages.data(); }
  uint64_t bytes() const override { return pages.size(); }
  void ReleaseFrom(uint64_t offset) override { pages.ReleaseFrom(offset); }
};

// BackendOptions::guard_buffers: the buffers' pages are PROT_NONE except
// while an op runs (Open/Close, nested ops counted), so a host access from
// outside the backend faults.
class BufferGuard {
 public:
  // A buffer made guarded; it leaves the list when destroyed.
  class Buffer final : public BackendBuffer {
   public:
    Buffer(BufferGuard* guard, PagedArray<uint8_t> pages) : guard_(guard), pages_(std::move(pages)) {
      guard_->Add(this);
    }
    ~Buffer() override { guard_->Remove(this); }
    void* data() override { return pages_.data(); }
    void* host() override { return nullptr; }  // (as a device's)
    uint64_t bytes() const override { return pages_.size(); }
    void ReleaseFrom(uint64_t offset) override { pages_.ReleaseFrom(offset); }
    void Protect(bool open) {
      if (pages_.size() > 0) mprotect(pages_.data(), pages_.size(), open ? PROT_READ | PROT_WRITE : PROT_NONE);
    }

   private:
    BufferGuard* guard_;
    PagedArray<uint8_t> pages_;
  };

  void Open() {
    std::lock_guard<std::mutex> lock(mu_);
    if (depth_++ == 0) {
      for (Buffer* b : buffers_) b->Protect(true);
    }
  }
  void Close() {
    std::lock_guard<std::mutex> lock(mu_);
    if (--depth_ == 0) {
      for (Buffer* b : buffers_) b->Protect(false);
    }
  }

 private:
  void Add(Buffer* b) {
    std::lock_guard<std::mutex> lock(mu_);
    buffers_.push_back(b);
    b->Protect(depth_ > 0);
    bytes_ += b->bytes();
    peak_ = std::max(peak_, bytes_);
  }
  void Remove(Buffer* b) {
    std::lock_guard<std::mutex> lock(mu_);
    buffers_.erase(std::find(buffers_.begin(), buffers_.end(), b));
    bytes_ -= b->bytes();
  }

 public:
  // The most bytes the guarded buffers held at once: what a device's
  // buffers would take of its memory (the tests of the device prediction).
  uint64_t peak() const {
    std::lock_guard<std::mutex> lock(mu_);
    return peak_;
  }

 private:
  mutable std::mutex mu_;
  int depth_ = 0;
  std::vector<Buffer*> buffers_;
  uint64_t bytes_ = 0;
  uint64_t peak_ = 0;
};

// While an op runs: its kernels on the backend's team, and its buffers
// open where they are guarded.
class OpScope {
 public:
  OpScope(cpu::ThreadTeam& team, BufferGuard* guard) : bound_(team), guard_(guard) {
    if (guard_ != nullptr) guard_->Open();
  }
  ~OpScope() {
    if (guard_ != nullptr) guard_->Close();
  }
  OpScope(const OpScope&) = delete;
  OpScope& operator=(const OpScope&) = delete;

 private:
  const cpu::ThreadTeam::Scope bound_;
  BufferGuard* guard_;
};

// An op's scope, and the wall time of its kind accumulated (when profiling).
class OpTimer {
 public:
  OpTimer(cpu::ThreadTeam& team, BufferGuard* guard, bool on, double* seconds, int64_t* calls)
      : scope_(team, guard), seconds_(on ? seconds : nullptr) {
    if (on) ++*calls;
  }
  ~OpTimer() {
    if (seconds_ != nullptr) *seconds_ += watch_.Seconds();
  }

 private:
  const OpScope scope_;
  double* seconds_;
  Stopwatch watch_;
};

class CpuBackend final : public Backend, public BackendProfile {
 public:
  CpuBackend(std::unique_ptr<cpu::ThreadTeam> team, bool exact, bool profile, bool pack_decode, bool half_kv,
             bool guard_buffers)
      : team_(std::move(team)),
        guard_(guard_buffers ? std::make_unique<BufferGuard>() : nullptr),
        num_threads_(team_->threads()),
        exact_(exact),
        profile_(profile),
        pack_decode_(pack_decode && !exact),
        half_kv_(half_kv && !exact) {}

  bool HalfDecodeKv() const override { return half_kv_; }
  void ToHalf(const float* x, uint16_t* y, int64_t n) override {
    const OpScope op(*team_, guard_.get());
    cpu::ToFp16(x, y, n);
  }
  void FromHalf(const uint16_t* x, float* y, int64_t n) override {
    const OpScope op(*team_, guard_.get());
    cpu::FromFp16(x, y, n);
  }
  void ToInt8Rows(const float* x, uint8_t* y, int64_t rows, int64_t dim) override {
    const OpScope op(*team_, guard_.get());
    cpu::ToInt8Rows(x, y, rows, dim);
  }
  void FromInt8Rows(const uint8_t* y, float* x, int64_t rows, int64_t dim) override {
    const OpScope op(*team_, guard_.get());
    cpu::FromInt8Rows(y, x, rows, dim);
  }
  bool HostReachesBuffers() const override { return guard_ == nullptr; }
  uint64_t DevicePeakBytes() const override { return guard_ != nullptr ? guard_->peak() : 0; }
  absl::StatusOr<std::unique_ptr<BackendBuffer>> NewBuffer(uint64_t bytes) override {
    if (guard_ == nullptr) return Backend::NewBuffer(bytes);
    SNAPFILL_ASSIGN_OR_RETURN(PagedArray<uint8_t> pages, MapPages(bytes));
    return std::unique_ptr<BackendBuffer>(new BufferGuard::Buffer(guard_.get(), std::move(pages)));
  }
  absl::Status Download(const void* src, void* host, uint64_t bytes) override {
    const OpScope op(*team_, guard_.get());
    return Backend::Download(src, host, bytes);
  }
  absl::Status Upload(const void* host, void* dst, uint64_t bytes) override {
    const OpScope op(*team_, guard_.get());
    return Backend::Upload(host, dst, bytes);
  }
  // Guarded, a copy behaves as a device's queued one would before its
  // fence is waited for: the bytes are read now (the queue's order), and
  // the host's are garbage until WaitDownload, so that a caller that reads
  // them early computes with NaNs and a test sees it.
  absl::StatusOr<uint64_t> DownloadAsync(const void* src, void* host, uint64_t bytes) override {
    if (guard_ == nullptr) return Backend::DownloadAsync(src, host, bytes);
    PendingCopy copy{++last_fence_, host, std::vector<uint8_t>(bytes)};
    {
      const OpScope op(*team_, guard_.get());
      if (bytes > 0) std::memcpy(copy.bytes.data(), src, bytes);
    }
    if (bytes > 0) std::memset(host, 0xff, bytes);
    pending_copies_.push_back(std::move(copy));
    return last_fence_;
  }
  absl::Status WaitDownload(uint64_t fence) override {
    while (!pending_copies_.empty() && pending_copies_.front().fence <= fence) {
      PendingCopy& c = pending_copies_.front();
      if (!c.bytes.empty()) std::memcpy(c.host, c.bytes.data(), c.bytes.size());
      pending_copies_.pop_front();
    }
    return absl::OkStatus();
  }
  absl::Status Complement(const int32_t* keep, int64_t keep_stride, int64_t kept, int64_t num_heads,
                          int64_t num_candidates, int32_t* out, int64_t out_stride) override {
    const OpScope op(*team_, guard_.get());
    return Backend::Complement(keep, keep_stride, kept, num_heads, num_candidates, out, out_stride);
  }
  absl::Status Add(float* x, const float* y, int64_t n) override {
    const OpScope op(*team_, guard_.get());
    return Backend::Add(x, y, n);
  }
  absl::Status AddRows(float* x, int64_t stride, const float* bias, int64_t rows, int64_t dim) override {
    const OpScope op(*team_, guard_.get());
    return Backend::AddRows(x, stride, bias, rows, dim);
  }
  absl::Status Scale(float* x, int64_t n, float s) override {
    const OpScope op(*team_, guard_.get());
    return Backend::Scale(x, n, s);
  }
  absl::Status Fill(float* x, int64_t n, float value) override {
    const OpScope op(*team_, guard_.get());
    return Backend::Fill(x, n, value);
  }
  absl::Status GateScores(const GateScoring& g) override {
    const OpScope op(*team_, guard_.get());
    return Backend::GateScores(g);
  }
  uint64_t KernelScratchBytes() const override { return team_->ScratchBytes(); }
  void ReleaseKernelScratch() override { team_->ReleaseScratch(); }

  std::string kernels() const override {
    if (exact_) return absl::StrCat("x86-64 ", cpu::CpuLevelName(cpu::ActiveCpuLevel()), ", exact (f32 activations)");
    const char* products = cpu::ProductPathName(cpu::ActiveMatMulImpl());
    const char* attention = cpu::AttentionHasAmx()        ? "amx-bf16"
                            : cpu::AttentionHasAvx512Bf16() ? "avx512-bf16"
                                                            : "f32";
    return absl::StrCat("x86-64 ", cpu::CpuLevelName(cpu::ActiveCpuLevel()), " (of ",
                        cpu::CpuLevelName(cpu::MaxCpuLevel()), "): products ", products, ", prefill attention ",
                        attention, ", decode layout ",
                        pack_decode_ && cpu::MatMulHasDecodeLayout() ? "yes" : "no",
                        ", decode KV ", half_kv_ ? "fp16" : "f32");
  }

  std::string kernel_timings() const override {
    std::lock_guard<std::mutex> lock(ChoiceMutex());
    std::string out;
    for (const KernelRates& op : ChosenRates()) {
      absl::StrAppend(&out, out.empty() ? "" : "; ", op.op, ", GOP/s:");
      for (size_t i = 0; i < op.rates.size(); ++i) {
        absl::StrAppendFormat(&out, "%s %s %.0f", i > 0 ? "," : "", op.rates[i].name, op.rates[i].gops);
      }
    }
    return out;
  }

  // The decode layout (pack_decode_): one-token products of every type it
  // covers read it; batch products only where the kernels read that layout
  // (AVX-512's Q4_0 / Q4_1).
  WeightCopy CopyOf(const WeightView& w, WeightUse use) const override {
    const uint64_t bytes = pack_decode_ ? cpu::DecodePackedBytes(w.type, w.rows, w.cols) : 0;
    if (bytes == 0 || (use == WeightUse::kBatch && !cpu::MatMulReadsDecodeLayout(w.type))) return {};
    return {.copied = true, .bytes = bytes};
  }

  // Every gather in num_threads_ parts of its rows, the parts over the
  // team where there are enough bytes to share (64 KiB: below that, waking
  // the other threads costs more than the copy).
  absl::Status Gather(const std::vector<RowGather>& gathers) override {
    SNAPFILL_RETURN_IF_ERROR(CheckGathers(gathers));
    const OpScope op(*team_, guard_.get());
    uint64_t bytes = 0;
    for (const RowGather& r : gathers) bytes += static_cast<uint64_t>(r.count) * r.row_bytes;
    const int64_t parts = bytes >= (64u << 10) ? std::max(1, num_threads_) : 1;
    const int64_t items = static_cast<int64_t>(gathers.size()) * parts;
    auto item = [&](int64_t i) {
      const RowGather& r = gathers[i / parts];
      const int64_t part = i % parts;
      GatherRows(r, r.count * part / parts, r.count * (part + 1) / parts);
    };
    if (parts > 1) {
      ParallelFor(items, item);
    } else {
      for (int64_t i = 0; i < items; ++i) item(i);
    }
    return absl::OkStatus();
  }

  bool MakeCopy(const WeightView& w, const std::function<void(const void*, size_t)>& copied) override {
    const cpu::ThreadTeam::Scope bound(*team_);
    return DecodePacked(w, /*now=*/true, copied) != nullptr;
  }

  BackendProfile* profile() override { return this; }

  std::string Report() const override {
    return profile_ ? OpTableReport(kOpNames, seconds_, calls_, ops_, kNumOps) : "";
  }

  std::vector<std::pair<std::string, double>> Seconds() const override {
    return profile_ ? OpTablePairs(kOpNames, seconds_, kNumOps) : std::vector<std::pair<std::string, double>>{};
  }
  std::vector<std::pair<std::string, double>> Ops() const override {
    return profile_ ? OpTablePairs(kOpNames, ops_, kNumOps) : std::vector<std::pair<std::string, double>>{};
  }
  double Int8MatMulOps() const override { return int8_matmul_ops_; }

  // The instructions of the active level's kernels (cpu/peak.h); the exact
  // backend runs every product and the attention in f32.
  Peaks MeasurePeaks() override {
    const cpu::ThreadTeam::Scope bound(*team_);
    Peaks p;
    p.threads = num_threads_;
    auto measure = [&](PeakInstruction instruction) {
      Peak peak;
      if (instruction == PeakInstruction::kNone) return peak;
      peak.instruction = PeakInstructionName(instruction);
      peak.ops_per_second = cpu::MeasurePeak(instruction, num_threads_);
      return peak;
    };
    p.f32 = measure(cpu::F32Instruction());
    if (exact_) {
      p.int8_products = {};
      p.prefill_attention = p.f32;
      return p;
    }
    p.int8_products = measure(cpu::Int8ProductsInstruction());
    const PeakInstruction attention = cpu::PrefillAttentionInstruction();
    p.prefill_attention = attention == cpu::F32Instruction() ? p.f32 : measure(attention);
    return p;
  }

  Device device() const override { return Device::kCpu; }
  int num_threads() const override { return num_threads_; }

  static absl::Status CheckMatMul(int64_t x_stride, int64_t m, const WeightView& w, int64_t y_stride) {
    if (!cpu::MatMulSupports(w.type)) {
      return absl::UnimplementedError(
          absl::StrCat("matmul: weight type ", GetTypeTraits(w.type).name ? GetTypeTraits(w.type).name : "?",
                       " is not supported"));
    }
    if (m < 0 || x_stride < w.cols || y_stride < w.rows || RowBytes(w.type, w.cols) < 0 ||
        static_cast<size_t>(RowBytes(w.type, w.cols)) > w.row_bytes) {
      return absl::InvalidArgumentError(absl::StrCat("matmul: bad shapes m=", m, " k=", w.cols,
                                                     " n=", w.rows, " x_stride=", x_stride,
                                                     " y_stride=", y_stride));
    }
    return absl::OkStatus();
  }

  // Profiling: the ops of one product of m rows by w (BackendProfile::Ops).
  void CountMatMul(const WeightView& w, int64_t m) {
    if (!profile_) return;
    const double ops = 2.0 * static_cast<double>(m) * static_cast<double>(w.rows) * static_cast<double>(w.cols);
    ops_[kMatMul] += ops;
    if (!exact_ && cpu::MatMulQuantizesActivations(w.type, m)) int8_matmul_ops_ += ops;
  }
  // (query, key) pairs of an attention of num_q queries over num_keys keys,
  // the last num_q of them the queries' own (causal): the keys before the
  // chunk are visible to every query, and query i sees i + 1 of the chunk's.
  // With a window, query i sees min(window, num_keys - num_q + i + 1).
  static double VisiblePairs(int64_t num_q, int64_t num_keys, int64_t window = 0) {
    if (window > 0) {
      double pairs = 0;
      for (int64_t i = 0; i < num_q; ++i) pairs += static_cast<double>(std::min(window, num_keys - num_q + i + 1));
      return pairs;
    }
    return static_cast<double>(num_q) * static_cast<double>(num_keys - num_q) +
           static_cast<double>(num_q) * static_cast<double>(num_q + 1) / 2;
  }

  absl::Status MatMulShared(const float* x, int64_t m, int64_t x_stride, const SharedOut* outs,
                            int count) override {
    // One type on the batch path: X quantized once (cpu::MatMulShared), the
    // same results as one MatMul each. One token over decode copies of one
    // type: cpu::MatMulDecodePackedShared, the same. Otherwise (exact mode,
    // mixed types, no copies), one MatMul each.
    if (m == 1 && pack_decode_ && count > 1 && count <= 8) return DecodeShared(x, x_stride, outs, count);
    bool shared = m > 1 && !exact_ && count > 1 && count <= 8;
    for (int c = 0; c < count && shared; ++c) {
      SNAPFILL_RETURN_IF_ERROR(CheckMatMul(x_stride, m, *outs[c].w, outs[c].y_stride));
      shared = outs[c].w->type == outs[0].w->type && outs[c].w->cols == outs[0].w->cols;
    }
    if (!shared) return Backend::MatMulShared(x, m, x_stride, outs, count);
    OpTimer timer(*team_, guard_.get(), profile_, &seconds_[kMatMul], &calls_[kMatMul]);
    ++epoch_;  // a batch (see MatMul)
    cpu::MatMulOut co[8];
    for (int c = 0; c < count; ++c) {
      const WeightView& w = *outs[c].w;
      co[c] = {w.data, w.rows, w.row_bytes, outs[c].y, outs[c].y_stride, BatchCopy(w)};
      CountMatMul(w, m);
    }
    cpu::MatMulShared(x, m, outs[0].w->cols, x_stride, outs[0].w->type, co, count);
    return absl::OkStatus();
  }

  // One token times `count` weights (pack_decode_): those with decode copies,
  // of one type and k, in one cpu::MatMulDecodePackedShared; otherwise each
  // as MatMul would (its copy, else the GGUF rows). DecodePacked runs once
  // per weight, as in `count` MatMul calls.
  absl::Status DecodeShared(const float* x, int64_t x_stride, const SharedOut* outs, int count) {
    for (int c = 0; c < count; ++c) {
      SNAPFILL_RETURN_IF_ERROR(CheckMatMul(x_stride, 1, *outs[c].w, outs[c].y_stride));
    }
    OpTimer timer(*team_, guard_.get(), profile_, &seconds_[kMatMul], &calls_[kMatMul]);
    cpu::DecodeOut co[8];
    bool shared = true;
    for (int c = 0; c < count; ++c) {
      const WeightView& w = *outs[c].w;
      CountMatMul(w, 1);
      co[c] = {DecodePacked(w), w.rows, outs[c].y};
      shared = shared && co[c].packed != nullptr && w.type == outs[0].w->type && w.cols == outs[0].w->cols;
    }
    if (shared) {
      cpu::MatMulDecodePackedShared(x, outs[0].w->cols, outs[0].w->type, co, count);
      return absl::OkStatus();
    }
    for (int c = 0; c < count; ++c) {
      OneToken(x, x_stride, *outs[c].w, static_cast<const uint8_t*>(co[c].packed), outs[c].y, outs[c].y_stride);
    }
    return absl::OkStatus();
  }

  // One token times w: over its decode copy `packed`, else the GGUF rows.
  static void OneToken(const float* x, int64_t x_stride, const WeightView& w, const uint8_t* packed, float* y,
                       int64_t y_stride) {
    if (packed != nullptr) {
      cpu::MatMulDecodePacked(x, w.cols, packed, w.type, w.rows, y);
    } else {
      cpu::MatMul(x, 1, w.cols, x_stride, w.data, w.type, w.rows, w.row_bytes, y, y_stride);
    }
  }

  absl::Status MatMul(const float* x, int64_t m, int64_t x_stride, const WeightView& w, float* y,
                      int64_t y_stride) override {
    OpTimer timer(*team_, guard_.get(), profile_, &seconds_[kMatMul], &calls_[kMatMul]);
    SNAPFILL_RETURN_IF_ERROR(CheckMatMul(x_stride, m, w, y_stride));
    if (m == 0) return absl::OkStatus();
    CountMatMul(w, m);
    // A batch: decoding may start over after it (perhaps with another model
    // where this one was), so decode copies are checked again.
    if (m > 1) ++epoch_;
    if (exact_ && w.type != GgmlType::kF32) {
      // Each matrix is dequantized once and kept (4 bytes per weight).
      std::vector<float>& f32 = dequantized_[w.data];
      if (f32.empty()) {
        f32.resize(w.rows * w.cols);
        const uint8_t* src = static_cast<const uint8_t*>(w.data);
        cpu::ParallelFor(w.rows, [&](int64_t r) {
          cpu::DequantizeRow(w.type, src + r * w.row_bytes, f32.data() + r * w.cols, w.cols);
        });
      }
      cpu::MatMul(x, m, w.cols, x_stride, f32.data(), GgmlType::kF32, w.rows,
                  w.cols * sizeof(float), y, y_stride);
      return absl::OkStatus();
    }
    if (m == 1 && pack_decode_) {
      OneToken(x, x_stride, w, DecodePacked(w), y, y_stride);
      return absl::OkStatus();
    }
    if (const uint8_t* copy = BatchCopy(w); copy != nullptr) {
      const cpu::MatMulOut out{w.data, w.rows, w.row_bytes, y, y_stride, copy};
      cpu::MatMulShared(x, m, w.cols, x_stride, w.type, &out, 1);  // the same as MatMul
      return absl::OkStatus();
    }
    cpu::MatMul(x, m, w.cols, x_stride, w.data, w.type, w.rows, w.row_bytes, y, y_stride);
    return absl::OkStatus();
  }

  absl::Status GetRows(const WeightView& table, const int32_t* ids, int64_t n, float* out,
                       int64_t out_stride) override {
    OpTimer timer(*team_, guard_.get(), profile_, &seconds_[kGetRows], &calls_[kGetRows]);
    if (out_stride < table.cols) return absl::InvalidArgumentError("get_rows: out_stride < cols");
    for (int64_t i = 0; i < n; ++i) {
      if (ids[i] < 0 || ids[i] >= table.rows) {
        return absl::OutOfRangeError(
            absl::StrCat("token id ", ids[i], " is outside the vocabulary of ", table.rows));
      }
    }
    auto row = [&](int64_t i) {
      cpu::DequantizeRow(table.type, static_cast<const uint8_t*>(table.data) + ids[i] * table.row_bytes,
                         out + i * out_stride, table.cols);
    };
    if (n <= 16) {  // (on this thread: a parallel region costs more)
      for (int64_t i = 0; i < n; ++i) row(i);
      return absl::OkStatus();
    }
    // On the kernels' team, 64 rows at a time.
    constexpr int64_t kRowsPerItem = 64;
    cpu::ParallelFor((n + kRowsPerItem - 1) / kRowsPerItem, [&](int64_t item) {
      for (int64_t i = item * kRowsPerItem; i < std::min(n, (item + 1) * kRowsPerItem); ++i) row(i);
    });
    return absl::OkStatus();
  }

  absl::Status RmsNorm(const float* x, int64_t x_stride, const float* weight, float* y,
                       int64_t y_stride, int64_t rows, int64_t dim, float eps) override {
    OpTimer timer(*team_, guard_.get(), profile_, &seconds_[kRmsNorm], &calls_[kRmsNorm]);
    if (x_stride < dim || y_stride < dim) return absl::InvalidArgumentError("rms_norm: stride < dim");
    cpu::RmsNorm(x, x_stride, weight, y, y_stride, rows, dim, eps);
    return absl::OkStatus();
  }

  void ParallelFor(int64_t n, const std::function<void(int64_t)>& f) override {
    const cpu::ThreadTeam::Scope bound(*team_);
    cpu::ParallelFor(n, f);
  }

  absl::Status Pool1d(const float* in, float* out, int64_t n, int64_t kernel, PoolOp op) override {
    return HostPool1d(in, out, n, kernel, op);
  }
  absl::Status TopK(const float* scores, int64_t n, int64_t k, int32_t* positions) override {
    return HostTopK(scores, n, k, positions);
  }
  absl::Status SelectHeads(const HeadSelection& s) override {
    const OpScope op(*team_, guard_.get());
    return HostSelectHeads(s, *this);
  }
  uint64_t AttentionScratchBytes(int64_t num_q, int64_t num_keys, int64_t num_kv_heads,
                                 int64_t head_dim) const override {
    return cpu::AttentionScratchBytes(num_q, num_keys, num_kv_heads, head_dim);
  }
  uint64_t ProductScratchBytes(int64_t tokens, int64_t widest, int64_t ffn_dim) const override {
    return exact_ ? 0 : cpu::ProductScratchBytes(tokens, widest, ffn_dim, num_threads_);
  }
  uint64_t WindowScoresScratchBytes(int64_t num_heads, int64_t num_q, int64_t num_keys) const override {
    const uint64_t scores = static_cast<uint64_t>(num_heads) * static_cast<uint64_t>(num_q) *
                            static_cast<uint64_t>(num_keys);
    return std::min(static_cast<uint64_t>(cpu::kDefaultWindowScoresKeptFloats), scores) * sizeof(float);
  }
  bool QuantizesActivations(GgmlType type) const override {
    return !exact_ && cpu::MatMulQuantizesActivations(type);
  }
  std::string thread_waits() const override { return cpu::ThreadWaits(); }

  absl::Status Rope(float* x, int64_t num_tokens, int64_t num_heads, int64_t head_dim,
                    int64_t token_stride, const int32_t* pos, const RopeSpec& r) override {
    OpTimer timer(*team_, guard_.get(), profile_, &seconds_[kRope], &calls_[kRope]);
    if (r.rot_dim > head_dim || r.rot_dim % 2 != 0 || token_stride < num_heads * head_dim) {
      return absl::InvalidArgumentError(absl::StrCat("rope: rot_dim=", r.rot_dim,
                                                     " head_dim=", head_dim));
    }
    cpu::Rope(x, num_tokens, num_heads, head_dim, token_stride, pos, r.rot_dim, r.freq_base,
              r.freq_scale, r.neox, r.freq_factors);
    return absl::OkStatus();
  }

  absl::Status GeluGlu(const float* gate, const float* up, float* out, int64_t n) override {
    OpTimer timer(*team_, guard_.get(), profile_, &seconds_[kSwiGlu], &calls_[kSwiGlu]);
    cpu::GeluGlu(gate, up, out, n);
    return absl::OkStatus();
  }
  absl::Status SwiGlu(const float* gate, const float* up, float* out, int64_t n) override {
    OpTimer timer(*team_, guard_.get(), profile_, &seconds_[kSwiGlu], &calls_[kSwiGlu]);
    cpu::SwiGlu(gate, up, out, n);
    return absl::OkStatus();
  }

  // Where a batch product runs on AMX-BF16 tiles, the SwiGLU in front of the
  // down projection is applied row by row as the product converts its input,
  // and the residual adds happen as the output tiles leave (both counted as
  // matmul).
  bool FusesResidualAdd(const WeightView& w, int64_t m) const override {
    return m > 1 && !exact_ && cpu::MatMulFuses(w.type, m, w.cols, w.row_bytes);
  }

  absl::Status MatMulAdd(const float* x, int64_t m, int64_t x_stride, const WeightView& w, float* y,
                         int64_t y_stride) override {
    if (!FusesResidualAdd(w, m)) return Backend::MatMulAdd(x, m, x_stride, w, y, y_stride);
    OpTimer timer(*team_, guard_.get(), profile_, &seconds_[kMatMul], &calls_[kMatMul]);
    SNAPFILL_RETURN_IF_ERROR(CheckMatMul(x_stride, m, w, y_stride));
    ++epoch_;  // a batch, as in MatMul
    CountMatMul(w, m);
    cpu::MatMulAdd(x, m, w.cols, x_stride, w.data, w.type, w.rows, w.row_bytes, y, y_stride);
    return absl::OkStatus();
  }

  absl::Status SwiGluMatMul(float* gate, const float* up, int64_t m, int64_t x_stride, const WeightView& w,
                            float* y, int64_t y_stride, bool add) override {
    if (!FusesResidualAdd(w, m)) return Backend::SwiGluMatMul(gate, up, m, x_stride, w, y, y_stride, add);
    OpTimer timer(*team_, guard_.get(), profile_, &seconds_[kMatMul], &calls_[kMatMul]);
    SNAPFILL_RETURN_IF_ERROR(CheckMatMul(x_stride, m, w, y_stride));
    ++epoch_;  // a batch, as in MatMul
    CountMatMul(w, m);
    cpu::MatMulSwiGlu(gate, up, m, w.cols, x_stride, w.data, w.type, w.rows, w.row_bytes, y, y_stride, add);
    return absl::OkStatus();
  }

  // On AMX-BF16 the whole block is one cpu::FeedForward: the norm row by row
  // as x is converted, gate and up leave the tiles into L1, through the
  // SwiGLU, into the down projection's bf16 input (all counted as matmul);
  // the buffers are not touched.
  absl::Status FeedForward(const float* x, int64_t m, int64_t x_stride, const FeedForwardBlock& f, float* y,
                           int64_t y_stride, bool add) override {
    const WeightView &gate = *f.gate, &up = *f.up, &down = *f.down;
    if (!FeedForwardFused(gate, up, down, m, add)) return Backend::FeedForward(x, m, x_stride, f, y, y_stride, add);
    OpTimer timer(*team_, guard_.get(), profile_, &seconds_[kMatMul], &calls_[kMatMul]);
    SNAPFILL_RETURN_IF_ERROR(CheckMatMul(x_stride, m, gate, f.buf_stride));
    SNAPFILL_RETURN_IF_ERROR(CheckMatMul(x_stride, m, up, f.buf_stride));
    SNAPFILL_RETURN_IF_ERROR(CheckMatMul(down.cols, m, down, y_stride));
    ++epoch_;  // a batch, as in MatMul
    CountMatMul(gate, m);
    CountMatMul(up, m);
    CountMatMul(down, m);
    cpu::RowNorm rn;
    rn.weight = f.norm.weight;
    rn.eps = f.norm.eps;
    cpu::FeedForward(x, m, gate.cols, x_stride, gate.data, up.data, gate.type, gate.rows, gate.row_bytes, down.data,
                     down.type, down.rows, down.row_bytes, y, y_stride, add, rn);
    return absl::OkStatus();
  }

  // Q, K and V with the attention norm in front: on AMX-BF16, one
  // cpu::NormMatMulShared that normalizes each row as it converts it
  // (counted as matmul); elsewhere RmsNorm then MatMulShared.
  absl::Status NormMatMulShared(const float* x, int64_t m, int64_t x_stride, const Norm& norm, const SharedOut* outs,
                                int count) override {
    const WeightView* ws[8];
    for (int c = 0; c < count && c < 8; ++c) ws[c] = outs[c].w;
    if (norm.weight == nullptr || !NormSharedFused(ws, count, m)) {
      return Backend::NormMatMulShared(x, m, x_stride, norm, outs, count);
    }
    OpTimer timer(*team_, guard_.get(), profile_, &seconds_[kMatMul], &calls_[kMatMul]);
    cpu::MatMulOut co[8];
    for (int c = 0; c < count; ++c) {
      const WeightView& w = *outs[c].w;
      SNAPFILL_RETURN_IF_ERROR(CheckMatMul(x_stride, m, w, outs[c].y_stride));
      co[c] = {w.data, w.rows, w.row_bytes, outs[c].y, outs[c].y_stride};
    }
    for (int c = 0; c < count; ++c) CountMatMul(*outs[c].w, m);
    ++epoch_;  // a batch, as in MatMul
    cpu::RowNorm rn;
    rn.weight = norm.weight;
    rn.eps = norm.eps;
    cpu::NormMatMulShared(x, m, outs[0].w->cols, x_stride, rn, outs[0].w->type, co, count);
    return absl::OkStatus();
  }

  bool FusesLayer(const LayerProducts& w, int64_t m) const override {
    const WeightView* qkv[3] = {w.wq, w.wk, w.wv};
    return NormSharedFused(qkv, 3, m) && FusesResidualAdd(*w.wo, m) && FeedForwardFused(*w.gate, *w.up, *w.down, m, true);
  }

  // Whether FeedForward / NormMatMulShared take their fused paths.
  bool FeedForwardFused(const WeightView& gate, const WeightView& up, const WeightView& down, int64_t m,
                        bool add) const {
    return m > 1 && !exact_ && gate.type == up.type && gate.rows == up.rows && gate.cols == up.cols &&
           gate.row_bytes == up.row_bytes && down.cols == gate.rows && (!add || FusesResidualAdd(down, m)) &&
           cpu::FeedForwardFuses(gate.type, down.type, m, gate.cols, gate.rows, gate.row_bytes, down.row_bytes);
  }
  bool NormSharedFused(const WeightView* const* ws, int count, int64_t m) const {
    bool fuse = m > 1 && !exact_ && count > 0 && count <= 8;
    for (int c = 0; c < count && fuse; ++c) {
      const WeightView& w = *ws[c];
      fuse = w.type == ws[0]->type && w.cols == ws[0]->cols && cpu::MatMulFuses(w.type, m, w.cols, w.row_bytes);
    }
    return fuse;
  }

  absl::Status Attention(const Queries& q, const KvView& kv, float* out, int64_t out_stride) override {
    return AttentionWithLse(q, kv, out, out_stride, nullptr);
  }

  bool AttentionKeepsLse() const override { return true; }
  absl::Status AttentionWithLse(const Queries& q, const KvView& kv, float* out, int64_t out_stride,
                                float* lse) override {
    OpTimer timer(*team_, guard_.get(), profile_, &seconds_[kAttention], &calls_[kAttention]);
    SNAPFILL_RETURN_IF_ERROR(CheckQueries("attention", q, kv, /*causal=*/true));
    if (out_stride < q.num_heads * q.head_dim) return absl::InvalidArgumentError("attention: stride smaller than a row");
    if (profile_) ops_[kAttention] += 4.0 * q.head_dim * q.num_heads * VisiblePairs(q.count, kv.num_keys, q.window);
    if (q.count == 1 && kv.k16 != nullptr && kv.v16 != nullptr && lse == nullptr) {
      // One query's window: the last q.window keys.
      const int64_t first = q.window > 0 ? std::max<int64_t>(0, kv.num_keys - q.window) : 0;
      cpu::AttentionDecodeF16(q.q, kv.k16 + first * kv.key_stride, kv.v16 + first * kv.key_stride, kv.head_stride,
                              kv.key_stride, out, kv.num_keys - first, q.num_heads, q.num_kv_heads, q.head_dim,
                              q.scale);
      return absl::OkStatus();
    }
    // The exact backend keeps attention in f32 too (no bf16 tiles).
    (exact_ ? cpu::AttentionF32 : cpu::Attention)(q.q, q.stride, kv.k, kv.v, kv.head_stride, kv.key_stride, out,
                                                  out_stride, q.count, kv.num_keys, q.num_heads, q.num_kv_heads,
                                                  q.head_dim, q.scale, q.window, lse);
    return absl::OkStatus();
  }

  absl::Status WindowScores(const Queries& q, const KvView& kv, float* votes, int64_t votes_stride) override {
    OpTimer timer(*team_, guard_.get(), profile_, &seconds_[kWindowScores], &calls_[kWindowScores]);
    SNAPFILL_RETURN_IF_ERROR(CheckQueries("window_scores", q, kv, /*causal=*/true));
    if (votes_stride < kv.num_keys) return absl::InvalidArgumentError("window_scores: votes stride below the keys");
    if (profile_) ops_[kWindowScores] += 2.0 * q.head_dim * q.num_heads * VisiblePairs(q.count, kv.num_keys);
    cpu::WindowScores(q.q, q.stride, kv.k, kv.head_stride, kv.key_stride, votes, votes_stride, q.count,
                      kv.num_keys, q.num_heads, q.num_kv_heads, q.head_dim, q.scale);
    return absl::OkStatus();
  }

  absl::Status QueryLogSumExp(const Queries& q, const KvView& kv, float* lse) override {
    OpTimer timer(*team_, guard_.get(), profile_, &seconds_[kWindowScores], &calls_[kWindowScores]);
    SNAPFILL_RETURN_IF_ERROR(CheckQueries("query_log_sum_exp", q, kv, /*causal=*/true));
    if (profile_) ops_[kWindowScores] += 2.0 * q.head_dim * q.num_heads * VisiblePairs(q.count, kv.num_keys);
    cpu::QueryLogSumExp(q.q, q.stride, kv.k, kv.head_stride, kv.key_stride, q.count, kv.num_keys, q.num_heads,
                        q.num_kv_heads, q.head_dim, q.scale, lse);
    return absl::OkStatus();
  }

  absl::Status RecallScores(const Queries& q, const float* lse, const KvView& keys, float* scores,
                            int64_t scores_stride, bool max_weight) override {
    OpTimer timer(*team_, guard_.get(), profile_, &seconds_[kWindowScores], &calls_[kWindowScores]);
    SNAPFILL_RETURN_IF_ERROR(CheckQueries("recall_scores", q, keys, /*causal=*/false));
    if (scores_stride < keys.num_keys) return absl::InvalidArgumentError("recall_scores: stride below the keys");
    if (profile_) ops_[kWindowScores] += 2.0 * q.head_dim * q.num_heads * q.count * keys.num_keys;
    // Context reconstruction's largest weights on the chunk attention's bf16
    // operands where it takes them (their denominators come from it:
    // AttentionWithLse); the exact backend's, and everything else, in f32.
    if (max_weight && !exact_ &&
        cpu::RecallMaxWeightsBf16(q.q, q.stride, q.count, lse, keys.k, keys.head_stride, keys.key_stride, keys.num_keys,
                                  scores, scores_stride, q.num_heads, q.num_kv_heads, q.head_dim, q.scale)) {
      return absl::OkStatus();
    }
    cpu::RecallScores(q.q, q.stride, q.count, lse, keys.k, keys.head_stride, keys.key_stride, keys.num_keys, scores,
                      scores_stride, q.num_heads, q.num_kv_heads, q.head_dim, q.scale, max_weight);
    return absl::OkStatus();
  }

  absl::Status Synchronize() override { return absl::OkStatus(); }

 private:
  // A matrix in the decode layout, with its shape and samples of the bytes
  // it was made from: a view at the same address with other contents
  // (another model mapped where this one was) starts over, not served stale.
  // The samples are compared by PrepareWeights and by the first
  // one-token product after each batch (m > 1), not by every product: the
  // caller may have given w's pages back, and reading them maps them in.
  struct Packed {
    std::unique_ptr<uint8_t, void (*)(void*)> data{nullptr, std::free};
    bool seen = false;
    // Made or matched by PrepareWeights (its caller vouches for w's
    // bytes until it asks again): batch products may read it.
    bool confirmed = false;
    int64_t checked_epoch = -1;  // epoch_ when the samples last matched
    GgmlType type = GgmlType::kF32;
    int64_t rows = 0, cols = 0;
    size_t row_bytes = 0;
    uint8_t sample[3][64] = {};
  };

  // Copies bytes [at, at + n) of w: with pread where w names its file, so
  // that the mapping's pages behind w.data stay out of the resident set
  // (the copy takes their place); from w.data otherwise, or if the read
  // fails (the same bytes, only mapped).
  static void ReadWeight(const WeightView& w, size_t at, size_t n, uint8_t* dst) {
    if (w.fd >= 0 && ReadAllAt(w.fd, dst, n, w.file_offset + at, "the weights' file").ok()) return;
    std::memcpy(dst, static_cast<const uint8_t*>(w.data) + at, n);
  }

  static void Sample(const WeightView& w, uint8_t out[3][64]) {
    const size_t bytes = w.rows * w.row_bytes;
    const size_t at[3] = {0, bytes / 2, bytes - 64};
    for (int i = 0; i < 3; ++i) ReadWeight(w, std::min(at[i], bytes - 64), 64, out[i]);
  }

  // For a batch product of w: its decode-layout copy where the batch kernels
  // read one (CopyOf(w, kBatch)) and the last PrepareWeights of w made
  // or confirmed it; nullptr otherwise. Never makes a copy, and never reads
  // w's bytes: their pages may have been given back, and a sample would map
  // its neighbours again with it (the kernel's fault-around).
  const uint8_t* BatchCopy(const WeightView& w) const {
    if (!CopyOf(w, WeightUse::kBatch).copied) return nullptr;
    const auto it = packed_.find(w.data);
    if (it == packed_.end() || it->second.data == nullptr || !it->second.confirmed) return nullptr;
    const Packed& p = it->second;
    if (p.type != w.type || p.rows != w.rows || p.cols != w.cols || p.row_bytes != w.row_bytes) return nullptr;
    return p.data.get();
  }

  // The decode-layout copy of w, made at its second one-token product (a
  // single one, such as the prefill's last logits, is not worth a copy);
  // nullptr before that, when the layout does not cover w, or when the copy
  // cannot be allocated (the product then reads the GGUF rows).
  // now: make the copy at this call (PrepareWeights), in slices of
  // kPackSliceRows rows, calling `copied` with each slice's source bytes as
  // soon as it is packed (and with all of w's bytes if the copy exists).
  static constexpr int64_t kPackSliceRows = 1024;
  const uint8_t* DecodePacked(const WeightView& w, bool now = false,
                              const std::function<void(const void*, size_t)>& copied = nullptr) {
    const size_t bytes = cpu::DecodePackedBytes(w.type, w.rows, w.cols);
    if (bytes == 0 || w.rows * w.row_bytes < 64) return nullptr;
    Packed& p = packed_[w.data];
    const bool shape = p.seen && p.type == w.type && p.rows == w.rows && p.cols == w.cols &&
                       p.row_bytes == w.row_bytes;
    // Checked since the last batch: w's bytes are not read again (their
    // pages may have been given back, and reading them would map them in).
    bool same = shape && !now && p.checked_epoch == epoch_;
    uint8_t sample[3][64];
    if (!same) {
      Sample(w, sample);
      same = shape && std::memcmp(p.sample, sample, sizeof(sample)) == 0;
    }
    p.checked_epoch = epoch_;
    if (same && p.data != nullptr) {
      if (now) p.confirmed = true;
      if (copied) copied(w.data, w.rows * w.row_bytes);
      return p.data.get();
    }
    if (!same) {  // first sight, or other bytes at this address: remember them
      p.data.reset();
      p.confirmed = false;
      p.seen = true;
      p.type = w.type;
      p.rows = w.rows;
      p.cols = w.cols;
      p.row_bytes = w.row_bytes;
      std::memcpy(p.sample, sample, sizeof(sample));
      if (!now) return nullptr;  // read the rows this time
    }
    p.data.reset(static_cast<uint8_t*>(std::aligned_alloc(64, (bytes + 63) / 64 * 64)));
    if (p.data == nullptr) {
      packed_.erase(w.data);
      return nullptr;
    }
    static_assert(kPackSliceRows % kDecodeGroupRows == 0, "slices of whole groups");
    // Slices of whole 16-row groups are sub-matrices of the layout.
    const auto* src = static_cast<const uint8_t*>(w.data);
    const size_t group_bytes = cpu::DecodePackedBytes(w.type, kDecodeGroupRows, w.cols);
    // Each slice is read into a buffer first (ReadWeight) rather than
    // through the mapping.
    std::unique_ptr<uint8_t, void (*)(void*)> slice(
        static_cast<uint8_t*>(std::aligned_alloc(64, (std::min(kPackSliceRows, w.rows) * w.row_bytes + 63) / 64 * 64)),
        std::free);
    for (int64_t r0 = 0; r0 < w.rows; r0 += kPackSliceRows) {
      const int64_t rows = std::min(kPackSliceRows, w.rows - r0);
      const uint8_t* from = src + r0 * w.row_bytes;
      if (slice != nullptr) {
        ReadWeight(w, r0 * w.row_bytes, rows * w.row_bytes, slice.get());
        from = slice.get();
      }
      cpu::PackForDecode(from, w.type, rows, w.cols, w.row_bytes,
                         p.data.get() + r0 / kDecodeGroupRows * group_bytes);
      if (copied) copied(src + r0 * w.row_bytes, rows * w.row_bytes);
    }
    p.confirmed = now;
    return p.data.get();
  }

  // The kernels' threads and scratch (first: the other members' kernels'
  // buffers may be freed with it).
  std::unique_ptr<cpu::ThreadTeam> team_;
  std::unique_ptr<BufferGuard> guard_;  // BackendOptions::guard_buffers
  // Guarded: the copies DownloadAsync queued, in fence order, their bytes
  // held until WaitDownload puts them in place.
  struct PendingCopy {
    uint64_t fence;
    void* host;
    std::vector<uint8_t> bytes;
  };
  std::deque<PendingCopy> pending_copies_;
  uint64_t last_fence_ = 0;
  int num_threads_;
  bool exact_;
  bool profile_;
  double seconds_[kNumOps] = {};
  int64_t calls_[kNumOps] = {};
  double ops_[kNumOps] = {};     // Ops()
  double int8_matmul_ops_ = 0;   // Int8MatMulOps()
  bool pack_decode_;
  bool half_kv_;
  // exact_matmul: weight matrices dequantized to f32, by their data.
  std::unordered_map<const void*, std::vector<float>> dequantized_;
  // pack_decode_weights: matrices in the decode layout, by their data.
  std::unordered_map<const void*, Packed> packed_;
  int64_t epoch_ = 0;  // batches (m > 1) seen
};

}  // namespace

void Backend::FromHalf(const uint16_t* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = Fp16ToFp32(x[i]);
}

std::vector<bool> Backend::PrepareWeights(const std::vector<const WeightView*>& weights, WeightUse use,
                                          const std::function<void(size_t, const void*, size_t)>& copied) {
  std::vector<bool> made(weights.size(), false);
  for (size_t i = 0; i < weights.size(); ++i) {
    if (!CopyOf(*weights[i], use).copied) continue;
    made[i] = MakeCopy(*weights[i], [&](const void* data, size_t n) {
      if (copied) copied(i, data, n);
    });
  }
  return made;
}

absl::Status Backend::Gather(const std::vector<RowGather>& gathers) {
  SNAPFILL_RETURN_IF_ERROR(CheckGathers(gathers));
  for (const RowGather& r : gathers) GatherRows(r, 0, r.count);
  return absl::OkStatus();
}

absl::Status Backend::SelectHeads(const HeadSelection& s) { return HostSelectHeads(s, *this); }

absl::Status Backend::Complement(const int32_t* keep, int64_t keep_stride, int64_t kept, int64_t num_heads,
                                 int64_t num_candidates, int32_t* out, int64_t out_stride) {
  return HostComplement(keep, keep_stride, kept, num_heads, num_candidates, out, out_stride);
}

absl::Status Backend::GateScores(const GateScoring& g) {
  SNAPFILL_RETURN_IF_ERROR(CheckGateScoring(g));
  if (g.n == 0) return absl::OkStatus();
  // (A head is n × hidden × head_dim multiply-adds, 2M for 2,048 keys of
  // SmolLM2: the heads share the threads where there are several.)
  auto head = [&](int64_t h) {
    cpu::GateScores(g.params + h * g.params_stride, g.head_dim, g.hidden, g.keys + h * g.keys_head_stride, g.key_stride,
                    g.n, g.y + h * g.y_stride);
  };
  if (g.num_heads > 1 && g.n >= 256) {
    ParallelFor(g.num_heads, head);
  } else {
    for (int64_t h = 0; h < g.num_heads; ++h) head(h);
  }
  return absl::OkStatus();
}

absl::Status Backend::TopSpans(const float* scores, int64_t n, int64_t k, int64_t span, int32_t* positions) {
  // (Single entries are the backend's TopK, which a device runs where it pays.)
  if (span == 1) return TopK(scores, n, k, positions);
  return HostTopSpans(scores, n, k, span, positions);
}

absl::StatusOr<std::unique_ptr<BackendBuffer>> Backend::NewBuffer(uint64_t bytes) {
  auto buffer = std::make_unique<HostBuffer>();
  SNAPFILL_ASSIGN_OR_RETURN(buffer->pages, MapPages(bytes));
  return std::unique_ptr<BackendBuffer>(std::move(buffer));
}

absl::StatusOr<std::unique_ptr<BackendBuffer>> Backend::NewHostBuffer(uint64_t bytes) {
  auto buffer = std::make_unique<HostBuffer>();
  SNAPFILL_ASSIGN_OR_RETURN(buffer->pages, MapPages(bytes));
  return std::unique_ptr<BackendBuffer>(std::move(buffer));
}

absl::StatusOr<uint64_t> Backend::DownloadAsync(const void* src, void* host, uint64_t bytes) {
  SNAPFILL_RETURN_IF_ERROR(Download(src, host, bytes));
  return uint64_t{0};
}

absl::Status Backend::Download(const void* src, void* host, uint64_t bytes) {
  if (bytes > 0) std::memcpy(host, src, bytes);
  return absl::OkStatus();
}

absl::Status Backend::Upload(const void* host, void* dst, uint64_t bytes) {
  if (bytes > 0) std::memcpy(dst, host, bytes);
  return absl::OkStatus();
}

absl::Status Backend::Add(float* x, const float* y, int64_t n) {
  constexpr int64_t kPiece = 65536;
  auto add = [&](int64_t p) {
    for (int64_t i = p * kPiece; i < std::min(n, (p + 1) * kPiece); ++i) x[i] += y[i];
  };
  if (n <= kPiece) {
    add(0);
  } else {
    ParallelFor((n + kPiece - 1) / kPiece, add);
  }
  return absl::OkStatus();
}

absl::Status Backend::AddRows(float* x, int64_t stride, const float* bias, int64_t rows, int64_t dim) {
  constexpr int64_t kRowsPerPiece = 64;
  ParallelFor((rows + kRowsPerPiece - 1) / kRowsPerPiece, [&](int64_t p) {
    for (int64_t r = p * kRowsPerPiece; r < std::min(rows, (p + 1) * kRowsPerPiece); ++r) {
      float* xr = x + r * stride;
      for (int64_t i = 0; i < dim; ++i) xr[i] += bias[i];
    }
  });
  return absl::OkStatus();
}

absl::Status Backend::Scale(float* x, int64_t n, float s) {
  constexpr int64_t kPiece = 65536;
  ParallelFor((n + kPiece - 1) / kPiece, [&](int64_t p) {
    for (int64_t i = p * kPiece; i < std::min(n, (p + 1) * kPiece); ++i) x[i] *= s;
  });
  return absl::OkStatus();
}

absl::Status Backend::Fill(float* x, int64_t n, float value) {
  if (n > 0 && x == nullptr) return absl::InvalidArgumentError("fill: no destination");
  if (n > 0) std::fill(x, x + n, value);
  return absl::OkStatus();
}

absl::Status Backend::ToHalfInBuffers(const float* x, uint16_t* y, int64_t n) {
  if (n < 0) return absl::InvalidArgumentError(absl::StrCat("to half: ", n, " values"));
  ToHalf(x, y, n);
  return absl::OkStatus();
}

void Backend::ToHalf(const float* x, uint16_t* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = Fp32ToFp16(x[i]);
}

absl::Status Backend::ToInt8RowsInBuffers(const float* x, uint8_t* y, int64_t rows, int64_t dim) {
  if (rows < 0 || dim < 0) return absl::InvalidArgumentError(absl::StrCat("to int8: ", rows, " rows of ", dim));
  ToInt8Rows(x, y, rows, dim);
  return absl::OkStatus();
}

void Backend::ToInt8Rows(const float* x, uint8_t* y, int64_t rows, int64_t dim) { EncodeInt8Rows(x, rows, dim, y); }

void Backend::FromInt8Rows(const uint8_t* y, float* x, int64_t rows, int64_t dim) { DecodeInt8Rows(y, rows, dim, x); }

namespace {

// The rates the kernels were chosen by in this process (timed, or given in
// BackendOptions::kernel_rates), by op, for kernel_timings(); empty until a
// choice by measurement.
std::vector<KernelRates>& ChosenRates() {
  static std::vector<KernelRates> rates;
  return rates;
}
std::mutex& ChoiceMutex() {
  static std::mutex mu;
  return mu;
}

constexpr char kAttentionOp[] = "prefill attention";
constexpr char kProductsOp[] = "products";
// The token block the products are timed on: a chunk's worth of work per
// call, as a prefill's (its speed changes little above a few hundred).
constexpr int64_t kProductTokens = 512;

std::vector<KernelRate> AttentionRatesNow(const BackendOptions::AttentionShape& shape) {
  // Timed once per process and shape (backends of one model share it).
  static std::mutex mu;
  static std::map<std::tuple<int64_t, int64_t, int64_t>, std::vector<KernelRate>> timed;
  const std::lock_guard<std::mutex> lock(mu);
  std::vector<KernelRate>& rates = timed[{shape.num_heads, shape.num_kv_heads, shape.head_dim}];
  if (rates.empty()) {
    for (const cpu::AttentionRate& r :
         cpu::MeasureAttentionImpls(shape.num_heads, shape.num_kv_heads, shape.head_dim)) {
      rates.push_back({cpu::AttentionImplName(r.impl), r.gops});
    }
  }
  return rates;
}

std::vector<KernelRate> ProductRatesNow(const BackendOptions::ProductShape& shape) {
  std::vector<KernelRate> out;
  for (const cpu::ProductRate& r : cpu::MeasureProductImpls(shape.type, kProductTokens, shape.k, shape.n)) {
    out.push_back({cpu::ProductPathName(r.impl), r.gops});
  }
  return out;
}

// An op's rates for "measure": those the options give, of the
// implementations this CPU runs (`here`), else timed now.
std::vector<KernelRate> RatesFor(const char* op, const BackendOptions& options, const std::vector<std::string>& here,
                                 const std::function<std::vector<KernelRate>()>& time_now) {
  std::vector<KernelRate> rates;
  for (const KernelRates& given : options.kernel_rates) {
    if (given.op != op) continue;
    for (const KernelRate& r : given.rates) {
      if (std::find(here.begin(), here.end(), r.name) != here.end()) rates.push_back(r);
    }
  }
  if (rates.empty()) rates = time_now();
  std::vector<KernelRates>& chosen = ChosenRates();
  auto it = std::find_if(chosen.begin(), chosen.end(), [&](const KernelRates& r) { return r.op == op; });
  if (it == chosen.end()) it = chosen.insert(chosen.end(), KernelRates{op, {}});
  it->rates = rates;
  return rates;
}

absl::Status NotRunHere(const char* what, const std::string& name, const std::vector<std::string>& here) {
  std::string names;
  for (const std::string& n : here) absl::StrAppend(&names, names.empty() ? "" : ", ", n);
  return absl::InvalidArgumentError(
      absl::StrCat(what, " ", name, " is not one this CPU runs here (it runs: ", names, ")"));
}

absl::Status ChooseAttention(const BackendOptions& options) {
  std::string name = options.attention_kernel;
  if (name.empty()) return absl::OkStatus();
  std::lock_guard<std::mutex> lock(ChoiceMutex());
  std::vector<std::string> here;
  for (cpu::AttentionImpl a : cpu::AvailableAttentionImpls()) here.push_back(cpu::AttentionImplName(a));
  if (name == "measure") {
    name = FastestKernel(
        RatesFor(kAttentionOp, options, here, [&] { return AttentionRatesNow(options.attention_shape); }));
  }
  const std::optional<cpu::AttentionImpl> impl = cpu::AttentionImplFromName(name);
  if (!impl) {
    return absl::InvalidArgumentError(absl::StrCat("attention kernel \"", name,
                                                   "\": expected measure, auto, f32, avx512-bf16 or amx-bf16"));
  }
  if (*impl != cpu::AttentionImpl::kAuto && std::find(here.begin(), here.end(), name) == here.end()) {
    return NotRunHere("attention kernel", name, here);
  }
  cpu::SetAttentionImpl(*impl);
  return absl::OkStatus();
}

absl::Status ChooseProducts(const BackendOptions& options) {
  std::string name = options.products_kernel;
  if (name.empty()) return absl::OkStatus();
  std::lock_guard<std::mutex> lock(ChoiceMutex());
  if (name == "auto") {
    cpu::SetMatMulImpl(cpu::MatMulImpl::kAuto);
    return absl::OkStatus();
  }
  const std::vector<cpu::MatMulImpl> impls = cpu::AvailableProductImpls();
  std::vector<std::string> here;
  for (cpu::MatMulImpl m : impls) here.push_back(cpu::ProductPathName(m));
  if (name == "measure") {
    name = FastestKernel(
        RatesFor(kProductsOp, options, here, [&] { return ProductRatesNow(options.product_shape); }));
  }
  for (size_t i = 0; i < impls.size(); ++i) {
    if (here[i] == name) {
      cpu::SetMatMulImpl(impls[i]);
      return absl::OkStatus();
    }
  }
  static constexpr const char* kKnown[] = {"amx-bf16", "amx-int8", "avx512-vnni", "avx-vnni", "avx2"};
  if (std::find(std::begin(kKnown), std::end(kKnown), name) == std::end(kKnown)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "products kernel \"", name, "\": expected measure, auto, amx-bf16, amx-int8, avx512-vnni, avx-vnni or avx2"));
  }
  return NotRunHere("products kernel", name, here);
}

// The level, AMX and wait choices of the options (not the implementations).
absl::Status ConfigureLevel(const BackendOptions& options) {
  cpu::KernelChoices choices;
  if (!options.kernel_level.empty()) {
    const absl::StatusOr<int> level = KernelLevelIndex(options.kernel_level);
    if (!level.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("kernel level \"", options.kernel_level, "\": ", level.status().message()));
    }
    choices.level = static_cast<cpu::CpuLevel>(*level);
  }
  switch (options.amx) {
    case BackendOptions::Amx::kUnset: break;
    case BackendOptions::Amx::kAll: choices.amx = cpu::AmxMode::kAll; break;
    case BackendOptions::Amx::kInt8Only: choices.amx = cpu::AmxMode::kInt8Only; break;
    case BackendOptions::Amx::kOff: choices.amx = cpu::AmxMode::kOff; break;
  }
  if (options.thread_waits != BackendOptions::Waits::kUnset) {
    choices.passive_waits = options.thread_waits == BackendOptions::Waits::kPassive;
  }
  std::string why;
  if (!cpu::ConfigureKernels(choices, &why)) {
    if (choices.level && !cpu::CpuSupports(*choices.level)) return absl::InvalidArgumentError(why);
    return absl::FailedPreconditionError(why);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<int> KernelLevelIndex(std::string_view name) {
  static constexpr cpu::CpuLevel kLevels[] = {cpu::CpuLevel::kGeneric, cpu::CpuLevel::kAvx2,
                                              cpu::CpuLevel::kAvxVnni, cpu::CpuLevel::kAvx512};
  for (cpu::CpuLevel l : kLevels) {
    if (name == cpu::CpuLevelName(l)) return static_cast<int>(l);
  }
  return absl::InvalidArgumentError("expected generic, avx2, avxvnni or avx512");
}

absl::Status ConfigureCpuKernels(const BackendOptions& options) {
  SNAPFILL_RETURN_IF_ERROR(ConfigureLevel(options));
  SNAPFILL_RETURN_IF_ERROR(ChooseAttention(options));
  return ChooseProducts(options);
}

std::string FastestKernel(const std::vector<KernelRate>& rates) {
  if (rates.empty()) return "";
  KernelRate best = rates.front();
  for (const KernelRate& r : rates) {
    if (r.gops > 1.1 * best.gops) best = r;
  }
  return best.name;
}

absl::StatusOr<std::vector<KernelRates>> MeasureCpuKernels(const BackendOptions& options) {
  SNAPFILL_RETURN_IF_ERROR(ConfigureLevel(options));
  // The rates are the backend's: with its thread count.
  cpu::ThreadTeam team(options.num_threads > 0 ? options.num_threads : omp_get_num_procs());
  const cpu::ThreadTeam::Scope bound(team);
  return std::vector<KernelRates>{{kAttentionOp, AttentionRatesNow(options.attention_shape)},
                                  {kProductsOp, ProductRatesNow(options.product_shape)}};
}

std::string CpuIdentity() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  std::string vendor = "unknown", brand;
  if (__get_cpuid(0, &a, &b, &c, &d) != 0) {
    char v[13] = {};
    std::memcpy(v, &b, 4);
    std::memcpy(v + 4, &d, 4);
    std::memcpy(v + 8, &c, 4);
    vendor = v;
  }
  unsigned family = 0, model = 0, stepping = 0;
  if (__get_cpuid(1, &a, &b, &c, &d) != 0) {
    family = (a >> 8) & 0xF;
    model = (a >> 4) & 0xF;
    stepping = a & 0xF;
    if (family == 0xF) family += (a >> 20) & 0xFF;
    if (family >= 6) model |= ((a >> 16) & 0xF) << 4;
  }
  for (unsigned leaf = 0x80000002; leaf <= 0x80000004; ++leaf) {
    unsigned r[4] = {};
    if (__get_cpuid(leaf, &r[0], &r[1], &r[2], &r[3]) == 0) break;
    brand.append(reinterpret_cast<const char*>(r), sizeof(r));
  }
  brand = brand.c_str();  // up to its NUL
  while (!brand.empty() && brand.back() == ' ') brand.pop_back();
  while (!brand.empty() && brand.front() == ' ') brand.erase(0, 1);
  return absl::StrCat(vendor, " ", brand.empty() ? "?" : brand, " (family ", family, " model ", model,
                      " stepping ", stepping, "), ", cpu::CpuLevelName(cpu::MaxCpuLevel()));
}

#ifndef SNAPFILL_WITH_CUDA
absl::StatusOr<std::string> DescribeCudaDevice() {
  return absl::UnimplementedError("built without CUDA (configure with -DSNAPFILL_WITH_CUDA=ON)");
}
#endif

absl::StatusOr<Device> ResolveDevice(std::string_view name) {
  if (name == "cpu") return Device::kCpu;
  if (name == "cuda") return Device::kCuda;
  if (name == "auto") return DescribeCudaDevice().ok() ? Device::kCuda : Device::kCpu;
  return absl::InvalidArgumentError(absl::StrCat("device \"", std::string(name), "\": expected cpu, cuda or auto"));
}

absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(Device device,
                                                       const BackendOptions& options) {
  if (device == Device::kCuda) {
#ifdef SNAPFILL_WITH_CUDA
    return CreateCudaBackend(options);
#else
    return absl::UnimplementedError("built without CUDA (configure with -DSNAPFILL_WITH_CUDA=ON)");
#endif
  }
  if (options.num_threads < 0) {
    return absl::InvalidArgumentError(absl::StrCat("threads must be >= 0, got ", options.num_threads));
  }
  // The backend's own threads: the kernels it chooses by measurement are
  // timed on them.
  auto team = std::make_unique<cpu::ThreadTeam>(options.num_threads > 0 ? options.num_threads : omp_get_num_procs());
  {
    const cpu::ThreadTeam::Scope bound(*team);
    SNAPFILL_RETURN_IF_ERROR(ConfigureCpuKernels(options));
  }
  return std::unique_ptr<Backend>(new CpuBackend(std::move(team), options.exact_matmul, options.profile,
                                                 options.pack_decode_weights, options.half_decode_kv,
                                                 options.guard_buffers));
}

}  // namespace snapfill
