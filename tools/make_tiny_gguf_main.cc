// make_tiny_gguf: writes a tiny random-weight Llama GGUF (see
// tools/testmodel/tiny_llama.h) for tests and golden end-to-end checks.
//
//   make_tiny_gguf --out=/tmp/tiny.gguf --seed=7 --layers=2 --f16
//   make_tiny_gguf --out=/tmp/llama2-7b-q8.gguf --preset llama2-7b --type Q8_0
//
// --preset gives a real model's shape (smollm2-135m, llama2-7b) with the tiny
// vocabulary; any shape flag given explicitly overrides the preset's value.
// Models above 2^28 weights (or any with --fast_weights) use the fast,
// multi-threaded generator and are streamed to disk tensor by tensor.
//
// Exit status: 0 on success, 2 for bad usage (unknown or invalid flags,
// missing --out), 1 for anything else (e.g. the file exists without --force).
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <set>
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
ABSL_FLAG(std::string, architecture, "llama",
          "llama | qwen2 (biases on Q, K, V) | qwen3 (RMSNorm of each head of Q and K) | gemma3 (Q/K norms, "
          "post-norms, GeGLU, sliding-window layers)");
ABSL_FLAG(int, sliding_window, 0, "gemma3: the local layers' window (0: llama.cpp's default, 512).");
ABSL_FLAG(int, swa_pattern, 0, "gemma3: every N-th layer global, the others local (0: llama.cpp's default, 6).");
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
ABSL_FLAG(std::string, preset, "",
          "A real model's shape with the tiny vocabulary: smollm2-135m (30 layers, dim 576, 9/3 heads, ffn 1536, "
          "context 8192, tied) or llama2-7b (32 layers, dim 4096, 32/32 heads, ffn 11008, context 4096, untied). "
          "--layers, --dim, --heads, --kv_heads, --ffn, --context and --[no]tie_embeddings given explicitly override it.");
ABSL_FLAG(bool, fast_weights, false,
          "Use the fast counter-hash generator (multi-threaded, streamed to disk) even for a model of at most 2^28 "
          "weights; larger models (up to 2^34) always use it. Other bytes than the default generator's.");
ABSL_FLAG(int, threads, 0, "Threads of the fast generator (0: all cores); the bytes do not depend on it.");

namespace {

constexpr int kExitOk = 0;
constexpr int kExitError = 1;
constexpr int kExitUsage = 2;

// absl::ParseCommandLine exits with status 1 on an unknown flag; check names
// first so that bad usage exits with 2 like every other snapfill tool.
// Records in *given the names of the flags on the command line (foo for
// --nofoo), which override a --preset's values (flags set through
// --flagfile do not count as given).
bool AllFlagsKnown(int argc, char** argv, std::set<std::string>* given) {
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
      given->insert(name);
      // "--flag value": the next argument is the value, not a flag.
      if (eq == std::string::npos && !f->IsOfType<bool>()) ++i;
      continue;
    }
    // --nofoo negates a bool flag foo.
    if (absl::StartsWith(name, "no")) {
      const absl::CommandLineFlag* f = absl::FindCommandLineFlag(name.substr(2));
      if (f != nullptr && f->IsOfType<bool>()) {
        given->insert(name.substr(2));
        continue;
      }
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
      "[--heads=N] [--kv_heads=N] [--ffn=N] [--vocab_merges=N] [--f16 | --type=T [--down_type=T]] [--force]\n"
      "       make_tiny_gguf --out=PATH --preset={smollm2-135m,llama2-7b} [--type=T] [shape flags] "
      "[--fast_weights] [--threads=N] [--force]");
  std::set<std::string> given_flags;
  if (!AllFlagsKnown(argc, argv, &given_flags)) return kExitUsage;
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
  // The preset first; then each shape flag replaces its value where the
  // preset set it only if given on the command line.
  const std::string preset = absl::GetFlag(FLAGS_preset);
  if (!preset.empty()) {
    if (absl::Status s = snapfill::ApplyTinyLlamaPreset(preset, &opts); !s.ok()) {
      std::fprintf(stderr, "make_tiny_gguf: --preset=%s: %s\n", preset.c_str(), std::string(s.message()).c_str());
      return kExitUsage;
    }
  }
  auto given = [&](const char* name) { return preset.empty() || given_flags.count(name) > 0; };
  opts.seed = absl::GetFlag(FLAGS_seed);
  opts.architecture = absl::GetFlag(FLAGS_architecture);
  opts.sliding_window = absl::GetFlag(FLAGS_sliding_window);
  opts.swa_pattern = absl::GetFlag(FLAGS_swa_pattern);
  if (given("layers")) opts.num_layers = absl::GetFlag(FLAGS_layers);
  if (given("dim")) opts.model_dim = absl::GetFlag(FLAGS_dim);
  if (given("heads")) opts.num_heads = absl::GetFlag(FLAGS_heads);
  if (given("kv_heads")) opts.num_kv_heads = absl::GetFlag(FLAGS_kv_heads);
  if (given("ffn")) opts.ffn_dim = absl::GetFlag(FLAGS_ffn);
  if (given("context")) opts.context_length = absl::GetFlag(FLAGS_context);
  opts.num_merges = absl::GetFlag(FLAGS_vocab_merges);
  if (given("tie_embeddings")) opts.tie_embeddings = absl::GetFlag(FLAGS_tie_embeddings);
  opts.f16_matrices = absl::GetFlag(FLAGS_f16);
  opts.fast_weights = absl::GetFlag(FLAGS_fast_weights);
  opts.num_threads = absl::GetFlag(FLAGS_threads);
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
  const auto start = std::chrono::steady_clock::now();
  if (absl::Status s = snapfill::WriteTinyLlamaGguf(out, opts); !s.ok()) {
    std::fprintf(stderr, "make_tiny_gguf: %s\n", s.ToString().c_str());
    return kExitError;
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  struct stat written;
  const double gib = ::stat(out.c_str(), &written) == 0 ? static_cast<double>(written.st_size) / (1 << 30) : 0.0;
  std::printf("wrote %s (%d layers, dim %d, %d/%d heads, ffn %d, %s%s; %lld weights, %s generator, %.2f GiB in %.1f s)\n",
              out.c_str(), opts.num_layers, opts.model_dim, opts.num_heads, opts.num_kv_heads, opts.ffn_dim,
              opts.f16_matrices ? "F16" : snapfill::GetTypeTraits(opts.matrix_type).name,
              opts.tie_embeddings ? ", tied" : ", untied",
              static_cast<long long>(snapfill::TinyLlamaWeightCount(opts)),
              snapfill::TinyLlamaUsesFastWeights(opts) ? "fast" : "original", gib, seconds);
  return kExitOk;
}
