// `tessera train`'s flags: Megatron's names and defaults, derived values, and the errors
// for invalid values, unsupported Megatron flags and unknown flags.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tessera/core/error.h"
#include "tessera/train/arguments.h"

using namespace tessera;

namespace {

std::vector<std::string> base_flags() {
  return {"--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "16",
          "--max-position-embeddings", "32", "--micro-batch-size", "2", "--tokenizer-type", "NullTokenizer",
          "--vocab-size", "1000", "--mock-data", "--lr", "1e-3", "--train-iters", "10"};
}

TrainArgs parse(std::vector<std::string> flags) {
  std::vector<char*> argv;
  for (auto& f : flags) argv.push_back(f.data());
  return parse_train_args(static_cast<int>(argv.size()), argv.data());
}

std::string error_of(std::vector<std::string> flags) {
  try {
    parse(std::move(flags));
  } catch (const Error& e) {
    return std::string(e.what()) + " | " + e.hint();
  }
  return "";
}

std::vector<std::string> with(std::vector<std::string> extra) {
  auto f = base_flags();
  f.insert(f.end(), extra.begin(), extra.end());
  return f;
}

}  // namespace

TEST(TrainArguments, MegatronDefaults) {
  TrainArgs a = parse(base_flags());
  EXPECT_EQ(a.model.kv_channels, 16);
  EXPECT_EQ(a.model.ffn_hidden_size, 256);
  EXPECT_EQ(a.model.vocab_size, 1001);          // NullTokenizer: N ids plus EOD
  EXPECT_EQ(a.model.padded_vocab_size, 1024);   // multiple of 128
  EXPECT_FLOAT_EQ(a.model.hidden_dropout, 0.1f);
  EXPECT_FLOAT_EQ(a.model.attention_dropout, 0.1f);
  EXPECT_FLOAT_EQ(a.model.norm_epsilon, 1e-5f);
  EXPECT_FLOAT_EQ(a.model.init_method_std, 0.02f);
  EXPECT_EQ(a.model.gelu, ops::GeluKind::Tanh);
  EXPECT_EQ(a.model.seed, 1234u);
  EXPECT_EQ(a.global_batch_size, 2);
  EXPECT_EQ(a.log_interval, 100);
  EXPECT_FLOAT_EQ(a.optimizer.clip_grad, 1.0f);
  EXPECT_FLOAT_EQ(a.optimizer.adam_beta2, 0.999f);
  EXPECT_FLOAT_EQ(a.optimizer.adam_eps, 1e-8f);
  EXPECT_DOUBLE_EQ(a.lr_schedule.start_wd, 0.01);
  EXPECT_EQ(a.lr_schedule.decay_style, LrDecayStyle::Linear);
  EXPECT_EQ(a.lr_schedule.decay_steps, 20);  // train iters × global batch, in samples
}

TEST(TrainArguments, GeluVariants) {
  EXPECT_EQ(parse(with({"--no-bias-gelu-fusion"})).model.gelu, ops::GeluKind::Erf);
  EXPECT_EQ(parse(with({"--no-bias-gelu-fusion", "--openai-gelu"})).model.gelu, ops::GeluKind::Tanh);
}

TEST(TrainArguments, ScheduleInSamples) {
  TrainArgs a = parse(with({"--global-batch-size", "8", "--lr-warmup-fraction", "0.1", "--lr-decay-iters", "20"}));
  EXPECT_EQ(a.lr_schedule.decay_steps, 160);
  EXPECT_EQ(a.lr_schedule.warmup_steps, 16);
  EXPECT_EQ(a.lr_schedule.wd_incr_steps, 80);
  auto f = base_flags();
  f[f.size() - 2] = "--train-samples";
  f.back() = "100";
  f.insert(f.end(), {"--global-batch-size", "8", "--lr-warmup-samples", "10"});
  a = parse(f);
  EXPECT_EQ(a.train_iters, 12);
  EXPECT_EQ(a.lr_schedule.decay_steps, 100);
  EXPECT_EQ(a.lr_schedule.warmup_steps, 10);
}

TEST(TrainArguments, InvalidValuesNameTheFlag) {
  EXPECT_NE(error_of(with({"--num-attention-heads", "5"})).find("--num-attention-heads"), std::string::npos);
  EXPECT_NE(error_of(with({"--seq-length", "64"})).find("--max-position-embeddings"), std::string::npos);
  EXPECT_NE(error_of(with({"--global-batch-size", "3"})).find("--global-batch-size"), std::string::npos);
  EXPECT_NE(error_of(with({"--hidden-dropout", "1.5"})).find("--hidden-dropout"), std::string::npos);
  EXPECT_NE(error_of(with({"--num-layers", "two"})).find("--num-layers expects an integer"), std::string::npos);
  EXPECT_NE(error_of(with({"--lr-decay-style", "step"})).find("invalid choice"), std::string::npos);
  EXPECT_NE(error_of(with({"--lr-warmup-iters", "20"})).find("warm-up"), std::string::npos);
  EXPECT_NE(error_of(with({"--train-samples", "10"})).find("exactly one"), std::string::npos);
  EXPECT_NE(error_of(with({"--lr-warmup-fraction", "0.1", "--lr-warmup-iters", "2"})).find("only one"),
            std::string::npos);
}

