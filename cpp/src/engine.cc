#include "engine.h"

#include <algorithm>
#include <filesystem>

#include "error.h"
#include "kernels.h"
#include "packed.h"
#include "session.h"

namespace specrt {

namespace {
namespace fs = std::filesystem;

std::string path_in(const std::string& folder, const std::string& rel) { return (fs::path(folder) / rel).string(); }

bool self_draft(const Manifest& m) {
  const ModelEntry& d = *m.draft;
  return (d.recipe == "self-int8" || d.recipe == "self-int4") && d.io.hidden_in.empty() && d.kv == m.target.kv;
}

}  // namespace

Engine::Engine(const std::string& folder, const specrt_open_options& o) : folder_(folder), manifest_(load_manifest(folder)) {
  bool want_draft = settle(o);
  auto before = o.hugepages ? anonymous_pages() : std::set<uintptr_t>();
  config_.threads = o.threads;
  bool eagle = manifest_.draft && !manifest_.draft->io.hidden_in.empty();
  packed_ = o.packed != 0 && !eagle;  // the packed graphs, without an EAGLE pair (as the Python runtime)
  no_kernels_ = eagle ? "an EAGLE pair" : "packed 0";
  if (packed_) choose_kernels(o);
  target_kv_ = std::make_shared<KvCache>(manifest_.target.kv, context_);
  models_.push_back(build(manifest_.target, target_kv_, "target", true, target_graph_));
  if (want_draft) load_draft();
  ngram_ = std::make_unique<NgramDrafter>(max_k_);
  generator_ = std::make_unique<Generator>(*models_[0]);
  for (auto& m : models_) m->warm();
  if (o.hugepages) {  // what the load added, onto 2 MiB pages (runtime/bundle/hugepages.py)
    auto after = anonymous_pages();
    std::set<uintptr_t> added;
    std::set_difference(after.begin(), after.end(), before.begin(), before.end(), std::inserter(added, added.end()));
    collapse_pages(added);
  }
}

// The open's context, default drafter, k and stop ids, checked against the bundle -> whether the
// draft model is loaded.
bool Engine::settle(const specrt_open_options& o) {
  const ModelEntry& t = manifest_.target;
  int s_max = t.kv.max_seq_len;
  context_ = o.max_seq_len > 0 ? o.max_seq_len : s_max;
  if (context_ < t.max_tokens_per_call + 1 || context_ > s_max)
    fail(SPECRT_ERR_INVALID_ARGUMENT, "max_seq_len must be between " + std::to_string(t.max_tokens_per_call + 1) +
                                          " and the bundle's " + std::to_string(s_max) + ", got " + std::to_string(o.max_seq_len));
  max_k_ = t.max_tokens_per_call - 1;
  const auto& d = manifest_.draft;
  bool eagle = d && !d->io.hidden_in.empty();
  if (o.draft == SPECRT_DRAFT_MODEL && !d)
    fail(SPECRT_ERR_NO_DRAFT, "bundle " + folder_ + " has no draft model; use draft none or ngram");
  if (o.draft == SPECRT_DRAFT_MODEL && eagle)
    fail(SPECRT_ERR_UNSUPPORTED, "bundle " + folder_ + " has an EAGLE draft head, which this library does not run yet; "
                                 "use draft none or ngram");
  // DEFAULT: the bundle's draft model if it has one this library runs (an EAGLE head's bundle
  // decodes without one: the same output)
  bool want_draft = d && !eagle && (o.draft == SPECRT_DRAFT_MODEL || o.draft == SPECRT_DRAFT_DEFAULT);
  draft_ = o.draft == SPECRT_DRAFT_DEFAULT ? (want_draft ? SPECRT_DRAFT_MODEL : SPECRT_DRAFT_NONE) : o.draft;
  k_ = o.k >= 0 ? o.k : std::min(d && d->default_k > 0 ? d->default_k : kDefaultK, max_k_);
  if (k_ > max_k_)
    fail(SPECRT_ERR_INVALID_ARGUMENT, "k must be between 0 and " + std::to_string(max_k_) +
                                          " (the bundle's max_tokens_per_call - 1), got " + std::to_string(k_));
  for (int64_t id : manifest_.tokenizer.eog_token_ids) eog_.push_back(int32_t(id));
  adaptive_ = o.adaptive == 1;
  model_policy_ = AdaptiveK(max_k_);
  ngram_policy_ = AdaptiveK(max_k_);
  return want_draft;
}

void Engine::choose_kernels(const specrt_open_options& o) {
  no_kernels_ = "kernels 0";
  if (o.kernels == 0) return;
  std::string lib = find_kernels_library(o.kernels_library ? o.kernels_library : "");
  no_kernels_ = "specrt's kernel library was not found: run `make kernels`";
  if (lib.empty()) {
    if (o.kernels == 1)
      fail(SPECRT_ERR_UNSUPPORTED, "specrt's kernel library was not found (libspecrt_kernels.so beside libspecrt.so, "
                                   "or $SPECRT_KERNELS): run `make kernels`, or open with kernels 0");
    return;
  }
  std::string isa = kernels_isa(lib);
  no_kernels_ = "this CPU has no fast form of specrt's kernels";
  if (isa == "ref") {  // the portable form is the kernels' definition, far slower than onnxruntime's own
    if (o.kernels == 1)
      fail(SPECRT_ERR_UNSUPPORTED, "this CPU has no fast form of specrt's kernels (x86-64 with AVX2, FMA and F16C, "
                                   "AVX-512 VNNI or AMX; ARM64 NEON), which they need to run at speed; open with "
                                   "kernels 0 or -1 (onnxruntime's operators)");
    return;
  }
  kernels_ = lib;
}

// The entry's model over `kv`: its packed graph of one lane (on specrt's kernels where chosen)
// when the load packs and the bundle has one, else its graph. exact: a target (filler rows, but
// on a kernel graph that computes a lone row as any call does: none).
std::unique_ptr<Model> Engine::build(const ModelEntry& e, std::shared_ptr<KvCache> kv, const std::string& name,
                                     bool exact, std::string& graph) {
  const PackedGraph& p = e.packed;
  bool packs = packed_ && !p.graph.empty() && std::count(p.lanes.begin(), p.lanes.end(), 1);
  bool own = packs && !kernels_.empty() && !p.kernels.empty();
  if (!own && e.portable_missing())
    fail(SPECRT_ERR_UNSUPPORTED, "bundle " + folder_ + " holds only its " + name + "'s kernel graphs (exported with "
                                 "portable = false) and this open needs its portable graphs (" + no_kernels_ +
                                 "); add them with: python -m specrt.export.portable " + folder_);
  graph = !packs ? e.graph : own ? lanes_file(p.kernels, 1) : lanes_file(p.graph, 1);
  std::string path = path_in(folder_, graph);
  if (!fs::is_regular_file(path) || (own && !fs::is_regular_file(path_in(folder_, p.kernel_data))))
    fail(SPECRT_ERR_NOT_FOUND, "bundle " + folder_ + " is incomplete: " + name + " file " + graph + " (or its data) is missing");
  SessionConfig config = config_;
  if (own) config.kernels_library = kernels_;
  try {
    if (packs) return std::make_unique<PackedModel>(path, e, std::move(kv), config, name, exact && !(own && p.one_row));
    return std::make_unique<BundleModel>(path, e, std::move(kv), config, name);
  } catch (const Ort::Exception& x) {
    fail(SPECRT_ERR_BAD_BUNDLE, "cannot load the " + name + " graph " + path + ": " + std::string(x.what()).substr(0, 300));
  }
}

void Engine::load_draft() {
  const ModelEntry& d = *manifest_.draft;
  Model& target = *models_[0];
  bool shared = self_draft(manifest_);
  if (d.vocab_size != target.vocab)
    fail(SPECRT_ERR_UNSUPPORTED, "the draft's vocabulary (" + std::to_string(d.vocab_size) + ") is not the target's (" +
                                     std::to_string(target.vocab) + "); use draft none or ngram");
  auto kv = shared ? target_kv_ : std::make_shared<KvCache>(d.kv, std::min(context_, d.kv.max_seq_len));
  models_.push_back(build(d, kv, "draft", false, draft_graph_));
  model_drafter_ = std::make_unique<ModelDrafter>(*models_[1], shared ? &target : nullptr, kDefaultDraftWindow);
}

Drafter* Engine::drafter_for(specrt_draft draft) {
  switch (draft == SPECRT_DRAFT_DEFAULT ? draft_ : draft) {
    case SPECRT_DRAFT_MODEL:
      if (!model_drafter_) fail(SPECRT_ERR_NO_DRAFT, "the draft model is not loaded (the bundle has none, or it was "
                                                     "opened with draft none/ngram): use draft none or ngram");
      return model_drafter_.get();
    case SPECRT_DRAFT_NGRAM:
      return ngram_.get();
    default:
      return nullptr;
  }
}

GenerateRequest Engine::request(const int32_t* prompt, size_t n_prompt, const specrt_generate_params& p) {
  const ModelEntry& t = manifest_.target;
  auto bad = [](const std::string& m) { fail(SPECRT_ERR_INVALID_ARGUMENT, m); };
  if (n_prompt == 0) bad("empty prompt");
  for (size_t i = 0; i < n_prompt; ++i)
    if (prompt[i] < 0 || prompt[i] >= t.vocab_size)
      bad("prompt token " + std::to_string(prompt[i]) + " at " + std::to_string(i) + " is outside the vocabulary [0, " +
          std::to_string(t.vocab_size) + ")");
  if (p.k > max_k_) bad("k must be between 0 and " + std::to_string(max_k_) + ", got " + std::to_string(p.k));
  if (n_prompt + size_t(p.max_new_tokens) > size_t(context_))
    fail(SPECRT_ERR_CONTEXT, "prompt (" + std::to_string(n_prompt) + " tokens) + max_new_tokens (" +
                                 std::to_string(p.max_new_tokens) + ") exceeds the context of " + std::to_string(context_) +
                                 " tokens; shorten the prompt or lower max_new_tokens to at most " +
                                 std::to_string(std::max<int64_t>(0, int64_t(context_) - int64_t(n_prompt))));
  GenerateRequest r;
  r.prompt.assign(prompt, prompt + n_prompt);
  r.max_new_tokens = p.max_new_tokens;
  r.cfg = SamplingConfig{p.temperature, p.top_k, p.top_p};
  r.seed = p.seed;
  if (!p.ignore_eos) r.stop_ids.assign(eog_.begin(), eog_.end());
  r.stop_ids.insert(r.stop_ids.end(), p.stop_ids, p.stop_ids + p.n_stop_ids);
  std::sort(r.stop_ids.begin(), r.stop_ids.end());
  r.drafter = drafter_for(p.draft);
  r.k = r.drafter ? (p.k >= 0 ? p.k : k_) : 0;
  if (r.drafter && (p.adaptive == 1 || (p.adaptive == -1 && adaptive_)))
    r.policy = r.drafter == ngram_.get() ? &ngram_policy_ : &model_policy_;
  if (p.on_token) {
    auto cb = p.on_token;
    void* user = p.user_data;
    r.on_token = [cb, user](int32_t token) { return cb(user, token) == 0; };
  }
  return r;
}

void Engine::generate(const int32_t* prompt, size_t n_prompt, const specrt_generate_params& params,
                      std::vector<int32_t>& out, specrt_stats& stats) {
  std::lock_guard<std::mutex> lock(mutex_);
  out.clear();
  GenerateRequest r = request(prompt, n_prompt, params);
  generator_->run(r, out, stats);
}

void Engine::info(specrt_model_info& out) const {
  out.vocab_size = manifest_.target.vocab_size;
  out.max_seq_len = context_;
  out.max_k = max_k_;
  out.k = k_;
  out.draft = draft_;
  out.has_draft_model = model_drafter_ != nullptr;
  out.eog_ids = eog_.data();
  out.n_eog_ids = eog_.size();
  out.target_graph = target_graph_.c_str();
  out.draft_graph = draft_graph_.c_str();
}

}  // namespace specrt
