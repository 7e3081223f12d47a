// Out-of-line error construction keeps the check macros small at every call site.
#include "runtime/error.h"

#include <algorithm>
#include <vector>

namespace mt {

void throw_error(const char* /*file*/, int /*line*/, const std::string& msg) {
  // User errors carry only the message: it already names what is wrong.
  throw Error(msg);
}

void throw_internal(const char* file, int line, const char* expr, const std::string& msg) {
  throw Error(fmt::format("internal error at {}:{}: `{}` failed{}{} (this is a meshtrain bug)", file,
                          line, expr, msg.empty() ? "" : ": ", msg));
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

}  // namespace mt
