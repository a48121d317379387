#include "tools/cli/commands.h"

namespace snapfill::cli {

const std::vector<Command>& Commands() {
  static const std::vector<Command> kCommands = {
      {"run",
       "Read a long input chunk by chunk into a compressed KV cache (SnapKV under an FM, IM or "
       "IMDC schedule), then answer --question or continue the text.",
       {"input", "question", "model", "schedule", "growth", "memory", "chunk", "first_memory",
        "window", "pool_kernel", "pooling", "pruner", "sinks", "original_positions", "n",
        "temp", "top_k", "top_p", "seed", "chat_template", "system", "threads", "telemetry",
        "progress", "dry_run", "max_memory", "checkpoint", "checkpoint_every", "resume",
        "force", "timing", "profile", "verbosity"},
       &RunRun},
      {"prefill",
       "Read a long input into a compressed KV cache and save it (--out) for snapfill generate "
       "--cache.",
       {"input", "out", "force", "model", "schedule", "growth", "memory", "chunk",
        "first_memory", "window", "pool_kernel", "pooling", "pruner", "sinks",
        "original_positions", "chat_template", "system", "threads", "telemetry", "progress",
        "dry_run", "max_memory", "checkpoint", "checkpoint_every", "resume", "timing", "profile",
        "verbosity"},
       &RunPrefill},
      {"generate",
       "Generate text from a prompt, or from a saved cache (--cache), streaming it to stdout.",
       {"model", "prompt", "prompt_file", "cache", "n", "temp", "top_k", "top_p", "seed",
        "chat_template", "system", "threads", "batch", "timing", "profile", "verbosity"},
       &RunGenerate},
      {"info", "Print a model's architecture, tensor types, sizes and context.",
       {"model", "verbosity"},
       &RunInfo},
  };
  return kCommands;
}

}  // namespace snapfill::cli
