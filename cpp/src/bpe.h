// A BPE model (Hugging Face tokenizers' `BPE`): a word's characters merged pair by pair, the
// lowest-ranked merge first (the leftmost of equal ones), until no merge applies.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace specrt {

class Bpe {
 public:
  // vocab: token text -> id; merges: (left, right) pairs, rank = position. ignore_merges: a word
  // that is itself in the vocabulary is that token (Llama-3's setting).
  Bpe(std::unordered_map<std::string, int32_t> vocab, const std::vector<std::pair<std::string, std::string>>& merges,
      bool ignore_merges);
  // Appends the ids of one pre-tokenized word (characters the vocabulary lacks are dropped, as
  // tokenizers does without an unk token).
  void tokenize(const std::string& word, std::vector<int32_t>& out);
  // The token's text; nullptr for an id the model does not have.
  const std::string* token(int32_t id) const;
  int32_t id(const std::string& token) const;  // -1: none
  size_t size() const { return tokens_.size(); }

 private:
  void merge(std::vector<int32_t>& symbols) const;

  std::unordered_map<std::string, int32_t> vocab_;
  std::vector<std::string> tokens_;  // id -> text
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges_;  // (left << 32 | right) -> (rank, merged id)
  std::unordered_map<std::string, std::vector<int32_t>> cache_;  // word -> ids (bounded)
  bool ignore_merges_;
};

}  // namespace specrt
