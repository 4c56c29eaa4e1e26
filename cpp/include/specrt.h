/*
 * specrt.h - run a specrt bundle's speculative decoding from C, C++ or anything that binds C.
 *
 * A bundle (docs/bundle.md) is opened once: its target model, and its draft model when it has
 * one and the options want it, become onnxruntime sessions over KV buffers allocated at open and
 * bound as both past input and present output. A generation then runs
 * propose -> verify -> commit -> rewind rounds over token ids, one request at a time per handle:
 * greedy output is the target's own greedy output token for token whatever drafts; sampled
 * output follows the target's distribution exactly (speculative rejection sampling).
 *
 * Conventions
 *  - Every function that can fail returns a specrt_status; SPECRT_OK is 0. It never aborts and
 *    never throws. The message of the calling thread's last failure is specrt_last_error().
 *  - Option and parameter structs start with `struct_size`: fill them with the matching
 *    *_init function first (it sets the size and every default), then change fields. A library
 *    of a later minor version reads only the fields the caller's struct_size covers.
 *  - Token ids are int32_t. Times are milliseconds (double). Strings are UTF-8, NUL-terminated.
 *  - A handle may be used from any thread; calls on one handle run one at a time (a second
 *    specrt_generate waits for the first).
 *
 * Versioning: SPECRT_API_VERSION grows when functions or struct fields are added (old callers
 * keep working); a change that breaks callers would change SPECRT_ABI (the .so's soname).
 */
#ifndef SPECRT_H
#define SPECRT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define SPECRT_EXPORT __declspec(dllexport)
#else
#define SPECRT_EXPORT __attribute__((visibility("default")))
#endif

#define SPECRT_API_VERSION 1
#define SPECRT_ABI 1

typedef enum specrt_status {
  SPECRT_OK = 0,
  SPECRT_ERR_INVALID_ARGUMENT = 1, /* a NULL pointer, a value out of range, a struct_size unknown */
  SPECRT_ERR_NOT_FOUND = 2,        /* the bundle folder, its specrt.json or a file it names is missing */
  SPECRT_ERR_BAD_BUNDLE = 3,       /* specrt.json corrupt, a graph onnxruntime cannot load, a field missing */
  SPECRT_ERR_SCHEMA_VERSION = 4,   /* the bundle's schema_version is not one this library reads */
  SPECRT_ERR_CONTEXT = 5,          /* prompt + max_new_tokens exceed the context (max_seq_len) */
  SPECRT_ERR_UNSUPPORTED = 6,      /* the bundle or this CPU asks for what this library cannot run */
  SPECRT_ERR_NO_DRAFT = 7,         /* draft "model" asked of a bundle (or an open) without a draft model */
  SPECRT_ERR_RUNTIME = 8,          /* onnxruntime failed, or a model produced NaN / inf logits */
  SPECRT_ERR_NO_MEMORY = 9,        /* an allocation failed */
  SPECRT_ERR_INTERNAL = 10         /* a bug: please report it with the message */
} specrt_status;

typedef enum specrt_draft {
  SPECRT_DRAFT_DEFAULT = 0, /* open: the bundle's draft model if it has one, else none;
                               generate: what the open chose */
  SPECRT_DRAFT_MODEL = 1,   /* the bundle's draft model */
  SPECRT_DRAFT_NGRAM = 2,   /* prompt lookup: continue the latest earlier match of the last 1-4 tokens */
  SPECRT_DRAFT_NONE = 3     /* no speculation: one target call per token */
} specrt_draft;

typedef enum specrt_stop_reason {
  SPECRT_STOP_LENGTH = 0,   /* max_new_tokens reached */
  SPECRT_STOP_EOS = 1,      /* a stop token (the bundle's end-of-generation ids or stop_ids); not kept */
  SPECRT_STOP_CANCELLED = 2 /* the token callback returned nonzero */
} specrt_stop_reason;

typedef struct specrt_model specrt_model; /* an open bundle: sessions, KV buffers, options */

/* ---- version and errors ---------------------------------------------------------------- */

/* The library's version, e.g. "0.1.0" (static string). */
SPECRT_EXPORT const char *specrt_version(void);
/* SPECRT_API_VERSION of the library (compare with the header's at run time). */
SPECRT_EXPORT int specrt_api_version(void);
/* The message of this thread's last failed call ("" if none); valid until this thread's next
   call into the library. */
