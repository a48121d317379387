// snapfill bench: TTFT and peak memory of every schedule on one input, in
// one run, with repetitions (DESIGN.md §7), beside the IMDC paper's eq. 4
// prediction; and decoding from the compressed cache against decoding over
// a full cache, beside what the bytes each step reads predict.
//
// Each configuration runs as a child `snapfill run --report` so that its
// peak resident memory is its own (getrusage of the child), not the
// largest of all configurations so far.
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"
#include "snapfill/schedule.h"
#include "snapfill/status.h"
#include "src/base/file_util.h"
#include "src/base/sys_stats.h"
#include "tools/cli/commands.h"
#include "tools/cli/common.h"
#include "tools/cli/flags.h"
#include "tools/cli/plot.h"
#include "tools/cli/roofline.h"

namespace snapfill::cli {
namespace {

using Json = nlohmann::json;

struct Config {
  std::string label;                 // "fm", "im:sqrt", "full"
  std::vector<std::string> args;     // run flags
};

struct Measured {
  Config config;
  std::vector<double> ttft, prefill, decode_tps;
  std::vector<double> first_step;  // seconds of the first decode step (it makes the decode copy)
  std::vector<double> bandwidth;   // read rate of a buffer as large as a decode step's bytes, probed
                                   // right after each run with a decode rate (its prediction's rate)
  std::vector<double> dram_bandwidth;  // with it, the read rate of a 512 MiB buffer (memory itself)
  std::vector<double> round_trip;  // CPU-to-CPU round trip (ns) probed with it; 0 with one thread
  std::vector<Work> work;                // each run's prefill work (its --profile)
  std::vector<BackendProfile::Peaks> peaks;     // each run's peaks, measured right after it
  double mean_memory = 0, attention_share = 0;
  int64_t chunk = 0, steps = 0, cache_entries = 0, input_tokens = 0;
  uint64_t peak_rss = 0, predicted_peak = 0;
  uint64_t device_peak = 0;  // the GPU backend's own allocations at their peak (0 on the CPU)
  uint64_t predicted_device_peak = 0;  // their prediction (run's DevicePrediction)
};

// The prefill work and the peaks of one `run --report` (written with
// --profile).
void AddWork(const Json& j, Measured& m) {
  if (!j.contains("prefill_work") || !j.contains("peaks")) return;
  const Json& w = j["prefill_work"];
  Work work;
  work.matmul_ops = w.value("matmul_ops", 0.0);
  work.int8_matmul_ops = w.value("int8_matmul_ops", 0.0);
  work.attention_ops = w.value("attention_ops", 0.0);
  work.window_ops = w.value("window_ops", 0.0);
  work.matmul_seconds = w.value("matmul_seconds", 0.0);
  work.attention_seconds = w.value("attention_seconds", 0.0);
  work.window_seconds = w.value("window_seconds", 0.0);
  const Json& p = j["peaks"];
  BackendProfile::Peaks peaks;
  peaks.threads = p.value("threads", 0);
  auto one = [&](const char* name, BackendProfile::Peak& peak) {
    if (!p.contains(name)) return;
    peak.instruction = p[name].value("instruction", std::string());
    peak.ops_per_second = p[name].value("ops_per_second", 0.0);
  };
  one("int8_products", peaks.int8_products);
  one("f32", peaks.f32);
  one("prefill_attention", peaks.prefill_attention);
  m.work.push_back(work);
  m.peaks.push_back(peaks);
}

// Decode tokens/s of one `run --report`, at steady state: the tokens after
// the first, over their time less the first step's, which also makes the
// decode copy of the weights once per process (not a cost of each step).
double SteadyDecodeRate(const nlohmann::json& j) {
  const int64_t tokens = j.value("decode_tokens", int64_t{0});
  const double seconds = j.value("decode_seconds", 0.0) - j.value("first_step_seconds", 0.0);
  return tokens > 2 && seconds > 0 ? (tokens - 2) / seconds : 0.0;
}

double ReadBandwidth(uint64_t bytes);
double CpuRoundTripNs();

// The buffer of the memory probe: larger than any cache here, so it reads
// memory itself.
constexpr uint64_t kDramProbeBytes = uint64_t{512} << 20;

// Adds a run's steady decode rate and first step to m, and read rates probed
// now, just after the run (its decode was the run's last phase), for that
// run's bytes prediction: this VM's bandwidth moves by half from one minute
// to the next, so one probe for all runs says little about any. The
// prediction's rate is that of reading a buffer as large as the bytes of one
// of this run's decode steps (`step_bytes` for its cache entries) again and
// again, as the steps read their weights and cache: a step whose bytes fit in
// a cache reads them at that cache's rate, not at memory's (on the AMX VM
// here, 119 MiB re-read at 41-48 GB/s where 512 MiB read at 24-25). A run
// with too few tokens to have a steady rate adds none of them.
void AddDecode(const nlohmann::json& j, Measured& m, const std::function<double(int64_t)>& step_bytes) {
  if (const double tps = SteadyDecodeRate(j); tps > 0) {
    m.decode_tps.push_back(tps);
    m.first_step.push_back(j.value("first_step_seconds", 0.0));
    const double bytes = step_bytes(j.value("cache_entries", int64_t{0}));
    m.bandwidth.push_back(ReadBandwidth(static_cast<uint64_t>(bytes)));
    m.dram_bandwidth.push_back(ReadBandwidth(kDramProbeBytes));
    m.round_trip.push_back(CpuRoundTripNs());
  }
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Runs `/proc/self/exe run <args> --report <file>`; returns the report and
// the child's peak resident set (bytes).
absl::StatusOr<std::pair<Json, uint64_t>> RunChild(const std::vector<std::string>& args,
                                                   const std::string& work) {
  const std::string report = work + "/report.json";
  const std::string log = work + "/child.log";
  std::vector<std::string> argv = {"snapfill", "run"};
  argv.insert(argv.end(), args.begin(), args.end());
  argv.push_back("--report=" + report);
  std::vector<char*> cargv;
  for (std::string& a : argv) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  std::remove(report.c_str());
  const pid_t pid = ::fork();
  if (pid < 0) return absl::InternalError("fork failed");
  if (pid == 0) {
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
    }
    ::execv("/proc/self/exe", cargv.data());
    ::_exit(127);
  }
  int status = 0;
  struct rusage usage {};
  if (::wait4(pid, &status, 0, &usage) != pid) return absl::InternalError("wait4 failed");
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::ifstream in(log);
    std::stringstream ss;
    ss << in.rdbuf();
    std::string tail = ss.str();
    if (tail.size() > 2000) tail = tail.substr(tail.size() - 2000);
    return absl::InternalError(absl::StrCat("snapfill run ", absl::StrJoin(args, " "),
                                            " failed:\n", tail));
  }
  std::ifstream in(report);
  Json j = Json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InternalError("the run's report is not JSON");
  return std::make_pair(j, static_cast<uint64_t>(usage.ru_maxrss) * 1024);
}

// The time a cache line takes to go from one of the first two threads to
// the other and back (ns; the median of 5 batches of up to 4,000 hand-offs,
// each batch cut at 20 ms), or 0 with fewer than 2 threads. On this
// project's 2-vCPU VM it moves between about 100 ns and about 400 ns from
// one second to the next, and the 400 ns phase is the one in which the read
// bandwidth is high (75-80 GB/s against 45-50): most likely the two vCPUs
// then sit behind different L3 caches and memory links (the clock and the
// DRAM latency do not change). Every parallel region of a
// decode step hands lines over (the fork, the join, each thread's half of
// an output), so that phase slows the step's fixed costs while it speeds
// its reads; the probe tells the phases apart where the bandwidth alone
// cannot (docs/history/BENCHMARKS-log.md).
double CpuRoundTripNs() {
  if (omp_get_max_threads() < 2) return 0;
  constexpr int kBatches = 5, kHandOffs = 4000;
  alignas(64) std::atomic<int64_t> line{0};
  alignas(64) std::atomic<bool> stop{false};
  std::vector<double> ns;
#pragma omp parallel num_threads(2)
  {
    const int t = omp_get_thread_num();
    if (omp_get_num_threads() == 2) {
      for (int b = 0; b < kBatches; ++b) {
        if (t == 0) {
          // Thread 0 writes odd values, thread 1 answers with the next even
          // one; thread 0 times the round trips and ends the batch.
          const int64_t base = line.load();
          const auto start = std::chrono::steady_clock::now();
          const auto limit = start + std::chrono::milliseconds(20);
          int done = 0;
          for (; done < kHandOffs; ++done) {
            const int64_t v = base + 2 * done;
            line.store(v + 1, std::memory_order_release);
            while (line.load(std::memory_order_acquire) != v + 2) {
            }
            if ((done & 63) == 63 && std::chrono::steady_clock::now() > limit) {
              ++done;
              break;
            }
          }
          const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
          ns.push_back(sec * 1e9 / done);
          stop.store(true, std::memory_order_release);
        } else {
          for (;;) {
            const int64_t v = line.load(std::memory_order_acquire);
            if (v % 2 == 1) {
              line.store(v + 1, std::memory_order_release);
            } else if (stop.load(std::memory_order_acquire)) {
              break;
            }
          }
        }
#pragma omp barrier
        if (t == 0) stop.store(false);
#pragma omp barrier
      }
    }
  }
  return Median(ns);
}

// The read rate of a buffer of `bytes` (rounded up to 256 KiB work items,
// at least one per thread) with the run's thread count, as the decode
// kernels read weights and KV: every thread streams its share with 64-byte
// vector loads into 8 independent sums and a software prefetch 1 KiB ahead
// (this machine's hardware prefetcher alone reaches about half of it). One
// untimed pass first brings the buffer wherever it stays between passes (a
// cache, if it fits one); then the best of five passes (three above 256 MiB).
double ReadBandwidth(uint64_t bytes) {
  constexpr int64_t kBlock = 1 << 16;  // floats per work item (256 KiB)
  const int64_t min_blocks = std::max(1, omp_get_max_threads());
  const int64_t blocks =
      std::max<int64_t>(min_blocks, static_cast<int64_t>((bytes + kBlock * sizeof(float) - 1) / (kBlock * sizeof(float))));
  const size_t n = static_cast<size_t>(blocks * kBlock);
  std::vector<float> buf(n, 1.0f);
  const int passes = 1 + (n * sizeof(float) > (uint64_t{256} << 20) ? 3 : 5);
  double best = 0;
  for (int rep = 0; rep < passes; ++rep) {
    Stopwatch w;
    double total = 0;
#pragma omp parallel for reduction(+ : total) schedule(static)
    for (int64_t b = 0; b < blocks; ++b) {
      const float* p = buf.data() + b * kBlock;
      float s[8][16] = {};
      for (int64_t i = 0; i < kBlock; i += 128) {
        __builtin_prefetch(p + i + 256);
        __builtin_prefetch(p + i + 256 + 16);
        __builtin_prefetch(p + i + 256 + 32);
        __builtin_prefetch(p + i + 256 + 48);
        __builtin_prefetch(p + i + 256 + 64);
        __builtin_prefetch(p + i + 256 + 80);
        __builtin_prefetch(p + i + 256 + 96);
        __builtin_prefetch(p + i + 256 + 112);
        for (int a = 0; a < 8; ++a) {
#pragma omp simd
          for (int l = 0; l < 16; ++l) s[a][l] += p[i + a * 16 + l];
        }
      }
      float sum = 0;
      for (int a = 0; a < 8; ++a) {
        for (int l = 0; l < 16; ++l) sum += s[a][l];
      }
      total += sum;
    }
    const double sec = w.Seconds();
    if (total != static_cast<double>(n)) return 0;  // keeps the loop
    if (rep > 0) best = std::max(best, n * sizeof(float) / sec);
  }
  return best;
}

// One --schedules entry: schedule[:growth][@chunk][/pruner].
struct Spec {
  std::string kind, growth;  // growth empty = the default
  int64_t chunk = 0;         // 0 = not given
  std::string pruner;        // empty = --pruner
};

absl::StatusOr<Spec> ParseSpec(absl::string_view spec) {
  Spec out;
  const std::string whole(spec);
  const auto bad = [&] {
    return absl::InvalidArgumentError(absl::StrCat(
        "--schedules: \"", whole,
        "\" is not schedule[:growth][@chunk][/pruner] (e.g. fm, im:sqrt, imdc@4096, fm/reconstruct)"));
  };
  if (const size_t slash = spec.find('/'); slash != absl::string_view::npos) {
    if (!ParsePrunerKind(std::string(spec.substr(slash + 1))).ok()) return bad();
    out.pruner = std::string(spec.substr(slash + 1));
    spec = spec.substr(0, slash);
  }
  absl::string_view body = spec;
  if (const size_t at = spec.find('@'); at != absl::string_view::npos) {
    body = spec.substr(0, at);
    if (!absl::SimpleAtoi(spec.substr(at + 1), &out.chunk) || out.chunk <= 0) return bad();
  }
  const std::vector<std::string> parts = absl::StrSplit(body, ':');
  if (parts.size() > 2 || !ParseScheduleKind(parts[0]).ok() ||
      (parts.size() == 2 && !ParseGrowth(parts[1]).ok())) {
    return bad();
  }
  out.kind = parts[0];
  if (parts.size() == 2) out.growth = parts[1];
  return out;
}

Config MakeConfig(const std::vector<std::string>& common, const std::string& label, const Spec& s,
                  int64_t chunk) {
  Config c;
  c.label = label;
  c.args = common;
  c.args.push_back("--schedule=" + s.kind);
  if (!s.growth.empty()) c.args.push_back("--growth=" + s.growth);
  c.args.push_back(absl::StrCat("--chunk=", chunk));
  c.args.push_back(absl::StrCat("--memory=", absl::GetFlag(FLAGS_memory)));
  if (!s.pruner.empty()) c.args.push_back("--pruner=" + s.pruner);  // after the common --pruner
  return c;
}

// The configurations in --schedules order. A schedule compares with the FM
// run of the same chunk, so where IMDC (or any entry) runs at a chunk no FM
// entry has, an FM run at that chunk ("fm@C") is added before it: eq. 4 and
// the peak-memory comparison only mean something at equal chunk.
std::vector<Config> Configs(const std::vector<std::string>& common) {
  std::vector<Config> out;
  const int64_t imdc_chunk = absl::GetFlag(FLAGS_imdc_chunk);
  const int64_t default_chunk = absl::GetFlag(FLAGS_chunk);
  std::vector<std::pair<Spec, std::string>> specs;
  for (absl::string_view text : absl::StrSplit(absl::GetFlag(FLAGS_schedules), ',')) {
    if (text.empty()) continue;
    absl::StatusOr<Spec> spec = ParseSpec(text);  // Validate() has refused bad ones
    if (spec.ok()) specs.emplace_back(*spec, std::string(text));
  }
  auto chunk_of = [&](const Spec& s) {
    if (s.chunk > 0) return s.chunk;
    return s.kind == "imdc" && imdc_chunk > 0 ? imdc_chunk : default_chunk;
  };
  std::vector<int64_t> fm_chunks;
  for (const auto& [s, text] : specs) {
    if (s.kind == "fm") fm_chunks.push_back(chunk_of(s));
  }
  for (const auto& [s, text] : specs) {
    const int64_t chunk = chunk_of(s);
    if (s.kind != "fm" && !fm_chunks.empty() &&
        std::find(fm_chunks.begin(), fm_chunks.end(), chunk) == fm_chunks.end()) {
      out.push_back(MakeConfig(common, absl::StrCat("fm@", chunk), Spec{"fm", "", chunk, ""}, chunk));
      fm_chunks.push_back(chunk);
    }
    out.push_back(MakeConfig(common, text, s, chunk));
  }
  return out;
}

absl::Status Validate() {
  if (absl::GetFlag(FLAGS_input).empty()) {
    return absl::InvalidArgumentError("--input FILE is required");
  }
  if (absl::GetFlag(FLAGS_repetitions) < 1) {
    return absl::InvalidArgumentError("--repetitions must be >= 1");
  }
  if (absl::GetFlag(FLAGS_full_tokens) < 0) {
    return absl::InvalidArgumentError("--full_tokens must be >= 0");
  }
  for (absl::string_view spec : absl::StrSplit(absl::GetFlag(FLAGS_schedules), ',')) {
    SNAPFILL_RETURN_IF_ERROR(ParseSpec(spec).status());
  }
  return absl::OkStatus();
}

absl::Status PlotBench(const std::vector<Measured>& rows, const std::string& png) {
  SNAPFILL_RETURN_IF_ERROR(CheckGnuplot());
  std::string data;
  for (size_t i = 0; i < rows.size(); ++i) {
    absl::StrAppendFormat(&data, "%d \"%s\" %.3f %.1f\n", i, rows[i].config.label,
                          Median(rows[i].ttft), rows[i].peak_rss / double(1 << 20));
  }
  const std::string script = absl::StrCat(
      "set terminal pngcairo size 1100,450 font ',10' noenhanced\nset output ", GnuplotQuote(AbsolutePath(png)),
      "\nset multiplot layout 1,2\nset style fill solid 0.8 border -1\nset boxwidth 0.7\n"
      "set grid ytics\nset xtics rotate by -30\nset yrange [0:*]\n"
      "set title 'Time to first token'\nset ylabel 'seconds'\n"
      "plot 'bench.dat' using 1:3:xtic(2) with boxes lc rgb '#4477aa' notitle, "
      "'' using 1:3:(sprintf('%.1f',$3)) with labels offset 0,0.7 notitle\n"
      "set title 'Peak resident memory'\nset ylabel 'MiB'\n"
      "plot 'bench.dat' using 1:4:xtic(2) with boxes lc rgb '#cc6677' notitle, "
      "'' using 1:4:(sprintf('%.0f',$4)) with labels offset 0,0.7 notitle\n"
      "unset multiplot\n");
  return RunGnuplot(script, {{"bench.dat", data}});
}

}  // namespace

