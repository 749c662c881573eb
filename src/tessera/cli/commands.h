// Entry points of the subcommands; argv excludes the subcommand name.
#pragma once

namespace tessera {
class OptionTable;
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

}  // namespace tessera::cli
