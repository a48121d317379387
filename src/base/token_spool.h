// The token ids of an input, written once in order and then read by range
// (a TokenSource). The first `memory_ids` stay in memory; past them every id
// goes to a temporary file, so that resident memory does not grow with the
// input. The file is unlinked as soon as it is made (O_TMPFILE, or mkstemp
// and unlink), so nothing is left behind however the process ends.
#ifndef SNAPFILL_BASE_TOKEN_SPOOL_H_
#define SNAPFILL_BASE_TOKEN_SPOOL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "snapfill/token_source.h"

namespace snapfill {

class TokenSpool final : public TokenSource {
 public:
  struct Options {
    // Where the file goes once the ids outgrow memory_ids.
    std::string dir = "/tmp";
    int64_t memory_ids = int64_t{1} << 22;  // 16 MiB
  };
  explicit TokenSpool(Options options);
  ~TokenSpool() override;
  TokenSpool(const TokenSpool&) = delete;
  TokenSpool& operator=(const TokenSpool&) = delete;

  // Appends ids. ResourceExhausted "disk full while writing the token spool
  // in DIR" when the file cannot grow, other errno codes for a directory
  // that cannot take the file; after an error the spool is unusable.
  absl::Status Append(const int32_t* ids, int64_t n);
  absl::Status Append(const std::vector<int32_t>& ids) {
    return Append(ids.data(), static_cast<int64_t>(ids.size()));
  }
  // Writes out what is buffered; Read() needs it.
  absl::Status Finish();

  int64_t size() const override { return size_; }
  absl::Status Read(int64_t start, int64_t count, int32_t* out) const override;

  // XXH3-64 of every id appended, as TokenDigest() of them in one vector.
  uint64_t digest() const;
  bool on_disk() const { return fd_ >= 0; }
  // What the ids hold in memory: those kept there, and the write buffer.
  uint64_t resident_bytes() const;
  const std::string& dir() const { return options_.dir; }
  // The most that resident_bytes() can be with these options.
  static uint64_t MaxResidentBytes(const Options& options);

 private:
  absl::Status Spill();
  absl::Status Fail(absl::Status status);

  Options options_;
  std::vector<int32_t> memory_;  // the first ids, or all of them below memory_ids
  std::vector<int32_t> buffer_;  // ids not yet written to the file
  int fd_ = -1;
  int64_t size_ = 0;
  int64_t on_file_ = 0;  // ids in the file
  bool finished_ = false;
  absl::Status error_;
  void* hash_state_ = nullptr;  // XXH3_state_t
};

}  // namespace snapfill

#endif  // SNAPFILL_BASE_TOKEN_SPOOL_H_
