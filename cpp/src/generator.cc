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
void commit(std::vector<T>& v, size_t n) {
  v.assign(n, T{});
  v.clear();
}
}  // namespace

Generator::Generator(Model& target) : target_(target) {
  // every buffer a request can need, sized now: memory does not grow after the first request
  size_t V = size_t(target.vocab), T = size_t(target.max_t);
  commit(seq_, target.capacity() + 1);
  commit(call_, T);
  commit(wide_, target.max_prefill_t + 2);
  commit(prop_.tokens, T);
  commit(prop_.q, T * V);
  commit(p_, T * V);
  commit(u_, T);
  commit(residual_, V);
  commit(scratch_.order, V);
  commit(scratch_.values, V);
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

void Generator::round() {
  const GenerateRequest& r = *req_;
  int V = target_.vocab, remaining = r.max_new_tokens - int(out_->size());
  int k = r.drafter ? std::min(r.k, remaining - 1) : 0;
  prop_.tokens.clear();
  prop_.q.clear();
  if (k > 0) {
    auto t0 = Clock::now();
    r.drafter->propose(seq_, k, r.cfg, rng_, prop_);
    stats_->draft_ms += ms_since(t0);
    stats_->draft_calls += prop_.calls;
  }
  auto t0 = Clock::now();
  int kp = int(prop_.tokens.size()), rows = 0;
  call_.assign(1, seq_.back());
  call_.insert(call_.end(), prop_.tokens.begin(), prop_.tokens.end());
  const float* logits = target_call(call_.data(), kp + 1, 0, &rows);
  std::pair<int, int> verdict;
  if (r.cfg.greedy()) {
    verdict = verify_greedy(prop_.tokens.data(), kp, logits, V);
  } else {
    p_.resize(size_t(kp + 1) * V);
    for (int i = 0; i <= kp; ++i) probs(logits + size_t(i) * V, V, r.cfg, p_.data() + size_t(i) * V, scratch_);
    u_.resize(kp);
    for (auto& u : u_) u = rng_.uniform();
    residual_.resize(V);
    verdict = verify_sampling(prop_.tokens.data(), kp, prop_.q.empty() ? nullptr : prop_.q.data(), p_.data(), u_.data(),
                              rng_.uniform(), V, residual_.data());
  }
  stats_->verify_ms += ms_since(t0);
  auto [n_ok, next] = verdict;
  ++stats_->rounds;
  stats_->drafted += kp;
  stats_->accepted += n_ok;
  prop_.tokens.resize(n_ok);  // commit d[:n_ok] + [next]
  prop_.tokens.push_back(next);
  int n_after = int(seq_.size() + prop_.tokens.size());
  target_.length = n_after - 1;  // rewind: [last, d0 .. d(n_ok-1)] are valid rows, the rest stale
  if (r.drafter) r.drafter->commit(n_after);
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
