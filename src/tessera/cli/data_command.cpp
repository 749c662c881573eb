// `tessera data <action>`: tools for indexed datasets.
//   merge    Megatron's tools/merge_datasets.py: --input PREFIX|DIR ... --output-prefix P
//   inspect  validate a dataset and print its header and counts: PREFIX ...
#include <sys/stat.h>

#include <cstdio>
#include <string>
#include <vector>

#include "tessera/cli/commands.h"
#include "tessera/core/error.h"
#include "tessera/core/options.h"
#include "tessera/data/indexed_dataset.h"

namespace tessera::cli {
namespace {

void print_help() {
  std::printf(
      "usage: tessera data <action> [flags]\n\n"
      "actions:\n"
      "  merge --input PREFIX|DIR [...] --output-prefix PREFIX\n"
      "      concatenate indexed datasets in the given order (a folder stands for all the\n"
      "      .bin/.idx pairs in it, sorted by name, as Megatron's tools/merge_datasets.py does)\n"
      "  inspect PREFIX [...]\n"
      "      validate <PREFIX>.idx/.bin and print dtype, sequences, documents and tokens\n");
}

// Megatron's tools/merge_datasets.py flags (argparse defaults: unique prefixes accepted).
const OptionTable& merge_option_table() {
  static const OptionTable table("tessera data merge",
                                 {
                                     {"--input", OptKind::List, nullptr, "dataset prefixes or folders, in order"},
                                     {"--output-prefix", OptKind::String, nullptr, "prefix of the merged dataset"},
                                     {"--multimodal", OptKind::StoreTrue, nullptr, "multimodal datasets (not supported yet)"},
                                 },
                                 {nullptr, true});
  return table;
}

int run_merge(int argc, char** argv) {
  ParsedOptions p = merge_option_table().parse(argc, argv);
  if (p.get_bool("--multimodal")) throw usage_error("--multimodal datasets are not supported yet");
  if (!p.given("--input") || !p.given("--output-prefix"))
    throw usage_error("merge needs --input and --output-prefix",
                      "e.g. tessera data merge --input a_text_document b_text_document --output-prefix ab_text_document");
  const std::string output_prefix = p.get_string("--output-prefix");
  std::vector<std::string> prefixes;
  for (const auto& in : p.get_list("--input")) {
    struct stat st{};
    if (::stat(in.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
      auto found = data::dataset_prefixes_in(in);
      if (found.empty()) throw runtime_error("folder " + in + " holds no .bin/.idx pair");
      prefixes.insert(prefixes.end(), found.begin(), found.end());
    } else {
      prefixes.push_back(in);
    }
  }
  data::install_temp_file_cleanup();
  for (const auto& pre : prefixes) std::printf("Merging %s\n", pre.c_str());
  data::MergeResult r = data::merge_datasets(prefixes, output_prefix);
  std::printf("Wrote %s.bin and .idx: %llu documents, %llu sequences, %llu tokens (%s)\n", output_prefix.c_str(),
              static_cast<unsigned long long>(r.documents), static_cast<unsigned long long>(r.sequences),
              static_cast<unsigned long long>(r.tokens), std::string(data::dtype_name(r.dtype)).c_str());
  return 0;
}

int run_inspect(int argc, char** argv) {
  if (argc == 0) throw usage_error("inspect needs a dataset prefix", "e.g. tessera data inspect my-gpt2_text_document");
  for (int i = 0; i < argc; ++i) {
    data::IndexedDataset ds(argv[i]);
    std::printf("%s: dtype %s, %llu sequences, %llu documents, %llu tokens, .bin %llu bytes%s\n", argv[i],
                std::string(data::dtype_name(ds.dtype())).c_str(),
                static_cast<unsigned long long>(ds.sequence_count()),
                static_cast<unsigned long long>(ds.document_count()),
                static_cast<unsigned long long>(ds.token_count()),
                static_cast<unsigned long long>(ds.bin_file().size()),
                ds.index().contiguous ? "" : " (sequences not contiguous)");
  }
  return 0;
}

}  // namespace

int run_data(int argc, char** argv) {
  std::string action = argc > 0 ? argv[0] : "";
  if (action.empty() || action == "--help" || action == "-h") {
    print_help();
    return action.empty() ? 2 : 0;
  }
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      print_help();
      return 0;
    }
  }
  if (action == "merge") return run_merge(argc - 1, argv + 1);
  if (action == "inspect") return run_inspect(argc - 1, argv + 1);
  throw usage_error("unknown action '" + action + "' for tessera data", "actions: merge, inspect");
}

}  // namespace tessera::cli
