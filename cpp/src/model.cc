#include "model.h"

#include <algorithm>

#include "error.h"

namespace specrt {

KvCache::KvCache(const KVLayout& layout, int capacity) : layout_(layout), capacity_(capacity) {
  size_t bytes = size_t(layout.kv_heads) * capacity * layout.head_dim * layout.itemsize();
  buffers_.resize(2 * size_t(layout.layers));
  for (auto& b : buffers_) b.assign(bytes, 0);  // every page committed now: RSS is flat from here
}

namespace {
int prefill_width(const ModelEntry& e) {
  // graphs with EAGLE feature IO keep max_tokens_per_call (their feature buffers are that wide)
  if (!e.io.hidden_in.empty() || !e.io.hidden_out.empty()) return e.max_tokens_per_call;
  return std::max(e.max_tokens_per_call, kPrefillTokens);
}
}  // namespace

Model::Model(const std::string& model_name, const ModelEntry& entry, std::shared_ptr<KvCache> kv, int min_t_,
             bool filler_)
    : name(model_name),
      vocab(entry.vocab_size),
      max_t(entry.max_tokens_per_call),
      max_prefill_t(prefill_width(entry)),
      min_t(min_t_),
      filler(filler_),
      entry_(entry),
      kv_(std::move(kv)),
      cpu_(Ort::MemoryInfo::CreateCpu(OrtArenaAllocator, OrtMemTypeDefault)) {
  const KVLayout& have = kv_->layout();
  if (have.layers != entry.kv.layers || have.kv_heads != entry.kv.kv_heads || have.head_dim != entry.kv.head_dim ||
      have.dtype != entry.kv.dtype || capacity() > entry.kv.max_seq_len)
    fail(SPECRT_ERR_BAD_BUNDLE, name + ": its KV layout does not match the buffers it is given");
}

Ort::Value& Model::tensor(std::vector<Ort::Value>& cache, size_t i, void* data, size_t bytes,
                          const std::vector<int64_t>& shape, ONNXTensorElementDataType type) {
  if (cache.size() <= i) cache.resize(i + 1);
  if (!cache[i]) cache[i] = Ort::Value::CreateTensor(cpu_, data, bytes, shape.data(), shape.size(), type);
  return cache[i];
}

void Model::bind_kv(Ort::IoBinding& io, const std::string& past_key, const std::string& past_value,
                    const std::string& present_key, const std::string& present_value) {
  const KVLayout& L = kv_->layout();
  auto type = L.dtype == "float16" ? ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16 : ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
  std::vector<int64_t> shape = {1, L.kv_heads, capacity(), L.head_dim};
  for (int i = 0; i < L.layers; ++i) {
    for (int j = 0; j < 2; ++j) {
      kv_values_.push_back(Ort::Value::CreateTensor(cpu_, kv_->buffer(2 * i + j), kv_->buffer_bytes(), shape.data(),
                                                    shape.size(), type));
      io.BindInput(layer_name(j ? past_value : past_key, i).c_str(), kv_values_.back());
      io.BindOutput(layer_name(j ? present_value : present_key, i).c_str(), kv_values_.back());
    }
  }
}

void Model::warm() {
  // the calls a request makes at their widest: a prompt chunk (its last row's logits), a
  // verification call (every row's), a lone token
  std::vector<int64_t> tokens(size_t(max_prefill_t), 0);
  int rows = 0;
  run(tokens.data(), max_prefill_t, 0, 1, &rows);
  run(tokens.data(), std::min(max_t, max_prefill_t), 0, 0, &rows);
  run(tokens.data(), std::min(min_t, max_prefill_t), 0, 1, &rows);
  length = 0;
}

void Model::check_call(int T, int past, int width) const {
  if (T < 1 || T > max_prefill_t || past < 0 || past + width > capacity())
    fail(SPECRT_ERR_INTERNAL, name + ": " + std::to_string(T) + " tokens at " + std::to_string(past) +
                                  " do not fit a call (1.." + std::to_string(max_prefill_t) + " tokens, max_seq_len " +
                                  std::to_string(capacity()) + ")");
}

BundleModel::BundleModel(const std::string& graph, const ModelEntry& entry, std::shared_ptr<KvCache> kv,
                         const SessionConfig& config, const std::string& model_name)
    // MatMulNBits at accuracy_level 4: one-token calls take other kernels (runtime/backends/ort.py numerics_min_t)
    : Model(model_name, entry, std::move(kv), entry.accuracy_level == 4 ? 2 : 1, false),
      session_(ort_env(), graph.c_str(), session_options(config)),
      binding_(session_) {
  ids_.assign(max_prefill_t, 0);
  mask_.assign(capacity(), 1);
  keep_.assign(1, 0);
  logits_.assign(size_t(max_prefill_t) * vocab, 0.0f);  // committed now: RSS stays flat
  bind_kv(binding_, entry.io.past_key, entry.io.past_value, entry.io.present_key, entry.io.present_value);
  const auto i64 = ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64;
  for (int64_t t = 1; t <= max_prefill_t; ++t) {  // every shape a call can bind, made now
    tensor(ids_values_, t, ids_.data(), sizeof(int64_t) * t, {1, t}, i64);
    tensor(logits_values_, t, logits_.data(), sizeof(float) * t * vocab, {1, t, vocab}, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT);
  }
  for (int64_t w = 1; w <= capacity(); ++w) tensor(mask_values_, w, mask_.data(), sizeof(int64_t) * w, {1, w}, i64);
  if (!entry.io.logits_to_keep.empty()) {
    std::vector<int64_t> one = {1};
    keep_value_.push_back(Ort::Value::CreateTensor<int64_t>(cpu_, keep_.data(), 1, one.data(), 1));
  }
}

const float* BundleModel::run(const int64_t* tokens, int T, int past, int keep, int* n_rows) {
  check_call(T, past, T);
  std::copy(tokens, tokens + T, ids_.begin());
  int n = (keep_value_.empty() || keep <= 0) ? T : std::min(keep, T);
  const auto i64 = ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64;
  if (!keep_value_.empty()) {
    keep_[0] = n;
    binding_.BindInput(entry_.io.logits_to_keep.c_str(), keep_value_[0]);
  }
  binding_.BindInput(entry_.io.input_ids.c_str(), tensor(ids_values_, T, ids_.data(), sizeof(int64_t) * T, {1, T}, i64));
  binding_.BindInput(entry_.io.attention_mask.c_str(),
                     tensor(mask_values_, past + T, mask_.data(), sizeof(int64_t) * (past + T), {1, past + T}, i64));
  binding_.BindOutput(entry_.io.logits.c_str(), tensor(logits_values_, n, logits_.data(), sizeof(float) * n * vocab,
                                                       {1, n, vocab}, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT));
  session_.Run(Ort::RunOptions{nullptr}, binding_);
  *n_rows = n;
  return logits_.data();
}

}  // namespace specrt
