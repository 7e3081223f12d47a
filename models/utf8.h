// UTF-8 and GPT-2 byte-level helpers shared by the tokenizer.json decoder (models/hf_tokenizer.h)
// and encoder (models/hf_encoder.h). Internal to models/.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace mt::utf8 {

// GPT-2's byte-level stand-ins: printable bytes stand for themselves, the other 68 byte values for
// the code points 256, 257, ... in byte order. Code point -> byte, and byte -> code point.
std::unordered_map<uint32_t, uint8_t> byte_of_code_point();
std::unordered_map<uint8_t, uint32_t> code_point_of_byte();
// The length of the valid UTF-8 sequence at s[i], or minus the length of the maximal invalid
// subpart there.
int utf8_sequence(std::string_view s, size_t i);
// The code points of valid UTF-8 text (an invalid byte counts as one code point of its value).
std::vector<uint32_t> code_points(std::string_view s);
std::string utf8_of(uint32_t cp);
// "<0xNN>" -> NN, else -1.
int byte_token(const std::string& t);
// `s` with every occurrence of `from` (not empty) replaced by `to`.
std::string replace_all(const std::string& s, const std::string& from, const std::string& to);

}  // namespace mt::utf8
