// The embedded training corpus: ~64 KB of original English prose (models/corpus/corpus.txt,
// CC0) compiled into the library, so that examples and tests can train a byte-level model with
// no download. unigram_entropy() gives the loss floor of a model that ignores context: a model
// that learns anything from the context must go below it.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace mt {

// The corpus text (ASCII, paragraphs separated by blank lines).
std::string_view embedded_corpus();
// The corpus through ByteTokenizer: one token per byte, vocab 256.
std::vector<int32_t> embedded_corpus_tokens();
// Entropy in nats of the empirical token distribution: -sum_v p(v) log p(v), p(v) = count / n.
// This is the cross-entropy a context-free model reaches at best. Throws on an empty vector.
double unigram_entropy(const std::vector<int32_t>& tokens);

}  // namespace mt
