#include "tools/cli/input.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "snapfill/status.h"
#include "src/base/file_util.h"
#include "src/base/sys_stats.h"
#include "src/tokenizer/unicode.h"
#include "tools/cli/common.h"

namespace snapfill::cli {
namespace {

constexpr size_t kReadBytes = size_t{1} << 18;
constexpr int64_t kProgressFromBytes = int64_t{64} << 20;

int64_t MtimeNs(const struct stat& st) {
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
}

// Counts the bytes that are not UTF-8 in a stream given in pieces: a
// sequence cut by a piece's end is judged with the next piece.
class Utf8Counter {
 public:
  void Add(std::string_view bytes) {
    carry_.append(bytes);
    // Hold back a lead byte (and what follows it) whose sequence may go on.
    size_t keep = carry_.size();
    for (size_t back = 1; back <= 3 && back <= carry_.size(); ++back) {
      const uint8_t b = static_cast<uint8_t>(carry_[carry_.size() - back]);
      if ((b & 0xC0) == 0x80) continue;
      if (b >= 0xC0 && Utf8LenFromLead(static_cast<char>(b)) > back) keep = carry_.size() - back;
      break;
    }
    Count(std::string_view(carry_).substr(0, keep));
    carry_.erase(0, keep);
  }
  void Finish() {
    Count(carry_);
    carry_.clear();
  }
  uint64_t invalid = 0;
  uint64_t first = 0;

 private:
  void Count(std::string_view text) {
    const std::vector<size_t> bad = InvalidUtf8Positions(text);
    if (!bad.empty() && invalid == 0) first = offset_ + bad[0];
    invalid += bad.size();
    offset_ += text.size();
  }
  std::string carry_;
  uint64_t offset_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<InputFile>> InputFile::Open(const std::string& path, const char* flag) {
  std::unique_ptr<InputFile> f(new InputFile());
  f->path_ = path;
  f->flag_ = flag;
  if (path == "-") {
    f->fd_ = STDIN_FILENO;
  } else {
    f->fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (f->fd_ < 0) {
      const int err = errno;
      if (err == ENOENT) return absl::NotFoundError(absl::StrCat(flag, " ", path, ": no such file"));
      return absl::PermissionDeniedError(absl::StrCat(flag, " ", path, ": cannot open: ", std::strerror(err)));
    }
    f->own_fd_ = true;
  }
  struct stat st {};
  if (::fstat(f->fd_, &st) != 0) {
    return absl::PermissionDeniedError(absl::StrCat(flag, " ", path, ": ", std::strerror(errno)));
  }
  if (S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " ", path, " is a directory, not a file"));
  }
  // A regular file (standard input too, when it is one read from its start)
  // has a size to show progress against and to check it kept.
  if (S_ISREG(st.st_mode) && ::lseek(f->fd_, 0, SEEK_CUR) == 0) {
    f->size_ = static_cast<int64_t>(st.st_size);
    f->mtime_ns_ = MtimeNs(st);
    // Read once, front to back.
    ::posix_fadvise(f->fd_, 0, 0, POSIX_FADV_SEQUENTIAL);
  }
  return f;
}

InputFile::~InputFile() {
  if (own_fd_) ::close(fd_);
}

absl::StatusOr<size_t> InputFile::Read(char* buffer, size_t n) {
  while (true) {
    const ssize_t got = ::read(fd_, buffer, n);
    if (got >= 0) return static_cast<size_t>(got);
    if (errno != EINTR) return FileErrnoStatus(errno, "error reading", path_);
  }
}

absl::Status InputFile::CheckUnchanged(uint64_t bytes_read, bool read_to_end) const {
  if (size_ < 0) return absl::OkStatus();
  struct stat st {};
  if (::fstat(fd_, &st) != 0) return absl::OkStatus();
  const bool changed = static_cast<int64_t>(st.st_size) != size_ || MtimeNs(st) != mtime_ns_ ||
                       (read_to_end && static_cast<int64_t>(bytes_read) != size_);
  if (!changed) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrFormat(
      "%s %s changed while it was read (%d bytes when opened, %d now, %d read%s): its tokens would "
      "mix two versions; run again once it is complete, or give a copy",
      flag_, path_, size_, static_cast<int64_t>(st.st_size), bytes_read,
      MtimeNs(st) != mtime_ns_ ? ", modified since" : ""));
}

