#include "manifest.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "error.h"

namespace specrt {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// A field's value if present and not null (a wrong type throws json::type_error: BAD_BUNDLE).
template <typename T>
void read(const json& j, const char* key, T& out) {
  auto it = j.find(key);
  if (it != j.end() && !it->is_null()) out = it->get<T>();
}

IONames read_io(const json& j) {
  IONames io;
  read(j, "input_ids", io.input_ids);
  read(j, "attention_mask", io.attention_mask);
  read(j, "logits", io.logits);
  read(j, "past_key", io.past_key);
  read(j, "past_value", io.past_value);
  read(j, "present_key", io.present_key);
  read(j, "present_value", io.present_value);
  read(j, "hidden_out", io.hidden_out);
  read(j, "hidden_in", io.hidden_in);
  read(j, "logits_to_keep", io.logits_to_keep);
  return io;
}

ModelEntry read_entry(const json& j) {
  ModelEntry e;
  read(j, "graph", e.graph);
  read(j, "data", e.data);
  read(j, "lowering", e.lowering);
  read(j, "precision", e.precision);
  read(j, "recipe", e.recipe);
  read(j, "vocab_size", e.vocab_size);
  read(j, "max_tokens_per_call", e.max_tokens_per_call);
  read(j, "default_k", e.default_k);
  read(j, "portable", e.portable);
  if (auto q = j.find("quantization"); q != j.end() && q->is_object()) read(*q, "accuracy_level", e.accuracy_level);
  if (auto io = j.find("io"); io != j.end() && io->is_object()) e.io = read_io(*io);
  if (auto kv = j.find("kv"); kv != j.end() && kv->is_object()) {
    read(*kv, "layers", e.kv.layers);
    read(*kv, "kv_heads", e.kv.kv_heads);
    read(*kv, "head_dim", e.kv.head_dim);
    read(*kv, "dtype", e.kv.dtype);
    read(*kv, "max_seq_len", e.kv.max_seq_len);
  }
  if (auto p = j.find("packed"); p != j.end() && p->is_object()) {
    read(*p, "graph", e.packed.graph);
    read(*p, "lanes", e.packed.lanes);
    read(*p, "kernels", e.packed.kernels);
    read(*p, "kernel_data", e.packed.kernel_data);
    read(*p, "one_row", e.packed.one_row);
    if (auto io = p->find("io"); io != p->end() && io->is_object()) {
      PackedIO& n = e.packed.io;
      read(*io, "lane_index", n.lane_index);
      read(*io, "lane_seqlens", n.lane_seqlens);
      read(*io, "unpack_index", n.unpack_index);
      read(*io, "logits_index", n.logits_index);
      read(*io, "past_key", n.past_key);
      read(*io, "past_value", n.past_value);
      read(*io, "present_key", n.present_key);
      read(*io, "present_value", n.present_value);
    }
  }
  return e;
}

TokenizerInfo read_tokenizer(const json& j) {
  TokenizerInfo t;
  read(j, "file", t.file);
  if (auto bos = j.find("bos_token_id"); bos != j.end() && !bos->is_null()) t.bos_token_id = bos->get<int64_t>();
  read(j, "eos_token_ids", t.eos_token_ids);
  auto eog = j.find("eog_token_ids");
  if (eog != j.end() && !eog->is_null()) {
    t.eog_token_ids = eog->get<std::vector<int64_t>>();
    return t;
  }
  // a bundle from before the field: eos + the FIM tokens that end a middle or a file (as the
  // Python runtime derives it, docs/cpp.md §1)
  std::set<int64_t> ids(t.eos_token_ids.begin(), t.eos_token_ids.end());
  if (auto fim = j.find("fim"); fim != j.end() && fim->is_object())
    for (const char* role : {"pad", "repo_name", "file_sep"})
      if (auto v = fim->find(role); v != fim->end() && v->is_number_integer()) ids.insert(v->get<int64_t>());
  t.eog_token_ids.assign(ids.begin(), ids.end());
  return t;
}

void check_entry(const std::string& role, const ModelEntry& e) {
  std::string what;
  if (e.graph.empty()) what = "graph";
  else if (e.vocab_size <= 0) what = "vocab_size";
  else if (e.kv.layers <= 0 || e.kv.kv_heads <= 0 || e.kv.head_dim <= 0 || e.kv.max_seq_len <= 0) what = "kv";
  else if (e.kv.dtype != "float32" && e.kv.dtype != "float16") what = "kv.dtype (" + e.kv.dtype + ")";
  else if (e.max_tokens_per_call < 1) what = "max_tokens_per_call";
  if (!what.empty()) fail(SPECRT_ERR_BAD_BUNDLE, "specrt.json: the " + role + " entry has no valid " + what);
}

void check_files(const fs::path& folder, const Manifest& m) {
  std::vector<std::pair<std::string, std::string>> named;  // (role, relative path)
  for (const auto* e : {&m.target, m.draft ? &*m.draft : nullptr}) {
    if (!e) continue;
    std::string role = e == &m.target ? "target" : "draft";
    if (!e->portable_missing()) named.emplace_back(role, e->graph);
    if (!e->data.empty()) named.emplace_back(role, e->data);
  }
  for (const auto& [role, rel] : named)
    if (!fs::is_regular_file(folder / rel))
      fail(SPECRT_ERR_NOT_FOUND, "bundle " + folder.string() + " is incomplete: " + role + " file " + rel + " is missing");
}

}  // namespace

