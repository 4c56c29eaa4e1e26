// UTF-8 and the byte-level alphabet of GPT-2-style BPE tokenizers (Hugging Face tokenizers'
// `ByteLevel`: every byte has a printable character, so a token's text is a string of them).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace specrt {

// The UTF-8 encoding of code point cp.
std::string utf8(uint32_t cp);
// Whether text is valid UTF-8 (no overlong forms, surrogates or code points past U+10FFFF).
bool valid_utf8(const std::string& text);
// bytes -> text, each maximal invalid subsequence replaced by U+FFFD (Rust's
// String::from_utf8_lossy, which Hugging Face tokenizers' decoders use).
std::string utf8_lossy(const std::string& bytes);
// text (valid UTF-8) -> its characters, each as its UTF-8 bytes.
std::vector<std::string> utf8_chars(const std::string& text);

// The byte-level alphabet: byte b -> its character's UTF-8, and back (-1: not a byte character).
class ByteAlphabet {
 public:
  ByteAlphabet();
  const std::string& encode(uint8_t b) const { return chars_[b]; }
  // token text -> its bytes; false if a character is not one of the alphabet's
  bool decode(const std::string& text, std::string& bytes) const;

 private:
  std::string chars_[256];
  int byte_of_[512];  // the alphabet's code points are all below U+0200
};

}  // namespace specrt