SPECRT_EXPORT const char *specrt_last_error(void);
/* A status's name, e.g. "SPECRT_ERR_NOT_FOUND" (static string). */
SPECRT_EXPORT const char *specrt_status_name(specrt_status status);

/* ---- open / close ---------------------------------------------------------------------- */

typedef struct specrt_open_options {
  size_t struct_size;
  int threads;        /* onnxruntime intra-op threads per session; 0: every core */
  specrt_draft draft; /* which drafter requests use by default; MODEL or DEFAULT loads the draft model */
  int k;              /* draft tokens per round (the ceiling with adaptive); -1: the bundle's
                         default_k, else 4 */
  int adaptive;       /* 1: choose k each round (0 .. k) from the acceptance and call times this
                         handle measures; 0: always k (default) */
  int max_seq_len;    /* context: KV rows allocated; 0: the bundle's max_seq_len */
  int hugepages;      /* move the sessions' memory onto 2 MiB pages after loading (Linux >= 6.1) */
  int packed;         /* 1: the entries' packed graphs where the bundle has them (as the Python runtime
                         does by default); 0: their plain graphs */
  int kernels;        /* the packed graphs on specrt's own operators where the bundle has them:
                         -1: when the kernel library is found and this CPU runs its fast form
                         (AVX-512 VNNI or AMX); 1: required (else SPECRT_ERR_UNSUPPORTED); 0: never */
  const char *kernels_library; /* libspecrt_kernels.so; NULL: $SPECRT_KERNELS, else the one beside
                                  libspecrt.so */
} specrt_open_options;

SPECRT_EXPORT void specrt_open_options_init(specrt_open_options *options);

/* Opens the bundle folder `path`. options NULL: the defaults. On success *out is a handle the
   caller closes with specrt_close; on failure *out is NULL. */
SPECRT_EXPORT specrt_status specrt_open(const char *path, const specrt_open_options *options, specrt_model **out);
/* Frees everything the handle holds. NULL is ignored. */
SPECRT_EXPORT void specrt_close(specrt_model *model);

/* What an open bundle is (read-only facts). */
typedef struct specrt_model_info {
  size_t struct_size;
  int vocab_size;      /* V */
  int max_seq_len;     /* the context loaded: prompt + max_new_tokens must fit */
  int max_k;           /* the widest k: the bundle's max_tokens_per_call - 1 */
  int k;               /* the k requests use by default */
  specrt_draft draft;  /* the drafter requests use by default (never DEFAULT) */
  int has_draft_model; /* the draft model was loaded */
  const int32_t *eog_ids; /* the bundle's end-of-generation token ids (owned by the handle) */
  size_t n_eog_ids;
  const char *target_graph; /* the graph file the target runs, relative to the bundle (owned by the handle) */
  const char *draft_graph;  /* the draft model's ("" when not loaded) */
} specrt_model_info;

SPECRT_EXPORT void specrt_model_info_init(specrt_model_info *info);
SPECRT_EXPORT specrt_status specrt_model_get_info(const specrt_model *model, specrt_model_info *info);

/* ---- generate -------------------------------------------------------------------------- */

/* Called once per committed token, in order. Return 0 to go on, nonzero to stop after this
   token (it stays in the output; stop_reason SPECRT_STOP_CANCELLED). */
typedef int (*specrt_token_callback)(void *user_data, int32_t token);

typedef struct specrt_generate_params {
  size_t struct_size;
  int max_new_tokens;      /* >= 1 (default 128) */
  float temperature;       /* 0: greedy (default); > 0: sampled */
  float top_p;             /* (0, 1]; 1: off */
  int top_k;               /* >= 0; 0: off */
  uint64_t seed;           /* the random stream of a sampled request (same seed, same output) */
  const int32_t *stop_ids; /* more stop tokens, besides the bundle's end-of-generation ids */
  size_t n_stop_ids;
  int ignore_eos;          /* nonzero: the bundle's end-of-generation ids do not stop (stop_ids still do) */
  specrt_draft draft;      /* DEFAULT: the open's drafter */
  int k;                   /* -1: the open's k; 0 .. max_k */
  int adaptive;            /* -1: the open's; 0: fixed k; 1: adaptive (k the ceiling) */
  specrt_token_callback on_token; /* NULL: none */
  void *user_data;
} specrt_generate_params;

SPECRT_EXPORT void specrt_generate_params_init(specrt_generate_params *params);

