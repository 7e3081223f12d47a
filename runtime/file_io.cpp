// Atomic, durable file writes (file_io.h).
#include "runtime/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <utility>

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

namespace {

// `path_in` with a symbolic link followed: the file it names is replaced, the link stays.
std::string link_target(const std::string& path_in) {
  std::error_code ec;
  if (fs::is_symlink(fs::symlink_status(path_in, ec))) {
    const fs::path target = fs::canonical(path_in, ec);
    if (!ec) return target.string();
  }
  return path_in;
}

}  // namespace

bool written_in_place(const std::string& path_in) {
  std::error_code ec;
  const std::string path = link_target(path_in);
  const fs::file_status st = fs::status(path, ec);
  const bool special = !ec && fs::exists(st) && !fs::is_regular_file(st) && !fs::is_directory(st);
  return special || path_in.starts_with("/dev/") || path_in.starts_with("/proc/") || path.starts_with("/dev/") ||
         path.starts_with("/proc/");
}

void write_file_atomically(const std::string& path_in, const std::function<void(std::ostream&)>& fill) {
  std::error_code ec;
  const std::string path = link_target(path_in);
  if (written_in_place(path_in)) {
    // A device, pipe or socket (/dev/null, a FIFO), or anything reached through /dev or /proc
    // (/dev/stdout redirected to a file, maybe with >>), is written in place: a temporary renamed
    // over it would replace the device node, or the file a shell appends to.
    // The process's own stdout (or stderr) is written through that stream: a second descriptor
    // of a file the shell opened with `>` has an offset of its own, so what each wrote overwrote
    // the other's (a table on stdout and `--json /dev/stdout`, until 2026-12-08).
    for (auto [fd, stream] : {std::pair<int, std::ostream*>{1, &std::cout}, {2, &std::cerr}}) {
      struct stat mine{}, named{};
      if (::fstat(fd, &mine) != 0 || ::stat(path_in.c_str(), &named) != 0 || mine.st_dev != named.st_dev ||
          mine.st_ino != named.st_ino)
        continue;
      std::fflush(fd == 1 ? stdout : stderr);
      fill(*stream);
      stream->flush();
      MT_CHECK(stream->good(), "cannot write '{}': {}", path_in, errno_text());
      return;
    }
    std::ofstream out(path_in, std::ios::binary | std::ios::app);  // no O_TRUNC: a >> redirect keeps its file
    MT_CHECK(out.is_open(), "cannot write '{}': {}", path_in, errno_text());
    fill(out);
    out.flush();
    MT_CHECK(out.good(), "cannot write '{}': {}", path_in, errno_text());
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
