#include "packed.h"

#include <algorithm>
#include <numeric>

#include "error.h"

namespace specrt {

PackedModel::PackedModel(const std::string& graph, const ModelEntry& entry, std::shared_ptr<KvCache> kv,
                         const SessionConfig& config, const std::string& model_name, bool filler)
    : Model(model_name, entry, std::move(kv), 1, filler),
      filler_(filler),
      session_(ort_env(), graph.c_str(), session_options(config)),
      binding_(session_) {
  int cap = max_prefill_t + 2;  // a call's tokens, and a filler
  ids_.assign(cap, 0);
  lane_.assign(cap, 0);
  unpack_.assign(cap, 0);
  keep_.assign(cap, 0);
  seqlens_.assign(1, 1);
  logits_.assign(size_t(cap) * vocab, 0.0f);  // committed now: RSS stays flat
  const PackedIO& io = entry.packed.io;
  bind_kv(binding_, io.past_key, io.past_value, io.present_key, io.present_value);
  std::vector<int64_t> one = {1};
  seqlens_value_.push_back(Ort::Value::CreateTensor<int32_t>(cpu_, seqlens_.data(), 1, one.data(), 1));
  binding_.BindInput(io.lane_seqlens.c_str(), seqlens_value_[0]);
  const auto i64 = ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64;
  for (int64_t n = 1; n <= cap; ++n) {  // every shape a call can bind, made now
    tensor(ids_values_, n, ids_.data(), sizeof(int64_t) * n, {1, n}, i64);
    tensor(lane_values_, n, lane_.data(), sizeof(int64_t) * n, {n}, i64);
    tensor(unpack_values_, n, unpack_.data(), sizeof(int64_t) * n, {n}, i64);
    tensor(keep_values_, n, keep_.data(), sizeof(int64_t) * n, {n}, i64);
    tensor(logits_values_, n, logits_.data(), sizeof(float) * n * vocab, {1, n, vocab}, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT);
  }
}

const float* PackedModel::run(const int64_t* tokens, int T, int past, int keep, int* n_rows) {
  int width = filler_ ? std::max(T, 2) : T;  // the lane's rows: a lone token's filler after it
  check_call(T, past, width);
  int k = keep <= 0 ? T : std::min(keep, T);
  std::copy(tokens, tokens + T, ids_.begin());
  std::iota(lane_.begin(), lane_.begin() + T, 0);
  std::fill(lane_.begin() + T, lane_.begin() + width, T - 1);  // filler: the lone token again, one row further
  seqlens_[0] = past + width - 1;
  std::iota(unpack_.begin(), unpack_.begin() + T, 0);
  std::iota(keep_.begin(), keep_.begin() + k, T - k);
  int n = T, rows = k;
  if (filler_ && n == 1) {  // a packed axis of one token would send the projections to M = 1 kernels
    ids_[1] = ids_[0], unpack_[1] = unpack_[0];
    n = 2;
  }
  if (filler_ && rows == 1) {  // the same for the LM head: one kept row is asked for twice
    keep_[1] = keep_[0];
    rows = 2;
  }
  const PackedIO& io = entry_.packed.io;
  const auto i64 = ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64;
  binding_.BindInput(entry_.io.input_ids.c_str(), tensor(ids_values_, n, ids_.data(), sizeof(int64_t) * n, {1, n}, i64));
  binding_.BindInput(layer_name(io.lane_index, 0, 0).c_str(),
                     tensor(lane_values_, width, lane_.data(), sizeof(int64_t) * width, {width}, i64));
  binding_.BindInput(io.lane_seqlens.c_str(), seqlens_value_[0]);
  binding_.BindInput(io.unpack_index.c_str(), tensor(unpack_values_, n, unpack_.data(), sizeof(int64_t) * n, {n}, i64));
  binding_.BindInput(io.logits_index.c_str(), tensor(keep_values_, rows, keep_.data(), sizeof(int64_t) * rows, {rows}, i64));
  binding_.BindOutput(entry_.io.logits.c_str(), tensor(logits_values_, rows, logits_.data(), sizeof(float) * rows * vocab,
                                                       {1, rows, vocab}, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT));
  session_.Run(Ort::RunOptions{nullptr}, binding_);
  *n_rows = k;
  return logits_.data();
}

}  // namespace specrt
