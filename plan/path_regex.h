// Linear-time regexes for plan files: module paths and parameter names are matched with RE2
// (a DFA/NFA engine whose time is linear in the input and whose memory is bounded), never with a
// backtracking engine, so a plan cannot make lowering hang (`((.*)*)*Q`) or overflow the stack (a
// 100 kB pattern). Patterns are bounded to kMaxPatternBytes; errors are "file:line:column: ..."
// at the offending part of the pattern. Internal to plan/: this header is not installed and no
// RE2 type appears in it.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "plan/plan.h"

namespace re2 {
class RE2;
}

namespace mt {

class PathRegex {
 public:
  // Longest pattern a plan may use (a stock plan's longest is ~60 bytes).
  static constexpr size_t kMaxPatternBytes = 4096;

  // Compiles `pattern` (RE2 syntax, fully matched). Throws mt::Error naming `loc` (moved to the
  // column of the offending part when RE2 names it), RE2's own message, and `expected`.
  PathRegex(const std::string& pattern, const PlanLoc& loc, std::string_view expected);
  ~PathRegex();
  PathRegex(PathRegex&&) noexcept;
  PathRegex& operator=(PathRegex&&) noexcept;

  // True when the whole of `s` matches (not a substring).
  bool full_match(std::string_view s) const;

 private:
  std::unique_ptr<re2::RE2> re_;
};

}  // namespace mt
