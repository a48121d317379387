#include "src/kv/recall_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <future>
#include <map>
#include <sstream>
#include <system_error>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "snapfill/backend.h"
#include "snapfill/status.h"
#include "src/base/file_util.h"
#include "src/base/half.h"
#include "src/base/int8_rows.h"

namespace snapfill {
namespace {

constexpr char kMetaName[] = "recall.meta";
constexpr char kMetaHead[] = "snapfill-recall 1";
constexpr char kDoneName[] = "recall.done";

std::string Hex(uint64_t x) { return absl::StrFormat("%016x", x); }

// The header's lines: what Reopen compares, in the order it names them.
std::string MetaText(const RecallStoreInfo& info) {
  return absl::StrCat(kMetaHead, "\nmodel=", info.model_fingerprint, "\ninput_digest=", Hex(info.input_digest),
                      "\ninput_tokens=", info.input_tokens, "\nplan_digest=", Hex(info.plan_digest),
                      "\nlayers=", info.num_layers, "\nkv_heads=", info.num_kv_heads, "\nhead_dim=", info.head_dim,
                      "\nformat=", RecallFormatName(info.format), "\n");
}

absl::StatusOr<std::map<std::string, std::string>> ReadMeta(const std::string& path) {
  std::ifstream in(path);
  if (!in) return FileErrnoStatus(errno, "cannot read", path);
  std::string line;
  if (!std::getline(in, line) || line != kMetaHead) {
    return absl::FailedPreconditionError(absl::StrCat(path, " is not a snapfill recall store header"));
  }
  std::map<std::string, std::string> kv;
  while (std::getline(in, line)) {
    const size_t eq = line.find('=');
    if (eq == std::string::npos) {
      return absl::FailedPreconditionError(absl::StrCat(path, ": malformed line \"", line, "\""));
    }
    kv[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return kv;
}

bool IsDirectory(const std::string& path, bool* exists) {
  struct stat st {};
  *exists = ::stat(path.c_str(), &st) == 0;
  return *exists && S_ISDIR(st.st_mode);
}

// The names in `dir` other than . and ..; errno status on failure.
absl::StatusOr<std::vector<std::string>> ListDir(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return FileErrnoStatus(errno, "cannot read the directory", dir);
  std::vector<std::string> names;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  ::closedir(d);
  return names;
}

absl::Status WriteFailed(int err, const std::string& path) {
  if (err == ENOSPC || err == EDQUOT || err == EFBIG) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the recall store ran out of disk writing ", path, ": ", std::strerror(err),
        " (--dry_run prints the space it needs; free some or point --recall_dir elsewhere)"));
  }
  return FileErrnoStatus(err, "cannot write", path);
}

}  // namespace

absl::StatusOr<RecallFormat> ParseRecallFormat(std::string_view name) {
  if (name == "f16") return RecallFormat::kF16;
  if (name == "q8") return RecallFormat::kQ8;
  return absl::InvalidArgumentError(absl::StrCat("--recall_format=", std::string(name), ": expected f16 or q8"));
}

const char* RecallFormatName(RecallFormat format) { return format == RecallFormat::kF16 ? "f16" : "q8"; }

uint64_t RecallVectorBytes(RecallFormat format, int64_t head_dim) {
  return format == RecallFormat::kF16 ? 2 * head_dim : static_cast<uint64_t>(Int8RowBytes(head_dim));
}

RecallStore::RecallStore(std::string dir, const RecallStoreInfo& info) : dir_(std::move(dir)), info_(info) {
  conversions_.to_half = [](const float* x, uint16_t* y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] = Fp32ToFp16(x[i]);
  };
  conversions_.from_half = [](const uint16_t* x, float* y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] = Fp16ToFp32(x[i]);
  };
  conversions_.to_int8 = [](const float* x, uint8_t* y, int64_t rows, int64_t dim) { EncodeInt8Rows(x, rows, dim, y); };
  conversions_.from_int8 = [](const uint8_t* y, float* x, int64_t rows, int64_t dim) {
    DecodeInt8Rows(y, rows, dim, x);
  };
  pos_fds_.assign(info.num_layers, -1);
  key_fds_.assign(info.num_layers, -1);
  value_fds_.assign(info.num_layers, -1);
  slots_.assign(info.num_layers, 0);
}

