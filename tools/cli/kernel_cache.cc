#include "tools/cli/kernel_cache.h"

#include <elf.h>
#include <link.h>
#include <omp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "src/base/file_util.h"

namespace snapfill::cli {
namespace {

// The first line; a file of another version is ignored, not read.
constexpr char kHeader[] = "snapfill kernel timings ";
constexpr int kVersion = 2;  // 2: the attention's heads in the key

std::string ShapeLine(const BackendOptions::ProductShape& s) {
  const char* name = GetTypeTraits(s.type).name;
  return absl::StrCat("shape ", name != nullptr ? name : "?", " ", s.k, "x", s.n);
}

// The lines that must match, in order, after the header.
std::vector<std::pair<std::string, std::string>> KeyLines(const KernelCacheKey& key) {
  return {{"cpu " + key.cpu, "another CPU"},
          {"build " + key.build, "another build of snapfill"},
          {"config " + (key.config.empty() ? std::string("the CPU's own") : key.config), "another kernel level"},
          {absl::StrCat("threads ", key.threads), "another thread count"},
          {ShapeLine(key.shape), "another product shape"},
          {absl::StrCat("attention heads ", key.heads.num_heads, " on ", key.heads.num_kv_heads, " of ",
                        key.heads.head_dim),
           "other attention heads"}};
}

int NoteCallback(struct dl_phdr_info* info, size_t, void* data) {
  // The first object is the executable itself.
  auto* out = static_cast<std::string*>(data);
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_NOTE) continue;
    const char* p = reinterpret_cast<const char*>(info->dlpi_addr + ph.p_vaddr);
    const char* end = p + ph.p_memsz;
    while (p + sizeof(ElfW(Nhdr)) <= end) {
      const auto* n = reinterpret_cast<const ElfW(Nhdr)*>(p);
      const char* name = p + sizeof(ElfW(Nhdr));
      const char* desc = name + ((n->n_namesz + 3) & ~3u);
      if (desc + n->n_descsz > end) break;
      if (n->n_type == NT_GNU_BUILD_ID && n->n_namesz == 4 && std::string(name, 3) == "GNU") {
        for (uint32_t j = 0; j < n->n_descsz; ++j) {
          absl::StrAppendFormat(out, "%02x", static_cast<unsigned char>(desc[j]));
        }
        return 1;
      }
      p = desc + ((n->n_descsz + 3) & ~3u);
    }
  }
  return 1;  // only the executable
}

}  // namespace

std::string ExecutableBuildId() {
  std::string id;
  dl_iterate_phdr(NoteCallback, &id);
  if (!id.empty()) return id;
  struct stat st;
  if (stat("/proc/self/exe", &st) == 0) {
    return absl::StrCat("size ", st.st_size, " mtime ", st.st_mtim.tv_sec, ".", st.st_mtim.tv_nsec);
  }
  return "unknown";
}

std::string KernelCacheDir() {
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && xdg[0] == '/') {
    return absl::StrCat(xdg, "/snapfill");
  }
  if (const char* home = std::getenv("HOME"); home != nullptr && home[0] == '/') {
    return absl::StrCat(home, "/.cache/snapfill");
  }
  return "";
}

std::string KernelCacheFile(const std::string& dir, const KernelCacheKey& key) {
  const char* name = GetTypeTraits(key.shape.type).name;
  std::string file =
      absl::StrCat(dir, "/kernels-t", key.threads, "-", name != nullptr ? name : "x", "-", key.shape.k, "x",
                   key.shape.n, "-h", key.heads.num_heads, "x", key.heads.num_kv_heads, "x", key.heads.head_dim);
  if (!key.config.empty()) absl::StrAppend(&file, "-", key.config);
  return file + ".txt";
}

