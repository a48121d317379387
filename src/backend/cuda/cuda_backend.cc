// The CUDA backend: the Backend interface over kernels/cuda and cuBLAS on
// one GPU.
//
// Where the data lives: the weight matrices are uploaded once, on their
// first product (or when LlamaForward prepares its batches: PrepareWeights),
// read with pread so that the model file's pages never enter the host's
// resident set, dequantized (Q8_0 on the device, other types on the host's
// cores) and kept on the device as bf16 (the default: cuBLAS's bf16
// products with f32 sums) or f32 (exact_matmul: f32 products, no TF32).
// The norms' weights are uploaded once as well. The backend's buffers
// (NewBuffer: the forward pass's activations, the chunk loop's candidates,
// and the engine's memory's keys and values, which become the decoder's
// cache: HostReachesBuffers) are device memory, the backend's own
// allocations; the votes stay in host memory.
// The attention family reads operands that are already device memory in
// place (its kernels take strides), and RoPE turns device rows in place.
// The other ops copy their operands into dense device scratch and their
// results out with cudaMemcpyDefault, which moves device operands within
// the device and host ones over the bus; the ops that the forward pass runs
// back to back are fused so that a layer copies its residual rows in and
// out once per block (NormMatMulShared, FeedForward with its add,
// MatMulAdd). Gather, Add, AddRows and Scale run on the device where their
// destination is the backend's. The embedding lookup dequantizes its rows
// on the host and copies them in.
#include "src/backend/cuda/cuda_backend.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/ops.h"
#include "snapfill/status.h"
#include "src/base/file_util.h"
#include "src/base/int8_rows.h"
#include "src/base/sys_stats.h"
#include "src/backend/backend_common.h"

namespace snapfill {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;

absl::Status CudaStatus(cudaError_t e, absl::string_view what) {
  if (e == cudaSuccess) return absl::OkStatus();
  if (e == cudaErrorMemoryAllocation) {
    return absl::ResourceExhaustedError(absl::StrCat("CUDA ", what, ": ", cudaGetErrorString(e)));
  }
  return absl::InternalError(absl::StrCat("CUDA ", what, ": ", cudaGetErrorName(e), ": ", cudaGetErrorString(e)));
}

// cuBLAS, opened when the first CUDA backend is made rather than linked:
// loading libcublasLt maps and relocates hundreds of MB, about 150 MiB of
// it resident, which a run on the CPU would otherwise carry. The functions
// the backend calls, by their exported names.
struct Cublas {
  decltype(&cublasCreate_v2) create = nullptr;
  decltype(&cublasDestroy_v2) destroy = nullptr;
  decltype(&cublasSetStream_v2) set_stream = nullptr;
  decltype(&cublasSetMathMode) set_math_mode = nullptr;
  // (C++ sees cublasGemmEx overloaded: the C one, spelled out.)
  cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                            const void*, cudaDataType, int, const void*, cudaDataType, int, const void*, void*,
                            cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t) = nullptr;
  cublasStatus_t (*gemm_strided_batched_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                                            const void*, const void*, cudaDataType, int, long long int, const void*,
                                            cudaDataType, int, long long int, const void*, void*, cudaDataType, int,
                                            long long int, int, cublasComputeType_t, cublasGemmAlgo_t) = nullptr;
  decltype(&cublasGetStatusString) status_string = nullptr;
};

absl::StatusOr<const Cublas*> LoadCublas() {
  static const absl::StatusOr<Cublas> loaded = []() -> absl::StatusOr<Cublas> {
    // The loader's search path first (LD_LIBRARY_PATH, ldconfig), then the
    // toolkit this was built with, then the toolkit's usual place.
    void* lib = nullptr;
    for (const char* path : {"libcublas.so.13", SNAPFILL_CUDA_LIBRARY_DIR "/libcublas.so.13",
                             "/usr/local/cuda/lib64/libcublas.so.13"}) {
      if ((lib = dlopen(path, RTLD_NOW | RTLD_LOCAL)) != nullptr) break;
    }
    if (lib == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot load cuBLAS (libcublas.so.13): ", dlerror(), " (use --device cpu)"));
    }
    Cublas c;
    bool ok = true;
    auto get = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
      ok = ok && fn != nullptr;
    };
    get(c.create, "cublasCreate_v2");
    get(c.destroy, "cublasDestroy_v2");
    get(c.set_stream, "cublasSetStream_v2");
    get(c.set_math_mode, "cublasSetMathMode");
    get(c.gemm_ex, "cublasGemmEx");
    get(c.gemm_strided_batched_ex, "cublasGemmStridedBatchedEx");
    get(c.status_string, "cublasGetStatusString");
    if (!ok) return absl::FailedPreconditionError("libcublas.so.13 lacks a function the backend calls");
    return c;
  }();
  if (!loaded.ok()) return loaded.status();
  return &*loaded;
}

absl::Status CublasStatus(cublasStatus_t s, absl::string_view what) {
  if (s == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  absl::StatusOr<const Cublas*> c = LoadCublas();
  return absl::InternalError(
      absl::StrCat("cuBLAS ", what, ": ", c.ok() ? (*c)->status_string(s) : std::to_string(static_cast<int>(s))));
}

#define SNAPFILL_CUDA(expr, what) SNAPFILL_RETURN_IF_ERROR(CudaStatus((expr), (what)))

enum Op {
  kMatMul, kGetRows, kRmsNorm, kRope, kSwiGlu, kAttention, kWindowScores, kRecall, kSelect, kUpload, kCopy, kNumOps
};
constexpr const char* kOpNames[kNumOps] = {"matmul",    "get_rows",      "rms_norm", "rope",   "swiglu",       "attention",
                                           "window_scores", "recall", "select", "weight_upload", "copy"};

// Device memory the backend holds, counted as it allocates (the peak is the
// backend's own figure; cudaMemGetInfo's is the whole device's).
class DeviceMemory {
 public:
  absl::StatusOr<void*> Allocate(size_t bytes) {
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, std::max<size_t>(bytes, 1));
    if (e != cudaSuccess) {
      cudaGetLastError();  // (clears an allocation's error; an earlier kernel's fault stays)
      if (e != cudaErrorMemoryAllocation) {
        // Most likely a fault of a kernel queued earlier, which the first
        // call to look at the device after it reports: not a lack of memory.
        return absl::InternalError(absl::StrCat("CUDA: allocating ", bytes, " bytes of device memory failed: ",
                                                cudaGetErrorName(e), ": ", cudaGetErrorString(e),
                                                " (an earlier kernel's error, if it names no memory)"));
      }
      size_t free_bytes = 0, total = 0;
      cudaMemGetInfo(&free_bytes, &total);
      return absl::ResourceExhaustedError(absl::StrFormat(
          "CUDA: cannot allocate %.1f MiB of device memory (%.1f MiB free of %.1f MiB; the backend holds %.1f MiB)",
          bytes / kMiB, free_bytes / kMiB, total / kMiB, current_ / kMiB));
    }
    current_ += bytes;
    peak_ = std::max(peak_, current_);
    sizes_[static_cast<const char*>(p)] = bytes;
    return p;
  }
  // Whether p lies in one of these allocations (a device address the
  // backend made), rather than in host memory.
  bool Owns(const void* p) const {
    const auto* c = static_cast<const char*>(p);
    auto it = sizes_.upper_bound(c);
    if (it == sizes_.begin()) return false;
    --it;
    return c < it->first + it->second;
  }
  void Free(void* p) {
    if (p == nullptr) return;
    auto it = sizes_.find(static_cast<const char*>(p));
    if (it != sizes_.end()) {
      current_ -= it->second;
      sizes_.erase(it);
    }
    cudaFree(p);
  }
  uint64_t current() const { return current_; }
  uint64_t peak() const { return peak_; }
  // A measurement's own buffers (MeasurePeaks) are not the run's.
  void set_peak(uint64_t bytes) { peak_ = std::max(bytes, current_); }

 private:
  uint64_t current_ = 0;
  uint64_t peak_ = 0;
  std::map<const char*, size_t> sizes_;  // by address, for Owns
};

