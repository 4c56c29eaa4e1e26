#include "generator.h"

#include <algorithm>
#include <chrono>

#include "error.h"

namespace specrt {

namespace {
using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }
}  // namespace

namespace {
// n elements written once and dropped: the capacity stays, its pages committed (resident from
// here on, not first touched by some later request)
template <typename T>
void commit_pages(std::vector<T>& v, size_t n) {
  v.assign(n, T{});
  v.clear();
}
}  // namespace

Generator::Generator(Model& target) : target_(target) {
  // every buffer a request can need, sized now: memory does not grow after the first request
  size_t V = size_t(target.vocab), T = size_t(target.max_t);
  commit_pages(seq_, target.capacity() + 1);
  commit_pages(call_, T);
  commit_pages(wide_, target.max_prefill_t + 2);
  commit_pages(prop_.tokens, T);
  commit_pages(prop_.q, T * V);
  commit_pages(p_, T * V);
  commit_pages(u_, T);
  commit_pages(residual_, V);
  commit_pages(scratch_.order, V);
  commit_pages(scratch_.values, V);
}

void Generator::run(const GenerateRequest& req, std::vector<int32_t>& out, specrt_stats& stats) {
  auto t0 = Clock::now();
  req_ = &req, out_ = &out, stats_ = &stats;
  out.clear();
  out.reserve(req.max_new_tokens);
  rng_ = Rng(req.seed);
  seq_.assign(req.prompt.begin(), req.prompt.end());
  target_.length = 0;
  if (req.drafter) req.drafter->reset();
  stats.prompt_tokens = int(req.prompt.size());
  stats.stop_reason = SPECRT_STOP_LENGTH;
  prefill();
  stats.prefill_ms = ms_since(t0);
  while (int(out.size()) < req.max_new_tokens && stats.stop_reason == SPECRT_STOP_LENGTH) round();
  stats.total_ms = ms_since(t0);
}

// A target call of n tokens at its length (runtime/engine/calls.py `one`). A call narrower than
// the target's min_t runs widened, with a filler after the tokens (its row lies past the track:
// stale, overwritten by the next call); a lone token of a filler-writing target at the buffer's
// last row has no row for its filler. Either, at the end of the buffer, runs with the rows
// before it recomputed (the same bits: every row of such a target comes from wide calls). Only
// the rows of `tokens` come back. -> logits [*rows, V] (keep 0: all n rows).
const float* Generator::target_call(const int64_t* tokens, int n, int keep, int* rows) {
  Model& m = target_;
  int pos = m.length, V = m.vocab;
  if (pos + n > m.capacity()) fail(SPECRT_ERR_INTERNAL, "target call past the KV buffers");
  ++stats_->target_calls;
  int width = n < m.min_t ? m.min_t : (m.filler && n == 1 && pos + 2 > m.capacity()) ? 2 : n;
  if (width == n) {
    const float* logits = m.run(tokens, n, pos, keep, rows);
    m.length += n;
    return logits;
  }
  int pad = width - n, start = pos, before = 0;
  wide_.clear();
  if (pos + width <= m.capacity()) {
    wide_.insert(wide_.end(), tokens, tokens + n);
    wide_.insert(wide_.end(), pad, tokens[n - 1]);
  } else {
    if (pos < pad) fail(SPECRT_ERR_INTERNAL, "no room for a widened target call");
    start = pos - pad, before = pad;
    wide_.insert(wide_.end(), seq_.begin() + start, seq_.begin() + pos);
    wide_.insert(wide_.end(), tokens, tokens + n);
  }
  int got = 0;
  const float* logits = m.run(wide_.data(), width, start, keep > 0 ? std::min(n, keep) + width - n - before : 0, &got);
  int w = (keep <= 0 || got == width) ? n : std::min(n, keep);
  int lo = before + n - w - (width - got);
  m.length += n;
  *rows = w;
  return logits + size_t(lo) * V;
}

int Generator::pick(const float* row) {
  int V = target_.vocab;
  if (req_->cfg.greedy()) return argmax(row, V);
  p_.resize(V);
  probs(row, V, req_->cfg, p_.data(), scratch_);
  return sample(p_.data(), V, rng_.uniform());
}

