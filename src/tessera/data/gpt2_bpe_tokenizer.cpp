#include "tessera/data/gpt2_bpe_tokenizer.h"

#include <simdjson.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cstdio>
#include <cstring>
#include <unordered_map>

#include "tessera/core/error.h"
#include "tessera/data/bpe_merge.h"
#include "tessera/data/file_util.h"
#include "tessera/data/gpt2_pretokenizer.h"
#include "tessera/data/json_util.h"
#include "tessera/data/utf8.h"

namespace tessera::data {
namespace {

// Python's str.split() separators (str.isspace).
bool is_python_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
         c == 0x202F || c == 0x205F || c == 0x3000;
}

std::vector<std::string_view> python_split(std::string_view s) {
  std::vector<std::string_view> parts;
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t i = 0, start = 0;
  bool in_word = false;
  while (i < s.size()) {
    size_t len;
    char32_t c = utf8::decode_valid(p + i, len);
    if (is_python_space(c)) {
      if (in_word) parts.push_back(s.substr(start, i - start));
      in_word = false;
    } else if (!in_word) {
      in_word = true;
      start = i;
    }
    i += len;
  }
  if (in_word) parts.push_back(s.substr(start));
  return parts;
}

}  // namespace

struct Gpt2Tables {
  // Symbols are interned strings (vocab keys, bytes, merge parts and results).
  std::unordered_map<std::string, int32_t> symbol_of;
  std::vector<int32_t> symbol_vocab_id;  // Megatron: encoder.get(token, 0)
  std::array<int32_t, 256> byte_symbol{};
  std::array<int32_t, 256> byte_token{};  // the vocab id of each byte's symbol
  MergeTable merges;
  // Decoding, by vocab id.
  std::vector<std::string> piece_of_id;  // vocab.json key
  std::vector<std::string> bytes_of_id;  // its bytes through the byte decoder
  std::vector<uint8_t> id_state;         // 0 unknown id, 1 decodable, 2 piece outside the byte map
  int64_t vocab_size = 0;
  int32_t eod = 0;
  // Symbols below this index are vocab.json keys (load_vocab interns them first).
  size_t vocab_symbols = 0;

  bool in_vocab(int32_t symbol) const { return static_cast<size_t>(symbol) < vocab_symbols; }

  int32_t intern(std::string s) {
    auto [it, inserted] = symbol_of.emplace(std::move(s), static_cast<int32_t>(symbol_vocab_id.size()));
    if (inserted) symbol_vocab_id.push_back(0);
    return it->second;
  }
};

