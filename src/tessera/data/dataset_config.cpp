#include "tessera/data/dataset_config.h"

#include "tessera/core/python_format.h"

#include <openssl/evp.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <sstream>

#include <nlohmann/json.hpp>

#include "tessera/core/error.h"
#include "tessera/data/file_util.h"

namespace tessera::data {

const char* split_name(Split split) {
  switch (split) {
    case Split::Train: return "train";
    case Split::Valid: return "valid";
    case Split::Test: return "test";
  }
  return "?";
}

// ---- Python-compatible JSON ---------------------------------------------------------------

std::string json_float_repr(double value) {
  if (std::isnan(value)) return "NaN";  // json.dumps spelling; repr() would say "nan"
  if (std::isinf(value)) return value > 0 ? "Infinity" : "-Infinity";
  return python_float_repr(value);
}

int64_t python_round(double value) { return static_cast<int64_t>(std::nearbyint(value)); }

namespace {

double pairwise_sum(const double* a, size_t n) {
  if (n < 8) {
    double res = 0.0;
    for (size_t i = 0; i < n; ++i) res += a[i];
    return res;
  }
  if (n <= 128) {
    double r[8];
    for (int j = 0; j < 8; ++j) r[j] = a[j];
    size_t i = 8;
    for (; i < n - (n % 8); i += 8)
      for (int j = 0; j < 8; ++j) r[j] += a[i + j];
    double res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    for (; i < n; ++i) res += a[i];
    return res;
  }
  size_t n2 = n / 2;
  n2 -= n2 % 8;
  return pairwise_sum(a, n2) + pairwise_sum(a + n2, n - n2);
}

// json.dumps' ensure_ascii string encoding of UTF-8 text; bytes that are not valid UTF-8 are
// written as the lone surrogates Python's surrogateescape would give them (\udcXX).
void append_json_string(std::string& out, const std::string& s) {
  auto hex4 = [&](unsigned v) {
    char b[8];
    std::snprintf(b, sizeof(b), "\\u%04x", v);
    out += b;
  };
  out += '"';
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t n = s.size();
  for (size_t i = 0; i < n;) {
    unsigned char c = p[i];
    if (c < 0x80) {
      switch (c) {
        case '"': out += "\\\""; break;
        case '\\': out += "\\\\"; break;
        case '\n': out += "\\n"; break;
        case '\r': out += "\\r"; break;
        case '\t': out += "\\t"; break;
        case '\b': out += "\\b"; break;
        case '\f': out += "\\f"; break;
        default:
          if (c < 0x20) hex4(c);
          else out += static_cast<char>(c);
      }
      ++i;
      continue;
    }
    // Decode one UTF-8 sequence.
    int len = (c >= 0xf0 && c <= 0xf4) ? 4 : (c >= 0xe0) ? 3 : (c >= 0xc2 && c < 0xe0) ? 2 : 0;
    uint32_t cp = 0;
    bool ok = len > 0 && i + len <= n;
    if (ok) {
      cp = c & (len == 2 ? 0x1f : len == 3 ? 0x0f : 0x07);
      for (int k = 1; k < len; ++k) {
        if ((p[i + k] & 0xc0) != 0x80) ok = false;
        cp = (cp << 6) | (p[i + k] & 0x3f);
      }
      if (ok && ((len == 3 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) || (len == 4 && (cp < 0x10000 || cp > 0x10ffff))))
        ok = false;
    }
    if (!ok) {
      hex4(0xdc00u + c);
      ++i;
      continue;
    }
    if (cp >= 0x10000) {
      uint32_t v = cp - 0x10000;
      hex4(0xd800u + (v >> 10));
      hex4(0xdc00u + (v & 0x3ff));
    } else {
      hex4(cp);
    }
    i += static_cast<size_t>(len);
  }
  out += '"';
}

}  // namespace

double numpy_sum(const std::vector<double>& values) { return pairwise_sum(values.data(), values.size()); }

std::vector<double> normalize_weights(const std::vector<double>& weights) {
  double sum = numpy_sum(weights);
  std::vector<double> out(weights.size());
  for (size_t i = 0; i < weights.size(); ++i) out[i] = weights[i] / sum;
  return out;
}

std::string md5_hex(const std::string& text) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_Digest(text.data(), text.size(), digest, &len, EVP_md5(), nullptr) != 1)
    throw runtime_error("MD5 is not available from OpenSSL", "check the OpenSSL installation (libssl3)");
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned i = 0; i < len; ++i) {
    out += hex[digest[i] >> 4];
    out += hex[digest[i] & 15];
  }
  return out;
}

std::string PyJson::dumps(int indent) const {
  std::string out;
  dump(out, indent, 0);
  return out;
}