// A device buffer that grows (never shrinks) to the largest size asked of it.
class Scratch {
 public:
  explicit Scratch(DeviceMemory* memory) : memory_(memory) {}
  ~Scratch() { memory_->Free(data_); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  absl::StatusOr<void*> Get(size_t bytes) {
    if (bytes > bytes_) {
      // Kernels queued earlier may still read the old buffer. cudaFree
      // waits for them in practice, but its documentation does not say so:
      // waiting here costs nothing where the buffer rarely grows. (A
      // kernel's fault surfaces here, named, rather than in the free.)
      if (data_ != nullptr) SNAPFILL_CUDA(cudaDeviceSynchronize(), "waiting before a scratch buffer grows");
      memory_->Free(data_);
      data_ = nullptr;
      bytes_ = 0;
      // Some headroom, so that a chunk that grows by a few rows does not
      // reallocate every time.
      const size_t want = bytes + bytes / 8;
      SNAPFILL_ASSIGN_OR_RETURN(data_, memory_->Allocate(want));
      bytes_ = want;
    }
    return data_;
  }

 private:
  DeviceMemory* memory_;
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// A BackendBuffer in device memory. It shares the backend's DeviceMemory,
// so that a buffer freed after its backend still counts and frees rightly.
class DeviceBuffer final : public BackendBuffer {
 public:
  DeviceBuffer(std::shared_ptr<DeviceMemory> memory, void* data, uint64_t bytes, cudaStream_t stream)
      : memory_(std::move(memory)), data_(data), bytes_(bytes), stream_(stream) {}
  ~DeviceBuffer() override { memory_->Free(data_); }
  void* data() override { return bytes_ > 0 ? data_ : nullptr; }
  uint64_t bytes() const override { return bytes_; }
  void* host() override { return nullptr; }
  // One device allocation cannot give back a part: the bytes are zeroed,
  // as the contract asks, and stay held (the device's peak counts them).
  void ReleaseFrom(uint64_t offset) override {
    // (A failure here is reported by nothing else: cleared, so that the
    // next op does not report it as its own.)
    if (offset < bytes_ &&
        cudaMemsetAsync(static_cast<char*>(data_) + offset, 0, bytes_ - offset, stream_) != cudaSuccess) {
      (void)cudaGetLastError();
    }
  }

 private:
  std::shared_ptr<DeviceMemory> memory_;
  void* data_;
  uint64_t bytes_;
  cudaStream_t stream_;
};

// Page-locked host memory (Backend::NewHostBuffer): the device's copies
// into it run beside its kernels, where a copy into pageable memory would
// be staged and wait for the queue.
class PinnedBuffer final : public BackendBuffer {
 public:
  PinnedBuffer(void* data, uint64_t bytes) : data_(data), bytes_(bytes) {}
  ~PinnedBuffer() override { cudaFreeHost(data_); }
  void* data() override { return bytes_ > 0 ? data_ : nullptr; }
  uint64_t bytes() const override { return bytes_; }
  void* host() override { return data(); }
  void ReleaseFrom(uint64_t offset) override {
    if (offset < bytes_) std::memset(static_cast<char*>(data_) + offset, 0, bytes_ - offset);
  }

 private:
  void* data_;
  uint64_t bytes_;
};

class CudaBackend final : public Backend, public BackendProfile {
 public:
  CudaBackend(int device, const cudaDeviceProp& prop, bool exact, bool profile, int host_threads, bool host_buffers,
              bool f32_attention)
      : device_(device),
        prop_(prop),
        exact_(exact),
        profile_(profile),
        host_threads_(host_threads),
        host_buffers_(host_buffers),
        tensor_core_attention_(!exact && !f32_attention && prop.major >= 8) {
    for (auto& s : scratch_) s = std::make_unique<Scratch>(memory_.get());
  }
  ~CudaBackend() override {
    for (auto& [data, w] : weights_) memory_->Free(w.data);
    for (auto& [data, v] : vectors_) memory_->Free(v);
    for (auto& s : scratch_) s.reset();
    if (stream_ != nullptr) cudaStreamSynchronize(stream_);
    for (auto& [fence, e] : copy_events_) cudaEventDestroy(e);
    for (cudaEvent_t e : free_events_) cudaEventDestroy(e);
    if (cublas_ != nullptr) lib_->destroy(cublas_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  absl::Status Init() {
    SNAPFILL_CUDA(cudaSetDevice(device_), "cudaSetDevice");
    SNAPFILL_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    SNAPFILL_ASSIGN_OR_RETURN(lib_, LoadCublas());
    SNAPFILL_RETURN_IF_ERROR(CublasStatus(lib_->create(&cublas_), "create"));
    SNAPFILL_RETURN_IF_ERROR(CublasStatus(lib_->set_stream(cublas_, stream_), "set stream"));
    // The default math mode: no TF32 for f32 products (the exact backend
    // asks for CUBLAS_COMPUTE_32F_PEDANTIC besides), tensor cores for bf16.
    SNAPFILL_RETURN_IF_ERROR(CublasStatus(lib_->set_math_mode(cublas_, CUBLAS_DEFAULT_MATH), "math mode"));
    return absl::OkStatus();
  }

  Device device() const override { return Device::kCuda; }
  std::string thread_waits() const override {
    return "the host waits for the GPU's stream where an op writes host memory, and for downloads";
  }
  int num_threads() const override { return host_threads_; }

  // The host's f16 and int8-row conversions (the recall store's keys and
  // values, the stored entries it reads back): the CPU's vector kernels
  // (cpu::ToFp16, the scalar twin's bits;
  // cpu::ToInt8Rows) in pieces over the host threads, where the base class
  // converts one value at a time in software (a 7B layer's evicted rows,
  // 8.4M values, on Zen 3: 47-50 ms against 2.0 ms on two threads for f16;
  // bench/bm_recall_store's BM_RecallConvert).
  void ToHalf(const float* x, uint16_t* y, int64_t n) override {
    HostPieces(n, kHostPiece, [&](int64_t i, int64_t len) { cpu::ToFp16(x + i, y + i, len); });
  }
  void FromHalf(const uint16_t* x, float* y, int64_t n) override {
    HostPieces(n, kHostPiece, [&](int64_t i, int64_t len) { cpu::FromFp16(x + i, y + i, len); });
  }
  void ToInt8Rows(const float* x, uint8_t* y, int64_t rows, int64_t dim) override {
    HostPieces(rows, RowsPerPiece(dim),
               [&](int64_t r, int64_t len) { cpu::ToInt8Rows(x + r * dim, y + r * Int8RowBytes(dim), len, dim); });
  }
  void FromInt8Rows(const uint8_t* y, float* x, int64_t rows, int64_t dim) override {
    HostPieces(rows, RowsPerPiece(dim),
               [&](int64_t r, int64_t len) { cpu::FromInt8Rows(y + r * Int8RowBytes(dim), x + r * dim, len, dim); });
  }
  // On the device where both are its buffers (the same functions as the
  // host's twins, so the same bits), else on the host.
  absl::Status ToHalfInBuffers(const float* x, uint16_t* y, int64_t n) override {
    if (n < 0) return absl::InvalidArgumentError(absl::StrCat("to half: ", n, " values"));
    if (n == 0) return absl::OkStatus();
    return ConvertInBuffers(
        "to half", x, y, [&] { ToHalf(x, y, n); }, [&] { return cuda::ToFp16(x, y, n, stream_); });
  }
  absl::Status ToInt8RowsInBuffers(const float* x, uint8_t* y, int64_t rows, int64_t dim) override {
    if (rows < 0 || dim < 0) return absl::InvalidArgumentError(absl::StrCat("to int8: ", rows, " rows of ", dim));
    if (rows == 0) return absl::OkStatus();
    return ConvertInBuffers(
        "to int8", x, y, [&] { ToInt8Rows(x, y, rows, dim); },
        [&] { return cuda::ToInt8Rows(x, y, rows, dim, stream_); });
  }

  std::string kernels() const override {
    return absl::StrFormat(
        "cuda: %s (sm_%d%d, %.1f GiB): products cuBLAS %s, attention %s, top-k CUB radix sort; %s",
        prop_.name, prop_.major, prop_.minor, prop_.totalGlobalMem / (kMiB * 1024),
        exact_ ? "f32 (exact)" : "bf16 (weights converted once, f32 sums)",
        tensor_core_attention_ ? "bf16 tensor cores (flash, f32 softmax) from 16 queries, tiled f32 below"
                               : "tiled f32 (online softmax)",
        host_buffers_ ? "activations and KV in host memory, copied per op"
                      : "activations, candidates, the memory and the decoder's cache in device memory");
  }

  // ---- Products.

  absl::Status MatMul(const float* x, int64_t m, int64_t x_stride, const WeightView& w, float* y,
                      int64_t y_stride) override {
    const SharedOut out{&w, y, y_stride};
    return NormMatMulShared(x, m, x_stride, Norm{}, &out, 1);
  }

  absl::Status MatMulShared(const float* x, int64_t m, int64_t x_stride, const SharedOut* outs, int count) override {
    return NormMatMulShared(x, m, x_stride, Norm{}, outs, count);
  }

  bool FusesResidualAdd(const WeightView& w, int64_t m) const override { return cpu::MatMulSupports(w.type); }
  bool FusesLayer(const LayerProducts& w, int64_t m) const override {
    for (const WeightView* p : {w.wq, w.wk, w.wv, w.wo, w.gate, w.up, w.down}) {
      if (!cpu::MatMulSupports(p->type)) return false;
    }
    return true;
  }

  absl::Status NormMatMulShared(const float* x, int64_t m, int64_t x_stride, const Norm& norm, const SharedOut* outs,
                                int count) override {
    if (count <= 0 || m <= 0) return absl::OkStatus();
    Timer t(this, kMatMul);
    const int64_t k = outs[0].w->cols;
    for (int c = 0; c < count; ++c) {
      SNAPFILL_RETURN_IF_ERROR(CheckProduct("matmul", m, x_stride, *outs[c].w, outs[c].y_stride, k));
    }
    SNAPFILL_ASSIGN_OR_RETURN(float* xd, UploadRows(kX, x, m, k, x_stride));
    SNAPFILL_ASSIGN_OR_RETURN(const void* xin, ProductInput(xd, m, k, norm.weight, norm.eps));
    for (int c = 0; c < count; ++c) {
      const WeightView& w = *outs[c].w;
      SNAPFILL_ASSIGN_OR_RETURN(float* yd, Buffer<float>(kY, m * w.rows));
      SNAPFILL_RETURN_IF_ERROR(Gemm(xin, m, w, yd, w.rows, /*beta=*/0.0f));
      SNAPFILL_RETURN_IF_ERROR(DownloadRows(yd, m, w.rows, outs[c].y, outs[c].y_stride));
      CountMatMul(m, w);
    }
    bool on_device = true;
    for (int c = 0; c < count; ++c) on_device &= Owns(outs[c].y);
    return Finish("matmul", on_device);
  }

  absl::Status MatMulAdd(const float* x, int64_t m, int64_t x_stride, const WeightView& w, float* y,
                         int64_t y_stride) override {
    if (m <= 0) return absl::OkStatus();
    Timer t(this, kMatMul);
    SNAPFILL_RETURN_IF_ERROR(CheckProduct("matmul", m, x_stride, w, y_stride, w.cols));
    SNAPFILL_ASSIGN_OR_RETURN(float* xd, UploadRows(kX, x, m, w.cols, x_stride));
    SNAPFILL_ASSIGN_OR_RETURN(const void* xin, ProductInput(xd, m, w.cols, nullptr, 0.0f));
    SNAPFILL_ASSIGN_OR_RETURN(float* yd, UploadRows(kY, y, m, w.rows, y_stride));
    SNAPFILL_RETURN_IF_ERROR(Gemm(xin, m, w, yd, w.rows, /*beta=*/1.0f));
    SNAPFILL_RETURN_IF_ERROR(DownloadRows(yd, m, w.rows, y, y_stride));
    CountMatMul(m, w);
    return Finish("matmul", y);
  }

  absl::Status SwiGluMatMul(float* gate, const float* up, int64_t m, int64_t x_stride, const WeightView& w, float* y,
                            int64_t y_stride, bool add) override {
    if (m <= 0) return absl::OkStatus();
    Timer t(this, kMatMul);
    SNAPFILL_RETURN_IF_ERROR(CheckProduct("matmul", m, x_stride, w, y_stride, w.cols));
    SNAPFILL_ASSIGN_OR_RETURN(float* gd, UploadRows(kGate, gate, m, w.cols, x_stride));
    SNAPFILL_ASSIGN_OR_RETURN(float* ud, UploadRows(kUp, up, m, w.cols, x_stride));
    SNAPFILL_ASSIGN_OR_RETURN(const void* h, SwiGluInput(gd, ud, m, w.cols));
    float* yd = nullptr;
    if (add) {
      SNAPFILL_ASSIGN_OR_RETURN(yd, UploadRows(kY, y, m, w.rows, y_stride));
    } else {
      SNAPFILL_ASSIGN_OR_RETURN(yd, Buffer<float>(kY, m * w.rows));
    }
    SNAPFILL_RETURN_IF_ERROR(Gemm(h, m, w, yd, w.rows, add ? 1.0f : 0.0f));
    SNAPFILL_RETURN_IF_ERROR(DownloadRows(yd, m, w.rows, y, y_stride));
    CountMatMul(m, w);
    return Finish("matmul", y);
  }

  absl::Status FeedForward(const float* x, int64_t m, int64_t x_stride, const FeedForwardBlock& f, float* y,
                           int64_t y_stride, bool add) override {
    if (m <= 0) return absl::OkStatus();
    Timer t(this, kMatMul);
    const int64_t dim = f.gate->cols, ffn = f.gate->rows;
    SNAPFILL_RETURN_IF_ERROR(CheckProduct("feed-forward", m, x_stride, *f.gate, ffn, dim));
    SNAPFILL_RETURN_IF_ERROR(CheckProduct("feed-forward", m, x_stride, *f.up, ffn, dim));
    SNAPFILL_RETURN_IF_ERROR(CheckProduct("feed-forward", m, ffn, *f.down, y_stride, ffn));
    SNAPFILL_ASSIGN_OR_RETURN(float* xd, UploadRows(kX, x, m, dim, x_stride));
    SNAPFILL_ASSIGN_OR_RETURN(const void* xin, ProductInput(xd, m, dim, f.norm.weight, f.norm.eps));
    SNAPFILL_ASSIGN_OR_RETURN(float* gd, Buffer<float>(kGate, m * ffn));
    SNAPFILL_ASSIGN_OR_RETURN(float* ud, Buffer<float>(kUp, m * ffn));
    SNAPFILL_RETURN_IF_ERROR(Gemm(xin, m, *f.gate, gd, ffn, 0.0f));
    SNAPFILL_RETURN_IF_ERROR(Gemm(xin, m, *f.up, ud, ffn, 0.0f));
    SNAPFILL_ASSIGN_OR_RETURN(const void* h, SwiGluInput(gd, ud, m, ffn));
    // y += the block: x's rows are already here where y is x.
    float* yd = nullptr;
    if (add && y == x && y_stride == x_stride && f.down->rows == dim) {
      yd = xd;
    } else if (add) {
      SNAPFILL_ASSIGN_OR_RETURN(yd, UploadRows(kY, y, m, f.down->rows, y_stride));
    } else {
      SNAPFILL_ASSIGN_OR_RETURN(yd, Buffer<float>(kY, m * f.down->rows));
    }
    SNAPFILL_RETURN_IF_ERROR(Gemm(h, m, *f.down, yd, f.down->rows, add ? 1.0f : 0.0f));
    SNAPFILL_RETURN_IF_ERROR(DownloadRows(yd, m, f.down->rows, y, y_stride));
    CountMatMul(m, *f.gate);
    CountMatMul(m, *f.up);
    CountMatMul(m, *f.down);
    return Finish("feed-forward", y);
  }

  // ---- Element-wise ops.

  absl::Status GetRows(const WeightView& table, const int32_t* ids, int64_t n, float* out,
                       int64_t out_stride) override {
    Timer t(this, kGetRows);
    if (!cpu::MatMulSupports(table.type)) {
      return absl::InvalidArgumentError(absl::StrCat("get_rows: unsupported GGML type ", static_cast<int>(table.type)));
    }
    for (int64_t i = 0; i < n; ++i) {
      if (ids[i] < 0 || ids[i] >= table.rows) {
        return absl::InvalidArgumentError(absl::StrCat("get_rows: id ", ids[i], " outside [0, ", table.rows, ")"));
      }
    }
    // Into the backend's memory through a dense host copy.
    const bool device = Owns(out);
    float* rows = out;
    int64_t stride = out_stride;
    if (device) {
      host_rows_.resize(static_cast<size_t>(n * table.cols));
      rows = host_rows_.data();
      stride = table.cols;
    }
    for (int64_t i = 0; i < n; ++i) {
      cpu::DequantizeRow(table.type, static_cast<const char*>(table.data) + ids[i] * table.row_bytes,
                         rows + i * stride, table.cols);
    }
    if (!device || n <= 0) return absl::OkStatus();
    SNAPFILL_CUDA(cudaMemcpy2DAsync(out, out_stride * sizeof(float), rows, table.cols * sizeof(float),
                                    table.cols * sizeof(float), n, cudaMemcpyHostToDevice, stream_),
                  "get_rows");
    return Finish("get_rows", out);
  }

  // ---- The backend's memory.

  bool HostReachesBuffers() const override { return host_buffers_; }
  absl::StatusOr<std::unique_ptr<BackendBuffer>> NewBuffer(uint64_t bytes) override {
    if (host_buffers_) return Backend::NewBuffer(bytes);
    SNAPFILL_ASSIGN_OR_RETURN(void* data, memory_->Allocate(bytes));
    auto buffer = std::make_unique<DeviceBuffer>(memory_, data, bytes, stream_);
    SNAPFILL_CUDA(cudaMemsetAsync(data, 0, std::max<uint64_t>(bytes, 1), stream_), "new buffer");
    SNAPFILL_RETURN_IF_ERROR(Launched("new buffer"));
    return std::unique_ptr<BackendBuffer>(std::move(buffer));
  }
  absl::Status Download(const void* src, void* host, uint64_t bytes) override {
    if (bytes == 0) return absl::OkStatus();
    Timer t(this, kCopy);
    SNAPFILL_CUDA(cudaMemcpyAsync(host, src, bytes, cudaMemcpyDefault, stream_), "download");
    return Sync("download");
  }
  absl::Status Upload(const void* host, void* dst, uint64_t bytes) override {
    if (bytes == 0) return absl::OkStatus();
    Timer t(this, kCopy);
    SNAPFILL_CUDA(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyDefault, stream_), "upload");
    return Sync("upload");
  }

  absl::StatusOr<std::unique_ptr<BackendBuffer>> NewHostBuffer(uint64_t bytes) override {
    void* data = nullptr;
    SNAPFILL_CUDA(cudaHostAlloc(&data, std::max<uint64_t>(bytes, 1), cudaHostAllocDefault),
                  absl::StrCat("page-locked host memory of ", bytes, " bytes"));
    std::memset(data, 0, bytes);
    return std::unique_ptr<BackendBuffer>(new PinnedBuffer(data, bytes));
  }
  // The copy queued behind the stream's work, and an event after it: the
  // fence. (One stream: an event covers every copy queued before it.)
  absl::StatusOr<uint64_t> DownloadAsync(const void* src, void* host, uint64_t bytes) override {
    if (bytes == 0) return last_fence_;
    Timer t(this, kCopy);
    SNAPFILL_CUDA(cudaMemcpyAsync(host, src, bytes, cudaMemcpyDefault, stream_), "download");
    cudaEvent_t e = nullptr;
    if (free_events_.empty()) {
      SNAPFILL_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "download's event");
    } else {
      e = free_events_.back();
      free_events_.pop_back();
    }
    copy_events_.emplace_back(++last_fence_, e);
    SNAPFILL_CUDA(cudaEventRecord(e, stream_), "download's event");
    return last_fence_;
  }
  absl::Status WaitDownload(uint64_t fence) override {
    cudaEvent_t last = nullptr;  // the latest event at or before the fence
    while (!copy_events_.empty() && copy_events_.front().first <= fence) {
      if (last != nullptr) free_events_.push_back(last);
      last = copy_events_.front().second;
      copy_events_.pop_front();
    }
    if (last == nullptr) return absl::OkStatus();
    const cudaError_t waited = cudaEventSynchronize(last);
    free_events_.push_back(last);
    SNAPFILL_CUDA(waited, "download");
    return absl::OkStatus();
  }

  // Rows between the backend's memory and the host's in any direction.
  // Copies within the device (runs of rows, or rows by device indices)
  // are queued together, kGatherBatch to a launch (kernels/cuda/
  // gather_copy.h): the chunk loop copies each KV head's rows apart, and a
  // launch each cost more than most of them move. Rows to or from the host
  // go as one strided copy (runs) or gathered where their source is and
  // copied as one block (indexed); the queued batch is launched before
  // them, so the device's work keeps the list's order.
  absl::Status Gather(const std::vector<RowGather>& gathers) override {
    SNAPFILL_RETURN_IF_ERROR(CheckGathers(gathers));
    Timer t(this, kCopy);
    // The host's own gathers (positions, scores) run at once; they wait
    // for the stream only where a queued copy touches host memory, so
    // that a gather list that stays on the device (the chunk loop's, with
    // the memory there) waits once, at its end.
    bool queued = false;        // device work not yet waited for
    bool host_pending = false;  // ... some of it reading or writing host memory
    batch_.clear();
    auto launch_batch = [&]() -> absl::Status {
      if (batch_.empty()) return absl::OkStatus();
      SNAPFILL_CUDA(cuda::GatherRows(batch_.data(), static_cast<int>(batch_.size()), stream_), "gather");
      batch_.clear();
      return absl::OkStatus();
    };
    for (const RowGather& r : gathers) {
      if (r.count <= 0 || r.row_bytes == 0) continue;
      const bool src_device = Owns(r.src), dst_device = Owns(r.dst);
      // (Rows in the device's memory: the kept entries SelectHeads chose,
      // read where they are; they index device sources only.)
      const bool rows_device = Owns(r.rows);
      if (rows_device && !src_device) {
        return absl::InvalidArgumentError("gather: row indices in device memory need a device source");
      }
      if (!src_device && !dst_device) {
        if (host_pending) {
          SNAPFILL_RETURN_IF_ERROR(Sync("gather"));
          queued = host_pending = false;
        }
        GatherRows(r, 0, r.count);
        continue;
      }
      queued = true;
      if (src_device && dst_device && (r.rows == nullptr || rows_device)) {
        batch_.push_back({r.src, r.src_stride, r.rows, r.dst, r.dst_stride, r.count, r.row_bytes});
        continue;
      }
      SNAPFILL_RETURN_IF_ERROR(launch_batch());
      host_pending |= src_device != dst_device;
      if (r.rows == nullptr) {
        SNAPFILL_CUDA(cudaMemcpy2DAsync(r.dst, Pitch(r.dst_stride, r.row_bytes, r.count), r.src,
                                        Pitch(r.src_stride, r.row_bytes, r.count), r.row_bytes, r.count,
                                        cudaMemcpyDefault, stream_),
                      "gather");
      } else if (src_device) {
        const int32_t* rows = r.rows;
        if (!rows_device) {
          SNAPFILL_ASSIGN_OR_RETURN(int32_t* staged, Buffer<int32_t>(kRows, r.count));
          SNAPFILL_CUDA(cudaMemcpyAsync(staged, r.rows, r.count * sizeof(int32_t), cudaMemcpyDefault, stream_),
                        "gather");
          rows = staged;
        }
        if (dst_device) {
          const cuda::GatherCopy copy{r.src, r.src_stride, rows, r.dst, r.dst_stride, r.count, r.row_bytes};
          SNAPFILL_CUDA(cuda::GatherRows(&copy, 1, stream_), "gather");
        } else {
          SNAPFILL_ASSIGN_OR_RETURN(char* packed, Buffer<char>(kPacked, r.count * static_cast<int64_t>(r.row_bytes)));
          const cuda::GatherCopy copy{r.src, r.src_stride, rows, packed, r.row_bytes, r.count, r.row_bytes};
          SNAPFILL_CUDA(cuda::GatherRows(&copy, 1, stream_), "gather");
          SNAPFILL_CUDA(cudaMemcpy2DAsync(r.dst, Pitch(r.dst_stride, r.row_bytes, r.count), packed, r.row_bytes,
                                          r.row_bytes, r.count, cudaMemcpyDefault, stream_),
                        "gather");
        }
      } else {
        // Host rows into the device: packed on the host, copied at once.
        // (The copy is made before the next gather reuses the pack: a
        // stream sync precedes the packing.)
        SNAPFILL_RETURN_IF_ERROR(Sync("gather"));
        host_pack_.resize(static_cast<size_t>(r.count) * r.row_bytes);
        RowGather packed = r;
        packed.dst = host_pack_.data();
        packed.dst_stride = r.row_bytes;
        GatherRows(packed, 0, r.count);
        SNAPFILL_CUDA(cudaMemcpy2DAsync(r.dst, Pitch(r.dst_stride, r.row_bytes, r.count), host_pack_.data(),
                                        r.row_bytes, r.row_bytes, r.count, cudaMemcpyDefault, stream_),
                      "gather");
      }
    }
    SNAPFILL_RETURN_IF_ERROR(launch_batch());
    return queued ? Finish("gather", !host_pending) : absl::OkStatus();
  }

  // The forward pass's element-wise work, on the device where x is the
  // backend's (the operand copied in where it is not), else on the host.
  absl::Status Add(float* x, const float* y, int64_t n) override {
    if (n <= 0) return absl::OkStatus();
    if (!Owns(x) && Owns(y)) return absl::InvalidArgumentError("add: x on the host, y in the device's buffers");
    if (!Owns(x)) return Backend::Add(x, y, n);
    Timer t(this, kSwiGlu);  // (the element-wise row of the profile)
    const float* yd = y;
    if (!Owns(y)) {
      SNAPFILL_ASSIGN_OR_RETURN(float* staged, UploadRows(kUp, y, 1, n, n));
      yd = staged;
    }
    SNAPFILL_CUDA(cuda::AddInPlace(x, yd, n, stream_), "add");
    return Finish("add", x);
  }
  absl::Status AddRows(float* x, int64_t stride, const float* bias, int64_t rows, int64_t dim) override {
    if (rows <= 0 || dim <= 0) return absl::OkStatus();
    if (!Owns(x)) return Backend::AddRows(x, stride, bias, rows, dim);
    Timer t(this, kSwiGlu);
    SNAPFILL_ASSIGN_OR_RETURN(const float* bd, Vector(bias, dim));  // (a model's bias: uploaded once)
    SNAPFILL_CUDA(cuda::AddRows(x, stride, bd, rows, dim, stream_), "add_rows");
    return Finish("add_rows", x);
  }
  absl::Status Scale(float* x, int64_t n, float s) override {
    if (n <= 0) return absl::OkStatus();
    if (!Owns(x)) return Backend::Scale(x, n, s);
    Timer t(this, kSwiGlu);
    SNAPFILL_CUDA(cuda::Scale(x, n, s, stream_), "scale");
    return Finish("scale", x);
  }
  absl::Status Fill(float* x, int64_t n, float value) override {
    if (n <= 0) return absl::OkStatus();
    if (!Owns(x)) return Backend::Fill(x, n, value);
    Timer t(this, kSwiGlu);
    SNAPFILL_CUDA(cuda::Fill(x, n, value, stream_), "fill");
    return Finish("fill", x);
  }

  absl::Status RmsNorm(const float* x, int64_t x_stride, const float* weight, float* y, int64_t y_stride,
                       int64_t rows, int64_t dim, float eps) override {
    if (rows <= 0) return absl::OkStatus();
    Timer t(this, kRmsNorm);
    if (x_stride < dim || y_stride < dim) return absl::InvalidArgumentError("rms_norm: stride below dim");
    SNAPFILL_ASSIGN_OR_RETURN(float* xd, UploadRows(kX, x, rows, dim, x_stride));
    SNAPFILL_ASSIGN_OR_RETURN(const float* wd, Vector(weight, dim));
    SNAPFILL_CUDA(cuda::RmsNorm(xd, dim, wd, xd, dim, rows, dim, eps, stream_), "rms_norm");
    SNAPFILL_RETURN_IF_ERROR(DownloadRows(xd, rows, dim, y, y_stride));
    return Finish("rms_norm", y);
  }

  absl::Status Rope(float* x, int64_t num_tokens, int64_t num_heads, int64_t head_dim, int64_t token_stride,
                    const int32_t* pos, const RopeSpec& r) override {
    if (num_tokens <= 0 || num_heads <= 0) return absl::OkStatus();
    Timer t(this, kRope);
    if (r.rot_dim % 2 != 0 || r.rot_dim > head_dim || token_stride < num_heads * head_dim) {
      return absl::InvalidArgumentError(absl::StrCat("rope: bad shapes: rot_dim ", r.rot_dim, ", head_dim ", head_dim,
                                                     ", token stride ", token_stride));
    }
    const float* factors = nullptr;
    if (r.freq_factors != nullptr) {
      SNAPFILL_ASSIGN_OR_RETURN(factors, Vector(r.freq_factors, r.rot_dim / 2));
    }
    const int64_t width = num_heads * head_dim;
    // In place where x is the backend's memory (each pair is read and
    // written by one thread), else through scratch.
    const bool in_place = Owns(x);
    float* xd = x;
    if (!in_place) {
      SNAPFILL_ASSIGN_OR_RETURN(xd, UploadRows(kX, x, num_tokens, width, token_stride));
    }
    SNAPFILL_ASSIGN_OR_RETURN(int32_t* pd, Buffer<int32_t>(kPositions, num_tokens));
    SNAPFILL_CUDA(cudaMemcpyAsync(pd, pos, num_tokens * sizeof(int32_t), cudaMemcpyDefault, stream_), "rope positions");
    SNAPFILL_CUDA(cuda::Rope(xd, num_tokens, num_heads, head_dim, in_place ? token_stride : width, head_dim, pd, 0,
                             r.rot_dim, r.freq_base, r.freq_scale, r.neox, factors, stream_),
                  "rope");
    if (!in_place) SNAPFILL_RETURN_IF_ERROR(DownloadRows(xd, num_tokens, width, x, token_stride));
    return Finish("rope", x);
  }

  // The chunk loop's candidates: every KV head in one call (a call per
  // head costs a round trip each).
  absl::Status RopeHeads(float* x, int64_t num_heads, int64_t head_stride, int64_t num_tokens, int64_t head_dim,
                         const int32_t* pos, int64_t pos_stride, const RopeSpec& r) override {
    if (num_tokens <= 0 || num_heads <= 0) return absl::OkStatus();
    const int64_t span = num_tokens * head_dim;
    if (head_stride < span || pos_stride < 0) {
      return Backend::RopeHeads(x, num_heads, head_stride, num_tokens, head_dim, pos, pos_stride, r);
    }
    Timer t(this, kRope);
    if (r.rot_dim % 2 != 0 || r.rot_dim > head_dim) {
      return absl::InvalidArgumentError(absl::StrCat("rope: bad shapes: rot_dim ", r.rot_dim, ", head_dim ", head_dim));
    }
    const float* factors = nullptr;
    if (r.freq_factors != nullptr) {
      SNAPFILL_ASSIGN_OR_RETURN(factors, Vector(r.freq_factors, r.rot_dim / 2));
    }
    // In place where x is the backend's memory (the candidates), else
    // through scratch.
    const bool in_place = Owns(x);
    float* xd = x;
    if (!in_place) {
      SNAPFILL_ASSIGN_OR_RETURN(xd, UploadRows(kX, x, num_heads, span, head_stride));
    }
    const int64_t num_pos = pos_stride == 0 ? num_tokens : (num_heads - 1) * pos_stride + num_tokens;
    SNAPFILL_ASSIGN_OR_RETURN(int32_t* pd, Buffer<int32_t>(kPositions, num_pos));
    SNAPFILL_CUDA(cudaMemcpyAsync(pd, pos, num_pos * sizeof(int32_t), cudaMemcpyDefault, stream_), "rope positions");
    SNAPFILL_CUDA(cuda::Rope(xd, num_tokens, num_heads, head_dim, head_dim, in_place ? head_stride : span, pd,
                             pos_stride, r.rot_dim, r.freq_base, r.freq_scale, r.neox, factors, stream_),
                  "rope");
    if (!in_place) SNAPFILL_RETURN_IF_ERROR(DownloadRows(xd, num_heads, span, x, head_stride));
    return Finish("rope", x);
  }

  absl::Status GeluGlu(const float* gate, const float* up, float* out, int64_t n) override {
    if (n <= 0) return absl::OkStatus();
    Timer t(this, kSwiGlu);  // (the gated activation's row in the profile)
    SNAPFILL_ASSIGN_OR_RETURN(float* gd, UploadRows(kGate, gate, 1, n, n));
    SNAPFILL_ASSIGN_OR_RETURN(float* ud, UploadRows(kUp, up, 1, n, n));
    SNAPFILL_CUDA(cuda::GeluGlu(gd, ud, gd, n, stream_), "geluglu");
    SNAPFILL_RETURN_IF_ERROR(DownloadRows(gd, 1, n, out, n));
    return Finish("geluglu", out);
  }
  absl::Status SwiGlu(const float* gate, const float* up, float* out, int64_t n) override {
    if (n <= 0) return absl::OkStatus();
    Timer t(this, kSwiGlu);
    SNAPFILL_ASSIGN_OR_RETURN(float* gd, UploadRows(kGate, gate, 1, n, n));
    SNAPFILL_ASSIGN_OR_RETURN(float* ud, UploadRows(kUp, up, 1, n, n));
    SNAPFILL_CUDA(cuda::SwiGlu(gd, ud, gd, n, stream_), "swiglu");
    SNAPFILL_RETURN_IF_ERROR(DownloadRows(gd, 1, n, out, n));
    return Finish("swiglu", out);
  }

  // ---- The attention family.

  absl::Status Attention(const Queries& q, const KvView& kv, float* out, int64_t out_stride) override {
    if (q.count <= 0) return absl::OkStatus();
    Timer t(this, kAttention);
    SNAPFILL_RETURN_IF_ERROR(CheckDeviceQueries("attention", q, kv, /*causal=*/true));
    if (out_stride < q.num_heads * q.head_dim) return absl::InvalidArgumentError("attention: output stride too small");
    SNAPFILL_ASSIGN_OR_RETURN(Operands o, UploadAttention(q, kv, /*with_v=*/true));
    const int64_t width = q.num_heads * q.head_dim;
    // Into the output where it is the backend's memory and not the queries'
    // (which the kernels read while they write), else through scratch.
    const bool direct = Owns(out) && (out + q.count * out_stride <= o.q || o.q + q.count * o.shape.q_stride <= out);
    float* od = out;
    int64_t od_stride = out_stride;
    if (!direct) {
      SNAPFILL_ASSIGN_OR_RETURN(od, Buffer<float>(kOut, q.count * width));
      od_stride = width;
    }
    if (UsesTensorCoreAttention(q)) {
      const int64_t halves = static_cast<int64_t>(cuda::FlashAttentionScratchBytes(o.shape) / sizeof(uint16_t));
      SNAPFILL_ASSIGN_OR_RETURN(uint16_t* kv_bf16, Buffer<uint16_t>(kKvBf16, halves));
      SNAPFILL_CUDA(cuda::FlashAttention(o.q, o.k, o.v, o.shape, od, od_stride, kv_bf16, stream_), "attention");
    } else {
      SNAPFILL_CUDA(cuda::Attention(o.q, o.k, o.v, o.shape, od, od_stride, stream_), "attention");
    }
    if (!direct) SNAPFILL_RETURN_IF_ERROR(DownloadRows(od, q.count, width, out, out_stride));
    if (profile_) {
      // Visible (query, key) pairs: the causal triangle's (a window's band
      // counted as the triangle: profile figures only).
      const double pairs = q.count * (kv.num_keys - q.count) + q.count * (q.count + 1) / 2.0;
      ops_[kAttention] += 4.0 * q.head_dim * q.num_heads * pairs;
    }
    return Finish("attention", out);
  }

  // The chunk's attention on tensor cores (bf16 operands, f32 softmax)
  // unless the backend is exact; a few queries (decoding, a short last
  // chunk) would leave most of its 64-row blocks idle, so they take the f32
  // kernel.
  static constexpr int64_t kTensorCoreMinQueries = 16;
  bool UsesTensorCoreAttention(const Queries& q) const {
    return tensor_core_attention_ && q.count >= kTensorCoreMinQueries &&
           cuda::FlashAttentionSupports(q.head_dim, prop_.major, prop_.sharedMemPerBlockOptin);
  }

  absl::Status WindowScores(const Queries& q, const KvView& kv, float* votes, int64_t votes_stride) override {
    if (kv.num_keys <= 0) return absl::OkStatus();
    Timer t(this, kWindowScores);
    SNAPFILL_RETURN_IF_ERROR(CheckDeviceQueries("window_scores", q, kv, /*causal=*/true));
    if (votes_stride < kv.num_keys) return absl::InvalidArgumentError("window_scores: votes stride below the keys");
    SNAPFILL_ASSIGN_OR_RETURN(Operands o, UploadAttention(q, kv, /*with_v=*/false));
    SNAPFILL_ASSIGN_OR_RETURN(float* lse, Buffer<float>(kLse, std::max<int64_t>(1, q.num_heads * q.count)));
    SNAPFILL_ASSIGN_OR_RETURN(float* sd, Buffer<float>(kOut, q.num_kv_heads * kv.num_keys));
    if (q.count == 0) {
      SNAPFILL_CUDA(cudaMemsetAsync(sd, 0, q.num_kv_heads * kv.num_keys * sizeof(float), stream_), "window_scores");
    } else {
      // The window's scores as one product per KV head (cuBLAS, f32 sums:
      // the window's few dozen rows against every key), then the softmax
      // and the column sums.
      const int64_t rows = q.num_heads / q.num_kv_heads * q.count;  // the group's window rows
      SNAPFILL_ASSIGN_OR_RETURN(float* grouped, Buffer<float>(kGrouped, q.num_heads * q.count * q.head_dim));
      SNAPFILL_CUDA(cuda::GroupQueries(o.q, o.shape.q_stride, q.count, q.num_heads, q.num_kv_heads, q.head_dim, grouped,
                                       stream_),
                    "window_scores");
      SNAPFILL_ASSIGN_OR_RETURN(float* scores, Buffer<float>(kScores, q.num_kv_heads * rows * kv.num_keys));
      const float alpha = 1.0f, beta = 0.0f;
      // Column-major, as Gemm: scoresᵀ [keys × rows] = K [keys × d] · groupedᵀ.
      SNAPFILL_RETURN_IF_ERROR(CublasStatus(
          lib_->gemm_strided_batched_ex(
              cublas_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(kv.num_keys), static_cast<int>(rows),
              static_cast<int>(q.head_dim), &alpha, o.k, CUDA_R_32F, static_cast<int>(o.shape.key_stride),
              o.shape.head_stride, grouped, CUDA_R_32F, static_cast<int>(q.head_dim), rows * q.head_dim, &beta, scores,
              CUDA_R_32F, static_cast<int>(kv.num_keys), rows * kv.num_keys, static_cast<int>(q.num_kv_heads),
              exact_ ? CUBLAS_COMPUTE_32F_PEDANTIC : CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
          "window scores"));
      SNAPFILL_CUDA(cuda::VotesFromScores(scores, q.count, kv.num_keys, q.num_heads, q.num_kv_heads, q.scale, lse, sd,
                                          kv.num_keys, stream_),
                    "window_scores");
    }
    SNAPFILL_RETURN_IF_ERROR(DownloadRows(sd, q.num_kv_heads, kv.num_keys, votes, votes_stride));
    if (profile_) ops_[kWindowScores] += 2.0 * q.head_dim * q.num_heads * q.count * kv.num_keys;
    return Finish("window_scores", votes);
  }

  absl::Status QueryLogSumExp(const Queries& q, const KvView& kv, float* lse) override {
    if (q.count <= 0) return absl::OkStatus();
    Timer t(this, kRecall);
    SNAPFILL_RETURN_IF_ERROR(CheckDeviceQueries("query_lse", q, kv, /*causal=*/true));
    SNAPFILL_ASSIGN_OR_RETURN(Operands o, UploadAttention(q, kv, /*with_v=*/false));
    SNAPFILL_ASSIGN_OR_RETURN(float* ld, Buffer<float>(kLse, q.num_heads * q.count));
    SNAPFILL_CUDA(cuda::QueryLogSumExp(o.q, o.k, o.shape, ld, stream_), "query_lse");
    SNAPFILL_RETURN_IF_ERROR(DownloadRows(ld, 1, q.num_heads * q.count, lse, q.num_heads * q.count));
    return Finish("query_lse", lse);
  }

  absl::Status RecallScores(const Queries& q, const float* lse, const KvView& keys, float* scores,
                            int64_t scores_stride, bool max_weight) override {
    if (keys.num_keys <= 0) return absl::OkStatus();
    Timer t(this, kRecall);
    SNAPFILL_RETURN_IF_ERROR(CheckDeviceQueries("recall_scores", q, keys, /*causal=*/false));
    if (scores_stride < keys.num_keys) return absl::InvalidArgumentError("recall_scores: stride below the keys");
    SNAPFILL_ASSIGN_OR_RETURN(float* sd, Buffer<float>(kOut, q.num_kv_heads * keys.num_keys));
    if (q.count == 0) {
      SNAPFILL_CUDA(cudaMemsetAsync(sd, 0, q.num_kv_heads * keys.num_keys * sizeof(float), stream_), "recall_scores");
    } else {
      SNAPFILL_ASSIGN_OR_RETURN(Operands o, UploadAttention(q, keys, /*with_v=*/false));
      SNAPFILL_ASSIGN_OR_RETURN(float* ld, Buffer<float>(kLse, q.num_heads * q.count));
      SNAPFILL_CUDA(cudaMemcpyAsync(ld, lse, q.num_heads * q.count * sizeof(float), cudaMemcpyDefault, stream_),
                    "recall_scores");
      o.shape.num_keys = keys.num_keys;
      SNAPFILL_CUDA(cuda::KeyWeights(o.q, ld, o.k, o.shape, /*causal=*/false, sd, keys.num_keys, stream_, max_weight),
                    "recall_scores");
    }
    SNAPFILL_RETURN_IF_ERROR(DownloadRows(sd, q.num_kv_heads, keys.num_keys, scores, scores_stride));
    return Finish("recall_scores", scores);
  }

  // The candidates a selection left, where its kept indices are (the
  // chunk loop's: nothing waited for); host operands take the host's walk.
  absl::Status Complement(const int32_t* keep, int64_t keep_stride, int64_t kept, int64_t num_heads,
                          int64_t num_candidates, int32_t* out, int64_t out_stride) override {
    SNAPFILL_RETURN_IF_ERROR(CheckComplement(keep, keep_stride, kept, num_heads, num_candidates, out, out_stride));
    if (num_heads == 0 || num_candidates == kept) return absl::OkStatus();
    // (Nothing kept: the kept indices are never read, so the output says
    // where the op runs.)
    const bool out_device = Owns(out), keep_device = kept == 0 ? out_device : Owns(keep);
    if (!keep_device && !out_device) {
      return HostComplement(keep, keep_stride, kept, num_heads, num_candidates, out, out_stride);
    }
    if (!keep_device || !out_device) {
      return absl::InvalidArgumentError("complement: the kept indices and the output must both be the device's");
    }
    Timer t(this, kSelect);
    SNAPFILL_CUDA(cuda::Complement(keep, keep_stride, kept, num_heads, num_candidates, out, out_stride, stream_),
                  "complement");
    return Finish("complement", true);
  }

  // The gate pruner's scores where the keys are (the chunk loop's: every
  // operand the device's, nothing waited for); host operands are copied
  // in, a host result out, so that the scores are the device's arithmetic
  // wherever the operands are.
  absl::Status GateScores(const GateScoring& g) override {
    SNAPFILL_RETURN_IF_ERROR(CheckGateScoring(g));
    if (g.num_heads == 0 || g.n == 0) return absl::OkStatus();
    Timer t(this, kRecall);  // (the scores' row of the profile)
    const int64_t param_floats = GateParamFloats(g.head_dim, g.hidden);
    const float* pd = g.params;
    int64_t params_stride = g.params_stride;
    if (!Owns(pd)) {
      SNAPFILL_ASSIGN_OR_RETURN(pd, UploadRows(kGate, g.params, g.num_heads, param_floats, g.params_stride));
      params_stride = param_floats;
    }
    const float* kd = g.keys;
    int64_t keys_head_stride = g.keys_head_stride;
    if (!Owns(kd)) {
      const int64_t head_floats = (g.n - 1) * g.key_stride + g.head_dim;
      SNAPFILL_ASSIGN_OR_RETURN(kd, UploadRows(kK, g.keys, g.num_heads, head_floats, g.keys_head_stride));
      keys_head_stride = head_floats;
    }
    float* yd = g.y;
    int64_t y_stride = g.y_stride;
    if (!Owns(yd)) {
      SNAPFILL_ASSIGN_OR_RETURN(yd, Buffer<float>(kOut, g.num_heads * g.n));
      y_stride = g.n;
    }
    SNAPFILL_CUDA(cuda::GateScores(pd, params_stride, g.num_heads, g.head_dim, g.hidden, kd, keys_head_stride,
                                   g.key_stride, g.n, yd, y_stride, stream_),
                  "gate_scores");
    if (yd != g.y) SNAPFILL_RETURN_IF_ERROR(DownloadRows(yd, g.num_heads, g.n, g.y, g.y_stride));
    if (profile_) ops_[kRecall] += 2.0 * g.num_heads * g.n * g.hidden * g.head_dim;
    return Finish("gate_scores", g.y);
  }

  // ---- The selection.

  // One head's votes are a few thousand values in host memory, where a
  // round trip to the device costs more than the CPU's selection (and the
  // pruner runs the heads on ParallelFor's threads); from kDeviceSelectMin
  // values on (the recall tier's stores, very large memories) the device
  // pools and sorts, one call at a time.
  static constexpr int64_t kDeviceSelectMin = int64_t{1} << 16;

  absl::Status Pool1d(const float* in, float* out, int64_t n, int64_t kernel, PoolOp op) override {
    if (n < kDeviceSelectMin || kernel <= 1 || kernel % 2 == 0) return HostPool1d(in, out, n, kernel, op);
    std::lock_guard<std::mutex> lock(select_mutex_);
    Timer t(this, kSelect);
    SNAPFILL_ASSIGN_OR_RETURN(float* id, UploadRows(kX, in, 1, n, n));
    SNAPFILL_ASSIGN_OR_RETURN(float* od, Buffer<float>(kOut, n));
    SNAPFILL_CUDA(cuda::Pool1d(id, od, n, kernel, op == PoolOp::kMax, stream_), "pool1d");
    SNAPFILL_RETURN_IF_ERROR(DownloadRows(od, 1, n, out, n));
    return Finish("pool1d", out);
  }

  absl::Status TopK(const float* scores, int64_t n, int64_t k, int32_t* positions) override {
    if (n < kDeviceSelectMin || k <= 0 || k > n) return HostTopK(scores, n, k, positions);
    std::lock_guard<std::mutex> lock(select_mutex_);
    Timer t(this, kSelect);
    SNAPFILL_ASSIGN_OR_RETURN(float* sd, UploadRows(kX, scores, 1, n, n));
    SNAPFILL_ASSIGN_OR_RETURN(int32_t* order, Buffer<int32_t>(kOut, n));
    const size_t scratch_bytes = cuda::TopKScratchBytes(n);
    SNAPFILL_ASSIGN_OR_RETURN(void* scratch, scratch_[kSortScratch]->Get(scratch_bytes));
    SNAPFILL_CUDA(cuda::SortDescending(sd, n, order, scratch, scratch_bytes, stream_), "top_k");
    SNAPFILL_CUDA(cudaMemcpyAsync(positions, order, k * sizeof(int32_t), cudaMemcpyDefault, stream_), "top_k");
    SNAPFILL_RETURN_IF_ERROR(Sync("top_k"));
    std::sort(positions, positions + k);
    return absl::OkStatus();
  }

  // A layer's selection where its votes and its result are the device's
  // (the chunk loop's, DESIGN.md §14): one launch for every head, nothing
  // waited for. Host operands take the host's selection.
  absl::Status SelectHeads(const HeadSelection& s) override {
    SNAPFILL_RETURN_IF_ERROR(CheckHeadSelection(s));
    if (s.num_heads == 0) return absl::OkStatus();
    const bool reads_votes = s.window_begin > s.rest_begin;
    const bool reads_then = reads_votes && s.then_pick > 0;
    const bool keep_device = Owns(s.keep), votes_device = reads_votes && Owns(s.votes);
    const bool then_device = reads_then && Owns(s.then_votes);
    if (!keep_device && !votes_device && !then_device) return HostSelectHeads(s, *this);
    if (!keep_device || (reads_votes && !votes_device) || (reads_then && !then_device)) {
      return absl::InvalidArgumentError("select_heads: the votes and the kept indices must all be the device's");
    }
    std::lock_guard<std::mutex> lock(select_mutex_);
    Timer t(this, kSelect);
    const size_t bytes = cuda::SelectHeadsScratchBytes(s.num_heads, s.window_begin - s.rest_begin);
    // (The positions' slot: num_kv_heads × candidates words, as the RoPE
    // of the candidates, so the device's prediction holds it.)
    SNAPFILL_ASSIGN_OR_RETURN(char* scratch, Buffer<char>(kPositions, static_cast<int64_t>(bytes)));
    SNAPFILL_CUDA(cuda::SelectHeads(s.votes, s.votes_stride, s.num_heads, s.num_candidates, s.rest_begin,
                                    s.window_begin, s.pick, s.pool_kernel, s.pool == PoolOp::kMax, s.span, s.then_votes,
                                    s.then_votes_stride, s.then_pick, scratch, s.keep, s.keep_stride, stream_),
                  "select_heads");
    return Finish("select_heads", s.keep);
  }

  // ---- Device memory, predicted.

  // Each scratch slot grows to its largest operand, with 1/8 headroom
  // (Scratch::Get); these are the largest operands of a prefill's ops, slot
  // by slot, as the ops above ask for them. Left out: the device selection's
  // sort (from kDeviceSelectMin values: a recall store's blocks, memories
  // past 64K entries), and what is not the backend's own allocation (the
  // CUDA context, cuBLAS's workspace).
  uint64_t DeviceScratchBytes(const OpSizes& z) const override {
    const uint64_t e = exact_ ? sizeof(float) : sizeof(uint16_t);  // a product's input
    const uint64_t m = static_cast<uint64_t>(std::max<int64_t>(z.tokens, 1));
    const uint64_t qw = static_cast<uint64_t>(z.num_heads * z.head_dim);
    const uint64_t kvw = static_cast<uint64_t>(z.num_kv_heads * z.head_dim);
    const uint64_t dim = static_cast<uint64_t>(z.model_dim), ffn = static_cast<uint64_t>(z.ffn_dim);
    const uint64_t keys = static_cast<uint64_t>(std::max<int64_t>(z.keys, 1));
    const uint64_t wide = std::max({dim, qw, ffn});  // a product's input row, an element-wise op's
    const uint64_t slots[] = {
        4 * std::max(m * wide, keys * kvw),                                             // kX (and the candidates' RoPE)
        e * m * wide,                                                                   // kXin
        4 * std::max(m * std::max({qw, kvw, dim, ffn}),
                     static_cast<uint64_t>(z.logit_rows) * static_cast<uint64_t>(z.vocab)),  // kY
        4 * m * ffn,                                                                    // kGate
        4 * m * ffn,                                                                    // kUp
        e * m * ffn,                                                                    // kH
        4 * m * qw,                                                                     // kQ
        4 * keys * kvw,                                                                 // kK
        4 * keys * kvw,                                                                 // kV
        4 * std::max(m * qw, static_cast<uint64_t>(z.num_kv_heads) * keys),             // kOut
        4 * static_cast<uint64_t>(z.num_heads) * m,                                     // kLse
        4 * std::max(m, static_cast<uint64_t>(z.num_kv_heads) * keys),                  // kPositions
        // kStage, a piece of a weight: f32 rows for the bf16 conversion, or
        // Q8_0's blocks (34 bytes per 32 values) in either arithmetic.
        (exact_ ? 2 : 4) * std::min<uint64_t>(static_cast<uint64_t>(z.largest_matrix),
                                              std::max<uint64_t>(uint64_t{4} << 20, dim)),
        4 * keys,                                                                       // kRows
        4 * keys * static_cast<uint64_t>(z.head_dim),                                   // kPacked
        4 * static_cast<uint64_t>(z.voters) * qw,                                       // kGrouped
        4 * static_cast<uint64_t>(z.num_heads) * static_cast<uint64_t>(z.voters) * keys,  // kScores
        tensor_core_attention_ ? 2 * sizeof(uint16_t) * keys * kvw : 0,                 // kKvBf16: k, v in bf16
    };
    uint64_t total = 0;
    for (uint64_t b : slots) total += b + b / 8;
    return total;
  }
  // The ops' scratch, grown to the prefill's largest operands (a window's
  // scores over every key: GiBs at 1M keys), goes back before decoding.
  // (cudaFree waits for the kernels still reading it.)
  void ReleaseKernelScratch() override {
    for (auto& s : scratch_) s = std::make_unique<Scratch>(memory_.get());
  }
  uint64_t DeviceFreeBytes() const override {
    size_t free_bytes = 0, total_bytes = 0;
    if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) {
      (void)cudaGetLastError();
      return 0;
    }
    return free_bytes;
  }

  // ---- Weights on the device.

  // Every matrix the products support is read from its device copy, in
  // batches as in one-token steps.
  WeightCopy CopyOf(const WeightView& w, WeightUse use) const override {
    if (!cpu::MatMulSupports(w.type)) return {};
    return {.copied = true, .bytes = DeviceWeightBytes(w), .on_device = true};
  }
  bool MakeCopy(const WeightView& w, const std::function<void(const void*, size_t)>& copied) override {
    if (!Weight(w).ok()) return false;  // the product that needs it reports the error
    if (copied) copied(w.data, static_cast<size_t>(w.rows) * w.row_bytes);
    return true;
  }

  void ParallelFor(int64_t n, const std::function<void(int64_t)>& f) override {
#pragma omp parallel for schedule(dynamic, 1) num_threads(host_threads_)
    for (int64_t i = 0; i < n; ++i) f(i);
  }

  absl::Status Synchronize() override { return Sync("synchronize"); }

  // ---- BackendProfile.

  BackendProfile* profile() override { return this; }

  std::string Report() const override {
    std::string out = profile_ ? OpTableReport(kOpNames, seconds_, calls_, ops_, kNumOps) : "";
    size_t free_bytes = 0, total_bytes = 0;
    if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) (void)cudaGetLastError();
    absl::StrAppendFormat(&out, "device memory: %.1f MiB held by the backend (peak %.1f MiB), %.1f MiB in use on the "
                          "device of %.1f MiB\n",
                          memory_->current() / kMiB, memory_->peak() / kMiB, (total_bytes - free_bytes) / kMiB,
                          total_bytes / kMiB);
    return out;
  }
  std::vector<std::pair<std::string, double>> Seconds() const override {
    return profile_ ? OpTablePairs(kOpNames, seconds_, kNumOps) : std::vector<std::pair<std::string, double>>{};
  }
  std::vector<std::pair<std::string, double>> Ops() const override {
    return profile_ ? OpTablePairs(kOpNames, ops_, kNumOps) : std::vector<std::pair<std::string, double>>{};
  }
  double Int8MatMulOps() const override { return 0; }
  // The rate cuBLAS reaches here on a large product of the kind the
  // backend runs (bf16 operands with f32 sums, or f32 when exact): the peak
  // the products' and the attention's shares are reported against.
  Peaks MeasurePeaks() override {
    Peaks p;
    absl::StatusOr<double> rate = GemmPeak();
    if (!rate.ok()) return p;
    const Peak peak{exact_ ? "cublas-f32-gemm" : "cublas-bf16-gemm", *rate};
    p.f32 = peak;
    p.prefill_attention = peak;
    return p;
  }

  uint64_t DevicePeakBytes() const override { return memory_->peak(); }

  absl::StatusOr<double> GemmPeak() {
    constexpr int kN = 8192, kRuns = 5;
    const uint64_t peak_before = memory_->peak();
    const size_t elem = exact_ ? sizeof(float) : sizeof(uint16_t);
    const size_t in_bytes = size_t{kN} * kN * elem;
    SNAPFILL_ASSIGN_OR_RETURN(void* a, memory_->Allocate(in_bytes));
    absl::StatusOr<void*> b = memory_->Allocate(in_bytes);
    absl::StatusOr<void*> c = memory_->Allocate(size_t{kN} * kN * sizeof(float));
    absl::StatusOr<double> result = absl::InternalError("not measured");
    if (b.ok() && c.ok()) {
      // Random operands: on zeros the tensor cores toggle no bits and draw
      // less power, so the product runs faster than on real data (894
      // against 788 TFLOP/s on an H200). Uploaded as f32 through c, then
      // converted where the products take bf16.
      // (One random matrix, for both operands: what matters is that the
      // bits change.)
      absl::Status s;
      std::vector<float> host(size_t{kN} * kN);
      uint32_t state = 0x9e3779b9u;
      for (float& x : host) {
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        x = static_cast<float>(static_cast<int32_t>(state)) * (1.0f / 2147483648.0f);  // [-1, 1)
      }
      for (void* dst : {a, *b}) {
        void* f32 = exact_ ? dst : *c;
        if (s.ok()) {
          s = CudaStatus(cudaMemcpyAsync(f32, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice,
                                         stream_),
                         "peak");
        }
        if (s.ok() && !exact_) {
          s = CudaStatus(cuda::F32ToBf16(static_cast<const float*>(f32), static_cast<uint16_t*>(dst),
                                         static_cast<int64_t>(host.size()), stream_),
                         "peak");
        }
        if (s.ok()) s = Sync("peak");  // (c is read before it is written again)
      }
      const float alpha = 1.0f, beta = 0.0f;
      const cudaDataType in = exact_ ? CUDA_R_32F : CUDA_R_16BF;
      auto gemm = [&] {
        return lib_->gemm_ex(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, kN, kN, kN, &alpha, a, in, kN, *b, in, kN, &beta, *c,
                            CUDA_R_32F, kN, exact_ ? CUBLAS_COMPUTE_32F_PEDANTIC : CUBLAS_COMPUTE_32F,
                            CUBLAS_GEMM_DEFAULT);
      };
      if (s.ok()) s = CublasStatus(gemm(), "peak");  // warm-up
      cudaEvent_t start = nullptr, stop = nullptr;
      if (s.ok()) s = CudaStatus(cudaEventCreate(&start), "peak");
      if (s.ok()) s = CudaStatus(cudaEventCreate(&stop), "peak");
      if (s.ok()) s = CudaStatus(cudaEventRecord(start, stream_), "peak");
      for (int r = 0; r < kRuns && s.ok(); ++r) s = CublasStatus(gemm(), "peak");
      if (s.ok()) s = CudaStatus(cudaEventRecord(stop, stream_), "peak");
      if (s.ok()) s = CudaStatus(cudaEventSynchronize(stop), "peak");
      float ms = 0;
      if (s.ok()) s = CudaStatus(cudaEventElapsedTime(&ms, start, stop), "peak");
      if (start != nullptr) cudaEventDestroy(start);
      if (stop != nullptr) cudaEventDestroy(stop);
      if (s.ok() && ms > 0) result = 2.0 * kN * kN * double{kN} * kRuns / (ms * 1e-3);
    }
    if (c.ok()) memory_->Free(*c);
    if (b.ok()) memory_->Free(*b);
    memory_->Free(a);
    memory_->set_peak(peak_before);
    return result;
  }

 private:
  // The scratch buffers, by use.
  enum Slot {
    kX, kXin, kY, kGate, kUp, kH, kQ, kK, kV, kOut, kLse, kPositions, kSortScratch, kStage, kRows, kPacked, kGrouped,
    kScores, kKvBf16, kNumSlots
  };

  // f(first, length) over [0, n) in pieces of `piece`, over the host
  // threads where there are several pieces. kHostPiece values a piece is
  // small enough that cpu::ToFp16, FromFp16 and the int8 rows run it on
  // the calling thread.
  static constexpr int64_t kHostPiece = int64_t{1} << 16;
  template <typename F>
  void HostPieces(int64_t n, int64_t piece, F f) const {
    const int64_t pieces = (n + piece - 1) / piece;
#pragma omp parallel for schedule(static) num_threads(host_threads_) if (pieces > 1)
    for (int64_t p = 0; p < pieces; ++p) f(p * piece, std::min(piece, n - p * piece));
  }
  // Rows of `dim` a piece.
  static int64_t RowsPerPiece(int64_t dim) { return std::max<int64_t>(1, kHostPiece / std::max<int64_t>(dim, 1)); }

  // A conversion in the backend's buffers (ToHalfInBuffers,
  // ToInt8RowsInBuffers): `launch` where x and y are both the device's,
  // `host` where both are the host's; refused where they are split.
  template <typename Host, typename Launch>
  absl::Status ConvertInBuffers(const char* what, const void* x, const void* y, Host host, Launch launch) {
    const bool x_device = Owns(x), y_device = Owns(y);
    if (x_device != y_device) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": one operand in the device's memory, the other in the host's"));
    }
    if (!x_device) {
      host();
      return absl::OkStatus();
    }
    Timer t(this, kCopy);
    SNAPFILL_CUDA(launch(), what);
    return Finish(what, /*outputs_on_device=*/true);
  }

  // Whether p is in the backend's device memory (a buffer, or scratch).
  bool Owns(const void* p) const { return p != nullptr && memory_->Owns(p); }

  template <typename T>
  absl::StatusOr<T*> Buffer(Slot slot, int64_t n) {
    SNAPFILL_ASSIGN_OR_RETURN(void* p, scratch_[slot]->Get(static_cast<size_t>(std::max<int64_t>(n, 1)) * sizeof(T)));
    return static_cast<T*>(p);
  }

  // A 2-D copy's pitch: one row's stride may be anything the ops accept (0
  // for one head), but CUDA wants a pitch of at least the row's width.
  static int64_t Pitch(int64_t stride, int64_t width, int64_t rows) { return rows == 1 ? width : stride; }

  // rows × cols floats at `stride` (on the host or in the backend's
  // buffers) into a dense device buffer.
  absl::StatusOr<float*> UploadRows(Slot slot, const float* x, int64_t rows, int64_t cols, int64_t stride) {
    SNAPFILL_ASSIGN_OR_RETURN(float* d, Buffer<float>(slot, rows * cols));
    if (rows <= 0 || cols <= 0) return d;  // (a copy of nothing is not one CUDA takes)
    SNAPFILL_CUDA(cudaMemcpy2DAsync(d, cols * sizeof(float), x, Pitch(stride, cols, rows) * sizeof(float),
                                    cols * sizeof(float), rows, cudaMemcpyDefault, stream_),
                  "copy to device");
    return d;
  }
  absl::Status DownloadRows(const float* d, int64_t rows, int64_t cols, float* y, int64_t stride) {
    if (rows <= 0 || cols <= 0) return absl::OkStatus();
    SNAPFILL_CUDA(cudaMemcpy2DAsync(y, Pitch(stride, cols, rows) * sizeof(float), d, cols * sizeof(float),
                                    cols * sizeof(float), rows, cudaMemcpyDefault, stream_),
                  "copy from device");
    return absl::OkStatus();
  }

  absl::Status Sync(absl::string_view what) {
    SNAPFILL_CUDA(cudaStreamSynchronize(stream_), what);
    return absl::OkStatus();
  }
  // The end of an op. Where what it wrote is the backend's device memory,
  // the host does not wait: the stream orders whatever follows, and the
  // host reads results only through Download (which waits) or an op that
  // writes host memory (which waits here). Host operands were consumed
  // when their copies were queued (pageable memory is staged at once; the
  // engine's page-locked buffers are for DownloadAsync, whose fences it
  // waits for). So only the launch is checked; an error inside a
  // kernel surfaces at the next wait. Profiling waits, to time the op.
  absl::Status Launched(absl::string_view what) {
    SNAPFILL_CUDA(cudaGetLastError(), what);
    return absl::OkStatus();
  }
  absl::Status Finish(absl::string_view what, bool outputs_on_device) {
    return outputs_on_device && !profile_ ? Launched(what) : Sync(what);
  }
  absl::Status Finish(absl::string_view what, const void* output) { return Finish(what, Owns(output)); }

  static absl::Status CheckProduct(const char* op, int64_t m, int64_t x_stride, const WeightView& w,
                                   int64_t y_stride, int64_t k) {
    if (!cpu::MatMulSupports(w.type)) {
      return absl::InvalidArgumentError(absl::StrCat(op, ": unsupported GGML weight type ", static_cast<int>(w.type)));
    }
    if (w.cols != k || x_stride < k || y_stride < w.rows || w.data == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(op, ": bad shapes: x [", m, ", ", k, "] stride ", x_stride,
                                                     ", W [", w.rows, ", ", w.cols, "], y stride ", y_stride));
    }
    return absl::OkStatus();
  }

  // CheckQueries, and what the kernels need besides: heads of at most
  // cuda::kMaxHeadDim, f32 keys.
  static absl::Status CheckDeviceQueries(const char* op, const Queries& q, const KvView& kv, bool causal) {
    SNAPFILL_RETURN_IF_ERROR(CheckQueries(op, q, kv, causal));
    if (q.head_dim <= 0 || q.head_dim > cuda::kMaxHeadDim || (kv.num_keys > 0 && kv.k == nullptr)) {
      return absl::InvalidArgumentError(absl::StrCat(op, ": heads of ", q.head_dim, " (at most ", cuda::kMaxHeadDim,
                                                     " here) or no f32 keys"));
    }
    return absl::OkStatus();
  }

  // The attention family's operands on the device: the queries dense, and
  // each KV head's keys (and values) as the span from its first key to its
  // last, heads packed one after the other.
  struct Operands {
    const float* q = nullptr;
    const float* k = nullptr;
    const float* v = nullptr;
    cuda::AttentionShape shape;
  };
  absl::StatusOr<Operands> UploadAttention(const Queries& q, const KvView& kv, bool with_v) {
    Operands o;
    const int64_t width = q.num_heads * q.head_dim;
    // Operands already in the backend's memory (the forward pass's queries,
    // the chunk loop's candidates, a device cache) are read where they are,
    // strides and all: the kernels only read them.
    int64_t q_stride = width;
    if (Owns(q.q)) {
      o.q = q.q;
      q_stride = q.stride;
    } else {
      SNAPFILL_ASSIGN_OR_RETURN(float* qd, UploadRows(kQ, q.q, std::max<int64_t>(q.count, 0), width, q.stride));
      o.q = qd;
    }
    const int64_t span = kv.num_keys > 0 ? (kv.num_keys - 1) * kv.key_stride + q.head_dim : 0;
    int64_t head_stride = span;
    if (span > 0 && Owns(kv.k) && (!with_v || Owns(kv.v))) {
      o.k = kv.k;
      if (with_v) o.v = kv.v;
      head_stride = kv.head_stride;
    } else if (span > 0) {
      // Head-major (the KV cache): each head's span, packed. Heads
      // interleaved within a key (a token-major store): the whole region,
      // its strides kept.
      const bool packed = kv.head_stride >= span || q.num_kv_heads == 1;
      const int64_t rows = packed ? q.num_kv_heads : 1;
      const int64_t cols = packed ? span : (q.num_kv_heads - 1) * kv.head_stride + span;
      const int64_t pitch = packed ? std::max(kv.head_stride, span) : cols;
      if (!packed) head_stride = kv.head_stride;
      SNAPFILL_ASSIGN_OR_RETURN(float* kd, UploadRows(kK, kv.k, rows, cols, pitch));
      o.k = kd;
      if (with_v) {
        SNAPFILL_ASSIGN_OR_RETURN(float* vd, UploadRows(kV, kv.v, rows, cols, pitch));
        o.v = vd;
      }
    }
    o.shape = cuda::AttentionShape{q_stride,    head_stride,    kv.key_stride, q.count, kv.num_keys,
                                   q.num_heads, q.num_kv_heads, q.head_dim,     q.scale, q.window};
    return o;
  }

  // The products' input from x's dense rows on the device: RmsNorm'd with
  // `norm` where given, in the weights' type (bf16, or f32 when exact).
  absl::StatusOr<const void*> ProductInput(float* xd, int64_t m, int64_t k, const float* norm, float eps) {
    const float* nd = nullptr;
    if (norm != nullptr) {
      SNAPFILL_ASSIGN_OR_RETURN(nd, Vector(norm, k));
    }
    if (exact_) {
      if (nd == nullptr) return static_cast<const void*>(xd);
      SNAPFILL_ASSIGN_OR_RETURN(float* xn, Buffer<float>(kXin, m * k));
      SNAPFILL_CUDA(cuda::RmsNorm(xd, k, nd, xn, k, m, k, eps, stream_), "rms_norm");
      return static_cast<const void*>(xn);
    }
    SNAPFILL_ASSIGN_OR_RETURN(uint16_t* xb, Buffer<uint16_t>(kXin, m * k));
    if (nd != nullptr) {
      SNAPFILL_CUDA(cuda::RmsNormBf16(xd, k, nd, xb, m, k, eps, stream_), "rms_norm");
    } else {
      SNAPFILL_CUDA(cuda::ToBf16(xd, m, k, k, xb, stream_), "to bf16");
    }
    return static_cast<const void*>(xb);
  }

  absl::StatusOr<const void*> SwiGluInput(const float* gd, const float* ud, int64_t m, int64_t n) {
    if (exact_) {
      SNAPFILL_ASSIGN_OR_RETURN(float* h, Buffer<float>(kH, m * n));
      SNAPFILL_CUDA(cuda::SwiGluRows(gd, ud, m, n, n, h, stream_), "swiglu");
      return static_cast<const void*>(h);
    }
    SNAPFILL_ASSIGN_OR_RETURN(uint16_t* h, Buffer<uint16_t>(kH, m * n));
    SNAPFILL_CUDA(cuda::SwiGluRowsBf16(gd, ud, m, n, n, h, stream_), "swiglu");
    return static_cast<const void*>(h);
  }

  // yd[m, w.rows] (dense) = x · Wᵀ + beta · yd, x dense [m, w.cols] in the
  // weights' type. Row-major y = x·Wᵀ is column-major yᵀ = W·xᵀ: W's rows
  // are the columns of a k × n column-major matrix, hence op(A) = Aᵀ.
  absl::Status Gemm(const void* x, int64_t m, const WeightView& w, float* yd, int64_t ldy, float beta) {
    SNAPFILL_ASSIGN_OR_RETURN(const void* wd, Weight(w));
    const float alpha = 1.0f;
    const cudaDataType in = exact_ ? CUDA_R_32F : CUDA_R_16BF;
    return CublasStatus(lib_->gemm_ex(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(w.rows), static_cast<int>(m),
                                     static_cast<int>(w.cols), &alpha, wd, in, static_cast<int>(w.cols), x, in,
                                     static_cast<int>(w.cols), &beta, yd, CUDA_R_32F, static_cast<int>(ldy),
                                     exact_ ? CUBLAS_COMPUTE_32F_PEDANTIC : CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                        absl::StrCat("gemm ", m, "x", w.rows, "x", w.cols));
  }

  void CountMatMul(int64_t m, const WeightView& w) {
    if (profile_) ops_[kMatMul] += 2.0 * m * w.rows * w.cols;
  }

  uint64_t DeviceWeightBytes(const WeightView& w) const {
    if (!cpu::MatMulSupports(w.type)) return 0;
    return static_cast<uint64_t>(w.rows) * w.cols * (exact_ ? sizeof(float) : sizeof(uint16_t));
  }

  // A device copy and what it was made from. By address alone a matrix of
  // another model mapped where an earlier one was would find the old copy;
  // one of another type or shape is made again. (The same type and shape
  // at the same address is the caller's to avoid, as with the CPU backend's
  // copies: one backend per model.)
  struct DeviceWeight {
    void* data = nullptr;
    GgmlType type = GgmlType::kF32;
    int64_t rows = 0, cols = 0;
    size_t row_bytes = 0;
    bool Holds(const WeightView& w) const {
      return type == w.type && rows == w.rows && cols == w.cols && row_bytes == w.row_bytes;
    }
  };

  // The device copy of w, made on first use: its rows read (pread where the
  // file is known, so the mapping's pages stay out of memory), dequantized
  // to f32 on the host's cores, converted to bf16 on the device. Q8_0 rows
  // go over the bus as they are (a quarter of their f32 bytes) and are
  // dequantized on the device, to the same values.
  absl::StatusOr<const void*> Weight(const WeightView& w) {
    auto it = weights_.find(w.data);
    if (it != weights_.end()) {
      if (it->second.Holds(w)) return static_cast<const void*>(it->second.data);
      memory_->Free(it->second.data);
      weights_.erase(it);
    }
    Timer t(this, kUpload);
    const size_t elem = exact_ ? sizeof(float) : sizeof(uint16_t);
    SNAPFILL_ASSIGN_OR_RETURN(void* dst, memory_->Allocate(static_cast<size_t>(w.rows) * w.cols * elem));
    const DeviceWeight dw{dst, w.type, w.rows, w.cols, w.row_bytes};
    // Rows per piece: about 16 MiB of f32.
    const int64_t piece = std::max<int64_t>(1, (int64_t{4} << 20) / std::max<int64_t>(1, w.cols));
    std::vector<char> raw(static_cast<size_t>(std::min(piece, w.rows)) * w.row_bytes);
    // (Q8_0 is dequantized on the device: no f32 rows on the host.)
    std::vector<float> f32(w.type == GgmlType::kQ8_0 ? 0 : static_cast<size_t>(std::min(piece, w.rows)) * w.cols);
    absl::Status status;
    for (int64_t r0 = 0; r0 < w.rows && status.ok(); r0 += piece) {
      const int64_t rows = std::min(piece, w.rows - r0);
      const char* src = static_cast<const char*>(w.data) + r0 * w.row_bytes;
      if (w.fd >= 0) {
        const size_t want = static_cast<size_t>(rows) * w.row_bytes;
        size_t got = 0;
        while (got < want) {
          const ssize_t n = pread(w.fd, raw.data() + got, want - got, w.file_offset + r0 * w.row_bytes + got);
          if (n <= 0) {
            status = absl::DataLossError(absl::StrCat("CUDA weight upload: cannot read the model file: ",
                                                      n < 0 ? std::strerror(errno) : "unexpected end of file"));
            break;
          }
          got += static_cast<size_t>(n);
        }
        src = raw.data();
      }
      if (!status.ok()) break;
      char* out = static_cast<char*>(dst) + static_cast<size_t>(r0) * w.cols * elem;
      if (w.type == GgmlType::kQ8_0) {
        const size_t bytes = static_cast<size_t>(rows) * w.row_bytes;
        absl::StatusOr<char*> stage = Buffer<char>(kStage, static_cast<int64_t>(bytes));
        if (!stage.ok()) {
          status = stage.status();
          break;
        }
        // (The pageable source is staged before the copy returns, so the
        // next piece may overwrite it.)
        status = CudaStatus(cudaMemcpyAsync(*stage, src, bytes, cudaMemcpyHostToDevice, stream_), "weight upload");
        if (status.ok()) {
          status = CudaStatus(cuda::DequantizeQ8_0(*stage, rows, w.cols, static_cast<int64_t>(w.row_bytes),
                                                   exact_ ? nullptr : reinterpret_cast<uint16_t*>(out),
                                                   exact_ ? reinterpret_cast<float*>(out) : nullptr, stream_),
                              "weight upload");
        }
        if (status.ok()) status = Sync("weight upload");
        continue;
      }
#pragma omp parallel for num_threads(host_threads_)
      for (int64_t r = 0; r < rows; ++r) cpu::DequantizeRow(w.type, src + r * w.row_bytes, f32.data() + r * w.cols, w.cols);
      if (exact_) {
        // (On the backend's stream, which orders it before the products;
        // the pageable source is staged before the call returns.)
        status = CudaStatus(cudaMemcpyAsync(out, f32.data(), rows * w.cols * sizeof(float), cudaMemcpyHostToDevice,
                                            stream_),
                            "weight upload");
      } else {
        absl::StatusOr<float*> stage = Buffer<float>(kStage, rows * w.cols);
        if (!stage.ok()) {
          status = stage.status();
          break;
        }
        status = CudaStatus(cudaMemcpyAsync(*stage, f32.data(), rows * w.cols * sizeof(float), cudaMemcpyHostToDevice,
                                            stream_),
                            "weight upload");
        if (status.ok()) {
          status = CudaStatus(cuda::F32ToBf16(*stage, reinterpret_cast<uint16_t*>(out), rows * w.cols, stream_),
                              "weight upload");
        }
        if (status.ok()) status = Sync("weight upload");
      }
    }
    if (!status.ok()) {
      memory_->Free(dst);
      return status;
    }
    weights_.emplace(w.data, dw);
    return static_cast<const void*>(dst);
  }

  // A model's vector (a norm's weights, a bias, RoPE's factors) on the
  // device, uploaded once: by its address and length, so a longer vector
  // at an address seen before is not read past the copy. (The model's
  // vectors live as long as the backend's use of them.)
  absl::StatusOr<const float*> Vector(const float* v, int64_t n) {
    auto it = vectors_.find({v, n});
    if (it != vectors_.end()) return static_cast<const float*>(it->second);
    SNAPFILL_ASSIGN_OR_RETURN(void* d, memory_->Allocate(n * sizeof(float)));
    absl::Status s = CudaStatus(cudaMemcpyAsync(d, v, n * sizeof(float), cudaMemcpyDefault, stream_), "norm upload");
    if (!s.ok()) {
      memory_->Free(d);
      return s;
    }
    vectors_.emplace(std::make_pair(v, n), d);
    return static_cast<const float*>(d);
  }

  // Accumulates an op's wall time (synchronized at its end: every op ends
  // with Sync) when profiling; nested timers (the upload inside a product)
  // count once, in the outer op.
  class Timer {
   public:
    Timer(CudaBackend* b, Op op) : b_(b->profile_ ? b : nullptr), op_(op) {
      if (b_ == nullptr) return;
      outer_ = b_->timer_depth_++ == 0;
      if (outer_) ++b_->calls_[op];
    }
    ~Timer() {
      if (b_ == nullptr) return;
      --b_->timer_depth_;
      if (outer_) b_->seconds_[op_] += watch_.Seconds();
    }

   private:
    CudaBackend* b_;
    Op op_;
    bool outer_ = false;
    Stopwatch watch_;
  };

  int device_;
  cudaDeviceProp prop_;
  bool exact_;
  bool profile_;
  int host_threads_;
  bool host_buffers_;  // BackendOptions::host_buffers
  bool tensor_core_attention_;  // the chunk's attention on tensor cores (bf16, sm_80+, not --kernels attention=f32)
  cudaStream_t stream_ = nullptr;
  const Cublas* lib_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  std::shared_ptr<DeviceMemory> memory_ = std::make_shared<DeviceMemory>();
  std::unique_ptr<Scratch> scratch_[kNumSlots];
  std::unordered_map<const void*, DeviceWeight> weights_;
  std::map<std::pair<const void*, int64_t>, void*> vectors_;  // by address and length
  std::mutex select_mutex_;  // the device's selection, from ParallelFor's threads
  // DownloadAsync's events by fence, oldest first, and those free again.
  std::deque<std::pair<uint64_t, cudaEvent_t>> copy_events_;
  std::vector<cudaEvent_t> free_events_;
  uint64_t last_fence_ = 0;
  std::vector<float> host_rows_;   // GetRows' rows on their way to the device
  std::vector<char> host_pack_;    // Gather's host rows on their way to the device
  std::vector<cuda::GatherCopy> batch_;  // Gather's copies within the device, queued for one launch
  int timer_depth_ = 0;
  double seconds_[kNumOps] = {};
  int64_t calls_[kNumOps] = {};
  double ops_[kNumOps] = {};
};