typedef struct specrt_stats {
  size_t struct_size;
  int prompt_tokens;
  int new_tokens;          /* tokens in the output */
  int rounds;              /* target calls after the prompt's (each commits >= 1 token) */
  int drafted;             /* draft tokens proposed */
  int accepted;            /* draft tokens the target kept */
  int target_calls;
  int draft_calls;
  double prefill_ms;       /* the prompt, to the first token */
  double draft_ms;         /* proposing (draft model calls, n-gram lookups) */
  double verify_ms;        /* target calls after the prompt, with verification */
  double total_ms;
  specrt_stop_reason stop_reason;
} specrt_stats;

SPECRT_EXPORT void specrt_stats_init(specrt_stats *stats);

/* Generates from `prompt` (n_prompt >= 1 token ids). The new tokens go to out_tokens
   (out_capacity >= params->max_new_tokens) and their count to *n_out; stats (may be NULL) is
   filled. params NULL: the defaults. Cancelling through the callback is not a failure: the
   tokens so far are the output. On failure *n_out holds the tokens committed before it. */
SPECRT_EXPORT specrt_status specrt_generate(specrt_model *model, const int32_t *prompt, size_t n_prompt,
                                            const specrt_generate_params *params, int32_t *out_tokens,
                                            size_t out_capacity, size_t *n_out, specrt_stats *stats);

/* ---- text: the bundle's tokenizer.json ----------------------------------------------------
   Byte-level BPE tokenizers (GPT-2, Qwen2 and Llama-3 styles), as Hugging Face tokenizers
   encodes and decodes them. Other kinds are refused with SPECRT_ERR_UNSUPPORTED at open: give
   token ids instead. Chat templates stay with the caller: render the template (specrt.json's
   tokenizer.chat_template, Jinja) and tokenize the result with PARSE_SPECIAL. A tokenizer is
   independent of any model handle; it may be used from any thread. */

typedef struct specrt_tokenizer specrt_tokenizer;

/* path: a bundle folder (its specrt.json names the file) or a tokenizer.json. */
SPECRT_EXPORT specrt_status specrt_tokenizer_open(const char *path, specrt_tokenizer **out);
SPECRT_EXPORT void specrt_tokenizer_close(specrt_tokenizer *tokenizer);

#define SPECRT_TOKENIZE_PARSE_SPECIAL 1 /* added tokens written in the text become their ids (a
                                           rendered chat template's <|im_start|> ...); without it
                                           the text stays text */
#define SPECRT_TOKENIZE_ADD_SPECIAL 2   /* the tokenizer's post-processor tokens (e.g. Llama-3's BOS) */

/* text (text_len bytes of UTF-8) -> token ids. *n_out is the number of ids; they are written
   when out_capacity holds them, else SPECRT_ERR_INVALID_ARGUMENT (call again with a larger
   buffer; out_ids may be NULL to ask for the count). */
SPECRT_EXPORT specrt_status specrt_tokenize(specrt_tokenizer *tokenizer, const char *text, size_t text_len, int flags,
                                            int32_t *out_ids, size_t out_capacity, size_t *n_out);
/* token ids -> UTF-8 text, NUL-terminated. skip_special: leave out special tokens. *n_out is the
   text's length in bytes (without the NUL); written when out_capacity > *n_out, else
   SPECRT_ERR_INVALID_ARGUMENT. Bytes that are not valid UTF-8 (a character cut between byte
   tokens) read as U+FFFD. */
SPECRT_EXPORT specrt_status specrt_detokenize(specrt_tokenizer *tokenizer, const int32_t *ids, size_t n_ids,
                                              int skip_special, char *out_text, size_t out_capacity, size_t *n_out);

/* A streaming decoder: push each committed chunk of ids, get the text they complete (never half a
   character: a character cut between byte tokens waits for the next ids). It uses its tokenizer,
   which must outlive it. */
typedef struct specrt_decoder specrt_decoder;
SPECRT_EXPORT specrt_status specrt_decoder_new(specrt_tokenizer *tokenizer, int skip_special, specrt_decoder **out);
/* *text (NUL-terminated, *text_len bytes) is valid until the next call on this decoder. */
SPECRT_EXPORT specrt_status specrt_decoder_push(specrt_decoder *decoder, const int32_t *ids, size_t n_ids,
                                                const char **text, size_t *text_len);
/* What is still held back (an incomplete character reads as U+FFFD); the decoder starts over. */
SPECRT_EXPORT specrt_status specrt_decoder_flush(specrt_decoder *decoder, const char **text, size_t *text_len);
SPECRT_EXPORT void specrt_decoder_free(specrt_decoder *decoder);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* SPECRT_H */
