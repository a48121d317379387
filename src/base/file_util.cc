#include "src/base/file_util.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"

namespace snapfill {
namespace {

// This Abseil's StrCat takes absl::string_view, which is not std::string_view.
absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// Large enough that the write syscalls cost nothing next to the bytes.
constexpr size_t kBufferBytes = size_t{1} << 20;

// "dir/name" -> {"dir", "name"}; "name" -> {".", "name"}; "/name" -> {"/", "name"}.
std::pair<std::string, std::string> SplitPath(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return {".", path};
  return {slash == 0 ? "/" : path.substr(0, slash), path.substr(slash + 1)};
}

absl::Status AlreadyExists(const std::string& path) {
  return absl::AlreadyExistsError(absl::StrCat(path, " exists; use --force to overwrite"));
}

// Checks what is at `path` now: nothing, or a regular file we may replace.
absl::Status CheckTarget(const std::string& path, bool overwrite) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return FileErrnoStatus(errno, "cannot write", path);
  }
  if (S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot write ", path, ": it is a directory"));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot write ", path, ": it exists and is not a regular file"));
  }
  if (!overwrite) return AlreadyExists(path);
  return absl::OkStatus();
}

// Renames without replacing an existing target. renameat2(RENAME_NOREPLACE)
// is atomic; filesystems without it get link()+unlink(), which fails with
// EEXIST just the same. Returns 0 or -1 with errno set.
int RenameNoReplace(const char* from, const char* to) {
#ifdef RENAME_NOREPLACE
  if (::renameat2(AT_FDCWD, from, AT_FDCWD, to, RENAME_NOREPLACE) == 0) return 0;
  if (errno != EINVAL && errno != ENOSYS) return -1;
#endif
  if (::link(from, to) != 0) return -1;
  ::unlink(from);
  return 0;
}

}  // namespace

absl::Status FileErrnoStatus(int err, std::string_view what, std::string_view path) {
  if (err == ENOSPC || err == EDQUOT) {
    return absl::ResourceExhaustedError(
        absl::StrCat("disk full while writing ", Sv(path), ": ", std::strerror(err)));
  }
  return absl::Status(absl::ErrnoToStatusCode(err),
                      absl::StrCat(Sv(what), " ", Sv(path), ": ", std::strerror(err)));
}

absl::Status WriteAll(int fd, std::string_view data, std::string_view path) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return FileErrnoStatus(errno, "cannot write", path);
    }
    if (n == 0) return FileErrnoStatus(ENOSPC, "cannot write", path);
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status ReadAllAt(int fd, void* dst, uint64_t bytes, uint64_t offset, std::string_view path) {
  auto* out = static_cast<uint8_t*>(dst);
  while (bytes > 0) {
    const ssize_t n = ::pread(fd, out, bytes, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return FileErrnoStatus(errno, "cannot read", path);
    }
    if (n == 0) {
      return absl::DataLossError(absl::StrCat(std::string(path), " ends at byte ", offset, ", ", bytes,
                                              " bytes short of what was to be read"));
    }
    out += n;
    offset += static_cast<uint64_t>(n);
    bytes -= static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
}

namespace {

// A writer killed before it could clean up (SIGKILL, power loss) leaves
// its `.<name>.tmp.<pid>[.<n>]`; the next writer of the same target removes
// those whose process is gone (this host only: pids are local).
void RemoveStaleTemporaries(const std::string& dir, const std::string& name) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return;
  const std::string prefix = absl::StrCat(".", name, ".tmp.");
  while (const struct dirent* e = ::readdir(d)) {
    const std::string_view entry(e->d_name);
    if (entry.size() <= prefix.size() || entry.substr(0, prefix.size()) != prefix) continue;
    const std::string_view rest = entry.substr(prefix.size());
    const std::string pid_text(rest.substr(0, rest.find('.')));
    char* end = nullptr;
    const long pid = std::strtol(pid_text.c_str(), &end, 10);
    if (pid_text.empty() || *end != '\0' || pid <= 0) continue;
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;  // alive, or unknown
    ::unlinkat(::dirfd(d), e->d_name, 0);
  }
  ::closedir(d);
}

}  // namespace

