// Logging through fmt, with the level from MT_LOG_LEVEL (debug|info|warn|error, default info)
// and every line prefixed "[rank r/w]" once the mesh layer has told us the rank.
#pragma once

#include <fmt/format.h>

#include <string_view>

namespace mt {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };

LogLevel log_level();
void set_log_rank(int rank, int world);
void log_line(LogLevel level, std::string_view msg);

template <class... Args>
void log(LogLevel level, fmt::format_string<Args...> f, Args&&... args) {
  if (level < log_level()) return;
  log_line(level, fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace mt

#define MT_LOG_INFO(...) ::mt::log(::mt::LogLevel::kInfo, __VA_ARGS__)
#define MT_LOG_WARN(...) ::mt::log(::mt::LogLevel::kWarn, __VA_ARGS__)
#define MT_LOG_DEBUG(...) ::mt::log(::mt::LogLevel::kDebug, __VA_ARGS__)
#define MT_LOG_ERROR(...) ::mt::log(::mt::LogLevel::kError, __VA_ARGS__)