namespace {

// The flags every child run gets.
std::vector<std::string> CommonArgs() {
  std::vector<std::string> common = {
      "--input=" + absl::GetFlag(FLAGS_input),
      absl::StrCat("--max_tokens=", absl::GetFlag(FLAGS_max_tokens)),
      absl::StrCat("--threads=", absl::GetFlag(FLAGS_threads)),
      "--device=" + absl::GetFlag(FLAGS_device),
      absl::StrCat("--pack_decode=", absl::GetFlag(FLAGS_pack_decode) ? "true" : "false"),
      absl::StrCat("--decode_kv_f16=", absl::GetFlag(FLAGS_decode_kv_f16) ? "true" : "false"),
      absl::StrCat("-n=", absl::GetFlag(FLAGS_n)),
      "--question=" + (absl::GetFlag(FLAGS_question).empty() ? std::string("What is this text about?")
                                                            : absl::GetFlag(FLAGS_question)),
      absl::StrCat("--window=", absl::GetFlag(FLAGS_window)),
      "--pruner=" + absl::GetFlag(FLAGS_pruner),
      "--ignore_eos", "--profile", "--progress=false", "--timing=false"};
  if (!absl::GetFlag(FLAGS_model).empty()) common.push_back("--model=" + absl::GetFlag(FLAGS_model));
  if (!absl::GetFlag(FLAGS_spool_dir).empty()) common.push_back("--spool_dir=" + absl::GetFlag(FLAGS_spool_dir));
  // The question-less pruners' inputs, for the rows that name them.
  if (!absl::GetFlag(FLAGS_gates).empty()) common.push_back("--gates=" + absl::GetFlag(FLAGS_gates));
  common.push_back(absl::StrCat("--repeat_stride=", absl::GetFlag(FLAGS_repeat_stride)));
  common.push_back(absl::StrCat("--score_span=", absl::GetFlag(FLAGS_score_span)));
  common.push_back(absl::StrCat("--spool_after=", absl::GetFlag(FLAGS_spool_after)));
  return common;
}

// The bytes a decode step reads: each weight matrix once, in the layout the
// products read (the decode copy with --pack_decode); and of each cache
// entry, in the width attention reads (fp16 with --decode_kv_f16).
struct DecodeBytes {
  bool half_kv = false;
  double entry_bytes = 0, weights = 0;
  double Step(int64_t entries) const { return weights + entries * entry_bytes; }
};

// Known before the runs, for their probes; the model is let go again before
// they start.
absl::StatusOr<DecodeBytes> MeasureDecodeBytes() {
  SNAPFILL_ASSIGN_OR_RETURN(LoadedModel model, LoadModelFromFlags());
  const LlamaConfig& mc = model.model->config();
  SNAPFILL_ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend, BackendFromFlags(model.model.get()));
  DecodeBytes d;
  d.half_kv = backend->HalfDecodeKv();
  // The read probes (ReadBandwidth, CpuRoundTripNs) run on OpenMP's
  // threads, as many as the runs' backend has.
  omp_set_num_threads(backend->num_threads());
  d.entry_bytes =
      2.0 * mc.num_layers * mc.num_kv_heads * mc.head_dim * (d.half_kv ? sizeof(uint16_t) : sizeof(float));
  for (const WeightView* w : model.model->DecodeMatrices()) {
    const WeightCopy copy = backend->CopyOf(*w, WeightUse::kDecode);
    d.weights += copy.copied ? static_cast<double>(copy.bytes) : static_cast<double>(w->rows) * w->row_bytes;
  }
  return d;
}

