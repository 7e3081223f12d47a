// Generation (models/generate.h, models/kv_cache.h, models/hf_tokenizer.h): the KV cache's
// logits against the whole-prefix forward that training runs, greedy and sampled choices against
// their definitions, determinism per seed, ended rows, errors, and tokenizer.json decoding.
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "models/config.h"
#include "models/generate.h"
#include "models/hf_tokenizer.h"
#include "models/llama.h"
#include "testing.h"

using namespace mt;
using namespace mt::testing;
using Catch::Contains;

namespace {

std::shared_ptr<CausalLM> model_of(const std::string& name, DType dtype, uint64_t seed = 5) {
  ModelConfig c = builtin_config(name);
  manual_seed(seed);
  auto m = build_causal_lm(c, dtype);
  m->eval();
  return m;
}

Tensor prompt_of(const std::vector<std::vector<int64_t>>& rows) {
  std::vector<int64_t> flat;
  for (const auto& r : rows) flat.insert(flat.end(), r.begin(), r.end());
  return from_vector(flat, Shape{static_cast<int64_t>(rows.size()), static_cast<int64_t>(rows[0].size())}, DType::kI64);
}

// Every step's logits [B, V], and the tokens.
struct Run {
  std::vector<Tensor> logits;
  std::vector<std::vector<int64_t>> tokens;
};

Run run(CausalLM& m, const Tensor& prompt, GenerateOptions o) {
  Run r;
  r.tokens = generate(m, prompt, o, [&](int64_t, const Tensor& l) { r.logits.push_back(l.clone()); });
  return r;
}

}  // namespace

TEST_CASE("generate: each step's logits are the whole-sequence forward's at that position, with and without the cache") {
  // llama-tiny (GQA: 4 heads, 2 kv heads) and mixtral-tiny (experts in eval), f64 and f32.
  for (const char* name : {"llama-tiny", "mixtral-tiny"}) {
    for (DType dt : {DType::kF64, DType::kF32}) {
      auto m = model_of(name, dt);
      const Tensor prompt = prompt_of({{72, 101, 108, 108, 111, 32}, {84, 104, 101, 32, 99, 97}});
      GenerateOptions o;
      o.max_new_tokens = 10;
      o.sampling.temperature = 0;
      const Run cached = run(*m, prompt, o);
      o.kv_cache = false;
      const Run full = run(*m, prompt, o);
      INFO(name << " " << dtype_name(dt));
      REQUIRE(cached.tokens == full.tokens);
      REQUIRE(cached.logits.size() == 10);
      const double tol = dt == DType::kF64 ? 1e-12 : 2e-5;
      // The whole sequence (prompt + the tokens chosen) through the training forward: position
      // T - 1 + s gives step s's logits.
      std::vector<std::vector<int64_t>> rows = {{72, 101, 108, 108, 111, 32}, {84, 104, 101, 32, 99, 97}};
      for (size_t b = 0; b < 2; ++b) rows[b].insert(rows[b].end(), cached.tokens[b].begin(), cached.tokens[b].end() - 1);
      const Tensor logits = (*m)(std::vector<Tensor>{prompt_of(rows)})[0];
      for (int64_t s = 0; s < 10; ++s) {
        const Tensor ref = logits.narrow(1, 5 + s, 1).reshape(Shape{2, logits.size(2)});
        REQUIRE_CLOSE(cached.logits[static_cast<size_t>(s)], ref, tol, tol);
        REQUIRE_CLOSE(full.logits[static_cast<size_t>(s)], ref, tol, tol);
      }
    }
  }
}

TEST_CASE("generate: the KV cache also serves a prompt of one token and a bf16 model") {
  auto m = model_of("llama-tiny", DType::kBF16);
  GenerateOptions o;
  o.max_new_tokens = 6;
  o.sampling.temperature = 0;
  const Tensor prompt = prompt_of({{65}});
  const Run cached = run(*m, prompt, o);
  o.kv_cache = false;
  const Run full = run(*m, prompt, o);
  REQUIRE(cached.tokens == full.tokens);
  for (size_t s = 0; s < cached.logits.size(); ++s) REQUIRE_CLOSE(cached.logits[s], full.logits[s], 2e-2, 2e-2);
}

