// Log sink: stderr, one line per call, rank-prefixed.
#include "runtime/log.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace mt {
namespace {
int g_rank = 0;
int g_world = 1;

LogLevel parse_level() {
  const char* s = std::getenv("MT_LOG_LEVEL");
  if (!s) return LogLevel::kInfo;
  if (!std::strcmp(s, "debug")) return LogLevel::kDebug;
  if (!std::strcmp(s, "warn")) return LogLevel::kWarn;
  if (!std::strcmp(s, "error")) return LogLevel::kError;
  return LogLevel::kInfo;
}
}  // namespace

LogLevel log_level() {
  static const LogLevel level = parse_level();
  return level;
}

void set_log_rank(int rank, int world) {
  g_rank = rank;
  g_world = world;
}

void log_line(LogLevel level, std::string_view msg) {
  static const char* kNames[] = {"debug", "info", "warn", "error"};
  fmt::print(stderr, "[rank {}/{}] {}: {}\n", g_rank, g_world, kNames[static_cast<int>(level)], msg);
  std::fflush(stderr);
}

}  // namespace mt
