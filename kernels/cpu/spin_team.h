// Internal to kernels/cpu: the threads of the kernels' parallel regions
// (cpu::ParallelFor offers them to the callers above).
//
// A decode step of a small model is about 150 parallel regions of 5-30 µs
// each (per layer Q/K/V, the attention, Wo, gate/up and down, then the
// head), and a prefill chunk about 10 per layer (the products, the
// attention, the votes, RoPE, the engine's copies and the selection).
// Under OpenMP each region's threads wait for the next one in libgomp,
// which spins GOMP_SPINCOUNT rounds and then sleeps in the kernel; a count
// of 1,000 (about 9 µs on the AMX VM) lets several jobs share the cores
// (docs/history/BENCHMARKS-log.md), but then the gaps
// between regions are longer than that often enough (the sampling between
// decode steps, a region one thread ends first, the selection between the
// votes and the copies) that the other thread slept several times a token
// and a layer, and waking it in a VM costs 30-50 µs, more than most regions
// take. OpenMP has no way to wait otherwise for some regions only, so the
// kernels use this team instead: its threads wait by spinning with `pause`,
// and `sched_yield` between short rounds of it (so that a thread of
// another job that needs this CPU gets it), and only after
// kIdleBeforeSleep without any work do they sleep (on a futex); with
// passive waits (kernel_config.h; the snapfill command's
// OMP_WAIT_POLICY=passive) they sleep at once, as OpenMP's threads would.
// Measured against OpenMP (docs/history/BENCHMARKS-log.md, alternating):
// decode 12-16% faster, two decoding jobs at once 34-49% faster each,
// prefill 6-12% faster at 64K tokens, two prefills at once 1-5% faster.
//
// A backend owns its team (cpu::ThreadTeam, thread_team.h) and binds it
// to the calling thread while one of its ops runs (Bind); the kernels run
// on the team bound to their thread (Current), with its thread count
// (CurrentThreads), and keep their buffers in its scratch
// (thread_scratch.h). A kernel called outside any backend (its unit tests
// and benchmarks) runs on the process's default team, with
// omp_get_max_threads() threads. A team's threads start on the first Run
// that asks for more than one (bound where OpenMP would bind its threads)
// and stop when the team is destroyed. The calling thread is thread 0 of
// every run; a team serves one calling thread at a time.
#ifndef SNAPFILL_KERNELS_CPU_SPIN_TEAM_H_
#define SNAPFILL_KERNELS_CPU_SPIN_TEAM_H_

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

#include "kernels/cpu/thread_scratch.h"

namespace snapfill::cpu::internal {

class SpinTeam {
 public:
  // A worker with no work for this long sleeps until the next run (0 with
  // passive waits).
  static constexpr std::chrono::microseconds kIdleBeforeSleep{2000};

  // A team of `threads` threads, the calling one included; 0: as many as
  // omp_get_max_threads() gives when the team starts.
  explicit SpinTeam(int threads);
  SpinTeam(const SpinTeam&) = delete;
  SpinTeam& operator=(const SpinTeam&) = delete;
  // Stops and joins the workers (not called while a run is in progress).
  ~SpinTeam();

  // The team kernels called outside any backend run on (never destroyed:
  // its threads may still be waiting when the process exits).
  static SpinTeam& Default();

  // The team bound to this thread (a worker's own team, or the one a
  // backend bound with Bind), else Default().
  static SpinTeam& Current();

  // The threads a kernel's run asks for on this thread: the bound team's
  // size, else omp_get_max_threads().
  static int CurrentThreads();

  // While it lives, this thread's kernels run on `team` and keep their
  // buffers in the team's slot 0. Binding a team already bound here (a
  // backend's op called from one of its own runs) changes nothing.
  struct Binding {
    SpinTeam* team = nullptr;
    ThreadScratch* scratch = nullptr;
    bool changed = false;
  };
  static Binding BindHere(SpinTeam& team);  // returns what to restore
  static void Restore(const Binding& previous);
  class Bind {
   public:
    explicit Bind(SpinTeam& team) : previous_(BindHere(team)) {}
    ~Bind() { Restore(previous_); }
    Bind(const Bind&) = delete;
    Bind& operator=(const Bind&) = delete;

   private:
    Binding previous_;
  };

  // What the team's scratch holds (every thread's), and freeing it. Not
  // while a run is in progress.
  uint64_t ScratchBytes() const;
  void ReleaseScratch();

  // True where the kernels' config asks for passive waits: the workers then
  // sleep at once instead of after kIdleBeforeSleep.
  static bool PassiveWaits();

  // Calls fn(t, nt) once for every t in [0, nt), nt = min(threads, size()),
  // t = 0 on the calling thread, and returns when every call has returned.
  // Called from inside a run (by fn), or while another thread's run is in
  // progress, or in a child process made by fork() after the team started
  // (its threads are not there), it calls fn(0, 1) on the calling thread
  // instead. fn must not throw.
  template <class F>
  void Run(int threads, F&& fn) {
    using Fn = std::remove_reference_t<F>;
    RunRaw(threads, [](void* ctx, int t, int nt) { (*static_cast<Fn*>(ctx))(t, nt); },
           const_cast<void*>(static_cast<const void*>(&fn)));
  }

  // The thread count a Run(threads, ...) from this thread would use now
  // (starting the team if it has not started): min(threads, size()).
  int Threads(int threads);

