// Crash-safe file output: a file is either absent, the old version, or the
// complete new version, never half-written.
//
// AtomicFileWriter writes to a temporary file in the target's directory,
// named `.<name>.tmp.<pid>` (so it is hidden and on the same filesystem),
// fsyncs it, renames it over the target and fsyncs the directory, so the
// rename itself survives a crash. On any error, and when the writer is
// destroyed without Commit(), the temporary file is removed.
//
// Refusals (each message names the target path):
//   AlreadyExists       the target exists and overwrite is false
//                       ("<path> exists; use --force to overwrite"); also
//                       when another process creates it before the rename
//   FailedPrecondition  the target is a directory or another non-regular file
//   ResourceExhausted   the disk is full (ENOSPC, EDQUOT) at any step:
//                       "disk full while writing <path>: ..."
//   other errno codes   absl::ErrnoToStatusCode (NotFound for a missing
//                       directory, PermissionDenied, ...), "<what> <path>:
//                       <strerror>"
#ifndef SNAPFILL_BASE_FILE_UTIL_H_
#define SNAPFILL_BASE_FILE_UTIL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace snapfill {

class AtomicFileWriter {
 public:
  // Checks the target and creates the temporary file. The target is checked
  // again at Commit(), so a file that appears in between is not clobbered
  // either.
  static absl::StatusOr<std::unique_ptr<AtomicFileWriter>> Create(const std::string& path,
                                                                  bool overwrite);
  // Removes the temporary file unless Commit() succeeded.
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  // Appends bytes (buffered). After the first error every later call
  // returns that error and the temporary file is already gone.
  absl::Status Write(std::string_view data);
  // Flushes, fsyncs, renames over the target and fsyncs the directory.
  absl::Status Commit();

  const std::string& path() const { return path_; }
  const std::string& temp_path() const { return temp_path_; }
  // Bytes accepted by Write() so far.
  uint64_t bytes_written() const { return bytes_written_; }

 private:
  AtomicFileWriter(std::string path, std::string temp_path, int fd, bool overwrite);
  absl::Status Flush();
  // Records `status` as the writer's error, closes and removes the
  // temporary file, and returns it.
  absl::Status Fail(absl::Status status);

  std::string path_;
  std::string temp_path_;
  int fd_ = -1;
  bool overwrite_ = false;
  bool committed_ = false;
  absl::Status error_;
  std::string buffer_;
  uint64_t bytes_written_ = 0;
};

// Writes `data` to `path` through an AtomicFileWriter.
absl::Status WriteFileAtomically(const std::string& path, std::string_view data,
                                 bool overwrite);

// The write step AtomicFileWriter uses: writes all of `data` to `fd`,
// retrying short writes and EINTR. Errors name `path` (ResourceExhausted
// "disk full while writing <path>: ..." for ENOSPC). Exposed so tests can
// point it at /dev/full.
absl::Status WriteAll(int fd, std::string_view data, std::string_view path);

// Reads exactly `bytes` bytes of `fd` from `offset` into `dst` with pread
// (retrying short reads and EINTR; the file position is not used). Errors
// name `path`; DataLoss if the file ends first.
absl::Status ReadAllAt(int fd, void* dst, uint64_t bytes, uint64_t offset, std::string_view path);

// The Status for a failed system call: the code from the errno, the message
// "<what> <path>: <strerror>", or "disk full while writing <path>: <strerror>"
// for ENOSPC and EDQUOT whatever `what` was.
absl::Status FileErrnoStatus(int err, std::string_view what, std::string_view path);

}  // namespace snapfill

#endif  // SNAPFILL_BASE_FILE_UTIL_H_