void PyJson::dump(std::string& out, int indent, int level) const {
  auto newline = [&](int lvl) {
    out += '\n';
    out.append(static_cast<size_t>(indent * lvl), ' ');
  };
  if (std::holds_alternative<std::monostate>(v_)) {
    out += "null";
  } else if (auto* b = std::get_if<bool>(&v_)) {
    out += *b ? "true" : "false";
  } else if (auto* i = std::get_if<int64_t>(&v_)) {
    out += std::to_string(*i);
  } else if (auto* f = std::get_if<Float>(&v_)) {
    out += json_float_repr(f->value);
  } else if (auto* s = std::get_if<std::string>(&v_)) {
    append_json_string(out, *s);
  } else if (auto* a = std::get_if<Array>(&v_)) {
    if (a->empty()) {
      out += "[]";
      return;
    }
    out += '[';
    for (size_t k = 0; k < a->size(); ++k) {
      if (k) out += ',';
      newline(level + 1);
      (*a)[k].dump(out, indent, level + 1);
    }
    newline(level);
    out += ']';
  } else if (auto* o = std::get_if<Object>(&v_)) {
    if (o->empty()) {
      out += "{}";
      return;
    }
    out += '{';
    for (size_t k = 0; k < o->size(); ++k) {
      if (k) out += ',';
      newline(level + 1);
      append_json_string(out, (*o)[k].first);
      out += ": ";
      (*o)[k].second.dump(out, indent, level + 1);
    }
    newline(level);
    out += '}';
  }
}

// ---- blends and splits --------------------------------------------------------------------

