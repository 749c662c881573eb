// Reading a Hugging Face tokenizer folder into HfTables: tokenizer.json's model, normalizer,
// pre-tokenizer, post-processor and added tokens, and the special tokens transformers takes
// from tokenizer_config.json / special_tokens_map.json.
#include <nlohmann/json.hpp>
#include <sys/stat.h>

#include <algorithm>

#include "tessera/core/error.h"
#include "tessera/data/file_util.h"
#include "tessera/data/hf_tables.h"
#include "tessera/data/hf_unicode.h"
#include "tessera/data/json_util.h"
#include "tessera/data/utf8.h"

namespace tessera::data {
namespace {

using Json = nlohmann::json;

constexpr const char* kSupported =
    "tessera reads byte-level BPE tokenizer.json files (Llama-3, Qwen2, GPT-4- and GPT-2-style): model BPE; "
    "normalizers NFC, NFD, NFKC, NFKD, Sequence; pre-tokenizers Split (Regex or String, Isolated or Removed), "
    "ByteLevel (last), Sequence; post-processors TemplateProcessing, RobertaProcessing, BertProcessing, "
    "ByteLevel, Sequence";

// GPT-2's pattern, which ByteLevel applies when its use_regex is true.
constexpr const char* kByteLevelPattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

// One JSON file being read, for error messages that name the file and the JSON path.
struct JsonFile {
  std::string path;
  Json root;

