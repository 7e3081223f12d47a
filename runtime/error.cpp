// Out-of-line error construction keeps the check macros small at every call site.
#include "runtime/error.h"

namespace mt {

void throw_error(const char* /*file*/, int /*line*/, const std::string& msg) {
  // User errors carry only the message: it already names what is wrong.
  throw Error(msg);
}

void throw_internal(const char* file, int line, const char* expr, const std::string& msg) {
  throw Error(fmt::format("internal error at {}:{}: `{}` failed{}{} (this is a meshtrain bug)", file,
                          line, expr, msg.empty() ? "" : ": ", msg));
}

}  // namespace mt
