// An open bundle (runtime/bundle/loader.py, for one sequence): the manifest, the target model,
// the draft model when the bundle has one and the options want it (on the target's KV buffers
// for a self-draft, on its own otherwise), the drafters, and the loop that runs a request.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "drafters.h"
#include "generator.h"
#include "manifest.h"
#include "model.h"
#include "specrt.h"

namespace specrt {

constexpr int kDefaultK = 4;            // when neither the options nor the bundle say
constexpr int kDefaultDraftWindow = 256;  // a separate draft reads at most this much (runtime/options.py)

class Engine {
 public:
  // options: already checked for ranges that need no bundle (c_api.cc). Throws Error.
  Engine(const std::string& folder, const specrt_open_options& options);

  // Checks `params` and the prompt against this bundle, then runs the request (one at a time:
  // a second caller waits). Throws Error; `out` keeps the tokens committed before a failure.
  void generate(const int32_t* prompt, size_t n_prompt, const specrt_generate_params& params, std::vector<int32_t>& out,
                specrt_stats& stats);

  void info(specrt_model_info& out) const;


 private:
  bool settle(const specrt_open_options& o);
  void choose_kernels(const specrt_open_options& o);
  std::unique_ptr<Model> build(const ModelEntry& entry, std::shared_ptr<KvCache> kv, const std::string& name,
                               bool exact, std::string& graph);
  void load_draft();
  Drafter* drafter_for(specrt_draft draft);
  GenerateRequest request(const int32_t* prompt, size_t n_prompt, const specrt_generate_params& params);

  std::string folder_;
  Manifest manifest_;
  SessionConfig config_;
  bool packed_ = false;
  std::string kernels_;  // the kernel library the packed kernel graphs register ("": none)
  std::string no_kernels_;  // why kernels_ is "" (for a bundle that holds only its kernel graphs)
  std::string target_graph_, draft_graph_;
  int context_ = 0;  // KV rows per sequence (the open's max_seq_len)
  int max_k_ = 0, k_ = 0;
  specrt_draft draft_ = SPECRT_DRAFT_NONE;
  std::vector<int32_t> eog_;
  std::shared_ptr<KvCache> target_kv_;         // a self-draft's too
  std::vector<std::unique_ptr<Model>> models_;  // target first
  std::unique_ptr<ModelDrafter> model_drafter_;
  std::unique_ptr<NgramDrafter> ngram_;
  bool adaptive_ = false;
  AdaptiveK model_policy_{0}, ngram_policy_{0};  // adaptive k per drafter: what earlier requests taught
  std::unique_ptr<Generator> generator_;
  std::mutex mutex_;

};

}  // namespace specrt
