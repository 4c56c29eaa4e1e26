/* Opens a bundle, generates 100 times (drafters, sampling and seeds varied; the same prompt and
   length), and prints the process's resident anonymous memory (RssAnon: the heap, onnxruntime's
   arena, the KV and other buffers; not the pages of mapped files and code) after the first and
   after the 10th and after the last generation, in kB (tests/cpp/test_cpp_tiny.py).
     memory_check BUNDLE MAX_NEW_TOKENS */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "specrt.h"

static long rss_kb(void) {
  char line[256];
  long kb = -1;
  FILE *f = fopen("/proc/self/status", "r");
  if (!f) return -1;
  while (fgets(line, sizeof line, f))
    if (strncmp(line, "RssAnon:", 8) == 0) kb = atol(line + 8);
  fclose(f);
  return kb;
}

int main(int argc, char **argv) {
  static const specrt_draft drafts[3] = {SPECRT_DRAFT_MODEL, SPECRT_DRAFT_NGRAM, SPECRT_DRAFT_NONE};
  int32_t prompt[7] = {1, 5, 9, 33, 7, 5, 9}, out[256];
  specrt_open_options options;
  specrt_generate_params params;
  specrt_model *model = NULL;
  long first = 0, tenth = 0, last = 0;
  size_t n = 0;
  int i;
  if (argc != 3) return 2;
  specrt_open_options_init(&options);
  options.draft = SPECRT_DRAFT_MODEL;
  if (specrt_open(argv[1], &options, &model) != SPECRT_OK) {
    fprintf(stderr, "%s\n", specrt_last_error());
    return 1;
  }
  specrt_generate_params_init(&params);
  params.max_new_tokens = atoi(argv[2]);
  params.ignore_eos = 1;
  for (i = 0; i < 100; ++i) {
    params.draft = drafts[i % 3];
    params.temperature = (i / 3) % 2 ? 0.9f : 0.0f;
    params.top_p = i % 5 == 4 ? 0.8f : 1.0f;
    params.seed = (uint64_t)i;
    if (specrt_generate(model, prompt, 7, &params, out, 256, &n, NULL) != SPECRT_OK) {
      fprintf(stderr, "%s\n", specrt_last_error());
      return 1;
    }
    if (i == 0) first = rss_kb();
    if (i == 9) tenth = rss_kb();
  }
  last = rss_kb();
  specrt_close(model);
  printf("%ld %ld %ld\n", first, tenth, last);
  return 0;
}
