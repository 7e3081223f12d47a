// Start-up checks of output paths (see outputs.h).
#include "tools/cli/outputs.h"

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "runtime/error.h"

namespace mt::cli {
namespace fs = std::filesystem;

namespace {

// Creates and removes an empty file in `dir`: the one test of writability that root, read-only
// mounts and pseudo file systems (/proc) all answer truthfully.
void probe_directory(const fs::path& dir, const std::string& path, const std::string& flag) {
  std::string name = (dir / ".meshtrain-probe-XXXXXX").string();
  const int fd = ::mkstemp(name.data());
  MT_CHECK(fd >= 0, "{} {}: cannot create files in the directory {}: {}", flag, path, dir.string(),
           std::strerror(errno));
  ::close(fd);
  ::unlink(name.c_str());
}

fs::path parent_or_cwd(const fs::path& p) { return p.has_parent_path() ? p.parent_path() : fs::path("."); }

// `out` as the file a write reaches: symbolic links followed, the last one too when the file it
// names does not exist yet (weakly_canonical stops at a dangling link).
fs::path written_path(const std::string& out) {
  std::error_code ec;
  fs::path p = fs::absolute(out, ec);
  for (int hops = 0; hops < 40 && fs::is_symlink(fs::symlink_status(p, ec)); ++hops) {
    const fs::path target = fs::read_symlink(p, ec);
    if (ec) break;
    p = target.is_absolute() ? target : p.parent_path() / target;
  }
  return fs::weakly_canonical(p, ec);
}

}  // namespace

void check_output_file(const std::string& path, const std::string& flag) {
  if (path.empty()) return;
  const fs::path p(path);
  std::error_code ec;
  MT_CHECK(!fs::is_directory(p, ec), "{} {}: is a directory, not a file", flag, path);
  const fs::path dir = parent_or_cwd(p);
  MT_CHECK(fs::exists(dir, ec), "{} {}: the directory {} does not exist", flag, path, dir.string());
  MT_CHECK(fs::is_directory(dir, ec), "{} {}: {} is not a directory", flag, path, dir.string());
  if (fs::exists(p, ec)) {
    // Opening for writing without O_CREAT or O_TRUNC changes nothing.
    const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
    MT_CHECK(fd >= 0, "{} {}: cannot write the file: {}", flag, path, std::strerror(errno));
    ::close(fd);
  } else {
    probe_directory(dir, path, flag);
  }
}

void check_not_input(const std::string& out, const std::string& out_flag,
                     const std::vector<std::pair<std::string, std::string>>& inputs) {
  std::error_code ec;
  if (out.empty()) return;
  const bool out_exists = fs::is_regular_file(out, ec);
  if (!out_exists && fs::exists(out, ec)) return;  // a device or pipe: written in place, never an input
  // Judged by the file a write reaches: a link named in a checkpoint directory's place is that
  // directory's file (such a link replaced the weights of `grad --hf` until 2026-12-08).
  const fs::path real = written_path(out);
  const fs::path name = real.filename();
  const std::string ext = name.extension().string();
  // A training checkpoint directory's own files too: `latest` (a metrics line appended to it made
  // the directory unresumable) and the run lock. These are refused by name whether or not they
  // exist yet: a fresh run's final save renames `latest` over a metrics file of that name.
  const bool checkpoint_file = name == "config.json" || name == "tokenizer.json" || name == "index.json" ||
                               name == "trainer_state.json" || name == "model.safetensors.index.json" ||
                               name == "latest" || name == ".meshtrain.lock" || ext == ".safetensors";
  const fs::path parent = parent_or_cwd(real);
  for (const auto& [flag, path] : inputs) {
    if (path.empty()) continue;
    const bool exists = fs::exists(path, ec);
    // An input that does not exist yet can only be a directory this command will create.
    const bool dir = !exists || fs::is_directory(path, ec);
    // In the directory, or in one of its step directories (any file there is the checkpoint's).
    const bool in_step_dir =
        parent.filename().string().rfind("step-", 0) == 0 && same_path(parent_or_cwd(parent).string(), path);
    const bool same = dir ? (checkpoint_file && same_path(parent.string(), path)) || in_step_dir
                          : out_exists && fs::equivalent(out, path, ec);
    MT_CHECK(!same, "{} {}: is {} {}{}: writing it would destroy the input; give another path", out_flag, out,
             dir ? "a checkpoint file of" : "the same file as", flag, dir || path != out ? " " + path : std::string());
  }
}

bool same_path(const std::string& a, const std::string& b) {
  if (a.empty() || b.empty()) return false;
  std::error_code ec;
  if (fs::exists(a, ec) && fs::exists(b, ec)) return fs::equivalent(a, b, ec);
  return fs::weakly_canonical(fs::absolute(a, ec), ec) == fs::weakly_canonical(fs::absolute(b, ec), ec);
}

void check_output_dir(const std::string& path, const std::string& flag) {
  MT_CHECK(!path.empty(), "{}: the directory name is empty", flag);
  fs::path p(path);
  std::error_code ec;
  if (fs::exists(p, ec)) {
    MT_CHECK(fs::is_directory(p, ec), "{} {}: exists and is not a directory", flag, path);
    probe_directory(p, path, flag);
    return;
  }
  // Created at the first write (with its parents): the nearest existing ancestor must take it.
  fs::path up = fs::absolute(p, ec).parent_path();
  while (!up.empty() && !fs::exists(up, ec) && up != up.root_path()) up = up.parent_path();
  MT_CHECK(fs::is_directory(up, ec), "{} {}: cannot be created: {} is not a directory", flag, path, up.string());
  probe_directory(up, path, flag);
}

void check_checkpoint_out(const std::string& path, const std::string& flag, Overwrite overwrite) {
  check_output_dir(path, flag);
  if (overwrite == Overwrite::kAllow) return;
  std::error_code ec;
  for (const char* file : {"config.json", "model.safetensors", "model.safetensors.index.json"}) {
    MT_CHECK(!fs::exists(fs::path(path) / file, ec),
             "{} {}: already holds a checkpoint ({} exists); pass --overwrite to replace it, or use another directory",
             flag, path, file);
  }
}

}  // namespace mt::cli