RecallStore::~RecallStore() {
  for (int64_t l = 0; l < info_.num_layers; ++l) {
    for (const LayerFile& f : LayerFiles(l)) {
      if (*f.fd >= 0) ::close(*f.fd);
    }
  }
}

std::array<RecallStore::LayerFile, 3> RecallStore::LayerFiles(int64_t layer) {
  return {LayerFile{&pos_fds_[layer], PosSlotBytes(), "pos"}, LayerFile{&key_fds_[layer], KeySlotBytes(), "keys"},
          LayerFile{&value_fds_[layer], ValueSlotBytes(), "values"}};
}

absl::StatusOr<uint64_t> RecallStore::FileBytes(int64_t layer, const LayerFile& f) const {
  struct stat st {};
  if (::fstat(*f.fd, &st) != 0) return FileErrnoStatus(errno, "cannot stat", FilePath(layer, f.kind));
  return static_cast<uint64_t>(st.st_size);
}

void RecallStore::SetConversions(Conversions conversions) {
  if (conversions.to_half) conversions_.to_half = std::move(conversions.to_half);
  if (conversions.from_half) conversions_.from_half = std::move(conversions.from_half);
  if (conversions.to_int8) conversions_.to_int8 = std::move(conversions.to_int8);
  if (conversions.from_int8) conversions_.from_int8 = std::move(conversions.from_int8);
}

RecallStore::Conversions RecallStore::BackendConversions(Backend* backend) {
  return {[backend](const float* x, uint16_t* y, int64_t n) { backend->ToHalf(x, y, n); },
          [backend](const uint16_t* x, float* y, int64_t n) { backend->FromHalf(x, y, n); },
          [backend](const float* x, uint8_t* y, int64_t rows, int64_t dim) { backend->ToInt8Rows(x, y, rows, dim); },
          [backend](const uint8_t* y, float* x, int64_t rows, int64_t dim) { backend->FromInt8Rows(y, x, rows, dim); }};
}

uint64_t RecallStore::VectorBytes() const { return RecallVectorBytes(info_.format, info_.head_dim); }
uint64_t RecallStore::KeySlotBytes() const { return info_.num_kv_heads * VectorBytes(); }
uint64_t RecallStore::PosSlotBytes() const { return info_.num_kv_heads * sizeof(int32_t); }
uint64_t RecallStore::ValueSlotBytes() const { return info_.num_kv_heads * VectorBytes(); }

uint64_t RecallStore::SlotBytes(const RecallStoreInfo& info) {
  RecallStore s("", info);
  return s.PosSlotBytes() + s.KeySlotBytes() + s.ValueSlotBytes();
}

uint64_t RecallStore::bytes() const {
  uint64_t slots = 0;
  for (int64_t n : slots_) slots += n;
  return slots * (PosSlotBytes() + KeySlotBytes() + ValueSlotBytes());
}

std::string RecallStore::FilePath(int64_t layer, const char* kind) const {
  return absl::StrFormat("%s/layer-%02d.%s", dir_, layer, kind);
}

