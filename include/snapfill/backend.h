// The compute backend: coarse operations that the model's forward pass is
// written against (in the spirit of ggml's backend interface). One virtual
// call per op per layer; the inner loops live in kernels/ and stay
// non-virtual. Adapters check shapes and return InvalidArgument before any
// kernel runs; kernels themselves only DCHECK.
//
// Layouts (all f32 unless a WeightView says otherwise):
//   activations: [num_tokens, features], row stride in floats
//   multi-head:  [num_tokens, num_heads, head_dim], token stride in floats
//   KV cache:    head-major, K[kv_head][key][head_dim] (see kv_cache.h)
#ifndef SNAPFILL_BACKEND_H_
#define SNAPFILL_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "snapfill/dtype.h"

namespace snapfill {

enum class Device { kCpu, kCuda };

// A weight matrix W[rows, cols] stored row by row in a GGUF type; row r
// starts at data + r * row_bytes. Non-owning (points into the model file).
struct WeightView {
  const void* data = nullptr;
  GgmlType type = GgmlType::kF32;
  int64_t rows = 0;   // output features (n)
  int64_t cols = 0;   // input features (k), contiguous
  size_t row_bytes = 0;
  // Where the same bytes can be read with pread (fd >= 0): a backend that
  // copies the matrix (a decode layout, a device upload) reads them from
  // here, so the mapping's pages behind `data` never enter the resident set.
  int fd = -1;
  uint64_t file_offset = 0;
};

// The products a weight matrix takes part in: batches (prefill, more than
// one token) or one-token steps (decode).
enum class WeightUse { kBatch, kDecode };

// Whether a backend reads a weight matrix through a copy of its own for one
// use, and what that copy holds (Backend::CopyOf).
struct WeightCopy {
  bool copied = false;  // false: the products read the matrix's own bytes
  uint64_t bytes = 0;   // the copy's size
  bool on_device = false;  // held in the device's memory, not the host's
};

// One implementation's measured rate, and an op's (the CPU backend's ops
// with more than one implementation: "prefill attention", "products").
struct KernelRate {
  std::string name;  // as Backend::kernels() names it
  double gops = 0;
};
struct KernelRates {
  std::string op;
  std::vector<KernelRate> rates;  // the reference (or the CPU flags' choice) first
};

// The largest operands a prefill hands the backend's ops
// (PrefillFootprint::ops), for a device's prediction of the scratch its ops
// keep (Backend::DeviceScratchBytes).
struct OpSizes {
  int64_t tokens = 0;  // rows of a forward batch: the largest chunk and the question's rows
  int64_t model_dim = 0;
  int64_t ffn_dim = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t keys = 0;        // the most keys one attention sees (the candidates' capacity)
  int64_t voters = 0;      // the most queries that vote at once (the window, the question's rows)
  int64_t logit_rows = 0;  // the most rows of logits one product makes
  int64_t vocab = 0;
  int64_t largest_matrix = 0;  // elements of the largest weight matrix
};

struct BackendOptions {
  int num_threads = 0;  // 0: all cores
  // Multiply with weights dequantized to f32 and f32 activations, instead
  // of quantizing activations to 8 bits as ggml does: slower, and free of
  // the activation-rounding noise (used to check the forward pass against
  // exact references). Keeps an f32 copy of each weight matrix it meets.
  // Attention stays in f32 as well (no bf16 tiles).
  bool exact_matmul = false;
  // Time every operation (wall clock, per op kind); see BackendProfile.
  bool profile = false;
  // One-token products (decode) read every weight byte once, so they run at
  // the speed the weights stream from memory. With this on, the CPU backend
  // rewrites each Q4_0 / Q4_1 / Q5_0 / Q8_0 matrix the second time it multiplies one
  // token by it (a single product, such as a prefill's last logits, does not
  // pay for a copy), into a layout that keeps up with that stream
  // (kernels/quant_blocks.h), and keeps the copy (same arithmetic).
  // LlamaForward asks for every copy when decoding starts (PrepareWeights)
  // and gives the model file's pages back as they are copied, so the copy
  // takes their place in memory.
  bool pack_decode_weights = true;
  // Decode attention reads an IEEE fp16 copy of the KV cache (the layout
  // llama.cpp's default f16 cache has) instead of the f32 entries: half the
  // bytes a decode step streams for attention, the products and sums still
  // in f32. The copy is made when decoding starts (LlamaForward asks with
  // KvCache::SyncHalf) and grows with each decoded token; it replaces the
  // f32 entries (their pages go back to the system; a later batch widens
  // them back, rounded to fp16), so decoding holds 2 bytes per element
  // instead of 4. Off with exact_matmul. Off here (the library computes
  // in f32 unless asked); the CLI's --decode_kv_f16 turns it on by default:
  // about 10% faster decode over a compressed cache of 1,155 entries, 25-50%
  // over a full 8K cache (docs/history/BENCHMARKS-log.md).
  bool half_decode_kv = false;
  // For tests: the CPU backend's buffers (NewBuffer) can be read and
  // written only while one of its ops runs, and fault otherwise, as a
  // device's memory would be out of the host's reach: code that touches
  // them other than through the backend fails at once.
  bool guard_buffers = false;
  // For tests: the CUDA backend's buffers in host memory, copied in and out
  // by each op as before they lived on the device, to check that the
  // device-resident buffers compute the same bits.
  bool host_buffers = false;

