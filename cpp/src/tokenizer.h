// A bundle's tokenizer.json, for byte-level BPE tokenizers (GPT-2, Qwen2 and Llama-3 styles):
// Hugging Face tokenizers' pipeline — added tokens, normalizer (none or NFC), pre-tokenizer
// (pretokenize.h), BPE (bpe.h), post-processor (TemplateProcessing) — and its ByteLevel decoder.
// Other kinds (WordPiece, Unigram, Metaspace, byte fallback, ...) are refused with
// SPECRT_ERR_UNSUPPORTED: the caller then gives token ids. Chat templates stay with the caller.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "bpe.h"
#include "pretokenize.h"
#include "unicode.h"

namespace specrt {

class Tokenizer {
 public:
  // Reads and checks the file; throws Error (NOT_FOUND, BAD_BUNDLE, UNSUPPORTED).
  explicit Tokenizer(const std::string& path);

  // text (UTF-8) -> ids. parse_special: added tokens written in the text become their ids (what a
  // rendered chat template needs; tokenizers' default); else the text stays text (llama.cpp's
  // parse_special = false). add_special: the post-processor's tokens (e.g. Llama-3's BOS).
  std::vector<int32_t> encode(const std::string& text, bool parse_special, bool add_special);
  // ids -> text, tokenizers' decode (special tokens skipped when asked; invalid UTF-8 from byte
  // tokens becomes U+FFFD).
  std::string decode(const int32_t* ids, size_t n, bool skip_special) const;
  size_t vocab_size() const;

 private:
  struct Added {
    std::string content;
    int32_t id;
    bool special;
  };
  void load_added(const nlohmann::json& added);
  void load_post(const nlohmann::json& post);
  void encode_text(const std::string& text, std::vector<int32_t>& out);
  size_t match_added(const std::string& text, size_t at) const;  // -> index + 1 of the longest match, 0: none

  std::unique_ptr<Bpe> bpe_;
  std::unique_ptr<PreTokenizer> pre_;
  bool nfc_ = false;
  std::vector<Added> added_;
  std::unordered_map<int32_t, size_t> added_by_id_;
  std::vector<std::vector<size_t>> added_by_byte_;  // first byte -> added tokens starting with it
  std::vector<int32_t> before_, after_;  // the post-processor's ids around a single sequence
  ByteAlphabet alphabet_;
};

// Incremental detokenization that never emits half a character (runtime/bundle/tokenizer.py
// `StreamDecoder`): decodes a short window of recent ids and emits the text past what the window
// already gave; text ending in U+FFFD (an incomplete UTF-8 sequence) waits for the next id.
class StreamDecoder {
 public:
  StreamDecoder(const Tokenizer& tokenizer, bool skip_special) : tok_(tokenizer), skip_(skip_special) {}
  std::string push(const int32_t* ids, size_t n);
  std::string flush();

 private:
  const Tokenizer& tok_;
  bool skip_;
  std::vector<int32_t> ids_;
  size_t prefix_ = 0, read_ = 0;
};

}  // namespace specrt