uint64_t TokenizeWorkingSetBytes(const InputOptions& options) {
  return kReadBytes + StreamingEncoder::WorkingSetBytes(options.block_bytes) +
         TokenSpool::MaxResidentBytes(options.spool);
}

absl::StatusOr<InputTokens> TokenizeInput(InputFile& input, const Tokenizer& tokenizer, const PromptFrame& frame,
                                          const InputOptions& options) {
  Stopwatch watch;
  InputTokens result;
  result.tokens = std::make_unique<TokenSpool>(options.spool);
  TokenSpool& spool = *result.tokens;
  SNAPFILL_RETURN_IF_ERROR(spool.Append(frame.prefix));
  StreamingEncoder encoder(tokenizer, frame.document_add_special, /*parse_special=*/false, options.block_bytes);
  Utf8Counter utf8;
  std::vector<char> buffer(kReadBytes);
  std::vector<int32_t> ids;
  int64_t seen = 0;  // document ids known so far
  const int64_t max_tokens = options.max_tokens > 0 ? options.max_tokens : INT64_MAX;
  // Appends the document's ids up to max_tokens; false once more are known.
  auto take = [&]() -> absl::StatusOr<bool> {
    const int64_t room = std::max<int64_t>(0, max_tokens - seen);
    const int64_t n = std::min<int64_t>(room, static_cast<int64_t>(ids.size()));
    SNAPFILL_RETURN_IF_ERROR(spool.Append(ids.data(), n));
    seen += static_cast<int64_t>(ids.size());
    ids.clear();
    return seen <= max_tokens;
  };
  const bool show = options.progress && (input.size() < 0 || input.size() >= kProgressFromBytes);
  const bool tty = isatty(fileno(stderr)) != 0;
  double last_print = 0;
  auto print = [&](bool done) {
    const double now = watch.Seconds();
    if (!show || (!done && now - last_print < (tty ? 0.5 : 10.0))) return;
    last_print = now;
    const double rate = result.bytes_read / std::max(now, 1e-9);
    std::string of;
    if (input.size() > 0) {
      of = absl::StrFormat(" of %s (%.1f%%) | ETA %s", HumanBytes(input.size()),
                           100.0 * result.bytes_read / input.size(),
                           HumanSeconds((input.size() - static_cast<double>(result.bytes_read)) / std::max(rate, 1.0)));
    }
    std::fprintf(stderr, "%s%s tokenizing: %s%s | %lld tokens | %s/s%s", tty ? "\r" : "", options.progress_tag,
                 HumanBytes(result.bytes_read).c_str(), done ? "" : of.c_str(), (long long)std::min(seen, max_tokens),
                 HumanBytes(static_cast<uint64_t>(rate)).c_str(), tty ? (done ? "   \n" : "   ") : "\n");
  };
  bool stopped = false;  // by max_tokens
  while (true) {
    SNAPFILL_ASSIGN_OR_RETURN(const size_t got, input.Read(buffer.data(), buffer.size()));
    if (got == 0) break;
    const std::string_view bytes(buffer.data(), got);
    result.bytes_read += bytes.size();
    utf8.Add(bytes);
    encoder.Add(bytes, &ids);
    SNAPFILL_ASSIGN_OR_RETURN(const bool more, take());
    print(false);
    if (!more) {
      stopped = true;
      break;
    }
  }
  if (result.bytes_read == 0) {
    return absl::InvalidArgumentError(absl::StrCat("--input ", input.path(), " is empty"));
  }
  SNAPFILL_RETURN_IF_ERROR(input.CheckUnchanged(result.bytes_read, /*read_to_end=*/!stopped));
  if (!stopped) {
    utf8.Finish();
    encoder.Finish(&ids);
    SNAPFILL_ASSIGN_OR_RETURN(const bool more, take());
    (void)more;
  }
  result.document_tokens = std::min(seen, max_tokens);
  result.document_tokens_seen = seen;
  result.read_to_end = !stopped;
  result.document_end = static_cast<int64_t>(frame.prefix.size()) + result.document_tokens;
  if (options.with_suffix) SNAPFILL_RETURN_IF_ERROR(spool.Append(frame.suffix));
  SNAPFILL_RETURN_IF_ERROR(spool.Finish());
  result.invalid_utf8 = utf8.invalid;
  result.first_invalid_utf8 = utf8.first;
  result.held_bytes = encoder.peak_held_bytes();
  result.seconds = watch.Seconds();
  print(true);
  return result;
}

}  // namespace snapfill::cli
