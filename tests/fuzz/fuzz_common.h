// Shared by the libFuzzer targets in this folder (docs/robustness.md). The rule every target
// follows: a parser may refuse any input with mt::Error (a user error naming the file and field);
// anything else is a finding and aborts, so libFuzzer saves the input: a crash, an ASan/UBSan
// report, an "internal error" (MT_ASSERT: a bug by definition), an exception of another type (a
// nlohmann::json::type_error or std::out_of_range escaping a reader), or a round-trip mismatch.
// The readers take paths, so inputs are written to a file in a private temporary directory.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

#include "runtime/error.h"

namespace mt::fuzz {

[[noreturn]] inline void finding(const char* what, const std::string& detail) {
  std::fprintf(stderr, "FUZZ FINDING: %s: %s\n", what, detail.c_str());
  std::abort();
}

// Runs fn(); mt::Error is the expected refusal and returns false; success returns true.
template <class Fn>
bool expect_ok_or_user_error(Fn&& fn) {
  try {
    fn();
    return true;
  } catch (const mt::Error& e) {
    // MT_ASSERT's message starts so (runtime/error.cpp); a user error may quote input that
    // merely contains the words.
    if (std::string_view(e.what()).starts_with("internal error at "))
      finding("MT_ASSERT failed (internal error)", e.what());
    return false;
  } catch (const std::exception& e) {
    finding("exception other than mt::Error escaped", e.what());
  } catch (...) {
    finding("non-std exception escaped", "?");
  }
}

// A private directory under $TMPDIR (default /tmp), removed at exit.
inline const std::filesystem::path& scratch_dir() {
  static const std::filesystem::path dir = [] {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/mt-fuzz-XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) finding("setup", "mkdtemp failed");
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(scratch_dir(), ec);
    });
    return std::filesystem::path(tmpl);
  }();
  return dir;
}

inline std::string write_input(const std::string& name, const uint8_t* data, size_t size) {
  const std::filesystem::path p = scratch_dir() / name;
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  out.close();
  if (!out) finding("setup", "cannot write " + p.string());
  return p.string();
}

inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

}  // namespace mt::fuzz
