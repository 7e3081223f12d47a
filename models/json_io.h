// Reading JSON documents with errors that name the file and the field: shared by config.json,
// tokenizer.json, the sharded checkpoint index and the trainer state.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

namespace mt {

// Parses the file at `path`; `what` names it in errors ("config.json", "checkpoint index", ...).
nlohmann::json read_json_file(const std::string& path, const char* what);

// A JSON value as it appears in an error message: its dump, cut to 80 characters (a hostile
// file's megabyte array stays out of the message).
std::string json_brief(const nlohmann::json& v);

// Typed reads of one JSON object's fields. Errors read "<where>: field '<prefix><key>' <what>",
// e.g. "config.json 'c/config.json': field 'rope_scaling.factor' must be a number, got "2"". A
// null value counts as absent. The getters with a default return it for an absent field; the
// `*_at` getters require the field.
class JsonFields {
 public:
  // `where` names the document (and the part of it) in errors; `prefix` goes before every key.
  // The object must outlive this reader.
  JsonFields(const nlohmann::json& object, std::string where, std::string prefix = "");

  bool has(const char* key) const;
  // The field's value; an error when it is absent.
  const nlohmann::json& at(const char* key) const;
  void require(const char* key) const { at(key); }
  [[noreturn]] void fail(const char* key, const std::string& what) const;

  int64_t get_int(const char* key, int64_t dflt) const;
  double get_double(const char* key, double dflt) const;
  bool get_bool(const char* key, bool dflt) const;
  std::string get_string(const char* key, const std::string& dflt) const;

  int64_t int_at(const char* key, int64_t min = INT64_MIN) const;  // an integer >= min
  uint64_t uint_at(const char* key) const;                          // a non-negative integer
  std::string string_at(const char* key) const;

  // `v` (the value of `key`) as an int64: integers, and floats with an integral value (1e3 and
  // 1000.0, as Python's json may write them). Integers beyond int64 are refused.
  int64_t as_int(const nlohmann::json& v, const char* key) const;

  const nlohmann::json& object() const { return object_; }

 private:
  const nlohmann::json& object_;
  std::string where_;
  std::string prefix_;
};

// The steps of a tokenizer.json pipeline field (normalizer, pre_tokenizer, post_processor,
// decoder): the node itself, or the items of a {"type": "Sequence", "<list_key>": [...]} in order,
// nested Sequences flattened (8 levels at most). `step(node, prefix)` gets each step (null ones
// too: the caller decides) with the prefix that names it in errors ("decoder.decoders[]."). `what`
// names the field in errors ("decoder"); `path` the file.
void for_each_sequence_step(const nlohmann::json& node, const std::string& path, const std::string& prefix,
                            const char* what, const char* list_key,
                            const std::function<void(const nlohmann::json&, const std::string&)>& step);

}  // namespace mt