// `reps` child runs of one configuration.
absl::StatusOr<Measured> MeasureConfig(const Config& c, int reps, const std::string& work, const DecodeBytes& bytes) {
  Measured m;
  m.config = c;
  auto step_bytes = [&](int64_t entries) { return bytes.Step(entries); };
  for (int rep = 0; rep < reps; ++rep) {
    std::fprintf(stderr, "[bench] %s, run %d/%d\n", c.label.c_str(), rep + 1, reps);
    SNAPFILL_ASSIGN_OR_RETURN(auto result, RunChild(c.args, work));
    const Json& j = result.first;
    m.ttft.push_back(j.value("ttft_seconds", 0.0));
    m.prefill.push_back(j.value("prefill_seconds", 0.0));
    AddDecode(j, m, step_bytes);
    m.mean_memory = j.value("mean_memory", 0.0);
    m.steps = j.value("steps", int64_t{0});
    m.cache_entries = j.value("cache_entries", int64_t{0});
    m.input_tokens = j.value("input_tokens", int64_t{0});
    m.predicted_peak = j.value("predicted_peak_bytes", uint64_t{0});
    m.peak_rss = std::max(m.peak_rss, result.second);
    m.device_peak = std::max(m.device_peak, j.value("device_peak_bytes", uint64_t{0}));
    m.predicted_device_peak = j.value("predicted_device_peak_bytes", uint64_t{0});
    AddWork(j, m);
    double total = 0, attention = 0;
    for (auto it = j["profile"].begin(); it != j["profile"].end(); ++it) {
      total += it.value().get<double>();
      if (it.key() == "attention" || it.key() == "window_scores") {
        attention += it.value().get<double>();
      }
    }
    m.attention_share = total > 0 ? attention / total : 0;
  }
  for (const std::string& a : c.args) {
    if (a.rfind("--chunk=", 0) == 0) m.chunk = std::stoll(a.substr(8));
  }
  return m;
}