  // The CPU kernels' choices. They hold for the whole process: the first
  // backend that names one fixes it, and a later backend may leave it (the
  // defaults below) or name the same; another one is refused with
  // FailedPrecondition. Nothing in the library reads the environment: the
  // snapfill command reads SNAPFILL_CPU, SNAPFILL_AMX and OMP_WAIT_POLICY
  // into these (tools/cli/environment.h).
  //
  // The highest x86-64 level whose kernels run: "generic", "avx2",
  // "avxvnni" or "avx512"; "" leaves it (the CPU's highest unless chosen).
  std::string kernel_level;
  // AMX: kAll uses AMX-BF16 and AMX-INT8 where the CPU has them, kInt8Only
  // keeps the AMX-INT8 products and no AMX-BF16, kOff none.
  enum class Amx { kUnset, kAll, kInt8Only, kOff };
  Amx amx = Amx::kUnset;
  // How the kernels' threads wait between regions: spin a while then sleep
  // (kSpin), or sleep at once (kPassive; for a machine shared with others).
  enum class Waits { kUnset, kSpin, kPassive };
  Waits thread_waits = Waits::kUnset;
  // The prefill attention's implementation: "" leaves it (at first, by the
  // CPU's flags: AMX-BF16, else AVX512-BF16, else f32; what the tests
  // assume); "measure": the fastest of those this CPU runs on
  // attention_shape's heads, timed when the backend is made (about 0.1 s,
  // once per process and shape; on some CPUs the bf16 dot products run at
  // half the f32 FMA's rate); or one by name, "f32",
  // "avx512-bf16", "amx-bf16" (InvalidArgument where this CPU does not run
  // it), or "auto" (by the flags). Unlike the choices above it may change
  // between backends: it decides how each later chunk is computed, and the
  // backend's kernels() names it, so a checkpoint records it and a resume
  // can ask for it again.
  std::string attention_kernel;
  // The token blocks' products, as the attention: "" leaves them (at first,
  // by the CPU's flags: AMX-BF16, else AMX-INT8, else AVX-512 VNNI, else
  // AVX2); "measure": the fastest of the paths this CPU runs, timed on
  // product_shape (the flags' choice unless another is more than 10%
  // faster); or a path by name, "amx-bf16", "amx-int8", "avx512-vnni",
  // "avx-vnni" or "avx2" (InvalidArgument where this CPU does not run it).
  // The paths round alike only up to the f32 order of sums (AMX-BF16 rounds
  // to bf16), so kernels() names the one taken.
  std::string products_kernel;
  // The product "measure" times: the model's feed-forward gate (most of a
  // prefill's work); by default SmolLM2-135M's.
  struct ProductShape {
    GgmlType type = GgmlType::kQ4_1;
    int64_t k = 576;   // columns
    int64_t n = 1536;  // rows
  };
  ProductShape product_shape;
  // The heads the attention's "measure" times a chunk of: the model's (the
  // kernels' speed differs with head_dim: the bf16 ones' S and P·V loops
  // run over it, their per-key work does not); by default SmolLM2-135M's.
  struct AttentionShape {
    int64_t num_heads = 9;
    int64_t num_kv_heads = 3;
    int64_t head_dim = 64;
  };
  AttentionShape attention_shape;
  // Rates timed before (a file that keeps them, tools/cli/kernel_cache.h):
  // "measure" takes an op's rates from here where they name one this CPU
  // runs, instead of timing them again.
  std::vector<KernelRates> kernel_rates;
};

// A read-only view of one layer's KV: K/V element (h, j, d) at
// k[h * head_stride + j * key_stride + d].
struct KvView {
  const float* k = nullptr;
  const float* v = nullptr;
  // The same entries as fp16 (the decode copy, same strides), or null.
  const uint16_t* k16 = nullptr;
  const uint16_t* v16 = nullptr;
  int64_t head_stride = 0;
  int64_t key_stride = 0;
  int64_t num_keys = 0;
};

// What a backend measures of itself, apart from its compute ops: the time
// and work of each op kind (with BackendOptions::profile) and the peak rates
// of the instructions its kernels run on here. For --profile, `snapfill
// bench` and `snapfill info` (tools/cli/roofline.h).
class BackendProfile {
 public:
  virtual ~BackendProfile() = default;
  // With BackendOptions::profile: a table of seconds and calls per op kind
  // since the backend was made; "" otherwise.
  virtual std::string Report() const = 0;
  // The same as (op name, seconds) pairs, in a fixed order; empty without
  // profiling. `snapfill bench` reads the attention share r from it.
  virtual std::vector<std::pair<std::string, double>> Seconds() const = 0;
  // With profiling, the work each op kind did since the backend was made,
  // in ops (a multiply-add counts 2), as (op name, ops) in Seconds' order:
  // matmul 2·m·n·k per product; attention 4·head_dim·num_heads per (query,
  // visible key) pair (q·k and p·v); window_scores 2·head_dim·num_heads per
  // pair (q·k); 0 for the element-wise ops. Empty without profiling.
  virtual std::vector<std::pair<std::string, double>> Ops() const = 0;
  // Of matmul's ops, those of products that ran on int8 dots (weight types
  // that quantize their activations, in the default arithmetic).
  virtual double Int8MatMulOps() const = 0;

