// The snapfill command: `snapfill <command> [flags]`.
//
//   info      the model's architecture, tensor types, sizes and context
//   generate  stream a continuation of a prompt (greedy at --temp 0)
//
// Flags live here only; the library takes plain structs. Exit codes: 0 OK,
// 2 bad usage (InvalidArgument from validation), 1 anything else.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "snapfill/backend.h"
#include "snapfill/status.h"
#include "src/base/sys_stats.h"
#include "src/engine/generate.h"
#include "src/model/llama_forward.h"
#include "src/model/llama_model.h"
#include "src/tokenizer/chat_template.h"
#include "src/tokenizer/tokenizer.h"

ABSL_FLAG(std::string, model, "",
          "Path of a Llama-family GGUF model. Default: $SNAPFILL_MODEL, else "
          "models/SmolLM2-135M-Instruct.Q4_1.gguf");
ABSL_FLAG(int32_t, threads, 0, "CPU threads; 0 = all cores");
ABSL_FLAG(std::string, prompt, "", "Prompt text");
ABSL_FLAG(std::string, prompt_file, "", "Read the prompt from this file (- for stdin)");
ABSL_FLAG(int64_t, n, 64, "Number of tokens to generate");
ABSL_FLAG(double, temp, 0.0, "Sampling temperature; 0 = greedy");
ABSL_FLAG(int32_t, top_k, 40, "Keep the k most likely tokens; 0 = all");
ABSL_FLAG(double, top_p, 0.95, "Nucleus sampling: keep tokens up to this cumulative probability");
ABSL_FLAG(uint64_t, seed, 0, "Random seed for sampling");
ABSL_FLAG(std::string, chat_template, "auto",
          "auto (the model's own, if it has one) | none | chatml | llama2 | llama2-sys | llama3 | zephyr");
ABSL_FLAG(std::string, system, "", "System message for the chat template (default: the template's)");
ABSL_FLAG(int64_t, batch, 512, "Tokens per forward batch during prefill");
ABSL_FLAG(bool, timing, true, "Print TTFT, tokens/s and peak memory to stderr");
ABSL_FLAG(int32_t, verbosity, 0, "0: results only; 1: also the resolved configuration");

namespace snapfill {
namespace {

struct Command {
  const char* name;
  const char* summary;
  std::vector<const char*> flags;
};

const std::vector<Command>& Commands() {
  static const std::vector<Command> kCommands = {
      {"info", "Print a model's architecture, tensor types, sizes and context.",
       {"model", "verbosity"}},
      {"generate", "Generate text from a prompt, streaming it to stdout.",
       {"model", "prompt", "prompt_file", "n", "temp", "top_k", "top_p", "seed", "chat_template",
        "system", "threads", "batch", "timing", "verbosity"}},
  };
  return kCommands;
}

void PrintUsage(std::FILE* out) {
  std::fprintf(out, "snapfill: chunked prefill of long inputs into a compressed KV cache.\n\n"
                    "usage: snapfill <command> [flags]   (snapfill <command> --help for its flags)\n\n"
                    "commands:\n");
  for (const Command& c : Commands()) std::fprintf(out, "  %-10s %s\n", c.name, c.summary);
}

void PrintCommandHelp(const Command& c) {
  std::printf("usage: snapfill %s [flags]\n\n%s\n\nflags:\n", c.name, c.summary);
  for (const char* name : c.flags) {
    const absl::CommandLineFlag* f = absl::FindCommandLineFlag(name);
    if (f == nullptr) continue;
    std::string flag = absl::StrCat(std::string(name).size() == 1 ? "-" : "--", name);
    std::printf("  %-18s %s (default: %s)\n", flag.c_str(), f->Help().c_str(),
                f->DefaultValue().empty() ? "\"\"" : f->DefaultValue().c_str());
  }
  std::printf("\nFlags accept --name=value or --name value; '-' and '_' are interchangeable.\n");
}

int ExitCode(const absl::Status& s) {
  if (s.ok()) return 0;
  return absl::IsInvalidArgument(s) ? 2 : 1;
}

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "snapfill: %s\n", s.ToString().c_str());
  return ExitCode(s);
}

