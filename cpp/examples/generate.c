/* generate.c - a bundle's continuation of token ids through specrt.h, streamed as it is
 * committed (docs/cpp.md). Build and run (after `make cpp`):
 *   cc -std=c99 -Icpp/include cpp/examples/generate.c -L.cache/cpp -lspecrt -Wl,-rpath,.cache/cpp -o generate
 *   ./generate engines/default 1 9690 198 ...
 * Prints the new token ids, comma-separated, then one line of stats on stderr. */
#include <stdio.h>
#include <stdlib.h>

#include "specrt.h"

static int print_token(void *user_data, int32_t token) {
  int *count = (int *)user_data;
  printf("%s%d", (*count)++ ? "," : "", (int)token);
  fflush(stdout);
  return 0; /* nonzero would stop here */
}

int main(int argc, char **argv) {
  specrt_open_options options;
  specrt_generate_params params;
  specrt_stats stats;
  specrt_model *model = NULL;
  specrt_status status;
  int32_t *prompt, *out;
  size_t n_prompt = (size_t)(argc > 2 ? argc - 2 : 0), n_out = 0, i;
  int count = 0;

  if (argc < 3) {
    fprintf(stderr, "usage: %s BUNDLE TOKEN_ID [TOKEN_ID ...]\n", argv[0]);
    return 1;
  }
  specrt_open_options_init(&options); /* defaults: the bundle's draft model and k, every core */
  status = specrt_open(argv[1], &options, &model);
  if (status != SPECRT_OK) {
    fprintf(stderr, "%s: %s\n", specrt_status_name(status), specrt_last_error());
    return (int)status;
  }

  specrt_generate_params_init(&params); /* greedy, 128 tokens, the bundle's stop tokens */
  params.max_new_tokens = 32;
  params.on_token = print_token;
  params.user_data = &count;
  prompt = malloc(n_prompt * sizeof *prompt);
  out = malloc((size_t)params.max_new_tokens * sizeof *out);
  for (i = 0; i < n_prompt; ++i) prompt[i] = (int32_t)atoi(argv[i + 2]);

  specrt_stats_init(&stats);
  status = specrt_generate(model, prompt, n_prompt, &params, out, (size_t)params.max_new_tokens, &n_out, &stats);
  printf("\n");
  if (status != SPECRT_OK)
    fprintf(stderr, "%s: %s\n", specrt_status_name(status), specrt_last_error());
  else
    fprintf(stderr, "specrt %s: %d tokens, %d rounds, %d/%d drafts accepted, %.1f ms\n", specrt_version(),
            stats.new_tokens, stats.rounds, stats.accepted, stats.drafted, stats.total_ms);
  free(prompt);
  free(out);
  specrt_close(model);
  return (int)status;
}
