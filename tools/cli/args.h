// Command-line flags for the meshtrain subcommands: `--name value` pairs (or `--name=value`),
// checked against the flags a command declares so that a typo is an error that lists them.
#pragma once

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace mt::cli {

// Thrown after `--help` printed a command's usage; main() exits 0.
struct HelpShown {};

// An error that ends the command with a documented exit code other than 1 (`parity`: 2 when no
// verdict could be reached). main() reports it like any error, with that code. `agreed`: every
// rank of the job throws it at the same point (the ranks agreed on it), so each returns the code
// and MPI ends normally; otherwise the job is ended at once (MPI_Abort with the code).
class ExitError : public std::runtime_error {
 public:
  ExitError(const std::string& what, int code, bool agreed)
      : std::runtime_error(what), code_(code), agreed_(agreed) {}
  int code() const { return code_; }
  bool agreed() const { return agreed_; }

 private:
  int code_;
  bool agreed_;
};

struct FlagSpec {
  std::string name;  // without the leading "--"
  std::string help;
  std::string default_value;  // "" = no default
  bool is_switch = false;     // takes no value
};

class Args {
 public:
  // Parses argv[first..]; throws naming the command and the bad flag, listing the valid ones.
  Args(const std::string& command, const std::vector<FlagSpec>& specs, int argc, char** argv, int first);

  bool has(const std::string& name) const;
  std::string str(const std::string& name) const;
  // The value as an int64: decimal digits with an optional '-', nothing else; errors name the
  // flag (garbage, or a value beyond int64).
  int64_t integer(const std::string& name) const;
  // The same, refused unless lo <= value <= hi (the error names the flag and the range).
  int64_t integer(const std::string& name, int64_t lo, int64_t hi) const;
  // A finite number (nan and inf are refused: no flag means anything by them).
  double real(const std::string& name) const;
  bool flag(const std::string& name) const;  // switches
  // Given on the command line, and for a switch turned on (`--overwrite=false` asks for nothing).
  bool asks(const std::string& name) const;
  // Throws unless `name` was given or has a default.
  std::string required(const std::string& name) const;
  static std::string usage(const std::string& command, const std::vector<FlagSpec>& specs);

 private:
  std::string command_;
  std::map<std::string, std::string> values_;
  std::map<std::string, FlagSpec> specs_;
};

}  // namespace mt::cli
