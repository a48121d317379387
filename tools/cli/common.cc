#include "tools/cli/common.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "snapfill/status.h"
#include "tools/cli/flags.h"

namespace snapfill::cli {

std::string HumanBytes(uint64_t b) {
  if (b >= (uint64_t{1} << 30)) return absl::StrFormat("%.2f GiB", b / double(uint64_t{1} << 30));
  if (b >= (uint64_t{1} << 20)) return absl::StrFormat("%.1f MiB", b / double(uint64_t{1} << 20));
  if (b >= 1024) return absl::StrFormat("%.1f KiB", b / 1024.0);
  return absl::StrCat(b, " B");
}

std::string HumanSeconds(double s) {
  if (!(s >= 0) || s > 1e8) return "?";
  const int64_t t = static_cast<int64_t>(s + 0.5);
  if (t >= 3600) return absl::StrFormat("%dh%02dm", t / 3600, (t % 3600) / 60);
  if (t >= 60) return absl::StrFormat("%dm%02ds", t / 60, t % 60);
  return absl::StrFormat("%.1fs", s);
}

absl::StatusOr<std::string> ReadInput(const std::string& path, const char* flag) {
  std::ostringstream ss;
  if (path == "-") {
    ss << std::cin.rdbuf();
    return ss.str();
  }
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    const int err = errno;
    if (err == ENOENT) return absl::NotFoundError(absl::StrCat(flag, " ", path, ": no such file"));
    return absl::PermissionDeniedError(absl::StrCat(flag, " ", path, ": ", std::strerror(err)));
  }
  if (S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " ", path, " is a directory, not a file"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::PermissionDeniedError(absl::StrCat(flag, " ", path, ": cannot open: ",
                                                    std::strerror(errno)));
  }
  // Read straight into one string of the file's size: a stream copy would
  // hold the text two or three times at the peak.
  std::string text;
  if (S_ISREG(st.st_mode)) {
    text.resize(static_cast<size_t>(st.st_size));
    in.read(text.data(), static_cast<std::streamsize>(text.size()));
    text.resize(static_cast<size_t>(in.gcount()));
  } else {
    ss << in.rdbuf();  // a pipe or device: its size is not known
    text = ss.str();
  }
  if (in.bad()) return absl::DataLossError(absl::StrCat("error reading ", path));
  return text;
}

absl::StatusOr<LoadedModel> LoadModelFromFlags() {
  LoadedModel m;
  m.path = ResolveModelPath(absl::GetFlag(FLAGS_model));
  SNAPFILL_ASSIGN_OR_RETURN(m.model, LlamaModel::Open(m.path));
  auto tok = Tokenizer::FromGguf(m.model->gguf());
  if (!tok.ok()) {
    return absl::Status(tok.status().code(),
                        absl::StrCat("tokenizer of ", m.path, ": ", tok.status().message()));
  }
  m.tokenizer = std::move(*tok);
  const std::string flag = absl::GetFlag(FLAGS_chat_template);
  auto own_text = m.model->gguf().GetString("tokenizer.chat_template");
  const ChatTemplate own = own_text.ok() ? DetectChatTemplate(*own_text) : ChatTemplate();
  if (flag == "auto") {
    m.chat_template = own;
  } else if (flag != "none") {
    m.chat_template = DetectChatTemplate(flag);
    if (m.chat_template.kind == ChatTemplateKind::kNone) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--chat_template=", flag,
          " is not one of auto, none, chatml, llama2, llama2-sys, llama3, zephyr"));
    }
    // The model's own template knows its default system prompt.
    if (own.kind == m.chat_template.kind) m.chat_template = own;
  }
  return m;
}

absl::StatusOr<std::unique_ptr<Backend>> BackendFromFlags() {
  BackendOptions opts;
  opts.num_threads = absl::GetFlag(FLAGS_threads);
  opts.profile = absl::GetFlag(FLAGS_profile);
  if (opts.num_threads < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--threads=", opts.num_threads,
                                                   " must be >= 0"));
  }
  return CreateBackend(Device::kCpu, opts);
}

absl::StatusOr<SamplingParams> SamplingFromFlags() {
  SamplingParams s;
  s.temperature = static_cast<float>(absl::GetFlag(FLAGS_temp));
  s.top_k = absl::GetFlag(FLAGS_top_k);
  s.top_p = static_cast<float>(absl::GetFlag(FLAGS_top_p));
  s.seed = absl::GetFlag(FLAGS_seed);
  SNAPFILL_RETURN_IF_ERROR(ValidateSamplingParams(s));
  return s;
}

}  // namespace snapfill::cli
