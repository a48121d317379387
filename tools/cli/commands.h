// The snapfill subcommands. Each returns a Status; main() maps it to an exit
// code (0 OK, 2 InvalidArgument, 1 otherwise) and prints it to stderr.
#ifndef SNAPFILL_TOOLS_CLI_COMMANDS_H_
#define SNAPFILL_TOOLS_CLI_COMMANDS_H_

#include <vector>

#include "absl/status/status.h"

namespace snapfill::cli {

struct Command {
  const char* name;
  const char* summary;
  std::vector<const char*> flags;  // the flags it reads, in --help order
  absl::Status (*run)();
};

const std::vector<Command>& Commands();

absl::Status RunInfo();
absl::Status RunGenerate();
absl::Status RunRun();
absl::Status RunPrefill();
absl::Status RunPpl();
absl::Status RunNeedle();
absl::Status RunPlot();
absl::Status RunBench();
absl::Status RunTokenize();
absl::Status RunBatch();
absl::Status RunTrainGate();

}  // namespace snapfill::cli

#endif  // SNAPFILL_TOOLS_CLI_COMMANDS_H_