  [[noreturn]] void fail(const std::string& at, const std::string& what) const {
    throw runtime_error(path + ": " + at + ": " + what, kSupported);
  }
  [[noreturn]] void unsupported(const std::string& at, const Json& node) const {
    const std::string type = node.is_object() && node.contains("type") && node["type"].is_string()
                                 ? node["type"].get<std::string>()
                                 : node.dump().substr(0, 80);
    fail(at, "\"" + type + "\" is not supported");
  }
  const Json& member(const Json& node, const std::string& at, const char* key) const {
    if (!node.is_object() || !node.contains(key)) fail(at, std::string("has no \"") + key + "\"");
    return node[key];
  }
  std::string string_at(const Json& node, const std::string& at, const char* key) const {
    const Json& v = member(node, at, key);
    if (!v.is_string()) fail(at + "." + key, "expected a string");
    return v.get<std::string>();
  }
  bool flag(const Json& node, const std::string& at, const char* key, bool fallback) const {
    if (!node.is_object() || !node.contains(key) || node[key].is_null()) return fallback;
    if (!node[key].is_boolean()) fail(at + "." + key, "expected true or false");
    return node[key].get<bool>();
  }
  int32_t id_at(const Json& v, const std::string& at) const {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= (int64_t{1} << 30))
      fail(at, "expected a token id in [0, 2^30)");
    return v.get<int32_t>();
  }
  static std::string type_of(const Json& node) {
    return node.is_object() && node.contains("type") && node["type"].is_string() ? node["type"].get<std::string>()
                                                                                  : "";
  }
};

bool exists(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

JsonFile read_json(const std::string& path, std::string_view what) {
  JsonFile f{path, {}};
  const std::string text = read_file(path, what);
  try {
    f.root = Json::parse(text);
  } catch (const Json::parse_error& e) {
    const TextPosition at = advance_position(text, std::min<size_t>(e.byte > 0 ? e.byte - 1 : 0, text.size()));
    throw runtime_error(path + ":" + std::to_string(at.line) + ":" + std::to_string(at.column) + ": malformed JSON",
                        "the --tokenizer-model folder must hold the tokenizer.json that `tokenizers` saves");
  }
  return f;
}

// ---- model ---------------------------------------------------------------------------------

// A vocab token in GPT-2's byte-level alphabet -> its raw bytes; false if a character is outside it.
bool level_to_bytes(std::string_view piece, const std::array<int, 0x144>& byte_of_char, std::string& bytes) {
  bytes.clear();
  const auto* p = reinterpret_cast<const unsigned char*>(piece.data());
  for (size_t i = 0; i < piece.size();) {
    size_t len;
    const char32_t c = utf8::decode_valid(p + i, len);
    i += len;
    if (c >= byte_of_char.size() || byte_of_char[c] < 0) return false;
    bytes += static_cast<char>(byte_of_char[c]);
  }
  return true;
}

void read_bpe_model(const JsonFile& f, HfTables& t, std::unordered_map<std::string, int32_t>& vocab) {
  const Json& model = f.member(f.root, "(top level)", "model");
  const std::string type = JsonFile::type_of(model);
  if (type != "BPE" && !(type.empty() && model.contains("merges"))) f.unsupported("model.type", model);
  if (model.contains("dropout") && !model["dropout"].is_null()) f.fail("model.dropout", "BPE dropout is not supported");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (model.contains(key) && !model[key].is_null() && model[key] != "")
      f.fail(std::string("model.") + key, "is not supported (byte-level BPE has none)");
  if (f.flag(model, "model", "byte_fallback", false)) f.fail("model.byte_fallback", "true is not supported");
  t.ignore_merges = f.flag(model, "model", "ignore_merges", false);

  const Json& vocab_json = f.member(model, "model", "vocab");
  if (!vocab_json.is_object()) f.fail("model.vocab", "expected an object of token -> id");
  for (auto it = vocab_json.begin(); it != vocab_json.end(); ++it) {
    vocab[it.key()] = f.id_at(it.value(), "model.vocab[\"" + it.key() + "\"]");
  }

  const std::array<char32_t, 256> alphabet = byte_level_alphabet();
  std::array<int, 0x144> byte_of_char;
  byte_of_char.fill(-1);
  for (int b = 0; b < 256; ++b) byte_of_char[alphabet[b]] = b;
  for (int b = 0; b < 256; ++b) {
    std::string s;
    utf8::append(s, alphabet[b]);
    auto it = vocab.find(s);
    if (it == vocab.end())
      f.fail("model.vocab", "has no token for the byte " + std::to_string(b) + " (\"" + s +
                                "\"): not a byte-level BPE vocabulary");
    t.byte_id[b] = it->second;
  }
  std::string bytes;
  for (const auto& [piece, id] : vocab)
    if (level_to_bytes(piece, byte_of_char, bytes)) t.id_of_bytes.emplace(bytes, id);

  const Json& merges = f.member(model, "model", "merges");
  if (!merges.is_array()) f.fail("model.merges", "expected an array");
  t.merges.reserve(merges.size());
  for (size_t r = 0; r < merges.size(); ++r) {
    const std::string at = "model.merges[" + std::to_string(r) + "]";
    const Json& m = merges[r];
    std::string a, b;
    if (m.is_string()) {  // "a b": tokenizers splits at the space and wants exactly two parts
      const std::string s = m.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        f.fail(at, "expected two tokens separated by one space, found \"" + s + "\"");
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      a = m[0].get<std::string>();
      b = m[1].get<std::string>();
    } else {
      f.fail(at, "expected \"a b\" or [\"a\", \"b\"]");
    }
    auto ia = vocab.find(a), ib = vocab.find(b), im = vocab.find(a + b);
    if (ia == vocab.end() || ib == vocab.end() || im == vocab.end())
      f.fail(at, "\"" + (ia == vocab.end() ? a : ib == vocab.end() ? b : a + b) + "\" is not in model.vocab");
    t.merges.set(ia->second, ib->second, MergeTable::Merge{static_cast<int32_t>(r), im->second});
  }
}

// ---- normalizer and pre-tokenizer ----------------------------------------------------------

void read_normalizer(const JsonFile& f, const Json& node, const std::string& at, HfTables& t) {
  if (node.is_null()) return;
  const std::string type = JsonFile::type_of(node);
  if (type == "Sequence") {
    const Json& list = f.member(node, at, "normalizers");
    for (size_t i = 0; i < list.size(); ++i)
      read_normalizer(f, list[i], at + ".normalizers[" + std::to_string(i) + "]", t);
  } else if (type == "NFC") {
    t.normalizers.push_back(UnicodeNormalization::NFC);
  } else if (type == "NFD") {
    t.normalizers.push_back(UnicodeNormalization::NFD);
  } else if (type == "NFKC") {
    t.normalizers.push_back(UnicodeNormalization::NFKC);
  } else if (type == "NFKD") {
    t.normalizers.push_back(UnicodeNormalization::NFKD);
  } else {
    f.unsupported(at + ".type", node);
  }
}

// Flattens Sequences into `steps`; `byte_level` tells whether ByteLevel was seen (it must be last).
void read_pretokenizer(const JsonFile& f, const Json& node, const std::string& at, HfTables& t, bool& byte_level) {
  const std::string type = JsonFile::type_of(node);
  if (byte_level) f.fail(at, "comes after ByteLevel, which tessera supports only as the last pre-tokenizer");
  if (type == "Sequence") {
    const Json& list = f.member(node, at, "pretokenizers");
    for (size_t i = 0; i < list.size(); ++i)
      read_pretokenizer(f, list[i], at + ".pretokenizers[" + std::to_string(i) + "]", t, byte_level);
  } else if (type == "Split") {
    if (f.flag(node, at, "invert", false)) f.fail(at + ".invert", "true is not supported");
    const std::string behavior = f.string_at(node, at, "behavior");
    if (behavior != "Isolated" && behavior != "Removed")
      f.fail(at + ".behavior", "\"" + behavior + "\" is not supported (Isolated and Removed are)");
    const Json& pattern = f.member(node, at, "pattern");
    std::string regex;
    if (pattern.is_object() && pattern.contains("Regex") && pattern["Regex"].is_string())
      regex = pattern["Regex"].get<std::string>();
    else if (pattern.is_object() && pattern.contains("String") && pattern["String"].is_string())
      regex = "\\Q" + pattern["String"].get<std::string>() + "\\E";
    else
      f.fail(at + ".pattern", "expected {\"Regex\": ...} or {\"String\": ...}");
    t.pretokenizer.push_back({behavior == "Isolated" ? HfPretokenStep::SplitIsolated : HfPretokenStep::SplitRemoved,
                              std::make_shared<RegexPattern>(regex, f.path + ": " + at + ".pattern")});
  } else if (type == "ByteLevel") {
    if (f.flag(node, at, "add_prefix_space", false)) t.pretokenizer.push_back({HfPretokenStep::PrefixSpace, nullptr});
    if (f.flag(node, at, "use_regex", true))
      t.pretokenizer.push_back(
          {HfPretokenStep::SplitIsolated, std::make_shared<RegexPattern>(kByteLevelPattern, "ByteLevel's pattern")});
    byte_level = true;
  } else {
    f.unsupported(at + ".type", node);
  }
}

// ---- post-processor ------------------------------------------------------------------------

// Adds the processor's tokens around the sequence: prefix ids before it, suffix ids after.
void read_post_processor(const JsonFile& f, const Json& node, const std::string& at, HfTables& t) {
  if (node.is_null()) return;
  const std::string type = JsonFile::type_of(node);
  if (type == "Sequence") {
    const Json& list = f.member(node, at, "processors");
    for (size_t i = 0; i < list.size(); ++i)
      read_post_processor(f, list[i], at + ".processors[" + std::to_string(i) + "]", t);
  } else if (type == "ByteLevel") {
    // Only adjusts offsets.
  } else if (type == "TemplateProcessing") {
    const Json& single = f.member(node, at, "single");
    const Json& specials = f.member(node, at, "special_tokens");
    std::vector<int32_t> before, after;
    bool seen_sequence = false;
    for (size_t i = 0; i < single.size(); ++i) {
      const std::string item_at = at + ".single[" + std::to_string(i) + "]";
      const Json& item = single[i];
      if (item.contains("Sequence")) {
        if (f.string_at(item["Sequence"], item_at + ".Sequence", "id") != "A")
          f.fail(item_at, "a single-sequence template can only use sequence A");
        seen_sequence = true;
        continue;
      }
      const std::string name = f.string_at(f.member(item, item_at, "SpecialToken"), item_at + ".SpecialToken", "id");
      if (!specials.contains(name)) f.fail(item_at, "names \"" + name + "\", which special_tokens does not define");
      const Json& ids = f.member(specials[name], at + ".special_tokens[\"" + name + "\"]", "ids");
      for (const Json& id : ids) (seen_sequence ? after : before).push_back(f.id_at(id, at + ".special_tokens"));
    }
    if (!seen_sequence) f.fail(at + ".single", "has no {\"Sequence\": {\"id\": \"A\"}}");
    t.prefix_ids.insert(t.prefix_ids.begin(), before.begin(), before.end());
    t.suffix_ids.insert(t.suffix_ids.end(), after.begin(), after.end());
  } else if (type == "RobertaProcessing" || type == "BertProcessing") {
    const Json& cls = f.member(node, at, "cls");
    const Json& sep = f.member(node, at, "sep");
    if (!cls.is_array() || cls.size() != 2 || !sep.is_array() || sep.size() != 2)
      f.fail(at, "cls and sep must be [token, id]");
    t.prefix_ids.insert(t.prefix_ids.begin(), f.id_at(cls[1], at + ".cls"));
    t.suffix_ids.push_back(f.id_at(sep[1], at + ".sep"));
  } else {
    f.unsupported(at + ".type", node);
  }
}

// ---- added tokens --------------------------------------------------------------------------

void read_added_tokens(const JsonFile& f, HfTables& t, std::unordered_map<std::string, int32_t>& all_tokens) {
  if (!f.root.contains("added_tokens") || f.root["added_tokens"].is_null()) return;
  const Json& list = f.root["added_tokens"];
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string at = "added_tokens[" + std::to_string(i) + "]";
    const Json& a = list[i];
    if (f.flag(a, at, "single_word", false)) f.fail(at + ".single_word", "true is not supported");
    HfAddedToken tok;
    tok.content = f.string_at(a, at, "content");
    tok.id = f.id_at(f.member(a, at, "id"), at + ".id");
    tok.lstrip = f.flag(a, at, "lstrip", false);
    tok.rstrip = f.flag(a, at, "rstrip", false);
    tok.normalized = f.flag(a, at, "normalized", !f.flag(a, at, "special", false));
    if (tok.content.empty()) f.fail(at + ".content", "is empty");
    all_tokens[tok.content] = tok.id;
    if (tok.normalized) {
      tok.content = normalize(t.normalizers, tok.content);
      t.normalized_added.tokens.push_back(std::move(tok));
    } else {
      t.raw_added.tokens.push_back(std::move(tok));
    }
  }
}

// ---- tokenizer_config.json / special_tokens_map.json ---------------------------------------

// The special tokens transformers' AutoTokenizer gives the tokenizer, by attribute name.
struct SpecialTokens {
  std::vector<std::pair<std::string, std::string>> named;  // bos_token, eos_token, ... in transformers' order
  std::vector<std::string> additional;
};

std::optional<std::string> token_text(const JsonFile& f, const Json& v, const std::string& at) {
  if (v.is_null()) return std::nullopt;
  if (v.is_string()) return v.get<std::string>();
  return f.string_at(v, at, "content");  // an AddedToken written as a dict
}

// The tokenizer class transformers' AutoTokenizer builds, when its tokenizer is tokenizer.json
// itself: PreTrainedTokenizerFast (transformers 4), TokenizersBackend (what transformers 5's
// save_pretrained writes for it) and Qwen2Tokenizer(Fast), whose pipeline in transformers 5 is
// the one Qwen2's tokenizer.json holds. Other classes rebuild parts of the tokenizer in Python
// (GPT-2's and Llama's pre-tokenizer or template), and a backend other than "tokenizers"
// (transformers 5's sentencepiece one) never reads tokenizer.json: errors naming the class.
std::string check_tokenizer_class(const JsonFile& config) {
  const std::string cls = config.root.value("tokenizer_class", std::string("PreTrainedTokenizerFast"));
  if (cls != "PreTrainedTokenizerFast" && cls != "TokenizersBackend" && cls != "Qwen2Tokenizer" &&
      cls != "Qwen2TokenizerFast")
    config.fail("tokenizer_class", "\"" + cls +
                                       "\" is not supported (PreTrainedTokenizerFast, TokenizersBackend and "
                                       "Qwen2Tokenizer(Fast) are; other classes change the tokenizer in Python, e.g. "
                                       "GPT-2's and Llama's rewrite the pre-tokenizer or the template)");
  if (auto backend = config.root.find("backend"); backend != config.root.end() && *backend != "tokenizers")
    config.fail("backend", backend->dump() + " is not supported: only the \"tokenizers\" backend reads "
                                             "tokenizer.json");
  return cls;
}

SpecialTokens read_special_tokens(const std::string& dir) {
  const std::string config_path = dir + "/tokenizer_config.json";
  if (!exists(config_path))
    throw runtime_error(dir + " has no tokenizer_config.json, without which transformers' AutoTokenizer (what "
                        "Megatron's HuggingFaceTokenizer calls) cannot load the tokenizer",
                        "save the tokenizer with transformers (save_pretrained), or add a tokenizer_config.json "
                        "with \"tokenizer_class\": \"PreTrainedTokenizerFast\" and the \"eos_token\"");
  const JsonFile config = read_json(config_path, "tokenizer config");
  static const char* kAttributes[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                      "pad_token", "cls_token", "mask_token"};
  std::unordered_map<std::string, Json> values;  // what the class defaults, then the files say
  const std::string cls = check_tokenizer_class(config);
  if (cls == "Qwen2Tokenizer" || cls == "Qwen2TokenizerFast")
    for (const char* k : {"unk_token", "eos_token", "pad_token"}) values[k] = "<|endoftext|>";
  for (const char* k : kAttributes)
    if (config.root.contains(k)) values[k] = config.root[k];
  // transformers 4 writes additional_special_tokens, 5 a list extra_special_tokens (4's
  // extra_special_tokens is a dict of named tokens, always empty for these classes).
  Json additional = config.root.value("additional_special_tokens", Json::array());
  if (auto extra = config.root.find("extra_special_tokens"); extra != config.root.end() && extra->is_array())
    additional = *extra;
  const std::string map_path = dir + "/special_tokens_map.json";
  if (exists(map_path)) {  // transformers lets this file override tokenizer_config.json
    const JsonFile map = read_json(map_path, "special tokens map");
    for (const char* k : kAttributes)
      if (map.root.contains(k)) values[k] = map.root[k];
    if (map.root.contains("additional_special_tokens")) additional = map.root["additional_special_tokens"];
  }
  SpecialTokens s;
  for (const char* k : kAttributes)
    if (auto it = values.find(k); it != values.end())
      if (auto text = token_text(config, it->second, k)) s.named.emplace_back(k, *text);
  for (size_t i = 0; i < additional.size(); ++i)
    if (auto text = token_text(config, additional[i], "additional_special_tokens[" + std::to_string(i) + "]"))
      s.additional.push_back(*text);
  return s;
}

// transformers adds a special token that the tokenizer lacks as a new added token, with the id
// tokenizers' AddedVocabulary gives it (after the model's vocabulary and the added tokens).
int32_t add_missing_token(HfTables& t, std::unordered_map<std::string, int32_t>& all_tokens,
                          const std::string& content, int32_t model_vocab_size) {
  if (auto it = all_tokens.find(content); it != all_tokens.end()) return it->second;
  int32_t max_added = -1;
  for (const AddedTokenSet* set : {&t.raw_added, &t.normalized_added})
    for (const HfAddedToken& a : set->tokens) max_added = std::max(max_added, a.id);
  const int32_t id = max_added < 0 ? model_vocab_size
                     : (max_added >= model_vocab_size || model_vocab_size == 0) ? max_added + 1
                                                                                 : model_vocab_size;
  t.raw_added.tokens.push_back(HfAddedToken{content, id, false, false, false});
  all_tokens[content] = id;
  return id;
}

void fill_decoding(HfTables& t, const std::unordered_map<std::string, int32_t>& all_tokens) {
  t.max_id = 0;
  for (const auto& [piece, id] : all_tokens) t.max_id = std::max(t.max_id, id);
  t.bytes_of_id.assign(static_cast<size_t>(t.max_id) + 1, "");
  t.has_id.assign(static_cast<size_t>(t.max_id) + 1, 0);
  for (const auto& [bytes, id] : t.id_of_bytes) {
    t.bytes_of_id[id] = bytes;
    t.has_id[id] = 1;
  }
  for (const AddedTokenSet* set : {&t.raw_added, &t.normalized_added})
    for (const HfAddedToken& a : set->tokens) {
      t.bytes_of_id[a.id] = a.content;
      t.has_id[a.id] = 1;
    }
}

void check_template_id(const HfTables& t, int32_t id, const std::string& path) {
  if (id > t.max_id || !t.has_id[id])
    throw runtime_error(path + ": post_processor: token id " + std::to_string(id) + " is not in the vocabulary",
                        "the template's special tokens must be tokens of model.vocab or added_tokens");
}

}  // namespace

