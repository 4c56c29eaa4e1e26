// The text API over many strings, for tests/cpp/test_cpp_tokenizer.py. Input: one string a line,
// hex-encoded UTF-8. Output, a line per string, tab-separated: ids with special tokens parsed,
// ids with text kept text, ids with the post-processor's tokens, then (hex) the decode of the
// first ids with special tokens, without them, and the streaming decoder's text fed one id at a
// time. Lines "ids:1,2,3" instead decode those ids (with / without special tokens, streamed).
//   tokenize_lines TOKENIZER < lines
#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "specrt.h"

namespace {

specrt_tokenizer* tok = nullptr;

[[noreturn]] void die(specrt_status st) {
  std::fprintf(stderr, "%s: %s\n", specrt_status_name(st), specrt_last_error());
  std::exit(1);
}

std::string hex(const std::string& s) {
  static const char* d = "0123456789abcdef";
  std::string out;
  for (unsigned char c : s) out += d[c >> 4], out += d[c & 15];
  return out;
}

std::string unhex(const std::string& h) {
  std::string out;
  for (size_t i = 0; i + 1 < h.size(); i += 2) out += char(std::stoi(h.substr(i, 2), nullptr, 16));
  return out;
}

std::vector<int32_t> encode(const std::string& text, int flags) {
  size_t n = 0;
  specrt_tokenize(tok, text.data(), text.size(), flags, nullptr, 0, &n);
  std::vector<int32_t> ids(n);
  specrt_status st = specrt_tokenize(tok, text.data(), text.size(), flags, ids.data(), ids.size(), &n);
  if (st != SPECRT_OK) die(st);
  return ids;
}

std::string decode(const std::vector<int32_t>& ids, int skip) {
  size_t n = 0;
  specrt_detokenize(tok, ids.data(), ids.size(), skip, nullptr, 0, &n);
  std::string text(n + 1, '\0');
  specrt_status st = specrt_detokenize(tok, ids.data(), ids.size(), skip, text.data(), text.size(), &n);
  if (st != SPECRT_OK) die(st);
  text.resize(n);
  return text;
}

std::string stream(const std::vector<int32_t>& ids) {
  specrt_decoder* dec = nullptr;
  specrt_status st = specrt_decoder_new(tok, 1, &dec);
  if (st != SPECRT_OK) die(st);
  std::string out;
  const char* piece = nullptr;
  size_t len = 0;
  for (int32_t id : ids) {
    if ((st = specrt_decoder_push(dec, &id, 1, &piece, &len)) != SPECRT_OK) die(st);
    out.append(piece, len);
  }
  if ((st = specrt_decoder_flush(dec, &piece, &len)) != SPECRT_OK) die(st);
  out.append(piece, len);
  specrt_decoder_free(dec);
  return out;
}

std::string join(const std::vector<int32_t>& ids) {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) out += (i ? "," : "") + std::to_string(ids[i]);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  specrt_status st = specrt_tokenizer_open(argv[1], &tok);
  if (st != SPECRT_OK) die(st);
  for (std::string line; std::getline(std::cin, line);) {
    std::vector<int32_t> ids;
    std::string a = "-", b = "-", c = "-";
    if (line.rfind("ids:", 0) == 0) {
      std::stringstream items(line.substr(4));
      for (std::string item; std::getline(items, item, ',');) ids.push_back(std::stoi(item));
    } else {
      std::string text = unhex(line);
      ids = encode(text, SPECRT_TOKENIZE_PARSE_SPECIAL);
      a = join(ids);
      b = join(encode(text, 0));
      c = join(encode(text, SPECRT_TOKENIZE_PARSE_SPECIAL | SPECRT_TOKENIZE_ADD_SPECIAL));
    }
    std::printf("%s\t%s\t%s\t%s\t%s\t%s\n", a.c_str(), b.c_str(), c.c_str(), hex(decode(ids, 0)).c_str(),
                hex(decode(ids, 1)).c_str(), hex(stream(ids)).c_str());
  }
  specrt_tokenizer_close(tok);
  return 0;
}
