#include "tessera/data/gpt_dataset_builder.h"

#include <cmath>

#include "tessera/core/error.h"
#include "tessera/data/gpt_dataset_mock.h"

namespace tessera::data {

namespace {

using Mids = std::array<std::shared_ptr<const GPTDataset>, 3>;

// _build_megatron_dataset_splits: one GPTDataset per present bookend.
Mids build_splits(const std::shared_ptr<const LowLevelDataset>& low, const std::optional<std::string>& path,
                  const SplitMatrix& matrix, const std::array<std::optional<int64_t>, 3>& sizes,
                  const GPTDatasetConfig& config, const std::string& class_name) {
  Mids out;
  int64_t n = static_cast<int64_t>(low->sequence_count());
  for (Split s : kAllSplits) {
    int i = static_cast<int>(s);
    if (!matrix[i]) continue;
    auto [begin, end] = split_range(*matrix[i], n);
    out[i] = std::make_shared<GPTDataset>(low, path, begin, end, sizes[i], s, config, class_name);
  }
  return out;
}

std::shared_ptr<const LowLevelDataset> open_prefix(const std::string& prefix) {
  return std::make_shared<IndexedLowLevelDataset>(prefix);
}

// The top-level dataset of split i over the mid-level datasets `mids` (one per prefix).
std::shared_ptr<const SampleDataset> blend_split(const std::vector<std::shared_ptr<const GPTDataset>>& mids,
                                                 const std::optional<std::vector<double>>& weights,
                                                 const std::vector<std::array<std::optional<int64_t>, 3>>& per_dataset,
                                                 std::optional<int64_t> size, int i, const GPTDatasetConfig& config) {
  std::vector<double> w;
  std::optional<int64_t> blend_size;
  if (weights && size) {
    int64_t total = 0;
    for (const auto& p : per_dataset) total += *p[i];
    blend_size = total;
    if (config.renormalize_blend_weights) {
      for (const auto& p : per_dataset) w.push_back(static_cast<double>(*p[i]) / static_cast<double>(total));
    } else {
      w = *weights;
    }
  } else if (!weights) {
    int64_t total = 0;
    for (const auto& m : mids) {
      w.push_back(static_cast<double>(m->size()));
      total += m->size();
    }
    if (size) blend_size = std::min(*size, total);
  } else {
    throw usage_error("blend weights need a requested size for every split");
  }
  return std::make_shared<BlendedDataset>(mids, std::move(w), blend_size, config);
}

}  // namespace

std::vector<std::array<std::optional<int64_t>, 3>> sizes_per_dataset(const std::vector<double>& weights,
                                                                     const SplitSizes& sizes) {
  std::vector<std::array<std::optional<int64_t>, 3>> out;
  for (double w : weights) {
    std::array<std::optional<int64_t>, 3> row;
    for (int i = 0; i < 3; ++i) {
      if (!sizes[i]) throw usage_error("blend weights need a requested size for every split");
      row[i] = static_cast<int64_t>(std::ceil(static_cast<double>(*sizes[i]) * w * 1.005));
    }
    out.push_back(row);
  }
  return out;
}

GPTDatasets build_gpt_datasets(const GPTDatasetConfig& config, const SplitSizes& sizes) {
  std::array<std::shared_ptr<const SampleDataset>, 3> top;
  if (config.mock) {
    TESSERA_CHECK(config.split_matrix.has_value(), "finalize() the config first");
    auto low = std::make_shared<MockLowLevelDataset>(config.eod_id);
    Mids m = build_splits(low, std::nullopt, *config.split_matrix, sizes, config, "MockGPTDataset");
    for (int i = 0; i < 3; ++i) top[i] = m[i];
  } else if (config.blend) {
    TESSERA_CHECK(config.split_matrix.has_value(), "finalize() the config first");
    const SplitMatrix& matrix = *config.split_matrix;
    const Blend& blend = *config.blend;
    std::optional<std::vector<double>> weights;
    if (blend.weights) weights = normalize_weights(*blend.weights);
    if (blend.prefixes.size() == 1 && !weights) {
      Mids m = build_splits(open_prefix(blend.prefixes[0]), blend.prefixes[0], matrix, sizes, config, "GPTDataset");
      for (int i = 0; i < 3; ++i) top[i] = m[i];
    } else {
      std::vector<std::array<std::optional<int64_t>, 3>> per_dataset;
      if (weights) per_dataset = sizes_per_dataset(*weights, sizes);
      else per_dataset.assign(blend.prefixes.size(), {});
      std::vector<Mids> mids;
      for (size_t j = 0; j < blend.prefixes.size(); ++j)
        mids.push_back(build_splits(open_prefix(blend.prefixes[j]), blend.prefixes[j], matrix, per_dataset[j], config,
                                    "GPTDataset"));
      for (int i = 0; i < 3; ++i) {
        if (!matrix[i]) continue;
        std::vector<std::shared_ptr<const GPTDataset>> split_mids;
        for (const auto& m : mids) split_mids.push_back(m[i]);
        top[i] = blend_split(split_mids, weights, per_dataset, sizes[i], i, config);
      }
    }
  } else if (config.blend_per_split) {
    for (int i = 0; i < 3; ++i) {
      const auto& blend = (*config.blend_per_split)[i];
      if (!blend) continue;
      SplitMatrix spoof;
      spoof[i] = Bookend{0.0, 1.0, false};
      std::array<std::optional<int64_t>, 3> sizes_spoof = {int64_t{0}, int64_t{0}, int64_t{0}};
      sizes_spoof[i] = sizes[i];
      std::optional<std::vector<double>> weights;
      if (blend->weights) weights = normalize_weights(*blend->weights);
      if (blend->prefixes.size() == 1) {
        top[i] = build_splits(open_prefix(blend->prefixes[0]), blend->prefixes[0], spoof, sizes_spoof, config,
                              "GPTDataset")[i];
        continue;
      }
      std::vector<std::array<std::optional<int64_t>, 3>> per_dataset;
      if (weights) per_dataset = sizes_per_dataset(*weights, sizes_spoof);
      else per_dataset.assign(blend->prefixes.size(), {});
      std::vector<std::shared_ptr<const GPTDataset>> split_mids;
      for (size_t j = 0; j < blend->prefixes.size(); ++j)
        split_mids.push_back(build_splits(open_prefix(blend->prefixes[j]), blend->prefixes[j], spoof, per_dataset[j],
                                          config, "GPTDataset")[i]);
      top[i] = blend_split(split_mids, weights, per_dataset, sizes[i], i, config);
    }
  } else {
    throw usage_error("no data source configured", "give --data-path, --train-data-path ... or --mock-data");
  }
  return GPTDatasets{top[0], top[1], top[2]};
}

}  // namespace tessera::data
