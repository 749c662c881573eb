// Whole-model properties on CPU: Megatron's initialisation statistics, a learnable task
// driven to near-zero loss, and bit-identical runs for the same seed and thread count.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "tessera/device/device.h"
#include "tessera/model/gpt.h"
#include "tessera/train/arguments.h"
#include "tessera/train/training_data.h"
#include "tessera/train/trainer.h"

using namespace tessera;

namespace {

TrainArgs args_from(std::vector<std::string> flags) {
  std::vector<char*> argv;
  for (auto& f : flags) argv.push_back(f.data());
  return parse_train_args(static_cast<int>(argv.size()), argv.data());
}

std::vector<std::string> tiny_flags() {
  return {"--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
          "--max-position-embeddings", "16", "--micro-batch-size", "2", "--global-batch-size", "4",
          "--tokenizer-type", "NullTokenizer", "--vocab-size", "20", "--mock-data", "--lr", "3e-3",
          "--train-iters", "10"};
}

// Every sample is the same repeating pattern 0 1 2 ... 7 0 1 2 ...: perfectly predictable
// after the first token.
class RepeatingPattern final : public SampleSource {
 public:
  explicit RepeatingPattern(int seq) : seq_(seq) {}
  void fill(int64_t index, int32_t* tokens) override {
    for (int t = 0; t <= seq_; ++t) tokens[t] = static_cast<int32_t>((t + index) % 8);
  }

 private:
  int seq_;
};

}  // namespace

TEST(GPTInit, MegatronInitialisation) {
  TrainArgs a = args_from(tiny_flags());
  a.model.hidden_size = 64;
  a.model.kv_channels = 16;
  a.model.ffn_hidden_size = 256;
  GPTModel model(a.model, cpu_device(), 1);
  model.init_weights();
  auto stats = [](const Tensor& t, double& mean, double& std, double& within_1sigma_frac, double sigma) {
    double s = 0, s2 = 0;
    int64_t within = 0;
    for (int64_t i = 0; i < t.numel(); ++i) {
      s += t.f32()[i];
      s2 += double(t.f32()[i]) * t.f32()[i];
      within += std::fabs(t.f32()[i]) < sigma;
    }
    mean = s / t.numel();
    std = std::sqrt(s2 / t.numel() - mean * mean);
    within_1sigma_frac = double(within) / t.numel();
  };
  double mean, std, frac;
  const Tensor& fc1 = model.param("decoder.layers.0.mlp.linear_fc1.weight");  // 16384 draws
  stats(fc1, mean, std, frac, 0.02);
  // Tolerances: 4 standard errors of 16384 draws (std error of std ~ 0.02/sqrt(2n)).
  EXPECT_NEAR(mean, 0.0, 4 * 0.02 / 128.0);
  EXPECT_NEAR(std, 0.02, 4 * 0.02 / std::sqrt(2.0 * 16384));
  EXPECT_NEAR(frac, 0.6827, 4 * std::sqrt(0.6827 * 0.3173 / 16384));
  const Tensor& fc2 = model.param("decoder.layers.1.mlp.linear_fc2.weight");
  const double scaled = 0.02 / std::sqrt(2.0 * 2);
  stats(fc2, mean, std, frac, scaled);
  EXPECT_NEAR(std, scaled, 4 * scaled / std::sqrt(2.0 * 16384));
  EXPECT_EQ(model.param("decoder.layers.0.input_layernorm.weight").f32()[5], 1.0f);
  EXPECT_EQ(model.param("decoder.layers.0.input_layernorm.bias").f32()[5], 0.0f);
  EXPECT_EQ(model.param("decoder.layers.0.self_attention.linear_qkv.bias").f32()[7], 0.0f);
  // Different parameters draw different numbers; the same seed the same ones.
  EXPECT_NE(model.param("decoder.layers.0.mlp.linear_fc1.weight").f32()[0],
            model.param("decoder.layers.1.mlp.linear_fc1.weight").f32()[0]);
  GPTModel again(a.model, cpu_device(), 3);
  again.init_weights();
  EXPECT_EQ(0, std::memcmp(again.param("decoder.layers.1.mlp.linear_fc1.weight").host<void>(),
                           model.param("decoder.layers.1.mlp.linear_fc1.weight").host<void>(), fc1.bytes()));
}

TEST(GPTTraining, LearnsARepeatingPattern) {
  auto flags = tiny_flags();
  flags.insert(flags.end(), {"--hidden-dropout", "0", "--attention-dropout", "0", "--lr-decay-style", "constant"});
  flags[flags.size() - 7] = "150";  // --train-iters
  TrainArgs a = args_from(flags);
  ASSERT_EQ(a.train_iters, 150);
  GPTModel model(a.model, cpu_device(), static_cast<int>(a.micro_batch_size));
  model.init_weights();
  RepeatingPattern data(a.model.seq_length);
  Trainer trainer(a, model, DataSources{&data}, cpu_device());
  const double first = trainer.train_step().lm_loss;
  EXPECT_NEAR(first, std::log(128.0), 0.3);  // near uniform over the padded vocabulary at init
  double last = first;
  for (int i = 1; i < 150; ++i) last = trainer.train_step().lm_loss;
  // Only the first token of each sample is unpredictable (1/16 of the tokens):
  // the loss must fall far below log(8)/16 ≈ 0.13.
  EXPECT_LT(last, 0.15) << "first " << first;
}

TEST(GPTTraining, SameSeedSameBits) {
  auto run = [](std::vector<double>& losses, std::vector<float>& weights) {
    TrainArgs a = args_from(tiny_flags());  // dropout on (0.1), as by default
    GPTModel model(a.model, cpu_device(), static_cast<int>(a.micro_batch_size));
    model.init_weights();
    TrainingData data = build_training_data(a);
    Trainer trainer(a, model, data.sources(), cpu_device());
    for (int i = 0; i < 5; ++i) {
      IterationResult r = trainer.train_step();
      losses.push_back(r.lm_loss);
      losses.push_back(r.grad_norm);
    }
    const Tensor& w = model.param("decoder.layers.1.mlp.linear_fc2.weight");
    weights.assign(w.f32(), w.f32() + w.numel());
  };
  std::vector<double> l1, l2;
  std::vector<float> w1, w2;
  run(l1, w1);
  run(l2, w2);
  EXPECT_EQ(l1, l2);
  EXPECT_EQ(0, std::memcmp(w1.data(), w2.data(), w1.size() * sizeof(float)));
}

TEST(GPTTraining, DropoutIsActiveAndKeyedBySeed) {
  auto first_loss = [](std::vector<std::string> extra) {
    auto flags = tiny_flags();
    flags.insert(flags.end(), extra.begin(), extra.end());
    TrainArgs a = args_from(flags);
    GPTModel model(a.model, cpu_device(), static_cast<int>(a.micro_batch_size));
    model.init_weights();
    TrainingData data = build_training_data(a);
    Trainer trainer(a, model, data.sources(), cpu_device());
    return trainer.train_step().lm_loss;
  };
  const double no_dropout = first_loss({"--hidden-dropout", "0", "--attention-dropout", "0"});
  EXPECT_NE(first_loss({}), no_dropout);
  EXPECT_NE(first_loss({"--hidden-dropout", "0"}), no_dropout);  // attention dropout alone
}