  // The peak rate of an instruction this backend's kernels run on, measured
  // here on its threads; instruction "" and rate 0 where it measures none.
  struct Peak {
    std::string instruction;
    double ops_per_second = 0;
  };
  struct Peaks {
    int threads = 0;
    Peak int8_products;      // the products of quantized types (int8 dots)
    Peak f32;                // f32 FMA: the float types' products, decode attention, the votes
    Peak prefill_attention;  // the attention of a chunk (f32 FMA, or bf16 dots)
  };
  // Measures them now (about 0.1 s each). None on AMX tiles or the
  // portable kernels.
  virtual Peaks MeasurePeaks() = 0;
};

// The queries of an attention-family op and the heads' shape: `count` rows
// of [num_heads, head_dim] floats, `stride` floats apart, grouped over
// num_kv_heads KV heads (num_heads a multiple of it); scores scaled by
// `scale`.
struct Queries {
  const float* q = nullptr;
  int64_t stride = 0;
  int64_t count = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  float scale = 0.0f;
  // > 0: a sliding window (a local layer's): Attention's query i sees only
  // the last `window` of the keys it would see, num_keys - count + i and
  // the window - 1 before it. Read by Attention only.
  int64_t window = 0;
  // The same queries from row `first` on.
  Queries From(int64_t first) const {
    Queries rest = *this;
    rest.q += first * stride;
    rest.count -= first;
    return rest;
  }
};

// How positions turn into rotations (ggml's rope_ext without YaRN): pair i
// of a head's first rot_dim dimensions turns by
// freq_scale * (pos * freq_base^(-2i / rot_dim) / freq_factors[i])
// (freq_factors: rot_dim / 2 values, Llama 3.1's rope_freqs tensor; null:
// 1). neox: the pairs are (i, i + rot_dim / 2), else (2i, 2i + 1).
struct RopeSpec {
  int64_t rot_dim = 0;
  float freq_base = 10000.0f;
  float freq_scale = 1.0f;
  bool neox = false;
  const float* freq_factors = nullptr;
};

// Memory that a backend's ops read and write: the host's on the CPU, the
// device's where a backend computes on one (there the host reaches it only
// through Backend::Download and Upload, or through ops). The forward pass
// keeps its activations in these (LlamaForward), so that they can stay
// where the backend computes. Made by Backend::NewBuffer; zeros at first.
class BackendBuffer {
 public:
  virtual ~BackendBuffer() = default;
  // The buffer's address for the backend's ops (a device address on a
  // device), or null for an empty buffer.
  virtual void* data() = 0;
  float* f32() { return static_cast<float*>(data()); }
  virtual uint64_t bytes() const = 0;
  // The same bytes' host address where the host may read and write them
  // in place (the CPU backend's buffers), else null: then only
  // Download/Upload and the ops reach them.
  virtual void* host() = 0;
  // The bytes from `offset` on go back (zeros when next read): the pages
  // a smaller batch no longer writes leave the resident set.
  virtual void ReleaseFrom(uint64_t offset) = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;
  virtual int num_threads() const = 0;
  // Returns which kernels this backend runs on this machine, in words (the
  // CPU backend: the x86-64 level picked at run time and the paths of the
  // products and the attention), for `snapfill info` and the benchmarks.
  virtual std::string kernels() const { return ""; }
  // What the backend timed to choose its kernels (the CPU backend: each
  // prefill attention's and product path's rate, where it measured them or
  // was given them), in words; "" where
  // it timed nothing. Apart from kernels(), which checkpoints and caches
  // record: a record must not change with timing noise.
  virtual std::string kernel_timings() const { return ""; }