TEST_CASE("generate: sampled tokens depend on the seed only, and the model's mode is restored") {
  auto m = model_of("llama-tiny", DType::kF32);
  m->train();
  const Tensor prompt = prompt_of({{1, 2, 3}});
  GenerateOptions o;
  o.max_new_tokens = 24;
  o.sampling.temperature = 1.0;
  o.seed = 11;
  const auto a = generate(*m, prompt, o), b = generate(*m, prompt, o);
  o.seed = 12;
  const auto c = generate(*m, prompt, o);
  CHECK(a == b);
  CHECK(a != c);
  CHECK(m->is_training());
  // No cache is left behind: a training forward works as before.
  (*m)(std::vector<Tensor>{prompt});
}

TEST_CASE("sample_next: greedy, top-k, top-p and temperature against their definitions") {
  Generator g(3);
  SamplingOptions greedy;
  greedy.temperature = 0;
  // Ties go to the lowest id.
  CHECK(sample_next(from_vector<double>({0.5, 2.0, 2.0, -1.0}, Shape{1, 4}), greedy, g) == std::vector<int64_t>{1});
  SamplingOptions k1;
  k1.top_k = 1;
  CHECK(sample_next(from_vector<double>({0.5, 2.0, 3.0, -1.0}, Shape{1, 4}), k1, g) == std::vector<int64_t>{2});

  // Frequencies of 40000 rows of log([0.1, 0.2, 0.3, 0.4]) (one uniform draw per row).
  const int64_t N = 40000;
  std::vector<double> row = {std::log(0.1), std::log(0.2), std::log(0.3), std::log(0.4)}, flat;
  for (int64_t i = 0; i < N; ++i) flat.insert(flat.end(), row.begin(), row.end());
  const Tensor logits = from_vector(flat, Shape{N, 4});
  auto freq = [&](const SamplingOptions& o) {
    std::vector<double> f(4, 0.0);
    for (int64_t t : sample_next(logits, o, g)) f[static_cast<size_t>(t)] += 1.0 / N;
    return f;
  };
  auto near = [](const std::vector<double>& f, const std::vector<double>& p) {
    for (size_t i = 0; i < p.size(); ++i)
      if (std::abs(f[i] - p[i]) > 0.012) return false;
    return true;
  };
  SamplingOptions plain;
  CHECK(near(freq(plain), {0.1, 0.2, 0.3, 0.4}));
  SamplingOptions topk;
  topk.top_k = 2;
  CHECK(near(freq(topk), {0, 0, 3.0 / 7, 4.0 / 7}));
  SamplingOptions topp;  // 0.4 < 0.5 <= 0.4 + 0.3: tokens 3 and 2
  topp.top_p = 0.5;
  CHECK(near(freq(topp), {0, 0, 3.0 / 7, 4.0 / 7}));
  SamplingOptions cold;  // p^(1/0.5) = p^2, normalized: 1, 4, 9, 16 over 30
  cold.temperature = 0.5;
  CHECK(near(freq(cold), {1.0 / 30, 4.0 / 30, 9.0 / 30, 16.0 / 30}));
  // -inf logits are never drawn.
  const Tensor masked = from_vector<double>({-INFINITY, 0.0, -INFINITY, 0.0}, Shape{1, 4});
  for (int i = 0; i < 50; ++i) {
    const int64_t t = sample_next(masked, plain, g)[0];
    CHECK((t == 1 || t == 3));
  }
}

TEST_CASE("sample_next and generate: bad logits and options are errors naming them") {
  Generator g(1);
  SamplingOptions o;
  CHECK_THAT(error_of([&] { sample_next(from_vector<double>({0.0, NAN, 1.0, 0.0}, Shape{2, 2}), o, g); }),
             Contains("row 0 has a NaN logit at token 1"));
  CHECK_THAT(error_of([&] { sample_next(from_vector<double>({-INFINITY, -INFINITY}, Shape{1, 2}), o, g); }),
             Contains("every logit of row 0 is -inf"));
  SamplingOptions p0;
  p0.top_p = 0;
  CHECK_THAT(error_of([&] { check_sampling(p0); }), Contains("top_p 0 must be in (0, 1]"));
  SamplingOptions tneg;
  tneg.temperature = -1;
  CHECK_THAT(error_of([&] { check_sampling(tneg); }), Contains("temperature -1 must be a finite number >= 0"));
  auto m = model_of("llama-tiny", DType::kF32);
  GenerateOptions go;
  CHECK_THAT(error_of([&] { generate(*m, prompt_of({{1, 256, 3}}), go); }),
             Contains("prompt token 256 (row 0, position 1) is outside the vocabulary [0, 256)"));
  CHECK_THAT(error_of([&] { generate(*m, from_vector<int32_t>({1, 2}, Shape{1, 2}), go); }),
             Contains("the prompt must be i64 [B, T]"));
  KvCache small(4);
  CHECK_THAT(error_of([&] { small.append(0, zeros({1, 2, 5, 8}), zeros({1, 2, 5, 8})); }),
             Contains("layer 0: 5 new positions after the 0 held pass the cache's capacity of 4 positions"));
  // A cache on a model in training mode.
  KvCache cache(8);
  m->train();
  m->set_kv_cache(&cache);
  CHECK_THAT(error_of([&] { (*m)(std::vector<Tensor>{prompt_of({{1, 2}})}); }),
             Contains("incremental decoding (a KV cache) runs in eval mode"));
  m->set_kv_cache(nullptr);
}

