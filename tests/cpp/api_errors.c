/* specrt.h's failures, checked from C without loading a model: each returns its status and
   leaves a message for this thread (tests/cpp/test_cpp_errors.py compiles and runs this). */
#include <stdio.h>
#include <string.h>

#include "specrt.h"

static int failures = 0;

static void expect(const char *what, specrt_status got, specrt_status want) {
  if (got != want) {
    printf("FAIL %s: %s, expected %s (%s)\n", what, specrt_status_name(got), specrt_status_name(want),
           specrt_last_error());
    ++failures;
  } else if (want != SPECRT_OK && specrt_last_error()[0] == '\0') {
    printf("FAIL %s: no message\n", what);
    ++failures;
  }
}

int main(int argc, char **argv) {
  specrt_model *model = (specrt_model *)&failures; /* not NULL: a failed open must clear it */
  specrt_open_options options;
  specrt_generate_params params;
  int32_t prompt[1] = {1}, out[4];
  size_t n = 99;
  if (argc < 2) return 2;

  if (specrt_api_version() != SPECRT_API_VERSION || strlen(specrt_version()) == 0) {
    printf("FAIL version\n");
    ++failures;
  }
  expect("missing bundle", specrt_open(argv[1], NULL, &model), SPECRT_ERR_NOT_FOUND);
  if (model != NULL) {
    printf("FAIL a failed open left a handle\n");
    ++failures;
  }
  if (strstr(specrt_last_error(), argv[1]) == NULL) {
    printf("FAIL the message does not name the path: %s\n", specrt_last_error());
    ++failures;
  }
  expect("NULL path", specrt_open(NULL, NULL, &model), SPECRT_ERR_INVALID_ARGUMENT);
  expect("NULL out", specrt_open(argv[1], NULL, NULL), SPECRT_ERR_INVALID_ARGUMENT);

  specrt_open_options_init(&options);
  options.struct_size = 0; /* not initialized */
  expect("struct_size 0", specrt_open(argv[1], &options, &model), SPECRT_ERR_INVALID_ARGUMENT);
  specrt_open_options_init(&options);
  options.threads = -1;
  expect("threads -1", specrt_open(argv[1], &options, &model), SPECRT_ERR_INVALID_ARGUMENT);
  specrt_open_options_init(&options);
  options.draft = (specrt_draft)17;
  expect("draft 17", specrt_open(argv[1], &options, &model), SPECRT_ERR_INVALID_ARGUMENT);

  specrt_generate_params_init(&params);
  expect("generate on NULL", specrt_generate(NULL, prompt, 1, &params, out, 4, &n, NULL), SPECRT_ERR_INVALID_ARGUMENT);
  if (n != 0) {
    printf("FAIL n_out not cleared\n");
    ++failures;
  }
  specrt_close(NULL); /* ignored */
  if (strcmp(specrt_status_name(SPECRT_ERR_CONTEXT), "SPECRT_ERR_CONTEXT") != 0) {
    printf("FAIL status name\n");
    ++failures;
  }
  if (!failures) printf("ok\n");
  return failures;
}
