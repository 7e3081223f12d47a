// PathRegex: RE2 behind a small interface (see path_regex.h for why RE2).
#include "plan/path_regex.h"

#include <re2/re2.h>

#include "runtime/error.h"

namespace mt {

namespace {

// A pattern as shown in a message: at most 80 bytes, control bytes escaped.
std::string excerpt(std::string_view p) {
  std::string s;
  for (size_t i = 0; i < p.size() && i < 80; ++i) {
    unsigned char c = static_cast<unsigned char>(p[i]);
    if (c < 0x20 || c == 0x7f) s += fmt::format("\\x{:02x}", c);
    else s += static_cast<char>(c);
  }
  if (p.size() > 80) s += fmt::format("... ({} bytes)", p.size());
  return s;
}

}  // namespace

PathRegex::PathRegex(const std::string& pattern, const PlanLoc& loc, std::string_view expected) {
  MT_CHECK(pattern.size() <= kMaxPatternBytes,
           "{}: the regular expression is {} bytes long ('{}'); expected at most {} bytes", loc.str(),
           pattern.size(), excerpt(pattern), kMaxPatternBytes);
  RE2::Options opts;
  opts.set_log_errors(false);  // the error goes into our message, not to stderr
  re_ = std::make_unique<RE2>(pattern, opts);
  if (re_->ok()) return;
  // Point at the part RE2 names (e.g. the "(?=" of a lookahead) when it occurs in the pattern.
  PlanLoc at = loc;
  size_t off = re_->error_arg().empty() ? std::string::npos : pattern.find(re_->error_arg());
  if (at.column > 0 && off != std::string::npos) at.column += static_cast<int>(off);
  MT_FAIL("{}: '{}' is not a valid regular expression ({}); expected {} (RE2 syntax, fully matched: no "
          "backreferences or lookaround)",
          at.str(), excerpt(pattern), re_->error(), expected);
}

PathRegex::~PathRegex() = default;
PathRegex::PathRegex(PathRegex&&) noexcept = default;
PathRegex& PathRegex::operator=(PathRegex&&) noexcept = default;

bool PathRegex::full_match(std::string_view s) const {
  return RE2::FullMatch(re2::StringPiece(s.data(), s.size()), *re_);
}

}  // namespace mt
