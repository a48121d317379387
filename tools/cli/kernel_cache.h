// The kernels' timings kept between runs. `--kernels auto` takes the fastest
// implementation of each CPU op that has more than one (BackendOptions::
// attention_kernel / products_kernel "measure"); timing them costs about a
// fifth of a second, so the rates are kept in a small file per CPU, build,
// thread count, product shape and attention heads under the user's cache directory, and
// later runs read them instead. A file that does not belong to this run (made on
// another CPU or by another build, of another format version, truncated or
// damaged) is ignored with a warning and replaced by a new timing.
#ifndef SNAPFILL_TOOLS_CLI_KERNEL_CACHE_H_
#define SNAPFILL_TOOLS_CLI_KERNEL_CACHE_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "snapfill/backend.h"

namespace snapfill::cli {

// What a file of timings must match to be used.
struct KernelCacheKey {
  std::string cpu;     // CpuIdentity()
  std::string build;   // ExecutableBuildId()
  std::string config;  // the kernel level and AMX mode asked for ("" : the CPU's own)
  int threads = 0;
  BackendOptions::ProductShape shape;
  BackendOptions::AttentionShape heads;
};

// $XDG_CACHE_HOME/snapfill, else $HOME/.cache/snapfill; "" where neither
// variable is set (no file is kept then).
std::string KernelCacheDir();

// The file for `key` in `dir`:
// kernels-t<threads>-<type>-<k>x<n>-h<heads>x<kv heads>x<head_dim>[-<config>].txt.
std::string KernelCacheFile(const std::string& dir, const KernelCacheKey& key);

// The rates the file holds. NotFound where there is no file; another error,
// naming what is wrong, where the file is unreadable, truncated, damaged, of
// another format version, or made on another CPU, by another build, or for
// another thread count, product shape or heads: the caller ignores it with a
// warning.
absl::StatusOr<std::vector<KernelRates>> ReadKernelCache(const std::string& path, const KernelCacheKey& key);

// Writes the rates for `key`: to a temporary file beside `path`, renamed
// over it (a reader sees the old file or the new one, never a part),
// creating the directory where it is missing.
absl::Status WriteKernelCache(const std::string& path, const KernelCacheKey& key,
                              const std::vector<KernelRates>& rates);

// The build id of the running executable (its ELF NT_GNU_BUILD_ID note, as
// hex), so that timings are not taken across builds; where it has none, its
// size and modification time.
std::string ExecutableBuildId();

// For --kernels auto: options' rates (BackendOptions::kernel_rates) from
// the cache file, or timed now and written there. Warnings (an ignored or
// unwritable file) go to stderr; nothing here fails the run except a
// timing that fails. *source says where the rates came from.
absl::Status LoadOrMeasureKernelRates(BackendOptions* options, std::string* source);

}  // namespace snapfill::cli

#endif  // SNAPFILL_TOOLS_CLI_KERNEL_CACHE_H_
