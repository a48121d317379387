#include "kernels/cpu/thread_team.h"

#include <algorithm>

#include "kernels/cpu/spin_team.h"

namespace snapfill::cpu {

ThreadTeam::ThreadTeam(int threads)
    : threads_(std::max(1, threads)), team_(std::make_unique<internal::SpinTeam>(threads_)) {}

ThreadTeam::~ThreadTeam() = default;

uint64_t ThreadTeam::ScratchBytes() const { return team_->ScratchBytes(); }

void ThreadTeam::ReleaseScratch() { team_->ReleaseScratch(); }

ThreadTeam::Scope::Scope(ThreadTeam& team) {
  const internal::SpinTeam::Binding previous = internal::SpinTeam::BindHere(*team.team_);
  team_ = previous.team;
  scratch_ = previous.scratch;
  changed_ = previous.changed;
}

ThreadTeam::Scope::~Scope() { internal::SpinTeam::Restore({team_, scratch_, changed_}); }

}  // namespace snapfill::cpu
