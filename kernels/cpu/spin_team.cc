#include "kernels/cpu/spin_team.h"

#include <omp.h>
#include <pthread.h>
#include <sched.h>

#include <strings.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <vector>

#include "kernels/cpu/kernel_config.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define SNAPFILL_SPIN_PAUSE() _mm_pause()
#else
#define SNAPFILL_SPIN_PAUSE() ((void)0)
#endif

namespace snapfill::cpu::internal {
namespace {

using Clock = std::chrono::steady_clock;

// Rounds of `pause` between two sched_yield calls while waiting (about 0.3
// µs at the AMX VM's 9 ns per pause): a wait notices new work within that,
// and a thread of another process that needs this CPU gets it at the yield.
constexpr int kPausesPerYield = 32;

// One round of a wait: `pause`, or every kPausesPerYield-th round
// sched_yield (then true).
inline bool Relax(int round) {
  if (round % kPausesPerYield != kPausesPerYield - 1) {
    SNAPFILL_SPIN_PAUSE();
    return false;
  }
  sched_yield();
  return true;
}

// Where OpenMP binds its threads (OMP_PROC_BIND, OMP_PLACES), worker i goes
// where OpenMP's thread i of a "close" team would: the place i after the
// calling thread's.
void BindLikeOpenMp(std::thread& worker, int i) {
  const int places = omp_get_num_places();
  if (omp_get_proc_bind() == omp_proc_bind_false || places <= 0) return;
  const int place = ((omp_get_place_num() < 0 ? 0 : omp_get_place_num()) + i) % places;
  std::vector<int> ids(omp_get_place_num_procs(place));
  if (ids.empty()) return;
  omp_get_place_proc_ids(place, ids.data());
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int id : ids) {
    if (id >= 0 && id < CPU_SETSIZE) CPU_SET(id, &set);
  }
  pthread_setaffinity_np(worker.native_handle(), sizeof(set), &set);
}

// A child of fork() has only the thread that forked: every team's workers
// stayed in the parent, so its runs run alone.
std::atomic<bool> g_forked{false};

// The team and scratch slot bound to this thread (a worker's, or a
// backend's while one of its ops runs).
thread_local SpinTeam* t_team = nullptr;
thread_local ThreadScratch* t_scratch = nullptr;

}  // namespace

ThreadScratch& CurrentScratch() {
  if (t_scratch != nullptr) return *t_scratch;
  static thread_local ThreadScratch own;  // a thread outside any team
  return own;
}

SpinTeam::SpinTeam(int threads) : threads_(std::max(0, threads)) {
  scratch_.push_back(std::make_unique<ThreadScratch>());
}

SpinTeam::~SpinTeam() {
  if (workers_.empty()) return;
  if (g_forked.load(std::memory_order_relaxed)) {
    // The threads are not in this process: nothing to join or to end.
    new std::vector<std::thread>(std::move(workers_));
    return;
  }
  stop_.store(true, std::memory_order_seq_cst);
  generation_.fetch_add(1, std::memory_order_seq_cst);
  generation_.notify_all();
  for (std::thread& w : workers_) w.join();
}

SpinTeam& SpinTeam::Default() {
  static SpinTeam* const team = new SpinTeam(0);
  return *team;
}

SpinTeam& SpinTeam::Current() { return t_team != nullptr ? *t_team : Default(); }

int SpinTeam::CurrentThreads() {
  if (t_team != nullptr && t_team->threads_ > 0) return t_team->threads_;
  return omp_get_max_threads();
}

SpinTeam::Binding SpinTeam::BindHere(SpinTeam& team) {
  const Binding previous{t_team, t_scratch, t_team != &team};
  if (previous.changed) {
    t_team = &team;
    t_scratch = team.scratch_[0].get();
  }
  return previous;
}

void SpinTeam::Restore(const Binding& previous) {
  if (!previous.changed) return;
  t_team = previous.team;
  t_scratch = previous.scratch;
}

uint64_t SpinTeam::ScratchBytes() const {
  uint64_t total = 0;
  for (const auto& s : scratch_) total += s->bytes();
  return total;
}

