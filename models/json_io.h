// Reading a JSON file with errors that name the file: shared by config.json, the sharded
// checkpoint index and the trainer state.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace mt {

// Parses the file at `path`; `what` names it in errors ("config.json", "checkpoint index", ...).
nlohmann::json read_json_file(const std::string& path, const char* what);

}  // namespace mt
