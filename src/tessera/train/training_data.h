// The training, validation and test samples of a run, from Megatron's GPT datasets
// (data/gpt_dataset_builder.h): --data-path blends, per-split paths or --mock-data.
#pragma once

#include <memory>

#include "tessera/comm/communicator.h"
#include "tessera/data/gpt_dataset_builder.h"
#include "tessera/train/arguments.h"
#include "tessera/train/sample_source.h"

namespace tessera {

// A split of a GPT dataset as a SampleSource. Megatron's mock documents hold ids up to
// 4095; with a smaller vocabulary they are reduced modulo it (EOD is the last id and stays).
class DatasetSamples final : public SampleSource {
 public:
  DatasetSamples(std::shared_ptr<const data::SampleDataset> dataset, int32_t vocab_modulo);
  void fill(int64_t index, int32_t* tokens) override;
  std::string index_digest() const { return dataset_->index_digest(); }

 private:
  std::shared_ptr<const data::SampleDataset> dataset_;
  int32_t vocab_modulo_;  // 0: ids are used as they are
};

struct TrainingData {
  std::unique_ptr<DatasetSamples> train, valid, test;  // valid/test null where absent
  data::LtorOptions masks;                             // loss mask and position ids
  DataSources sources() const { return {train.get(), valid.get(), test.get(), masks}; }
};

// Builds (or loads from the cache) every split, sized by Megatron's sample counts
// (build_train_valid_test_datasets in megatron/training/training.py); prints the target
// sizes on rank 0.
TrainingData build_training_data(const TrainArgs& args);

// Every process builds or loads its own index arrays (nodes need not share storage); this
// compares their digests across the world before training and throws an Error naming the
// ranks and hosts whose samples would differ from rank 0's (a stale or foreign cache, or
// different data files).
void check_datasets_agree(const TrainingData& data, Communicator& world);

}  // namespace tessera
