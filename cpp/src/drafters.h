// Drafters: what proposes the k tokens a target call verifies (runtime/drafters/). One drafter
// per open model, reset at each request; it holds which rows of the draft model's KV are valid.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model.h"
#include "sampling.h"

namespace specrt {

struct Proposal {
  std::vector<int64_t> tokens;  // [k'] the proposed continuation (k' may be 0)
  std::vector<double> q;        // [k', V] the distributions they were drawn from; empty = one-hot
  int calls = 0;                // draft model calls made
};

class Drafter {
 public:
  virtual ~Drafter() = default;
  virtual std::string name() const = 0;
  // A new request begins.
  virtual void reset() {}
  // At most k tokens continuing seq (the committed tokens), into `out` (cleared first). A sampled
  // request draws from rng; greedy ones take the argmax.
  virtual void propose(const std::vector<int64_t>& seq, int k, const SamplingConfig& cfg, Rng& rng, Proposal& out) = 0;
  // The committed sequence now has seq_len tokens: forget rows past what is still valid.
  virtual void commit(int seq_len) { (void)seq_len; }
};

// Prompt lookup: the continuation of the latest earlier match of the last n tokens (n from
// n_max down to n_min). Deterministic, so verification treats it as one-hot (exact).
class NgramDrafter : public Drafter {
 public:
  NgramDrafter(int max_proposal, int n_min = 1, int n_max = 4) : max_(max_proposal), n_min_(n_min), n_max_(n_max) {}
  std::string name() const override { return "ngram"; }
  void propose(const std::vector<int64_t>& seq, int k, const SamplingConfig& cfg, Rng& rng, Proposal& out) override;

 private:
  int max_, n_min_, n_max_;
};

// A draft model. Shared KV (a self-draft: a quantized copy of the target, same layout): its
// rows of committed tokens are the target's, taken by moving its length to the target's; it
// writes only rows at or past that length, which the verification call rewrites before reading
// them. Own KV (another model): it catches up on the committed tokens it lacks, in chunks, and
// reads at most the last `window` of them when more are missing (positions counted from there).
class ModelDrafter : public Drafter {
 public:
  // target: the target model when `draft` shares its KV buffers, else nullptr.
  ModelDrafter(Model& draft, Model* target, int window);
  std::string name() const override { return "model"; }
  void reset() override;
  void propose(const std::vector<int64_t>& seq, int k, const SamplingConfig& cfg, Rng& rng, Proposal& out) override;
  void commit(int seq_len) override;

 private:
  int choose(const float* row, const SamplingConfig& cfg, Rng& rng, Proposal& out);
  const float* feed(const int64_t* tokens, int n, int keep, Proposal& out);

  Model& model_;
  Model* target_;
  int window_;
  int offset_ = 0;  // the committed token at row 0 (> 0 once windowed)
  ProbScratch scratch_;
};

}  // namespace specrt
