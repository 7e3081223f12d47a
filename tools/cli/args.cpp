// Flag parsing for the meshtrain CLI.
#include "tools/cli/args.h"

#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <stdexcept>

#include "runtime/error.h"

namespace mt::cli {
namespace {
std::string flag_list(const std::vector<FlagSpec>& specs) {
  std::string out;
  for (const auto& s : specs) out += (out.empty() ? "--" : ", --") + s.name;
  return out;
}
}  // namespace

Args::Args(const std::string& command, const std::vector<FlagSpec>& specs, int argc, char** argv, int first)
    : command_(command) {
  for (const auto& s : specs) specs_[s.name] = s;
  for (int i = first; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      fmt::print("{}", usage(command, specs));
      throw HelpShown{};
    }
    MT_CHECK(a.rfind("--", 0) == 0, "meshtrain {}: unexpected argument '{}' (flags: {})", command, a, flag_list(specs));
    std::string name = a.substr(2), value;
    bool inline_value = false;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      inline_value = true;
    }
    auto it = specs_.find(name);
    MT_CHECK(it != specs_.end(), "meshtrain {}: unknown flag --{} (flags: {}; --help explains them)", command, name,
             flag_list(specs));
    if (it->second.is_switch) {
      // `--no-cache=no` turned the cache off until 2026-12-08 (any value but 0 or false was true).
      const bool on = !inline_value || value == "1" || value == "true" || value == "yes";
      MT_CHECK(on || value == "0" || value == "false" || value == "no",
               "meshtrain {}: --{} is a switch: give it alone, or as --{}=true / --{}=false (1/0, yes/no), not '{}'",
               command, name, name, name, value);
      values_[name].assign(1, on ? '1' : '0');
      continue;
    }
    if (!inline_value) {
      MT_CHECK(i + 1 < argc, "meshtrain {}: flag --{} needs a value", command, name);
      value = argv[++i];
    }
    values_[name] = value;
  }
}

bool Args::has(const std::string& name) const { return values_.count(name) > 0; }

std::string Args::str(const std::string& name) const {
  auto it = values_.find(name);
  if (it != values_.end()) return it->second;
  auto s = specs_.find(name);
  MT_ASSERT(s != specs_.end(), "flag --{} not declared for {}", name, command_);
  return s->second.default_value;
}

std::string Args::required(const std::string& name) const {
  std::string v = str(name);
  MT_CHECK(!v.empty(), "meshtrain {}: --{} is required", command_, name);
  return v;
}

int64_t Args::integer(const std::string& name) const {
  const std::string v = str(name);
  int64_t x = 0;
  const char* end = v.data() + v.size();
  const auto [ptr, ec] = std::from_chars(v.data(), end, x);
  MT_CHECK(ec != std::errc::result_out_of_range, "meshtrain {}: --{} {} is out of range (a 64-bit integer: at most {})",
           command_, name, v, std::numeric_limits<int64_t>::max());
  MT_CHECK(ec == std::errc() && ptr == end && !v.empty(), "meshtrain {}: --{} expects an integer, got '{}'", command_,
           name, v);
  return x;
}

int64_t Args::integer(const std::string& name, int64_t lo, int64_t hi) const {
  const int64_t x = integer(name);
  MT_CHECK(x >= lo && x <= hi, "meshtrain {}: --{} {} is out of range (expected {} <= --{} <= {})", command_, name,
           x, lo, name, hi);
  return x;
}

double Args::real(const std::string& name) const {
  const std::string v = str(name);
  // strtod, not stod: a value below the smallest normal double (1e-320) is a number, which stod
  // refused as "out of range" until 2026-12-08; only one beyond the largest is.
  errno = 0;
  char* end = nullptr;
  const double x = v.empty() ? 0 : std::strtod(v.c_str(), &end);
  const bool parsed = !v.empty() && end == v.c_str() + v.size() && !std::isspace(static_cast<unsigned char>(v[0]));
  MT_CHECK(!(parsed && errno == ERANGE && std::fabs(x) > 1), "meshtrain {}: --{} {} is out of the range of a double",
           command_, name, v);
  MT_CHECK(parsed, "meshtrain {}: --{} expects a number, got '{}'", command_, name, v);
  MT_CHECK(std::isfinite(x), "meshtrain {}: --{} must be a finite number, got '{}'", command_, name, v);
  return x;
}

bool Args::asks(const std::string& name) const {
  const auto s = specs_.find(name);
  return has(name) && (s == specs_.end() || !s->second.is_switch || flag(name));
}

bool Args::flag(const std::string& name) const {
  std::string v = str(name);
  return !v.empty() && v != "0" && v != "false";
}

std::string Args::usage(const std::string& command, const std::vector<FlagSpec>& specs) {
  // The arguments a command takes before its flags (its --help left them out until 2026-12-07).
  const std::string positional = command == "tokenize"             ? " INPUT..."
                                 : command == "compare"            ? " A B"
                                 : command == "checkpoint inspect" ? " DIR"
                                                                   : "";
  std::string out = "usage: meshtrain " + command + positional + " [flags]\n";
  for (const auto& s : specs) {
    out += "  --" + s.name + (s.is_switch ? "" : " V") + "  " + s.help;
    if (!s.default_value.empty() && !s.is_switch) out += " (default " + s.default_value + ")";
    out += "\n";
  }
  return out;
}

}  // namespace mt::cli
