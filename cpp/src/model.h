// One model = one onnxruntime session over KV buffers allocated once (runtime/backends/ort.py
// `OrtModel`, for one sequence). Buffers, never reallocated:
//   KV      KvCache: 2 * layers buffers [1, Hkv, S, D] (K, V per layer), bound at construction
//           as both past_key_values.{i}.* and present.{i}.*: the graph writes a call's rows in
//           place. A self-draft is built over its target's KvCache.
//   ids     int64 [max_prefill_t]; mask int64 [S] all ones; logits float32 [max_prefill_t * V].
// A call binds prefixes of these (a tensor per shape, made on first use and kept), so nothing
// is allocated per step once the shapes have been seen.
#pragma once

#include <onnxruntime_cxx_api.h>

#include <memory>
#include <string>
#include <vector>

#include "manifest.h"
#include "session.h"

namespace specrt {

constexpr int kPrefillTokens = 64;  // widest prompt chunk (runtime/backends/ort.py PREFILL_TOKENS)

class KvCache {
 public:
  // capacity: rows per buffer (the load's context, <= layout.max_seq_len)
  KvCache(const KVLayout& layout, int capacity);
  const KVLayout& layout() const { return layout_; }
  int capacity() const { return capacity_; }
  int64_t buffer_bytes() const { return static_cast<int64_t>(buffers_[0].size()); }
  void* buffer(int i) { return buffers_[i].data(); }  // i = 2 * layer + (0: key, 1: value)

 private:
  KVLayout layout_;
  int capacity_;
  std::vector<std::vector<uint8_t>> buffers_;
};

class Model {
 public:
  Model(const std::string& graph, const ModelEntry& entry, std::shared_ptr<KvCache> kv, const SessionConfig& config,
        const std::string& name);

  // tokens [T] (1 <= T <= max_prefill_t) at positions [past, past + T) -> logits [n, V] of the last
  // n = min(keep, T) positions (keep 0: all T; all T where the graph has no logits_to_keep
  // input). The view is valid until the next call. Lengths are the caller's (`length`).
  const float* run(const int64_t* tokens, int T, int past, int keep, int* n_rows);

  const std::string name;
  const int vocab;          // V
  const int max_t;          // widest verification call (max_tokens_per_call)
  const int max_prefill_t;  // widest call at all (prompt chunks)
  const int min_t;          // narrowest call whose rows equal a wider call's (2 at accuracy_level 4)
  int capacity() const { return kv_->capacity(); }
  KvCache& kv() { return *kv_; }
  int length = 0;  // rows of committed tokens in the KV buffers (this model's track)

 private:
  Ort::Value& cached(std::vector<Ort::Value>& cache, size_t i, void* data, size_t bytes, const std::vector<int64_t>& shape,
                     ONNXTensorElementDataType type);

  ModelEntry entry_;
  std::shared_ptr<KvCache> kv_;
  Ort::Session session_;
  Ort::IoBinding binding_;
  Ort::MemoryInfo cpu_;
  std::vector<int64_t> ids_, mask_, keep_;
  std::vector<float> logits_;
  std::vector<Ort::Value> ids_values_, mask_values_, logits_values_, keep_value_, kv_values_;
};

}  // namespace specrt
