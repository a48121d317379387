// A long input read as a stream: the file (or standard input) in blocks,
// tokenized as it is read (StreamingEncoder) inside the prompt's frame, the
// ids into a TokenSpool. Resident memory stays about a block of text and
// the spool's buffer however large the input; the ids are exactly those of
// tokenizing the whole text at once.
#ifndef SNAPFILL_TOOLS_CLI_INPUT_H_
#define SNAPFILL_TOOLS_CLI_INPUT_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "src/base/token_spool.h"
#include "src/engine/prompt.h"
#include "src/tokenizer/tokenizer.h"

namespace snapfill::cli {

// An input opened for reading: a regular file, a FIFO or a device, or "-"
// for standard input. Opened before the model is loaded, so that a missing
// file is refused first.
class InputFile {
 public:
  // NotFound / PermissionDenied / InvalidArgument (a directory), each
  // naming `flag` and the path.
  static absl::StatusOr<std::unique_ptr<InputFile>> Open(const std::string& path, const char* flag = "--input");
  ~InputFile();
  const std::string& path() const { return path_; }
  // The size when opened; -1 for a pipe or device (or standard input that
  // is a file read from elsewhere than its start).
  int64_t size() const { return size_; }
  // Reads up to `n` bytes (0 at the end), retrying EINTR; errors name the
  // path.
  absl::StatusOr<size_t> Read(char* buffer, size_t n);
  // For a regular file: FailedPrecondition if it changed since it was
  // opened (size or modification time), or if `bytes_read` (the whole of
  // it, read to its end) is not its size then.
  absl::Status CheckUnchanged(uint64_t bytes_read, bool read_to_end) const;

 private:
  InputFile() = default;
  std::string path_;
  const char* flag_ = "--input";
  int fd_ = -1;
  bool own_fd_ = false;
  int64_t size_ = -1;
  int64_t mtime_ns_ = 0;
};

struct InputOptions {
  // The first max_tokens of the document's tokens (0: all); reading stops
  // as soon as more than that are known.
  int64_t max_tokens = 0;
  // Append the frame's suffix (the user turn's closing and the question);
  // prefill stores the prefix and the document only.
  bool with_suffix = true;
  TokenSpool::Options spool;
  size_t block_bytes = StreamingEncoder::kDefaultBlockBytes;
  // A progress line on stderr for inputs of 64 MiB and more (or of unknown size).
  bool progress = false;
  const char* progress_tag = "[snapfill]";
};

struct InputTokens {
  std::unique_ptr<TokenSpool> tokens;  // prefix, document, suffix
  int64_t document_tokens = 0;         // the document's own (after max_tokens)
  // The document's tokens known when reading stopped: all of them where it
  // was read to its end, else more than max_tokens (the whole is not known).
  int64_t document_tokens_seen = 0;
  bool read_to_end = true;
  int64_t document_end = 0;            // prefix and document
  uint64_t bytes_read = 0;
  double seconds = 0;
  // Bytes that are not UTF-8, and the first one's offset.
  uint64_t invalid_utf8 = 0;
  uint64_t first_invalid_utf8 = 0;
  // The most text the encoder held at once.
  uint64_t held_bytes = 0;
};

// InvalidArgument for an empty input; the input's read errors and
// CheckUnchanged's; the spool's (a full disk).
absl::StatusOr<InputTokens> TokenizeInput(InputFile& input, const Tokenizer& tokenizer, const PromptFrame& frame,
                                          const InputOptions& options);

// What TokenizeInput holds at most beside the process: the read buffer,
// the encoder's working set, and the spool's memory.
uint64_t TokenizeWorkingSetBytes(const InputOptions& options);

}  // namespace snapfill::cli

#endif  // SNAPFILL_TOOLS_CLI_INPUT_H_
