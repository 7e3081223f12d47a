// JSON file reading with file-naming errors.
#include "models/json_io.h"

#include <fstream>
#include <sstream>

#include "runtime/error.h"

namespace mt {

nlohmann::json read_json_file(const std::string& path, const char* what) {
  std::ifstream in(path);
  MT_CHECK(in.is_open(), "{} '{}': cannot open", what, path);
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    return nlohmann::json::parse(ss.str());
  } catch (const nlohmann::json::exception& e) {
    MT_FAIL("{} '{}': not valid JSON: {}", what, path, e.what());
  }
}

}  // namespace mt