namespace {

[[noreturn]] void file_error(const std::string& file, TextPosition pos, bool with_column,
                             const std::string& msg, const std::string& hint) {
  std::string where = file + ":" + std::to_string(pos.line);
  if (with_column) where += ":" + std::to_string(pos.column);
  throw runtime_error(where + ": " + msg, hint);
}

std::string in_quotes(std::string_view s) {
  std::string quoted(1, '"');  // appended piece by piece: GCC 12 warns (-Wrestrict) on "\"" + std::string
  quoted.append(s.substr(0, 80));
  quoted += '"';
  return quoted;
}

// Where a vocab.json key is written (its first quoted occurrence), for error messages.
TextPosition key_position(std::string_view text, std::string_view key) {
  size_t off = text.find(in_quotes(key));
  return off == std::string_view::npos ? TextPosition{} : advance_position(text, off);
}

constexpr const char* kVocabHint = "--vocab-file must be GPT-2's vocab.json (a JSON object of token -> id)";
constexpr const char* kMergesHint =
    "--merge-file must be GPT-2's merges.txt (a \"#version\" header line, then one \"a b\" pair per line) "
    "and belong to --vocab-file";

// The ids must number the tokens 0..N-1 once each (Megatron sizes the embedding by the token
// count), and every byte needs its token (byte-level BPE starts from them).
void check_vocab_ids(const Gpt2Tables& t, const std::string& path, std::string_view text,
                     const std::vector<std::string>& order, const std::unordered_map<std::string, int64_t>& vocab) {
  std::vector<const std::string*> token_of_id(vocab.size(), nullptr);
  for (const std::string& key : order) {
    const int64_t id = vocab.at(key);
    if (id >= t.vocab_size)
      file_error(path, key_position(text, key), true,
                 "token " + in_quotes(key) + " has id " + std::to_string(id) + ", but the file holds only " +
                     std::to_string(t.vocab_size) + " tokens (the ids must be 0.." + std::to_string(t.vocab_size - 1) +
                     ", each once)",
                 kVocabHint);
    if (token_of_id[id])
      file_error(path, key_position(text, key), true,
                 "token " + in_quotes(key) + " has id " + std::to_string(id) + ", which token " +
                     in_quotes(*token_of_id[id]) + " has too (the ids must be 0.." + std::to_string(t.vocab_size - 1) +
                     ", each once)",
                 kVocabHint);
    token_of_id[id] = &key;
  }
}

void check_byte_tokens(const std::unordered_map<std::string, int64_t>& vocab, const std::string& path,
                       const std::array<char32_t, 256>& byte_map) {
  for (int b = 0; b < 256; ++b) {
    std::string s;
    utf8::append(s, byte_map[b]);
    if (!vocab.count(s)) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "0x%02X", b);
      throw runtime_error(path + ": has no token for the byte " + hex + " (" + in_quotes(s) +
                              "): it is not a byte-level BPE vocabulary",
                          kVocabHint);
    }
  }
}

void load_vocab(Gpt2Tables& t, const std::string& path) {
  std::string text = read_file(path, "vocab file");
  std::string hint = kVocabHint;
  if (text.starts_with("#version")) hint += "; this file looks like merges.txt: are --vocab-file and --merge-file swapped?";
  if (size_t bad = utf8::find_invalid(text); bad != utf8::npos)
    file_error(path, advance_position(text, bad), true, "invalid UTF-8", hint);
  simdjson::dom::parser parser;
  simdjson::dom::element root;
  if (auto err = parser.parse(text).get(root)) {
    JsonSyntaxError e;
    if (describe_json_error(text, e))
      file_error(path, advance_position(text, e.offset), true, "malformed JSON: " + e.message, hint);
    throw runtime_error(path + ": malformed JSON: " + simdjson::error_message(err), hint);
  }
  simdjson::dom::object obj;
  if (root.get_object().get(obj)) throw runtime_error(path + ": expected a JSON object of token -> id", hint);
  std::unordered_map<std::string, int64_t> vocab;  // json.load: the last duplicate key wins
  std::vector<std::string> order;
  for (auto field : obj) {
    int64_t id;
    if (field.value.get_int64().get(id) || id < 0 || id >= (int64_t{1} << 24))
      file_error(path, key_position(text, field.key), true,
                 "the id of token " + in_quotes(field.key) + " is not an integer in [0, 2^24)", hint);
    std::string key(field.key);
    if (vocab.emplace(key, id).second) order.push_back(key);
    else vocab[key] = id;
  }
  t.vocab_size = static_cast<int64_t>(vocab.size());
  check_vocab_ids(t, path, text, order, vocab);
  check_byte_tokens(vocab, path, byte_level_alphabet());
  t.piece_of_id.assign(static_cast<size_t>(t.vocab_size), "");
  t.bytes_of_id.assign(static_cast<size_t>(t.vocab_size), "");
  t.id_state.assign(static_cast<size_t>(t.vocab_size), 0);
  for (const std::string& key : order) {
    int64_t id = vocab[key];
    int32_t sym = t.intern(key);
    t.symbol_vocab_id[sym] = static_cast<int32_t>(id);
    t.piece_of_id[id] = key;
  }
  t.vocab_symbols = t.symbol_vocab_id.size();
  auto it = vocab.find("<|endoftext|>");
  if (it == vocab.end())
    throw runtime_error(path + ": has no \"<|endoftext|>\" token, which GPT-2 uses as EOD", hint);
  t.eod = static_cast<int32_t>(it->second);
}

