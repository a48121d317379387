#include "src/base/token_spool.h"

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "snapfill/status.h"
#include "src/base/file_util.h"

namespace snapfill {
namespace {

constexpr int64_t kBufferIds = int64_t{1} << 18;  // 1 MiB a write

XXH3_state_t* State(void* p) { return static_cast<XXH3_state_t*>(p); }

}  // namespace

TokenSpool::TokenSpool(Options options) : options_(std::move(options)) {
  hash_state_ = XXH3_createState();
  XXH3_64bits_reset(State(hash_state_));
}

TokenSpool::~TokenSpool() {
  if (fd_ >= 0) ::close(fd_);
  XXH3_freeState(State(hash_state_));
}

uint64_t TokenSpool::MaxResidentBytes(const Options& options) {
  // At the spill, the ids kept so far are written out from memory beside
  // the new write buffer.
  return static_cast<uint64_t>(options.memory_ids + kBufferIds) * sizeof(int32_t);
}

uint64_t TokenSpool::resident_bytes() const {
  return (memory_.size() + buffer_.capacity()) * sizeof(int32_t);
}

uint64_t TokenSpool::digest() const { return XXH3_64bits_digest(State(hash_state_)); }

absl::Status TokenSpool::Fail(absl::Status status) {
  error_ = status;
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  memory_ = {};
  buffer_ = {};
  return status;
}

absl::Status TokenSpool::Spill() {
  const std::string where = absl::StrCat("the token spool in ", options_.dir);
  int fd = ::open(options_.dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0 && (errno == EOPNOTSUPP || errno == EISDIR || errno == EINVAL)) {
    // A filesystem without O_TMPFILE: a named file, unlinked at once.
    std::string name = absl::StrCat(options_.dir, "/.snapfill-tokens.XXXXXX");
    fd = ::mkostemp(name.data(), O_CLOEXEC);
    if (fd >= 0) ::unlink(name.c_str());
  }
  if (fd < 0) {
    const int err = errno;
    return Fail(FileErrnoStatus(err, "cannot create", where));
  }
  fd_ = fd;
  buffer_.reserve(kBufferIds);
  const std::string_view bytes(reinterpret_cast<const char*>(memory_.data()), memory_.size() * sizeof(int32_t));
  if (absl::Status s = WriteAll(fd_, bytes, where); !s.ok()) return Fail(s);
  on_file_ = static_cast<int64_t>(memory_.size());
  memory_ = {};
  return absl::OkStatus();
}

absl::Status TokenSpool::Append(const int32_t* ids, int64_t n) {
  if (!error_.ok()) return error_;
  if (finished_) return absl::FailedPreconditionError("token spool: Append after Finish");
  if (n <= 0) return absl::OkStatus();
  XXH3_64bits_update(State(hash_state_), ids, static_cast<size_t>(n) * sizeof(int32_t));
  size_ += n;
  if (fd_ < 0 && size_ <= options_.memory_ids) {
    // Reserved whole, so it never moves: only the pages written are resident.
    if (memory_.capacity() == 0) memory_.reserve(static_cast<size_t>(options_.memory_ids));
    memory_.insert(memory_.end(), ids, ids + n);
    return absl::OkStatus();
  }
  if (fd_ < 0) SNAPFILL_RETURN_IF_ERROR(Spill());
  while (n > 0) {
    const int64_t take = std::min<int64_t>(n, kBufferIds - static_cast<int64_t>(buffer_.size()));
    buffer_.insert(buffer_.end(), ids, ids + take);
    ids += take;
    n -= take;
    if (static_cast<int64_t>(buffer_.size()) == kBufferIds) {
      const std::string_view bytes(reinterpret_cast<const char*>(buffer_.data()), buffer_.size() * sizeof(int32_t));
      if (absl::Status s = WriteAll(fd_, bytes, absl::StrCat("the token spool in ", options_.dir)); !s.ok()) {
        return Fail(s);
      }
      on_file_ += static_cast<int64_t>(buffer_.size());
      buffer_.clear();
    }
  }
  return absl::OkStatus();
}

absl::Status TokenSpool::Finish() {
  if (!error_.ok()) return error_;
  finished_ = true;
  if (fd_ < 0) return absl::OkStatus();
  const std::string where = absl::StrCat("the token spool in ", options_.dir);
  const std::string_view bytes(reinterpret_cast<const char*>(buffer_.data()), buffer_.size() * sizeof(int32_t));
  if (absl::Status s = WriteAll(fd_, bytes, where); !s.ok()) return Fail(s);
  on_file_ += static_cast<int64_t>(buffer_.size());
  buffer_ = {};
  return absl::OkStatus();
}

absl::Status TokenSpool::Read(int64_t start, int64_t count, int32_t* out) const {
  SNAPFILL_RETURN_IF_ERROR(CheckRange(start, count));
  if (!error_.ok()) return error_;
  if (count == 0) return absl::OkStatus();
  if (fd_ < 0) {
    std::memcpy(out, memory_.data() + start, static_cast<size_t>(count) * sizeof(int32_t));
    return absl::OkStatus();
  }
  if (!finished_) return absl::FailedPreconditionError("token spool: Read before Finish");
  return ReadAllAt(fd_, out, static_cast<uint64_t>(count) * sizeof(int32_t),
                   static_cast<uint64_t>(start) * sizeof(int32_t), absl::StrCat("the token spool in ", options_.dir));
}

}  // namespace snapfill
