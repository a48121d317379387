// The snapfill command: `snapfill <command> [flags]`.
//
//   run       read a long input into a compressed cache, then answer
//   prefill   read a long input into a compressed cache and save it
//   generate  continue a prompt, or answer from a saved cache
//   info      what a model file holds
//
// Flags live in tools/cli/; the library takes plain structs. Exit codes:
// 0 OK, 2 bad usage (InvalidArgument from validation), 1 anything else.
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "tools/cli/commands.h"
#include "tools/cli/environment.h"
#include "tools/cli/flags.h"

namespace snapfill::cli {
namespace {

void PrintUsage(std::FILE* out) {
  std::fprintf(out,
               "snapfill: read inputs far longer than memory through a Llama-family model, chunk "
               "by chunk,\ncompressing the KV cache under FM, IM or IMDC schedules: by the question's attention\n"
               "(SnapKV) where one is given, else by what learned gates predict later text will need (SmartKV).\n\n"
               "usage: snapfill <command> [flags]   (snapfill <command> --help for its flags)\n\n"
               "commands:\n");
  for (const Command& c : Commands()) std::fprintf(out, "  %-10s %s\n", c.name, c.summary);
  std::fprintf(out, "\n%s", EnvironmentHelp());
}

void PrintCommandHelp(const Command& c) {
  std::printf("usage: snapfill %s [flags]\n\n%s\n\nflags:\n", c.name, c.summary);
  for (const char* name : c.flags) {
    const absl::CommandLineFlag* f = absl::FindCommandLineFlag(name);
    if (f == nullptr) continue;
    const std::string flag = absl::StrCat(std::strlen(name) == 1 ? "-" : "--", name);
    const std::string def = f->DefaultValue();
    std::printf("  %-22s %s (default: %s)\n", flag.c_str(), f->Help().c_str(),
                def.empty() ? "\"\"" : def.c_str());
  }
  std::printf("\nFlags take --name=value or --name value; '-' and '_' in names are the same.\n\n%s",
              EnvironmentHelp());
}

// absl flag names use '_'; accept '-' too (--prompt-file, --top-p).
std::string NormalizeFlag(std::string a) {
  if (a.size() > 1 && a[0] == '-' && a != "--") {
    const size_t start = a.find_first_not_of('-');
    size_t end = a.find('=');
    if (end == std::string::npos) end = a.size();
    for (size_t j = start; j < end; ++j) {
      if (a[j] == '-') a[j] = '_';
    }
  }
  return a;
}

// Returns the flag name of an argument like --name=value, -n, --noforce.
std::string FlagName(const std::string& a) {
  const size_t start = a.find_first_not_of('-');
  const size_t end = a.find('=');
  return a.substr(start, end == std::string::npos ? std::string::npos : end - start);
}

int Main(int argc, char** argv) {
  absl::SetProgramUsageMessage("snapfill <command> [flags]; run `snapfill --help`");
  if (argc < 2) {
    PrintUsage(stderr);
    return 2;
  }
  const std::string cmd_name = argv[1];
  if (cmd_name == "--help" || cmd_name == "-h" || cmd_name == "help") {
    PrintUsage(stdout);
    return 0;
  }
  const Command* cmd = nullptr;
  for (const Command& c : Commands()) {
    if (cmd_name == c.name) cmd = &c;
  }
  if (cmd == nullptr) {
    std::fprintf(stderr, "snapfill: unknown command \"%s\"\n\n", cmd_name.c_str());
    PrintUsage(stderr);
    return 2;
  }
  std::vector<std::string> args = {argv[0]};
  for (int i = 2; i < argc; ++i) {
    const std::string a = NormalizeFlag(argv[i]);
    if (a == "--help" || a == "-h" || a == "-help") {
      PrintCommandHelp(*cmd);
      return 0;
    }
    args.push_back(a);
  }
  // Check flag names here so that a wrong flag is bad usage (exit 2) with
  // a message naming the command, rather than Abseil's exit 1; and record
  // the ones given (FlagGiven).
  std::vector<std::string> given;
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--") break;
    if (a.size() < 2 || a[0] != '-') continue;
    std::string name = FlagName(a);
    // A value such as "-1" (after --temp) is not a flag.
    if (name.empty() || !std::isalpha(static_cast<unsigned char>(name[0]))) continue;
    bool known = false;
    for (const char* f : cmd->flags) {
      if (name == f || (name.rfind("no", 0) == 0 && name.substr(2) == f)) {
        known = true;
        given.push_back(f);
      }
    }
    if (!known) {
      std::fprintf(stderr, "snapfill %s: unknown flag %s (see snapfill %s --help)\n", cmd->name,
                   argv[i + 1], cmd->name);
      return 2;
    }
  }
  RecordGivenFlags(given);
  std::vector<char*> cargs;
  for (std::string& s : args) cargs.push_back(s.data());
  std::vector<char*> positional =
      absl::ParseCommandLine(static_cast<int>(cargs.size()), cargs.data());
  if (positional.size() > 1) {
    std::fprintf(stderr, "snapfill %s: unexpected argument \"%s\"\n", cmd->name, positional[1]);
    return 2;
  }
  const absl::Status s = cmd->run();
  if (s.ok()) return 0;
  std::fprintf(stderr, "snapfill %s: %s\n", cmd->name, s.ToString().c_str());
  // 130 as a shell reports a program stopped by SIGINT: the run stopped on
  // a signal after saving its checkpoint.
  if (absl::IsCancelled(s)) return 130;
  return absl::IsInvalidArgument(s) ? 2 : 1;
}

}  // namespace
}  // namespace snapfill::cli

int main(int argc, char** argv) { return snapfill::cli::Main(argc, argv); }
