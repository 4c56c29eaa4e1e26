// The entry's packed graph of one lane (docs/bundle.md "Packed calls"; runtime/backends/packed.py
// for one sequence): input_ids [1, N], lane_index.0 [T_0], lane_seqlens int32 [1], unpack_index
// [N], logits_index [n], the lane's KV buffers, logits [1, n, V]. The Python runtime runs these
// by default, on specrt's own operators where the bundle has those and the CPU runs them.
//
// filler (a target on onnxruntime's operators): no kernel runs its one-row special case, so a
// row's bits do not depend on the call's width: a lone token gets a filler after it inside its
// lane (its K/V row lands one past the sequence, where the next call writes first), the packed
// axis is never one token and the LM head never one row. A draft model, and a target's kernel
// graph whose every node computes a lone row as a wide call does (`packed.one_row`), skip both (docs/design.md "One-token calls of int8-activation graphs").
#pragma once

#include "model.h"

namespace specrt {

class PackedModel : public Model {
 public:
  PackedModel(const std::string& graph, const ModelEntry& entry, std::shared_ptr<KvCache> kv,
              const SessionConfig& config, const std::string& name, bool filler);
  const float* run(const int64_t* tokens, int T, int past, int keep, int* n_rows) override;

 private:
  bool filler_;
  Ort::Session session_;
  Ort::IoBinding binding_;
  std::vector<int64_t> ids_, lane_, unpack_, keep_;
  std::vector<int32_t> seqlens_;
  std::vector<float> logits_;
  std::vector<Ort::Value> ids_values_, lane_values_, unpack_values_, keep_values_, logits_values_, seqlens_value_;
};

}  // namespace specrt
