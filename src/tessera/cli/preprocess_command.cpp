// `tessera preprocess` (alias `preprocess_data`): Megatron's tools/preprocess_data.py flags
// plus a few of tessera's own. One table drives parsing and --help.
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "tessera/cli/commands.h"
#include "tessera/core/error.h"
#include "tessera/core/options.h"
#include "tessera/data/preprocess.h"

namespace tessera::cli {
namespace {

using K = OptKind;

}  // namespace

const OptionTable& preprocess_option_table() {
  static const OptionTable table(
      "tessera preprocess",
      {
          {"--input", K::List, nullptr,
           "JSONL file (one JSON object per line) or JSON array of objects; globs and .gz allowed; required"},
          {"--json-keys", K::List, "text", "keys to extract; each gets its own <prefix>_<key>_document.bin/.idx"},
          {"--split-sentences", K::StoreTrue, nullptr, "split documents into sentences (not supported yet)"},
          {"--keep-newlines", K::StoreTrue, nullptr, "accepted (only matters with --split-sentences)"},
          {"--lang", K::String, "english", "accepted (NLTK language for --split-sentences)"},
          {"--text-template", K::String, nullptr,
           "build each document from record fields, e.g. '{instruction}\\n{input}\\n{output}' (tessera)"},
          {"--tokenizer-type", K::String, nullptr,
           "GPT2BPETokenizer, HuggingFaceTokenizer, Llama2Tokenizer, GPTSentencePieceTokenizer or NullTokenizer; "
           "required"},
          {"--vocab-file", K::String, nullptr, "GPT-2 vocab.json"},
          {"--merge-file", K::String, nullptr, "GPT-2 merges.txt"},
          {"--vocab-size", K::Int, nullptr, "vocabulary size for NullTokenizer (EOD is N)"},
          {"--append-eod", K::StoreTrue, nullptr, "append the EOD token to every non-empty document"},
          {"--vocab-extra-ids", K::Int, "0", "accepted (preprocess_data.py forces 0)"},
          {"--tokenizer-model", K::String, nullptr,
           "HuggingFaceTokenizer: the folder of tokenizer.json; Llama2Tokenizer, GPTSentencePieceTokenizer: the .model file"},
          {"--tiktoken-pattern", K::String, nullptr, "accepted (TikTokenizer is not supported yet)"},
          {"--tiktoken-num-special-tokens", K::Int, "1000", "accepted"},
          {"--tiktoken-special-tokens", K::List, nullptr, "accepted"},
          {"--output-prefix", K::String, nullptr, "output path without suffix; required"},
          {"--workers", K::Int, nullptr, "tokenizing threads (default: the number of cores)"},
          {"--partitions", K::Int, "1",
           "order documents as Megatron's N-partition run does (line j to partition j mod N, merged in order)"},
          {"--keep-sequential-samples", K::StoreTrue, nullptr,
           "with --partitions, keep input order (contiguous partitions)"},
          {"--log-interval", K::Int, "1000", "print progress every N documents"},
          {"--skip-bad-records", K::StoreTrue, nullptr,
           "skip records that cannot be read (bad JSON, missing key, ...), report and count them (tessera)"},
          {"--no-progress-bar", K::StoreTrue, nullptr, "never draw the terminal progress bar (tessera)"},
          {"--chunk-bytes", K::Int, "65536", "bytes of input per work item (tessera)"},
      },
      // tools/preprocess_data.py keeps argparse's default: unique prefixes are accepted.
      {nullptr, true});
  return table;
}

data::TokenizerOptions preprocess_tokenizer_options(const ParsedOptions& p) {
  data::TokenizerOptions o;
  o.type = p.get_string("--tokenizer-type");
  o.vocab_file = p.get_string("--vocab-file");
  o.merge_file = p.get_string("--merge-file");
  o.tokenizer_model = p.get_string("--tokenizer-model");
  if (p.raw("--vocab-size")) o.vocab_size = p.get_int("--vocab-size");
  return o;
}

namespace {

int64_t in_range(const ParsedOptions& p, const char* flag, int64_t lo, int64_t hi) {
  int64_t v = p.get_int(flag);
  if (v < lo || v > hi)
    throw usage_error(std::string(flag) + " must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " +
                      std::to_string(v));
  return v;
}

data::PreprocessOptions preprocess_options(const ParsedOptions& p) {
  data::PreprocessOptions o;
  std::string missing;
  for (const char* f : {"--input", "--output-prefix", "--tokenizer-type"})
    if (!p.given(f)) missing += std::string(" ") + f;
  if (!missing.empty()) throw usage_error("missing required flag(s):" + missing, "see `tessera preprocess --help`");
  if (p.get_bool("--split-sentences"))
    throw usage_error("--split-sentences is not supported yet",
                      "tessera writes document-level datasets (<prefix>_<key>_document), which is what "
                      "GPT pre-training reads; drop the flag, or split sentences with Megatron's NLTK pass");
  o.inputs = p.get_list("--input");
  if (p.given("--json-keys")) o.json_keys = p.get_list("--json-keys");
  if (p.raw("--text-template")) o.text_template = p.get_string("--text-template");
  o.tokenizer = preprocess_tokenizer_options(p);
  o.append_eod = p.get_bool("--append-eod");
  o.output_prefix = p.get_string("--output-prefix");
  if (p.raw("--workers")) o.workers = static_cast<int>(in_range(p, "--workers", 1, 1024));
  o.partitions = static_cast<int>(in_range(p, "--partitions", 1, 65536));
  o.keep_sequential_samples = p.get_bool("--keep-sequential-samples");
  o.log_interval = in_range(p, "--log-interval", 1, INT64_MAX);
  o.skip_bad_records = p.get_bool("--skip-bad-records");
  if (p.get_bool("--no-progress-bar")) o.progress_bar = data::PreprocessOptions::Progress::Never;
  o.chunk_bytes = static_cast<size_t>(in_range(p, "--chunk-bytes", 1, INT64_MAX));
  return o;
}

}  // namespace

int run_preprocess(int argc, char** argv) {
  for (int i = 0; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--help") || !std::strcmp(argv[i], "-h")) {
      preprocess_option_table().print_help();
      std::printf("\nTokenizes JSONL / JSON-array documents into Megatron's indexed dataset\n"
                  "(<prefix>_<key>_document.bin/.idx), byte-identical to tools/preprocess_data.py.\n");
      return 0;
    }
  }
  data::PreprocessResult r = data::preprocess(preprocess_options(preprocess_option_table().parse(argc, argv)));
  for (const auto& out : r.outputs)
    std::printf("Wrote %s.bin and .idx: %llu documents, %llu sequences, %llu tokens\n", out.prefix.c_str(),
                static_cast<unsigned long long>(out.documents), static_cast<unsigned long long>(out.sequences),
                static_cast<unsigned long long>(out.tokens));
  uint64_t tokens = 0;
  for (const auto& out : r.outputs) tokens += out.tokens;
  double secs = r.processing_seconds > 0 ? r.processing_seconds : 1e-9;
  std::printf("Done: %llu documents, %.2f MB of input in %.4f s (%.2f MB/s, %.0f tokens/s)\n",
              static_cast<unsigned long long>(r.documents), r.input_bytes / 1e6, r.processing_seconds,
              r.input_bytes / 1e6 / secs, tokens / secs);
  if (r.skipped > 0)
    std::fprintf(stderr, "warning: skipped %llu bad record(s) of %llu (--skip-bad-records)\n",
                 static_cast<unsigned long long>(r.skipped), static_cast<unsigned long long>(r.records));
  return 0;
}

}  // namespace tessera::cli
