#define PCRE2_CODE_UNIT_WIDTH 8
#include "pretokenize.h"

#include <pcre2.h>

#include "error.h"

namespace specrt {

namespace {
// Hugging Face tokenizers' ByteLevel split (GPT-2's pattern)
const char* kByteLevelPattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

[[noreturn]] void unsupported(const std::string& what) {
  fail(SPECRT_ERR_UNSUPPORTED, "tokenizer.json: " + what + " is not supported (byte-level BPE only: GPT-2, Qwen2 "
                               "and Llama-3 style); give token ids instead");
}
}  // namespace

Regex::Regex(const std::string& pattern, bool literal) {
  int error = 0;
  PCRE2_SIZE at = 0;
  uint32_t options = PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0);
  code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), options, &error, &at, nullptr);
  if (!code_) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof message);
    fail(SPECRT_ERR_UNSUPPORTED, "tokenizer.json: PCRE2 cannot compile the pattern " + pattern + " (at " +
                                     std::to_string(at) + "): " + reinterpret_cast<char*>(message));
  }
  pcre2_jit_compile(static_cast<pcre2_code*>(code_), PCRE2_JIT_COMPLETE);  // faster where JIT exists
}

Regex::~Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

void Regex::find_all(const std::string& text, std::vector<std::pair<size_t, size_t>>& out) const {
  auto* code = static_cast<pcre2_code*>(code_);
  pcre2_match_data* match = pcre2_match_data_create_from_pattern(code, nullptr);
  auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  for (size_t from = 0; from <= text.size();) {
    int rc = pcre2_match(code, subject, text.size(), from, PCRE2_NO_UTF_CHECK, match, nullptr);
    if (rc < 0) break;  // PCRE2_ERROR_NOMATCH, or a limit: the rest is one gap
    PCRE2_SIZE* at = pcre2_get_ovector_pointer(match);
    if (at[1] == at[0]) {  // an empty match: step one character on
      from = at[1] + 1;
      while (from < text.size() && (uint8_t(text[from]) & 0xC0) == 0x80) ++from;
      continue;
    }
    out.emplace_back(at[0], at[1]);
    from = at[1];
  }
  pcre2_match_data_free(match);
}

PreTokenizer::PreTokenizer(const nlohmann::json& config) {
  if (config.is_null()) return;  // no pre-tokenizer: the text is one word
  if (config.value("type", "") == "Sequence") {
    for (const auto& step : config.at("pretokenizers")) add(step);
  } else {
    add(config);
  }
}

void PreTokenizer::add(const nlohmann::json& j) {
  std::string type = j.value("type", "");
  Step step{};
  if (type == "ByteLevel") {
    step.kind = Step::kByteLevel;
    step.prefix_space = j.value("add_prefix_space", false);
    if (j.value("use_regex", true)) step.regex = std::make_shared<Regex>(kByteLevelPattern);
  } else if (type == "Split") {
    step.kind = Step::kSplit;
    std::string behavior = j.value("behavior", "");
    if (j.value("invert", false)) unsupported("an inverted Split");
    if (behavior != "Isolated" && behavior != "Removed") unsupported("Split behavior " + behavior);
    step.removed = behavior == "Removed";
    const auto& pattern = j.at("pattern");
    if (pattern.contains("Regex")) step.regex = std::make_shared<Regex>(pattern["Regex"].get<std::string>());
    else step.regex = std::make_shared<Regex>(pattern.at("String").get<std::string>(), true);
  } else {
    unsupported("pre-tokenizer " + type);
  }
  steps_.push_back(step);
}

void PreTokenizer::apply(const Step& step, const std::vector<std::string>& in, std::vector<std::string>& out) const {
  std::vector<std::pair<size_t, size_t>> matches;
  for (const std::string& piece : in) {
    std::string text = step.kind == Step::kByteLevel && step.prefix_space && piece.rfind(' ', 0) != 0 ? " " + piece : piece;
    std::vector<std::string> parts;
    if (!step.regex) {
      parts.push_back(text);
    } else {
      matches.clear();
      step.regex->find_all(text, matches);
      size_t last = 0;
      for (auto [a, b] : matches) {  // Isolated: gaps and matches alike become pieces
        if (a > last) parts.push_back(text.substr(last, a - last));
        if (!step.removed) parts.push_back(text.substr(a, b - a));
        last = b;
      }
      if (last < text.size()) parts.push_back(text.substr(last));
    }
    for (std::string& part : parts) {
      if (step.kind == Step::kByteLevel) {  // every byte as its alphabet character
        std::string mapped;
        for (unsigned char b : part) mapped += alphabet_.encode(b);
        part = std::move(mapped);
      }
      if (!part.empty()) out.push_back(std::move(part));
    }
  }
}

void PreTokenizer::run(const std::string& text, std::vector<std::string>& out) const {
  std::vector<std::string> pieces{text}, next;
  for (const Step& step : steps_) {
    next.clear();
    apply(step, pieces, next);
    pieces.swap(next);
  }
  for (std::string& p : pieces) out.push_back(std::move(p));
}

}  // namespace specrt
