// Fuzzes parse_plan (plan/plan.h) from a string: the tokenizer (escapes, comments, groups), the
// placement syntax S(0) / RS(d,[..],b) / owner(k,d), mesh declarations and the regex checks. Why:
// plan files are hand-written, and every error must be a file:line:col message, never a crash
// or a hang. A plan that parses must print (Plan::str) to text that parses again to the same
// text, and resolve_mesh must either fit a small world or refuse it with mt::Error.
#include "plan/plan.h"
#include "tests/fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace mt;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  Plan plan;
  if (!fuzz::expect_ok_or_user_error([&] { plan = parse_plan(text, "fuzz.plan"); })) return 0;

  std::string printed, reprinted;
  const bool ok = fuzz::expect_ok_or_user_error([&] {
    printed = plan.str();
    reprinted = parse_plan(printed, "printed.plan").str();
  });
  if (!ok) fuzz::finding("round trip", "Plan::str() of a parsed plan does not parse:\n" + printed);
  if (printed != reprinted) fuzz::finding("round trip", "str(parse(str(p))) != str(p):\n" + printed + "\n--\n" + reprinted);
  for (int64_t world : {1, 2, 4, 6, 8})
    fuzz::expect_ok_or_user_error([&] { (void)plan.resolve_mesh(world).str(); });
  return 0;
}
