// The threads a backend's CPU kernels run on, and the buffers the kernels
// keep between calls (spin_team.h, thread_scratch.h). A backend owns one,
// made with its thread count, and binds it to the calling thread while each
// of its ops runs (Scope): the kernels then split their work over these
// threads and keep their scratch in the team, which the backend can count
// and free. The threads start on the first op that uses more than one and
// stop when the team is destroyed. One calling thread at a time.
#ifndef SNAPFILL_KERNELS_CPU_THREAD_TEAM_H_
#define SNAPFILL_KERNELS_CPU_THREAD_TEAM_H_

#include <cstdint>
#include <memory>

namespace snapfill::cpu {
namespace internal {
class SpinTeam;
class ThreadScratch;
}  // namespace internal

class ThreadTeam {
 public:
  explicit ThreadTeam(int threads);  // threads >= 1
  ~ThreadTeam();
  ThreadTeam(const ThreadTeam&) = delete;
  ThreadTeam& operator=(const ThreadTeam&) = delete;

  int threads() const { return threads_; }

  // What the kernels' buffers hold now, over every thread of the team.
  uint64_t ScratchBytes() const;
  // Frees them (a kernel's next call makes its buffer again). Not while an
  // op runs.
  void ReleaseScratch();

  // While it lives, the calling thread's kernels run on this team.
  class Scope {
   public:
    explicit Scope(ThreadTeam& team);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    internal::SpinTeam* team_;
    internal::ThreadScratch* scratch_;
    bool changed_;
  };

 private:
  const int threads_;
  std::unique_ptr<internal::SpinTeam> team_;
};

}  // namespace snapfill::cpu

#endif  // SNAPFILL_KERNELS_CPU_THREAD_TEAM_H_
