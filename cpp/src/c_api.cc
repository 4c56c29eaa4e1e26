// The C API (include/specrt.h) over Engine: every entry point checks its arguments, runs inside
// `guard`, which turns any exception into a status and this thread's last-error message.
#include <cmath>
#include <algorithm>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "api_guard.h"
#include "engine.h"
#include "error.h"
#include "specrt.h"

struct specrt_model {
  specrt::Engine engine;
};


using specrt::guard;

namespace {

// The caller's struct read over our defaults: only the bytes its struct_size covers (a caller
// built against an older header has a smaller struct). Larger than ours: a newer header.
template <typename S>
void read_struct(const S* given, S& into, const char* what) {
  if (!given) return;
  if (given->struct_size < sizeof(size_t) || given->struct_size > sizeof(S))
    specrt::fail(SPECRT_ERR_INVALID_ARGUMENT, std::string(what) + ".struct_size is " + std::to_string(given->struct_size) +
                                                  " (this library knows " + std::to_string(sizeof(S)) +
                                                  "): call " + what + "_init first");
  std::memcpy(static_cast<void*>(&into), given, given->struct_size);
  into.struct_size = sizeof(S);
}

void check_open(const specrt_open_options& o) {
  auto bad = [](const std::string& m) { specrt::fail(SPECRT_ERR_INVALID_ARGUMENT, m); };
  if (o.threads < 0) bad("threads must be >= 0 (0: every core), got " + std::to_string(o.threads));
  if (o.draft < SPECRT_DRAFT_DEFAULT || o.draft > SPECRT_DRAFT_NONE) bad("draft is not a specrt_draft value");
  if (o.k < -1) bad("k must be >= 0, or -1 for the bundle's default, got " + std::to_string(o.k));
  if (o.max_seq_len < 0) bad("max_seq_len must be >= 0 (0: the bundle's), got " + std::to_string(o.max_seq_len));
  if (o.adaptive < 0 || o.adaptive > 1) bad("adaptive must be 0 or 1, got " + std::to_string(o.adaptive));
  if (o.kernels < -1 || o.kernels > 1) bad("kernels must be -1 (auto), 0 or 1, got " + std::to_string(o.kernels));
}

void check_params(const specrt_generate_params& p) {
  auto bad = [](const std::string& m) { specrt::fail(SPECRT_ERR_INVALID_ARGUMENT, m); };
  if (p.max_new_tokens < 1) bad("max_new_tokens must be >= 1, got " + std::to_string(p.max_new_tokens));
  if (!std::isfinite(p.temperature) || p.temperature < 0)
    bad("temperature must be >= 0 (0 = greedy), got " + std::to_string(p.temperature));
  if (!(p.top_p > 0 && p.top_p <= 1)) bad("top_p must be in (0, 1], got " + std::to_string(p.top_p));
  if (p.top_k < 0) bad("top_k must be >= 0 (0 = off), got " + std::to_string(p.top_k));
  if (p.k < -1) bad("k must be >= 0, or -1 for the open's k, got " + std::to_string(p.k));
  if (p.adaptive < -1 || p.adaptive > 1) bad("adaptive must be -1 (the open's), 0 or 1, got " + std::to_string(p.adaptive));
  if (p.draft < SPECRT_DRAFT_DEFAULT || p.draft > SPECRT_DRAFT_NONE) bad("draft is not a specrt_draft value");
  if (p.n_stop_ids && !p.stop_ids) bad("stop_ids is NULL but n_stop_ids is " + std::to_string(p.n_stop_ids));
}

}  // namespace

