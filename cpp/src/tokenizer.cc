#include "tokenizer.h"

#include <unistr.h>
#include <uninorm.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "error.h"

namespace specrt {

namespace {
using nlohmann::json;

[[noreturn]] void unsupported(const std::string& what) {
  fail(SPECRT_ERR_UNSUPPORTED, "tokenizer.json: " + what + " is not supported (byte-level BPE only: GPT-2, Qwen2 "
                               "and Llama-3 style); give token ids instead");
}

std::string text_of(const json& j, const char* key) {
  auto it = j.find(key);
  return it == j.end() || it->is_null() ? "" : it->get<std::string>();
}

bool normalizer_is_nfc(const json& n) {
  if (n.is_null()) return false;
  std::string type = n.value("type", "");
  if (type == "NFC") return true;
  if (type == "Sequence" && n.at("normalizers").empty()) return false;
  if (type == "Sequence" && n.at("normalizers").size() == 1) return normalizer_is_nfc(n["normalizers"][0]);
  unsupported("normalizer " + type);
}

std::string nfc(const std::string& text) {
  size_t length = 0;
  uint8_t* out = u8_normalize(UNINORM_NFC, reinterpret_cast<const uint8_t*>(text.data()), text.size(), nullptr, &length);
  if (!out) fail(SPECRT_ERR_NO_MEMORY, "NFC normalization failed");
  std::string result(reinterpret_cast<char*>(out), length);
  std::free(out);
  return result;
}

std::vector<std::pair<std::string, std::string>> read_merges(const json& merges) {
  std::vector<std::pair<std::string, std::string>> out;
  out.reserve(merges.size());
  for (const auto& m : merges) {
    if (m.is_array()) {
      out.emplace_back(m.at(0).get<std::string>(), m.at(1).get<std::string>());
    } else {  // older files: "left right"
      std::string s = m.get<std::string>();
      auto space = s.find(' ', 1);
      if (space == std::string::npos) fail(SPECRT_ERR_BAD_BUNDLE, "tokenizer.json: merge \"" + s + "\" has no space");
      out.emplace_back(s.substr(0, space), s.substr(space + 1));
    }
  }
  return out;
}
}  // namespace

Tokenizer::Tokenizer(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail(SPECRT_ERR_NOT_FOUND, "the bundle's tokenizer " + path + " is missing");
  json j;
  try {
    j = json::parse(in);
    const json& model = j.at("model");
    if (model.value("type", "BPE") != "BPE") unsupported("model " + model.value("type", ""));
    if (model.value("byte_fallback", false)) unsupported("byte_fallback");
    if (!text_of(model, "continuing_subword_prefix").empty() || !text_of(model, "end_of_word_suffix").empty())
      unsupported("a subword prefix or suffix");
    if (!model.value("dropout", json()).is_null()) unsupported("BPE dropout");
    const json& decoder = j.value("decoder", json());
    if (decoder.is_null() || decoder.value("type", "") != "ByteLevel")
      unsupported("decoder " + (decoder.is_null() ? std::string("null") : decoder.value("type", "")));
    nfc_ = normalizer_is_nfc(j.value("normalizer", json()));
    pre_ = std::make_unique<PreTokenizer>(j.value("pre_tokenizer", json()));
    bpe_ = std::make_unique<Bpe>(model.at("vocab").get<std::unordered_map<std::string, int32_t>>(),
                                 read_merges(model.at("merges")), model.value("ignore_merges", false));
    load_added(j.value("added_tokens", json::array()));
    load_post(j.value("post_processor", json()));
  } catch (const json::exception& e) {
    fail(SPECRT_ERR_BAD_BUNDLE, path + " is corrupt: " + e.what());
  }
}

void Tokenizer::load_added(const json& added) {
  added_by_byte_.assign(256, {});
  for (const auto& a : added) {
    if (a.value("single_word", false) || a.value("lstrip", false) || a.value("rstrip", false))
      unsupported("added token " + a.value("content", "") + " with single_word / lstrip / rstrip");
    Added t{a.at("content").get<std::string>(), a.at("id").get<int32_t>(), a.value("special", false)};
    if (t.content.empty()) continue;
    added_by_id_[t.id] = added_.size();
    added_by_byte_[uint8_t(t.content[0])].push_back(added_.size());
    added_.push_back(t);
  }
}

void Tokenizer::load_post(const json& post) {
  if (post.is_null() || post.value("type", "") == "ByteLevel") return;  // ByteLevel: offsets only
  if (post.value("type", "") != "TemplateProcessing") unsupported("post-processor " + post.value("type", ""));
  const json& specials = post.value("special_tokens", json::object());
  std::vector<int32_t>* side = &before_;
  for (const auto& item : post.at("single")) {
    if (item.contains("Sequence")) {
      side = &after_;
      continue;
    }
    std::string name = item.at("SpecialToken").at("id").get<std::string>();
    for (const auto& id : specials.at(name).at("ids")) side->push_back(id.get<int32_t>());
  }
}

size_t Tokenizer::vocab_size() const { return bpe_->size(); }

size_t Tokenizer::match_added(const std::string& text, size_t at) const {
  size_t best = 0, length = 0;
  for (size_t i : added_by_byte_[uint8_t(text[at])]) {
    const std::string& c = added_[i].content;
    if (c.size() > length && text.compare(at, c.size(), c) == 0) best = i + 1, length = c.size();
  }
  return best;
}

void Tokenizer::encode_text(const std::string& text, std::vector<int32_t>& out) {
  if (text.empty()) return;
  std::vector<std::string> words;
  pre_->run(nfc_ ? nfc(text) : text, words);
  for (const std::string& w : words) bpe_->tokenize(w, out);
}

std::vector<int32_t> Tokenizer::encode(const std::string& text, bool parse_special, bool add_special) {
  if (!valid_utf8(text)) fail(SPECRT_ERR_INVALID_ARGUMENT, "the text is not valid UTF-8");
  std::vector<int32_t> out;
  if (add_special) out = before_;
  size_t from = 0;
  if (parse_special) {  // the leftmost, then longest, added token splits the text
    for (size_t at = 0; at < text.size(); ++at) {
      size_t hit = match_added(text, at);
      if (!hit) continue;
      encode_text(text.substr(from, at - from), out);
      out.push_back(added_[hit - 1].id);
      at += added_[hit - 1].content.size() - 1;
      from = at + 1;
    }
  }
  encode_text(text.substr(from), out);
  if (add_special) out.insert(out.end(), after_.begin(), after_.end());
  return out;
}

std::string Tokenizer::decode(const int32_t* ids, size_t n, bool skip_special) const {
  std::string bytes, piece;
  for (size_t i = 0; i < n; ++i) {
    const std::string* text = nullptr;
    auto added = added_by_id_.find(ids[i]);
    if (added != added_by_id_.end()) {
      if (skip_special && added_[added->second].special) continue;
      text = &added_[added->second].content;
    } else {
      text = bpe_->token(ids[i]);
    }
    if (!text) continue;  // an id the tokenizer does not have
    // ByteLevel: a token of alphabet characters is its bytes; any other text stays as it is
    bytes += alphabet_.decode(*text, piece) ? piece : *text;
  }
  return utf8_lossy(bytes);
}

std::string StreamDecoder::push(const int32_t* ids, size_t n) {
  ids_.insert(ids_.end(), ids, ids + n);
  std::string before = tok_.decode(ids_.data() + prefix_, read_ - prefix_, skip_);
  std::string after = tok_.decode(ids_.data() + prefix_, ids_.size() - prefix_, skip_);
  static const std::string kReplacement = "\xEF\xBF\xBD";
  bool incomplete = after.size() >= 3 && after.compare(after.size() - 3, 3, kReplacement) == 0;
  if (after.size() > before.size() && !incomplete) {
    prefix_ = read_;
    read_ = ids_.size();
    return after.substr(before.size());
  }
  return "";
}

std::string StreamDecoder::flush() {
  std::string before = tok_.decode(ids_.data() + prefix_, read_ - prefix_, skip_);
  std::string after = tok_.decode(ids_.data() + prefix_, ids_.size() - prefix_, skip_);
  prefix_ = read_ = ids_.size();
  return after.size() > before.size() ? after.substr(before.size()) : "";
}

}  // namespace specrt
