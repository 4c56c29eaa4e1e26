// The C API's text half (include/specrt.h "text"): tokenizers and streaming decoders over
// tokenizer.h, with the same error handling as c_api.cc.
#include <cstring>
#include <filesystem>
#include <mutex>
#include <string>

#include "api_guard.h"
#include "manifest.h"
#include "tokenizer.h"

struct specrt_tokenizer {
  specrt::Tokenizer tokenizer;
  std::mutex encoding;  // encode's word cache is shared; decoding reads only
};

struct specrt_decoder {
  specrt::StreamDecoder stream;
  std::string text;  // the last call's text (what it returned points into)
};

using specrt::fail;
using specrt::guard;

namespace {
std::string tokenizer_file(const std::string& path) {
  namespace fs = std::filesystem;
  if (!fs::exists(path)) fail(SPECRT_ERR_NOT_FOUND, "no bundle or tokenizer.json at " + path);
  if (!fs::is_directory(path)) return path;
  return (fs::path(path) / specrt::load_manifest(path).tokenizer.file).string();
}
}  // namespace


extern "C" {

specrt_status specrt_tokenizer_open(const char* path, specrt_tokenizer** out) {
  return guard([&] {
    if (!out) fail(SPECRT_ERR_INVALID_ARGUMENT, "out is NULL");
    *out = nullptr;
    if (!path) fail(SPECRT_ERR_INVALID_ARGUMENT, "path is NULL");
    *out = new specrt_tokenizer{specrt::Tokenizer(tokenizer_file(path)), {}};
  });
}

void specrt_tokenizer_close(specrt_tokenizer* tokenizer) { delete tokenizer; }

specrt_status specrt_tokenize(specrt_tokenizer* tok, const char* text, size_t text_len, int flags, int32_t* out_ids,
                              size_t out_capacity, size_t* n_out) {
  return guard([&] {
    if (!tok || !n_out || (!text && text_len)) fail(SPECRT_ERR_INVALID_ARGUMENT, "tokenizer, text or n_out is NULL");
    *n_out = 0;
    if (flags & ~(SPECRT_TOKENIZE_PARSE_SPECIAL | SPECRT_TOKENIZE_ADD_SPECIAL))
      fail(SPECRT_ERR_INVALID_ARGUMENT, "unknown tokenize flags " + std::to_string(flags));
    std::vector<int32_t> ids;
    {
      std::lock_guard<std::mutex> lock(tok->encoding);
      ids = tok->tokenizer.encode(std::string(text ? text : "", text_len), flags & SPECRT_TOKENIZE_PARSE_SPECIAL,
                                  flags & SPECRT_TOKENIZE_ADD_SPECIAL);
    }
    *n_out = ids.size();
    if (ids.size() > out_capacity || (!out_ids && !ids.empty()))
      fail(SPECRT_ERR_INVALID_ARGUMENT, "the text has " + std::to_string(ids.size()) + " tokens; out_capacity is " +
                                            std::to_string(out_capacity));
    std::copy(ids.begin(), ids.end(), out_ids);
  });
}

specrt_status specrt_detokenize(specrt_tokenizer* tok, const int32_t* ids, size_t n_ids, int skip_special, char* out_text,
                                size_t out_capacity, size_t* n_out) {
  return guard([&] {
    if (!tok || !n_out || (!ids && n_ids)) fail(SPECRT_ERR_INVALID_ARGUMENT, "tokenizer, ids or n_out is NULL");
    *n_out = 0;
    std::string text = tok->tokenizer.decode(ids, n_ids, skip_special != 0);
    *n_out = text.size();
    if (!out_text || out_capacity <= text.size())
      fail(SPECRT_ERR_INVALID_ARGUMENT, "the text has " + std::to_string(text.size()) + " bytes (+ NUL); out_capacity is " +
                                            std::to_string(out_capacity));
    std::memcpy(out_text, text.c_str(), text.size() + 1);
  });
}

specrt_status specrt_decoder_new(specrt_tokenizer* tok, int skip_special, specrt_decoder** out) {
  return guard([&] {
    if (!tok || !out) fail(SPECRT_ERR_INVALID_ARGUMENT, "tokenizer or out is NULL");
    *out = nullptr;
    *out = new specrt_decoder{specrt::StreamDecoder(tok->tokenizer, skip_special != 0), {}};
  });
}

specrt_status specrt_decoder_push(specrt_decoder* decoder, const int32_t* ids, size_t n_ids, const char** text,
                                  size_t* text_len) {
  return guard([&] {
    if (!decoder || !text || !text_len || (!ids && n_ids))
      fail(SPECRT_ERR_INVALID_ARGUMENT, "decoder, ids, text or text_len is NULL");
    decoder->text = decoder->stream.push(ids, n_ids);
    *text = decoder->text.c_str();
    *text_len = decoder->text.size();
  });
}

specrt_status specrt_decoder_flush(specrt_decoder* decoder, const char** text, size_t* text_len) {
  return guard([&] {
    if (!decoder || !text || !text_len) fail(SPECRT_ERR_INVALID_ARGUMENT, "decoder, text or text_len is NULL");
    decoder->text = decoder->stream.flush();
    *text = decoder->text.c_str();
    *text_len = decoder->text.size();
  });
}

void specrt_decoder_free(specrt_decoder* decoder) { delete decoder; }

}  // extern "C"
