// Pre-tokenization of byte-level BPE tokenizers (Hugging Face tokenizers' `ByteLevel` and
// `Split` pre-tokenizers, alone or in a `Sequence`): text -> the words BPE sees, each in the
// byte-level alphabet. Regular expressions run on PCRE2 with Unicode properties (\p{L}, \p{N},
// \s as Unicode white space), which the GPT-2, Qwen2 and Llama-3 patterns need.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "unicode.h"

namespace specrt {

class Regex {
 public:
  explicit Regex(const std::string& pattern, bool literal = false);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  // The non-overlapping matches in text (valid UTF-8), left to right: (start, end) byte offsets.
  void find_all(const std::string& text, std::vector<std::pair<size_t, size_t>>& out) const;

 private:
  void* code_ = nullptr;  // pcre2_code_8
};

class PreTokenizer {
 public:
  // From tokenizer.json's "pre_tokenizer" object; throws Error (UNSUPPORTED) for kinds and
  // settings other than those named above.
  explicit PreTokenizer(const nlohmann::json& config);
  // text (valid UTF-8, normalized) -> words appended to `out`.
  void run(const std::string& text, std::vector<std::string>& out) const;

 private:
  struct Step {
    enum Kind { kSplit, kByteLevel } kind;
    std::shared_ptr<Regex> regex;  // Split's pattern; ByteLevel's when it splits (use_regex)
    bool removed = false;          // Split: matches dropped (behavior "Removed"), else kept alone ("Isolated")
    bool prefix_space = false;     // ByteLevel add_prefix_space
  };
  void add(const nlohmann::json& step);
  void apply(const Step& step, const std::vector<std::string>& in, std::vector<std::string>& out) const;

  std::vector<Step> steps_;
  ByteAlphabet alphabet_;
};

}  // namespace specrt
