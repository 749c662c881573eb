// The training, validation and test samples of a run, from Megatron's GPT datasets
// (data/gpt_dataset_builder.h): --data-path blends, per-split paths or --mock-data.
#pragma once

#include <memory>

#include "tessera/comm/communicator.h"
#include "tessera/data/gpt_dataset_builder.h"
#include "tessera/train/arguments.h"
#include "tessera/train/sample_source.h"

namespace tessera {

// A split of a GPT dataset as a SampleSource; with a vocab_modulo, every id is taken modulo
// it (--mock-data under a vocabulary too small for its ids: build_training_data says when).
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

// Where a resumed run starts: the checkpoint's iteration and consumed validation samples.
struct ResumePosition {
  int64_t iteration = 0;
  int64_t consumed_valid_samples = 0;
};
// --load's latest checkpoint (none, or --finetune: the start).
ResumePosition resume_position(const TrainArgs& args);

// The validation samples a run reads: from the resumed position, --eval-iters global batches
// at every --eval-interval up to --train-iters, and once more at the end.
int64_t validation_samples_read(const TrainArgs& args, const ResumePosition& from);

// Builds (or loads from the cache) every split, sized by Megatron's sample counts
// (get_train_valid_test_num_samples in megatron/training/training.py); prints the target
// sizes on rank 0. Megatron sizes validation for a run from iteration 0; a resume that
// changed --eval-iters or --eval-interval can read past that (Megatron's sampler runs out
// after training), so the validation split is then built for what this run reads. A run
// that keeps its flags reads exactly Megatron's count, and keeps Megatron's samples.
TrainingData build_training_data(const TrainArgs& args, const ResumePosition& from = {});

// Every process builds or loads its own index arrays (nodes need not share storage); this
// compares their digests across the world before training and throws an Error naming the
// ranks and hosts whose samples would differ from rank 0's (a stale or foreign cache, or
// different data files).
void check_datasets_agree(const TrainingData& data, Communicator& world);

}  // namespace tessera
