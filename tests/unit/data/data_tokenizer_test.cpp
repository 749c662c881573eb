// GPT-2 BPE and Null tokenizers: the 27 ordinary vectors of expected_ids.json, the whole-corpus
// count and sha256 of tinyshakespeare, random Unicode round trips, the fast pre-tokenizer
// against the PCRE2 reference (random Unicode, and mostly-ASCII text with long runs) and its
// eight-byte ASCII class masks against the class table, the code point classes against
// python-regex's, and bad files.
#include <gtest/gtest.h>

#include "tessera/core/sha256.h"

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "tessera/core/error.h"
#include "tessera/data/gpt2_bpe_tokenizer.h"
#include "tessera/data/gpt2_pretokenizer.h"
#include "tessera/data/utf8.h"

namespace td = tessera::data;

namespace {

const std::string kData = std::string(TESSERA_SOURCE_DIR) + "/tests/data";

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

td::GPT2BPETokenizer& gpt2() {
  static td::GPT2BPETokenizer tok(kData + "/gpt2/vocab.json", kData + "/gpt2/merges.txt");
  return tok;
}

std::string sha256_hex(const void* data, size_t size) {
  return tessera::sha256_hex({static_cast<const unsigned char*>(data), size});
}

std::string write_temp(const std::string& name, const std::string& content) {
  std::string path = std::string(TESSERA_BINARY_DIR) + "/tokenizer_test_" + name;
  std::ofstream(path, std::ios::binary) << content;
  return path;
}

// Random strings mixing ASCII, whitespace of every kind, letters and marks of many scripts,
// digits, symbols, emoji and astral code points; always valid UTF-8.
std::string random_unicode(std::mt19937_64& rng, size_t max_chars) {
  static const std::vector<std::pair<char32_t, char32_t>> ranges = {
      {0x20, 0x7E},     {0x09, 0x0D},     {0x1C, 0x20},     {0x80, 0xFF},     {0x100, 0x24F},
      {0x300, 0x36F},   {0x370, 0x3FF},   {0x400, 0x4FF},   {0x590, 0x6FF},   {0x900, 0x97F},
      {0xE00, 0xE7F},   {0x1680, 0x1680}, {0x2000, 0x206F}, {0x2070, 0x218F}, {0x3000, 0x30FF},
      {0x4E00, 0x4E80}, {0xAC00, 0xAC80}, {0xFE00, 0xFFFD}, {0x1F300, 0x1F64F}, {0x10000, 0x1007F},
      {0x1D400, 0x1D7FF}, {0x20000, 0x20080}, {0xE0000, 0xE007F}, {0x10FFF0, 0x10FFFF}};
  std::uniform_int_distribution<size_t> pick(0, ranges.size() + 6);
  std::uniform_int_distribution<size_t> len(0, max_chars);
  std::string s;
  size_t n = len(rng);
  for (size_t i = 0; i < n; ++i) {
    size_t r = pick(rng);
    char32_t c;
    if (r >= ranges.size()) {
      static const char32_t common[] = {' ', ' ', '\'', 's', '\n', 'a', '1'};
      c = common[r - ranges.size()];
    } else {
      auto [a, b] = ranges[r];
      c = std::uniform_int_distribution<uint32_t>(a, b)(rng);
    }
    if (c >= 0xD800 && c <= 0xDFFF) c = 'x';
    td::utf8::append(s, c);
  }
  return s;
}

}  // namespace

TEST(DataTokenizer, Gpt2ExpectedIds) {
  auto cases = nlohmann::json::parse(slurp(kData + "/gpt2/expected_ids.json"));
  ASSERT_EQ(cases["cases"].size(), 27u);
  auto& tok = gpt2();
  EXPECT_EQ(tok.vocab_size(), 50257);
  EXPECT_EQ(tok.eod(), 50256);
  for (auto& c : cases["cases"]) {
    std::string text = c["text"];
    std::vector<int32_t> want = c["ids"].get<std::vector<int32_t>>();
    std::vector<int32_t> got = tok.encode(text);
    EXPECT_EQ(got, want) << c["name"];
    std::vector<std::string> pieces;
    for (int32_t id : got) pieces.emplace_back(tok.piece(id));
    EXPECT_EQ(pieces, c["pieces"].get<std::vector<std::string>>()) << c["name"];
    if (c.value("roundtrip", true)) {
      EXPECT_EQ(tok.decode(got), text) << c["name"];
    }
  }
  // The special cases only apply where special tokens are allowed; for Megatron's GPT-2
  // tokenizer "<|endoftext|>" in text is ordinary text.
  EXPECT_EQ(tok.encode("<|endoftext|>"), (std::vector<int32_t>{27, 91, 437, 1659, 5239, 91, 29}));
}