  // y[m, w.rows] = x[m, w.cols] · Wᵀ.
  virtual absl::Status MatMul(const float* x, int64_t m, int64_t x_stride, const WeightView& w,
                              float* y, int64_t y_stride) = 0;
  // One of the products of MatMulShared: y[m, w->rows] = x · Wᵀ.
  struct SharedOut {
    const WeightView* w;
    float* y;
    int64_t y_stride;
  };
  // The products of one x with `count` weights of the same cols (Q, K and V;
  // gate and up): the same results as MatMul on each, in order; a backend
  // may share work between them (the CPU backend quantizes x once when the
  // weights have one type).
  virtual absl::Status MatMulShared(const float* x, int64_t m, int64_t x_stride, const SharedOut* outs,
                                    int count) {
    for (int c = 0; c < count; ++c) {
      absl::Status s = MatMul(x, m, x_stride, *outs[c].w, outs[c].y, outs[c].y_stride);
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }
  // f(i) for every i in [0, n), on the threads this backend runs its own
  // parallel work on, where it has any (the CPU backend: its kernels'
  // spinning team); returns when all are done. For the engine's loops that
  // run between the backend's operations (gathering and copying KV rows).
  // This default runs them in order on the calling thread.
  virtual void ParallelFor(int64_t n, const std::function<void(int64_t)>& f) {
    for (int64_t i = 0; i < n; ++i) f(i);
  }
  // out[i, :] = dequantized row ids[i] of `table` (embedding lookup).
  virtual absl::Status GetRows(const WeightView& table, const int32_t* ids, int64_t n, float* out,
                               int64_t out_stride) = 0;
  // y = x / rms(x) * weight, row by row.
  virtual absl::Status RmsNorm(const float* x, int64_t x_stride, const float* weight, float* y,
                               int64_t y_stride, int64_t rows, int64_t dim, float eps) = 0;
  // Rotary embedding in place over [num_tokens, num_heads, head_dim] (the
  // rotation RopeSpec describes).
  virtual absl::Status Rope(float* x, int64_t num_tokens, int64_t num_heads, int64_t head_dim,
                            int64_t token_stride, const int32_t* pos, const RopeSpec& rope) = 0;
  // Rope of num_heads separate runs of num_tokens rows of head_dim floats
  // (one head each, as the chunk loop keeps its candidates: head h's token
  // t at x + h * head_stride + t * head_dim), head h's positions at
  // pos + h * pos_stride (pos_stride 0: the same for every head). The same
  // results as Rope(x + h * head_stride, num_tokens, 1, head_dim, head_dim,
  // pos + h * pos_stride, rope) for each head, which is what this default
  // does; a backend may do them in one call.
  virtual absl::Status RopeHeads(float* x, int64_t num_heads, int64_t head_stride, int64_t num_tokens,
                                 int64_t head_dim, const int32_t* pos, int64_t pos_stride, const RopeSpec& rope) {
    for (int64_t h = 0; h < num_heads; ++h) {
      absl::Status s = Rope(x + h * head_stride, num_tokens, 1, head_dim, head_dim, pos + h * pos_stride, rope);
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }
  // out = silu(gate) * up, element-wise over n values.
  virtual absl::Status SwiGlu(const float* gate, const float* up, float* out, int64_t n) = 0;
  // out = gelu(gate) * up (GELU's tanh form: Gemma's GeGLU), element-wise.
  virtual absl::Status GeluGlu(const float* gate, const float* up, float* out, int64_t n) = 0;
  // Whether this backend adds a product into y itself for this weight and a
  // batch of m rows (MatMulAdd, SwiGluMatMul with add): the residual adds
  // after the attention output and the feed-forward block, fused into the
  // products' stores. Callers add separately where it says no.
  virtual bool FusesResidualAdd(const WeightView& w, int64_t m) const {
    (void)w;
    (void)m;
    return false;
  }
  // y[m, w.rows] += x · Wᵀ, in f32 per output: the same results as MatMul into
  // a temporary and then y + t. Only where FusesResidualAdd(w, m).
  virtual absl::Status MatMulAdd(const float* x, int64_t m, int64_t x_stride, const WeightView& w, float* y,
                                 int64_t y_stride) {
    (void)x, (void)x_stride, (void)y, (void)y_stride;
    return absl::UnimplementedError(
        absl::StrCat("MatMulAdd: this backend does not fuse the residual add (", w.rows, " rows, m = ", m, ")"));
  }
  // The feed-forward block's end: y[m, w.rows] = (silu(gate) ⊙ up) · Wᵀ, with
  // gate and up [m, w.cols] at row stride x_stride; with `add`, y += it
  // instead (only where FusesResidualAdd(w, m)). gate's contents are
  // unspecified afterwards (here it holds silu(gate) ⊙ up; a backend may
  // fuse the two steps and leave it as it was). The same results as SwiGlu
  // then MatMul (then the add).
  virtual absl::Status SwiGluMatMul(float* gate, const float* up, int64_t m, int64_t x_stride,
                                    const WeightView& w, float* y, int64_t y_stride, bool add) {
    if (x_stride == w.cols) {
      absl::Status s = SwiGlu(gate, up, gate, m * x_stride);
      if (!s.ok()) return s;
    } else {
      for (int64_t i = 0; i < m; ++i) {
        absl::Status s = SwiGlu(gate + i * x_stride, up + i * x_stride, gate + i * x_stride, w.cols);
        if (!s.ok()) return s;
      }
    }
    // (MatMulAdd refuses unless a backend overrides it with FusesResidualAdd.)
    return add ? MatMulAdd(gate, m, x_stride, w, y, y_stride) : MatMul(gate, m, x_stride, w, y, y_stride);
  }
  // An RMSNorm in front of products (the layers' attention and feed-forward
  // norms): y = x / rms(x) * weight as RmsNorm computes it, with eps; xn
  // ([m, xn_stride]) is where a backend that does not fold it into the
  // products puts the normalized rows. weight nullptr: no norm.
  struct Norm {
    const float* weight = nullptr;
    float eps = 0.0f;
    float* xn = nullptr;
    int64_t xn_stride = 0;
  };
  // The products of one transformer layer, for FusesLayer.
  struct LayerProducts {
    const WeightView *wq, *wk, *wv, *wo, *gate, *up, *down;
  };
  // Whether a batch of m rows through a layer with these weights runs every
  // step fused here: NormMatMulShared with its norm folded in, MatMulAdd for
  // the attention output, FeedForward in one pass with its norm and add, so
  // that the callers' norm.xn and gate/up buffers are never written (memory
  // predictions leave them out). Default: false.
  virtual bool FusesLayer(const LayerProducts& w, int64_t m) const {
    (void)w;
    (void)m;
    return false;
  }
  // MatMulShared over RmsNorm(x) (Q, K and V): the same results as RmsNorm
  // into norm.xn and then MatMulShared over it, which is what this default
  // does; a backend that folds the norm into the products' reading of x may
  // leave norm.xn unwritten.
  virtual absl::Status NormMatMulShared(const float* x, int64_t m, int64_t x_stride, const Norm& norm,
                                        const SharedOut* outs, int count) {
    if (count <= 0) return MatMulShared(x, m, x_stride, outs, count);
    absl::Status s = NormalizeRows(norm, m, outs[0].w->cols, x, x_stride);
    if (!s.ok()) return s;
    return MatMulShared(x, m, x_stride, outs, count);
  }
  // A feed-forward block's weights, the norm in front of it, and its
  // scratch: gate_buf and up_buf ([m, buf_stride], buf_stride >= gate.rows)
  // for the two products, norm.xn for the normalized rows.
  struct FeedForwardBlock {
    const WeightView* gate = nullptr;
    const WeightView* up = nullptr;
    const WeightView* down = nullptr;
    Norm norm;
    float* gate_buf = nullptr;
    float* up_buf = nullptr;
    int64_t buf_stride = 0;
  };
  // The feed-forward block: y[m, down.rows] = (silu(x̂ · Gᵀ) ⊙ (x̂ · Uᵀ)) · Dᵀ
  // for x̂ = RmsNorm(x) (with norm.weight; else x itself), x [m, gate.cols];
  // with `add`, y += it instead (only where FusesResidualAdd(down, m)). The
  // scratch's contents are unspecified afterwards. y may be x or norm.xn (x̂
  // is read in full before y is written). The same results as RmsNorm into
  // norm.xn, MatMulShared over gate and up into the buffers, then
  // SwiGluMatMul, which is what this default does.
  virtual absl::Status FeedForward(const float* x, int64_t m, int64_t x_stride, const FeedForwardBlock& f, float* y,
                                   int64_t y_stride, bool add) {
    absl::Status s = NormalizeRows(f.norm, m, f.gate->cols, x, x_stride);
    if (!s.ok()) return s;
    const SharedOut gate_up[2] = {{f.gate, f.gate_buf, f.buf_stride}, {f.up, f.up_buf, f.buf_stride}};
    s = MatMulShared(x, m, x_stride, gate_up, 2);
    if (!s.ok()) return s;
    return SwiGluMatMul(f.gate_buf, f.up_buf, m, f.buf_stride, *f.down, y, y_stride, add);
  }
  // Causal grouped-query attention of q.count queries (the last q.count of
  // the kv.num_keys positions) over kv; see kernels/cpu/ops.h for the rule.
  // out: [q.count, num_heads * head_dim] at out_stride.
  virtual absl::Status Attention(const Queries& q, const KvView& kv, float* out, int64_t out_stride) = 0;
  // Attention, and each query's log softmax denominator over the keys it
  // saw into lse ([num_heads][q.count], QueryLogSumExp's layout), which
  // context reconstruction weighs the chunk's keys by. The CPU's kernels
  // keep it from their own pass (of the scores they computed: bf16 where
  // the chunk's attention is bf16); this default runs QueryLogSumExp after
  // Attention (no window: refused with one).
  virtual absl::Status AttentionWithLse(const Queries& q, const KvView& kv, float* out, int64_t out_stride,
                                        float* lse) {
    absl::Status s = lse != nullptr && q.window > 0
                         ? absl::InvalidArgumentError("attention_with_lse: QueryLogSumExp has no window")
                         : Attention(q, kv, out, out_stride);
    if (!s.ok() || lse == nullptr) return s;
    return QueryLogSumExp(q, kv, lse);
  }
  // Whether AttentionWithLse keeps the denominators from the attention's own
  // pass (the CPU's kernels), rather than the default's second pass over the
  // keys: only then does context reconstruction attend its repetition in the
  // last layer, whose rows are read for nothing else.
  virtual bool AttentionKeepsLse() const { return false; }
  // SnapKV votes: for each KV head and key j < kv.num_keys, the queries'
  // softmax weight on j summed over the q.count queries and averaged over
  // the KV group's query heads (Attention's visibility rule).
  // votes: [num_kv_heads][votes_stride].
  virtual absl::Status WindowScores(const Queries& q, const KvView& kv, float* votes, int64_t votes_stride) = 0;
  // The recall tier's two ops (DESIGN.md §8). QueryLogSumExp: each query's
  // log softmax denominator over the kv.num_keys keys it sees (Attention's
  // visibility), lse: [num_heads][q.count]. RecallScores: for each KV head
  // and each of keys.num_keys stored keys (all visible), the softmax weight
  // the queries would give it beside the keys behind `lse`, summed over the
  // queries and averaged over the KV group's query heads; with max_weight
  // the largest such weight over the queries and the group's heads instead
  // (context reconstruction, DESIGN.md §9); scores:
  // [num_kv_heads][scores_stride].
  virtual absl::Status QueryLogSumExp(const Queries& q, const KvView& kv, float* lse) = 0;
  virtual absl::Status RecallScores(const Queries& q, const float* lse, const KvView& keys, float* scores,
                                    int64_t scores_stride, bool max_weight) = 0;
  // The selection's ops over one head's votes (host memory, n values).
  // Pool1d: out[i] = the average (counting the pads as zeros, always over
  // `kernel`) or the maximum (ignoring the pads) of in[i - kernel/2,
  // i + kernel/2], kernel odd; kernel <= 1 copies. TopK: the positions of
  // the k largest of scores[0, n) in ascending position order, ties to the
  // lower position; k <= n.
  // Gather: for each RowGather, row rows[i] of src (row i where rows is
  // null) to row i of dst, for i < count, row_bytes bytes each; strides in
  // bytes. The engine's copies of the KV (memory and chunk into the
  // candidates, the kept candidates back into the memory) go through it, so
  // that a backend whose tensors live elsewhere copies them there. No
  // destination may overlap another or any source. The base class copies
  // one row at a time; InvalidArgument for a negative count or a null
  // pointer with rows to copy.
  struct RowGather {
    const void* src = nullptr;
    size_t src_stride = 0;
    const int32_t* rows = nullptr;
    void* dst = nullptr;
    size_t dst_stride = 0;
    int64_t count = 0;
    size_t row_bytes = 0;
  };
  virtual absl::Status Gather(const std::vector<RowGather>& gathers);
  // Memory for the backend's ops (BackendBuffer). The base class maps host
  // pages, which become resident as they are written; ResourceExhausted
  // where the mapping cannot be made.
  virtual absl::StatusOr<std::unique_ptr<BackendBuffer>> NewBuffer(uint64_t bytes);
  // Whether the host reaches this backend's buffers in place
  // (BackendBuffer::host() set): the CPU's, unless guarded. Where it does
  // not (a device), the prefill engine keeps its memory's keys and values
  // in the backend's buffers as well, so that its copies stay there.
  virtual bool HostReachesBuffers() const { return true; }
  // Copies between the backend's memory (a BackendBuffer's bytes) and the
  // host's. The base class: memcpy.
  virtual absl::Status Download(const void* src, void* host, uint64_t bytes);
  virtual absl::Status Upload(const void* host, void* dst, uint64_t bytes);
  // Copies to the host that run beside the backend's ops, so that the host
  // reads a layer's results while the next layer computes (the recall
  // tier's evicted rows, DESIGN.md §14). NewHostBuffer: host memory for
  // them (page-locked on a device, where a copy into pageable memory would
  // wait for the queue; the base class's plain pages), host() and data()
  // its address, which no op reads. DownloadAsync: queues a copy of
  // `bytes` from the backend's memory `src` into such a buffer's `host`
  // behind the ops queued so far and returns a fence; the bytes are the
  // copy's once WaitDownload returns for that fence (or a later one), and
  // the caller neither reads nor writes them before. The base class copies
  // at once (Download) and its fences are 0.
  virtual absl::StatusOr<std::unique_ptr<BackendBuffer>> NewHostBuffer(uint64_t bytes);
  virtual absl::StatusOr<uint64_t> DownloadAsync(const void* src, void* host, uint64_t bytes);
  virtual absl::Status WaitDownload(uint64_t fence) { return absl::OkStatus(); }
  // Element-wise ops of the forward pass: x[i] += y[i] for i < n (the
  // residual stream where no product adds into it); x[r, i] += bias[i] for
  // rows r < rows and i < dim, rows `stride` floats apart (Qwen's Q/K/V
  // biases; the bias in host memory); and x[i] *= s for i < n (Gemma's
  // embedding scale); and x[i] = value for i < n (a question's own keys'
  // votes at the last step, the largest there is). The base class runs
  // them on the host, over ParallelFor where there are more than 64 Ki
  // values (a parallel region costs more than a smaller add).
  virtual absl::Status Add(float* x, const float* y, int64_t n);
  virtual absl::Status AddRows(float* x, int64_t stride, const float* bias, int64_t rows, int64_t dim);
  virtual absl::Status Scale(float* x, int64_t n, float s);
  virtual absl::Status Fill(float* x, int64_t n, float value);
  enum class PoolOp { kAvg, kMax };
  virtual absl::Status Pool1d(const float* in, float* out, int64_t n, int64_t kernel, PoolOp op) = 0;
  virtual absl::Status TopK(const float* scores, int64_t n, int64_t k, int32_t* positions) = 0;
  // The k entries of scores[0, n) taken as spans around the highest, in
  // ascending position order: walking TopK's ranking, each entry not yet
  // taken is taken with every untaken entry within span/2 of it, nearest
  // first (the lower side first), until k are (a question's facts and
  // stored scores are several tokens, DESIGN.md §7); span 1 is TopK.
  // Twin: ref::TopSpanIndices. The base class runs on the host;
  // InvalidArgument unless 0 <= k <= n and span >= 1.
  virtual absl::Status TopSpans(const float* scores, int64_t n, int64_t k, int64_t span, int32_t* positions);
  // SnapKV's selection for every KV head of a layer in one op, its votes
  // and its result in backend memory: a device picks what a layer keeps
  // without the votes coming to the host, and the kept rows are gathered by
  // indices that stay there (DESIGN.md §14). For head h < num_heads, with
  // R = candidates [rest_begin, window_begin) and pooled = Pool1d over
  // votes[h][R] alone (pool_kernel, pool), keep[h] is, ascending, [0,
  // rest_begin) (the sinks), the `pick` entries of R taken by TopSpans
  // over the pooled votes (`span`; with 1, the highest pooled votes,
  // higher, then lower index) and [window_begin, num_candidates) (the
  // window): count() indices. Where `then_pick` > 0 (a question that
  // leaves the window's votes a share, --query_share < 1), that many more
  // entries of R are kept after those: the highest of Pool1d over
  // then_votes[h][R] (the same pooling) among the entries the first pick
  // left (higher, then lower index), both picks merged ascending. One more
  // word follows them: -1, or the first candidate of R whose vote (in
  // either row) is not finite (every vote of R is checked, whatever the
  // picks); the row is then [0, count()), so that a gather by it stays in
  // bounds, and the caller reports the vote. Twin: ref::SelectHeads. The
  // base class runs on the host (kernels/cpu's pooling and top-k), head by
  // head over ParallelFor; InvalidArgument for inconsistent sizes.
  struct HeadSelection {
    const float* votes = nullptr;  // [num_heads][votes_stride]
    int64_t votes_stride = 0;      // 0: one row that every head reads
    int64_t num_heads = 0;
    int64_t num_candidates = 0;
    int64_t rest_begin = 0;  // 0 <= rest_begin <= window_begin <= num_candidates
    int64_t window_begin = 0;
    int64_t pick = 0;         // at most window_begin - rest_begin (with then_pick)
    int64_t pool_kernel = 1;  // odd; 1 pools nothing
    PoolOp pool = PoolOp::kAvg;
    int64_t span = 1;         // >= 1
    const float* then_votes = nullptr;  // [num_heads][then_votes_stride] where then_pick > 0
    int64_t then_votes_stride = 0;      // 0: one row that every head reads
    int64_t then_pick = 0;              // pick + then_pick at most window_begin - rest_begin
    int32_t* keep = nullptr;            // [num_heads][keep_stride], keep_stride > count()
    int64_t keep_stride = 0;
    int64_t count() const { return rest_begin + pick + then_pick + (num_candidates - window_begin); }
  };
  virtual absl::Status SelectHeads(const HeadSelection& s);
  // The candidates that a selection left (the recall tier's evicted rows,
  // found where SelectHeads' kept indices are, DESIGN.md §14): for head
  // h < num_heads, out[h * out_stride + i] for i < num_candidates - kept
  // are the indices of [0, num_candidates) that keep[h * keep_stride, +
  // kept) does not hold, ascending; the kept indices ascending, distinct and
  // below num_candidates. Twin: ref::Complement. The base class runs on the
  // host; InvalidArgument for inconsistent sizes.
  virtual absl::Status Complement(const int32_t* keep, int64_t keep_stride, int64_t kept, int64_t num_heads,
                                  int64_t num_candidates, int32_t* out, int64_t out_stride);
  // SmartKV's learned gates (DESIGN.md §9) on a layer's keys before RoPE,
  // every KV head in one op, so that a gate pruner's scores are made where
  // the keys are: for head h < num_heads and key i < n,
  //   y[h * y_stride + i] = w2 · relu(w1 x̂ + b1) + b2,
  //   x̂ = (k - mean) ⊙ inv_std, k = keys[h * keys_head_stride + i * key_stride, + head_dim),
  // with head h's parameters at params + h * params_stride, packed as
  // mean[head_dim], inv_std[head_dim], w1[hidden][head_dim], b1[hidden],
  // w2[hidden], b2 (GateParamFloats of them). Twin: ref::GateForward. The
  // base class runs on the host (kernels/cpu); InvalidArgument for
  // inconsistent sizes or a missing operand.
  struct GateScoring {
    int64_t num_heads = 0;
    int64_t head_dim = 0;
    int64_t hidden = 0;
    int64_t n = 0;  // keys per head
    const float* params = nullptr;
    int64_t params_stride = 0;  // >= GateParamFloats(head_dim, hidden)
    const float* keys = nullptr;
    int64_t keys_head_stride = 0;
    int64_t key_stride = 0;  // >= head_dim
    float* y = nullptr;
    int64_t y_stride = 0;  // >= n
  };
  static int64_t GateParamFloats(int64_t head_dim, int64_t hidden) {
    return 2 * head_dim + hidden * head_dim + 2 * hidden + 1;
  }
  virtual absl::Status GateScores(const GateScoring& g);
  // Bytes of scratch WindowScores holds for num_q queries of num_heads heads
  // over num_keys keys (its scores kept for a second pass), for memory
  // predictions. The base class keeps none.
  virtual uint64_t WindowScoresScratchBytes(int64_t num_heads, int64_t num_q, int64_t num_keys) const {
    return 0;
  }
  // Bytes of scratch Attention keeps after a chunk of num_q queries over
  // num_keys keys (the longest, a global layer's; windows take no more),
  // for memory predictions. The base class keeps none.
  virtual uint64_t AttentionScratchBytes(int64_t num_q, int64_t num_keys, int64_t num_kv_heads,
                                         int64_t head_dim) const {
    return 0;
  }
  // A bound on the scratch the products keep after a batch of `tokens` rows
  // whose inputs are at most `widest` values wide (ffn_dim of them the
  // feed-forward block's), where the backend knows it; for memory
  // predictions, which take the larger of it and their fit for the int8
  // paths' quantized activations and packed tiles. The base class: 0.
  virtual uint64_t ProductScratchBytes(int64_t tokens, int64_t widest, int64_t ffn_dim) const { return 0; }
  // Whether MatMul quantizes the activations (int8 dots) for weights of
  // `type`, so that its peak is the int8 one (`snapfill info`'s ceiling).
  virtual bool QuantizesActivations(GgmlType type) const { return false; }
  // How the backend's threads wait between operations, in words ("" where
  // that does not apply), for `snapfill info`.
  virtual std::string thread_waits() const { return ""; }
  // Whether one-query Attention (decode) wants the KV's fp16 copy
  // (BackendOptions::half_decode_kv): the caller then passes a KvView with
  // k16 / v16 set, which Attention reads instead of k / v.
  virtual bool HalfDecodeKv() const { return false; }
  // y[i] = x[i] as IEEE fp16, rounded to nearest even (the decode copy of
  // the KV cache). The base class converts element by element.
  virtual void ToHalf(const float* x, uint16_t* y, int64_t n);
  // y[i] = x[i] widened from IEEE fp16 (exact). The base class converts
  // element by element.
  virtual void FromHalf(const uint16_t* x, float* y, int64_t n);
  // ToHalf's conversion as an op on the backend's buffers (NewBuffer), x
  // and y both in them, queued as the other ops are: the recall tier's
  // evicted rows, converted where they were gathered so that half the bytes
  // travel to the host. The base class calls ToHalf (buffers the host
  // reaches); InvalidArgument for a negative count.
  virtual absl::Status ToHalfInBuffers(const float* x, uint16_t* y, int64_t n);
  // Row-scaled int8 records (src/base/int8_rows.h: the recall store's q8):
  // `rows` rows of `dim` floats x to rows × (4 + dim) bytes y, each row
  // [f32 max|x| / 127][dim int8], and back. The base class converts row by
  // row with the scalar twins; every backend gives the twins' bits for
  // finite values.
  virtual void ToInt8Rows(const float* x, uint8_t* y, int64_t rows, int64_t dim);
  virtual void FromInt8Rows(const uint8_t* y, float* x, int64_t rows, int64_t dim);
  // ToInt8Rows as an op on the backend's buffers, as ToHalfInBuffers is (a
  // q8 store's evicted rows: under a third of their f32 bytes travel).
  // InvalidArgument for a negative count.
  virtual absl::Status ToInt8RowsInBuffers(const float* x, uint8_t* y, int64_t rows, int64_t dim);
  // How the backend reads weight matrix `w` in the products of `use`: in
  // place (its mapped bytes; the default) or through a copy of its own (the
  // CPU's decode layout with BackendOptions::pack_decode_weights, which
  // AVX-512's Q4_0 / Q4_1 batch products read as well; a GPU's device
  // copy). Known before any copy is made (memory predictions, LlamaForward's
  // placement of the weights).
  virtual WeightCopy CopyOf(const WeightView& w, WeightUse use) const { return {}; }
  // The one preparation before the products of `use` start: makes the copy
  // CopyOf(w, use) names for each of `weights` that has one (the others are
  // left alone), and calls `copied(i, data, bytes)` for each range of
  // weights[i]'s bytes that it has copied and will not read again, so that
  // the caller may give those pages back while the copies grow. Returns,
  // for each weight, whether it is read through a copy now (false where
  // CopyOf says none, or the copy could not be allocated: its products then
  // read w's bytes). Products that read a copy do so without reading w's
  // bytes again, so the caller vouches for them until it prepares again
  // (another model at the same address would otherwise be multiplied with
  // the old copy).
  std::vector<bool> PrepareWeights(const std::vector<const WeightView*>& weights, WeightUse use,
                                   const std::function<void(size_t, const void*, size_t)>& copied);
  // The most device memory the backend has held at once, in bytes (its own
  // allocations: weights, buffers, scratch); 0 where the backend computes in
  // host memory (the CPU; under guard_buffers, which stands in for a
  // device, its buffers' bytes).
  virtual uint64_t DevicePeakBytes() const { return 0; }
  // What the backend's ops keep in device memory between calls (their
  // scratch, grown to the largest operands) for work of at most these
  // sizes: an upper bound, for --dry_run and --max_memory on a device; 0
  // where the ops' scratch is host memory.
  virtual uint64_t DeviceScratchBytes(const OpSizes& sizes) const { return 0; }
  // Device memory free now (cudaMemGetInfo), 0 where there is no device.
  virtual uint64_t DeviceFreeBytes() const { return 0; }
  // The buffers the backend's kernels keep between ops (packed activations
  // and weight rows, tables), over all its threads: what they hold now, and
  // freeing them (the next op makes what it needs again), as between a
  // prefill's chunks and decoding. Not while an op runs.
  virtual uint64_t KernelScratchBytes() const { return 0; }
  virtual void ReleaseKernelScratch() {}
  // Waits for queued work (a no-op on the CPU).
  virtual absl::Status Synchronize() = 0;
  // What the backend measures of itself, or null where it measures nothing
  // (BackendProfile: its ops' time and work, its instructions' peaks).
  virtual BackendProfile* profile() { return nullptr; }

 protected:
  // PrepareWeights' work for one matrix that CopyOf names a copy for: makes
  // the copy (or finds it made from the same bytes), calling `copied` for
  // each range of w's bytes it has copied; false where it cannot be made.
  virtual bool MakeCopy(const WeightView& w, const std::function<void(const void*, size_t)>& copied) {
    return false;
  }
  // With norm.weight: RmsNorm of x's m rows of dim into norm.xn, and x,
  // x_stride then name those rows; without it, x as it is. (The defaults of
  // NormMatMulShared and FeedForward.)
  absl::Status NormalizeRows(const Norm& norm, int64_t m, int64_t dim, const float*& x, int64_t& x_stride) {
    if (norm.weight == nullptr) return absl::OkStatus();
    absl::Status s = RmsNorm(x, x_stride, norm.weight, norm.xn, norm.xn_stride, m, dim, norm.eps);
    if (!s.ok()) return s;
    x = norm.xn;
    x_stride = norm.xn_stride;
    return absl::OkStatus();
  }
};

// The CPU kernel level `name` names (BackendOptions::kernel_level), as an
// index from the lowest; InvalidArgument "expected generic, avx2, avxvnni or
// avx512" for a name that is none.
absl::StatusOr<int> KernelLevelIndex(std::string_view name);

// Makes BackendOptions' kernel choices for the CPU's kernels (CreateBackend
// does so too): InvalidArgument for a level name that is not one or that
// this CPU cannot run, FailedPrecondition once the kernels run with others.
// For a harness that runs the kernels without a backend.
absl::Status ConfigureCpuKernels(const BackendOptions& options);

// The implementation to take of `rates`: the first (the reference) unless
// another is more than 10% faster, so that timing noise between near-equals
// does not flip the choice; then the fastest. "" for no rates.
std::string FastestKernel(const std::vector<KernelRate>& rates);

// Times, with the options' level, AMX mode and thread count, the
// implementations this CPU runs of each op that has several: the prefill
// attention (on a chunk of options.attention_shape's heads) and the products
// (on options.product_shape), about 0.2 s in all. Each op's list starts with
// its reference. Errors as ConfigureCpuKernels.
absl::StatusOr<std::vector<KernelRates>> MeasureCpuKernels(const BackendOptions& options);

// This CPU, for a file of timings: vendor, brand string, family, model and
// stepping, and the highest kernel level it runs.
std::string CpuIdentity();

// Returns a backend for `device`; Unimplemented("built without CUDA") for
// kCuda in a CPU-only build, FailedPrecondition where no GPU can be used.
absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(Device device,
                                                       const BackendOptions& options = {});

// The GPU a kCuda backend runs on, in words (name, compute capability,
// memory, driver); Unimplemented in a CPU-only build, FailedPrecondition
// where there is no driver or no GPU.
absl::StatusOr<std::string> DescribeCudaDevice();

// The device a name asks for: "cpu", "cuda", or "auto" (the GPU where one
// can be used, else the CPU). InvalidArgument for another name.
absl::StatusOr<Device> ResolveDevice(std::string_view name);

}  // namespace snapfill

#endif  // SNAPFILL_BACKEND_H_
