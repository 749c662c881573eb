// `tessera preprocess`: Megatron's tools/preprocess_data.py as a streaming,
// multi-threaded pipeline whose .bin/.idx outputs are byte-identical to Megatron core_r0.10.0's
// for the same input and flags.
//
//   reader thread --chunks--> N worker threads (parse JSON, tokenize) --results--> writer
//   (calling thread), which takes the results in input order and feeds the builders.
//
// Memory is bounded by the number of chunks in flight (4 per worker) times the chunk size, plus
// the largest single record; the builders spill their index arrays to scratch files.
#pragma once

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "tessera/data/tokenizer.h"

namespace tessera::data {

struct PreprocessOptions {
  std::vector<std::string> inputs;            // --input: paths or glob patterns
  std::vector<std::string> json_keys{"text"}; // --json-keys
  std::string output_prefix;                  // --output-prefix
  TokenizerOptions tokenizer;
  bool append_eod = false;
  int workers = 0;      // 0: the number of hardware threads
  int partitions = 1;   // --partitions: document order as Megatron's partitioned run
  bool keep_sequential_samples = false;
  int64_t log_interval = 1000;
  std::optional<std::string> text_template;   // --text-template
  bool skip_bad_records = false;
  size_t chunk_bytes = size_t{64} << 10;
  enum class Progress { Auto, Always, Never } progress_bar = Progress::Auto;  // Auto: when err is a terminal
  FILE* out = stdout;  // Megatron's stdout lines ("Opening ...", "Time to startup: ...")
  FILE* err = stderr;  // progress lines, the bar, skipped-record warnings
};

struct PreprocessOutput {
  std::string key;
  std::string prefix;  // <output-prefix>_<key>_document
  uint64_t sequences = 0, documents = 0, tokens = 0;
};

struct PreprocessResult {
  uint64_t records = 0;    // records read (documents + skipped)
  uint64_t documents = 0;  // documents written (per key)
  uint64_t skipped = 0;    // bad records skipped with --skip-bad-records
  uint64_t chars = 0;      // Megatron's byte count: characters of the raw records
  uint64_t input_bytes = 0;
  double startup_seconds = 0, processing_seconds = 0;
  std::vector<PreprocessOutput> outputs;
};

// Runs the preprocessing. Errors (bad flags, unreadable input, unwritable output, a bad record
// without --skip-bad-records) are tessera::Errors; no output exists under its final name
// unless the run succeeds.
PreprocessResult preprocess(const PreprocessOptions& options);

// The input files: each pattern that names an existing path is taken as is, others are
// expanded as globs (sorted). No match is an Error.
std::vector<std::string> expand_inputs(const std::vector<std::string>& patterns);

}  // namespace tessera::data
