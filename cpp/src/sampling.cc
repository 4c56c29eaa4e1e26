#include "sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "error.h"

namespace specrt {

namespace {
uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}
uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

[[noreturn]] void non_finite() {
  fail(SPECRT_ERR_RUNTIME, "the model produced non-finite logits (NaN/inf): the model or its export is broken");
}

// Nucleus filter in place on p [V] (normalized). The nucleus is almost always inside the `head`
// most probable tokens, so those are sorted first; a full sort is the fallback. Same result
// either way (order: -p, then index).
void top_p_filter(double* p, int V, double top_p, ProbScratch& s) {
  auto before = [&](int a, int b) { return p[a] > p[b] || (p[a] == p[b] && a < b); };
  s.order.resize(V);
  std::iota(s.order.begin(), s.order.end(), 0);
  int head = std::min(V, 256), kept = -1;
  for (int width : {head, V}) {
    if (width < V) {
      std::nth_element(s.order.begin(), s.order.begin() + width - 1, s.order.end(), before);
      std::sort(s.order.begin(), s.order.begin() + width, before);
    } else {
      std::sort(s.order.begin(), s.order.end(), before);
    }
    double cum = 0.0;
    int last = -1;
    for (int i = 0; i < width && cum < top_p; ++i) {
      last = i;
      cum += p[s.order[i]];
    }
    // decided inside the head iff the nucleus ends before its last token and no token outside
    // it ties with the boundary
    if (width == V || (last < width - 1 && p[s.order[last]] > p[s.order[width - 1]])) {
      kept = last + 1;
      break;
    }
  }
  double total = 0.0;
  for (int i = 0; i < kept; ++i) total += p[s.order[i]];
  s.values.assign(V, 0.0);
  for (int i = 0; i < kept; ++i) s.values[s.order[i]] = p[s.order[i]] / total;
  std::copy(s.values.begin(), s.values.end(), p);
}
}  // namespace

Rng::Rng(uint64_t seed) {
  uint64_t x = seed;
  for (auto& s : s_) s = splitmix64(x);
}

uint64_t Rng::next() {
  uint64_t result = rotl(s_[1] * 5, 7) * 9, t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

double Rng::uniform() { return double(next() >> 11) * 0x1.0p-53; }

// As the Python runtime's check (runtime/backends/protocol.py): NaN anywhere, or a row whose
// largest logit is infinite, is a broken model; -inf entries are masks (a draft's LM head over a
// vocabulary subset writes -inf for the tokens outside it) and are kept.
int argmax(const float* row, int V) {
  int best = 0;
  float top = row[0];
  bool nan = std::isnan(top);
  for (int i = 1; i < V; ++i) {
    float x = row[i];
    nan |= std::isnan(x);
    if (x > top) top = x, best = i;
  }
  if (nan || !std::isfinite(top)) non_finite();
  return best;
}

void probs(const float* logits, int V, const SamplingConfig& cfg, double* p, ProbScratch& s) {
  double top = -std::numeric_limits<double>::infinity();
  for (int i = 0; i < V; ++i) {  // -inf: a masked token (probability 0); NaN or a +inf top: broken
    if (std::isnan(logits[i])) non_finite();
    p[i] = double(logits[i]) / cfg.temperature;
    top = std::max(top, p[i]);
  }
  if (!std::isfinite(top)) non_finite();
  double kth = -std::numeric_limits<double>::infinity();
  if (cfg.top_k > 0 && cfg.top_k < V) {
    s.values.assign(p, p + V);
    std::nth_element(s.values.begin(), s.values.begin() + (cfg.top_k - 1), s.values.end(), std::greater<double>());
    kth = s.values[cfg.top_k - 1];
  }
  double total = 0.0;
  for (int i = 0; i < V; ++i) {
    p[i] = p[i] < kth ? 0.0 : std::exp(p[i] - top);
    total += p[i];
  }
  for (int i = 0; i < V; ++i) p[i] /= total;
  if (cfg.top_p < 1.0) top_p_filter(p, V, cfg.top_p, s);
}

int sample(const double* p, int V, double u) {
  double total = 0.0;
  for (int i = 0; i < V; ++i) total += p[i];
  double target = u * total, cum = 0.0;
  for (int i = 0; i < V; ++i) {  // the first index whose cumulative sum passes u * total
    cum += p[i];
    if (cum > target) return i;
  }
  return V - 1;
}

std::pair<int, int> verify_greedy(const int64_t* draft, int k, const float* rows, int V) {
  int n = 0;
  while (n < k && draft[n] == argmax(rows + size_t(n) * V, V)) ++n;
  return {n, argmax(rows + size_t(n) * V, V)};
}

std::pair<int, int> verify_sampling(const int64_t* draft, int k, const double* q, const double* p,
                                    const double* u_accept, double u_sample, int V, double* residual) {
  for (int i = 0; i < k; ++i) {
    int x = int(draft[i]);
    const double* pi = p + size_t(i) * V;
    double qx = q ? q[size_t(i) * V + x] : 1.0, px = pi[x];
    if (qx > 0 && u_accept[i] * qx < px) continue;
    double total = 0.0;
    for (int v = 0; v < V; ++v) {
      residual[v] = q ? std::max(pi[v] - q[size_t(i) * V + v], 0.0) : (v == x ? 0.0 : pi[v]);
      total += residual[v];
    }
    // p == q exactly (rejection then has probability 0): fall back to p
    return {i, total > 0 ? sample(residual, V, u_sample) : sample(pi, V, u_sample)};
  }
  return {k, sample(p + size_t(k) * V, V, u_sample)};
}

}  // namespace specrt
