// Helpers shared by the snapfill subcommands.
#ifndef SNAPFILL_TOOLS_CLI_COMMON_H_
#define SNAPFILL_TOOLS_CLI_COMMON_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "snapfill/backend.h"
#include "src/engine/sampler.h"
#include "src/model/llama_model.h"
#include "src/tokenizer/chat_template.h"
#include "src/tokenizer/tokenizer.h"

namespace snapfill::cli {

// "93.8 MiB", "1.21 GiB".
std::string HumanBytes(uint64_t bytes);
// "3m07s", "1h02m".
std::string HumanSeconds(double seconds);

// Reads a whole text file, or stdin for "-". NotFound / InvalidArgument
// (a directory) / PermissionDenied with the path in the message.
absl::StatusOr<std::string> ReadInput(const std::string& path, const char* flag);

struct LoadedModel {
  std::string path;
  std::unique_ptr<LlamaModel> model;
  std::unique_ptr<Tokenizer> tokenizer;
  ChatTemplate chat_template;  // resolved from --chat_template and the model
};
// Loads --model (or its default), its tokenizer and chat template.
absl::StatusOr<LoadedModel> LoadModelFromFlags();

// The CPU backend with --threads.
absl::StatusOr<std::unique_ptr<Backend>> BackendFromFlags();

// --temp, --top_k, --top_p, --seed, validated.
absl::StatusOr<SamplingParams> SamplingFromFlags();

}  // namespace snapfill::cli

#endif  // SNAPFILL_TOOLS_CLI_COMMON_H_