void AddedTokenSet::index() {
  for (auto& v : by_first_byte) v.clear();
  for (uint32_t i = 0; i < tokens.size(); ++i)
    by_first_byte[static_cast<unsigned char>(tokens[i].content[0])].push_back(i);
  for (auto& v : by_first_byte)  // longest first: leftmost-longest matching takes the first hit
    std::stable_sort(v.begin(), v.end(),
                     [&](uint32_t a, uint32_t b) { return tokens[a].content.size() > tokens[b].content.size(); });
}

std::shared_ptr<const HfTables> load_hf_tables(const std::string& dir) {
  const std::string json_path = dir + "/tokenizer.json";
  struct stat st {};
  if (stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    throw usage_error("--tokenizer-model " + dir + " is not a folder",
                      "HuggingFaceTokenizer takes the folder holding tokenizer.json and tokenizer_config.json "
                      "(tessera never downloads from the Hugging Face hub)");
  if (!exists(json_path))
    throw runtime_error(dir + " has no tokenizer.json",
                        "tessera reads the fast tokenizer's tokenizer.json; save the tokenizer with transformers or "
                        "tokenizers to write it");
  const JsonFile f = read_json(json_path, "tokenizer.json");
  auto t = std::make_shared<HfTables>();
  std::unordered_map<std::string, int32_t> all_tokens;  // model vocabulary and added tokens
  int32_t model_vocab_size = 0;
  try {
    read_bpe_model(f, *t, all_tokens);
    model_vocab_size = static_cast<int32_t>(all_tokens.size());
    read_normalizer(f, f.root.value("normalizer", Json()), "normalizer", *t);
    bool byte_level = false;
    if (!f.root.contains("pre_tokenizer") || f.root["pre_tokenizer"].is_null())
      f.fail("pre_tokenizer", "is null; a byte-level BPE needs the ByteLevel pre-tokenizer");
    read_pretokenizer(f, f.root["pre_tokenizer"], "pre_tokenizer", *t, byte_level);
    if (!byte_level) f.fail("pre_tokenizer", "has no ByteLevel step; tessera implements byte-level BPE only");
    read_post_processor(f, f.root.value("post_processor", Json()), "post_processor", *t);
    read_added_tokens(f, *t, all_tokens);
  } catch (const Json::exception& e) {  // a value of the wrong JSON type somewhere the checks above do not look
    throw runtime_error(json_path + ": unexpected JSON structure (" + e.what() + ")", kSupported);
  }

  const SpecialTokens special = read_special_tokens(dir);
  for (const auto& [name, content] : special.named) add_missing_token(*t, all_tokens, content, model_vocab_size);
  for (const std::string& content : special.additional) add_missing_token(*t, all_tokens, content, model_vocab_size);
  for (const auto& [name, content] : special.named) {
    if (name == "eos_token") t->eos = all_tokens.at(content);
    if (name == "bos_token") t->bos = all_tokens.at(content);
    if (name == "pad_token") t->pad = all_tokens.at(content);
  }
  if (std::none_of(special.named.begin(), special.named.end(), [](const auto& p) { return p.first == "eos_token"; }))
    throw runtime_error(dir + "/tokenizer_config.json names no eos_token, whose id Megatron's "
                        "HuggingFaceTokenizer uses as EOD",
                        "set \"eos_token\" in tokenizer_config.json (Llama-3: \"<|end_of_text|>\")");
  t->raw_added.index();
  t->normalized_added.index();
  t->vocab_size = static_cast<int64_t>(all_tokens.size());
  fill_decoding(*t, all_tokens);
  for (int32_t id : t->prefix_ids) check_template_id(*t, id, json_path);
  for (int32_t id : t->suffix_ids) check_template_id(*t, id, json_path);
  if (t->max_id >= t->vocab_size)
    throw runtime_error(json_path + ": token id " + std::to_string(t->max_id) + " is not below the vocabulary size " +
                            std::to_string(t->vocab_size) +
                            " (len(tokenizer)), by which Megatron sizes the embedding: the ids have gaps",
                        "renumber the tokens 0..N-1");
  return t;
}

}  // namespace tessera::data
