// `tessera data <action>`: tools for indexed datasets.
//   merge    Megatron's tools/merge_datasets.py: --input PREFIX|DIR ... --output-prefix P
//   inspect  validate a dataset and print its header, counts and document lengths; decode a
//            document with the tokenizer flags: PREFIX ... [--decode N <tokenizer flags>]
#include <sys/stat.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "tessera/cli/commands.h"
#include "tessera/core/error.h"
#include "tessera/core/options.h"
#include "tessera/data/dataset_stats.h"
#include "tessera/data/indexed_dataset.h"
#include "tessera/data/tokenizer.h"

namespace tessera::cli {
namespace {

void print_help() {
  std::printf(
      "usage: tessera data <action> [flags]\n\n"
      "actions:\n"
      "  merge --input PREFIX|DIR [...] --output-prefix PREFIX\n"
      "      concatenate indexed datasets in the given order (a folder stands for all the\n"
      "      .bin/.idx pairs in it, sorted by name, as Megatron's tools/merge_datasets.py does)\n"
      "  inspect PREFIX [...] [--decode N <the tokenizer flags of tessera preprocess>]\n"
      "      validate <PREFIX>.idx/.bin and print dtype, sequences, documents, tokens and the\n"
      "      document lengths (min, percentiles, mean, max); --decode prints document N as text\n"
      "      (--tokenizer-type T with --vocab-file V --merge-file M, --tokenizer-model M or --vocab-size N)\n");
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

bool exists(const std::string& path, bool folder) {
  struct stat st{};
  return ::stat(path.c_str(), &st) == 0 && (S_ISDIR(st.st_mode) == folder);
}

// The datasets one --input names: the prefix's own .bin/.idx when either file is there, else
// every pair in the folder of that name. A prefix a run has trained on is both: training
// keeps its index cache in <prefix>/cache/GPTDataset_indices (Megatron's default
// --data-cache-path), so the pair beside the folder wins.
std::vector<std::string> merge_input_prefixes(const std::string& in) {
  if (exists(in + ".bin", false) || exists(in + ".idx", false) || !exists(in, true)) return {in};
  std::vector<std::string> found = data::dataset_prefixes_in(in);
  if (found.empty())
    throw runtime_error("--input " + in + " holds no dataset: there is no " + in + ".bin/.idx pair, and the folder " +
                            in + " holds no .bin/.idx pair",
                        "give a dataset prefix (the path without .bin/.idx) or a folder of them");
  return found;
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
    const std::vector<std::string> found = merge_input_prefixes(in);
    prefixes.insert(prefixes.end(), found.begin(), found.end());
  }
  data::install_temp_file_cleanup();
  for (const auto& pre : prefixes) std::printf("Merging %s\n", pre.c_str());
  data::MergeResult r = data::merge_datasets(prefixes, output_prefix);
  std::printf("Wrote %s.bin and .idx: %llu documents, %llu sequences, %llu tokens (%s)\n", output_prefix.c_str(),
              static_cast<unsigned long long>(r.documents), static_cast<unsigned long long>(r.sequences),
              static_cast<unsigned long long>(r.tokens), std::string(data::dtype_name(r.dtype)).c_str());
  return 0;
}

// `data inspect`'s flags: --decode and the tokenizer flags of `tessera preprocess` (its own
// definitions, so the two cannot drift); everything else on its command line is a prefix.
const OptionTable& inspect_option_table() {
  static const OptionTable table = [] {
    std::vector<OptionDef> defs = {
        {"--decode", OptKind::Int, nullptr, "print document N of each dataset as text (needs the tokenizer flags)"}};
    for (const OptionDef& def : preprocess_option_table().defs())
      for (const char* flag : {"--tokenizer-type", "--vocab-file", "--merge-file", "--vocab-size", "--tokenizer-model"})
        if (std::strcmp(def.flag, flag) == 0) defs.push_back(def);
    return OptionTable("tessera data inspect", std::move(defs));
  }();
  return table;
}

void print_document_lengths(const data::IndexedDataset& ds) {
  const data::DocumentLengthStats s = data::document_length_stats(ds);
  if (s.documents == 0) return;
  std::printf("  document lengths (tokens): min %lld, p10 %lld, median %lld, mean %.1f, p90 %lld, p99 %lld, max %lld",
              static_cast<long long>(s.min), static_cast<long long>(s.p10), static_cast<long long>(s.median), s.mean,
              static_cast<long long>(s.p90), static_cast<long long>(s.p99), static_cast<long long>(s.max));
  if (s.empty) std::printf("; %llu empty", static_cast<unsigned long long>(s.empty));
  std::printf("\n");
}

int run_inspect(int argc, char** argv) {
  std::vector<std::string> prefixes;
  std::vector<char*> flags;
  for (int i = 0; i < argc; ++i) {
    if (std::strncmp(argv[i], "--", 2) != 0) {
      prefixes.push_back(argv[i]);
      continue;
    }
    flags.push_back(argv[i]);  // every inspect flag takes one value
    if (!std::strchr(argv[i], '=') && i + 1 < argc) flags.push_back(argv[++i]);
  }
  const ParsedOptions p = inspect_option_table().parse(static_cast<int>(flags.size()), flags.data());
  if (prefixes.empty())
    throw usage_error("inspect needs a dataset prefix", "e.g. tessera data inspect my-gpt2_text_document");
  std::unique_ptr<data::Tokenizer> tokenizer;
  const std::optional<int64_t> decode = p.get_opt_int("--decode");
  if (decode) {
    if (!p.given("--tokenizer-type"))
      throw usage_error("--decode needs the tokenizer the data was preprocessed with",
                        "add the tokenizer flags of `tessera preprocess`: --tokenizer-type GPT2BPETokenizer "
                        "--vocab-file vocab.json --merge-file merges.txt, HuggingFaceTokenizer --tokenizer-model "
                        "FOLDER, Llama2Tokenizer or GPTSentencePieceTokenizer --tokenizer-model FILE.model, or "
                        "NullTokenizer --vocab-size N");
    if (*decode < 0) throw usage_error("--decode takes a document number >= 0");
    tokenizer = data::build_tokenizer(preprocess_tokenizer_options(p));
  }
  for (const std::string& prefix : prefixes) {
    data::IndexedDataset ds(prefix);
    std::printf("%s: dtype %s, %llu sequences, %llu documents, %llu tokens, .bin %llu bytes%s\n", prefix.c_str(),
                std::string(data::dtype_name(ds.dtype())).c_str(),
                static_cast<unsigned long long>(ds.sequence_count()),
                static_cast<unsigned long long>(ds.document_count()),
                static_cast<unsigned long long>(ds.token_count()),
                static_cast<unsigned long long>(ds.bin_file().size()),
                ds.index().contiguous ? "" : " (sequences not contiguous)");
    print_document_lengths(ds);
    if (!tokenizer) continue;
    const std::vector<int32_t> ids = data::document_tokens(ds, static_cast<uint64_t>(*decode));
    std::printf("  document %lld (%zu tokens):\n%s\n", static_cast<long long>(*decode), ids.size(),
                tokenizer->decode(ids).c_str());
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
