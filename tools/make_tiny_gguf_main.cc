// make_tiny_gguf: writes a tiny random-weight Llama GGUF (see
// tools/testmodel/tiny_llama.h) for tests and golden end-to-end checks.
//
//   make_tiny_gguf --out=/tmp/tiny.gguf --seed=7 --layers=2 --f16
//
// Exit status: 0 on success, 2 for bad usage (unknown or invalid flags,
// missing --out), 1 for anything else (e.g. the file exists without --force).
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "tools/testmodel/tiny_llama.h"

ABSL_FLAG(std::string, out, "", "Output GGUF path (required).");
ABSL_FLAG(uint64_t, seed, 1, "Seed for the random weights; same seed, same bytes.");
ABSL_FLAG(int, layers, 2, "Number of transformer blocks (llama.block_count).");
ABSL_FLAG(int, dim, 64, "Model dimension (llama.embedding_length).");
ABSL_FLAG(int, heads, 4, "Query heads; head_dim = dim / heads.");
ABSL_FLAG(int, kv_heads, 2, "Key/value heads; must divide --heads.");
ABSL_FLAG(int, ffn, 128, "Feed-forward hidden size (llama.feed_forward_length).");
ABSL_FLAG(int, context, 512, "Context length in tokens (llama.context_length).");
ABSL_FLAG(int, vocab_merges, -1,
          "BPE merges in the vocabulary, 0..max; -1 = all. Vocab size = 256 + merges + 3.");
ABSL_FLAG(bool, tie_embeddings, true,
          "Share token_embd.weight as the output matrix (no output.weight).");
ABSL_FLAG(bool, f16, false, "Store the 2-D weight matrices as F16 instead of F32.");
ABSL_FLAG(std::string, type, "F32",
          "Type of the 2-D weight matrices: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K or Q6_K "
          "(the K-quants need --dim and --ffn multiples of 256).");
ABSL_FLAG(std::string, down_type, "",
          "Type of ffn_down alone, as llama.cpp's mixed files (Q4_K_M: --type Q4_K --down_type Q6_K); empty: --type.");
ABSL_FLAG(bool, force, false, "Overwrite --out if it already exists.");