namespace {

std::string strip(const std::string& s) {
  // Python's str.strip(): whitespace as str.isspace() sees it (ASCII subset here).
  size_t b = 0, e = s.size();
  auto ws = [](unsigned char c) { return c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1c && c <= 0x1f); };
  while (b < e && ws(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && ws(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

// Python's float(str) for the forms that matter: decimal and exponent notation, inf/nan,
// surrounding whitespace, underscores between digits.
std::optional<double> python_float(const std::string& text) {
  std::string s = strip(text);
  if (s.empty()) return std::nullopt;
  std::string t;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '_') {
      if (i == 0 || i + 1 == s.size() || !std::isdigit(static_cast<unsigned char>(s[i - 1])) ||
          !std::isdigit(static_cast<unsigned char>(s[i + 1])))
        return std::nullopt;
      continue;
    }
    if (s[i] == 'x' || s[i] == 'X' || s[i] == 'p' || s[i] == 'P') return std::nullopt;  // no hex floats
    t += s[i];
  }
  char* end = nullptr;
  double v = std::strtod(t.c_str(), &end);
  if (end != t.c_str() + t.size()) return std::nullopt;
  return v;
}

}  // namespace

Blend blend_from_list(const std::vector<std::string>& items, const std::string& flag) {
  if (items.empty())
    throw usage_error(flag + " needs at least one dataset prefix",
                      "give a prefix (path/to/corpus_text_document) or weight/prefix pairs");
  Blend blend;
  std::vector<std::string> raw_prefixes;
  if (items.size() % 2 == 1) {
    raw_prefixes = items;
  } else {
    std::vector<std::optional<double>> weights;
    for (size_t i = 0; i < items.size(); i += 2) {
      weights.push_back(python_float(items[i]));
      raw_prefixes.push_back(items[i + 1]);
    }
    // `any(is_none)` then `all(is_none)` over the same iterator: after the first weight that
    // does not parse, none of the later ones may parse.
    auto first_bad = std::find_if(weights.begin(), weights.end(), [](const auto& w) { return !w.has_value(); });
    if (first_bad != weights.end()) {
      for (auto it = first_bad + 1; it != weights.end(); ++it)
        if (it->has_value())
          throw usage_error(flag + " mixes weights and prefixes: '" + items[2 * (it - weights.begin())] +
                                "' is a number but an earlier weight position holds a path",
                            "give either prefixes only, or weight/prefix pairs");
      raw_prefixes = items;
    } else {
      std::vector<double> w;
      for (const auto& x : weights) w.push_back(*x);
      blend.weights = std::move(w);
    }
  }
  for (const auto& p : raw_prefixes) blend.prefixes.push_back(strip(p));
  return blend;
}

Blend blend_from_file(const std::string& path) {
  std::string text = read_file(path, "--data-args-path file");
  std::istringstream in(text);
  std::vector<std::string> items;
  for (std::string w; in >> w;) items.push_back(w);
  return blend_from_list(items, "--data-args-path " + path);
}

std::vector<double> parse_split_vector(const std::string& split) {
  static const std::regex number("[.0-9]+");
  std::vector<double> v;
  for (auto it = std::sregex_iterator(split.begin(), split.end(), number); it != std::sregex_iterator(); ++it) {
    auto f = python_float(it->str());
    if (!f) throw usage_error("--split '" + split + "': '" + it->str() + "' is not a number", "e.g. --split 949,50,1");
    v.push_back(*f);
  }
  if (v.size() > 3)
    throw usage_error("--split '" + split + "' has " + std::to_string(v.size()) + " numbers; at most 3 (train, valid, test)",
                      "e.g. --split 949,50,1");
  while (v.size() < 3) v.push_back(0.0);
  double sum = numpy_sum(v);
  if (!(sum > 0.0)) throw usage_error("--split '" + split + "' sums to zero", "e.g. --split 949,50,1");
  return normalize_weights(v);
}

SplitMatrix split_matrix_from_vector(const std::vector<double>& vector) {
  SplitMatrix m;
  // expansion = [0 (int), 0 + v0, (0 + v0) + v1, ...]
  double lo = 0.0;
  bool lo_int = true;
  for (size_t i = 0; i < 3; ++i) {
    double hi = lo + vector[i];
    if (!(hi <= lo)) m[i] = Bookend{lo, hi, lo_int};
    lo = hi;
    lo_int = false;
  }
  return m;
}

SplitMatrix split_matrix_from_string(const std::string& split) { return split_matrix_from_vector(parse_split_vector(split)); }

std::pair<int64_t, int64_t> split_range(const Bookend& b, int64_t n) {
  return {python_round(b.lo * static_cast<double>(n)), python_round(b.hi * static_cast<double>(n))};
}

// ---- sample counts ------------------------------------------------------------------------

SplitSizes requested_sample_counts(int64_t train_iters, std::optional<int64_t> train_samples,
                                   int64_t global_batch_size, int64_t eval_interval, int64_t eval_iters) {
  if (eval_interval <= 0) throw usage_error("--eval-interval must be positive", "e.g. --eval-interval 1000");
  SplitSizes s;
  s[0] = (train_samples && *train_samples > 0) ? *train_samples : train_iters * global_batch_size;
  s[1] = (train_iters / eval_interval + 1) * eval_iters * global_batch_size;
  s[2] = eval_iters * global_batch_size;
  return s;
}

std::string format_target_sizes(const SplitSizes& sizes) {
  auto v = [](const std::optional<int64_t>& x) { return x ? std::to_string(*x) : std::string("None"); };
  return " > datasets target sizes (minimum size):\n    train:      " + v(sizes[0]) + "\n    validation: " +
         v(sizes[1]) + "\n    test:       " + v(sizes[2]) + "\n";
}

// ---- tokenizer identity -------------------------------------------------------------------

PyJson TokenizerIdentity::to_json() const {
  PyJson::Object o;
  o.emplace_back("class", class_name);
  PyJson::Array paths_json;
  for (const auto& p : paths) paths_json.emplace_back(p);
  o.emplace_back("tokenizer_path", std::move(paths_json));
  for (const auto& [k, v] : options) o.emplace_back(k, v);
  return o;
}

TokenizerIdentity gpt2_bpe_tokenizer_identity(const std::string& vocab_file, const std::string& merge_file) {
  return {"_GPT2BPETokenizer", {vocab_file, merge_file}, {}};
}

TokenizerIdentity null_tokenizer_identity(int64_t vocab_size) {
  return {"_NullTokenizer", {std::nullopt}, {{"vocab_size", std::to_string(vocab_size)}}};
}

TokenizerIdentity tokenizer_identity(const TokenizerOptions& t) {
  if (t.type == "NullTokenizer") return null_tokenizer_identity(*t.vocab_size);
  if (t.type == "GPT2BPETokenizer") return gpt2_bpe_tokenizer_identity(t.vocab_file, t.merge_file);
  if (t.type == "HuggingFaceTokenizer") return {"_HuggingFaceTokenizer", {t.tokenizer_model}, {}};
  // _Llama2Tokenizer and _GPTSentencePieceTokenizer pass vocab_extra_ids=0 to their base class.
  return {"_" + t.type, {t.tokenizer_model}, {{"vocab_extra_ids", "0"}}};
}

// ---- configuration ------------------------------------------------------------------------

void GPTDatasetConfig::finalize() {
  if (sequence_length <= 1) throw usage_error("--seq-length must be at least 2 for GPT datasets", "e.g. --seq-length 1024");
  bool per_split = blend_per_split && std::any_of(blend_per_split->begin(), blend_per_split->end(),
                                                  [](const auto& b) { return b.has_value(); });
  if (per_split) {
    if (blend) throw usage_error("--data-path and --train/valid/test-data-path cannot be used together");
    if (split) throw usage_error("--split cannot be used with --train/valid/test-data-path",
                                 "each split has its own data; drop --split");
    for (const auto& b : *blend_per_split)
      if (b && b->weights && b->weights->size() != b->prefixes.size())
        throw usage_error("a per-split blend needs as many weights as prefixes");
    mock = false;
    split_matrix.reset();
  } else {
    blend_per_split.reset();
    if (blend) {
      if (blend->weights && blend->weights->size() != blend->prefixes.size())
        throw usage_error("--data-path needs as many weights as prefixes");
      if (!split) throw usage_error("--split must be given with --data-path", "e.g. --split 949,50,1");
      mock = false;
    } else {
      mock = true;
      split = "1,1,1";
    }
    split_matrix = split_matrix_from_string(*split);
  }
}

GPTDatasetConfig make_gpt_dataset_config(const DataArgs& a, TokenizerIdentity tokenizer, int64_t eod_id) {
  bool use_data_path = a.data_path.has_value() || a.data_args_path.has_value();
  bool use_per_split = a.train_data_path || a.valid_data_path || a.test_data_path || a.per_split_data_args_path;
  int sources = int(a.mock_data) + int(a.data_path.has_value() && !a.data_path->empty()) +
                int(a.train_data_path || a.valid_data_path || a.test_data_path);
  if (sources > 1)
    throw usage_error("give one data source: --mock-data, --data-path, or --train/valid/test-data-path",
                      "Megatron accepts a single data source in training mode");
  if (!use_data_path && !use_per_split && !a.mock_data)
    throw usage_error("no training data: give --data-path (or --train-data-path ...) or --mock-data");

  GPTDatasetConfig c;
  c.random_seed = a.seed;
  c.sequence_length = a.seq_length;
  c.path_to_cache = a.data_cache_path;
  c.tokenizer = std::move(tokenizer);
  c.eod_id = eod_id;
  c.reset_position_ids = a.reset_position_ids;
  c.reset_attention_mask = a.reset_attention_mask;
  c.eod_mask_loss = a.eod_mask_loss;
  c.renormalize_blend_weights = a.renormalize_blend_weights;
  c.split = a.split;
  if (use_data_path) {
    if (a.data_args_path) {
      if (a.data_path) throw usage_error("--data-path and --data-args-path cannot be used together");
      c.blend = blend_from_file(*a.data_args_path);
    } else {
      c.blend = blend_from_list(*a.data_path, "--data-path");
    }
    if (!c.split) {
      std::fprintf(stderr,
                   "WARNING: Use --split with --data-path; the legacy default split '969, 30, 1' "
                   "is used for now.\n");
      c.split = "969, 30, 1";
    }
  } else if (use_per_split) {
    std::array<std::optional<Blend>, 3> per;
    if (a.per_split_data_args_path) {
      std::string text = read_file(*a.per_split_data_args_path, "--per-split-data-args-path file");
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(text);
      } catch (const std::exception& e) {
        throw usage_error(*a.per_split_data_args_path + ": not valid JSON: " + e.what(),
                          "expected {\"train\": [...], \"valid\": [...], \"test\": [...]}");
      }
      const char* keys[3] = {"train", "valid", "test"};
      for (int i = 0; i < 3; ++i) {
        if (!j.contains(keys[i]))
          throw usage_error(*a.per_split_data_args_path + ": missing key '" + keys[i] + "'");
        const auto& v = j[keys[i]];
        if (v.is_null()) continue;
        std::vector<std::string> items;
        if (v.is_string()) {
          std::istringstream in(v.get<std::string>());
          for (std::string w; in >> w;) items.push_back(w);
        } else if (v.is_array()) {
          for (const auto& x : v) items.push_back(x.is_string() ? x.get<std::string>() : x.dump());
        } else {
          throw usage_error(*a.per_split_data_args_path + ": '" + keys[i] + "' must be a list or a string");
        }
        per[i] = blend_from_list(items, std::string("--per-split-data-args-path ") + keys[i]);
      }
    } else {
      const std::optional<std::vector<std::string>>* lists[3] = {&a.train_data_path, &a.valid_data_path, &a.test_data_path};
      const char* flags[3] = {"--train-data-path", "--valid-data-path", "--test-data-path"};
      for (int i = 0; i < 3; ++i)
        if (*lists[i]) per[i] = blend_from_list(**lists[i], flags[i]);
    }
    c.blend_per_split = per;
  }
  c.finalize();
  return c;
}

}  // namespace tessera::data
