#include "tessera/data/gpt_dataset.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include "tessera/core/error.h"
#include "tessera/core/log.h"
#include "tessera/data/gpt_dataset_cache.h"
#include "tessera/data/indexed_dataset.h"

namespace tessera::data {

namespace {

constexpr int64_t kAddExtraToken = 1;  // add_extra_token_to_sequence = True
constexpr double kSeparateFinalEpochThreshold = 0.80;
constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

int64_t floor_div(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

template <class T>
void widen(const void* src, uint64_t n, int32_t* out) {
  const auto* p = static_cast<const unsigned char*>(src);
  for (uint64_t i = 0; i < n; ++i) {
    T v;
    std::memcpy(&v, p + i * sizeof(T), sizeof(T));
    out[i] = static_cast<int32_t>(v);
  }
}

PyJson split_matrix_json(const std::optional<SplitMatrix>& m) {
  if (!m) return PyJson();
  PyJson::Array rows;
  for (const auto& b : *m) {
    if (!b) {
      rows.emplace_back();
    } else {
      PyJson lo = b->lo_is_int_zero ? PyJson(int64_t{0}) : PyJson(b->lo);
      rows.emplace_back(PyJson::Array{lo, PyJson(b->hi)});
    }
  }
  return rows;
}

}  // namespace

// ---- IndexedLowLevelDataset ----------------------------------------------------------------

IndexedLowLevelDataset::IndexedLowLevelDataset(const std::string& prefix)
    : dataset_(std::make_shared<IndexedDataset>(prefix)) {}
IndexedLowLevelDataset::IndexedLowLevelDataset(std::shared_ptr<const IndexedDataset> dataset)
    : dataset_(std::move(dataset)) {}
uint64_t IndexedLowLevelDataset::sequence_count() const { return dataset_->sequence_count(); }
int32_t IndexedLowLevelDataset::sequence_length(uint64_t i) const { return dataset_->sequence_length(i); }
std::optional<std::string> IndexedLowLevelDataset::path_prefix() const { return dataset_->prefix(); }

void IndexedLowLevelDataset::read_tokens(uint64_t i, uint64_t offset, uint64_t count, int32_t* out) const {
  TokenSpan s = dataset_->get(i, offset, count);
  switch (s.dtype) {
    case IndexDType::UInt8: widen<uint8_t>(s.data, s.length, out); break;
    case IndexDType::Int8: widen<int8_t>(s.data, s.length, out); break;
    case IndexDType::Int16: widen<int16_t>(s.data, s.length, out); break;
    case IndexDType::UInt16: widen<uint16_t>(s.data, s.length, out); break;
    case IndexDType::Int32: std::memcpy(out, s.data, s.length * 4); break;
    case IndexDType::Int64: widen<int64_t>(s.data, s.length, out); break;
    case IndexDType::Float32: widen<float>(s.data, s.length, out); break;
    case IndexDType::Float64: widen<double>(s.data, s.length, out); break;
  }
}

// ---- index construction --------------------------------------------------------------------

EpochPlan plan_epochs(int64_t tpe, std::optional<int64_t> num_samples, int32_t seq_length, bool drop_last_partial) {
  EpochPlan p;
  p.tokens_per_epoch = tpe;
  TESSERA_CHECK(tpe > 1 && seq_length > 1, "plan_epochs needs more than one token per epoch and seq_length > 1");
  if (num_samples) {
    int64_t tokens = tpe;
    int64_t requested = *num_samples * seq_length + kAddExtraToken;
    while (tokens < requested) {
      ++p.num_epochs;
      tokens += tpe;
    }
  }
  if (p.num_epochs > 1) {
    int64_t sans = floor_div(static_cast<int64_t>(p.num_epochs - 1) * tpe - kAddExtraToken, seq_length);
    int64_t from_final = *num_samples - sans;
    int64_t per_epoch = floor_div(tpe - kAddExtraToken, seq_length);
    TESSERA_CHECK(from_final >= 0 && from_final <= per_epoch + 1, "inconsistent epoch arithmetic");
    p.num_samples_sans_final_epoch = sans;
    p.separate_final_epoch = from_final < static_cast<int64_t>(kSeparateFinalEpochThreshold * static_cast<double>(per_epoch));
  }
  int64_t total_tokens = static_cast<int64_t>(p.num_epochs) * tpe - kAddExtraToken;
  if (drop_last_partial) {
    p.total_samples = total_tokens / seq_length;
  } else {
    p.total_samples = static_cast<int64_t>(std::ceil(static_cast<float>(total_tokens) / static_cast<float>(seq_length)));
  }
  return p;
}

std::vector<int32_t> build_document_index(int64_t begin, int64_t end, int32_t num_epochs, Mt19937RandomState& rng,
                                          bool separate_final_epoch) {
  if (!separate_final_epoch || num_epochs == 1) {
    size_t n = static_cast<size_t>(end - begin);
    std::vector<int32_t> index(n * static_cast<size_t>(num_epochs));
    for (int32_t e = 0; e < num_epochs; ++e)
      std::iota(index.begin() + static_cast<ptrdiff_t>(e * n), index.begin() + static_cast<ptrdiff_t>((e + 1) * n),
                static_cast<int32_t>(begin));
    rng.shuffle(index);
    return index;
  }
  std::vector<int32_t> first = build_document_index(begin, end, num_epochs - 1, rng, false);
  std::vector<int32_t> last = build_document_index(begin, end, 1, rng, false);
  first.insert(first.end(), last.begin(), last.end());
  return first;
}

namespace {

template <class T>
std::vector<T> sample_index_rows(std::span<const int32_t> lengths, int64_t base, std::span<const int32_t> doc_index,
                                 int32_t seq_length, int64_t num_samples) {
  std::vector<T> rows(2 * static_cast<size_t>(num_samples + 1));
  auto len_of = [&](int64_t k) -> int64_t { return lengths[static_cast<size_t>(doc_index[static_cast<size_t>(k)] - base)]; };
  const int64_t last = static_cast<int64_t>(doc_index.size()) - 1;
  int64_t idx = 0, offset = 0;
  rows[0] = 0;
  rows[1] = 0;
  for (int64_t k = 1; k <= num_samples; ++k) {
    int64_t remaining = seq_length + kAddExtraToken;
    while (remaining != 0) {
      int64_t doc_length = len_of(idx) - offset;
      remaining -= doc_length;
      if (remaining <= 0) {
        offset += remaining + doc_length - kAddExtraToken;
        remaining = 0;
      } else {
        if (idx == last) {
          TESSERA_CHECK(k == num_samples, "sample index ran past the document index");
          offset = len_of(idx) - kAddExtraToken;
          break;
        }
        ++idx;
        offset = 0;
      }
    }
    rows[2 * static_cast<size_t>(k)] = static_cast<T>(idx);
    rows[2 * static_cast<size_t>(k) + 1] = static_cast<T>(offset);
  }
  return rows;
}

}  // namespace

NpyArray build_sample_index(std::span<const int32_t> lengths, int64_t lengths_base, std::span<const int32_t> document_index,
                            int32_t seq_length, int32_t num_epochs, int64_t tokens_per_epoch, bool drop_last_partial,
                            int64_t max_sequence_length) {
  TESSERA_CHECK(seq_length > 1 && num_epochs > 0 && tokens_per_epoch > 1, "build_sample_index preconditions");
  int64_t total_tokens = static_cast<int64_t>(num_epochs) * tokens_per_epoch - kAddExtraToken;
  int64_t num_samples = drop_last_partial
                            ? total_tokens / seq_length
                            : static_cast<int64_t>(std::ceil(static_cast<float>(total_tokens) / static_cast<float>(seq_length)));
  int64_t max_value = std::max<int64_t>(static_cast<int64_t>(document_index.size()), max_sequence_length);
  std::vector<int64_t> shape = {num_samples + 1, 2};
  if (max_value <= kInt32Max)
    return NpyArray::from_vector(sample_index_rows<int32_t>(lengths, lengths_base, document_index, seq_length, num_samples), shape);
  return NpyArray::from_vector(sample_index_rows<int64_t>(lengths, lengths_base, document_index, seq_length, num_samples), shape);
}

namespace {
template <class T>
NpyArray shuffle_index_of(int64_t num_samples, int64_t total_size, Mt19937RandomState& rng) {
  std::vector<T> index(static_cast<size_t>(total_size));
  std::iota(index.begin(), index.end(), T{0});
  std::span<T> all(index);
  rng.shuffle(all.subspan(0, static_cast<size_t>(num_samples)));
  if (num_samples != total_size) rng.shuffle(all.subspan(static_cast<size_t>(num_samples)));
  return NpyArray::from_vector(std::move(index));
}
}  // namespace

NpyArray build_shuffle_index(int64_t num_samples, int64_t total_size, Mt19937RandomState& rng) {
  TESSERA_CHECK(num_samples >= 0 && num_samples <= total_size, "build_shuffle_index: num_samples > total_size");
  if (total_size >= static_cast<int64_t>(std::numeric_limits<uint32_t>::max()) - 1)
    return shuffle_index_of<int64_t>(num_samples, total_size, rng);
  return shuffle_index_of<uint32_t>(num_samples, total_size, rng);
}

// ---- GPTDataset ----------------------------------------------------------------------------

GPTDataset::GPTDataset(std::shared_ptr<const LowLevelDataset> low_level, std::optional<std::string> dataset_path,
                       int64_t begin, int64_t end, std::optional<int64_t> num_samples, Split split,
                       const GPTDatasetConfig& config, std::string class_name)
    : low_level_(std::move(low_level)),
      begin_(begin),
      end_(end),
      num_samples_(num_samples),
      split_(split),
      seq_length_(config.sequence_length),
      seed_(config.random_seed),
      pad_id_(config.pad_id) {
  TESSERA_CHECK(begin_ >= 0 && begin_ <= end_ && static_cast<uint64_t>(end_) <= low_level_->sequence_count(),
                "GPTDataset: sequence range outside the low-level dataset");
  if (seq_length_ <= 1) throw usage_error("--seq-length must be at least 2 for GPT datasets");
  drop_last_partial_ = split_ != Split::Valid || config.drop_last_partial_validation_sequence;

  PyJson::Object ids;
  ids.emplace_back("class", class_name);
  ids.emplace_back("dataset_path", PyJson(dataset_path));
  ids.emplace_back("num_samples", PyJson(num_samples));
  ids.emplace_back("index_split", split_name(split));
  ids.emplace_back("random_seed", static_cast<int64_t>(config.random_seed));
  ids.emplace_back("sequence_length", static_cast<int64_t>(config.sequence_length));
  ids.emplace_back("split", PyJson(config.split));
  ids.emplace_back("split_matrix", split_matrix_json(config.split_matrix));
  ids.emplace_back("tokenizer", config.tokenizer.to_json());
  unique_identifiers_ = PyJson(std::move(ids));
  description_ = unique_identifiers_.dumps(4);
  description_hash_ = md5_hex(description_);

  std::string where = dataset_path ? *dataset_path : std::string("mock data");
  int64_t tpe = 0;
  for (int64_t i = begin_; i < end_; ++i) tpe += low_level_->sequence_length(static_cast<uint64_t>(i));
  if (tpe <= 1)
    throw runtime_error("the " + std::string(split_name(split)) + " split of " + where + " holds " + std::to_string(tpe) +
                            " tokens (sequences [" + std::to_string(begin_) + ", " + std::to_string(end_) +
                            ")); Megatron needs more than one token per epoch",
                        "use a larger dataset or give this split a larger share with --split");
  for (uint64_t i = 0; i < low_level_->sequence_count(); ++i)
    max_sequence_length_ = std::max<int64_t>(max_sequence_length_, low_level_->sequence_length(i));
  plan_ = plan_epochs(tpe, num_samples_, seq_length_, drop_last_partial_);

  std::optional<std::string> cache_dir = config.path_to_cache;
  if (!cache_dir && !config.mock && low_level_->path_prefix())
    cache_dir = *low_level_->path_prefix() + "/cache/" + class_name + "_indices";

  std::vector<NpyArray> arrays;
  if (cache_dir) {
    cache_dir_ = *cache_dir;
    CacheEntry entry;
    entry.dir = *cache_dir;
    entry.base = description_hash_ + "-" + class_name + "-" + split_name(split);
    entry.description = description_;
    entry.array_names = {"document_index", "sample_index", "shuffle_index"};
    if (auto p = low_level_->path_prefix()) entry.source_prefixes = {*p};
    entry.verify_contents = config.verify_cache_contents;
    entry.verbose = config.verbose;
    CacheResult r = load_or_build(
        entry, [this] { return build_arrays(); },
        [this](const std::vector<NpyArray>& a) { return check_arrays(a); });
    built_anew_ = r.built;
    arrays = std::move(r.arrays);
  } else {
    arrays = build_arrays();
    built_anew_ = true;
  }
  document_index_ = std::move(arrays[0]);
  sample_index_ = std::move(arrays[1]);
  shuffle_index_ = std::move(arrays[2]);
  if (config.verbose) {
    print_rank_0("%s the %s %s indices%s", built_anew_ ? "Built" : "Loaded", class_name.c_str(), split_name(split),
                 cache_dir_.empty() ? " (not cached)" : "");
    print_rank_0("> total number of samples: %lld", static_cast<long long>(size()));
    print_rank_0("> total number of epochs: %d", plan_.num_epochs);
  }
}

std::vector<NpyArray> GPTDataset::build_arrays() const {
  Mt19937RandomState rng(seed_);
  std::vector<int32_t> doc = build_document_index(begin_, end_, plan_.num_epochs, rng, plan_.separate_final_epoch);
  std::vector<int32_t> lengths(static_cast<size_t>(end_ - begin_));
  for (int64_t i = begin_; i < end_; ++i) lengths[static_cast<size_t>(i - begin_)] = low_level_->sequence_length(static_cast<uint64_t>(i));
  NpyArray sample = build_sample_index(lengths, begin_, doc, seq_length_, plan_.num_epochs, plan_.tokens_per_epoch,
                                       drop_last_partial_, max_sequence_length_);
  int64_t total = static_cast<int64_t>(sample.shape()[0]) - 1;
  NpyArray shuffle = plan_.separate_final_epoch ? build_shuffle_index(plan_.num_samples_sans_final_epoch, total, rng)
                                                : build_shuffle_index(total, total, rng);
  std::vector<NpyArray> out;
  out.push_back(NpyArray::from_vector(std::move(doc)));
  out.push_back(std::move(sample));
  out.push_back(std::move(shuffle));
  return out;
}

std::string GPTDataset::check_arrays(const std::vector<NpyArray>& a) const {
  if (a.size() != 3) return "expected three arrays";
  int64_t doc_len = static_cast<int64_t>(plan_.num_epochs) * (end_ - begin_);
  int64_t t = plan_.total_samples;
  NpyDType sample_dtype = std::max(doc_len, max_sequence_length_) <= kInt32Max ? NpyDType::Int32 : NpyDType::Int64;
  NpyDType shuffle_dtype =
      t >= static_cast<int64_t>(std::numeric_limits<uint32_t>::max()) - 1 ? NpyDType::Int64 : NpyDType::UInt32;
  if (a[0].dtype() != NpyDType::Int32 || a[0].shape() != std::vector<int64_t>{doc_len})
    return "document_index.npy has dtype/shape " + std::string(npy_descr(a[0].dtype())) + " of " +
           std::to_string(a[0].size()) + " elements; expected <i4 (" + std::to_string(doc_len) + ",)";
  if (a[1].dtype() != sample_dtype || a[1].shape() != std::vector<int64_t>{t + 1, 2})
    return "sample_index.npy does not have the expected dtype " + std::string(npy_descr(sample_dtype)) + " and shape (" +
           std::to_string(t + 1) + ", 2)";
  if (a[2].dtype() != shuffle_dtype || a[2].shape() != std::vector<int64_t>{t})
    return "shuffle_index.npy does not have the expected dtype " + std::string(npy_descr(shuffle_dtype)) + " and shape (" +
           std::to_string(t) + ",)";
  return "";
}

void GPTDataset::sample(int64_t index, std::span<int32_t> out) const {
  const size_t want = static_cast<size_t>(seq_length_) + kAddExtraToken;
  if (index < 0 || index >= size())
    throw runtime_error("sample " + std::to_string(index) + " is out of range: the " + split_name(split_) +
                        " dataset has " + std::to_string(size()) + " samples");
  TESSERA_CHECK(out.size() == want, "sample(): the output must hold seq_length + 1 tokens");
  auto corrupt = [&](const std::string& what) {
    return runtime_error("dataset index arrays are inconsistent (" + what + ")" +
                             (cache_dir_.empty() ? std::string() : " in the cache " + cache_dir_),
                         "delete the cache files of this dataset; they are rebuilt on the next run");
  };
  int64_t k = shuffle_index_.at(static_cast<uint64_t>(index));
  int64_t rows = static_cast<int64_t>(sample_index_.shape()[0]);
  if (k < 0 || k + 1 >= rows) throw corrupt("shuffle_index value " + std::to_string(k));
  int64_t b = sample_index_.at(2 * static_cast<uint64_t>(k)), bo = sample_index_.at(2 * static_cast<uint64_t>(k) + 1);
  int64_t e = sample_index_.at(2 * static_cast<uint64_t>(k + 1)), eo = sample_index_.at(2 * static_cast<uint64_t>(k + 1) + 1);
  int64_t doc_rows = static_cast<int64_t>(document_index_.size());
  if (b < 0 || e < b || e >= doc_rows || bo < 0 || eo < 0) throw corrupt("sample_index row " + std::to_string(k));
  size_t filled = 0;
  auto read = [&](int64_t pos, int64_t offset, std::optional<int64_t> length) {
    int64_t seq = document_index_.at(static_cast<uint64_t>(pos));
    if (seq < begin_ || seq >= end_) throw corrupt("document_index value " + std::to_string(seq));
    int64_t len = low_level_->sequence_length(static_cast<uint64_t>(seq));
    int64_t n = length ? *length : len - offset;
    if (offset > len || n < 0 || offset + n > len || filled + static_cast<size_t>(n) > want)
      throw corrupt("sample_index row " + std::to_string(k));
    low_level_->read_tokens(static_cast<uint64_t>(seq), static_cast<uint64_t>(offset), static_cast<uint64_t>(n),
                            out.data() + filled);
    filled += static_cast<size_t>(n);
  };
  if (b == e) {
    read(b, bo, eo - bo + kAddExtraToken);
  } else {
    for (int64_t i = b; i <= e; ++i) {
      int64_t offset = i > b ? 0 : bo;
      std::optional<int64_t> length;
      if (i == e) length = eo + kAddExtraToken;
      read(i, offset, length);
    }
  }
  std::fill(out.begin() + static_cast<ptrdiff_t>(filled), out.end(), static_cast<int32_t>(pad_id_));
}

std::vector<int64_t> GPTDataset::sample_sequences(int64_t index) const {
  int64_t k = shuffle_index_.at(static_cast<uint64_t>(index));
  int64_t b = sample_index_.at(2 * static_cast<uint64_t>(k)), e = sample_index_.at(2 * static_cast<uint64_t>(k + 1));
  std::vector<int64_t> ids;
  for (int64_t i = b; i <= e; ++i) ids.push_back(document_index_.at(static_cast<uint64_t>(i)));
  return ids;
}

// ---- masks and position ids ----------------------------------------------------------------

void make_ltor_sample(std::span<const int32_t> text, const LtorOptions& o, LtorSample& out) {
  TESSERA_CHECK(text.size() >= 2, "make_ltor_sample needs at least two tokens");
  const size_t s = text.size() - 1;
  out.tokens.assign(text.begin(), text.end() - 1);
  out.labels.assign(text.begin() + 1, text.end());
  out.loss_mask.assign(s, 1.0f);
  out.position_ids.resize(s);
  out.segment_starts.clear();
  if (o.reset_attention_mask) out.segment_starts.push_back(0);
  int64_t segment_start = 0;  // first position after the last EOD seen
  for (size_t i = 0; i < s; ++i) {
    out.position_ids[i] = o.reset_position_ids ? static_cast<int64_t>(i) - segment_start : static_cast<int64_t>(i);
    if (out.tokens[i] == o.eod_id) {
      if (o.eod_mask_loss) out.loss_mask[i] = 0.0f;
      if (o.reset_position_ids) segment_start = static_cast<int64_t>(i) + 1;
      if (o.reset_attention_mask && i + 1 < s) out.segment_starts.push_back(static_cast<int32_t>(i + 1));
    }
  }
  for (size_t i = 0; i < s; ++i) {
    if (out.labels[i] == o.pad_id) {
      out.loss_mask[i] = 0.0f;
      out.labels[i] = 0;
    }
    if (out.tokens[i] == o.pad_id) out.tokens[i] = 0;
  }
}

std::string GPTDataset::index_digest() const {
  // The digests of the three arrays, hashed again: one line per array, in a fixed order.
  std::string all = description_hash_;
  for (const NpyArray* a : {&document_index_, &sample_index_, &shuffle_index_}) all += ":" + sha256_hex(a->bytes());
  return sha256_hex({reinterpret_cast<const unsigned char*>(all.data()), all.size()});
}

}  // namespace tessera::data
