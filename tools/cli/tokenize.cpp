// `meshtrain tokenize INPUT... --tokenizer T --out FILE.bin`: text documents to an llm.c token
// shard with a Hugging Face tokenizer.json (models/hf_encoder.h), the file `train --data` and
// `--val-data` read (docs/data.md, "Tokenizing text").
#include <fmt/format.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "models/data.h"
#include "models/hf_encoder.h"
#include "runtime/error.h"
#include "tools/cli/args.h"
#include "tools/cli/checks.h"
#include "tools/cli/commands.h"
#include "tools/cli/outputs.h"

namespace mt::cli {
namespace {

namespace fs = std::filesystem;

const std::vector<FlagSpec> kTokenizeFlags = {
    {"tokenizer", "a tokenizer.json, or a checkpoint directory holding one", "", false},
    {"out", "the llm.c token shard to write (uint16 ids when all are below 65536, else uint32)", "", false},
    {"format", "text (each input file one document), lines (each non-empty line one document) or jsonl (each "
               "line a JSON object; its --text-field is the document)", "text", false},
    {"text-field", "with --format jsonl: the field holding the text", "text", false},
    {"bos", "before each document: auto (the tokenizer's template, e.g. Llama's BOS, as tokenizer(text) adds it), "
            "none, or a token id (llm.c's GPT-2 shards start each document with <|endoftext|>, 50256)", "auto", false},
};

}  // namespace

int run_tokenize(int argc, char** argv) {
  std::vector<std::string> inputs;
  int first = 2;
  while (first < argc && std::string(argv[first]).rfind("--", 0) != 0) inputs.push_back(argv[first++]);
  // Before the flags are parsed: inputs given after them are "unexpected arguments" to the parser.
  bool help = false;
  for (int i = first; i < argc; ++i) help = help || std::string(argv[i]) == "--help" || std::string(argv[i]) == "-h";
  MT_CHECK(!inputs.empty() || help, "meshtrain tokenize: give the input files before the flags: meshtrain tokenize "
           "A.txt B.txt --tokenizer DIR --out data.bin");
  const Args args("tokenize", kTokenizeFlags, argc, argv, first);
  const std::string tok = args.required("tokenizer"), out = args.required("out"), format = args.str("format");
  MT_CHECK(format == "text" || format == "lines" || format == "jsonl",
           "meshtrain tokenize: --format must be text, lines or jsonl, got '{}'", format);
  MT_CHECK(!args.has("text-field") || format == "jsonl",
           "meshtrain tokenize: --text-field applies to --format jsonl, not {}", format);
  const std::string bos = args.str("bos");
  int64_t bos_id = -1;
  if (bos != "auto" && bos != "none") bos_id = args.integer("bos", 0, (int64_t{1} << 31) - 1);
  const std::string tok_file = fs::is_directory(tok) ? (fs::path(tok) / "tokenizer.json").string() : tok;
  MT_CHECK(fs::is_regular_file(tok_file), "meshtrain tokenize: --tokenizer {}: {} is not a file", tok, tok_file);
  check_output_file(out, "--out");
  // A checkpoint directory given as --tokenizer counts as a whole: its weights and config are not
  // to be written over either (its model.safetensors was, until 2026-12-07).
  std::vector<std::pair<std::string, std::string>> named{{"--tokenizer", tok_file}};
  if (fs::is_directory(tok)) named.emplace_back("--tokenizer", tok);
  for (const std::string& in : inputs) {
    MT_CHECK(fs::is_regular_file(in), "meshtrain tokenize: input {} is not a regular file", in);
    named.emplace_back("an input", in);
  }
  check_not_input(out, "--out", named);
  const HfTokenEncoder enc = HfTokenEncoder::from_file(tok_file);
  MT_CHECK(bos_id < 0 || enc.defines(bos_id), "meshtrain tokenize: --bos {} is not a token of {}", bos_id, tok_file);

  const auto t0 = std::chrono::steady_clock::now();
  std::vector<int32_t> ids;
  int64_t docs = 0, bytes = 0;
  const auto add = [&](const std::string& text, const std::string& where) {
    std::vector<int64_t> d;
    try {
      d = enc.encode(text, bos == "auto");
    } catch (const Error& e) {
      MT_FAIL("meshtrain tokenize: {}: {}", where, e.what());
    }
    if (bos_id >= 0) ids.push_back(static_cast<int32_t>(bos_id));
    for (int64_t id : d) {
      MT_CHECK(id >= 0 && id <= INT32_MAX, "meshtrain tokenize: {}: token id {} does not fit a token shard", where, id);
      ids.push_back(static_cast<int32_t>(id));
    }
    ++docs;
    bytes += static_cast<int64_t>(text.size());
  };
  for (const std::string& in : inputs) {
    std::ifstream f(in, std::ios::binary);
    MT_CHECK(f, "meshtrain tokenize: cannot open {}", in);
    if (format == "text") {
      std::ostringstream ss;
      ss << f.rdbuf();
      add(ss.str(), in);
      continue;
    }
    std::string line;
    for (int64_t n = 1; std::getline(f, line); ++n) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      const std::string where = fmt::format("{} line {}", in, n);
      if (format == "lines") {
        if (!line.empty()) add(line, where);
        continue;
      }
      if (line.find_first_not_of(" \t") == std::string::npos) continue;
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(line);
      } catch (const nlohmann::json::exception& e) {
        // nlohmann's message names the byte and what it expected (e.g. a lone UTF-16 surrogate
        // escape, which JSON text cannot turn into UTF-8).
        MT_FAIL("meshtrain tokenize: {}: not valid JSON: {}", where, e.what());
      }
      MT_CHECK(j.is_object(), "meshtrain tokenize: {}: not a JSON object (a {})", where, j.type_name());
      const std::string field = args.str("text-field");
      MT_CHECK(j.contains(field) && j[field].is_string(), "meshtrain tokenize: {}: no string field '{}'", where, field);
      add(j[field].get<std::string>(), where);
    }
    MT_CHECK(!f.bad(), "meshtrain tokenize: reading {} failed", in);
  }
  MT_CHECK(!ids.empty(), "meshtrain tokenize: the inputs hold no text to tokenize");
  write_token_file(out, ids);
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  fmt::print("tokenize: {} documents, {} bytes -> {} tokens ({:.2f} bytes/token) in {:.2f} s ({:.0f} tokens/s); "
             "wrote {}\n",
             docs, bytes, ids.size(), static_cast<double>(bytes) / static_cast<double>(ids.size()), sec,
             static_cast<double>(ids.size()) / std::max(sec, 1e-9), out);
  flush_stdout("tokenize");  // the result line is part of the contract (docs/cli.md)
  return 0;
}

}  // namespace mt::cli