// Megatron's converter run (megatron/training/initialize.py, training.py): the format's save
// goes to --ckpt-convert-save/<format>, in that format; it needs both flags and --load.
TEST(TrainArguments, CkptConvertFormatSavesIntoItsFolder) {
  const TrainArgs a =
      parse(with({"--load", "ckpt", "--ckpt-convert-format", "torch", "--ckpt-convert-save", "converted"}));
  EXPECT_EQ(a.ckpt_convert_format, "torch");
  EXPECT_EQ(a.save, "converted/torch");
  EXPECT_TRUE(a.save_megatron_format);
  EXPECT_FALSE(a.save_torch_dist);
  EXPECT_NE(error_of(with({"--load", "ckpt", "--ckpt-convert-format", "torch"})).find("--ckpt-convert-save"),
            std::string::npos);
  EXPECT_NE(error_of(with({"--ckpt-convert-format", "torch_dist", "--ckpt-convert-save", "c"})).find("--load"),
            std::string::npos);
  EXPECT_NE(error_of(with({"--load", "ckpt", "--ckpt-convert-format", "zarr", "--ckpt-convert-save", "c"}))
                .find("zarr is not written"),
            std::string::npos);
}

TEST(TrainArguments, UnsupportedMegatronFlagVersusUnknownFlag) {
  std::string e = error_of(with({"--qk-layernorm"}));
  EXPECT_NE(e.find("--qk-layernorm is a Megatron-LM flag that tessera does not support yet"), std::string::npos) << e;
  e = error_of(with({"--num-layer", "2"}));
  EXPECT_NE(e.find("unknown flag --num-layer"), std::string::npos) << e;
  EXPECT_NE(e.find("did you mean --num-layers?"), std::string::npos) << e;
}

// The Llama family's flags with Megatron's defaults and deprecated spellings
// (megatron/training/arguments.py).
TEST(TrainArguments, LlamaFlagsFollowMegatron) {
  TrainArgs a = parse(with({"--swiglu", "--normalization", "RMSNorm", "--use-rotary-position-embeddings",
                            "--group-query-attention", "--disable-bias-linear", "--add-qkv-bias"}));
  const GPTConfig& m = a.model;
  EXPECT_EQ(m.ffn_hidden_size, 4 * m.hidden_size * 2 / 3 / 64 * 64);  // --swiglu's default
  EXPECT_EQ(m.normalization, Normalization::RMSNorm);
  EXPECT_EQ(m.position_embedding, PositionEmbedding::Rope);
  EXPECT_EQ(m.query_groups(), 1);  // --group-query-attention without --num-query-groups
  EXPECT_FALSE(m.add_bias_linear);
  EXPECT_TRUE(m.has_qkv_bias());
  EXPECT_EQ(m.rotary_base, 10000.0f);
  EXPECT_EQ(parse(with({"--no-position-embedding"})).model.position_embedding, PositionEmbedding::None);
  // --num-query-groups alone does nothing (Megatron reads it only with the switch).
  EXPECT_EQ(parse(with({"--num-query-groups", "2"})).model.query_groups(), parse(with({})).model.num_attention_heads);
}

// --use-rope-scaling (core_r0.10.0: factor 8) and later Megatron's --rope-scaling-factor.
TEST(TrainArguments, RopeScaling) {
  const std::vector<std::string> rope = {"--position-embedding-type", "rope", "--use-rope-scaling"};
  ops::Rope r = parse(with(rope)).model.rope();
  EXPECT_EQ(r.scaling.factor, 8.0f);
  EXPECT_EQ(r.scaling.low_freq_factor, 1.0f);
  EXPECT_EQ(r.scaling.high_freq_factor, 4.0f);
  EXPECT_EQ(r.scaling.original_max_positions, 8192.0f);
  std::vector<std::string> f = rope;
  f.insert(f.end(), {"--rope-scaling-factor", "32"});
  EXPECT_EQ(parse(with(f)).model.rope().scaling.factor, 32.0f);
  EXPECT_EQ(parse(with({"--position-embedding-type", "rope"})).model.rope().scaling.factor, 0.0f);  // none
  f.back() = "0.5";
  EXPECT_NE(error_of(with(f)).find("--rope-scaling-factor must be >= 1"), std::string::npos) << error_of(with(f));
}

