// specrt-cpp BUNDLE --prompt-ids 1,2,3 [options]: one generation through the C API (specrt.h),
// printed as one JSON object {"token_ids": [...], "stats": {...}} on stdout. A failure prints
// {"error": {"code", "status", "message"}} and exits with the specrt_status (1..10).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "specrt.h"

namespace {

using nlohmann::json;

const char* kUsage =
    "usage: specrt-cpp BUNDLE (--prompt-ids 1,2,3 | --prompt-file IDS.json | --prompt TEXT [--add-special])\n"
    "       [--max-new-tokens N]\n"
    "       [--draft model|ngram|none] [--k K] [--adaptive] [--temperature T] [--top-p P] [--top-k K] [--seed S]\n"
    "       [--stop-ids 2,3] [--ignore-eos] [--threads N] [--max-seq-len N] [--no-hugepages]\n"
    "       [--graphs packed|kernels|bundle] [--repeat N]\n";

struct Args {
  std::string bundle;
  std::vector<int32_t> prompt;
  std::string text;  // --prompt: tokenized with the bundle's tokenizer (special tokens parsed)
  bool have_text = false, add_special = false;
  specrt_open_options open;
  specrt_generate_params gen;
  std::vector<int32_t> stop;
  int repeat = 1;
};

[[noreturn]] void die(specrt_status status, const std::string& message) {
  json err = {{"error", {{"code", specrt_status_name(status)}, {"status", int(status)}, {"message", message}}}};
  std::printf("%s\n", err.dump().c_str());
  std::fprintf(stderr, "specrt-cpp: %s\n", message.c_str());
  std::exit(int(status));
}

[[noreturn]] void bad(const std::string& message) {
  std::fputs(kUsage, stderr);
  die(SPECRT_ERR_INVALID_ARGUMENT, message);
}

std::vector<int32_t> ids(const std::string& text) {
  std::vector<int32_t> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    try {
      size_t used = 0;
      long long v = std::stoll(item, &used);
      if (used != item.size() || v < INT32_MIN || v > INT32_MAX) throw std::invalid_argument(item);
      out.push_back(int32_t(v));
    } catch (const std::exception&) {
      bad("not a list of token ids: " + text);
    }
  }
  return out;
}

std::vector<int32_t> ids_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) die(SPECRT_ERR_NOT_FOUND, "cannot read " + path);
  try {
    return json::parse(in).get<std::vector<int32_t>>();
  } catch (const json::exception& e) {
    bad(path + " is not a JSON list of token ids: " + e.what());
  }
  return {};
}

specrt_draft draft_kind(const std::string& name) {
  if (name == "model") return SPECRT_DRAFT_MODEL;
  if (name == "ngram") return SPECRT_DRAFT_NGRAM;
  if (name == "none") return SPECRT_DRAFT_NONE;
  bad("--draft must be model, ngram or none, got " + name);
}

// packed: the packed graphs, on specrt's kernels where they run fast (the default); kernels:
// those required; bundle: the entries' plain graphs
void graphs(specrt_open_options& o, const std::string& name) {
  if (name == "packed") o.packed = 1, o.kernels = -1;
  else if (name == "kernels") o.packed = 1, o.kernels = 1;
  else if (name == "bundle") o.packed = 0, o.kernels = 0;
  else bad("--graphs must be packed, kernels or bundle, got " + name);
}

double number(const std::string& flag, const std::string& text) {
  try {
    size_t used = 0;
    double v = std::stod(text, &used);
    if (used == text.size()) return v;
  } catch (const std::exception&) {
  }
  bad(flag + " takes a number, got " + text);
}

Args parse(int argc, char** argv) {
  Args a;
  specrt_open_options_init(&a.open);
  specrt_generate_params_init(&a.gen);
  bool have_prompt = false;
  for (int i = 1; i < argc; ++i) {
    std::string f = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) bad(f + " needs a value");
      return argv[++i];
    };
    auto integer = [&]() { double v = number(f, value()); if (v != (long long)v) bad(f + " takes an integer"); return (long long)v; };
    if (f == "--help" || f == "-h") { std::fputs(kUsage, stdout); std::exit(0); }
    else if (f == "--prompt-ids") a.prompt = ids(value()), have_prompt = true;
    else if (f == "--prompt-file") a.prompt = ids_file(value()), have_prompt = true;
    else if (f == "--prompt") a.text = value(), a.have_text = have_prompt = true;
    else if (f == "--add-special") a.add_special = true;
    else if (f == "--max-new-tokens") a.gen.max_new_tokens = int(integer());
    else if (f == "--draft") a.open.draft = draft_kind(value());
    else if (f == "--k") a.open.k = int(integer());
    else if (f == "--adaptive") a.open.adaptive = 1;
    else if (f == "--temperature") a.gen.temperature = float(number(f, value()));
    else if (f == "--top-p") a.gen.top_p = float(number(f, value()));
    else if (f == "--top-k") a.gen.top_k = int(integer());
    else if (f == "--seed") a.gen.seed = uint64_t(integer());
    else if (f == "--stop-ids") a.stop = ids(value());
    else if (f == "--ignore-eos") a.gen.ignore_eos = 1;
    else if (f == "--threads") a.open.threads = int(integer());
    else if (f == "--max-seq-len") a.open.max_seq_len = int(integer());
    else if (f == "--no-hugepages") a.open.hugepages = 0;
    else if (f == "--repeat") a.repeat = int(integer());
    else if (f == "--graphs") graphs(a.open, value());
    else if (!f.empty() && f[0] == '-') bad("unknown option " + f);
    else if (a.bundle.empty()) a.bundle = f;
    else bad("one bundle only (got " + a.bundle + " and " + f + ")");
  }
  if (a.bundle.empty()) bad("no BUNDLE given");
  if (!have_prompt) bad("no prompt: give --prompt-ids, --prompt-file or --prompt");
  if (a.repeat < 1) bad("--repeat must be >= 1");
  return a;
}