// The lines of a file split at '\n' (Python's split('\n'): a final newline gives an empty last line).
std::vector<std::string_view> split_lines(std::string_view text) {
  std::vector<std::string_view> lines;
  size_t start = 0;
  while (true) {
    size_t nl = text.find('\n', start);
    if (nl == std::string_view::npos) {
      lines.push_back(text.substr(start));
      return lines;
    }
    lines.push_back(text.substr(start, nl - start));
    start = nl + 1;
  }
}

// Every vocab token is a byte, a special token ("<|endoftext|>") or made by a merge; one that
// none of these can produce means merges are missing (a copy truncated at a line boundary)
// or the merges belong to another vocabulary.
void check_every_token_made(const Gpt2Tables& t, const std::vector<uint8_t>& made, const std::string& path,
                            const std::string& vocab_path, size_t lines) {
  std::vector<uint8_t> reachable = made;
  for (int32_t sym : t.byte_symbol) reachable[t.symbol_vocab_id[sym]] = 1;
  int64_t unmade = 0, first = -1;
  for (int64_t id = 0; id < t.vocab_size; ++id) {
    const std::string& piece = t.piece_of_id[id];
    if (reachable[id] || (piece.starts_with("<") && piece.ends_with(">"))) continue;
    if (first < 0) first = id;
    ++unmade;
  }
  if (unmade > 0)
    throw runtime_error(path + ": after its " + std::to_string(lines - 1) + " lines, " + std::to_string(unmade) +
                            " tokens of " + vocab_path + " (the first: " + in_quotes(t.piece_of_id[first]) + ", id " +
                            std::to_string(first) +
                            ") are made by no merge: the merges file is truncated or belongs to another vocabulary",
                        kMergesHint);
}

// Megatron reads read().split('\n')[1:-1] whatever the lines hold, so a wrong file (the
// vocab.json, a truncated copy, another tokenizer's merges) would silently apply no or wrong
// merges: the header, the final newline and every merge's pieces are checked instead.
void load_merges(Gpt2Tables& t, const std::string& path, const std::string& vocab_path) {
  std::string text = read_file(path, "merge file");
  if (size_t bad = utf8::find_invalid(text); bad != utf8::npos)
    file_error(path, advance_position(text, bad), true, "invalid UTF-8", kMergesHint);
  const std::vector<std::string_view> lines = split_lines(text);
  if (!lines.front().starts_with("#version")) {
    std::string hint = kMergesHint;
    if (text.starts_with("{")) hint += "; this file looks like JSON: are --vocab-file and --merge-file swapped?";
    file_error(path, TextPosition{1, 1}, false,
               "expected the \"#version\" header line, found " + in_quotes(lines.front()), hint);
  }
  if (!lines.back().empty())
    file_error(path, TextPosition{lines.size(), 1}, false,
               "the last line " + in_quotes(lines.back()) +
                   " does not end with a newline: the file looks truncated (Megatron would drop this line)",
               "use a complete copy of the merges file");
  const size_t count = lines.size() - 2;
  if (count == 0) throw runtime_error(path + ": holds no merges, only the header", kMergesHint);
  t.merges.reserve(count);
  std::vector<uint8_t> made(static_cast<size_t>(t.vocab_size), 0);  // by vocab id: some merge makes it
  for (size_t r = 0; r < count; ++r) {
    const std::string_view line = lines[r + 1];
    const TextPosition at{r + 2, 1};
    auto parts = python_split(line);
    if (parts.size() != 2)
      file_error(path, at, false,
                 "expected two tokens separated by a space, found " + std::to_string(parts.size()) + " in " +
                     in_quotes(line),
                 kMergesHint);
    const std::string pieces[3] = {std::string(parts[0]), std::string(parts[1]),
                                   std::string(parts[0]) + std::string(parts[1])};  // a, b, merged
    int32_t symbol[3];
    for (int k = 0; k < 3; ++k) {
      symbol[k] = t.intern(pieces[k]);
      if (!t.in_vocab(symbol[k]))
        file_error(path, at, false,
                   "the merge " + in_quotes(line) + " uses or makes " + in_quotes(pieces[k]) +
                       ", which is not a token of " + vocab_path,
                   kMergesHint);
    }
    t.merges.set(symbol[0], symbol[1], MergeTable::Merge{static_cast<int32_t>(r), symbol[2]});  // dict(): last rank wins
    made[t.symbol_vocab_id[symbol[2]]] = 1;
  }
  check_every_token_made(t, made, path, vocab_path, lines.size());
}

}  // namespace