namespace {
std::string fill(std::string text, const std::string& key, int value) {
  for (auto at = text.find(key); at != std::string::npos; at = text.find(key)) text.replace(at, key.size(), std::to_string(value));
  return text;
}
}  // namespace

std::string layer_name(const std::string& pattern, int layer, int lane) {
  return fill(fill(pattern, "{i}", layer), "{r}", lane);
}

std::string lanes_file(const std::string& pattern, int lanes) { return fill(pattern, "{lanes}", lanes); }

Manifest load_manifest(const std::string& folder_name) {
  fs::path folder(folder_name);
  if (!fs::is_directory(folder))
    fail(SPECRT_ERR_NOT_FOUND, "no bundle at " + folder_name + ": folder does not exist (run `make export`)");
  fs::path path = folder / "specrt.json";
  if (!fs::is_regular_file(path)) fail(SPECRT_ERR_NOT_FOUND, folder_name + " is not a specrt bundle: specrt.json is missing");
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  json j;
  try {
    j = json::parse(text.str());
  } catch (const json::exception& e) {
    fail(SPECRT_ERR_BAD_BUNDLE, path.string() + " is corrupt: " + e.what());
  }
  if (!j.is_object()) fail(SPECRT_ERR_BAD_BUNDLE, path.string() + " is corrupt: expected a JSON object");
  auto version = j.find("schema_version");
  if (version == j.end() || !version->is_number_integer() || (*version != 1 && *version != 2))
    fail(SPECRT_ERR_SCHEMA_VERSION, "unsupported bundle schema_version " + (version == j.end() ? "(none)" : version->dump()) +
                                        "; this library reads versions [1, 2] (re-export the bundle)");
  Manifest m;
  try {
    m.schema_version = version->get<int>();
    read(j, "name", m.name);
    if (auto t = j.find("target"); t != j.end() && t->is_object()) m.target = read_entry(*t);
    if (auto d = j.find("draft"); d != j.end() && d->is_object()) m.draft = read_entry(*d);
    if (auto t = j.find("tokenizer"); t != j.end() && t->is_object()) m.tokenizer = read_tokenizer(*t);
  } catch (const json::exception& e) {
    fail(SPECRT_ERR_BAD_BUNDLE, path.string() + " is corrupt: " + e.what());
  }
  check_entry("target", m.target);
  if (m.draft) check_entry("draft", *m.draft);
  check_files(folder, m);
  return m;
}

}  // namespace specrt
