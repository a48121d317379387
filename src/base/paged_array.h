// PagedArray<T>: a fixed-size array in its own anonymous memory mapping.
//
// Its pages are zero and cost no resident memory until first written, and
// Release() hands whole pages back to the operating system (they read as zero
// afterwards). The prefill sizes its buffers for the largest step of a plan:
// with PagedArray a step that uses less (IMDC's memory starts small; its
// chunks shrink as the memory grows) also holds less, so peak resident memory
// follows what the schedule actually uses instead of the largest of each
// buffer (docs/history/BENCHMARKS-log.md, "peak memory of IMDC").
//
// Not a container: no growth and no copies.
// T must be trivially copyable; the contents start as zero bytes.
#ifndef SNAPFILL_BASE_PAGED_ARRAY_H_
#define SNAPFILL_BASE_PAGED_ARRAY_H_

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

namespace snapfill {

template <class T>
class PagedArray {
  static_assert(std::is_trivially_copyable_v<T>, "PagedArray holds plain data");

 public:
  PagedArray() = default;
  ~PagedArray() { Free(); }
  PagedArray(PagedArray&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  PagedArray& operator=(PagedArray&& o) noexcept {
    if (this != &o) {
      Free();
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  PagedArray(const PagedArray&) = delete;
  PagedArray& operator=(const PagedArray&) = delete;

  // Replaces the contents with n zero elements. False if the mapping cannot
  // be made (the array is then empty).
  bool Allocate(size_t n) {
    Free();
    if (n == 0) return true;
    void* p = mmap(nullptr, n * sizeof(T), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                   -1, 0);
    if (p == MAP_FAILED) return false;
    data_ = static_cast<T*>(p);
    size_ = n;
    return true;
  }

  T* data() { return data_; }
  const T* data() const { return data_; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  T* begin() { return data_; }
  T* end() { return data_ + size_; }
  const T* begin() const { return data_; }
  const T* end() const { return data_ + size_; }
  T& operator[](size_t i) { return data_[i]; }
  const T& operator[](size_t i) const { return data_[i]; }

  // Gives back the whole pages inside elements [first, first + count): they
  // stop counting as resident and read as zero afterwards. Partial pages at
  // either end are kept (their other elements may be in use).
  void Release(size_t first, size_t count) {
    if (data_ == nullptr || first >= size_) return;
    if (count > size_ - first) count = size_ - first;
    const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
    const uintptr_t lo = reinterpret_cast<uintptr_t>(data_ + first);
    const uintptr_t hi = reinterpret_cast<uintptr_t>(data_ + first + count);
    const uintptr_t a = (lo + page - 1) / page * page;
    const uintptr_t b = hi / page * page;
    if (b > a) madvise(reinterpret_cast<void*>(a), b - a, MADV_DONTNEED);
  }
  void ReleaseFrom(size_t first) { Release(first, first < size_ ? size_ - first : 0); }

 private:
  void Free() {
    if (data_ != nullptr) munmap(data_, size_ * sizeof(T));
    data_ = nullptr;
    size_ = 0;
  }

  T* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace snapfill

#endif  // SNAPFILL_BASE_PAGED_ARRAY_H_