TEST_CASE("generate: a row ends at the eos token, and all rows ended stop the loop") {
  auto m = model_of("llama-tiny", DType::kF64);
  const Tensor prompt = prompt_of({{10, 20, 30}, {40, 50, 60}});
  GenerateOptions o;
  o.max_new_tokens = 8;
  o.sampling.temperature = 0;
  const auto free = generate(*m, prompt, o);
  // End row 0 at its third token: it keeps 3 tokens, row 1 (unless it meets that token too) all 8.
  o.eos_token_ids = {free[0][2]};
  const auto ended = generate(*m, prompt, o);
  const auto first_eos = [&](const std::vector<int64_t>& t) {
    for (size_t i = 0; i < t.size(); ++i)
      if (t[i] == o.eos_token_ids[0]) return i + 1;
    return t.size();
  };
  REQUIRE(ended[0].size() == first_eos(free[0]));
  REQUIRE(std::vector<int64_t>(free[0].begin(), free[0].begin() + static_cast<int64_t>(ended[0].size())) == ended[0]);
  REQUIRE(ended[1].size() == first_eos(free[1]));
  // Both rows ending on their first token stop after one step.
  const auto one = generate(*m, prompt_of({{10, 20, 30}}), o);
  o.eos_token_ids = {one[0][0]};
  CHECK(generate(*m, prompt_of({{10, 20, 30}}), o)[0].size() == 1);
}

