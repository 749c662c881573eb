// Entry points of the subcommands; argv excludes the subcommand name.
#pragma once

namespace tessera::cli {

int run_train(int argc, char** argv);
int run_preprocess(int argc, char** argv);
int run_data(int argc, char** argv);
int run_launch(int argc, char** argv);
int run_bench(int argc, char** argv);
int run_doctor(int argc, char** argv);
int run_ckpt(int argc, char** argv);

}  // namespace tessera::cli