// Decoding over a full cache of the input's first `full_tokens` tokens.
absl::StatusOr<Measured> MeasureFullCache(const std::vector<std::string>& common, int64_t full_tokens, int reps,
                                          const std::string& work, const DecodeBytes& bytes) {
  Config c;
  c.label = absl::StrCat("full ", full_tokens);
  c.args = common;
  for (std::string& a : c.args) {
    if (a.rfind("--max_tokens=", 0) == 0) a = absl::StrCat("--max_tokens=", full_tokens);
    if (a.rfind("--pruner=", 0) == 0) a = "--pruner=full";
  }
  c.args.push_back("--chunk=1024");
  return MeasureConfig(c, reps, work, bytes);
}

bool IsFm(const Measured& m) { return m.config.label == "fm" || absl::StartsWith(m.config.label, "fm@"); }

// Each row's baseline for eq. 4 (r · ((m_max + c)/(m̂ + c) − 1) + 1, r =
// FM's attention share): the FM run of the same chunk (Configs() adds one).
const Measured* Baseline(const std::vector<Measured>& rows, const Measured& row) {
  for (const Measured& m : rows) {
    if (IsFm(m) && m.chunk == row.chunk) return &m;
  }
  return nullptr;
}

// Per run: its probed bandwidth over the bytes of a step; the medians of the
// runs' predictions and of their decode rate / prediction shares (and the
// same with memory's own read rate, for comparison).
double PredictedTps(const Measured& m, const DecodeBytes& bytes) {
  return Median(m.bandwidth) / bytes.Step(m.cache_entries);
}
double ShareOf(const Measured& m, const std::vector<double>& bandwidth, const DecodeBytes& bytes) {
  std::vector<double> v;
  for (size_t i = 0; i < m.decode_tps.size() && i < bandwidth.size(); ++i) {
    if (bandwidth[i] > 0) v.push_back(m.decode_tps[i] * bytes.Step(m.cache_entries) / bandwidth[i]);
  }
  return Median(v);
}