json stats_json(const specrt_stats& s) {
  static const char* reasons[] = {"length", "eos", "cancelled"};
  return {{"prompt_tokens", s.prompt_tokens}, {"new_tokens", s.new_tokens}, {"rounds", s.rounds},
          {"drafted", s.drafted}, {"accepted", s.accepted}, {"target_calls", s.target_calls},
          {"draft_calls", s.draft_calls}, {"prefill_ms", s.prefill_ms}, {"draft_ms", s.draft_ms},
          {"verify_ms", s.verify_ms}, {"total_ms", s.total_ms}, {"stop_reason", reasons[s.stop_reason]},
          {"ms_per_token", s.new_tokens > 1 ? (s.total_ms - s.prefill_ms) / (s.new_tokens - 1) : 0.0}};
}

// The prompt's ids: --prompt TEXT through the bundle's tokenizer (the text as the model sees
// it: a chat template is the caller's to render; special-token strings become their ids).
void tokenize(specrt_tokenizer* tok, Args& a) {
  int flags = SPECRT_TOKENIZE_PARSE_SPECIAL | (a.add_special ? SPECRT_TOKENIZE_ADD_SPECIAL : 0);
  size_t n = 0;
  specrt_tokenize(tok, a.text.data(), a.text.size(), flags, nullptr, 0, &n);
  a.prompt.resize(n);
  specrt_status st = specrt_tokenize(tok, a.text.data(), a.text.size(), flags, a.prompt.data(), n, &n);
  if (st != SPECRT_OK) die(st, specrt_last_error());
}

// The output's text (special tokens skipped); null without a tokenizer this library reads.
json detokenize(specrt_tokenizer* tok, const std::vector<int32_t>& ids) {
  if (!tok) return nullptr;
  size_t n = 0;
  specrt_detokenize(tok, ids.data(), ids.size(), 1, nullptr, 0, &n);
  std::string text(n + 1, '\0');
  if (specrt_detokenize(tok, ids.data(), ids.size(), 1, text.data(), text.size(), &n) != SPECRT_OK) return nullptr;
  text.resize(n);
  return text;
}

}  // namespace

int main(int argc, char** argv) {
  Args a = parse(argc, argv);
  a.gen.stop_ids = a.stop.data();
  a.gen.n_stop_ids = a.stop.size();
  // the tokenizer: required for --prompt; else only for the output's text (null when the bundle's
  // tokenizer is not one this library reads)
  specrt_tokenizer* tok = nullptr;
  specrt_status tst = specrt_tokenizer_open(a.bundle.c_str(), &tok);
  if (a.have_text) {
    if (tst != SPECRT_OK) die(tst, specrt_last_error());
    tokenize(tok, a);
  }
  auto t0 = std::chrono::steady_clock::now();
  specrt_model* model = nullptr;
  specrt_status st = specrt_open(a.bundle.c_str(), &a.open, &model);
  if (st != SPECRT_OK) die(st, specrt_last_error());
  double load_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::vector<int32_t> out(a.gen.max_new_tokens > 0 ? a.gen.max_new_tokens : 1);
  size_t n = 0;
  specrt_stats stats;
  specrt_stats_init(&stats);
  json runs = json::array();
  for (int r = 0; r < a.repeat; ++r) {
    st = specrt_generate(model, a.prompt.data(), a.prompt.size(), &a.gen, out.data(), out.size(), &n, &stats);
    if (st != SPECRT_OK) {
      std::string message = specrt_last_error();
      specrt_close(model);
      die(st, message);
    }
    runs.push_back(stats_json(stats)["ms_per_token"]);
  }
  specrt_model_info info;
  specrt_model_info_init(&info);
  specrt_model_get_info(model, &info);
  static const char* drafts[] = {"default", "model", "ngram", "none"};
  std::vector<int32_t> ids(out.begin(), out.begin() + n);
  json result = {{"token_ids", ids},
                 {"text", detokenize(tok, ids)},
                 {"stats", stats_json(stats)},
                 {"draft", drafts[info.draft]},
                 {"k", info.k},
                 {"graphs", {{"target", info.target_graph}, {"draft", info.draft_graph}}},
                 {"load_ms", load_ms}};
  if (a.repeat > 1) result["ms_per_token_runs"] = runs;
  if (a.have_text) result["prompt_ids"] = a.prompt;
  std::printf("%s\n", result.dump().c_str());
  specrt_close(model);
  specrt_tokenizer_close(tok);
  return 0;
}
