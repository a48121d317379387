// Internal to kernels/cpu: the buffers a kernel keeps from call to call on
// one thread (packed activations and weight rows, RoPE tables, a decode
// step's partial sums), grown as the shapes ask and reused, so that no
// product allocates. They belong to the thread team of the backend that
// runs the kernels (spin_team.h): one ThreadScratch per thread of the team,
// freed with it or by ReleaseScratch, and counted (bytes()) where the
// backend reports its memory. A kernel asks for its buffer by type:
//
//   XPack& xp = internal::CurrentScratch().Get<XPack>();
//
// Every type kept here has `uint64_t bytes() const` (what it holds now).
#ifndef SNAPFILL_KERNELS_CPU_THREAD_SCRATCH_H_
#define SNAPFILL_KERNELS_CPU_THREAD_SCRATCH_H_

#include <atomic>
#include <cstdint>
#include <vector>

namespace snapfill::cpu::internal {

// The capacity of vectors, in bytes (for the types' bytes()).
template <class... V>
uint64_t CapacityBytes(const V&... v) {
  return (uint64_t{0} + ... + static_cast<uint64_t>(v.capacity() * sizeof(typename V::value_type)));
}

// A small number per scratch type, the same for the whole process.
inline int NextScratchTypeId() {
  static std::atomic<int> next{0};
  return next.fetch_add(1, std::memory_order_relaxed);
}
template <class T>
int ScratchTypeId() {
  static const int id = NextScratchTypeId();
  return id;
}

class ThreadScratch {
 public:
  ThreadScratch() = default;
  ThreadScratch(const ThreadScratch&) = delete;
  ThreadScratch& operator=(const ThreadScratch&) = delete;
  ~ThreadScratch() { Clear(); }

  // This thread's T, made (empty) on first use.
  template <class T>
  T& Get() {
    const size_t id = static_cast<size_t>(ScratchTypeId<T>());
    if (id >= slots_.size()) slots_.resize(id + 1);
    Slot& s = slots_[id];
    if (s.p == nullptr) {
      s.p = new T();
      s.free = [](void* p) { delete static_cast<T*>(p); };
      s.bytes = [](const void* p) { return static_cast<const T*>(p)->bytes() + sizeof(T); };
    }
    return *static_cast<T*>(s.p);
  }

  // What every buffer holds now.
  uint64_t bytes() const {
    uint64_t total = 0;
    for (const Slot& s : slots_) {
      if (s.p != nullptr) total += s.bytes(s.p);
    }
    return total;
  }

  // Frees every buffer (the next Get makes it again). Not while a kernel of
  // this thread runs.
  void Clear() {
    for (Slot& s : slots_) {
      if (s.p != nullptr) s.free(s.p);
      s = Slot{};
    }
  }

 private:
  struct Slot {
    void* p = nullptr;
    void (*free)(void*) = nullptr;
    uint64_t (*bytes)(const void*) = nullptr;
  };
  std::vector<Slot> slots_;
};

// The calling thread's scratch: its slot in the team it belongs to (a
// worker's own, or slot 0 of the team a backend has bound to the calling
// thread, SpinTeam::Bind), else one of the thread's own.
ThreadScratch& CurrentScratch();

}  // namespace snapfill::cpu::internal

#endif  // SNAPFILL_KERNELS_CPU_THREAD_SCRATCH_H_