void Generator::prefill() {
  const auto& prompt = req_->prompt;
  int n = int(prompt.size()), chunk = target_.max_prefill_t, rows = 0;
  const float* logits = nullptr;
  for (int from = 0; from < n; from += chunk) {
    int T = std::min(chunk, n - from);
    logits = target_call(prompt.data() + from, T, 1, &rows);
  }
  int64_t first = pick(logits + size_t(rows - 1) * target_.vocab);
  emit(&first, 1);
}

// One round: propose -> verify -> commit (with the rewind).
void Generator::round() {
  int remaining = req_->max_new_tokens - int(out_->size());
  int k = req_->drafter ? std::min(req_->k, remaining - 1) : 0;  // the round's last token is the target's
  if (req_->policy && k > 0) k = req_->policy->choose(k);
  propose(k);
  auto [n_ok, next] = verify();
  if (req_->policy && req_->drafter) req_->policy->observe(int(prop_.tokens.size()), n_ok, draft_ms_, verify_ms_);
  commit(n_ok, next);
}

// Up to k draft tokens into prop_ (none without a drafter, or where it finds none).
void Generator::propose(int k) {
  prop_.tokens.clear();
  prop_.q.clear();
  draft_ms_ = 0;
  if (k <= 0) return;
  auto t0 = Clock::now();
  req_->drafter->propose(seq_, k, req_->cfg, rng_, prop_);
  draft_ms_ = ms_since(t0);
  stats_->draft_ms += draft_ms_;
  stats_->draft_calls += prop_.calls;
}

// One target call of [last, d0 .. dk-1] -> k + 1 rows -> (n_ok, next): greedy, or exact
// rejection sampling against the draft's q (one-hot for n-gram proposals).
std::pair<int, int> Generator::verify() {
  auto t0 = Clock::now();
  const SamplingConfig& cfg = req_->cfg;
  int V = target_.vocab, k = int(prop_.tokens.size()), rows = 0;
  call_.assign(1, seq_.back());
  call_.insert(call_.end(), prop_.tokens.begin(), prop_.tokens.end());
  const float* logits = target_call(call_.data(), k + 1, 0, &rows);  // [k + 1, V]
  std::pair<int, int> verdict;
  if (cfg.greedy()) {
    verdict = verify_greedy(prop_.tokens.data(), k, logits, V);
  } else {
    p_.resize(size_t(k + 1) * V);
    for (int i = 0; i <= k; ++i) probs(logits + size_t(i) * V, V, cfg, p_.data() + size_t(i) * V, scratch_);
    u_.resize(k);
    for (auto& u : u_) u = rng_.uniform();
    residual_.resize(V);
    verdict = verify_sampling(prop_.tokens.data(), k, prop_.q.empty() ? nullptr : prop_.q.data(), p_.data(), u_.data(),
                              rng_.uniform(), V, residual_.data());
  }
  verify_ms_ = ms_since(t0);
  stats_->verify_ms += verify_ms_;
  ++stats_->rounds;
  stats_->drafted += k;
  stats_->accepted += verdict.first;
  return verdict;
}

// Keeps d[:n_ok] + [next]; the target's length goes back to n' - 1 (the rows of [last,
// d0 .. d(n_ok-1)] are valid, the rest stale: the next call overwrites them); the drafter
// follows; the tokens go out.
void Generator::commit(int n_ok, int next) {
  prop_.tokens.resize(n_ok);
  prop_.tokens.push_back(next);
  int n_after = int(seq_.size() + prop_.tokens.size());
  target_.length = n_after - 1;
  if (req_->drafter) req_->drafter->commit(n_after);
  emit(prop_.tokens.data(), int(prop_.tokens.size()));
}

bool Generator::emit(const int64_t* tokens, int n) {
  const GenerateRequest& r = *req_;
  for (int i = 0; i < n; ++i) {
    if (std::binary_search(r.stop_ids.begin(), r.stop_ids.end(), tokens[i])) {
      stats_->stop_reason = SPECRT_STOP_EOS;
      return false;
    }
    if (int(out_->size()) >= r.max_new_tokens) return false;
    seq_.push_back(tokens[i]);
    out_->push_back(int32_t(tokens[i]));
    stats_->new_tokens = int(out_->size());
    if (r.on_token && !r.on_token(int32_t(tokens[i]))) {
      stats_->stop_reason = SPECRT_STOP_CANCELLED;
      return false;
    }
  }
  return int(out_->size()) < r.max_new_tokens;
}

}  // namespace specrt