absl::StatusOr<std::string> ReadFileOrStdin(const std::string& path) {
  std::ostringstream ss;
  if (path == "-") {
    ss << std::cin.rdbuf();
    return ss.str();
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open prompt file ", path));
  ss << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat("error reading ", path));
  return ss.str();
}

std::string HumanBytes(uint64_t b) {
  if (b >= (uint64_t{1} << 30)) return absl::StrFormat("%.2f GiB", b / double(uint64_t{1} << 30));
  if (b >= (uint64_t{1} << 20)) return absl::StrFormat("%.1f MiB", b / double(uint64_t{1} << 20));
  if (b >= 1024) return absl::StrFormat("%.1f KiB", b / 1024.0);
  return absl::StrCat(b, " B");
}

absl::Status RunInfo() {
  const std::string path = ResolveModelPath(absl::GetFlag(FLAGS_model));
  SNAPFILL_ASSIGN_OR_RETURN(auto model, LlamaModel::Open(path));
  const LlamaConfig& c = model->config();
  const GgufFile& f = model->gguf();
  std::printf("file:            %s (GGUF v%u, %s)\n", path.c_str(), f.version(),
              HumanBytes(f.file_size()).c_str());
  std::printf("name:            %s\n", c.name.c_str());
  std::printf("architecture:    %s\n", c.architecture.c_str());
  std::printf("layers:          %lld\n", (long long)c.num_layers);
  std::printf("model_dim:       %lld\n", (long long)c.model_dim);
  std::printf("ffn_dim:         %lld\n", (long long)c.ffn_dim);
  std::printf("heads:           %lld (KV heads %lld, grouped-query %lldx)\n", (long long)c.num_heads,
              (long long)c.num_kv_heads, (long long)(c.num_heads / c.num_kv_heads));
  std::printf("head_dim:        %lld\n", (long long)c.head_dim);
  std::printf("vocab_size:      %lld\n", (long long)c.vocab_size);
  std::printf("context_length:  %lld (training)\n", (long long)c.context_length);
  std::printf("rope:            %s, base %.1f, dims %lld, freq_scale %g\n",
              c.rope_neox ? "neox" : "norm", c.rope_freq_base, (long long)c.rope_dim,
              c.rope_freq_scale);
  std::printf("rms_eps:         %g\n", c.rms_eps);
  std::printf("tied embeddings: %s\n", c.tied_embeddings ? "yes" : "no");
  std::map<std::string, std::pair<int, uint64_t>> types;
  uint64_t params = 0;
  for (const GgufTensorInfo& t : f.tensors()) {
    const char* tn = GetTypeTraits(t.type).name;
    auto& e = types[tn ? tn : "?"];
    e.first++;
    e.second += t.size_bytes;
    params += t.num_elements();
  }
  std::printf("parameters:      %.1f M\n", params / 1e6);
  std::printf("weights:         %s in %zu tensors\n", HumanBytes(model->weight_bytes()).c_str(),
              f.tensors().size());
  for (const auto& [name, e] : types) {
    std::printf("  %-6s %4d tensors, %s\n", name.c_str(), e.first, HumanBytes(e.second).c_str());
  }
  auto tok = Tokenizer::FromGguf(f);
  if (tok.ok()) {
    std::printf("tokenizer:       %s, %d tokens\n", f.GetString("tokenizer.ggml.model").value_or("?").c_str(),
                (*tok)->vocab_size());
  } else {
    std::printf("tokenizer:       unusable: %s\n", tok.status().ToString().c_str());
  }
  auto tmpl = f.GetString("tokenizer.chat_template");
  std::printf("chat template:   %s\n",
              tmpl.ok() ? ChatTemplateKindName(DetectChatTemplate(*tmpl).kind) : "none");
  if (absl::GetFlag(FLAGS_verbosity) >= 1) {
    std::printf("metadata:\n");
    for (const GgufKv& kv : f.metadata()) {
      std::printf("  %-40s %s[%llu]\n", kv.key.c_str(), GgufValueTypeName(kv.value.type),
                  (unsigned long long)kv.value.size());
    }
  }
  return absl::OkStatus();
}

