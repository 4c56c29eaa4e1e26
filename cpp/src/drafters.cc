#include "drafters.h"

#include <algorithm>

namespace specrt {

void NgramDrafter::propose(const std::vector<int64_t>& seq, int k, const SamplingConfig&, Rng&, Proposal& out) {
  out.tokens.clear();
  out.q.clear();
  out.calls = 0;
  int len = int(seq.size());
  k = std::min(k, max_);
  for (int n = std::min(n_max_, len - 1); n >= n_min_; --n) {
    const int64_t* pattern = seq.data() + len - n;
    for (int start = len - 1 - n; start >= 0; --start) {  // windows of seq[:-1], the latest first
      if (!std::equal(pattern, pattern + n, seq.data() + start)) continue;
      int from = start + n;
      out.tokens.assign(seq.begin() + from, seq.begin() + std::min(len, from + k));
      return;
    }
  }
}

ModelDrafter::ModelDrafter(Model& draft, Model* target, int window)
    : model_(draft), target_(target), window_(target ? 0 : window) {
  scratch_.order.assign(draft.vocab, 0);  // committed now (see Generator)
  scratch_.order.clear();
  scratch_.values.assign(draft.vocab, 0.0);
  scratch_.values.clear();
}

void ModelDrafter::reset() {
  model_.length = 0;
  offset_ = 0;
}

const float* ModelDrafter::feed(const int64_t* tokens, int n, int keep, Proposal& out) {
  int rows = 0;
  const float* logits = model_.run(tokens, n, model_.length, keep, &rows);
  model_.length += n;
  ++out.calls;
  return logits + size_t(rows - 1) * model_.vocab;  // the last position's row
}

int ModelDrafter::choose(const float* row, const SamplingConfig& cfg, Rng& rng, Proposal& out) {
  if (cfg.greedy()) return argmax(row, model_.vocab);
  int V = model_.vocab;
  size_t at = out.q.size();
  out.q.resize(at + V);  // capacity kept across rounds: no allocation once grown
  probs(row, V, cfg, out.q.data() + at, scratch_);
  return sample(out.q.data() + at, V, rng.uniform());
}

void ModelDrafter::propose(const std::vector<int64_t>& seq, int k, const SamplingConfig& cfg, Rng& rng, Proposal& out) {
  out.tokens.clear();
  out.q.clear();
  out.calls = 0;
  int n = int(seq.size());
  if (k <= 0) return;
  if (target_) {
    model_.length = n - 1;  // the committed rows are the target's (its length is n - 1 here)
  } else if (window_ > 0 && (n - offset_ - model_.length > window_ || n - offset_ + k > model_.capacity())) {
    model_.length = 0;  // read the window again: too much is missing, or this round would not fit
    offset_ = std::max(0, n - window_);
  }
  // feed the committed tokens the cache lacks (one normally; two after a round that kept every
  // proposal; many at a separate draft's first round); the last row gives the first proposal
  const float* row = nullptr;
  for (int from = offset_ + model_.length; from < n;) {
    int chunk = std::min(n - from, model_.max_prefill_t);
    row = feed(seq.data() + from, chunk, 1, out);
    from += chunk;
  }
  while (true) {
    int64_t t = choose(row, cfg, rng, out);
    out.tokens.push_back(t);
    if (int(out.tokens.size()) >= k) return;
    row = feed(&out.tokens.back(), 1, 0, out);
  }
}

void ModelDrafter::commit(int seq_len) {
  // rows hold seq[:n] + proposals[:k-1]; the valid prefix is the committed part
  model_.length = std::min(model_.length, seq_len - 1 - offset_);
}

}  // namespace specrt