TEST(TrainArguments, SpeedOnlyFlagsAreAccepted) {
  TrainArgs a = parse(with({"--transformer-impl", "local", "--no-masked-softmax-fusion", "--use-flash-attn",
                            "--no-persist-layer-norm"}));
  EXPECT_EQ(a.model.num_layers, 2);
}

TEST(TrainArguments, ArgumentDumpMatchesMegatronsFormat) {
  auto f = base_flags();
  std::vector<char*> argv;
  for (auto& s : f) argv.push_back(s.data());
  ParsedOptions parsed;
  parse_train_args(static_cast<int>(argv.size()), argv.data(), &parsed);
  testing::internal::CaptureStdout();
  train_option_table().print_arguments(parsed);
  std::string out = testing::internal::GetCapturedStdout();
  EXPECT_EQ(out.rfind("------------------------ arguments ------------------------\n", 0), 0u);
  EXPECT_NE(out.find("\n  adam_eps " + std::string(48 - 8, '.') + " 1e-08\n"), std::string::npos) << out;
  EXPECT_NE(out.find("\n  hidden_size " + std::string(48 - 11, '.') + " 64\n"), std::string::npos);
  EXPECT_NE(out.find("\n  kv_channels " + std::string(48 - 11, '.') + " 16\n"), std::string::npos);  // derived, as Megatron prints it
  EXPECT_NE(out.find("\n  lr_decay_iters " + std::string(48 - 14, '.') + " None\n"), std::string::npos);
  EXPECT_NE(out.find("\n  bias_gelu_fusion " + std::string(48 - 16, '.') + " True\n"), std::string::npos);
  EXPECT_NE(out.find("\n  min_lr " + std::string(48 - 6, '.') + " 0.0\n"), std::string::npos);
  // Sorted case-insensitively: adam_beta1 before adam_eps before attention_dropout.
  EXPECT_LT(out.find("adam_beta1"), out.find("adam_eps"));
  EXPECT_LT(out.find("adam_eps"), out.find("attention_dropout"));
  EXPECT_NE(out.find("-------------------- end of arguments ---------------------\n"), std::string::npos);
}

// --ckpt-format torch at EP > 1: the mp_rank_*_EEE folders are written with the optimizer state
// (megatron-core's chained dense and expert optimizers), the distributed optimizer's too.
TEST(TrainArguments, TorchFormatAtExpertParallelismSavesTheOptimizer) {
  auto parse_ep2 = [](std::vector<std::string> extra) {
    std::vector<std::string> flags =
        with({"--num-experts", "4", "--disable-bias-linear", "--expert-model-parallel-size", "2", "--save", "/tmp",
              "--save-interval", "5", "--ckpt-format", "torch", "--global-batch-size", "4"});
    flags.insert(flags.end(), extra.begin(), extra.end());
    std::vector<char*> argv;
    for (auto& f : flags) argv.push_back(f.data());
    return parse_train_args(static_cast<int>(argv.size()), argv.data(), nullptr, 2);
  };
  EXPECT_FALSE(parse_ep2({}).no_save_optim);
  EXPECT_TRUE(parse_ep2({"--use-distributed-optimizer"}).use_distributed_optimizer);
}

// --moe-grouped-gemm with --ckpt-format torch saves megatron-core's GroupedMLP tensors, whose
// distributed-optimizer buffers tessera does not lay out: that save is refused by name.
TEST(TrainArguments, GroupedGemmTorchSaveRefusesTheDistributedOptimizer) {
  auto parse = [](std::vector<std::string> extra) {
    std::vector<std::string> flags = with({"--num-experts", "4", "--disable-bias-linear", "--moe-grouped-gemm",
                                           "--save", "/tmp", "--save-interval", "5", "--global-batch-size", "4"});
    flags.insert(flags.end(), extra.begin(), extra.end());
    std::vector<char*> argv;
    for (auto& f : flags) argv.push_back(f.data());
    return parse_train_args(static_cast<int>(argv.size()), argv.data(), nullptr, 1);
  };
  EXPECT_NO_THROW(parse({"--ckpt-format", "torch"}));
  EXPECT_NO_THROW(parse({"--ckpt-format", "torch", "--use-distributed-optimizer", "--no-save-optim"}));
  EXPECT_NO_THROW(parse({"--use-distributed-optimizer"}));  // torch_dist
  try {
    parse({"--ckpt-format", "torch", "--use-distributed-optimizer"});
    ADD_FAILURE() << "a GroupedMLP torch save with the distributed optimizer must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--moe-grouped-gemm and --use-distributed-optimizer"), std::string::npos)
        << e.what();
    EXPECT_NE(e.hint().find("torch_dist"), std::string::npos) << e.hint();
  }
}
