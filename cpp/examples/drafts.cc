// drafts.cc - one open bundle, several prompts, each drafter: what a C++ service does with
// specrt.h (RAII over the C handle, the drafter chosen per request). Build (after `make cpp`):
//   c++ -std=c++17 -Icpp/include cpp/examples/drafts.cc -L.cache/cpp -lspecrt -Wl,-rpath,.cache/cpp -o drafts
//   ./drafts engines/default PROMPTS.txt 64 none model ngram
// PROMPTS.txt: one prompt a line, token ids separated by commas. Prints one line per prompt and
// drafter: "<prompt index> <drafter> <accepted>/<drafted> <ids, comma-separated>".
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "specrt.h"

namespace {

struct Close {
  void operator()(specrt_model* m) const { specrt_close(m); }
};
using Model = std::unique_ptr<specrt_model, Close>;

void check(specrt_status status) {
  if (status != SPECRT_OK) throw std::runtime_error(std::string(specrt_status_name(status)) + ": " + specrt_last_error());
}

Model open(const std::string& path) {
  specrt_open_options options;
  specrt_open_options_init(&options);
  options.draft = SPECRT_DRAFT_MODEL;  // load the draft model; each request picks its drafter
  specrt_model* m = nullptr;
  check(specrt_open(path.c_str(), &options, &m));
  return Model(m);
}

specrt_draft drafter(const std::string& name) {
  if (name == "model") return SPECRT_DRAFT_MODEL;
  if (name == "ngram") return SPECRT_DRAFT_NGRAM;
  if (name == "none") return SPECRT_DRAFT_NONE;
  throw std::invalid_argument("unknown drafter " + name);
}

std::vector<std::vector<int32_t>> read_prompts(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::vector<std::vector<int32_t>> prompts;
  for (std::string line; std::getline(in, line);) {
    std::vector<int32_t> ids;
    std::stringstream items(line);
    for (std::string item; std::getline(items, item, ',');) ids.push_back(std::stoi(item));
    if (!ids.empty()) prompts.push_back(ids);
  }
  return prompts;
}

}  // namespace

int main(int argc, char** argv) try {
  if (argc < 5) {
    std::fprintf(stderr, "usage: %s BUNDLE PROMPTS.txt MAX_NEW_TOKENS DRAFTER [DRAFTER ...]\n", argv[0]);
    return 1;
  }
  Model model = open(argv[1]);
  auto prompts = read_prompts(argv[2]);
  specrt_generate_params params;
  specrt_generate_params_init(&params);
  params.max_new_tokens = std::stoi(argv[3]);
  std::vector<int32_t> out(params.max_new_tokens);
  for (size_t p = 0; p < prompts.size(); ++p) {
    for (int d = 4; d < argc; ++d) {
      params.draft = drafter(argv[d]);
      specrt_stats stats;
      specrt_stats_init(&stats);
      size_t n = 0;
      check(specrt_generate(model.get(), prompts[p].data(), prompts[p].size(), &params, out.data(), out.size(), &n, &stats));
      std::printf("%zu %s %d/%d ", p, argv[d], stats.accepted, stats.drafted);
      for (size_t i = 0; i < n; ++i) std::printf("%s%d", i ? "," : "", out[i]);
      std::printf("\n");
    }
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 1;
}