TEST(DataTokenizer, Gpt2TinyShakespeareCorpus) {
  auto meta = nlohmann::json::parse(slurp(kData + "/gpt2/expected_ids.json"))["corpora"][0];
  std::string text = slurp(kData + "/corpora/tinyshakespeare.txt");
  ASSERT_EQ(sha256_hex(text.data(), text.size()), meta["sha256"]);
  auto tok = gpt2().clone();
  std::vector<int32_t> ids = tok->encode(text);
  ASSERT_EQ(ids.size(), meta["tokens"].get<size_t>());
  std::vector<uint16_t> u16(ids.begin(), ids.end());  // little-endian host
  EXPECT_EQ(sha256_hex(u16.data(), u16.size() * 2), meta["ids_u16le_sha256"]);
  std::vector<int32_t> first(ids.begin(), ids.begin() + 20);
  EXPECT_EQ(first, meta["first_20_ids"].get<std::vector<int32_t>>());
  EXPECT_EQ(tok->decode(ids), text);
}

TEST(DataTokenizer, RandomUnicodeRoundTrip) {
  std::mt19937_64 rng(1234);
  auto tok = gpt2().clone();
  for (int i = 0; i < 3000; ++i) {
    std::string s = random_unicode(rng, 60);
    ASSERT_EQ(tok->decode(tok->encode(s)), s) << "case " << i;
  }
}

