// logits -> probabilities (temperature, top-k, top-p), draws, and verification of k draft tokens
// against the target's k + 1 rows. Ports of runtime/sampling/draws.py `probs` / `sample` and
// runtime/sampling/verify.py: pure functions, the uniforms passed in.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace specrt {

struct SamplingConfig {
  double temperature = 0.0;  // 0 = greedy
  int top_k = 0;             // 0 = off
  double top_p = 1.0;        // 1 = off
  bool greedy() const { return temperature == 0.0; }
};

// A request's random stream (xoshiro256** seeded through splitmix64): the same seed gives the
// same draws on every platform and compiler.
class Rng {
 public:
  explicit Rng(uint64_t seed);
  uint64_t next();
  double uniform();  // [0, 1), 53 bits

 private:
  uint64_t s_[4];
};

// Index of the largest of row[0, V) (the first on ties, as numpy's argmax). Throws Error
// (SPECRT_ERR_RUNTIME) on a NaN or inf: the model or its export is broken.
int argmax(const float* row, int V);

// Scratch for `probs` (one per request loop; sized on first use, reused after).
struct ProbScratch {
  std::vector<int> order;
  std::vector<double> values;
};

// logits row [V] -> p [V] (sums to 1). top-k keeps the k largest logits (ties at the boundary
// kept); top-p keeps the smallest set of most probable tokens whose mass reaches p (the token
// that crosses p is kept; ties ordered by index). Throws on non-finite logits.
void probs(const float* logits, int V, const SamplingConfig& cfg, double* p, ProbScratch& scratch);

// Inverse-CDF draw from p [V] (need not be normalized) with a uniform u in [0, 1).
int sample(const double* p, int V, double u);

// Greedy verification. target rows [k + 1, V] (row i: the position of draft[i]) -> (n_ok, next):
// keep draft[i] while it is row i's argmax; next = argmax of the first row that disagreed.
std::pair<int, int> verify_greedy(const int64_t* draft, int k, const float* rows, int V);

// Exact speculative sampling (Leviathan et al. 2023; Chen et al. 2023). q [k, V]: the draft
// distributions the tokens were drawn from, or nullptr for a one-hot drafter (n-gram); p
// [k + 1, V]: the target's, after the same processing. Token i is accepted iff
// u_accept[i] * q_i(x) < p_i(x); on the first rejection the next token is drawn from
// norm(max(0, p_i - q_i)) with u_sample, if all pass from p_k. residual: scratch [V].
std::pair<int, int> verify_sampling(const int64_t* draft, int k, const double* q, const double* p,
                                    const double* u_accept, double u_sample, int V, double* residual);

}  // namespace specrt