// The decode fields of the JSON, for a compressed run and the full cache alike.
void DecodeJson(const Measured& m, const DecodeBytes& bytes, Json& r) {
  r["decode_step_bytes"] = bytes.Step(m.cache_entries);
  r["decode_predicted_tokens_per_second"] = PredictedTps(m, bytes);
  r["decode_share_of_prediction"] = ShareOf(m, m.bandwidth, bytes);
  r["read_bandwidth_bytes_per_second"] = m.bandwidth;
  r["dram_read_bandwidth_bytes_per_second"] = m.dram_bandwidth;
  r["decode_share_of_dram_prediction"] = ShareOf(m, m.dram_bandwidth, bytes);
  r["cpu_round_trip_ns"] = m.round_trip;
}

// The prefill against the peaks of this machine's instructions, each run
// against its own (probed right after it): the medians over the runs of the
// products' and the attention's rates, their shares of the peak of the
// instruction each runs on (the products' only where all of them ran on
// int8 dots, or none), and the floor (Work at the peaks: FloorSeconds) over
// the prefill's time.
struct Roofline {
  bool measured = false;
  double matmul_ops = 0, attention_ops = 0, window_ops = 0;
  double matmul_rate = 0, attention_rate = 0, matmul_share = 0, attention_share = 0, floor = 0, floor_share = 0;
};

