#include "unicode.h"

namespace specrt {

std::string utf8(uint32_t cp) {
  std::string out;
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
  return out;
}

namespace {
// The length of the valid UTF-8 sequence at s[i] (1..4), or -(bytes of its maximal invalid
// prefix, >= 1): the Unicode "maximal subpart" rule, as Rust's from_utf8_lossy applies it.
int sequence(const std::string& s, size_t i) {
  auto b = [&](size_t k) { return k < s.size() ? uint8_t(s[k]) : 0x100; };
  unsigned c = b(i);
  if (c < 0x80) return 1;
  int need;
  unsigned lo = 0x80, hi = 0xBF;  // the allowed range of the second byte
  if (c >= 0xC2 && c <= 0xDF) need = 1;
  else if (c == 0xE0) need = 2, lo = 0xA0;
  else if (c >= 0xE1 && c <= 0xEC) need = 2;
  else if (c == 0xED) need = 2, hi = 0x9F;
  else if (c >= 0xEE && c <= 0xEF) need = 2;
  else if (c == 0xF0) need = 3, lo = 0x90;
  else if (c >= 0xF1 && c <= 0xF3) need = 3;
  else if (c == 0xF4) need = 3, hi = 0x8F;
  else return -1;
  for (int k = 1; k <= need; ++k) {
    unsigned x = b(i + k);
    bool ok = k == 1 ? (x >= lo && x <= hi) : (x >= 0x80 && x <= 0xBF);
    if (!ok) return -k;
  }
  return need + 1;
}
}  // namespace

bool valid_utf8(const std::string& text) {
  for (size_t i = 0; i < text.size();) {
    int n = sequence(text, i);
    if (n < 0) return false;
    i += n;
  }
  return true;
}

std::string utf8_lossy(const std::string& bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (size_t i = 0; i < bytes.size();) {
    int n = sequence(bytes, i);
    if (n > 0) {
      out.append(bytes, i, n);
      i += n;
    } else {
      out += "\xEF\xBF\xBD";
      i += -n;
    }
  }
  return out;
}

std::vector<std::string> utf8_chars(const std::string& text) {
  std::vector<std::string> out;
  for (size_t i = 0; i < text.size();) {
    int n = sequence(text, i);
    if (n < 0) n = -n;
    out.push_back(text.substr(i, n));
    i += n;
  }
  return out;
}

ByteAlphabet::ByteAlphabet() {
  // printable Latin-1 bytes are their own character; the rest map to U+0100 onwards, in order
  for (int& x : byte_of_) x = -1;
  int next = 0;
  for (int b = 0; b < 256; ++b) {
    bool own = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    uint32_t cp = own ? b : 0x100 + next++;
    chars_[b] = utf8(cp);
    byte_of_[cp] = b;
  }
}

bool ByteAlphabet::decode(const std::string& text, std::string& bytes) const {
  bytes.clear();
  for (size_t i = 0; i < text.size();) {
    unsigned c = uint8_t(text[i]);
    uint32_t cp;
    if (c < 0x80) cp = c, i += 1;
    else if ((c & 0xE0) == 0xC0 && i + 1 < text.size()) cp = ((c & 0x1F) << 6) | (uint8_t(text[i + 1]) & 0x3F), i += 2;
    else return false;  // every alphabet character is one or two bytes of UTF-8
    if (cp >= 512 || byte_of_[cp] < 0) return false;
    bytes += char(byte_of_[cp]);
  }
  return true;
}

}  // namespace specrt
