#include "tessera/data/token_id_range.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>
#include <tuple>

#include "tessera/core/error.h"

namespace tessera::data {
namespace {

// The range a dtype can hold (floating-point ids are not ids: their range is unbounded).
std::pair<int64_t, int64_t> dtype_range(IndexDType dtype) {
  switch (dtype) {
    case IndexDType::UInt8: return {0, 255};
    case IndexDType::Int8: return {-128, 127};
    case IndexDType::Int16: return {-32768, 32767};
    case IndexDType::UInt16: return {0, 65535};
    case IndexDType::Int32: return {std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max()};
    default: return {std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()};
  }
}

template <class T>
void min_max(const unsigned char* p, uint64_t n, int64_t& lo, int64_t& hi) {
  T a = std::numeric_limits<T>::max(), b = std::numeric_limits<T>::lowest();
  for (uint64_t i = 0; i < n; ++i) {
    T v;
    std::memcpy(&v, p + i * sizeof(T), sizeof(T));
    a = std::min(a, v);
    b = std::max(b, v);
  }
  if (n) lo = std::min(lo, static_cast<int64_t>(a)), hi = std::max(hi, static_cast<int64_t>(b));
}

// The smallest and largest id of sequence i (lo/hi untouched for an empty sequence).
void sequence_min_max(const IndexedDataset& ds, uint64_t i, int64_t& lo, int64_t& hi) {
  const TokenSpan s = ds.get(i);
  const auto* p = static_cast<const unsigned char*>(s.data);
  switch (s.dtype) {
    case IndexDType::UInt8: return min_max<uint8_t>(p, s.length, lo, hi);
    case IndexDType::Int8: return min_max<int8_t>(p, s.length, lo, hi);
    case IndexDType::Int16: return min_max<int16_t>(p, s.length, lo, hi);
    case IndexDType::UInt16: return min_max<uint16_t>(p, s.length, lo, hi);
    case IndexDType::Int32: return min_max<int32_t>(p, s.length, lo, hi);
    case IndexDType::Int64: return min_max<int64_t>(p, s.length, lo, hi);
    case IndexDType::Float32: return min_max<float>(p, s.length, lo, hi);
    case IndexDType::Float64: return min_max<double>(p, s.length, lo, hi);
  }
}

std::optional<uint64_t> first_sequence_outside(const IndexedDataset& ds, int64_t vocab_limit) {
  for (uint64_t i = 0; i < ds.sequence_count(); ++i) {
    int64_t lo = 0, hi = 0;
    sequence_min_max(ds, i, lo, hi);
    if (lo < 0 || hi >= vocab_limit) return i;
  }
  return std::nullopt;
}

}  // namespace

TokenIdRange token_id_range(const IndexedDataset& ds, int64_t vocab_limit) {
  TokenIdRange r;
  std::tie(r.min_id, r.max_id) = dtype_range(ds.dtype());
  if (r.min_id >= 0 && r.max_id < vocab_limit) return r;
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t n = static_cast<int64_t>(ds.sequence_count());
  int64_t lo = std::numeric_limits<int64_t>::max(), hi = std::numeric_limits<int64_t>::min();
#pragma omp parallel for schedule(dynamic, 256) reduction(min : lo) reduction(max : hi)
  for (int64_t i = 0; i < n; ++i) sequence_min_max(ds, static_cast<uint64_t>(i), lo, hi);
  r.scanned = true;
  r.min_id = n && lo <= hi ? lo : 0;
  r.max_id = n && lo <= hi ? hi : 0;
  r.bytes_read = ds.token_count() * dtype_size(ds.dtype());
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (r.min_id < 0 || r.max_id >= vocab_limit) r.first_bad_sequence = first_sequence_outside(ds, vocab_limit);
  return r;
}

std::string describe_vocabulary(const TokenizerOptions& tokenizer, int64_t vocab_size, int64_t padded_vocab_size) {
  std::string how = tokenizer.type;
  if (tokenizer.type == "NullTokenizer" && tokenizer.vocab_size)
    how += " --vocab-size " + std::to_string(*tokenizer.vocab_size);
  else if (!tokenizer.vocab_file.empty())
    how += " --vocab-file " + tokenizer.vocab_file;
  return std::to_string(padded_vocab_size) + " ids (" + how + ": " + std::to_string(vocab_size) +
         " tokens, padded to " + std::to_string(padded_vocab_size) + ")";
}

std::string token_id_problem(const IndexedDataset& ds, const TokenIdRange& r, int64_t padded_vocab_size,
                             const std::string& vocabulary) {
  if (!r.first_bad_sequence) return "";
  const uint64_t seq = *r.first_bad_sequence;
  const int64_t bad = r.min_id < 0 ? r.min_id : r.max_id;
  uint64_t doc = 0;  // the document holding sequence `seq`
  while (doc + 1 < ds.document_count() && static_cast<uint64_t>(ds.document_index(doc + 1)) <= seq) ++doc;
  std::string found = "token ids up to " + std::to_string(r.max_id);
  if (r.min_id < 0) found += " and down to " + std::to_string(r.min_id);
  return ds.prefix() + " holds " + found + " (the first sequence with one outside the vocabulary: " +
         std::to_string(seq) + ", in document " + std::to_string(doc) + "), but the model's vocabulary has " +
         vocabulary + ": id " + std::to_string(bad) + " is outside [0, " + std::to_string(padded_vocab_size) +
         "), so the data was tokenized with another tokenizer";
}

std::vector<std::string> dataset_prefixes(const GPTDatasetConfig& config) {
  std::vector<std::string> out;
  auto add = [&](const std::optional<Blend>& b) {
    if (!b) return;
    for (const std::string& p : b->prefixes)
      if (std::find(out.begin(), out.end(), p) == out.end()) out.push_back(p);
  };
  add(config.blend);
  if (config.blend_per_split)
    for (const std::optional<Blend>& b : *config.blend_per_split) add(b);
  return out;
}

std::vector<TokenIdRange> check_token_ids_fit(const GPTDatasetConfig& config, int64_t padded_vocab_size,
                                              const std::string& vocabulary) {
  std::vector<TokenIdRange> ranges;
  if (config.mock) return ranges;
  for (const std::string& prefix : dataset_prefixes(config)) {
    const IndexedDataset ds(prefix);
    ranges.push_back(token_id_range(ds, padded_vocab_size));
    if (std::string problem = token_id_problem(ds, ranges.back(), padded_vocab_size, vocabulary); !problem.empty())
      throw runtime_error(problem, kTokenIdHint);
  }
  return ranges;
}

}  // namespace tessera::data