  // Inside a run of nt threads: returns once all nt have called it (what
  // OpenMP's barrier is in a parallel region). Every thread of the run must
  // call it the same number of times; with nt = 1 it returns at once.
  void Barrier(int nt);

  // Threads a run can use, the calling thread included (1 before the first
  // run with threads > 1).
  int size() const { return num_workers_.load(std::memory_order_acquire) + 1; }

  // For tests: the workers asleep now (or about to be).
  int asleep() const { return sleepers_.load(std::memory_order_seq_cst); }

 private:
  using RawFn = void (*)(void*, int, int);
  void RunRaw(int threads, RawFn fn, void* ctx);
  void Start(int workers);
  void Work(int index);

  const int threads_;  // 0: omp_get_max_threads() at Start
  std::mutex start_mu_;
  // Thread t's buffers: [0] the calling thread's (while bound), [t] worker t's.
  std::vector<std::unique_ptr<ThreadScratch>> scratch_;
  std::atomic<bool> stop_{false};  // the destructor's: workers return
  std::chrono::microseconds idle_before_sleep_ = kIdleBeforeSleep;
  std::vector<std::thread> workers_;
  std::atomic<int> num_workers_{0};  // workers_.size() once started, for readers without the mutex
  // The current task, written by the caller before it bumps generation_.
  RawFn fn_ = nullptr;
  void* ctx_ = nullptr;
  int nt_ = 0;
  std::atomic<bool> busy_{false};  // a run is in progress
  alignas(64) std::atomic<int> barrier_count_{0};       // threads at the barrier
  alignas(64) std::atomic<uint32_t> barrier_round_{0};  // one more each time all have arrived
  alignas(64) std::atomic<uint32_t> generation_{0};  // one more per task; the sleepers' futex word
  alignas(64) std::atomic<int> pending_{0};          // workers that have not finished the task
  alignas(64) std::atomic<int> sleepers_{0};         // workers asleep (or about to be) on generation_
};

// Iterations [first, last) of n for thread t of nt, as OpenMP's
// schedule(static) splits them (libgomp: the first n % nt threads take one
// more).
struct StaticRange {
  int64_t first, last;
  StaticRange(int64_t n, int t, int nt) {
    const int64_t q = n / nt, r = n % nt;
    first = t * q + std::min<int64_t>(t, r);
    last = first + q + (t < r ? 1 : 0);
  }
};

// Items [0, n) handed out one at a time to whichever thread of a run asks
// next (OpenMP's schedule(dynamic, 1)). Made before the run, shared by its
// threads, used for one loop.
class DynamicItems {
 public:
  explicit DynamicItems(int64_t n) : n_(n) {}
  // f(i) for every item this thread gets.
  template <class F>
  void ForEach(F&& f) {
    for (int64_t i = next_.fetch_add(1, std::memory_order_relaxed); i < n_;
         i = next_.fetch_add(1, std::memory_order_relaxed)) {
      f(i);
    }
  }

 private:
  const int64_t n_;
  std::atomic<int64_t> next_{0};
};

// Items [0, n) split among nt threads as StaticRange splits them, each
// thread taking its own range from the front, half of what is left of it at
// a time (never less than `chunk`); a thread whose range is done takes from
// the others' ranges the same way (the following threads' first). Each
// thread streams its own contiguous span, as under schedule(static), and
// touches a counter no other thread touches until its span runs out, in
// about log2(span / chunk) atomic adds (each waits for the loads in flight:
// 16 KiB chunks cost about 2% of a decode step), but the run no longer waits
// for a thread that one vCPU's slow phase held back
// (docs/history/BENCHMARKS-log.md). Made before the run of nt threads, shared by them, used for
// one loop. The counters of up to kInlineSpans threads live in the object
// itself: a decode step makes about 150 of these, so no allocation for them.
class StealingRanges {
 public:
  StealingRanges(int64_t n, int nt, int64_t chunk)
      : chunk_(std::max<int64_t>(chunk, 1)), nt_(nt), heap_(nt > kInlineSpans ? nt : 0),
        spans_(nt > kInlineSpans ? heap_.data() : inline_.data()) {
    for (int t = 0; t < nt_; ++t) {
      const StaticRange r(n, t, nt_);
      spans_[t].next.store(r.first, std::memory_order_relaxed);
      spans_[t].last = r.last;
    }
  }
  StealingRanges(const StealingRanges&) = delete;
  StealingRanges& operator=(const StealingRanges&) = delete;
  // f(first, last) for every piece [first, last) thread t of the run gets.
  template <class F>
  void ForEach(int t, F&& f) {
    for (int i = 0; i < nt_; ++i) {
      Span& s = spans_[(t + i) % nt_];
      for (int64_t seen = s.next.load(std::memory_order_relaxed); seen < s.last;
           seen = s.next.load(std::memory_order_relaxed)) {
        const int64_t take = std::max(chunk_, (s.last - seen) / 2);
        const int64_t first = s.next.fetch_add(take, std::memory_order_relaxed);
        if (first >= s.last) break;
        f(first, std::min(first + take, s.last));
      }
    }
  }

 private:
  struct alignas(64) Span {
    std::atomic<int64_t> next{0};
    int64_t last = 0;
  };
  static constexpr int kInlineSpans = 4;
  const int64_t chunk_;
  const int nt_;
  std::array<Span, kInlineSpans> inline_;
  std::vector<Span> heap_;  // nt > kInlineSpans
  Span* spans_;
};

}  // namespace snapfill::cpu::internal

#endif  // SNAPFILL_KERNELS_CPU_SPIN_TEAM_H_