TEST_CASE("HfTokenDecoder: byte-level and SentencePiece-style tokenizer.json files") {
  TempDir dir;
  // Byte-level (GPT-2 / Llama 3): "Ġ" stands for a space, "Ċ" for a newline, "Ã©" for the two
  // bytes of "é"; a special added token is left out, a plain added token is its text.
  dir.write("tokenizer.json", R"({"added_tokens": [{"id": 5, "content": "<|begin|>", "special": true},
      {"id": 6, "content": "<tool>", "special": false}],
    "decoder": {"type": "ByteLevel", "add_prefix_space": false},
    "model": {"type": "BPE", "vocab": {"Hello": 0, "\u0120world": 1, "\u010a": 2, "\u00c3\u00a9": 3, "!": 4}, "merges": []}})");
  auto d = HfTokenDecoder::from_dir(dir.path.string());
  REQUIRE(d.has_value());
  CHECK(d->byte_level());
  CHECK(d->decode({5, 0, 1, 3, 4, 2, 6}) == "Hello world\xC3\xA9!\n<tool>");
  // An id the file does not define (a vocabulary padded past the tokenizer's) is left out and
  // counted, as the tokenizers library leaves it out.
  int64_t unknown = -1;
  CHECK(d->decode({0, 9, 4, -3}, &unknown) == "Hello!");
  CHECK(unknown == 2);

  TempDir sp;  // Llama 2 / Mistral: U+2581 for spaces, <0x0A> a byte, the first space stripped
  sp.write("tokenizer.json", R"({"added_tokens": [{"id": 3, "content": "<s>", "special": true}],
    "decoder": {"type": "Sequence", "decoders": [
      {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "}, {"type": "ByteFallback"},
      {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
    "model": {"type": "BPE", "vocab": {"\u2581Hello": 0, "\u2581world": 1, "<0x0A>": 2, "<0xC3>": 4, "<0xA9>": 5, "<0x20>": 6, "Hi": 7}, "merges": []}})");
  auto s = HfTokenDecoder::from_dir(sp.path.string());
  REQUIRE(s.has_value());
  CHECK(s->decode({3, 0, 1, 2, 4, 5}) == "Hello world\n\xC3\xA9");

  // A run of byte tokens that is not valid UTF-8 is one U+FFFD per byte (ByteFallback); the Strip
  // step after Fuse strips a leading space that came from a byte token too.
  CHECK(s->decode({4, 1}) == "\xEF\xBF\xBD world");
  CHECK(s->decode({6, 7}) == "Hi");
  CHECK(s->decode({6, 6, 7}) == " Hi");      // Strip takes at most one
  CHECK(s->decode({6, 0}) == " Hello");      // one of the two spaces

  TempDir none;
  CHECK_FALSE(HfTokenDecoder::from_dir(none.path.string()).has_value());
  TempDir bad;
  bad.write("tokenizer.json", R"({"decoder": {"type": "WordPiece"}, "model": {"vocab": {"a": 0}}})");
  CHECK_THAT(error_of([&] { HfTokenDecoder::from_dir(bad.path.string()); }),
             Contains("decoder type 'WordPiece' (decoder.type) is not supported"));
  bad.write("tokenizer.json", "{not json");
  CHECK_THAT(error_of([&] { HfTokenDecoder::from_dir(bad.path.string()); }), Contains("not a JSON object"));
  // A field of the wrong JSON type is an mt::Error naming the file and the field (the fuzzer found a
  // decoder "type" that was a list, which escaped as nlohmann's own type_error).
  const std::string vocab = R"("model": {"vocab": {"a": 0}})";
  const std::pair<std::string, std::string> wrong[] = {
      {R"({"decoder": {"type": ["ByteLevel"]}, )" + vocab + "}",
       R"(field 'decoder.type' must be a string, got ["ByteLevel"])"},
      {R"({"decoder": {"type": "Metaspace", "add_prefix_space": "yes"}, )" + vocab + "}",
       R"(field 'decoder.add_prefix_space' must be true or false, got "yes")"},
      {R"({"decoder": {"type": "Metaspace", "prepend_scheme": 1}, )" + vocab + "}",
       "field 'decoder.prepend_scheme' must be a string, got 1"},
      {R"({"decoder": {"type": "Sequence", "decoders": [{"type": "Strip", "start": 1.5}]}, )" + vocab + "}",
       "field 'decoder.decoders[].start' must be an integer, got 1.5"},
      {R"({"decoder": {"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": {}}}]}, )" +
           vocab + "}",
       "field 'decoder.decoders[].pattern.String' must be a string, got {}"},
      {R"({"added_tokens": [{"id": 1, "content": "<s>", "special": 1}], "decoder": {"type": "ByteLevel"}, )" +
           vocab + "}",
       "field 'added_tokens[].special' must be true or false, got 1"},
  };
  for (const auto& [text, message] : wrong) {
    bad.write("tokenizer.json", text);
    const std::string e = error_of([&] { HfTokenDecoder::from_dir(bad.path.string()); });
    CHECK_THAT(e, Contains(message) && Contains(bad.file("tokenizer.json")));
  }
  // null counts as absent, as in the files the tokenizers library writes.
  bad.write("tokenizer.json", R"({"decoder": {"type": "Metaspace", "prepend_scheme": null}, )" + vocab + "}");
  CHECK(HfTokenDecoder::from_dir(bad.path.string())->decode({0}) == "a");
}

TEST_CASE("HfTokenDecoder: decodes as the tokenizers library does") {
  TempDir dir;
  // Byte-level: a token cut inside a character ("Ã" alone is the first byte of "é") becomes
  // U+FFFD, one per maximal invalid sequence; an added token with a character outside GPT-2's
  // table (a space) is its own text, one with only table characters is decoded like any token.
  dir.write("tokenizer.json", R"({"added_tokens": [{"id": 5, "content": "a b", "special": false},
      {"id": 6, "content": "\u0120x", "special": false}],
    "decoder": {"type": "ByteLevel"},
    "model": {"type": "BPE", "vocab": {"Hello": 0, "\u00c3": 1, "\u00a9": 2, "\u00ff": 3}, "merges": []}})");
  auto b = HfTokenDecoder::from_dir(dir.path.string());
  REQUIRE(b.has_value());
  CHECK(b->decode({0, 1}) == "Hello\xEF\xBF\xBD");
  CHECK(b->decode({1, 2}) == "\xC3\xA9");
  CHECK(b->decode({1, 1, 2}) == "\xEF\xBF\xBD\xC3\xA9");
  CHECK(b->decode({3, 0}) == "\xEF\xBF\xBDHello");  // 0xFF is never UTF-8
  CHECK(b->decode({5, 6}) == "a b x");

  // Metaspace alone: every U+2581 of the first token is dropped (prepend scheme "first"), later
  // ones are spaces; byte tokens are not converted (no ByteFallback step).
  dir.write("tokenizer.json", R"({"decoder": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first"},
    "model": {"vocab": [["\u2581Hi\u2581there", 0], ["\u2581you", 0], ["<0x41>", 0]]}})");
  auto m = HfTokenDecoder::from_dir(dir.path.string());
  CHECK(m->decode({0, 1, 2}) == "Hithere you<0x41>");
  dir.write("tokenizer.json", R"({"decoder": {"type": "Metaspace", "prepend_scheme": "never"},
    "model": {"vocab": [["\u2581Hi", 0]]}})");
  CHECK(HfTokenDecoder::from_dir(dir.path.string())->decode({0, 0}) == " Hi Hi");

  // No decoder: the tokens joined by spaces; an empty Sequence joins them with nothing. A nested
  // Sequence is flattened. add_prefix_space false is prepend scheme "never".
  dir.write("tokenizer.json", R"({"decoder": null, "model": {"vocab": {"ab": 0, "c": 1}}})");
  CHECK(HfTokenDecoder::from_dir(dir.path.string())->decode({0, 1}) == "ab c");
  dir.write("tokenizer.json", R"({"decoder": {"type": "Sequence", "decoders": []}, "model": {"vocab": {"ab": 0, "c": 1}}})");
  CHECK(HfTokenDecoder::from_dir(dir.path.string())->decode({0, 1}) == "abc");
  dir.write("tokenizer.json", R"({"decoder": {"type": "Metaspace", "add_prefix_space": false},
    "model": {"vocab": [["\u2581Hi", 0]]}})");
  CHECK(HfTokenDecoder::from_dir(dir.path.string())->decode({0}) == " Hi");
  dir.write("tokenizer.json", R"({"decoder": {"type": "Sequence", "decoders": [
      {"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": "_"}, "content": "-"}]},
      {"type": "Fuse"}, {"type": "Strip", "content": "-", "start": 0, "stop": 2}]},
    "model": {"vocab": {"a_": 0, "_": 1}}})");
  CHECK(HfTokenDecoder::from_dir(dir.path.string())->decode({0, 1, 1}) == "a-");

  // What meshtrain does not decode is refused, naming the step.
  const std::pair<std::string, std::string> refused[] = {
      {R"({"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"Regex": " +"}, "content": " "}]})",
       "field 'decoder.decoders[].pattern' is a regex"},
      {R"({"type": "Sequence", "decoders": [{"type": "CTC"}]})", "decoder type 'CTC' (decoder.decoders[].type)"},
      {R"({"type": "Metaspace", "prepend_scheme": "sometimes"})", "must be always, first or never, got 'sometimes'"},
      {R"({"type": "Metaspace", "prepend_scheme": "first", "add_prefix_space": false})",
       "'decoder.add_prefix_space' (false) and 'decoder.prepend_scheme' ('first') disagree"},
      {R"({"type": "Strip", "content": "ab"})", "field 'decoder.content' must be one character"},
      {R"({"type": "Sequence", "decoders": {"type": "Fuse"}})", "field 'decoder.decoders' must be a list"},
  };
  for (const auto& [decoder, message] : refused) {
    dir.write("tokenizer.json", R"({"model": {"vocab": {"a": 0}}, "decoder": )" + decoder + "}");
    CHECK_THAT(error_of([&] { HfTokenDecoder::from_dir(dir.path.string()); }), Contains(message));
  }
  std::string deep = R"({"type": "Fuse"})";
  for (int i = 0; i < 12; ++i) deep = R"({"type": "Sequence", "decoders": [)" + deep + "]}";
  dir.write("tokenizer.json", R"({"model": {"vocab": {"a": 0}}, "decoder": )" + deep + "}");
  CHECK_THAT(error_of([&] { HfTokenDecoder::from_dir(dir.path.string()); }), Contains("nested more than 8 deep"));
}
