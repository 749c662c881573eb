#include "tessera/data/blended_dataset.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

#include "tessera/core/error.h"
#include "tessera/core/log.h"
#include "tessera/data/gpt_dataset_cache.h"

namespace tessera::data {

void build_blending_indices(std::span<int16_t> dataset_index, std::span<int64_t> dataset_sample_index,
                            std::span<const double> weights, int64_t size) {
  TESSERA_CHECK(!weights.empty() && static_cast<int64_t>(dataset_index.size()) >= size &&
                    static_cast<int64_t>(dataset_sample_index.size()) >= size,
                "build_blending_indices: bad arguments");
  std::vector<int64_t> current(weights.size(), 0);
  for (int64_t i = 0; i < size; ++i) {
    double s = std::max(static_cast<double>(i), 1.0);
    size_t best = 0;
    double best_error = weights[0] * s - static_cast<double>(current[0]);
    for (size_t d = 1; d < weights.size(); ++d) {
      double error = weights[d] * s - static_cast<double>(current[d]);
      if (error > best_error) {
        best_error = error;
        best = d;
      }
    }
    dataset_index[static_cast<size_t>(i)] = static_cast<int16_t>(best);
    dataset_sample_index[static_cast<size_t>(i)] = current[best];
    ++current[best];
  }
}

void build_exhaustive_blending_indices(std::span<int16_t> dataset_index, std::span<int64_t> dataset_sample_index,
                                       std::span<const int64_t> sizes) {
  int64_t total = 0;
  std::set<int32_t> unspent;
  for (size_t i = 0; i < sizes.size(); ++i) {
    TESSERA_CHECK(sizes[i] > 0, "build_exhaustive_blending_indices: sizes must be positive");
    total += sizes[i];
    unspent.insert(static_cast<int32_t>(i));
  }
  TESSERA_CHECK(static_cast<int64_t>(dataset_index.size()) >= total && static_cast<int64_t>(dataset_sample_index.size()) >= total,
                "build_exhaustive_blending_indices: outputs too small");
  std::vector<double> weights(sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) weights[i] = static_cast<double>(sizes[i]) / static_cast<double>(total);
  std::vector<int64_t> counts(sizes.size(), 0);
  int64_t i = 0;
  while (!unspent.empty()) {
    double s = std::max(static_cast<double>(i), 1.0);
    int64_t best = -1;
    double best_error = std::numeric_limits<double>::lowest();
    for (int32_t d : unspent) {
      double error = weights[static_cast<size_t>(d)] * s - static_cast<double>(counts[static_cast<size_t>(d)]);
      if (error > best_error) {
        best = d;
        best_error = error;
      }
    }
    TESSERA_CHECK(best >= 0, "exhaustive blending found no dataset");
    dataset_index[static_cast<size_t>(i)] = static_cast<int16_t>(best);
    dataset_sample_index[static_cast<size_t>(i)] = counts[static_cast<size_t>(best)];
    ++counts[static_cast<size_t>(best)];
    if (static_cast<double>(sizes[static_cast<size_t>(best)]) - static_cast<double>(counts[static_cast<size_t>(best)]) == 0)
      unspent.erase(static_cast<int32_t>(best));
    ++i;
  }
}

BlendedDataset::BlendedDataset(std::vector<std::shared_ptr<const GPTDataset>> datasets, std::vector<double> weights,
                               std::optional<int64_t> size, const GPTDatasetConfig& config)
    : datasets_(std::move(datasets)), size_(size) {
  TESSERA_CHECK(!datasets_.empty() && datasets_.size() == weights.size() && datasets_.size() < 32767,
                "BlendedDataset: datasets and weights differ in number");
  split_ = datasets_.front()->split();
  for (const auto& d : datasets_) TESSERA_CHECK(d->split() == split_, "BlendedDataset: datasets of different splits");
  for (size_t i = 0; i < weights.size(); ++i)
    if (!(weights[i] > 0))
      throw runtime_error("blend weight " + std::to_string(i) + " of the " + split_name(split_) + " split is " +
                              std::to_string(weights[i]) + "; every dataset in a blend needs a positive weight",
                          "drop the dataset from the blend or give it a positive weight (an empty split has weight 0)");
  if (datasets_.size() == 1) log_warn("Building a BlendedDataset for a single MegatronDataset");

  PyJson::Array weights_json;
  if (size_) {
    weights_ = normalize_weights(weights);
    for (double w : weights_) weights_json.emplace_back(w);
  } else {
    for (double w : weights) {
      if (w != std::floor(w)) throw runtime_error("an exhaustive blend (no size) needs integral weights");
      counts_.push_back(static_cast<int64_t>(w));
      weights_json.emplace_back(static_cast<int64_t>(w));
    }
  }
  PyJson::Array datasets_json;
  for (const auto& d : datasets_) datasets_json.push_back(d->unique_identifiers());
  PyJson::Object ids;
  ids.emplace_back("class", "BlendedDataset");
  ids.emplace_back("datasets", std::move(datasets_json));
  ids.emplace_back("split", split_name(split_));
  ids.emplace_back("weights", std::move(weights_json));
  ids.emplace_back("size", PyJson(size_));
  unique_identifiers_ = PyJson(std::move(ids));
  description_ = unique_identifiers_.dumps(4);
  description_hash_ = md5_hex(description_);

  int64_t n = 0;
  if (size_) n = *size_;
  else for (int64_t c : counts_) n += c;
  auto check = [n](const std::vector<NpyArray>& a) -> std::string {
    if (a.size() != 2 || a[0].dtype() != NpyDType::Int16 || a[0].shape() != std::vector<int64_t>{n} ||
        a[1].dtype() != NpyDType::Int64 || a[1].shape() != std::vector<int64_t>{n})
      return "the blending arrays do not have dtypes <i2, <i8 and shape (" + std::to_string(n) + ",)";
    return "";
  };
  std::vector<NpyArray> arrays;
  if (config.path_to_cache) {
    CacheEntry entry;
    entry.dir = *config.path_to_cache;
    entry.base = description_hash_ + "-BlendedDataset-" + split_name(split_);
    entry.description = description_;
    entry.array_names = {"dataset_index", "dataset_sample_index"};
    entry.verify_contents = config.verify_cache_contents;
    entry.verbose = config.verbose;
    CacheResult r = load_or_build(entry, [this] { return build_arrays(); }, check);
    built_anew_ = r.built;
    arrays = std::move(r.arrays);
  } else {
    arrays = build_arrays();
    built_anew_ = true;
  }
  dataset_index_ = std::move(arrays[0]);
  dataset_sample_index_ = std::move(arrays[1]);

  // Megatron's check that no dataset is drawn beyond its length.
  std::vector<int64_t> drawn(datasets_.size(), 0);
  for (uint64_t i = 0; i < dataset_index_.size(); ++i) {
    int64_t d = dataset_index_.at(i);
    if (d < 0 || d >= static_cast<int64_t>(datasets_.size()))
      throw runtime_error("dataset_index of the " + std::string(split_name(split_)) + " blend names dataset " +
                              std::to_string(d) + " of " + std::to_string(datasets_.size()),
                          "delete the BlendedDataset cache files; they are rebuilt on the next run");
    ++drawn[static_cast<size_t>(d)];
  }
  for (size_t d = 0; d < datasets_.size(); ++d)
    if (drawn[d] > datasets_[d]->size())
      throw runtime_error("The " + std::string(split_name(split_)) + " blend oversamples the contributing datasets: it requests " +
                              std::to_string(drawn[d]) + " samples from GPTDataset number " + std::to_string(d) +
                              ", which has " + std::to_string(datasets_[d]->size()),
                          "check the blend weights and requested sample counts");
  if (config.verbose)
    print_rank_0("%s the BlendedDataset %s indices: %lld samples from %zu datasets", built_anew_ ? "Built" : "Loaded",
                 split_name(split_), static_cast<long long>(this->size()), datasets_.size());
}

std::vector<NpyArray> BlendedDataset::build_arrays() const {
  int64_t n = 0;
  if (size_) n = *size_;
  else for (int64_t c : counts_) n += c;
  std::vector<int16_t> di(static_cast<size_t>(n));
  std::vector<int64_t> dsi(static_cast<size_t>(n));
  if (size_) build_blending_indices(di, dsi, weights_, n);
  else build_exhaustive_blending_indices(di, dsi, counts_);
  std::vector<NpyArray> out;
  out.push_back(NpyArray::from_vector(std::move(di)));
  out.push_back(NpyArray::from_vector(std::move(dsi)));
  return out;
}

void BlendedDataset::sample(int64_t index, std::span<int32_t> out) const {
  if (index < 0 || index >= size())
    throw runtime_error("sample " + std::to_string(index) + " is out of range: the " + split_name(split_) +
                        " blend has " + std::to_string(size()) + " samples");
  int64_t d = dataset_index_.at(static_cast<uint64_t>(index));
  int64_t s = dataset_sample_index_.at(static_cast<uint64_t>(index));
  datasets_[static_cast<size_t>(d)]->sample(s, out);
}

std::string BlendedDataset::index_digest() const {
  std::string all = description_hash_;
  for (const NpyArray* a : {&dataset_index_, &dataset_sample_index_}) all += ":" + sha256_hex(a->bytes());
  for (const auto& d : datasets_) all += ":" + d->index_digest();
  return sha256_hex({reinterpret_cast<const unsigned char*>(all.data()), all.size()});
}

}  // namespace tessera::data