void SpinTeam::ReleaseScratch() {
  for (auto& s : scratch_) s->Clear();
}

bool SpinTeam::PassiveWaits() { return ActiveKernelConfig().passive_waits; }

void SpinTeam::Start(int workers) {
  std::lock_guard<std::mutex> lock(start_mu_);
  if (!workers_.empty()) return;
  static std::once_flag at_fork;
  std::call_once(at_fork, [] {
    pthread_atfork(nullptr, nullptr, [] { g_forked.store(true, std::memory_order_relaxed); });
  });
  if (PassiveWaits()) idle_before_sleep_ = std::chrono::microseconds(0);
  for (int i = 1; i <= workers; ++i) scratch_.push_back(std::make_unique<ThreadScratch>());
  for (int i = 1; i <= workers; ++i) {
    workers_.emplace_back([this, i] { Work(i); });
    BindLikeOpenMp(workers_.back(), i);
  }
  num_workers_.store(workers, std::memory_order_release);
}

void SpinTeam::Work(int index) {
  t_team = this;
  t_scratch = scratch_[index].get();
  uint32_t seen = 0;
  for (;;) {
    // Wait for the next task: spin, yielding the CPU between short rounds,
    // until kIdleBeforeSleep has passed without one; then sleep on the
    // futex until the caller wakes us.
    Clock::time_point idle_since = Clock::now();
    uint32_t g;
    for (int round = 0; (g = generation_.load(std::memory_order_acquire)) == seen; ++round) {
      if (!Relax(round) || Clock::now() - idle_since < idle_before_sleep_) continue;
      sleepers_.fetch_add(1, std::memory_order_seq_cst);
      if (generation_.load(std::memory_order_seq_cst) == seen) {
        generation_.wait(seen, std::memory_order_seq_cst);
      }
      sleepers_.fetch_sub(1, std::memory_order_seq_cst);
      idle_since = Clock::now();
    }
    seen = g;
    if (stop_.load(std::memory_order_seq_cst)) return;
    // The task's fields were written before generation_ was bumped.
    if (index < nt_) fn_(ctx_, index, nt_);
    pending_.fetch_sub(1, std::memory_order_release);
  }
}

void SpinTeam::Barrier(int nt) {
  if (nt <= 1) return;
  const uint32_t round = barrier_round_.load(std::memory_order_acquire);
  if (barrier_count_.fetch_add(1, std::memory_order_acq_rel) == nt - 1) {
    barrier_count_.store(0, std::memory_order_relaxed);
    barrier_round_.fetch_add(1, std::memory_order_release);
    return;
  }
  for (int spin = 0; barrier_round_.load(std::memory_order_acquire) == round; ++spin) Relax(spin);
}

int SpinTeam::Threads(int threads) {
  if (g_forked.load(std::memory_order_relaxed)) return 1;
  if (threads > 1 && num_workers_.load(std::memory_order_acquire) == 0) {
    Start((threads_ > 0 ? threads_ : std::max(1, omp_get_max_threads())) - 1);
  }
  return std::max(1, std::min(threads, size()));
}

void SpinTeam::RunRaw(int threads, RawFn fn, void* ctx) {
  const int nt = Threads(threads);  // (starts the team first)
  const int workers = num_workers_.load(std::memory_order_acquire);
  if (nt <= 1 || busy_.exchange(true, std::memory_order_acquire)) {
    fn(ctx, 0, 1);
    return;
  }
  fn_ = fn;
  ctx_ = ctx;
  nt_ = nt;
  // Every worker takes part in every task (those past nt only count
  // themselves done), so that none still reads these fields when the next
  // task writes them.
  pending_.store(workers, std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_seq_cst);
  if (sleepers_.load(std::memory_order_seq_cst) > 0) generation_.notify_all();
  fn(ctx, 0, nt);
  for (int round = 0; pending_.load(std::memory_order_acquire) != 0; ++round) Relax(round);
  busy_.store(false, std::memory_order_release);
}

}  // namespace snapfill::cpu::internal