GPT2BPETokenizer::GPT2BPETokenizer(const std::string& vocab_file, const std::string& merge_file) {
  auto t = std::make_shared<Gpt2Tables>();
  load_vocab(*t, vocab_file);
  auto byte_map = byte_level_alphabet();
  std::array<int, 0x144> byte_of_char;
  byte_of_char.fill(-1);
  for (int b = 0; b < 256; ++b) {
    std::string s;
    utf8::append(s, byte_map[b]);
    t->byte_symbol[b] = t->intern(s);
    byte_of_char[byte_map[b]] = b;
  }
  for (size_t id = 0; id < t->piece_of_id.size(); ++id) {
    const std::string& piece = t->piece_of_id[id];
    if (piece.empty()) continue;
    std::string bytes;
    bool ok = true;
    const auto* p = reinterpret_cast<const unsigned char*>(piece.data());
    for (size_t i = 0; i < piece.size();) {
      size_t len;
      char32_t c = utf8::decode_valid(p + i, len);
      i += len;
      if (c >= byte_of_char.size() || byte_of_char[c] < 0) {
        ok = false;
        break;
      }
      bytes += static_cast<char>(byte_of_char[c]);
    }
    t->id_state[id] = ok ? 1 : 2;
    if (ok) t->bytes_of_id[id] = std::move(bytes);
  }
  load_merges(*t, merge_file, vocab_file);
  for (int b = 0; b < 256; ++b) t->byte_token[b] = t->symbol_vocab_id[t->byte_symbol[b]];
  tables_ = std::move(t);
  cache_ = std::make_unique<PretokenCache>(tables_->byte_token);
  gpt2_char_classes();  // build the class table now rather than inside the first encode
}

GPT2BPETokenizer::GPT2BPETokenizer(const GPT2BPETokenizer& other)
    : tables_(other.tables_), cache_(std::make_unique<PretokenCache>(tables_->byte_token)) {}

GPT2BPETokenizer::~GPT2BPETokenizer() = default;

int64_t GPT2BPETokenizer::vocab_size() const { return tables_->vocab_size; }
int32_t GPT2BPETokenizer::eod() const { return tables_->eod; }

std::unique_ptr<Tokenizer> GPT2BPETokenizer::clone() const {
  return std::make_unique<GPT2BPETokenizer>(*this);
}

std::string_view GPT2BPETokenizer::piece(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= tables_->piece_of_id.size()) return {};
  return tables_->piece_of_id[id];
}

void GPT2BPETokenizer::encode(std::string_view text, std::vector<int32_t>& out) {
  if (size_t bad = utf8::find_invalid(text); bad != utf8::npos)
    throw runtime_error("invalid UTF-8 at byte " + std::to_string(bad) + " of the text");
  const Gpt2Tables& t = *tables_;
  auto merge = [&t](std::string_view bytes, std::vector<int32_t>& word) {
    for (unsigned char b : bytes) word.push_back(t.byte_symbol[b]);
    bpe_merge(t.merges, word);
    for (int32_t& s : word) s = t.symbol_vocab_id[s];
  };
  std::array<std::string_view, PretokenCache::kBatch> batch;  // the cache looks a batch up at once
  size_t n = 0;
  gpt2_pretokenize(text, [&](std::string_view piece) {
    batch[n++] = piece;
    if (n == batch.size()) {
      cache_->append_ids(batch, out, merge);
      n = 0;
    }
  });
  cache_->append_ids(std::span(batch.data(), n), out, merge);
}

