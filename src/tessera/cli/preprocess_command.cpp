// `tessera preprocess` (alias `preprocess_data`): Megatron's tools/preprocess_data.py flags
// (megatron.md §2.1) plus a few of tessera's own. One table drives parsing and --help.
#include <cstdio>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "tessera/cli/commands.h"
#include "tessera/core/error.h"
#include "tessera/data/index_format.h"
#include "tessera/data/preprocess.h"

namespace tessera::cli {
namespace {

using data::PreprocessOptions;
using Values = std::vector<std::string>;

struct Flag {
  const char* name;
  const char* metavar;  // nullptr: a switch without value
  bool many;            // nargs='+'
  const char* group;
  const char* help;
  std::function<void(PreprocessOptions&, const Values&)> apply;
};

int64_t to_int(const std::string& flag, const std::string& v) {
  try {
    size_t used = 0;
    long long x = std::stoll(v, &used);
    if (used == v.size()) return x;
  } catch (const std::exception&) {
  }
  throw usage_error(flag + " expects an integer, got '" + v + "'");
}

const std::vector<Flag>& flags() {
  static const std::vector<Flag> table = {
      {"--input", "PATH", true, "input data",
       "JSONL file (one JSON object per line) or JSON array of objects; globs and .gz allowed; required",
       [](PreprocessOptions& o, const Values& v) { o.inputs = v; }},
      {"--json-keys", "KEY", true, "input data",
       "keys to extract; each gets its own <prefix>_<key>_document.bin/.idx (default: text)",
       [](PreprocessOptions& o, const Values& v) { o.json_keys = v; }},
      {"--split-sentences", nullptr, false, "input data", "split documents into sentences (not supported yet)",
       [](PreprocessOptions&, const Values&) {
         throw usage_error("--split-sentences is not supported yet",
                           "tessera writes document-level datasets (<prefix>_<key>_document), which is what "
                           "GPT pre-training reads; drop the flag, or split sentences with Megatron's NLTK pass");
       }},
      {"--keep-newlines", nullptr, false, "input data", "accepted for compatibility (only matters with --split-sentences)",
       [](PreprocessOptions&, const Values&) {}},
      {"--lang", "LANG", false, "input data", "accepted for compatibility (NLTK language for --split-sentences)",
       [](PreprocessOptions&, const Values&) {}},
      {"--text-template", "TEMPLATE", false, "input data",
       "build each document from record fields, e.g. '{instruction}\\n{input}\\n{output}' (tessera)",
       [](PreprocessOptions& o, const Values& v) { o.text_template = v[0]; }},
      {"--tokenizer-type", "TYPE", false, "tokenizer", "GPT2BPETokenizer or NullTokenizer; required",
       [](PreprocessOptions& o, const Values& v) { o.tokenizer.type = v[0]; }},
      {"--vocab-file", "PATH", false, "tokenizer", "GPT-2 vocab.json",
       [](PreprocessOptions& o, const Values& v) { o.tokenizer.vocab_file = v[0]; }},
      {"--merge-file", "PATH", false, "tokenizer", "GPT-2 merges.txt",
       [](PreprocessOptions& o, const Values& v) { o.tokenizer.merge_file = v[0]; }},
      {"--vocab-size", "N", false, "tokenizer", "vocabulary size for NullTokenizer (EOD is N)",
       [](PreprocessOptions& o, const Values& v) { o.tokenizer.vocab_size = to_int("--vocab-size", v[0]); }},
      {"--append-eod", nullptr, false, "tokenizer", "append the EOD token to every non-empty document",
       [](PreprocessOptions& o, const Values&) { o.append_eod = true; }},
      {"--vocab-extra-ids", "N", false, "tokenizer", "accepted for compatibility (preprocess_data.py forces 0)",
       [](PreprocessOptions&, const Values&) {}},
      {"--tokenizer-model", "PATH", false, "tokenizer", "accepted for compatibility (no model-file tokenizer yet)",
       [](PreprocessOptions&, const Values&) {}},
      {"--tiktoken-pattern", "V", false, "tokenizer", "accepted for compatibility (TikTokenizer is not supported yet)",
       [](PreprocessOptions&, const Values&) {}},
      {"--tiktoken-num-special-tokens", "N", false, "tokenizer", "accepted for compatibility",
       [](PreprocessOptions&, const Values&) {}},
      {"--tiktoken-special-tokens", "TOKEN", true, "tokenizer", "accepted for compatibility",
       [](PreprocessOptions&, const Values&) {}},
      {"--output-prefix", "PREFIX", false, "output data", "output path without suffix; required",
       [](PreprocessOptions& o, const Values& v) { o.output_prefix = v[0]; }},
      {"--workers", "N", false, "runtime", "tokenizing threads (default: the number of cores)",
       [](PreprocessOptions& o, const Values& v) {
         int64_t n = to_int("--workers", v[0]);
         if (n < 1 || n > 1024) throw usage_error("--workers must be in [1, 1024], got " + v[0]);
         o.workers = static_cast<int>(n);
       }},
      {"--partitions", "N", false, "runtime",
       "order documents as Megatron's N-partition run does (line j to partition j mod N, merged in order)",
       [](PreprocessOptions& o, const Values& v) {
         int64_t n = to_int("--partitions", v[0]);
         if (n < 1 || n > 65536) throw usage_error("--partitions must be in [1, 65536], got " + v[0]);
         o.partitions = static_cast<int>(n);
       }},
      {"--keep-sequential-samples", nullptr, false, "runtime",
       "with --partitions, keep input order (contiguous partitions)",
       [](PreprocessOptions& o, const Values&) { o.keep_sequential_samples = true; }},
      {"--log-interval", "N", false, "runtime", "print progress every N documents (default: 1000)",
       [](PreprocessOptions& o, const Values& v) {
         o.log_interval = to_int("--log-interval", v[0]);
         if (o.log_interval < 1) throw usage_error("--log-interval must be at least 1");
       }},
      {"--skip-bad-records", nullptr, false, "tessera",
       "skip records that cannot be read (bad JSON, missing key, ...), report and count them",
       [](PreprocessOptions& o, const Values&) { o.skip_bad_records = true; }},
      {"--no-progress-bar", nullptr, false, "tessera", "never draw the terminal progress bar",
       [](PreprocessOptions& o, const Values&) { o.progress_bar = PreprocessOptions::Progress::Never; }},
      {"--chunk-bytes", "N", false, "tessera", "bytes of input per work item (default: 65536)",
       [](PreprocessOptions& o, const Values& v) {
         int64_t n = to_int("--chunk-bytes", v[0]);
         if (n < 1) throw usage_error("--chunk-bytes must be at least 1");
         o.chunk_bytes = static_cast<size_t>(n);
       }},
  };
  return table;
}

void print_help() {
  std::printf(
      "usage: tessera preprocess --input PATH --output-prefix PREFIX --tokenizer-type TYPE [flags]\n\n"
      "Tokenizes JSONL / JSON-array documents into Megatron's indexed dataset\n"
      "(<prefix>_<key>_document.bin/.idx), byte-identical to tools/preprocess_data.py.\n");
  const char* group = "";
  for (const auto& f : flags()) {
    if (std::string(group) != f.group) {
      group = f.group;
      std::printf("\n%s:\n", group);
    }
    std::string spec = f.name;
    if (f.metavar) spec += std::string(" ") + f.metavar + (f.many ? " [...]" : "");
    std::printf("  %-34s %s\n", spec.c_str(), f.help);
  }
}

const Flag& find_flag(const std::string& name) {
  const Flag* match = nullptr;
  int matches = 0;
  for (const auto& f : flags()) {
    if (name == f.name) return f;
    if (std::string(f.name).rfind(name, 0) == 0) {  // argparse accepts unique prefixes
      match = &f;
      ++matches;
    }
  }
  if (matches == 1) return *match;
  if (matches > 1) throw usage_error("ambiguous flag " + name, "spell it out; see `tessera preprocess --help`");
  throw usage_error("unknown flag " + name, "see `tessera preprocess --help`");
}

}  // namespace

int run_preprocess(int argc, char** argv) {
  PreprocessOptions o;
  std::vector<std::string> args(argv, argv + argc);
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") {
      print_help();
      return 0;
    }
    if (a.rfind("--", 0) != 0) throw usage_error("unexpected argument '" + a + "'", "see `tessera preprocess --help`");
    std::string name = a;
    Values values;
    bool inline_value = false;
    if (auto eq = a.find('='); eq != std::string::npos) {
      name = a.substr(0, eq);
      values.push_back(a.substr(eq + 1));
      inline_value = true;
    }
    const Flag& f = find_flag(name);
    if (!f.metavar) {
      if (inline_value) throw usage_error(std::string(f.name) + " takes no value");
    } else if (!inline_value || f.many) {
      while (i + 1 < args.size() && args[i + 1].rfind("--", 0) != 0) {
        values.push_back(args[++i]);
        if (!f.many) break;
      }
      if (values.empty()) throw usage_error(std::string(f.name) + " expects a value (" + f.metavar + ")");
    }
    f.apply(o, values);
  }
  if (o.inputs.empty() || o.output_prefix.empty() || o.tokenizer.type.empty()) {
    std::string missing;
    if (o.inputs.empty()) missing += " --input";
    if (o.output_prefix.empty()) missing += " --output-prefix";
    if (o.tokenizer.type.empty()) missing += " --tokenizer-type";
    throw usage_error("missing required flag(s):" + missing, "see `tessera preprocess --help`");
  }
  data::PreprocessResult r = data::preprocess(o);
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
