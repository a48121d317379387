// Status helpers for snapfill.
//
// Anything that can fail for reasons outside the code returns absl::Status or
// absl::StatusOr<T>. The local Abseil (20220623) has no status macros, so they
// are defined here, shaped like ABSL_RETURN_IF_ERROR / ABSL_ASSIGN_OR_RETURN
// so that they can become aliases later. Programmer errors are not statuses:
// SNAPFILL_CHECK aborts with file:line (SNAPFILL_DCHECK only in debug builds).
#ifndef SNAPFILL_STATUS_H_
#define SNAPFILL_STATUS_H_

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define SNAPFILL_STATUS_CONCAT_INNER_(a, b) a##b
#define SNAPFILL_STATUS_CONCAT_(a, b) SNAPFILL_STATUS_CONCAT_INNER_(a, b)

// Returns from the enclosing function if `expr` (an absl::Status) is not OK.
#define SNAPFILL_RETURN_IF_ERROR(expr)                      \
  do {                                                      \
    ::absl::Status snapfill_status_ = (expr);               \
    if (!snapfill_status_.ok()) return snapfill_status_;    \
  } while (0)

// Evaluates `rexpr` (an absl::StatusOr<T>); on error returns its status,
// otherwise moves the value into `lhs` (which may be a declaration).
#define SNAPFILL_ASSIGN_OR_RETURN(lhs, rexpr) \
  SNAPFILL_ASSIGN_OR_RETURN_IMPL_(SNAPFILL_STATUS_CONCAT_(snapfill_statusor_, __LINE__), lhs, rexpr)
#define SNAPFILL_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                                    \
  if (!statusor.ok()) return std::move(statusor).status();    \
  lhs = std::move(statusor).value()

namespace snapfill::internal {

// Streams a message and aborts when destroyed; used by SNAPFILL_CHECK.
class CheckFailure {
 public:
  CheckFailure(const char* file, int line, const char* cond) {
    stream_ << file << ":" << line << ": check failed: " << cond << " ";
  }
  [[noreturn]] ~CheckFailure() {
    std::fprintf(stderr, "%s\n", stream_.str().c_str());
    std::fflush(stderr);
    std::abort();
  }
  std::ostream& stream() { return stream_; }

 private:
  std::ostringstream stream_;
};

// Lets `cond ? (void)0 : Voidify() & stream` type-check.
struct CheckVoidify {
  void operator&(std::ostream&) {}
};

}  // namespace snapfill::internal

// Always-on invariant check: SNAPFILL_CHECK(n > 0) << "n=" << n;
#define SNAPFILL_CHECK(cond)                 \
  (cond) ? (void)0                           \
         : ::snapfill::internal::CheckVoidify() & \
               ::snapfill::internal::CheckFailure(__FILE__, __LINE__, #cond).stream()

#ifdef NDEBUG
#define SNAPFILL_DCHECK(cond) \
  while (false) SNAPFILL_CHECK(cond)
#else
#define SNAPFILL_DCHECK(cond) SNAPFILL_CHECK(cond)
#endif

#endif  // SNAPFILL_STATUS_H_