absl::Status RecallStore::OpenFiles(bool create) {
  const int flags = O_RDWR | O_CLOEXEC | (create ? O_CREAT | O_EXCL : 0);
  for (int64_t l = 0; l < info_.num_layers; ++l) {
    for (const LayerFile& f : LayerFiles(l)) {
      const std::string path = FilePath(l, f.kind);
      *f.fd = ::open(path.c_str(), flags, 0600);
      if (*f.fd < 0) return FileErrnoStatus(errno, create ? "cannot create" : "cannot open", path);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<RecallStore>> RecallStore::Create(const std::string& dir,
                                                                 const RecallStoreInfo& info) {
  if (info.num_layers <= 0 || info.num_kv_heads <= 0 || info.head_dim <= 0) {
    return absl::InvalidArgumentError("recall store: empty shape");
  }
  if (dir.empty()) return absl::InvalidArgumentError("--recall_dir is empty");
  std::unique_ptr<RecallStore> s(new RecallStore(dir, info));
  bool exists = false;
  if (IsDirectory(dir, &exists)) {
    SNAPFILL_ASSIGN_OR_RETURN(const std::vector<std::string> names, ListDir(dir));
    if (!names.empty()) {
      const bool store = std::find(names.begin(), names.end(), kMetaName) != names.end();
      return absl::FailedPreconditionError(absl::StrCat(
          "--recall_dir ", dir, store ? " holds the recall store of an earlier run" : " is not empty",
          "; remove it or choose another directory (a new store needs an absent or empty one)"));
    }
  } else if (exists) {
    return absl::FailedPreconditionError(absl::StrCat("--recall_dir ", dir, " exists and is not a directory"));
  } else {
    if (::mkdir(dir.c_str(), 0700) != 0) return FileErrnoStatus(errno, "--recall_dir: cannot create", dir);
    s->made_dir_ = true;
  }
  absl::Status st = s->OpenFiles(/*create=*/true);
  // (made_dir: whether Remove, after a resume too, takes the directory.)
  if (st.ok()) {
    st = WriteFileAtomically(absl::StrCat(dir, "/", kMetaName),
                             absl::StrCat(MetaText(info), "made_dir=", s->made_dir_ ? 1 : 0, "\n"),
                             /*overwrite=*/false);
  }
  if (!st.ok()) {
    s->Remove().IgnoreError();
    return st;
  }
  return s;
}

namespace {

// Reads the header in `dir` and checks it names `info` (its format too
// unless `any_format`). FailedPrecondition naming what differs.
absl::StatusOr<std::map<std::string, std::string>> CheckMeta(const std::string& dir, const RecallStoreInfo& info,
                                                              bool any_format, const char* hint) {
  const std::string meta_path = absl::StrCat(dir, "/", kMetaName);
  if (::access(meta_path.c_str(), F_OK) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("--recall_dir ", dir, " holds no recall store (", meta_path, " is missing): ", hint));
  }
  SNAPFILL_ASSIGN_OR_RETURN(auto meta, ReadMeta(meta_path));
  std::istringstream want(MetaText(info));
  std::string line;
  std::getline(want, line);  // the head line, checked by ReadMeta
  while (std::getline(want, line)) {
    const size_t eq = line.find('=');
    const std::string key = line.substr(0, eq), value = line.substr(eq + 1);
    if (any_format && key == "format") continue;
    const auto it = meta.find(key);
    const std::string found = it == meta.end() ? "(missing)" : it->second;
    if (found != value) {
      const char* what = key == "model"                                           ? "another model"
                         : key == "input_digest" || key == "input_tokens"          ? "another input"
                         : key == "plan_digest"                                    ? "another plan"
                                                                                    : "another shape or format";
      return absl::FailedPreconditionError(absl::StrCat("the recall store in ", dir, " belongs to ", what, ": its ",
                                                        key, " is ", found, ", this run's ", value));
    }
  }
  return meta;
}

}  // namespace

absl::StatusOr<std::unique_ptr<RecallStore>> RecallStore::Reopen(const std::string& dir,
                                                                 const RecallStoreInfo& info,
                                                                 const std::vector<int64_t>& slots) {
  if (static_cast<int64_t>(slots.size()) != info.num_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("recall store: ", slots.size(), " slot counts for ", info.num_layers, " layers"));
  }
  SNAPFILL_ASSIGN_OR_RETURN(
      auto meta, CheckMeta(dir, info, /*any_format=*/false, "resume with the --recall_dir the checkpoint was written with"));
  std::unique_ptr<RecallStore> s(new RecallStore(dir, info));
  s->made_dir_ = meta["made_dir"] == "1";
  SNAPFILL_RETURN_IF_ERROR(s->OpenFiles(/*create=*/false));
  for (int64_t l = 0; l < info.num_layers; ++l) {
    for (const LayerFile& f : s->LayerFiles(l)) {
      SNAPFILL_ASSIGN_OR_RETURN(const uint64_t bytes, s->FileBytes(l, f));
      const uint64_t want_bytes = static_cast<uint64_t>(slots[l]) * f.slot_bytes;
      if (bytes < want_bytes) {
        return absl::DataLossError(absl::StrCat("the recall store file ", s->FilePath(l, f.kind), " holds ",
                                                bytes / f.slot_bytes, " entries; the checkpoint recorded ", slots[l]));
      }
      // Entries written after the checkpoint are written again by the resumed run.
      if (::ftruncate(*f.fd, static_cast<off_t>(want_bytes)) != 0) {
        return FileErrnoStatus(errno, "cannot truncate", s->FilePath(l, f.kind));
      }
    }
    s->slots_[l] = slots[l];
  }
  return s;
}

absl::Status RecallStore::MarkComplete() {
  SNAPFILL_RETURN_IF_ERROR(Sync());
  return WriteFileAtomically(absl::StrCat(dir_, "/", kDoneName), "complete\n", /*overwrite=*/true);
}

absl::StatusOr<std::unique_ptr<RecallStore>> RecallStore::Open(const std::string& dir, const RecallStoreInfo& info) {
  SNAPFILL_ASSIGN_OR_RETURN(auto meta, CheckMeta(dir, info, /*any_format=*/true,
                                                 "give the --recall_dir that prefill --out wrote it to"));
  const std::string done = absl::StrCat(dir, "/", kDoneName);
  if (::access(done.c_str(), F_OK) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the recall store in ", dir, " is incomplete (its prefill did not finish; resume it with --resume)"));
  }
  RecallStoreInfo with_format = info;
  SNAPFILL_ASSIGN_OR_RETURN(with_format.format, ParseRecallFormat(meta["format"]));
  std::unique_ptr<RecallStore> s(new RecallStore(dir, with_format));
  s->made_dir_ = meta["made_dir"] == "1";
  SNAPFILL_RETURN_IF_ERROR(s->OpenFiles(/*create=*/false));
  for (int64_t l = 0; l < info.num_layers; ++l) {
    int64_t slots = -1;
    for (const LayerFile& f : s->LayerFiles(l)) {
      SNAPFILL_ASSIGN_OR_RETURN(const uint64_t bytes, s->FileBytes(l, f));
      const int64_t n = static_cast<int64_t>(bytes / f.slot_bytes);
      if (bytes % f.slot_bytes != 0 || (slots >= 0 && n != slots)) {
        return absl::DataLossError(absl::StrCat("the recall store file ", s->FilePath(l, f.kind), " (", bytes,
                                                " bytes) does not match the layer's other files"));
      }
      slots = n;
    }
    s->slots_[l] = slots;
  }
  return s;
}

void RecallStore::Encode(const float* x, int64_t vectors, uint8_t* out) const {
  if (info_.format == RecallFormat::kF16) {
    conversions_.to_half(x, reinterpret_cast<uint16_t*>(out), vectors * info_.head_dim);
  } else {
    conversions_.to_int8(x, out, vectors, info_.head_dim);
  }
}

void RecallStore::Decode(const uint8_t* in, int64_t vectors, float* x) const {
  if (info_.format == RecallFormat::kF16) {
    conversions_.from_half(reinterpret_cast<const uint16_t*>(in), x, vectors * info_.head_dim);
  } else {
    conversions_.from_int8(in, x, vectors, info_.head_dim);
  }
}

absl::Status RecallStore::WriteAll(int fd, const uint8_t* data, uint64_t n, uint64_t offset, const char* what,
                                   int64_t layer) {
  uint64_t done = 0;
  while (done < n) {
    const ssize_t w = ::pwrite(fd, data + done, n - done, static_cast<off_t>(offset + done));
    if (w < 0) {
      if (errno == EINTR) continue;
      return WriteFailed(errno, FilePath(layer, what));
    }
    done += static_cast<uint64_t>(w);
  }
  return absl::OkStatus();
}

absl::Status RecallStore::ReadAll(int fd, uint8_t* data, uint64_t n, uint64_t offset, const char* what,
                                  int64_t layer) {
  return ReadAllAt(fd, data, n, offset, FilePath(layer, what));
}

absl::Status RecallStore::CheckAppend(int64_t layer, int64_t n) const {
  if (layer < 0 || layer >= info_.num_layers || n < 0) {
    return absl::InvalidArgumentError(absl::StrCat("recall store: append of ", n, " to layer ", layer));
  }
  return absl::OkStatus();
}

absl::Status RecallStore::Append(int64_t layer, int64_t n, const int32_t* const* idx, const float* k, const float* v,
                                 int64_t head_stride, const int32_t* pos, int64_t pos_stride) {
  SNAPFILL_RETURN_IF_ERROR(CheckAppend(layer, n));
  if (n == 0) return absl::OkStatus();
  const int64_t heads = info_.num_kv_heads, d = info_.head_dim;
  // Slot-major records: slot i holds every head's entry idx[h][i].
  std::vector<int32_t>& p = pos_staging_;
  p.resize(n * heads);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t h = 0; h < heads; ++h) p[i * heads + h] = pos[h * pos_stride + idx[h][i]];
  }
  SNAPFILL_RETURN_IF_ERROR(WritePositions(layer, n, p.data()));
  staging_.resize(n * heads * d);
  for (auto [src, fds, kind] : {std::tuple{k, &key_fds_, "keys"}, std::tuple{v, &value_fds_, "values"}}) {
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t h = 0; h < heads; ++h) {
        std::memcpy(staging_.data() + (i * heads + h) * d, src + h * head_stride + idx[h][i] * d, d * sizeof(float));
      }
    }
    SNAPFILL_RETURN_IF_ERROR(WriteVectors(layer, n, staging_.data(), (*fds)[layer], kind));
  }
  slots_[layer] += n;
  return absl::OkStatus();
}

