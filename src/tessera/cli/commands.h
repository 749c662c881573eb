// Entry points of the subcommands; argv excludes the subcommand name.
#pragma once

namespace tessera {
class OptionTable;
class ParsedOptions;
}
namespace tessera::data {
struct TokenizerOptions;
}

namespace tessera::cli {

int run_train(int argc, char** argv);
int run_preprocess(int argc, char** argv);
int run_data(int argc, char** argv);
int run_launch(int argc, char** argv);
int run_bench(int argc, char** argv);
int run_doctor(int argc, char** argv);
int run_ckpt(int argc, char** argv);
int run_flags(int argc, char** argv);

// The option table of `tessera preprocess` (`tessera flags` reports on it).
const OptionTable& preprocess_option_table();
// The tokenizer that preprocess's tokenizer flags name (--tokenizer-type, --vocab-file,
// --merge-file, --vocab-size, --tokenizer-model), from options parsed by a table that holds
// them; `tessera data inspect --decode` takes the same flags.
data::TokenizerOptions preprocess_tokenizer_options(const ParsedOptions& p);

}  // namespace tessera::cli
