#include "policy.h"

#include <algorithm>

namespace specrt {

namespace {
constexpr double kPriorAccept = 0.7;  // before anything is measured
constexpr double kDecay = 0.9;        // per observation: about the last ten rounds count
constexpr double kTimeDecay = 0.8;
constexpr double kWidthCost = 0.1;    // an unseen width: +10% of a one-token call per token
constexpr int kProbeEvery = 8;

constexpr double kShrink = 2.0;       // observations a position needs to count as much as its prior

double ema(double old, double now, double decay) { return old > 0 ? decay * old + (1 - decay) * now : now; }
}  // namespace

AdaptiveK::AdaptiveK(int max_k)
    : accept_(std::max(max_k, 0), kPriorAccept), seen_(std::max(max_k, 0), 0.0), call_ms_(max_k + 2, 0.0) {}

double AdaptiveK::rate(int j) const {
  double prior = j == 0 ? kPriorAccept : rate(j - 1);
  return (seen_[j] * accept_[j] + kShrink * prior) / (seen_[j] + kShrink);
}

double AdaptiveK::verify_ms(int T) const {
  if (call_ms_[T] > 0) return call_ms_[T];
  // the nearest width measured, scaled by the prior slope (in one-token calls)
  for (int d = 1; d < int(call_ms_.size()); ++d) {
    for (int t : {T - d, T + d}) {
      if (t >= 1 && t < int(call_ms_.size()) && call_ms_[t] > 0)
        return call_ms_[t] * (1 + kWidthCost * (T - 1)) / (1 + kWidthCost * (t - 1));
    }
  }
  return 1 + kWidthCost * (T - 1);  // nothing measured: in units of a one-token call
}

int AdaptiveK::choose(int cap) {
  cap = std::min(cap, int(accept_.size()));
  if (cap <= 0) return 0;
  double draft = draft_ms_ > 0 ? draft_ms_ : 0.25 * verify_ms(1);  // unmeasured: a quarter of a target step
  int best = 0;
  double best_rate = 1.0 / verify_ms(1), expected = 1.0, reach = 1.0;
  for (int k = 1; k <= cap; ++k) {
    reach *= rate(k - 1);
    expected += reach;
    double rate = expected / (k * draft + verify_ms(k + 1));
    if (rate > best_rate) best_rate = rate, best = k;
  }
  if (best == 0 && ++plain_ >= kProbeEvery) {
    plain_ = 0;
    return 1;  // a probe: is drafting worth it again?
  }
  return best;
}

void AdaptiveK::observe(int k, int n_ok, double draft_ms, double verify_ms) {
  if (k + 1 < int(call_ms_.size())) call_ms_[k + 1] = ema(call_ms_[k + 1], verify_ms, kTimeDecay);
  if (k == 0) return;
  plain_ = 0;
  draft_ms_ = ema(draft_ms_, draft_ms / k, kTimeDecay);
  for (int j = 0; j <= std::min(n_ok, k - 1); ++j) {  // proposals 0 .. n_ok were reached
    double ok = j < n_ok ? 1.0 : 0.0;
    accept_[j] = seen_[j] > 0 ? kDecay * accept_[j] + (1 - kDecay) * ok : ok;
    seen_[j] = kDecay * seen_[j] + 1;
  }
}

}  // namespace specrt
