// The snapfill command: `snapfill <command> [flags]`.
//
//   run       read a long input into a compressed cache, then answer
//   prefill   read a long input into a compressed cache and save it
//   generate  continue a prompt, or answer from a saved cache
//   info      what a model file holds
//
// Flags live in tools/cli/; the library takes plain structs. Exit codes:
// 0 OK, 2 bad usage (InvalidArgument from validation), 1 anything else.
#include <omp.h>
#include <sched.h>
#include <unistd.h>

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

namespace snapfill::cli {
namespace {

void PrintUsage(std::FILE* out) {
  std::fprintf(out,
               "snapfill: read inputs far longer than memory through a Llama-family model, chunk "
               "by chunk,\ncompressing the KV cache with SnapKV under FM, IM or IMDC schedules.\n\n"
               "usage: snapfill <command> [flags]   (snapfill <command> --help for its flags)\n\n"
               "commands:\n");
  for (const Command& c : Commands()) std::fprintf(out, "  %-10s %s\n", c.name, c.summary);
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
  std::printf("\nFlags take --name=value or --name value; '-' and '_' in names are the same.\n");
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

// libgomp, left to its defaults, spins 300,000 rounds in every wait before
// it sleeps. While another process wants the cores too (two jobs at once on a
// 2-core machine), those spins burn the time slices that the thread everyone
// waits for needs: two 2-thread prefills at once ran at 23% of one alone
// each, instead of about half. 1,000 rounds gave 44% each there and cost
// nothing alone (prefill and decode, measured;
// docs/history/BENCHMARKS-log.md). libgomp reads its settings when it loads, before main, so unless the
// user chose (GOMP_SPINCOUNT or OMP_WAIT_POLICY), this sets GOMP_SPINCOUNT
// and runs the program again; if that fails it takes the setting back and
// goes on with the defaults (`snapfill info` says which).
//
// With OMP_PROC_BIND (or OMP_PLACES) set, libgomp has also bound this
// thread to the first place as it loaded, and the program run again would
// inherit that one place: every command ran on one thread (decode 263
// tokens/s instead of 400 on 2 cores). So the CPUs of all the places are
// given back first; libgomp binds the threads of the new run itself.
void SpinBrieflyInOpenMpWaits(char** argv) {
  if (std::getenv("GOMP_SPINCOUNT") != nullptr || std::getenv("OMP_WAIT_POLICY") != nullptr) return;
  cpu_set_t bound, places;
  const bool restore = omp_get_num_places() > 0 && sched_getaffinity(0, sizeof(bound), &bound) == 0;
  if (restore) {
    CPU_ZERO(&places);
    for (int p = 0; p < omp_get_num_places(); ++p) {
      std::vector<int> ids(std::max(omp_get_place_num_procs(p), 0));
      omp_get_place_proc_ids(p, ids.data());
      for (int id : ids) {
        if (id >= 0 && id < CPU_SETSIZE) CPU_SET(id, &places);
      }
    }
    if (CPU_COUNT(&places) == 0 || sched_setaffinity(0, sizeof(places), &places) != 0) return;
  }
  if (setenv("GOMP_SPINCOUNT", "1000", 1) == 0) execv("/proc/self/exe", argv);
  unsetenv("GOMP_SPINCOUNT");
  if (restore) sched_setaffinity(0, sizeof(bound), &bound);  // as libgomp left it
}

int Main(int argc, char** argv) {
  SpinBrieflyInOpenMpWaits(argv);
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
  // a message naming the command, rather than Abseil's exit 1.
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--") break;
    if (a.size() < 2 || a[0] != '-') continue;
    std::string name = FlagName(a);
    // A value such as "-1" (after --temp) is not a flag.
    if (name.empty() || !std::isalpha(static_cast<unsigned char>(name[0]))) continue;
    bool known = false;
    for (const char* f : cmd->flags) {
      if (name == f || (name.rfind("no", 0) == 0 && name.substr(2) == f)) known = true;
    }
    if (!known) {
      std::fprintf(stderr, "snapfill %s: unknown flag %s (see snapfill %s --help)\n", cmd->name,
                   argv[i + 1], cmd->name);
      return 2;
    }
  }
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
