// Sampled generations over many seeds through specrt.h, for the statistical test
// (tests/cpp/test_cpp_tiny.py): one line of token ids per seed 0 .. N-1.
//   sample_tokens BUNDLE N PROMPT_IDS MAX_NEW DRAFT K TEMPERATURE TOP_K TOP_P
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "specrt.h"

int main(int argc, char** argv) {
  if (argc != 10) return 2;
  std::vector<int32_t> prompt;
  std::stringstream ids(argv[3]);
  for (std::string item; std::getline(ids, item, ',');) prompt.push_back(std::stoi(item));
  std::string draft = argv[5];
  specrt_open_options options;
  specrt_open_options_init(&options);
  options.draft = draft == "model" ? SPECRT_DRAFT_MODEL : draft == "ngram" ? SPECRT_DRAFT_NGRAM : SPECRT_DRAFT_NONE;
  options.k = std::stoi(argv[6]);
  options.hugepages = 0;
  specrt_model* model = nullptr;
  if (specrt_open(argv[1], &options, &model) != SPECRT_OK) {
    std::fprintf(stderr, "%s\n", specrt_last_error());
    return 1;
  }
  specrt_generate_params params;
  specrt_generate_params_init(&params);
  params.max_new_tokens = std::stoi(argv[4]);
  params.temperature = std::stof(argv[7]);
  params.top_k = std::stoi(argv[8]);
  params.top_p = std::stof(argv[9]);
  params.ignore_eos = 1;
  std::vector<int32_t> out(params.max_new_tokens);
  specrt_stats stats;
  long drafted = 0, accepted = 0;
  for (int seed = 0, n = std::stoi(argv[2]); seed < n; ++seed) {
    params.seed = uint64_t(seed);
    size_t got = 0;
    specrt_stats_init(&stats);
    if (specrt_generate(model, prompt.data(), prompt.size(), &params, out.data(), out.size(), &got, &stats) != SPECRT_OK) {
      std::fprintf(stderr, "%s\n", specrt_last_error());
      return 1;
    }
    drafted += stats.drafted, accepted += stats.accepted;
    for (size_t i = 0; i < got; ++i) std::printf("%s%d", i ? "," : "", out[i]);
    std::printf("\n");
  }
  std::fprintf(stderr, "drafted %ld accepted %ld\n", drafted, accepted);
  specrt_close(model);
  return 0;
}
