// --mock-data's token ids against the model's vocabulary: Megatron's MockGPTLowLevelDataset
// documents (ids 1..4094, then EOD) are trained on as they are wherever the padded
// vocabulary holds them, and folded modulo the vocabulary only where it cannot.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "tessera/train/arguments.h"
#include "tessera/train/training_data.h"

using namespace tessera;

namespace {

TrainArgs mock_args(const std::string& vocab_size) {
  std::vector<std::string> flags = {"--num-layers", "1", "--hidden-size", "8", "--num-attention-heads", "1",
                                    "--seq-length", "1024", "--max-position-embeddings", "1024",
                                    "--micro-batch-size", "1", "--global-batch-size", "1", "--train-iters", "200",
                                    "--lr", "1e-3", "--tokenizer-type", "NullTokenizer", "--vocab-size", vocab_size,
                                    "--mock-data", "--eval-iters", "0"};
  std::vector<char*> argv;
  for (std::string& f : flags) argv.push_back(f.data());
  return parse_train_args(static_cast<int>(argv.size()), argv.data());
}

// The largest id in the first 200 training samples (200 x 1025 tokens, ~100 documents: some
// of them long enough to reach past 4000).
int32_t largest_id(const TrainArgs& args) {
  TrainingData data = build_training_data(args);
  std::vector<int32_t> tokens(args.model.seq_length + 1);
  int32_t largest = 0;
  for (int64_t i = 0; i < 200; ++i) {
    data.train->fill(i, tokens.data());
    largest = std::max(largest, *std::max_element(tokens.begin(), tokens.end()));
  }
  return largest;
}

}  // namespace

TEST(MockData, IdsAsMegatronsWhereThePaddedVocabularyHoldsThem) {
  // 4000 ids + EOD, padded to 4096: Megatron's ids up to 4094 fit, and are kept.
  const TrainArgs args = mock_args("4000");
  ASSERT_EQ(args.model.padded_vocab_size, 4096);
  EXPECT_GT(largest_id(args), 4000);  // folded modulo 4001, every id would be <= 4000
}

TEST(MockData, FoldedWhereThePaddedVocabularyCannotHoldThem) {
  const TrainArgs args = mock_args("60");  // 61 ids padded to 128
  EXPECT_EQ(largest_id(args), 60);         // the EOD, and every id below it
}