absl::StatusOr<std::vector<KernelRates>> ReadKernelCache(const std::string& path, const KernelCacheKey& key) {
  std::ifstream in(path);
  if (!in) {
    if (access(path.c_str(), F_OK) != 0) return absl::NotFoundError(absl::StrCat(path, " does not exist"));
    return absl::PermissionDeniedError(absl::StrCat("cannot read ", path));
  }
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  auto bad = [&](const std::string& why) { return absl::DataLossError(absl::StrCat(path, ": ", why)); };
  if (lines.empty() || lines[0].rfind(kHeader, 0) != 0) return bad("not a file of kernel timings");
  int version = 0;
  if (!absl::SimpleAtoi(lines[0].substr(sizeof(kHeader) - 1), &version) || version != kVersion) {
    return absl::FailedPreconditionError(absl::StrCat(path, ": format version \"", lines[0].substr(sizeof(kHeader) - 1),
                                                      "\", this build reads ", kVersion));
  }
  const auto want = KeyLines(key);
  if (lines.size() < want.size() + 2 || lines.back() != "end") return bad("truncated (no \"end\" line)");
  for (size_t i = 0; i < want.size(); ++i) {
    if (lines[i + 1] != want[i].first) {
      return absl::FailedPreconditionError(
          absl::StrCat(path, ": made for ", want[i].second, " (\"", lines[i + 1], "\", here \"", want[i].first, "\")"));
    }
  }
  std::vector<KernelRates> out;
  for (size_t i = want.size() + 1; i + 1 < lines.size(); ++i) {
    // rates <op>: <name> <gops>, <name> <gops>
    const std::string& l = lines[i];
    const size_t colon = l.find(": ");
    if (l.rfind("rates ", 0) != 0 || colon == std::string::npos) return bad(absl::StrCat("line ", i + 1, " damaged"));
    KernelRates r;
    r.op = l.substr(6, colon - 6);
    for (absl::string_view item : absl::StrSplit(l.substr(colon + 2), ", ")) {
      const std::vector<std::string> parts = absl::StrSplit(item, ' ');
      KernelRate rate;
      if (parts.size() != 2 || parts[0].empty() || !absl::SimpleAtod(parts[1], &rate.gops) || !(rate.gops > 0)) {
        return bad(absl::StrCat("line ", i + 1, " damaged"));
      }
      rate.name = parts[0];
      r.rates.push_back(rate);
    }
    out.push_back(std::move(r));
  }
  if (out.empty()) return bad("no rates");
  return out;
}

absl::Status WriteKernelCache(const std::string& path, const KernelCacheKey& key,
                              const std::vector<KernelRates>& rates) {
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  if (ec) return absl::PermissionDeniedError(absl::StrCat("cannot make the folder of ", path, ": ", ec.message()));
  std::string text = absl::StrCat(kHeader, kVersion, "\n");
  for (const auto& [line, why] : KeyLines(key)) absl::StrAppend(&text, line, "\n");
  for (const KernelRates& r : rates) {
    absl::StrAppend(&text, "rates ", r.op, ": ");
    for (size_t i = 0; i < r.rates.size(); ++i) {
      absl::StrAppendFormat(&text, "%s%s %.1f", i > 0 ? ", " : "", r.rates[i].name, r.rates[i].gops);
    }
    text += "\n";
  }
  text += "end\n";
  return WriteFileAtomically(path, text, /*overwrite=*/true);
}

absl::Status LoadOrMeasureKernelRates(BackendOptions* options, std::string* source) {
  KernelCacheKey key;
  key.cpu = CpuIdentity();
  key.build = ExecutableBuildId();
  key.threads = options->num_threads > 0 ? options->num_threads : omp_get_num_procs();
  key.shape = options->product_shape;
  key.heads = options->attention_shape;
  if (!options->kernel_level.empty()) key.config = options->kernel_level;
  if (options->amx == BackendOptions::Amx::kOff) absl::StrAppend(&key.config, key.config.empty() ? "" : "-", "amx0");
  if (options->amx == BackendOptions::Amx::kInt8Only) {
    absl::StrAppend(&key.config, key.config.empty() ? "" : "-", "amxint8");
  }
  const std::string dir = KernelCacheDir();
  const std::string path = dir.empty() ? "" : KernelCacheFile(dir, key);
  if (!path.empty()) {
    absl::StatusOr<std::vector<KernelRates>> kept = ReadKernelCache(path, key);
    if (kept.ok()) {
      options->kernel_rates = *std::move(kept);
      *source = path;
      return absl::OkStatus();
    }
    if (!absl::IsNotFound(kept.status())) {
      std::fprintf(stderr, "snapfill: warning: kernel timings ignored: %s; timing the kernels again\n",
                   std::string(kept.status().message()).c_str());
    }
  }
  absl::StatusOr<std::vector<KernelRates>> timed = MeasureCpuKernels(*options);
  if (!timed.ok()) return timed.status();
  options->kernel_rates = *std::move(timed);
  *source = "timed now";
  if (!path.empty()) {
    if (const absl::Status s = WriteKernelCache(path, key, options->kernel_rates); !s.ok()) {
      std::fprintf(stderr, "snapfill: warning: the kernel timings are not kept: %s\n",
                   std::string(s.message()).c_str());
    } else {
      *source = absl::StrCat("timed now, kept in ", path);
    }
  }
  return absl::OkStatus();
}

}  // namespace snapfill::cli
