// Access to the corpus bytes generated at build time by models/corpus/embed.py.
#include "models/corpus.h"

#include <cmath>
#include <cstddef>
#include <map>

#include "models/tokenizer.h"
#include "runtime/error.h"

namespace mt::detail {
extern const uint8_t kCorpusBytes[];
extern const size_t kCorpusSize;
}  // namespace mt::detail

namespace mt {

std::string_view embedded_corpus() {
  return {reinterpret_cast<const char*>(detail::kCorpusBytes), detail::kCorpusSize};
}

std::vector<int32_t> embedded_corpus_tokens() { return ByteTokenizer().encode(embedded_corpus()); }

double unigram_entropy(const std::vector<int32_t>& tokens) {
  MT_CHECK(!tokens.empty(), "unigram_entropy: the token vector is empty");
  // std::map: the sum runs in id order, so the result does not depend on hashing.
  std::map<int32_t, int64_t> counts;
  for (int32_t t : tokens) ++counts[t];
  const double n = static_cast<double>(tokens.size());
  double h = 0.0;
  for (const auto& [id, c] : counts) {
    const double p = static_cast<double>(c) / n;
    h -= p * std::log(p);
  }
  return h;
}

}  // namespace mt