absl::Status RecallStore::AppendRecords(int64_t layer, int64_t n, const int32_t* pos, const uint8_t* k,
                                        const uint8_t* v) {
  SNAPFILL_RETURN_IF_ERROR(CheckAppend(layer, n));
  if (n == 0) return absl::OkStatus();
  // The values' file on a thread of its own while this one writes the
  // positions and the keys: a 7B layer's append into new page-cache pages
  // on two Zen 3 cores went from 4.5-5.3 to 2.7-4.0 ms in f16 and from
  // 2.3-2.6 to 1.5-1.8 ms in q8 (docs/BENCHMARKS.md). A device's
  // rows come while the host's cores have nothing else to do; Append, the
  // CPU's, stays on one thread, as its conversions take the kernels' team.
  auto write_values = [&] { return WriteRecords(layer, n, v, value_fds_[layer], "values"); };
  std::future<absl::Status> values;
  try {
    values = std::async(std::launch::async, write_values);
  } catch (const std::system_error&) {
    // (No thread to be had: one file after the other.)
  }
  absl::Status s = WritePositions(layer, n, pos);
  if (s.ok()) s = WriteRecords(layer, n, k, key_fds_[layer], "keys");
  const absl::Status vs = values.valid() ? values.get() : write_values();
  SNAPFILL_RETURN_IF_ERROR(s);
  SNAPFILL_RETURN_IF_ERROR(vs);
  slots_[layer] += n;
  return absl::OkStatus();
}

