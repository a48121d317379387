// GGUF writer: builds a GGUF v3 file in memory and writes it to disk.
//
// It exists for tests and tools (tiny random models, malformed-file fixtures),
// not for converting real checkpoints. Tensors added with AddTensor are held
// in memory; tensors added with AddTensorGenerated are produced one at a
// time while the file is written, so WriteFile's peak memory is about two
// such tensors (one being filled, one being written; synthetic models of
// many gigabytes). The
// output follows the layout in gguf_reader.h: header, metadata in insertion
// order, tensor directory in insertion order, zero padding to the alignment,
// then each tensor's bytes at an aligned offset (tensors packed in order, as
// ggml's gguf_write_to_buf does).
//
// Metadata keys are unique: adding a key that already exists replaces its
// value in place. Tensors are validated when added (known type, 1..4 positive
// dimensions, whole blocks, byte count matching the shape) and names are
// unique, so Serialize() always produces a file GgufFile accepts. Malformed
// fixtures are made by corrupting the serialized bytes.
#ifndef SNAPFILL_TOOLS_TESTMODEL_GGUF_WRITER_H_
#define SNAPFILL_TOOLS_TESTMODEL_GGUF_WRITER_H_

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "snapfill/dtype.h"
#include "src/gguf/gguf_reader.h"

namespace snapfill {

class GgufWriter {
 public:
  GgufWriter() = default;

  // Sets the version written in the header (default 3). Versions 2 and 3 share
  // one layout; other values are for crafting unsupported files in tests.
  void set_version(uint32_t version) { version_ = version; }
  uint32_t version() const { return version_; }

  // Sets the data alignment (a nonzero power of two; InvalidArgument
  // otherwise) and records it as the uint32 key `general.alignment`.
  absl::Status SetAlignment(uint32_t alignment);
  uint32_t alignment() const { return alignment_; }

  // Typed metadata setters; each stores the value with the named GGUF type.
  void AddString(std::string_view key, std::string_view value);
  void AddUint32(std::string_view key, uint32_t value);
  void AddInt32(std::string_view key, int32_t value);
  void AddUint64(std::string_view key, uint64_t value);
  void AddFloat32(std::string_view key, float value);
  void AddBool(std::string_view key, bool value);
  void AddStringArray(std::string_view key, const std::vector<std::string>& values);
  void AddFloat32Array(std::string_view key, const std::vector<float>& values);
  void AddInt32Array(std::string_view key, const std::vector<int32_t>& values);

  // Stores any value. The variant alternative must match `type` (or
  // `array_type`) as GgufValue documents (uint64_t for unsigned types, ...)
  // and the value must fit the stored width; InvalidArgument otherwise.
  // Nested arrays are rejected (the reader does not support them).
  absl::Status AddValue(std::string_view key, GgufValue value);

  // Adds a tensor. `shape` is ne[0] first; `data` holds exactly
  // RowBytes(type, ne[0]) * ne[1] * ... bytes. InvalidArgument otherwise.
  absl::Status AddTensor(std::string_view name, GgmlType type, std::vector<int64_t> shape,
                         std::string_view data);
  // Adds a tensor whose bytes are produced when the file is serialized or
  // written: `fill` receives a buffer of exactly RowBytes(type, ne[0]) *
  // ne[1] * ... bytes and must fill all of it, the same way on every call
  // (Serialize and WriteFile may each call it). Shape and type are checked
  // now, as AddTensor checks them.
  using TensorFill = std::function<void(char* dst, uint64_t bytes)>;
  absl::Status AddTensorGenerated(std::string_view name, GgmlType type, std::vector<int64_t> shape,
                                  TensorFill fill);
  // Convenience: an F32 tensor from floats.
  absl::Status AddTensorF32(std::string_view name, std::vector<int64_t> shape,
                            const std::vector<float>& values);

  int num_kvs() const { return static_cast<int>(kvs_.size()); }
  int num_tensors() const { return static_cast<int>(tensors_.size()); }

  // Returns the complete file.
  std::string Serialize() const;

  // Writes the bytes of Serialize() to `path` atomically through an
  // AtomicFileWriter (a temporary beside `path`, fsync'ed, then renamed over
  // it, replacing any existing file; callers decide whether that is
  // allowed). The file is streamed: header and directory, then each
  // tensor's bytes in turn, written on a second thread while the next
  // generated tensor is filled (two reused buffers), never the whole file
  // in memory.
  absl::Status WriteFile(const std::string& path) const;

 private:
  struct Tensor {
    std::string name;
    GgmlType type;
    std::vector<int64_t> shape;
    std::string data;  // empty for a generated tensor
    uint64_t bytes = 0;
    TensorFill fill;   // set for a generated tensor
  };
  void Put(std::string_view key, GgufValue value);
  // Checks a new tensor's name, type and shape; returns its byte count.
  absl::Status CheckTensor(std::string_view name, GgmlType type, const std::vector<int64_t>& shape,
                           uint64_t* bytes) const;
  // The header, metadata and tensor directory, padded to the alignment.
  std::string Head() const;

  uint32_t version_ = 3;
  uint32_t alignment_ = 32;
  std::vector<GgufKv> kvs_;
  std::vector<Tensor> tensors_;
};

}  // namespace snapfill

#endif  // SNAPFILL_TOOLS_TESTMODEL_GGUF_WRITER_H_