extern "C" {

const char* specrt_version(void) { return "0.1.0"; }
int specrt_api_version(void) { return SPECRT_API_VERSION; }
const char* specrt_last_error(void) { return specrt::last_error().c_str(); }

const char* specrt_status_name(specrt_status status) {
  switch (status) {
    case SPECRT_OK: return "SPECRT_OK";
    case SPECRT_ERR_INVALID_ARGUMENT: return "SPECRT_ERR_INVALID_ARGUMENT";
    case SPECRT_ERR_NOT_FOUND: return "SPECRT_ERR_NOT_FOUND";
    case SPECRT_ERR_BAD_BUNDLE: return "SPECRT_ERR_BAD_BUNDLE";
    case SPECRT_ERR_SCHEMA_VERSION: return "SPECRT_ERR_SCHEMA_VERSION";
    case SPECRT_ERR_CONTEXT: return "SPECRT_ERR_CONTEXT";
    case SPECRT_ERR_UNSUPPORTED: return "SPECRT_ERR_UNSUPPORTED";
    case SPECRT_ERR_NO_DRAFT: return "SPECRT_ERR_NO_DRAFT";
    case SPECRT_ERR_RUNTIME: return "SPECRT_ERR_RUNTIME";
    case SPECRT_ERR_NO_MEMORY: return "SPECRT_ERR_NO_MEMORY";
    case SPECRT_ERR_INTERNAL: return "SPECRT_ERR_INTERNAL";
  }
  return "SPECRT_ERR_UNKNOWN";
}

void specrt_open_options_init(specrt_open_options* o) {
  if (!o) return;
  *o = specrt_open_options{};
  o->struct_size = sizeof(*o);
  o->threads = 0;
  o->draft = SPECRT_DRAFT_DEFAULT;
  o->k = -1;
  o->adaptive = 0;
  o->max_seq_len = 0;
  o->hugepages = 1;
  o->packed = 1;
  o->kernels = -1;
  o->kernels_library = nullptr;
}

void specrt_generate_params_init(specrt_generate_params* p) {
  if (!p) return;
  *p = specrt_generate_params{};
  p->struct_size = sizeof(*p);
  p->max_new_tokens = 128;
  p->temperature = 0.0f;
  p->top_p = 1.0f;
  p->top_k = 0;
  p->draft = SPECRT_DRAFT_DEFAULT;
  p->k = -1;
  p->adaptive = -1;
}

void specrt_stats_init(specrt_stats* s) {
  if (!s) return;
  *s = specrt_stats{};
  s->struct_size = sizeof(*s);
}

void specrt_model_info_init(specrt_model_info* i) {
  if (!i) return;
  *i = specrt_model_info{};
  i->struct_size = sizeof(*i);
}

specrt_status specrt_open(const char* path, const specrt_open_options* options, specrt_model** out) {
  return guard([&] {
    if (!out) specrt::fail(SPECRT_ERR_INVALID_ARGUMENT, "out is NULL");
    *out = nullptr;
    if (!path) specrt::fail(SPECRT_ERR_INVALID_ARGUMENT, "path is NULL");
    specrt_open_options o;
    specrt_open_options_init(&o);
    read_struct(options, o, "specrt_open_options");
    check_open(o);
    *out = new specrt_model{specrt::Engine(path, o)};
  });
}

void specrt_close(specrt_model* model) { delete model; }

specrt_status specrt_model_get_info(const specrt_model* model, specrt_model_info* info) {
  return guard([&] {
    if (!model || !info) specrt::fail(SPECRT_ERR_INVALID_ARGUMENT, "model or info is NULL");
    specrt_model_info i;
    specrt_model_info_init(&i);
    read_struct(info, i, "specrt_model_info");
    model->engine.info(i);
    std::memcpy(static_cast<void*>(info), &i, info->struct_size);
  });
}

specrt_status specrt_generate(specrt_model* model, const int32_t* prompt, size_t n_prompt,
                              const specrt_generate_params* params, int32_t* out_tokens, size_t out_capacity,
                              size_t* n_out, specrt_stats* stats) {
  if (n_out) *n_out = 0;
  specrt_stats s;
  specrt_stats_init(&s);
  std::vector<int32_t> tokens;
  specrt_status status = guard([&] {
    if (!model || !out_tokens || !n_out) specrt::fail(SPECRT_ERR_INVALID_ARGUMENT, "model, out_tokens or n_out is NULL");
    if (!prompt && n_prompt) specrt::fail(SPECRT_ERR_INVALID_ARGUMENT, "prompt is NULL");
    if (stats && (stats->struct_size < sizeof(size_t) || stats->struct_size > sizeof(s)))
      specrt::fail(SPECRT_ERR_INVALID_ARGUMENT, "specrt_stats.struct_size is " + std::to_string(stats->struct_size) +
                                                    ": call specrt_stats_init first");
    specrt_generate_params p;
    specrt_generate_params_init(&p);
    read_struct(params, p, "specrt_generate_params");
    check_params(p);
    if (out_capacity < size_t(p.max_new_tokens))
      specrt::fail(SPECRT_ERR_INVALID_ARGUMENT, "out_capacity (" + std::to_string(out_capacity) +
                                                    ") is smaller than max_new_tokens (" + std::to_string(p.max_new_tokens) + ")");
    model->engine.generate(prompt, n_prompt, p, tokens, s);
  });
  if (out_tokens && n_out) {
    size_t n = std::min(tokens.size(), out_capacity);
    std::copy(tokens.begin(), tokens.begin() + n, out_tokens);
    *n_out = n;
  }
  if (stats && stats->struct_size >= sizeof(size_t) && stats->struct_size <= sizeof(s))
    std::memcpy(static_cast<void*>(stats), &s, stats->struct_size);
  return status;
}

}  // extern "C"