std::vector<int32_t> GPT2BPETokenizer::bpe_for_testing(std::string_view pretoken, bool heap) const {
  const Gpt2Tables& t = *tables_;
  std::vector<int32_t> word;
  for (unsigned char b : pretoken) word.push_back(t.byte_symbol[b]);
  if (heap) bpe_merge_heap(t.merges, word);
  else bpe_merge_rounds(t.merges, word);
  for (int32_t& s : word) s = t.symbol_vocab_id[s];
  return word;
}

std::string GPT2BPETokenizer::decode(std::span<const int32_t> ids) const {
  const Gpt2Tables& t = *tables_;
  std::string bytes;
  for (int32_t id : ids) {
    if (id < 0 || static_cast<size_t>(id) >= t.id_state.size() || t.id_state[id] == 0)
      throw runtime_error("cannot decode token id " + std::to_string(id) + ": not in the vocabulary");
    if (t.id_state[id] == 2)
      throw runtime_error("cannot decode token id " + std::to_string(id) +
                          ": its vocab entry has characters outside GPT-2's byte map");
    bytes += t.bytes_of_id[id];
  }
  return utf8::decode_with_replacement(bytes);
}

// ---- NullTokenizer --------------------------------------------------------------------

NullTokenizer::NullTokenizer(int64_t vocab_size_without_eod) : vocab_size_without_eod_(vocab_size_without_eod) {
  if (vocab_size_without_eod < 1 || vocab_size_without_eod >= INT32_MAX)
    throw usage_error("--vocab-size must be in [1, 2^31-1) for NullTokenizer, got " +
                      std::to_string(vocab_size_without_eod));
}

void NullTokenizer::encode(std::string_view text, std::vector<int32_t>& out) {
  if (text.empty()) return;
  // Python: [int(x) for x in text.split(' ')]; int() allows surrounding whitespace, a sign
  // and single underscores between digits.
  size_t start = 0;
  while (true) {
    size_t sp = text.find(' ', start);
    std::string_view piece = text.substr(start, sp == std::string_view::npos ? std::string_view::npos : sp - start);
    size_t a = 0, b = piece.size();
    auto ws = [](char c) { return c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r' || (c >= 0x1c && c <= 0x1f); };
    while (a < b && ws(piece[a])) ++a;
    while (b > a && ws(piece[b - 1])) --b;
    std::string_view num = piece.substr(a, b - a);
    bool negative = false;
    size_t i = 0;
    if (i < num.size() && (num[i] == '+' || num[i] == '-')) negative = num[i++] == '-';
    int64_t value = 0;
    bool ok = i < num.size(), prev_digit = false;
    for (; ok && i < num.size(); ++i) {
      char c = num[i];
      if (c >= '0' && c <= '9') {
        value = value * 10 + (c - '0');
        if (value > (int64_t{1} << 40)) value = int64_t{1} << 40;
        prev_digit = true;
      } else if (c == '_' && prev_digit && i + 1 < num.size() && num[i + 1] >= '0' && num[i + 1] <= '9') {
        prev_digit = false;
      } else {
        ok = false;
      }
    }
    if (!ok)
      throw runtime_error("NullTokenizer: \"" + std::string(piece.substr(0, 40)) +
                          "\" is not an integer (the text must be ids separated by single spaces)");
    if (negative) value = -value;
    if (value < 0 || value >= vocab_size())
      throw runtime_error("NullTokenizer: id " + std::to_string(value) + " is outside [0, " +
                          std::to_string(vocab_size()) + ") (--vocab-size " +
                          std::to_string(vocab_size_without_eod_) + " plus EOD)");
    out.push_back(static_cast<int32_t>(value));
    if (sp == std::string_view::npos) break;
    start = sp + 1;
  }
}

std::string NullTokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) out += ' ';
    out += std::to_string(ids[i]);
  }
  return out;
}

}  // namespace tessera::data
