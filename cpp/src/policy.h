// Adaptive k: how many tokens to draft each round, from what this handle has measured
// (runtime/policy/adaptive.py's rule, without its confidence early stop and cost probe).
//
//   a_j   = P(proposal j accepted | proposal j reached), decayed so it follows the text; a
//           position seldom reached leans on the one before it (acceptance falls slowly with
//           position), so a k that was never tried can still be chosen
//   E(k)  = 1 + sum_{j<k} prod_{i<=j} a_i          tokens a round of k proposals yields
//   R(k)  = E(k) / (k * draft_ms + verify_ms(k+1))  tokens per ms
//   k     = argmax R(k) over 0 .. the request's k (0: a plain target step), with a probe round
//           of one proposal after every kProbeEvery plain rounds, so a workload that turns
//           predictable is noticed.
// Call times are followed online (EMA per call width; widths not seen yet are estimated from the
// nearest seen one). The choice changes only how many tokens a target call yields: greedy
// output stays the target's own, sampled output its distribution.
#pragma once

#include <vector>

namespace specrt {

class AdaptiveK {
 public:
  explicit AdaptiveK(int max_k);
  // k for the next round, at most `cap`.
  int choose(int cap);
  // A round proposed k tokens and kept n_ok of them; draft_ms (all its draft calls) and
  // verify_ms (its target call of k + 1 tokens) as measured.
  void observe(int k, int n_ok, double draft_ms, double verify_ms);

 private:
  double verify_ms(int T) const;

  double rate(int j) const;      // a_j, shrunk toward a_{j-1} while position j has few observations

  std::vector<double> accept_;   // measured a_j, j = 0 .. max_k - 1
  std::vector<double> seen_;     // decayed count of rounds that reached position j
  std::vector<double> call_ms_;  // target call of T tokens (index T), 0: not seen
  double draft_ms_ = 0.0;        // one draft step (0: not seen)
  int plain_ = 0;                // plain rounds since the last drafting one
};

}  // namespace specrt
