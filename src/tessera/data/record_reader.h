// Streams records out of preprocess inputs, in order, in bounded memory: JSONL (one JSON value
// per line, as Megatron reads it) or a JSON array of records (an Alpaca file), detected per
// file by its first non-blank byte; `.gz` files are decompressed on the fly. Records are only
// delimited here (cheaply, bytewise); parsing happens in the workers. Each record carries its
// file, line and column so that errors can point at it.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace tessera::data {

struct Record {
  uint64_t offset = 0;   // into Chunk::data
  uint64_t size = 0;     // bytes of the record (JSONL: the line without its newline)
  uint64_t index = 0;    // 0-based number of the record over all inputs (Megatron's line j)
  uint64_t line = 1;     // 1-based position of its first byte in its file
  uint64_t column = 1;   // 1-based, in characters
  uint32_t file = 0;     // index into the reader's file list
  bool newline = false;  // JSONL: the line ended with '\n' (Megatron counts it in its byte total)
  bool array_element = false;  // from a JSON array (errors then give line and column)
};

// A batch of consecutive records, copied back to back into `data` followed by padding (so that
// simdjson may read past the last one).
struct Chunk {
  uint64_t sequence = 0;  // 0, 1, 2, ... in input order
  std::string data;
  std::vector<Record> records;
  uint64_t consumed_bytes = 0;  // input bytes (compressed for .gz) read when the chunk was cut
  bool last = false;            // no records follow
  std::exception_ptr error;     // the input failed after these records (I/O, broken JSON array)
};

class RecordReader {
 public:
  // `on_open` is called with each file's path when the reader opens it.
  // read_bytes: size of each read from a file (tests use tiny ones to cross every boundary).
  RecordReader(std::vector<std::string> files, size_t chunk_bytes,
               std::function<void(const std::string&)> on_open = {}, size_t read_bytes = size_t{1} << 20);
  ~RecordReader();
  RecordReader(const RecordReader&) = delete;
  RecordReader& operator=(const RecordReader&) = delete;

  // Fills `chunk` (cleared first) with the next records: at least one unless the input is
  // exhausted (then chunk.last is set), about chunk_bytes of them. A failure of the input is
  // stored in chunk.error (with chunk.last set) after the records read before it.
  void next(Chunk& chunk);

  const std::vector<std::string>& files() const { return files_; }
  uint64_t total_bytes() const { return total_bytes_; }  // sum of the file sizes

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::vector<std::string> files_;
  uint64_t total_bytes_ = 0;
};

// Bytes of padding after the last record of a chunk (simdjson's SIMDJSON_PADDING).
size_t record_padding();

}  // namespace tessera::data
