// snapfill tokenize: a model's token ids for a text, as llama.cpp's
// llama-tokenize prints them, so that a user can check what the model
// reads and the tests can compare vocabularies with llama.cpp. The text is
// taken as it is (no escape processing); special-token texts become their
// ids only with --parse_special. --input streams: a file of any size is
// tokenized as it is read and its ids printed as they are settled.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "snapfill/status.h"
#include "src/gguf/gguf_reader.h"
#include "src/tokenizer/tokenizer.h"
#include "tools/cli/commands.h"
#include "tools/cli/common.h"
#include "tools/cli/environment.h"
#include "tools/cli/flags.h"
#include "tools/cli/input.h"

namespace snapfill::cli {
namespace {

enum class Output { kIdAndPiece, kIds, kPieces };

// Prints ids as llama-tokenize does: "[1, 2, 3]" (--ids), the pieces one a
// line (--pieces), else "    id -> 'piece'" lines.
class Printer {
 public:
  Printer(const Tokenizer& tokenizer, Output output) : tokenizer_(tokenizer), output_(output) {}
  void Print(const std::vector<int32_t>& ids) {
    for (const int32_t id : ids) {
      const std::string piece = tokenizer_.TokenToPiece(id, /*render_special=*/true);
      switch (output_) {
        case Output::kIds:
          std::printf("%s%d", count_ == 0 ? "[" : ", ", id);
          break;
        case Output::kPieces:
          std::fwrite(piece.data(), 1, piece.size(), stdout);
          std::fputc('\n', stdout);
          break;
        case Output::kIdAndPiece:
          std::printf("%6d -> '", id);
          std::fwrite(piece.data(), 1, piece.size(), stdout);
          std::fputs("'\n", stdout);
          break;
      }
      ++count_;
    }
  }
  void Finish() {
    if (output_ == Output::kIds) std::puts(count_ == 0 ? "[]" : "]");
  }
  int64_t count() const { return count_; }

 private:
  const Tokenizer& tokenizer_;
  const Output output_;
  int64_t count_ = 0;
};

}  // namespace

absl::Status RunTokenize() {
  const std::string input_path = absl::GetFlag(FLAGS_input);
  const std::string prompt = absl::GetFlag(FLAGS_prompt);
  if (input_path.empty() == prompt.empty()) {
    return absl::InvalidArgumentError("give the text as --prompt TEXT or --input FILE (- for stdin), one of them");
  }
  if (absl::GetFlag(FLAGS_ids) && absl::GetFlag(FLAGS_pieces)) {
    return absl::InvalidArgumentError("--ids and --pieces are two outputs: give one");
  }
  const Output output = absl::GetFlag(FLAGS_ids)      ? Output::kIds
                        : absl::GetFlag(FLAGS_pieces) ? Output::kPieces
                                                      : Output::kIdAndPiece;
  std::unique_ptr<InputFile> file;
  if (!input_path.empty()) {
    SNAPFILL_ASSIGN_OR_RETURN(file, InputFile::Open(input_path, "--input"));
  }
  // The vocabulary alone: no weights are read.
  const std::string model_path = ResolveModelPath(absl::GetFlag(FLAGS_model));
  SNAPFILL_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> gguf, GgufFile::Open(model_path));
  SNAPFILL_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tokenizer, Tokenizer::FromGguf(*gguf));
  const bool add_special = absl::GetFlag(FLAGS_add_special);
  const bool parse_special = absl::GetFlag(FLAGS_parse_special);
  Printer printer(*tokenizer, output);
  if (file == nullptr) {
    printer.Print(tokenizer->Encode(prompt, add_special, parse_special));
  } else {
    StreamingEncoder encoder(*tokenizer, add_special, parse_special);
    std::vector<char> buffer(StreamingEncoder::kDefaultBlockBytes);
    std::vector<int32_t> ids;
    uint64_t read_bytes = 0;
    while (true) {
      SNAPFILL_ASSIGN_OR_RETURN(const size_t got, file->Read(buffer.data(), buffer.size()));
      if (got == 0) break;
      read_bytes += got;
      encoder.Add(std::string_view(buffer.data(), got), &ids);
      printer.Print(ids);
      ids.clear();
    }
    SNAPFILL_RETURN_IF_ERROR(file->CheckUnchanged(read_bytes, /*read_to_end=*/true));
    encoder.Finish(&ids);
    printer.Print(ids);
  }
  printer.Finish();
  if (absl::GetFlag(FLAGS_verbosity) >= 1) {
    std::fprintf(stderr, "%lld tokens\n", static_cast<long long>(printer.count()));
  }
  return absl::OkStatus();
}

}  // namespace snapfill::cli