absl::StatusOr<std::unique_ptr<AtomicFileWriter>> AtomicFileWriter::Create(
    const std::string& path, bool overwrite) {
  if (path.empty()) return absl::InvalidArgumentError("cannot write a file with an empty path");
  const auto [dir, name] = SplitPath(path);
  if (name.empty() || name == "." || name == "..") {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot write ", path, ": it is a directory"));
  }
  if (absl::Status s = CheckTarget(path, overwrite); !s.ok()) return s;
  RemoveStaleTemporaries(dir, name);

  // Hidden, in the same directory (rename must not cross filesystems), and
  // unique: the pid, then a counter for several writers in one process.
  static std::atomic<uint64_t> counter{0};
  const std::string base = absl::StrCat(dir == "/" ? "" : dir, "/.", name, ".tmp.", ::getpid());
  std::string temp = base;
  int fd = -1;
  for (int attempt = 0; attempt < 100; ++attempt) {
    fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd >= 0 || errno != EEXIST) break;
    temp = absl::StrCat(base, ".", counter.fetch_add(1) + 1);
  }
  if (fd < 0) {
    return FileErrnoStatus(errno, "cannot create a temporary file for",
                           absl::StrCat(path, " (", temp, ")"));
  }
  return std::unique_ptr<AtomicFileWriter>(
      new AtomicFileWriter(path, std::move(temp), fd, overwrite));
}

AtomicFileWriter::AtomicFileWriter(std::string path, std::string temp_path, int fd,
                                   bool overwrite)
    : path_(std::move(path)), temp_path_(std::move(temp_path)), fd_(fd), overwrite_(overwrite) {
  buffer_.reserve(kBufferBytes);
}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_ && error_.ok()) ::unlink(temp_path_.c_str());
}

absl::Status AtomicFileWriter::Fail(absl::Status status) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  ::unlink(temp_path_.c_str());
  error_ = status;
  return status;
}

absl::Status AtomicFileWriter::Flush() {
  if (buffer_.empty()) return absl::OkStatus();
  absl::Status s = WriteAll(fd_, buffer_, path_);
  buffer_.clear();
  if (!s.ok()) return Fail(std::move(s));
  return absl::OkStatus();
}

absl::Status AtomicFileWriter::Write(std::string_view data) {
  if (!error_.ok()) return error_;
  if (committed_) {
    return absl::FailedPreconditionError(absl::StrCat(path_, " is already committed"));
  }
  bytes_written_ += data.size();
  if (buffer_.size() + data.size() <= kBufferBytes) {
    buffer_.append(data);
    return absl::OkStatus();
  }
  if (absl::Status s = Flush(); !s.ok()) return s;
  if (data.size() >= kBufferBytes) {
    absl::Status s = WriteAll(fd_, data, path_);
    if (!s.ok()) return Fail(std::move(s));
    return absl::OkStatus();
  }
  buffer_.append(data);
  return absl::OkStatus();
}

absl::Status AtomicFileWriter::Commit() {
  if (!error_.ok()) return error_;
  if (committed_) return absl::OkStatus();
  if (absl::Status s = Flush(); !s.ok()) return s;
  // Data reach the disk before the name points at them; otherwise a crash
  // after the rename could leave an empty or partial file under the name.
  if (::fsync(fd_) != 0) return Fail(FileErrnoStatus(errno, "cannot sync", path_));
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) return Fail(FileErrnoStatus(errno, "cannot close", path_));

  if (overwrite_) {
    // The target may have become a directory since Create(); rename() would
    // then fail with EISDIR, which Fail() reports.
    if (absl::Status s = CheckTarget(path_, true); !s.ok()) return Fail(std::move(s));
    if (::rename(temp_path_.c_str(), path_.c_str()) != 0) {
      return Fail(FileErrnoStatus(errno, "cannot rename the temporary file over", path_));
    }
  } else if (RenameNoReplace(temp_path_.c_str(), path_.c_str()) != 0) {
    if (errno == EEXIST) return Fail(AlreadyExists(path_));
    return Fail(FileErrnoStatus(errno, "cannot rename the temporary file to", path_));
  }
  committed_ = true;

  // Make the rename itself durable. Some filesystems cannot sync a
  // directory (EINVAL); the file is complete either way.
  const std::string dir = SplitPath(path_).first;
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    const int rc = ::fsync(dfd);
    const int err = errno;
    ::close(dfd);
    if (rc != 0 && err != EINVAL && err != EROFS) {
      return FileErrnoStatus(err, "wrote but could not sync the directory of", path_);
    }
  }
  return absl::OkStatus();
}

absl::Status WriteFileAtomically(const std::string& path, std::string_view data,
                                 bool overwrite) {
  auto writer = AtomicFileWriter::Create(path, overwrite);
  if (!writer.ok()) return writer.status();
  if (absl::Status s = (*writer)->Write(data); !s.ok()) return s;
  return (*writer)->Commit();
}

}  // namespace snapfill