absl::Status RunGenerate() {
  std::string prompt = absl::GetFlag(FLAGS_prompt);
  const std::string prompt_file = absl::GetFlag(FLAGS_prompt_file);
  if (!prompt.empty() && !prompt_file.empty()) {
    return absl::InvalidArgumentError("give either --prompt or --prompt-file, not both");
  }
  if (!prompt_file.empty()) {
    SNAPFILL_ASSIGN_OR_RETURN(prompt, ReadFileOrStdin(prompt_file));
  }
  if (prompt.empty()) {
    return absl::InvalidArgumentError("the prompt is empty: give --prompt TEXT or --prompt-file F");
  }
  const int64_t n = absl::GetFlag(FLAGS_n);
  if (n < 0) return absl::InvalidArgumentError(absl::StrCat("-n=", n, " must be >= 0"));
  const int64_t batch = absl::GetFlag(FLAGS_batch);
  if (batch <= 0) return absl::InvalidArgumentError(absl::StrCat("--batch=", batch, " must be > 0"));
  SamplingParams sampling;
  sampling.temperature = static_cast<float>(absl::GetFlag(FLAGS_temp));
  sampling.top_k = absl::GetFlag(FLAGS_top_k);
  sampling.top_p = static_cast<float>(absl::GetFlag(FLAGS_top_p));
  sampling.seed = absl::GetFlag(FLAGS_seed);
  SNAPFILL_RETURN_IF_ERROR(ValidateSamplingParams(sampling));

  const std::string path = ResolveModelPath(absl::GetFlag(FLAGS_model));
  SNAPFILL_ASSIGN_OR_RETURN(auto model, LlamaModel::Open(path));
  SNAPFILL_ASSIGN_OR_RETURN(auto tokenizer, Tokenizer::FromGguf(model->gguf()));

  // The chat template wraps the prompt as a user message for instruct models.
  const std::string tmpl_flag = absl::GetFlag(FLAGS_chat_template);
  ChatTemplate tmpl;
  if (tmpl_flag == "auto") {
    auto text = model->gguf().GetString("tokenizer.chat_template");
    if (text.ok()) tmpl = DetectChatTemplate(*text);
  } else if (tmpl_flag != "none") {
    tmpl = DetectChatTemplate(tmpl_flag);
    if (tmpl.kind == ChatTemplateKind::kNone) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--chat_template=", tmpl_flag,
          " is not one of auto, none, chatml, llama2, llama2-sys, llama3, zephyr"));
    }
    // The model's own template knows its default system prompt.
    auto text = model->gguf().GetString("tokenizer.chat_template");
    if (text.ok()) {
      ChatTemplate own = DetectChatTemplate(*text);
      if (own.kind == tmpl.kind) tmpl = own;
    }
  }
  const ChatTemplateKind kind = tmpl.kind;
  std::string text = prompt;
  bool parse_special = false;
  if (kind != ChatTemplateKind::kNone) {
    std::vector<ChatMessage> messages;
    if (!absl::GetFlag(FLAGS_system).empty()) {
      messages.push_back({"system", absl::GetFlag(FLAGS_system)});
    }
    messages.push_back({"user", prompt});
    text = ApplyChatTemplate(tmpl, messages, /*add_generation_prompt=*/true);
    parse_special = true;  // the template's own markers are special tokens
  }
  std::vector<int32_t> ids = tokenizer->Encode(text, /*add_special=*/true, parse_special);
  if (ids.empty()) return absl::InvalidArgumentError("the prompt encodes to no tokens");

  BackendOptions bopts;
  bopts.num_threads = absl::GetFlag(FLAGS_threads);
  SNAPFILL_ASSIGN_OR_RETURN(auto backend, CreateBackend(Device::kCpu, bopts));
  const int64_t capacity = static_cast<int64_t>(ids.size()) + n;
  if (capacity > model->config().context_length) {
    std::fprintf(stderr,
                 "snapfill: warning: %lld prompt + %lld new tokens exceed the model's training "
                 "context of %lld; quality will degrade (snapfill run compresses long inputs)\n",
                 (long long)ids.size(), (long long)n, (long long)model->config().context_length);
  }
  SNAPFILL_ASSIGN_OR_RETURN(auto forward, LlamaForward::Create(*model, backend.get(), batch));
  SNAPFILL_ASSIGN_OR_RETURN(auto kv, forward->NewKvCache(capacity));
  if (absl::GetFlag(FLAGS_verbosity) >= 1) {
    std::fprintf(stderr,
                 "model=%s threads=%d prompt_tokens=%zu n=%lld temp=%g top_k=%d top_p=%g seed=%llu "
                 "chat_template=%s batch=%lld kv=%s\n",
                 path.c_str(), backend->num_threads(), ids.size(), (long long)n,
                 sampling.temperature, sampling.top_k, sampling.top_p,
                 (unsigned long long)sampling.seed, ChatTemplateKindName(kind), (long long)batch,
                 HumanBytes(kv->bytes()).c_str());
  }
  GenerateOptions gopts;
  gopts.max_new_tokens = n;
  gopts.sampling = sampling;
  gopts.is_eog = [&](int32_t id) { return tokenizer->IsEndOfGeneration(id); };
  const bool tty = isatty(fileno(stdout));
  SNAPFILL_ASSIGN_OR_RETURN(
      GenerateResult r, Generate(*forward, *kv, 0, ids, gopts, [&](int32_t id) {
        const std::string piece = tokenizer->TokenToPiece(id);
        std::fwrite(piece.data(), 1, piece.size(), stdout);
        if (tty) std::fflush(stdout);
        return true;
      }));
  std::fputc('\n', stdout);
  std::fflush(stdout);
  if (absl::GetFlag(FLAGS_timing)) {
    const double decode_tps =
        r.tokens.size() > 1 ? (r.tokens.size() - 1) / r.decode_seconds : 0.0;
    std::fprintf(stderr,
                 "prompt: %lld tokens in %.3f s (%.1f tokens/s) | TTFT %.3f s | generated %zu "
                 "tokens, decode %.1f tokens/s%s | peak RSS %s\n",
                 (long long)r.prompt_tokens, r.prefill_seconds,
                 r.prompt_tokens / std::max(r.prefill_seconds, 1e-9), r.ttft_seconds,
                 r.tokens.size(), decode_tps, r.stopped_at_eog ? " (stopped at end of turn)" : "",
                 HumanBytes(PeakRssBytes()).c_str());
  }
  return absl::OkStatus();
}