Roofline RooflineOf(const Measured& m) {
  Roofline r;
  std::vector<double> mr, ar, ms, as, fl, fs;
  for (size_t i = 0; i < m.work.size() && i < m.peaks.size(); ++i) {
    const Work& w = m.work[i];
    const BackendProfile::Peaks& p = m.peaks[i];
    r.measured = true;
    r.matmul_ops = w.matmul_ops;
    r.attention_ops = w.attention_ops;
    r.window_ops = w.window_ops;
    if (w.matmul_seconds > 0) mr.push_back(w.matmul_ops / w.matmul_seconds);
    if (w.attention_seconds > 0) ar.push_back(w.attention_ops / w.attention_seconds);
    const BackendProfile::Peak* mp = MatMulPeak(w, p);
    if (w.matmul_seconds > 0 && mp != nullptr && mp->ops_per_second > 0) {
      ms.push_back(w.matmul_ops / w.matmul_seconds / mp->ops_per_second);
    }
    if (w.attention_seconds > 0 && p.prefill_attention.ops_per_second > 0) {
      as.push_back(w.attention_ops / w.attention_seconds / p.prefill_attention.ops_per_second);
    }
    const double floor = FloorSeconds(w, p, /*prefill=*/true);
    if (floor > 0) {
      fl.push_back(floor);
      if (i < m.prefill.size() && m.prefill[i] > 0) fs.push_back(floor / m.prefill[i]);
    }
  }
  r.matmul_rate = Median(mr);
  r.attention_rate = Median(ar);
  r.matmul_share = Median(ms);
  r.attention_share = Median(as);
  r.floor = Median(fl);
  r.floor_share = Median(fs);
  return r;
}

