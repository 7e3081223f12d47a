// Errors: MT_CHECK for user errors (always on), MT_ASSERT for internal bugs.
// Both throw mt::Error (never exit()), so a tool's main() can log with the rank and abort the job.
// Messages are formatted with fmt and must name the op, shapes, dtypes or paths at fault.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace mt {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

[[noreturn]] void throw_error(const char* file, int line, const std::string& msg);
[[noreturn]] void throw_internal(const char* file, int line, const char* expr, const std::string& msg);

// Levenshtein distance (insertions, deletions, substitutions of one char each), for the
// "did you mean" hints of errors that name an unknown module, parameter or plan path.
size_t edit_distance(const std::string& a, const std::string& b);

}  // namespace mt

// User-facing check: `MT_CHECK(a.dim() == 2, "matmul: expected 2-D, got {}", a.shape())`.
#define MT_CHECK(cond, ...)                                        \
  do {                                                             \
    if (!(cond)) [[unlikely]]                                      \
      ::mt::throw_error(__FILE__, __LINE__, fmt::format(__VA_ARGS__)); \
  } while (0)

#define MT_FAIL(...) ::mt::throw_error(__FILE__, __LINE__, fmt::format(__VA_ARGS__))

// Invariant that only a bug in meshtrain can break.
#define MT_ASSERT(cond, ...)                                                       \
  do {                                                                             \
    if (!(cond)) [[unlikely]]                                                      \
      ::mt::throw_internal(__FILE__, __LINE__, #cond, fmt::format("" __VA_ARGS__)); \
  } while (0)