namespace {

constexpr int kExitOk = 0;
constexpr int kExitError = 1;
constexpr int kExitUsage = 2;

// absl::ParseCommandLine exits with status 1 on an unknown flag; check names
// first so that bad usage exits with 2 like every other snapfill tool.
bool AllFlagsKnown(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--") break;
    if (arg.size() < 2 || arg[0] != '-') continue;
    arg = arg.substr(arg[1] == '-' ? 2 : 1);
    const size_t eq = arg.find('=');
    const std::string name = arg.substr(0, eq);
    // Abseil's own flags, handled inside ParseCommandLine.
    static const char* const kBuiltin[] = {"help",     "helpfull",  "helpshort",  "helppackage",
                                           "helpon",   "helpmatch", "version",    "only_check_args",
                                           "flagfile", "fromenv",   "tryfromenv", "undefok"};
    if (std::find(std::begin(kBuiltin), std::end(kBuiltin), name) != std::end(kBuiltin)) continue;
    if (const absl::CommandLineFlag* f = absl::FindCommandLineFlag(name); f != nullptr) {
      // "--flag value": the next argument is the value, not a flag.
      if (eq == std::string::npos && !f->IsOfType<bool>()) ++i;
      continue;
    }
    // --nofoo negates a bool flag foo.
    if (absl::StartsWith(name, "no")) {
      const absl::CommandLineFlag* f = absl::FindCommandLineFlag(name.substr(2));
      if (f != nullptr && f->IsOfType<bool>()) continue;
    }
    std::fprintf(stderr, "make_tiny_gguf: unknown flag --%s (see --help)\n", name.c_str());
    return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Writes a tiny random-weight Llama GGUF (byte-level GPT-2 vocab, llama.cpp tensor "
      "names).\nUsage: make_tiny_gguf --out=PATH [--seed=N] [--layers=N] [--dim=N] "
      "[--heads=N] [--kv_heads=N] [--ffn=N] [--vocab_merges=N] [--f16 | --type=T [--down_type=T]] [--force]");
  if (!AllFlagsKnown(argc, argv)) return kExitUsage;
  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  if (positional.size() > 1) {
    std::fprintf(stderr, "make_tiny_gguf: unexpected argument '%s' (see --help)\n", positional[1]);
    return kExitUsage;
  }
  const std::string out = absl::GetFlag(FLAGS_out);
  if (out.empty()) {
    std::fprintf(stderr, "make_tiny_gguf: --out is required (see --help)\n");
    return kExitUsage;
  }

  snapfill::TinyLlamaOptions opts;
  opts.seed = absl::GetFlag(FLAGS_seed);
  opts.num_layers = absl::GetFlag(FLAGS_layers);
  opts.model_dim = absl::GetFlag(FLAGS_dim);
  opts.num_heads = absl::GetFlag(FLAGS_heads);
  opts.num_kv_heads = absl::GetFlag(FLAGS_kv_heads);
  opts.ffn_dim = absl::GetFlag(FLAGS_ffn);
  opts.context_length = absl::GetFlag(FLAGS_context);
  opts.num_merges = absl::GetFlag(FLAGS_vocab_merges);
  opts.tie_embeddings = absl::GetFlag(FLAGS_tie_embeddings);
  opts.f16_matrices = absl::GetFlag(FLAGS_f16);
  // A type by its ggml name (GgmlTypeTraits::name).
  auto type_named = [](const std::string& name, snapfill::GgmlType* type) {
    for (uint32_t id = 0; id < 64; ++id) {
      const char* n = snapfill::GetTypeTraits(static_cast<snapfill::GgmlType>(id)).name;
      if (n != nullptr && name == n) {
        *type = static_cast<snapfill::GgmlType>(id);
        return true;
      }
    }
    return false;
  };
  if (!type_named(absl::GetFlag(FLAGS_type), &opts.matrix_type)) {
    std::fprintf(stderr, "make_tiny_gguf: --type=%s is no ggml type name (see --help)\n",
                 absl::GetFlag(FLAGS_type).c_str());
    return kExitUsage;
  }
  if (!absl::GetFlag(FLAGS_down_type).empty() && !type_named(absl::GetFlag(FLAGS_down_type), &opts.ffn_down_type)) {
    std::fprintf(stderr, "make_tiny_gguf: --down_type=%s is no ggml type name (see --help)\n",
                 absl::GetFlag(FLAGS_down_type).c_str());
    return kExitUsage;
  }
  if (opts.f16_matrices && opts.matrix_type != snapfill::GgmlType::kF32) {
    std::fprintf(stderr, "make_tiny_gguf: --f16 and --type=%s: pass one of them\n", absl::GetFlag(FLAGS_type).c_str());
    return kExitUsage;
  }
  if (absl::Status s = snapfill::ValidateTinyLlamaOptions(opts); !s.ok()) {
    std::fprintf(stderr, "make_tiny_gguf: invalid flags: %s\n", s.ToString().c_str());
    return kExitUsage;
  }

  struct stat st;
  if (!absl::GetFlag(FLAGS_force) && ::stat(out.c_str(), &st) == 0) {
    std::fprintf(stderr, "make_tiny_gguf: %s already exists; pass --force to overwrite it\n",
                 out.c_str());
    return kExitError;
  }
  if (absl::Status s = snapfill::WriteTinyLlamaGguf(out, opts); !s.ok()) {
    std::fprintf(stderr, "make_tiny_gguf: %s\n", s.ToString().c_str());
    return kExitError;
  }
  std::printf("wrote %s (%d layers, dim %d, %d/%d heads, ffn %d, %s)\n", out.c_str(),
              opts.num_layers, opts.model_dim, opts.num_heads, opts.num_kv_heads, opts.ffn_dim,
              opts.f16_matrices ? "F16" : snapfill::GetTypeTraits(opts.matrix_type).name);
  return kExitOk;
}