// absl flag names use '_'; accept '-' as well (--prompt-file, --top-p).
std::vector<char*> NormalizeFlagNames(int argc, char** argv, std::vector<std::string>& storage) {
  storage.assign(argv, argv + argc);
  for (size_t i = 1; i < storage.size(); ++i) {
    std::string& a = storage[i];
    if (a.size() > 2 && a[0] == '-' && a != "--") {
      size_t start = a.find_first_not_of('-');
      size_t end = a.find('=');
      if (end == std::string::npos) end = a.size();
      for (size_t j = start; j < end; ++j) {
        if (a[j] == '-') a[j] = '_';
      }
    }
  }
  std::vector<char*> out;
  for (std::string& s : storage) out.push_back(s.data());
  return out;
}

int Main(int argc, char** argv) {
  absl::SetProgramUsageMessage("snapfill <command> [flags]; run `snapfill --help`");
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h" ||
      std::string(argv[1]) == "help") {
    PrintUsage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string cmd_name = argv[1];
  const Command* cmd = nullptr;
  for (const Command& c : Commands()) {
    if (cmd_name == c.name) cmd = &c;
  }
  if (cmd == nullptr) {
    std::fprintf(stderr, "snapfill: unknown command \"%s\"\n\n", cmd_name.c_str());
    PrintUsage(stderr);
    return 2;
  }
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h" || a == "-help") {
      PrintCommandHelp(*cmd);
      return 0;
    }
  }
  std::vector<std::string> storage;
  std::vector<char*> args = NormalizeFlagNames(argc, argv, storage);
  // Drop the command name so absl sees only flags.
  args.erase(args.begin() + 1);
  std::vector<char*> positional = absl::ParseCommandLine(static_cast<int>(args.size()), args.data());
  if (positional.size() > 1) {
    std::fprintf(stderr, "snapfill %s: unexpected argument \"%s\"\n", cmd->name, positional[1]);
    return 2;
  }
  absl::Status s;
  if (cmd_name == "info") {
    s = RunInfo();
  } else if (cmd_name == "generate") {
    s = RunGenerate();
  }
  return s.ok() ? 0 : Fail(s);
}

}  // namespace
}  // namespace snapfill

int main(int argc, char** argv) { return snapfill::Main(argc, argv); }