// The schedules' table, and their entries of the JSON.
void PrintSchedules(const std::vector<Measured>& rows, const std::vector<Roofline>& rooflines,
                    const DecodeBytes& bytes, double m_max, Json& out, std::vector<double>& all_dram) {
  std::printf("%-16s %8s %7s %8s %9s %9s %9s %10s %8s %10s %9s\n", "schedule", "tokens", "chunk",
              "mean m", "TTFT s", "vs FM", "eq.4", "peak RSS", "vs FM", "predicted", "decode/s");
  for (size_t row = 0; row < rows.size(); ++row) {
    const Measured& m = rows[row];
    const double ttft = Median(m.ttft);
    double speedup = 0, eq4 = 0, peak_vs_fm = 0;
    const Measured* base = Baseline(rows, m);
    if (base != nullptr && ttft > 0) {
      speedup = Median(base->ttft) / ttft;
      eq4 = PredictedSpeedup(base->attention_share, m_max, m.mean_memory, m.chunk);
      peak_vs_fm = base->peak_rss > 0 ? static_cast<double>(m.peak_rss) / base->peak_rss : 0;
    }
    // Without an FM run to compare with, the ratio columns say so ("-").
    auto ratio = [&](double v, int width) {
      return base != nullptr ? absl::StrFormat("%*.2fx", width - 1, v) : absl::StrFormat("%*s", width, "-");
    };
    std::printf("%-16s %8lld %7lld %8.1f %9.2f %9s %9s %10s %8s %10s %9.1f\n", m.config.label.c_str(),
                (long long)m.input_tokens, (long long)m.chunk, m.mean_memory, ttft, ratio(speedup, 9).c_str(),
                ratio(eq4, 9).c_str(), HumanBytes(m.peak_rss).c_str(), ratio(peak_vs_fm, 8).c_str(),
                HumanBytes(m.predicted_peak).c_str(), Median(m.decode_tps));
    Json r;
    r["schedule"] = m.config.label;
    r["input_tokens"] = m.input_tokens;
    r["chunk"] = m.chunk;
    r["steps"] = m.steps;
    r["mean_memory"] = m.mean_memory;
    r["ttft_seconds"] = m.ttft;
    r["ttft_median"] = ttft;
    r["prefill_seconds"] = m.prefill;
    r["speedup_vs_fm"] = speedup;
    r["baseline"] = base != nullptr ? base->config.label : "";
    r["peak_rss_vs_fm"] = peak_vs_fm;
    r["eq4_prediction"] = eq4;
    r["attention_share"] = m.attention_share;
    r["peak_rss_bytes"] = m.peak_rss;
    r["predicted_peak_bytes"] = m.predicted_peak;
    r["device_peak_bytes"] = m.device_peak;
    r["predicted_device_peak_bytes"] = m.predicted_device_peak;
    r["decode_tokens_per_second"] = Median(m.decode_tps);
    r["decode_tokens_per_second_runs"] = m.decode_tps;
    r["cache_entries"] = m.cache_entries;
    if (const Roofline& rl = rooflines[row]; rl.measured) {
      r["prefill_matmul_ops"] = rl.matmul_ops;
      r["prefill_attention_ops"] = rl.attention_ops;
      r["prefill_window_ops"] = rl.window_ops;
      r["prefill_matmul_ops_per_second"] = rl.matmul_rate;
      r["prefill_attention_ops_per_second"] = rl.attention_rate;
      r["prefill_matmul_share_of_peak"] = rl.matmul_share;
      r["prefill_attention_share_of_peak"] = rl.attention_share;
      r["prefill_floor_seconds"] = rl.floor;
      r["prefill_floor_share"] = rl.floor_share;
    }
    DecodeJson(m, bytes, r);
    all_dram.insert(all_dram.end(), m.dram_bandwidth.begin(), m.dram_bandwidth.end());
    out["schedules"].push_back(r);
  }
  if (std::any_of(rows.begin(), rows.end(), [](const Measured& m) { return m.device_peak > 0; })) {
    // (--device cuda: the peak RSS above is the host's.)
    std::string line = "peak device memory (the backend's own allocations):";
    for (const Measured& m : rows) {
      absl::StrAppend(&line, " ", m.config.label, " ", HumanBytes(m.device_peak), " (predicted ",
                      HumanBytes(m.predicted_device_peak), ")");
    }
    std::printf("%s\n", line.c_str());
  }
  if (std::none_of(rows.begin(), rows.end(), IsFm)) {
    std::printf("no FM run to compare with (--schedules has no fm entry): vs FM and eq. 4 need one\n");
  }
  for (const Measured& m : rows) {
    if (!IsFm(m)) continue;
    std::printf("vs FM compares with the FM run of the same chunk; eq. 4 uses r = %.3f for chunk "
                "%lld, that run's measured attention share (attention + SnapKV votes over all "
                "backend time)\n",
                m.attention_share, (long long)m.chunk);
  }
}

// The prefill against the machine's peaks, where the runs measured them.
void PrintRooflines(const std::vector<Measured>& rows, const std::vector<Roofline>& rooflines) {
  if (std::none_of(rooflines.begin(), rooflines.end(), [](const Roofline& r) { return r.measured; })) return;
  const Measured& first = *std::find_if(rows.begin(), rows.end(), [](const Measured& m) { return !m.peaks.empty(); });
  std::printf("\nprefill against this machine's peaks (median of each run against its own peaks, probed right "
              "after it; ops count a multiply-add as 2; floor = the prefill's products, attention and votes at "
              "those peaks, nothing else; first run's %s)\n",
              PeaksLine(first.peaks.front()).c_str());
  std::printf("%-16s %12s %10s %8s %14s %10s %8s %10s %10s %10s\n", "schedule", "matmul TOP", "GOP/s", "of peak",
              "attention TOP", "GOP/s", "of peak", "floor s", "prefill s", "floor/pre");
  auto pct = [](double share) { return share > 0 ? absl::StrFormat("%.0f%%", 100 * share) : std::string("-"); };
  for (size_t row = 0; row < rows.size(); ++row) {
    const Measured& m = rows[row];
    const Roofline& r = rooflines[row];
    if (!r.measured) continue;
    std::printf("%-16s %12.2f %10.1f %8s %14.2f %10.1f %8s %10.1f %10.1f %10s\n", m.config.label.c_str(),
                r.matmul_ops * 1e-12, r.matmul_rate * 1e-9, pct(r.matmul_share).c_str(), r.attention_ops * 1e-12,
                r.attention_rate * 1e-9, pct(r.attention_share).c_str(), r.floor, Median(m.prefill),
                pct(r.floor_share).c_str());
  }
}

