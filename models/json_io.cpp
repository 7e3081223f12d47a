// JSON file reading and typed field access with file-naming errors (json_io.h).
#include "models/json_io.h"

#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>

#include "runtime/error.h"

namespace mt {

using json = nlohmann::json;

json read_json_file(const std::string& path, const char* what) {
  std::ifstream in(path);
  MT_CHECK(in.is_open(), "{} '{}': cannot open", what, path);
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    return json::parse(ss.str());
  } catch (const json::exception& e) {
    MT_FAIL("{} '{}': not valid JSON: {}", what, path, e.what());
  }
}

std::string json_brief(const json& v) {
  constexpr size_t kMax = 80;
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  if (s.size() > kMax) s = s.substr(0, kMax) + "...";
  return s;
}

JsonFields::JsonFields(const json& object, std::string where, std::string prefix)
    : object_(object), where_(std::move(where)), prefix_(std::move(prefix)) {}

bool JsonFields::has(const char* key) const {
  if (!object_.is_object()) return false;
  const auto it = object_.find(key);
  return it != object_.end() && !it->is_null();
}

const json& JsonFields::at(const char* key) const {
  if (!has(key)) fail(key, "is missing (required)");
  return object_.at(key);
}

void JsonFields::fail(const char* key, const std::string& what) const {
  MT_FAIL("{}: field '{}{}' {}", where_, prefix_, key, what);
}

int64_t JsonFields::as_int(const json& v, const char* key) const {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      fail(key, fmt::format("= {} is too large (not an int64)", u));
    return static_cast<int64_t>(u);
  }
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (std::isfinite(d) && d == std::floor(d)) {
      if (std::fabs(d) < 9e15) return static_cast<int64_t>(d);
      fail(key, fmt::format("= {} is too large", json_brief(v)));
    }
  }
  fail(key, fmt::format("must be an integer, got {}", json_brief(v)));
}

int64_t JsonFields::get_int(const char* key, int64_t dflt) const { return has(key) ? as_int(at(key), key) : dflt; }

double JsonFields::get_double(const char* key, double dflt) const {
  if (!has(key)) return dflt;
  const json& v = at(key);
  if (!v.is_number()) fail(key, fmt::format("must be a number, got {}", json_brief(v)));
  return v.get<double>();
}

bool JsonFields::get_bool(const char* key, bool dflt) const {
  if (!has(key)) return dflt;
  const json& v = at(key);
  if (!v.is_boolean()) fail(key, fmt::format("must be true or false, got {}", json_brief(v)));
  return v.get<bool>();
}

std::string JsonFields::get_string(const char* key, const std::string& dflt) const {
  return has(key) ? string_at(key) : dflt;
}

int64_t JsonFields::int_at(const char* key, int64_t min) const {
  const int64_t v = as_int(at(key), key);
  if (v < min) fail(key, fmt::format("must be an integer >= {}, got {}", min, v));
  return v;
}

uint64_t JsonFields::uint_at(const char* key) const {
  const json& v = at(key);
  if (!v.is_number_unsigned()) fail(key, fmt::format("must be a non-negative integer, got {}", json_brief(v)));
  return v.get<uint64_t>();
}

std::string JsonFields::string_at(const char* key) const {
  const json& v = at(key);
  if (!v.is_string()) fail(key, fmt::format("must be a string, got {}", json_brief(v)));
  return v.get<std::string>();
}

namespace {

void sequence_steps(const json& node, const std::string& path, const std::string& prefix, const char* what,
                    const char* list_key, const std::function<void(const json&, const std::string&)>& step,
                    int depth) {
  const JsonFields f(node, path, prefix);
  if (f.get_string("type", "") != "Sequence") {
    step(node, prefix);
    return;
  }
  MT_CHECK(depth < 8, "{}: {} Sequences nested more than 8 deep", path, what);
  const json& list = f.at(list_key);
  MT_CHECK(list.is_array(), "{}: field '{}{}' must be a list", path, prefix, list_key);
  for (const json& item : list)
    sequence_steps(item, path, prefix + list_key + "[].", what, list_key, step, depth + 1);
}

}  // namespace

void for_each_sequence_step(const json& node, const std::string& path, const std::string& prefix, const char* what,
                            const char* list_key, const std::function<void(const json&, const std::string&)>& step) {
  sequence_steps(node, path, prefix, what, list_key, step, 0);
}

}  // namespace mt
