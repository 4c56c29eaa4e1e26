#include "bpe.h"

#include <limits>

#include "error.h"
#include "unicode.h"

namespace specrt {

namespace {
constexpr size_t kCacheWords = 10000;  // as tokenizers' BPE cache
uint64_t key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }
}  // namespace

Bpe::Bpe(std::unordered_map<std::string, int32_t> vocab, const std::vector<std::pair<std::string, std::string>>& merges,
         bool ignore_merges)
    : vocab_(std::move(vocab)), ignore_merges_(ignore_merges) {
  int32_t top = -1;
  for (const auto& [text, id] : vocab_) top = std::max(top, id);
  tokens_.resize(size_t(top + 1));
  for (const auto& [text, id] : vocab_) tokens_[id] = text;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [a, b] = merges[rank];
    int32_t ia = id(a), ib = id(b), merged = id(a + b);
    if (ia < 0 || ib < 0 || merged < 0)
      fail(SPECRT_ERR_BAD_BUNDLE, "tokenizer.json: merge " + std::to_string(rank) + " (" + a + " " + b +
                                      ") names a token the vocabulary lacks");
    merges_.emplace(key(ia, ib), std::make_pair(int32_t(rank), merged));  // the first (lowest) rank wins
  }
}

const std::string* Bpe::token(int32_t id) const {
  return id >= 0 && size_t(id) < tokens_.size() && !tokens_[id].empty() ? &tokens_[id] : nullptr;
}

int32_t Bpe::id(const std::string& token) const {
  auto it = vocab_.find(token);
  return it == vocab_.end() ? -1 : it->second;
}

void Bpe::merge(std::vector<int32_t>& s) const {
  while (s.size() > 1) {
    int32_t best = std::numeric_limits<int32_t>::max(), merged = -1;
    size_t at = 0;
    for (size_t i = 0; i + 1 < s.size(); ++i) {
      auto it = merges_.find(key(s[i], s[i + 1]));
      if (it != merges_.end() && it->second.first < best) best = it->second.first, merged = it->second.second, at = i;
    }
    if (merged < 0) return;
    s[at] = merged;
    s.erase(s.begin() + at + 1);
  }
}

void Bpe::tokenize(const std::string& word, std::vector<int32_t>& out) {
  if (ignore_merges_) {
    int32_t whole = id(word);
    if (whole >= 0) {
      out.push_back(whole);
      return;
    }
  }
  auto hit = cache_.find(word);
  if (hit == cache_.end()) {
    std::vector<int32_t> symbols;
    for (const std::string& c : utf8_chars(word)) {
      int32_t i = id(c);
      if (i >= 0) symbols.push_back(i);
    }
    merge(symbols);
    if (cache_.size() >= kCacheWords) cache_.clear();
    hit = cache_.emplace(word, std::move(symbols)).first;
  }
  out.insert(out.end(), hit->second.begin(), hit->second.end());
}

}  // namespace specrt