// Decoding over each compressed cache and the full one, against the read
// rates probed after each run; the full cache's entry of the JSON.
void PrintDecode(const std::vector<Measured>& rows, const Measured& full, const DecodeBytes& bytes, int reps,
                 Json& out, std::vector<double>& all_dram) {
  std::printf("\ndecode (%lld tokens, median of %d, after the first step, which also makes the "
              "decode copy of the weights; bytes per step: weights %s + KV in %s; prediction = the "
              "read rate of a buffer of a step's bytes, re-read as the steps re-read theirs, probed "
              "right after each run / those bytes; share = each run's rate / its prediction; DRAM = "
              "the same with a 512 MiB buffer, memory's own rate, which a step that fits in a cache "
              "beats; CPU rt = the round trip of a cache line between two threads, probed with them)\n",
              (long long)absl::GetFlag(FLAGS_n), reps, HumanBytes(static_cast<uint64_t>(bytes.weights)).c_str(),
              bytes.half_kv ? "fp16" : "f32");
  std::printf("%-26s %10s %10s %10s %10s %10s %10s %7s %9s %9s %14s %10s\n", "cache", "entries", "KV bytes",
              "step bytes", "tokens/s", "GB/s", "predicted", "share", "DRAM GB/s", "DRAM shr", "first step ms",
              "CPU rt ns");
  auto line = [&](const std::string& name, const Measured& m) {
    std::printf("%-26s %10lld %10s %10s %10.1f %10.1f %10.1f %6.0f%% %9.1f %8.0f%% %14.1f %10.0f\n",
                name.c_str(), (long long)m.cache_entries,
                HumanBytes(static_cast<uint64_t>(m.cache_entries * bytes.entry_bytes)).c_str(),
                HumanBytes(static_cast<uint64_t>(bytes.Step(m.cache_entries))).c_str(), Median(m.decode_tps),
                Median(m.bandwidth) / 1e9, PredictedTps(m, bytes), 100 * ShareOf(m, m.bandwidth, bytes),
                Median(m.dram_bandwidth) / 1e9, 100 * ShareOf(m, m.dram_bandwidth, bytes),
                Median(m.first_step) * 1e3, Median(m.round_trip));
  };
  for (const Measured& m : rows) line("compressed (" + m.config.label + ")", m);
  line(full.config.label, full);
  Json f;
  f["tokens"] = full.input_tokens;
  f["cache_entries"] = full.cache_entries;
  f["decode_tokens_per_second"] = Median(full.decode_tps);
  f["decode_tokens_per_second_runs"] = full.decode_tps;
  DecodeJson(full, bytes, f);
  all_dram.insert(all_dram.end(), full.dram_bandwidth.begin(), full.dram_bandwidth.end());
  f["peak_rss_bytes"] = full.peak_rss;
  out["full_cache"] = f;
}

}  // namespace

absl::Status RunBench() {
  SNAPFILL_RETURN_IF_ERROR(Validate());
  const std::string work = std::filesystem::temp_directory_path().string() + "/snapfill-bench-" +
                           std::to_string(::getpid());
  std::filesystem::create_directories(work);
  struct Cleanup {
    std::string dir;
    ~Cleanup() { std::filesystem::remove_all(dir); }
  } cleanup{work};

  const std::vector<std::string> common = CommonArgs();
  const int reps = absl::GetFlag(FLAGS_repetitions);
  SNAPFILL_ASSIGN_OR_RETURN(const DecodeBytes bytes, MeasureDecodeBytes());
  std::vector<Measured> rows;
  for (const Config& c : Configs(common)) {
    SNAPFILL_ASSIGN_OR_RETURN(Measured m, MeasureConfig(c, reps, work, bytes));
    rows.push_back(std::move(m));
  }
  const int64_t full_tokens = absl::GetFlag(FLAGS_full_tokens);
  Measured full;
  if (full_tokens > 0) {
    SNAPFILL_ASSIGN_OR_RETURN(full, MeasureFullCache(common, full_tokens, reps, work, bytes));
  }

  std::vector<Roofline> rooflines;  // rows' order
  for (const Measured& m : rows) rooflines.push_back(RooflineOf(m));
  Json out;
  out["input"] = absl::GetFlag(FLAGS_input);
  const double m_max = absl::GetFlag(FLAGS_memory);
  out["memory"] = m_max;
  out["repetitions"] = reps;
  out["decode_kv"] = bytes.half_kv ? "f16" : "f32";
  out["decode_bytes_per_kv_entry"] = bytes.entry_bytes;
  std::vector<double> all_dram;  // every run's memory probe, for the JSON's median
  PrintSchedules(rows, rooflines, bytes, m_max, out, all_dram);
  PrintRooflines(rows, rooflines);
  if (full_tokens > 0) PrintDecode(rows, full, bytes, reps, out, all_dram);
  out["dram_read_bandwidth_bytes_per_second"] = Median(all_dram);
  if (const std::string json = absl::GetFlag(FLAGS_json); !json.empty()) {
    SNAPFILL_RETURN_IF_ERROR(WriteFileAtomically(json, out.dump(1) + "\n", true));
  }
  if (const std::string png = absl::GetFlag(FLAGS_png); !png.empty()) {
    SNAPFILL_RETURN_IF_ERROR(PlotBench(rows, png));
  }
  return absl::OkStatus();
}

}  // namespace snapfill::cli
