/* generate.c - text in, text out through specrt.h: the prompt tokenized with the bundle's
 * tokenizer, the reply streamed as its tokens are committed (docs/cpp.md). Build and run
 * (after `make cpp`):
 *   cc -std=c99 -Icpp/include cpp/examples/generate.c -L.cache/cpp -lspecrt -Wl,-rpath,.cache/cpp -o generate
 *   ./generate engines/default "$(printf '<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n')"
 * The prompt is the text as the model sees it: render the chat template yourself. Prints the
 * reply, then one line of stats on stderr. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "specrt.h"

static int print_text(void *user_data, int32_t token) {
  specrt_decoder *decoder = (specrt_decoder *)user_data;
  const char *text;
  size_t len;
  if (specrt_decoder_push(decoder, &token, 1, &text, &len) != SPECRT_OK) return 1; /* stop */
  fwrite(text, 1, len, stdout);
  fflush(stdout);
  return 0; /* nonzero would stop here */
}

static int fail(specrt_status status) {
  fprintf(stderr, "%s: %s\n", specrt_status_name(status), specrt_last_error());
  return (int)status;
}

int main(int argc, char **argv) {
  specrt_tokenizer *tokenizer = NULL;
  specrt_model *model = NULL;
  specrt_decoder *decoder = NULL;
  specrt_generate_params params;
  specrt_stats stats;
  specrt_status status;
  int32_t *prompt = NULL, out[32];
  size_t n_prompt = 0, n_out = 0, len;
  const char *rest;

  if (argc != 3) {
    fprintf(stderr, "usage: %s BUNDLE PROMPT_TEXT\n", argv[0]);
    return 1;
  }
  /* the prompt's ids: ask for the count, then fill */
  if ((status = specrt_tokenizer_open(argv[1], &tokenizer)) != SPECRT_OK) return fail(status);
  specrt_tokenize(tokenizer, argv[2], strlen(argv[2]), SPECRT_TOKENIZE_PARSE_SPECIAL, NULL, 0, &n_prompt);
  prompt = malloc((n_prompt ? n_prompt : 1) * sizeof *prompt);
  status = specrt_tokenize(tokenizer, argv[2], strlen(argv[2]), SPECRT_TOKENIZE_PARSE_SPECIAL, prompt, n_prompt,
                           &n_prompt);
  /* the model: options NULL = the defaults (the bundle's draft model and k, every core) */
  if (status == SPECRT_OK) status = specrt_open(argv[1], NULL, &model);
  if (status == SPECRT_OK) status = specrt_decoder_new(tokenizer, 1, &decoder);
  if (status == SPECRT_OK) {
    specrt_generate_params_init(&params); /* greedy, the bundle's stop tokens */
    params.max_new_tokens = 32;
    params.on_token = print_text;
    params.user_data = decoder;
    specrt_stats_init(&stats);
    status = specrt_generate(model, prompt, n_prompt, &params, out, 32, &n_out, &stats);
  }
  if (status == SPECRT_OK && specrt_decoder_flush(decoder, &rest, &len) == SPECRT_OK) fwrite(rest, 1, len, stdout);
  printf("\n");
  if (status != SPECRT_OK)
    fail(status);
  else
    fprintf(stderr, "specrt %s: %d tokens, %d rounds, %d/%d drafts accepted, %.1f ms\n", specrt_version(),
            stats.new_tokens, stats.rounds, stats.accepted, stats.drafted, stats.total_ms);
  specrt_decoder_free(decoder);
  specrt_close(model);
  specrt_tokenizer_close(tokenizer);
  free(prompt);
  return (int)status;
}
