// specrt.json -> typed structs (schema: docs/bundle.md; the Python mirror is
// runtime/bundle/manifest.py). Only what a runtime needs is read; unknown keys are ignored and
// every field has the default the Python reader gives it, so older bundles stay readable.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace specrt {

constexpr int kSchemaVersion = 2;  // 1 reads as 2 without io.hidden_out / io.hidden_in

struct IONames {
  std::string input_ids = "input_ids";             // int64 [B, T]
  std::string attention_mask = "attention_mask";   // int64 [B, P + T], all ones
  std::string logits = "logits";                   // float32 [B, n, V]
  std::string past_key = "past_key_values.{i}.key";  // [B, Hkv, S_max, D], bound with present
  std::string past_value = "past_key_values.{i}.value";
  std::string present_key = "present.{i}.key";
  std::string present_value = "present.{i}.value";
  std::string hidden_out;      // EAGLE features out ("" = none)
  std::string hidden_in;       // EAGLE features in ("" = none)
  std::string logits_to_keep;  // int64 [1] input: logits of the last n positions ("" = none)
};

struct KVLayout {
  int layers = 0;
  int kv_heads = 0;
  int head_dim = 0;
  std::string dtype = "float32";  // "float32" | "float16"
  int max_seq_len = 0;            // S_max: rows per buffer

  size_t itemsize() const { return dtype == "float16" ? 2 : 4; }
  bool operator==(const KVLayout& o) const {
    return layers == o.layers && kv_heads == o.kv_heads && head_dim == o.head_dim && dtype == o.dtype &&
           max_seq_len == o.max_seq_len;
  }
};

struct PackedIO {  // "{i}": the layer, "{r}": the lane
  std::string lane_index = "lane_index.{r}";  // int64 [T_r]: lane r's tokens, indices into the call's N
  std::string lane_seqlens = "lane_seqlens";  // int32 [lanes]: per lane, total length - 1
  std::string unpack_index = "unpack_index";  // int64 [N]: token i's row in the lanes' outputs
  std::string logits_index = "logits_index";  // int64 [n]: the tokens that get logits
  std::string past_key = "past_key_values.{i}.key.lane{r}";
  std::string past_value = "past_key_values.{i}.value.lane{r}";
  std::string present_key = "present.{i}.key.lane{r}";
  std::string present_value = "present.{i}.value.lane{r}";
};

struct PackedGraph {  // the entry's packed graphs (docs/bundle.md "Packed calls"); "" = none
  std::string graph;  // "{lanes}" in the name
  std::vector<int> lanes;
  PackedIO io;
  std::string kernels;      // the same on specrt's own operators ("" = none)
  std::string kernel_data;  // the weights file those add
  bool one_row = false;     // every node of those computes a lone row as a wide call does: no
                            // filler after a lone token (runtime/bundle/manifest.py PackedGraph)
};

struct ModelEntry {
  std::string graph;           // ONNX file, relative to the bundle
  std::string data;            // its external weights ("" = none)
  std::string lowering = "ort";  // "ort" | "standard"
  std::string precision = "fp32";
  std::string recipe;          // "export", "self-int8", "self-int4", "model", "eagle"
  int vocab_size = 0;
  int max_tokens_per_call = 17;  // widest verification call: k + 1 <= this
  int default_k = 0;           // draft entry: k the exporter recommends (0: unset)
  int accuracy_level = -1;     // quantization.accuracy_level (-1: none recorded)
  IONames io;
  KVLayout kv;
  PackedGraph packed;
  // false: the bundle holds only the kernel graphs (exported with portable = false; `graph` and
  // `packed.graph` name where `python -m specrt.export.portable BUNDLE` writes the others)
  bool portable = true;
  bool portable_missing() const { return !portable && !packed.kernels.empty(); }
};

struct TokenizerInfo {
  std::string file = "tokenizer.json";
  std::optional<int64_t> bos_token_id;
  std::vector<int64_t> eos_token_ids;
  std::vector<int64_t> eog_token_ids;  // end of generation (derived for bundles without the field)
};

struct Manifest {
  int schema_version = kSchemaVersion;
  std::string name;
  ModelEntry target;
  std::optional<ModelEntry> draft;
  TokenizerInfo tokenizer;
};

// Reads and checks `<folder>/specrt.json`: the schema version is one this library reads and
// every file it names exists. Throws Error (NOT_FOUND, BAD_BUNDLE, SCHEMA_VERSION).
Manifest load_manifest(const std::string& folder);

// An IO name template with "{i}" (the layer) and "{r}" (the lane) filled in.
std::string layer_name(const std::string& pattern, int layer, int lane = 0);
// A packed graph's file name with "{lanes}" filled in.
std::string lanes_file(const std::string& pattern, int lanes);

}  // namespace specrt