absl::Status RecallStore::WritePositions(int64_t layer, int64_t n, const int32_t* pos) {
  return WriteAll(pos_fds_[layer], reinterpret_cast<const uint8_t*>(pos), n * PosSlotBytes(),
                  slots_[layer] * PosSlotBytes(), "pos", layer);
}

absl::Status RecallStore::WriteVectors(int64_t layer, int64_t n, const float* x, int fd, const char* what) {
  buffer_.resize(n * KeySlotBytes());  // (values take as many bytes as keys)
  Encode(x, n * info_.num_kv_heads, buffer_.data());
  return WriteRecords(layer, n, buffer_.data(), fd, what);
}

absl::Status RecallStore::WriteRecords(int64_t layer, int64_t n, const uint8_t* records, int fd, const char* what) {
  return WriteAll(fd, records, n * KeySlotBytes(), slots_[layer] * KeySlotBytes(), what, layer);
}

absl::Status RecallStore::CheckRange(int64_t layer, int64_t first, int64_t n) const {
  if (layer < 0 || layer >= info_.num_layers || first < 0 || n < 0 || first + n > slots_[layer]) {
    return absl::OutOfRangeError(absl::StrCat("recall store: slots [", first, ", ", first + n, ") of layer ",
                                              layer, ", which holds ",
                                              layer >= 0 && layer < info_.num_layers ? slots_[layer] : 0));
  }
  return absl::OkStatus();
}