absl::StatusOr<int> FindDevice(cudaDeviceProp* prop) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    cudaGetLastError();
    return absl::FailedPreconditionError(absl::StrCat(
        "no CUDA device: ", e != cudaSuccess ? cudaGetErrorString(e) : "the driver reports none",
        " (use --device cpu)"));
  }
  SNAPFILL_CUDA(cudaGetDeviceProperties(prop, 0), "cudaGetDeviceProperties");
  // The kernels are built for compute capability 8.0 and 9.0 (bf16 tensor
  // cores, cuBLAS's bf16 products): an older device would fail at its first
  // kernel.
  if (prop->major < 8) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "CUDA device %s has compute capability %d.%d; snapfill's CUDA kernels need 8.0 or later (use --device cpu)",
        prop->name, prop->major, prop->minor));
  }
  return 0;
}

}  // namespace

absl::StatusOr<std::string> DescribeCudaDevice() {
  cudaDeviceProp prop;
  SNAPFILL_ASSIGN_OR_RETURN(int device, FindDevice(&prop));
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  size_t free_bytes = 0, total = 0;
  if (cudaSetDevice(device) != cudaSuccess || cudaMemGetInfo(&free_bytes, &total) != cudaSuccess) {
    (void)cudaGetLastError();
  }
  return absl::StrFormat("%s, compute capability %d.%d, %d SMs, %.1f GiB (%.1f GiB free), driver CUDA %d.%d, runtime %d.%d",
                         prop.name, prop.major, prop.minor, prop.multiProcessorCount, total / (kMiB * 1024),
                         free_bytes / (kMiB * 1024), driver / 1000, driver % 1000 / 10, runtime / 1000,
                         runtime % 1000 / 10);
}

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const BackendOptions& options) {
  if (options.num_threads < 0) {
    return absl::InvalidArgumentError(absl::StrCat("threads must be >= 0, got ", options.num_threads));
  }
  cudaDeviceProp prop;
  SNAPFILL_ASSIGN_OR_RETURN(int device, FindDevice(&prop));
  const int threads = options.num_threads > 0 ? options.num_threads : omp_get_num_procs();
  // --kernels attention=f32: the chunk's attention on the f32 kernel, as
  // the exact backend's (the other names are the CPU's).
  if (!options.attention_kernel.empty() && options.attention_kernel != "auto" && options.attention_kernel != "f32" &&
      options.attention_kernel != "measure") {
    return absl::InvalidArgumentError(absl::StrCat("attention kernel \"", options.attention_kernel,
                                                   "\" is the CPU's: on cuda, auto (tensor cores) or f32"));
  }
  auto backend = std::make_unique<CudaBackend>(device, prop, options.exact_matmul, options.profile, threads,
                                               options.host_buffers, options.attention_kernel == "f32");
  SNAPFILL_RETURN_IF_ERROR(backend->Init());
  return std::unique_ptr<Backend>(std::move(backend));
}

}  // namespace snapfill
