// The kernels' thread team (kernels/cpu/spin_team.h): every run calls its
// function once per thread index, on the calling thread for index 0; runs
// follow each other without losing one, after the workers went to sleep
// too; a run from inside a run, or beside another thread's, runs on the
// calling thread alone; its barrier holds every thread until all arrive;
// cpu::ParallelFor covers every index once; StealingRanges gives each
// thread its own span first, every item once, and lets a thread done first
// take what a held-back thread left.
#include "kernels/cpu/spin_team.h"

#include <omp.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/files.h"
#include "kernels/cpu/ops.h"

namespace snapfill::cpu::internal {
namespace {

// The team has omp_get_max_threads() - 1 workers; these tests need one.
bool TwoThreads() { return omp_get_max_threads() >= 2; }

TEST(SpinTeamTest, EveryIndexOnceIndexZeroOnTheCaller) {
  if (!TwoThreads()) GTEST_SKIP() << "one thread";
  SpinTeam& team = SpinTeam::Default();
  const std::thread::id caller = std::this_thread::get_id();
  for (int threads : {2, 3, 64}) {
    std::vector<std::atomic<int>> calls(64);
    std::atomic<int> seen_nt{0};
    std::atomic<bool> zero_on_caller{false}, others_elsewhere{true};
    team.Run(threads, [&](int t, int nt) {
      calls[t].fetch_add(1);
      seen_nt.store(nt);
      if (t == 0) zero_on_caller.store(std::this_thread::get_id() == caller);
      if (t != 0 && std::this_thread::get_id() == caller) others_elsewhere.store(false);
    });
    const int nt = std::min(threads, team.size());
    EXPECT_GE(team.size(), 2);
    EXPECT_EQ(seen_nt.load(), nt);
    for (int t = 0; t < 64; ++t) EXPECT_EQ(calls[t].load(), t < nt ? 1 : 0) << "index " << t << " of " << nt;
    EXPECT_TRUE(zero_on_caller.load());
    EXPECT_TRUE(others_elsewhere.load());
  }
}

// Many short runs back to back (as a decode step's regions), each summing
// into its own slots: nothing lost, nothing run twice, and each run's
// writes are seen by the caller when Run returns.
TEST(SpinTeamTest, BackToBackRunsLoseNothing) {
  if (!TwoThreads()) GTEST_SKIP() << "one thread";
  SpinTeam& team = SpinTeam::Default();
  constexpr int kRuns = 20000;
  std::vector<int64_t> slots(2 * 16, 0);  // a line per index
  int64_t expected = 0;
  for (int r = 0; r < kRuns; ++r) {
    team.Run(2, [&](int t, int) { slots[16 * t] += r + t; });
    expected += r;
    ASSERT_EQ(slots[0], expected) << "run " << r;
    if (team.size() >= 2) {
      ASSERT_EQ(slots[16], expected + r + 1) << "run " << r;  // + t = 1 per run
    }
  }
}

// After kIdleBeforeSleep without work every worker sleeps; the next run
// wakes them, and runs go on as before.
TEST(SpinTeamTest, RunsAfterTheWorkersSlept) {
  if (!TwoThreads()) GTEST_SKIP() << "one thread";
  SpinTeam& team = SpinTeam::Default();
  team.Run(2, [](int, int) {});
  for (int round = 0; round < 3; ++round) {
    std::this_thread::sleep_for(SpinTeam::kIdleBeforeSleep * 4 + std::chrono::milliseconds(20));
    EXPECT_EQ(team.asleep(), team.size() - 1) << "round " << round;
    std::atomic<int> calls{0};
    team.Run(2, [&](int, int) { calls.fetch_add(1); });
    EXPECT_EQ(calls.load(), 2) << "round " << round;
  }
}

// A run inside a run (from any of its threads) and a run beside another
// thread's run both run on their calling thread alone, and return.
TEST(SpinTeamTest, NestedAndConcurrentRunsRunAlone) {
  if (!TwoThreads()) GTEST_SKIP() << "one thread";
  SpinTeam& team = SpinTeam::Default();
  std::atomic<int> inner_calls{0}, inner_bad{0};
  team.Run(2, [&](int, int) {
    team.Run(2, [&](int t, int nt) {
      inner_calls.fetch_add(1);
      if (t != 0 || nt != 1) inner_bad.fetch_add(1);
    });
  });
  EXPECT_EQ(inner_calls.load(), 2);  // once from each of the outer run's threads
  EXPECT_EQ(inner_bad.load(), 0);

  // Two threads run at once, 2,000 times each: every run completes with
  // every index it was given exactly once.
  std::atomic<int> bad{0};
  auto many = [&] {
    for (int r = 0; r < 2000; ++r) {
      std::atomic<int> mask{0};
      int given = 0;
      team.Run(2, [&](int t, int nt) {
        mask.fetch_or(1 << t);
        if (t == 0) given = nt;
      });
      if (mask.load() != (1 << given) - 1) bad.fetch_add(1);
    }
  };
  std::thread other(many);
  many();
  other.join();
  EXPECT_EQ(bad.load(), 0);
}

// Where OpenMP binds its threads, each worker runs on the CPUs of the place
// OpenMP's thread of that index would (ctest runs this suite once more
// with OMP_PROC_BIND=close and OMP_PLACES=cores for it).
TEST(SpinTeamTest, WorkersBoundWhereOpenMpBinds) {
  if (!TwoThreads()) GTEST_SKIP() << "one thread";
  if (omp_get_proc_bind() == omp_proc_bind_false || omp_get_num_places() < 2) {
    GTEST_SKIP() << "OpenMP binds no threads here";
  }
  SpinTeam& team = SpinTeam::Default();
  const int places = omp_get_num_places();
  const int home = std::max(0, omp_get_place_num());
  std::vector<std::set<int>> got(64);
  team.Run(64, [&](int t, int) {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (t > 0 && sched_getaffinity(0, sizeof(set), &set) == 0) {
      for (int c = 0; c < CPU_SETSIZE; ++c) {
        if (CPU_ISSET(c, &set)) got[t].insert(c);
      }
    }
  });
  for (int t = 1; t < team.size(); ++t) {
    const int place = (home + t) % places;
    std::vector<int> ids(omp_get_place_num_procs(place));
    omp_get_place_proc_ids(place, ids.data());
    EXPECT_EQ(got[t], std::set<int>(ids.begin(), ids.end())) << "worker " << t << ", place " << place;
  }
}

// cpu::ParallelFor, the team offered to the callers above the kernels:
// every index once, none for n <= 0, and a loop inside a loop covers its
// own indices too (on the calling thread).
TEST(SpinTeamTest, ParallelForEveryIndexOnce) {
  for (const int64_t n : {0, 1, 2, 3, 1000}) {
    std::vector<std::atomic<int>> hits(std::max<int64_t>(n, 1));
    cpu::ParallelFor(n, [&](int64_t i) { hits[i].fetch_add(1); });
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(hits[i].load(), 1) << "n " << n << " i " << i;
    if (n == 0) {
      EXPECT_EQ(hits[0].load(), 0);
    }
  }
  std::vector<std::atomic<int>> inner(4 * 50);
  cpu::ParallelFor(4, [&](int64_t i) {
    cpu::ParallelFor(50, [&](int64_t j) { inner[i * 50 + j].fetch_add(1); });
  });
  for (size_t i = 0; i < inner.size(); ++i) EXPECT_EQ(inner[i].load(), 1) << i;
}

// The barrier: no thread passes it before every thread of the run has
// arrived, round after round.
TEST(SpinTeamTest, BarrierHoldsUntilAllArrive) {
  if (!TwoThreads()) GTEST_SKIP() << "one thread";
  SpinTeam& team = SpinTeam::Default();
  constexpr int kRounds = 5000;
  std::atomic<int> arrived{0}, early{0};
  team.Run(2, [&](int t, int nt) {
    for (int r = 0; r < kRounds; ++r) {
      arrived.fetch_add(1);
      if (t == 1 && r % 7 == 0) std::this_thread::yield();  // arrive late now and then
      team.Barrier(nt);
      if (arrived.load() < (r + 1) * nt) early.fetch_add(1);
      team.Barrier(nt);
    }
  });
  EXPECT_EQ(early.load(), 0);
  EXPECT_EQ(arrived.load(), kRounds * std::min(2, team.size()));
}

// A child of fork() has none of the team's threads: its runs run on the
// calling thread (rather than wait for workers that are not there).
TEST(SpinTeamTest, RunsAloneInAForkedChild) {
  if (!TwoThreads()) GTEST_SKIP() << "one thread";
  SpinTeam& team = SpinTeam::Default();
  team.Run(2, [](int, int) {});  // started
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    alarm(20);  // a hang fails the test instead of stalling it
    int calls = 0, bad = 0;
    for (int r = 0; r < 100; ++r) {
      team.Run(2, [&](int t, int nt) {
        ++calls;
        if (t != 0 || nt != 1) ++bad;
      });
    }
    _exit(calls == 100 && bad == 0 ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "the child did not exit (signal " << WTERMSIG(status) << ")";
  EXPECT_EQ(WEXITSTATUS(status), 0);
  // The parent's team still runs on all its threads.
  std::atomic<int> calls{0};
  team.Run(2, [&](int, int) { calls.fetch_add(1); });
  EXPECT_EQ(calls.load(), 2);
}

TEST(SpinTeamTest, OneThreadRunsOnTheCaller) {
  SpinTeam& team = SpinTeam::Default();
  const std::thread::id caller = std::this_thread::get_id();
  int calls = 0;
  bool ok = true;
  team.Run(1, [&](int t, int nt) {
    ++calls;
    ok = ok && t == 0 && nt == 1 && std::this_thread::get_id() == caller;
  });
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(ok);
}

// The threads of this process now.
int ProcessThreads() { return static_cast<int>(testing::ListDir("/proc/self/task").size()); }

// A backend's own team: its size is what it was made with, whatever
// OpenMP's count; its threads start on the first run that wants them and
// are gone when it is destroyed.
TEST(SpinTeamTest, AnOwnTeamStartsItsThreadsAndStopsThem) {
  const int before = ProcessThreads();
  {
    SpinTeam team(3);
    EXPECT_EQ(ProcessThreads(), before) << "threads before the first run";
    std::set<std::thread::id> ids;
    std::mutex mu;
    team.Run(3, [&](int, int nt) {
      std::lock_guard<std::mutex> lock(mu);
      ids.insert(std::this_thread::get_id());
      EXPECT_EQ(nt, 3);
    });
    EXPECT_EQ(ids.size(), 3u);
    EXPECT_EQ(team.size(), 3);
    EXPECT_EQ(ProcessThreads(), before + 2);
    // Asleep or spinning, the workers end with the team.
    std::this_thread::sleep_for(SpinTeam::kIdleBeforeSleep * 2 + std::chrono::milliseconds(10));
  }
  // (A joined thread's /proc entry can outlast the join by a moment: the
  // kernel wakes the joiner as the thread exits and reaps the task after;
  // CI once counted one thread more. Up to a second for it to go.)
  for (int i = 0; i < 100 && ProcessThreads() != before; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(ProcessThreads(), before) << "the team's threads outlived it";
}

// While a team is bound, the kernels' team and thread count are its own
// (in its workers too); unbound, the default's and OpenMP's; binding the
// team already bound (an op called from the team's own run) changes nothing.
TEST(SpinTeamTest, ABoundTeamIsTheKernelsTeam) {
  SpinTeam team(3);
  EXPECT_EQ(&SpinTeam::Current(), &SpinTeam::Default());
  EXPECT_EQ(SpinTeam::CurrentThreads(), omp_get_max_threads());
  {
    const SpinTeam::Bind bound(team);
    EXPECT_EQ(&SpinTeam::Current(), &team);
    EXPECT_EQ(SpinTeam::CurrentThreads(), 3);
    std::atomic<int> own{0};
    team.Run(3, [&](int, int) {
      const SpinTeam::Bind again(team);
      if (&SpinTeam::Current() == &team && SpinTeam::CurrentThreads() == 3) own.fetch_add(1);
    });
    EXPECT_EQ(own.load(), 3);
    EXPECT_EQ(&SpinTeam::Current(), &team);
  }
  EXPECT_EQ(&SpinTeam::Current(), &SpinTeam::Default());
}

// Each thread of a team has its own scratch, the calling thread the team's
// slot 0 while bound and one of its own otherwise; the team counts what
// they hold and frees it.
TEST(SpinTeamTest, ScratchBelongsToTheTeamsThreads) {
  struct Buffer {
    std::vector<float> v;
    uint64_t bytes() const { return CapacityBytes(v); }
  };
  SpinTeam team(2);
  ThreadScratch* outside = &CurrentScratch();
  std::vector<ThreadScratch*> seen(2, nullptr);
  {
    const SpinTeam::Bind bound(team);
    EXPECT_NE(&CurrentScratch(), outside);
    team.Run(2, [&](int t, int nt) {
      seen[t] = &CurrentScratch();
      CurrentScratch().Get<Buffer>().v.resize(1000 * (t + 1));
      if (nt == 1) CurrentScratch().Get<Buffer>().v.resize(3000);  // (a run alone: both on one)
    });
  }
  EXPECT_EQ(&CurrentScratch(), outside);
  EXPECT_NE(seen[0], nullptr);
  if (seen[1] != nullptr) {
    EXPECT_NE(seen[0], seen[1]);
  }
  EXPECT_GE(team.ScratchBytes(), 3000 * sizeof(float));
  EXPECT_EQ(outside->bytes(), 0u);
  team.ReleaseScratch();
  EXPECT_EQ(team.ScratchBytes(), 0u);
}

// StealingRanges on one thread (what a run that falls back to the calling
// thread gets): thread 0's span, then the others' in thread order, each
// taken half of what is left at a time, never less than the chunk, and cut
// at the span's end; every item once.
TEST(StealingRangesTest, OneThreadTakesEverySpanInOrder) {
  using Pieces = std::vector<std::pair<int64_t, int64_t>>;
  auto pieces = [](int64_t n, int nt, int64_t chunk, int t) {
    StealingRanges ranges(n, nt, chunk);
    Pieces got;
    ranges.ForEach(t, [&](int64_t first, int64_t last) { got.emplace_back(first, last); });
    return got;
  };
  // Spans [0, 4), [4, 7), [7, 10).
  EXPECT_EQ(pieces(10, 3, 1, 0), (Pieces{{0, 2}, {2, 3}, {3, 4}, {4, 5}, {5, 6}, {6, 7}, {7, 8}, {8, 9}, {9, 10}}));
  EXPECT_EQ(pieces(10, 3, 3, 0), (Pieces{{0, 3}, {3, 4}, {4, 7}, {7, 10}}));
  EXPECT_EQ(pieces(10, 3, 100, 0), (Pieces{{0, 4}, {4, 7}, {7, 10}}));
  // Thread 2 of 3 starts with its own span, then wraps to thread 0's.
  EXPECT_EQ(pieces(10, 3, 1, 2), (Pieces{{7, 8}, {8, 9}, {9, 10}, {0, 2}, {2, 3}, {3, 4}, {4, 5}, {5, 6}, {6, 7}}));
  // A long span: halves first, then chunks, in about log2(span / chunk) pieces.
  const Pieces big = pieces(1024, 1, 8, 0);
  EXPECT_EQ(big.front(), (std::pair<int64_t, int64_t>{0, 512}));
  EXPECT_EQ(big.back().second, 1024);
  EXPECT_LE(big.size(), 9u);
  for (size_t i = 1; i < big.size(); ++i) EXPECT_EQ(big[i].first, big[i - 1].second);
  // More threads than the counters kept inline (the rest on the heap):
  // still every span in order, every item once.
  const Pieces many = pieces(100, 6, 100, 0);
  ASSERT_EQ(many.size(), 6u);
  for (size_t i = 0; i < many.size(); ++i) {
    EXPECT_EQ(many[i].first, i == 0 ? 0 : many[i - 1].second);
  }
  EXPECT_EQ(many.back().second, 100);
  // No items, or fewer than threads: nothing twice, nothing made up.
  EXPECT_TRUE(pieces(0, 2, 4, 0).empty());
  EXPECT_EQ(pieces(1, 3, 4, 1), (Pieces{{0, 1}}));
}

// On the team: every item once, whichever thread gets there first (under a
// loaded machine one thread may take nearly all); and when thread 0 holds
// back until thread 1 has helped with its span, thread 1 began with its own
// span's start and then took pieces of thread 0's.
TEST(StealingRangesTest, TeamTakesEveryItemOnceAndHelpsTheSlowThread) {
  if (!TwoThreads()) GTEST_SKIP() << "one thread";
  SpinTeam& team = SpinTeam::Default();
  constexpr int64_t kItems = 1000;
  for (const bool hold_back : {false, true}) {
    StealingRanges ranges(kItems, 2, 7);
    std::vector<std::atomic<int>> hits(kItems);
    std::atomic<bool> helped{false};
    int64_t first_of_1 = -1;  // (written by thread 1 only, read after the run)
    int run_nt = 0;
    team.Run(2, [&](int t, int nt) {
      if (t == 0) run_nt = nt;
      if (hold_back && t == 0 && nt == 2) {
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (!helped.load() && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
      }
      ranges.ForEach(t, [&](int64_t first, int64_t last) {
        if (t == 1 && first_of_1 < 0) first_of_1 = first;
        for (int64_t i = first; i < last; ++i) hits[i].fetch_add(1);
        if (t == 1 && first < kItems / 2) helped.store(true);
      });
    });
    for (int64_t i = 0; i < kItems; ++i) ASSERT_EQ(hits[i].load(), 1) << "item " << i;
    if (hold_back && run_nt == 2) {
      EXPECT_TRUE(helped.load()) << "thread 1 took none of the held-back thread's span";
      EXPECT_EQ(first_of_1, kItems / 2);
    }
  }
}

}  // namespace
}  // namespace snapfill::cpu::internal
