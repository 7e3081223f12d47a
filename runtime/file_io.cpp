// Atomic, durable file writes (file_io.h).
#include "runtime/file_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "runtime/error.h"

namespace mt {

namespace fs = std::filesystem;

namespace {

std::string errno_text() { return std::strerror(errno); }

}  // namespace

void fsync_path(const std::string& p) {
  const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
  MT_CHECK(fd >= 0, "cannot open {} to sync it: {}", p, std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  MT_CHECK(rc == 0 || err == EINVAL, "cannot sync {}: {}", p, std::strerror(err));
}

void write_file_atomically(const std::string& path, const std::function<void(std::ostream&)>& fill) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (!ec && fs::exists(st) && !fs::is_regular_file(st) && !fs::is_directory(st)) {
    // A device, pipe or socket (/dev/null, /dev/stdout, a FIFO) is written in place: renaming a
    // temporary file over it would replace the device node itself.
    std::ofstream out(path, std::ios::binary);
    MT_CHECK(out.is_open(), "cannot write '{}': {}", path, errno_text());
    fill(out);
    out.flush();
    MT_CHECK(out.good(), "cannot write '{}': {}", path, errno_text());
    return;
  }
  const std::string tmp = fmt::format("{}.tmp.{}", path, static_cast<long>(::getpid()));
  auto cleanup = [&] {
    std::error_code ec;
    fs::remove(tmp, ec);
  };
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    MT_CHECK(out.is_open(), "cannot write '{}': {}", path, errno_text());
    try {
      fill(out);
      out.flush();
    } catch (...) {
      out.close();
      cleanup();
      throw;
    }
    if (!out.good()) {
      std::string why = errno_text();
      out.close();
      cleanup();
      MT_FAIL("cannot write '{}': {}", path, why);
    }
    out.close();
    if (out.fail()) {
      cleanup();
      MT_FAIL("cannot write '{}': closing failed", path);
    }
  }
  // Make the data durable before the rename publishes it. A failed sync (EIO, ENOSPC on some file
  // systems) fails the write: renamed in, the file could name a step that `latest` then points at
  // and --keep prunes the last good one for.
  try {
    fsync_path(tmp);
  } catch (const Error& e) {
    cleanup();
    MT_FAIL("cannot write '{}': {}", path, e.what());
  }
  fs::rename(tmp, path, ec);
  if (ec) {
    cleanup();
    MT_FAIL("cannot write '{}': renaming the temporary file failed: {}", path, ec.message());
  }
}

}  // namespace mt