TEST(DataTokenizer, PretokenizerMatchesPcre2Reference) {
  // PCRE2 10.42 has Unicode 14 tables, ICU 72 (and python3-regex 2.5.123) Unicode 15: skip
  // strings with a code point whose class changed in Unicode 15 (none of the generator's
  // ranges has one today; the list is the whole difference, measured).
  static const std::pair<char32_t, char32_t> kUnicode15[] = {
      {0x1123F, 0x11240}, {0x11F00, 0x11F59}, {0x1342F, 0x13446}, {0x1B132, 0x1B132}, {0x1B155, 0x1B155},
      {0x1D2C0, 0x1D2D3}, {0x1DF25, 0x1DF2A}, {0x1E030, 0x1E06D}, {0x1E4D0, 0x1E4F9}, {0x2B739, 0x2B739},
      {0x31350, 0x323AF}};
  std::mt19937_64 rng(99);
  int compared = 0;
  for (int i = 0; i < 4000; ++i) {
    std::string s = random_unicode(rng, 40);
    bool unicode15 = false;
    const auto* p = reinterpret_cast<const unsigned char*>(s.data());
    for (size_t j = 0; j < s.size();) {
      size_t len;
      char32_t c = td::utf8::decode_valid(p + j, len);
      j += len;
      for (auto [a, b] : kUnicode15) unicode15 |= c >= a && c <= b;
    }
    if (unicode15) continue;
    std::vector<std::string_view> fast;
    td::gpt2_pretokenize(s, [&](std::string_view piece) { fast.push_back(piece); });
    ASSERT_EQ(fast, td::gpt2_pretokenize_regex(s)) << "case " << i;
    ++compared;
  }
  EXPECT_GT(compared, 3500);
  // Mostly ASCII, with runs longer than the eight bytes the scanner takes at a time, ending at
  // every offset, at the end of the text and at non-ASCII letters, digits, spaces and symbols.
  const std::vector<std::string> atoms = {"a", "Z", "q", "7", "0", "!", ".", "-", "\x1f", "\x7f", " ", "\n", "\t",
                                          "'s", "\xC3\xA9", "\xD9\xA3", "\xC2\xA0", "\xC2\xA9", "\xE4\xB8\xAD"};
  for (int i = 0; i < 3000; ++i) {
    std::string s;
    for (size_t runs = rng() % 8; runs > 0; --runs) {
      const std::string& atom = atoms[rng() % atoms.size()];
      for (size_t r = rng() % 20 + 1; r > 0; --r) s += atom;
    }
    std::vector<std::string_view> fast;
    td::gpt2_pretokenize(s, [&](std::string_view piece) { fast.push_back(piece); });
    ASSERT_EQ(fast, td::gpt2_pretokenize_regex(s)) << "ASCII case " << i;
  }
  // Pre-tokens of GPT-2's pattern under Python's `regex` module (findall), measured.
  auto pre = [](std::string_view s) {
    std::vector<std::string> out;
    td::gpt2_pretokenize(s, [&](std::string_view p) { out.emplace_back(p); });
    return out;
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(pre("Hello world"), (V{"Hello", " world"}));
  EXPECT_EQ(pre("I'm  here.\n\nNew para"), (V{"I", "'m", " ", " here", ".", "\n", "\n", "New", " para"}));
  EXPECT_EQ(pre("It's 2024!!! ok"), (V{"It", "'s", " 2024", "!!!", " ok"}));
  EXPECT_EQ(pre("a\t\tb"), (V{"a", "\t", "\t", "b"}));
  EXPECT_EQ(pre("x   "), (V{"x", "   "}));
  EXPECT_EQ(pre("  lead"), (V{" ", " lead"}));
  EXPECT_EQ(pre("<|endoftext|>"), (V{"<|", "endoftext", "|>"}));
}

TEST(DataTokenizer, CharClassesEqualPythonRegex) {
  // tests/data/gpt2/regex_char_classes.txt: "first last class" ranges written by
  // tests/reference/data/char_classes.py from python3-regex 2.5.123 (Unicode 15.0).
  std::ifstream f(kData + "/gpt2/regex_char_classes.txt");
  ASSERT_TRUE(f) << "missing regex_char_classes.txt";
  const td::CharClass* table = td::gpt2_char_classes();
  std::string a, b, k;
  uint32_t next = 0;
  while (f >> a >> b >> k) {
    uint32_t lo = std::stoul(a, nullptr, 16), hi = std::stoul(b, nullptr, 16);
    ASSERT_EQ(lo, next);
    td::CharClass want = k == "S" ? td::CharClass::Space : k == "L" ? td::CharClass::Letter
                         : k == "N" ? td::CharClass::Number : td::CharClass::Other;
    for (uint32_t c = lo; c <= hi; ++c) ASSERT_EQ(table[c], want) << std::hex << "U+" << c;
    next = hi + 1;
  }
  EXPECT_EQ(next, 0x110000u);
}

TEST(DataTokenizer, AsciiRunMasksAgreeWithTheClassTable) {
  // The scanner's eight-bytes-at-a-time class masks against the table, for every byte at every
  // position of a word, and for random words (a byte's neighbours must not change its bit).
  namespace pd = td::pretokenizer_detail;
  const td::CharClass* table = td::gpt2_char_classes();
  std::mt19937_64 rng(5);
  for (td::CharClass k : {td::CharClass::Letter, td::CharClass::Number, td::CharClass::Other}) {
    for (int trial = 0; trial < 20000; ++trial) {
      unsigned char w[8];
      for (auto& b : w) b = static_cast<unsigned char>(rng());
      if (trial < 256 * 8) w[trial % 8] = static_cast<unsigned char>(trial / 8);  // every byte, every position
      const uint64_t mask = pd::ascii_class_mask(w, k);
      for (int i = 0; i < 8; ++i) {
        const bool want = w[i] < 0x80 && table[w[i]] == k;
        ASSERT_EQ((mask >> (8 * i + 7)) & 1, uint64_t{want})
            << "class " << int(k) << ", byte 0x" << std::hex << int(w[i]) << " at " << i;
        ASSERT_EQ(mask & (uint64_t{0x7F} << (8 * i)), 0u);
      }
    }
  }
}

TEST(DataTokenizer, HeapBpeEqualsRoundBpe) {
  std::mt19937_64 rng(7);
  const char* alphabets[] = {"ab", "abc ", "0123456789", "=-", "etaoinshrdlu", "\xC3\xA9\xE4\xB8\xAD"};
  for (int i = 0; i < 300; ++i) {
    std::string alpha = alphabets[i % 6];
    std::string s;
    size_t n = std::uniform_int_distribution<size_t>(2, 400)(rng);
    if (i % 6 == 5) {  // whole UTF-8 characters
      for (size_t j = 0; j < n / 3; ++j) s += (rng() & 1) ? std::string("\xC3\xA9") : std::string("\xE4\xB8\xAD");
    } else {
      for (size_t j = 0; j < n; ++j) s += alpha[rng() % alpha.size()];
    }
    ASSERT_EQ(gpt2().bpe_for_testing(s, true), gpt2().bpe_for_testing(s, false)) << s;
  }
  std::string long_run(5000, '=');
  EXPECT_EQ(gpt2().bpe_for_testing(long_run, true), gpt2().bpe_for_testing(long_run, false));
}

TEST(DataTokenizer, DecodeReplacesInvalidBytesLikePython) {
  auto& tok = gpt2();
  // 0xE4 0xB8 0xAD is U+4E2D; alone, its first byte (token 160, 'ä') is an ill-formed subpart.
  std::vector<int32_t> ids = tok.encode("\xE4\xB8\xAD");
  ASSERT_GE(ids.size(), 1u);
  EXPECT_EQ(td::utf8::decode_with_replacement("\xE4\xB8"), "\xEF\xBF\xBD");
  EXPECT_EQ(td::utf8::decode_with_replacement("a\xFF" "b"), "a\xEF\xBF\xBD" "b");
  EXPECT_EQ(td::utf8::decode_with_replacement("\xF0\x9F\x98"), "\xEF\xBF\xBD");
  EXPECT_EQ(td::utf8::decode_with_replacement("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_THROW(tok.decode(std::vector<int32_t>{50257}), tessera::Error);
  EXPECT_THROW(tok.encode("bad \xFF utf8"), tessera::Error);
}

TEST(DataTokenizer, NullTokenizer) {
  td::NullTokenizer tok(100);
  EXPECT_EQ(tok.vocab_size(), 101);
  EXPECT_EQ(tok.eod(), 100);
  EXPECT_EQ(tok.encode("1 2 3"), (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(tok.encode("7\n 1_0 +3"), (std::vector<int32_t>{7, 10, 3}));
  EXPECT_THROW(tok.encode(" 7"), tessera::Error);  // split(' ') gives an empty first piece
  EXPECT_EQ(tok.encode(""), (std::vector<int32_t>{}));
  EXPECT_EQ(tok.encode("100"), (std::vector<int32_t>{100}));
  EXPECT_THROW(tok.encode("101"), tessera::Error);
  EXPECT_THROW(tok.encode("1  2"), tessera::Error);  // split(' ') gives an empty piece
  EXPECT_THROW(tok.encode("x"), tessera::Error);
  EXPECT_THROW(tok.encode("-1"), tessera::Error);
  EXPECT_EQ(tok.decode(std::vector<int32_t>{4, 5}), "4 5");
}

TEST(DataTokenizer, BadFilesNameFileAndLine) {
  std::string merges = kData + "/gpt2/merges.txt";
  std::string vocab = kData + "/gpt2/vocab.json";
  auto message = [](auto&& fn) {
    try {
      fn();
    } catch (const tessera::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  std::string m = message([&] { td::GPT2BPETokenizer t("/nonexistent/vocab.json", merges); });
  EXPECT_NE(m.find("/nonexistent/vocab.json"), std::string::npos) << m;
  std::string bad_json = write_temp("vocab_bad.json", "{\"a\": 1,\n  \"b\": 2,,\n}");
  m = message([&] { td::GPT2BPETokenizer t(bad_json, merges); });
  EXPECT_NE(m.find(bad_json + ":2:10"), std::string::npos) << m;
  std::string bad_id = write_temp("vocab_bad_id.json", "{\"a\": 1,\n \"b\": \"x\"}");
  m = message([&] { td::GPT2BPETokenizer t(bad_id, merges); });
  EXPECT_NE(m.find(bad_id + ":2:2"), std::string::npos) << m;
  std::string vocab_text = slurp(vocab);
  vocab_text.erase(vocab_text.find(", \"<|endoftext|>\": 50256"), 24);
  std::string no_eod = write_temp("vocab_no_eod.json", vocab_text);
  m = message([&] { td::GPT2BPETokenizer t(no_eod, merges); });
  EXPECT_NE(m.find("<|endoftext|>"), std::string::npos) << m;
  std::string bad_merges = write_temp("merges_bad.txt", "#version: 0.2\n\xC4\xA0 t\nonlyone\nx y\n");
  m = message([&] { td::GPT2BPETokenizer t(vocab, bad_merges); });
  EXPECT_NE(m.find(bad_merges + ":3"), std::string::npos) << m;
  std::string bad_utf8 = write_temp("merges_utf8.txt", "#version: 0.2\na b\nc \xFF\n");
  m = message([&] { td::GPT2BPETokenizer t(vocab, bad_utf8); });
  EXPECT_NE(m.find(bad_utf8 + ":3:3"), std::string::npos) << m;
}

// A wrong or damaged vocab/merges pair is refused, naming the file and the line, where
// Megatron would apply no merges (the vocab.json as --merge-file), fewer merges (a truncated
// copy) or wrong ones (another vocabulary's merges).
TEST(DataTokenizer, WrongOrDamagedGpt2FilesAreRefused) {
  const std::string vocab = kData + "/gpt2/vocab.json";
  const std::string merges = kData + "/gpt2/merges.txt";
  const std::string merges_text = slurp(merges);
  auto message = [](const std::string& v, const std::string& m) {
    try {
      td::GPT2BPETokenizer t(v, m);
    } catch (const tessera::Error& e) {
      return std::string(e.what()) + " | hint: " + e.hint();
    }
    return std::string("no error");
  };
  auto expect = [&](const std::string& v, const std::string& m, const std::string& where, const std::string& what) {
    const std::string msg = message(v, m);
    EXPECT_NE(msg.find(where), std::string::npos) << msg;
    EXPECT_NE(msg.find(what), std::string::npos) << msg;
  };
  EXPECT_EQ(message(vocab, merges), "no error");
  expect(vocab, vocab, vocab + ":1: expected the \"#version\" header", "swapped");
  expect(merges, merges, merges + ":1:1: malformed JSON", "swapped");

  // Cut in the middle of line 40001 (the header is line 1).
  size_t line_40001 = 0;
  for (int n = 0; n < 40000; ++n) line_40001 = merges_text.find('\n', line_40001) + 1;
  const std::string cut_mid_line = write_temp("merges_cut.txt", merges_text.substr(0, line_40001 + 3));
  expect(vocab, cut_mid_line, cut_mid_line + ":40001: the last line", "does not end with a newline");
  const std::string cut_at_line = write_temp("merges_cut_line.txt", merges_text.substr(0, line_40001));
  expect(vocab, cut_at_line, cut_at_line + ": after its 40000 lines, 10001 tokens", "truncated");
  expect(vocab, write_temp("merges_header_only.txt", "#version: 0.2\n"), "holds no merges", "");

  // A merge whose result is no token of this vocabulary (line 3 of 4).
  std::string garbled = merges_text;
  const size_t line3 = garbled.find('\n', garbled.find('\n') + 1) + 1;
  garbled.replace(line3, garbled.find('\n', line3) - line3, "zq xj");
  const std::string garbled_path = write_temp("merges_garbled.txt", garbled);
  expect(vocab, garbled_path, garbled_path + ":3: the merge \"zq xj\" uses or makes \"zq\"", "not a token of " + vocab);

  // vocab.json: an id beyond the token count, a repeated id, a missing byte token.
  std::string vocab_text = slurp(vocab);
  std::string gap = vocab_text;
  gap.replace(gap.find("\"!\": 0"), 6, "\"!\": 99999");
  expect(write_temp("vocab_gap.json", gap), merges, "vocab_gap.json:1:2: token \"!\" has id 99999", "0..50256");
  std::string repeated = vocab_text;
  repeated.replace(repeated.find("\"\\\"\": 1,"), 8, "\"\\\"\": 0,");
  expect(write_temp("vocab_repeat.json", repeated), merges, "has id 0, which token \"!\" has too", "");
  expect(write_temp("vocab_words.json", "{\"hello\": 0, \"<|endoftext|>\": 1}"), merges, "has no token for the byte 0x00",
         "not a byte-level BPE vocabulary");
}
