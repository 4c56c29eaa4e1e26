// A model = one onnxruntime session over KV buffers allocated once, running one sequence's calls
// (runtime/backends/protocol.py `PoolModel`, for one slot). Two graphs of a bundle entry:
//   BundleModel  its `graph` (runtime/backends/ort.py `OrtModel`), below
//   PackedModel  its packed graph of one lane (runtime/backends/packed.py), packed.h
// Buffers, never reallocated: the KV buffers (KvCache: 2 * layers of [1, Hkv, S, D], bound at
// construction as both past and present: the graph writes a call's rows in place; a self-draft
// is built over its target's KvCache), and each model's host buffers for ids, indices and
// logits. A call binds prefixes of these, through a tensor per shape, all made at construction:
// nothing of ours is allocated per step.
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
  size_t buffer_bytes() const { return buffers_[0].size(); }
  void* buffer(int i) { return buffers_[i].data(); }  // i = 2 * layer + (0: key, 1: value)

 private:
  KVLayout layout_;
  int capacity_;
  std::vector<std::vector<uint8_t>> buffers_;
};

class Model {
 public:
  virtual ~Model() = default;
  // tokens [T] (1 <= T <= max_prefill_t) at positions [past, past + T) -> logits [n, V] of the
  // last n = min(keep, T) positions (keep 0: all T; all T where the graph cannot keep fewer).
  // The view is valid until the next call. Lengths are the caller's (`length`).
  virtual const float* run(const int64_t* tokens, int T, int past, int keep, int* n_rows) = 0;

  const std::string name;
  const int vocab;          // V
  const int max_t;          // widest verification call (max_tokens_per_call)
  const int max_prefill_t;  // widest call at all (prompt chunks)
  const int min_t;          // narrowest call whose rows equal a wider call's (2 at accuracy_level 4)
  const bool filler;        // a lone token writes a filler row after it (the packed target): it
  //                           needs the row after it free
  // Runs the widest prompt chunk, the widest verification call and the narrowest call once at
  // row 0 (their rows are stale: every request writes its own from row 0), so what onnxruntime
  // allocates on a session's first calls (its arena's high-water mark, per-session scratch) is
  // allocated at open, not during a request.
  void warm();
  int capacity() const { return kv_->capacity(); }
  KvCache& kv() { return *kv_; }
  int length = 0;  // rows of committed tokens in the KV buffers (this model's track)

 protected:
  Model(const std::string& name, const ModelEntry& entry, std::shared_ptr<KvCache> kv, int min_t, bool filler);
  // the tensor cache[i]: `shape` over `data`, made on first use (the constructors make them all)
  Ort::Value& tensor(std::vector<Ort::Value>& cache, size_t i, void* data, size_t bytes,
                     const std::vector<int64_t>& shape, ONNXTensorElementDataType type);
  // binds every layer's K/V buffer as both the past input and the present output
  void bind_kv(Ort::IoBinding& io, const std::string& past_key, const std::string& past_value,
               const std::string& present_key, const std::string& present_value);
  void check_call(int T, int past, int width) const;

  ModelEntry entry_;
  std::shared_ptr<KvCache> kv_;
  Ort::MemoryInfo cpu_;
  std::vector<Ort::Value> kv_values_;
};

// The entry's own graph: input_ids [1, T], attention_mask [1, P + T], num_logits_to_keep [1]
// when the graph has it, logits [1, n, V].
class BundleModel : public Model {
 public:
  BundleModel(const std::string& graph, const ModelEntry& entry, std::shared_ptr<KvCache> kv,
              const SessionConfig& config, const std::string& name);
  const float* run(const int64_t* tokens, int T, int past, int keep, int* n_rows) override;

 private:
  Ort::Session session_;
  Ort::IoBinding binding_;
  std::vector<int64_t> ids_, mask_, keep_;
  std::vector<float> logits_;
  std::vector<Ort::Value> ids_values_, mask_values_, logits_values_, keep_value_;
};

}  // namespace specrt
