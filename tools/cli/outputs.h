// Start-up checks of the paths a command will write (--metrics, --checkpoint-dir, --out). Every
// rank runs them before anything is built, loaded or trained, so that a path that cannot be
// written ends the job at once with an error naming the flag and the path, instead of after the
// whole run, or on rank 0 only while the others wait. They leave nothing behind: writability is
// probed by creating and removing a uniquely named empty file in the directory concerned.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace mt::cli {

// Whether existing checkpoints (an `init --out` directory, training step directories, a `latest`
// naming a later step) may be replaced: only when the user said so (`--overwrite`).
enum class Overwrite { kRefuse, kAllow };

// `path` will be written as a file: it must not be a directory, its directory must exist and be
// writable, and an existing file must be writable. An empty path (output off) passes.
void check_output_file(const std::string& path, const std::string& flag);

// `out` (a file the command will write, named by `out_flag`) must not be a file the command reads:
// each of `inputs` is (flag, path) of an input file, or of a checkpoint directory, whose config,
// weight, index, state and tokenizer files count as inputs. Refused naming both flags (writing it
// would destroy the input: `grad --out DIR/model.safetensors --hf DIR`, `--metrics` = `--data`).
// Paths are compared as files (same device and inode), so links and other spellings are caught.
void check_not_input(const std::string& out, const std::string& out_flag,
                     const std::vector<std::pair<std::string, std::string>>& inputs);

// Two paths name the same file or directory: by identity (device and inode) when both exist,
// else by their normalized absolute paths (`m.jsonl` and `./m.jsonl`, before either is written).
// check_not_input compares directories so.
bool same_path(const std::string& a, const std::string& b);

// `path` is, or will be created as, a directory: it must not be a file, and it (or, when it does
// not exist yet, the nearest existing directory it will be created under) must be writable.
void check_output_dir(const std::string& path, const std::string& flag);

// check_output_dir for a Hugging Face checkpoint directory about to be written (`init --out`):
// one that already holds a checkpoint (config.json or model weights) is refused unless
// `overwrite` allows it.
void check_checkpoint_out(const std::string& path, const std::string& flag, Overwrite overwrite);

}  // namespace mt::cli
