// One request's speculation loop over the target model (runtime/engine/speculate.py, for one
// sequence):
//
//   prefill   the prompt in chunks of max_prefill_t, logits of each chunk's last row only;
//             the last one's row picks the first new token
//   round     propose  k' <= k tokens (the drafter; k' = 0 without one)
//             verify   one target call of [last, d0 .. dk'-1] -> k' + 1 rows -> (n_ok, next)
//             commit   keep d[:n_ok] + [next]; emit them up to a stop token / max_new_tokens /
//                      a cancel from the callback
//             rewind   the target's length back to n' - 1 (a pointer move: the rows past it are
//                      stale and the next call overwrites them); the drafter follows
//
// Greedy output is the target's own greedy output token for token: the draft only decides how
// many tokens one target call yields. Sampled output follows the target's distribution exactly.
#pragma once

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "drafters.h"
#include "model.h"
#include "policy.h"
#include "sampling.h"
#include "specrt.h"

namespace specrt {

struct GenerateRequest {
  std::vector<int64_t> prompt;    // >= 1 token; prompt + max_new_tokens fit the context (checked by the caller)
  int max_new_tokens = 128;
  SamplingConfig cfg;
  uint64_t seed = 0;
  std::vector<int64_t> stop_ids;  // sorted: a committed one ends the output, itself not kept
  int k = 0;                      // draft tokens per round (0: no drafting)
  Drafter* drafter = nullptr;     // nullptr: none
  AdaptiveK* policy = nullptr;    // chooses k (<= k) each round; nullptr: always k
  std::function<bool(int32_t)> on_token;  // returns false to stop after this token (may be empty)
};

class Generator {
 public:
  explicit Generator(Model& target);
  // Runs `req`; the new tokens land in `out` (cleared first; committed tokens stay there if a
  // call throws), counters and times in `stats`.
  void run(const GenerateRequest& req, std::vector<int32_t>& out, specrt_stats& stats);

 private:
  const float* target_call(const int64_t* tokens, int n, int keep, int* rows);
  int pick(const float* row);
  void prefill();
  void round();
  void propose(int k);
  std::pair<int, int> verify();
  void commit(int n_ok, int next);
  bool emit(const int64_t* tokens, int n);  // -> whether the request goes on

  Model& target_;
  const GenerateRequest* req_ = nullptr;
  std::vector<int32_t>* out_ = nullptr;
  specrt_stats* stats_ = nullptr;
  Rng rng_{0};
  double draft_ms_ = 0, verify_ms_ = 0;  // the round's
  std::vector<int64_t> seq_, call_, wide_;
  Proposal prop_;
  std::vector<double> p_, u_, residual_;
  ProbScratch scratch_;
};

}  // namespace specrt