absl::Status RecallStore::ReadPositions(int64_t layer, int64_t first, int64_t n, int32_t* pos) {
  SNAPFILL_RETURN_IF_ERROR(CheckRange(layer, first, n));
  return ReadAll(pos_fds_[layer], reinterpret_cast<uint8_t*>(pos), n * PosSlotBytes(), first * PosSlotBytes(), "pos",
                 layer);
}

absl::Status RecallStore::ReadKeys(int64_t layer, int64_t first, int64_t n, float* k, int32_t* pos) {
  SNAPFILL_RETURN_IF_ERROR(ReadPositions(layer, first, n, pos));
  buffer_.resize(n * KeySlotBytes());
  SNAPFILL_RETURN_IF_ERROR(
      ReadAll(key_fds_[layer], buffer_.data(), n * KeySlotBytes(), first * KeySlotBytes(), "keys", layer));
  Decode(buffer_.data(), n * info_.num_kv_heads, k);
  return absl::OkStatus();
}

absl::Status RecallStore::ReadEntry(int64_t layer, int64_t head, int64_t slot, float* k, float* v, int32_t* pos) {
  if (layer < 0 || layer >= info_.num_layers || head < 0 || head >= info_.num_kv_heads || slot < 0 ||
      slot >= slots_[layer]) {
    return absl::OutOfRangeError(absl::StrCat("recall store: slot ", slot, " of layer ", layer, " head ", head));
  }
  const uint64_t vec = VectorBytes();
  buffer_.resize(std::max<uint64_t>(vec, sizeof(int32_t)));
  uint8_t* buf = buffer_.data();
  SNAPFILL_RETURN_IF_ERROR(
      ReadAll(pos_fds_[layer], buf, sizeof(int32_t), slot * PosSlotBytes() + head * sizeof(int32_t), "pos", layer));
  std::memcpy(pos, buf, sizeof(int32_t));
  SNAPFILL_RETURN_IF_ERROR(ReadAll(key_fds_[layer], buf, vec, slot * KeySlotBytes() + head * vec, "keys", layer));
  Decode(buf, 1, k);
  SNAPFILL_RETURN_IF_ERROR(ReadAll(value_fds_[layer], buf, vec, slot * ValueSlotBytes() + head * vec, "values", layer));
  Decode(buf, 1, v);
  return absl::OkStatus();
}

absl::Status RecallStore::Sync() {
  for (int64_t l = 0; l < info_.num_layers; ++l) {
    for (const LayerFile& f : LayerFiles(l)) {
      if (::fdatasync(*f.fd) != 0) return FileErrnoStatus(errno, "cannot sync", FilePath(l, f.kind));
    }
  }
  return absl::OkStatus();
}

absl::Status RecallStore::Remove() {
  absl::Status status;
  for (int64_t l = 0; l < info_.num_layers; ++l) {
    for (const LayerFile& f : LayerFiles(l)) {
      if (*f.fd >= 0) {
        ::close(*f.fd);
        *f.fd = -1;
      }
      const std::string path = FilePath(l, f.kind);
      if (::unlink(path.c_str()) != 0 && errno != ENOENT && status.ok()) {
        status = FileErrnoStatus(errno, "cannot remove", path);
      }
    }
  }
  const std::string done = absl::StrCat(dir_, "/", kDoneName);
  if (::unlink(done.c_str()) != 0 && errno != ENOENT && status.ok()) {
    status = FileErrnoStatus(errno, "cannot remove", done);
  }
  const std::string meta = absl::StrCat(dir_, "/", kMetaName);
  if (::unlink(meta.c_str()) != 0 && errno != ENOENT && status.ok()) {
    status = FileErrnoStatus(errno, "cannot remove", meta);
  }
  if (made_dir_ && ::rmdir(dir_.c_str()) != 0 && status.ok()) {
    status = FileErrnoStatus(errno, "cannot remove the directory", dir_);
  }
  std::fill(slots_.begin(), slots_.end(), 0);
  return status;
}

}  // namespace snapfill
