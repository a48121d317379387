// Where the engine reads its input's token ids from: by range, a chunk at a
// time, so that an input need not be one vector in memory (TokenSpool keeps
// a long one in a temporary file).
#ifndef SNAPFILL_TOKEN_SOURCE_H_
#define SNAPFILL_TOKEN_SOURCE_H_

#include <cstdint>
#include <cstring>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace snapfill {

class TokenSource {
 public:
  virtual ~TokenSource() = default;
  virtual int64_t size() const = 0;
  // Copies ids [start, start + count) to out. OutOfRange past size(); an
  // I/O error from a source on disk.
  virtual absl::Status Read(int64_t start, int64_t count, int32_t* out) const = 0;

 protected:
  absl::Status CheckRange(int64_t start, int64_t count) const {
    if (start < 0 || count < 0 || start + count > size()) {
      return absl::OutOfRangeError(absl::StrCat("token ids [", start, ", ", start + count,
                                                ") read from an input of ", size()));
    }
    return absl::OkStatus();
  }
};

// Ids that are in memory already (not owned).
class SpanTokenSource final : public TokenSource {
 public:
  SpanTokenSource(const int32_t* ids, int64_t n) : ids_(ids), n_(n) {}
  explicit SpanTokenSource(const std::vector<int32_t>& ids)
      : ids_(ids.data()), n_(static_cast<int64_t>(ids.size())) {}
  int64_t size() const override { return n_; }
  absl::Status Read(int64_t start, int64_t count, int32_t* out) const override {
    if (absl::Status s = CheckRange(start, count); !s.ok()) return s;
    if (count > 0) std::memcpy(out, ids_ + start, static_cast<size_t>(count) * sizeof(int32_t));
    return absl::OkStatus();
  }

 private:
  const int32_t* ids_;
  int64_t n_;
};

}  // namespace snapfill

#endif  // SNAPFILL_TOKEN_SOURCE_H_
