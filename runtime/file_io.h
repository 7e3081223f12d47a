// Writing files so that a reader never sees half of one: durable data (fsync) and atomic
// replacement (a temporary file renamed over the target).
#pragma once

#include <functional>
#include <ostream>
#include <string>

namespace mt {

// Makes a file's data or a directory's entries durable (fsync through a read-only descriptor).
// File systems that cannot sync (EINVAL) are let through; any other failure is an error naming the
// path.
void fsync_path(const std::string& path);

// Writes a file atomically: `fill` writes the content to a stream on "<path>.tmp.<pid>" in the
// same directory, which is then flushed, synced and renamed onto `path`. Throws naming `path` if
// it cannot be written (the temporary file is removed); exceptions from `fill` propagate after the
// same cleanup. A symbolic link is followed (the file it names is replaced). A device, pipe or
// socket, or any path under /dev or /proc (/dev/null, /dev/stdout redirected to a file), is
// written in place, appending (a rename would replace the device node, or the file a shell
// redirect appends to).
void write_file_atomically(const std::string& path, const std::function<void(std::ostream&)>& fill);

// Whether write_file_atomically writes `path` in place: a device, pipe or socket, or any path
// under /dev or /proc (followed through a symbolic link), rather than a file it replaces.
bool written_in_place(const std::string& path);

}  // namespace mt
