// Whole-file reads and durable writes, with errors that name the file. Streaming writers
// with signal clean-up (preprocess) live in data/file_util.h.
#pragma once

#include <span>
#include <string>

namespace tessera {

// The file's bytes; an Error naming the file when it cannot be read.
std::string read_file(const std::string& path);

// Writes `bytes` to `path` (created or truncated) and fsyncs it.
void write_file_synced(const std::string& path, std::span<const char> bytes);

// write_file_synced in pieces, for files assembled from bounded buffers (checkpoints staged
// from a device): append() each piece, then finish() fsyncs and closes. A writer destroyed
// unfinished closes the file and leaves it as written so far.
class SyncedFileWriter {
 public:
  explicit SyncedFileWriter(const std::string& path);  // created or truncated
  ~SyncedFileWriter();
  SyncedFileWriter(const SyncedFileWriter&) = delete;
  SyncedFileWriter& operator=(const SyncedFileWriter&) = delete;
  void append(std::span<const char> bytes);
  void finish();

 private:
  std::string path_;
  int fd_ = -1;
};

// Replaces `path` atomically: writes `<path>.tmp.<pid>`, fsyncs it, renames it over `path`
// and fsyncs the folder. On failure the temporary is removed and `path` is untouched.
void write_file_atomic(const std::string& path, std::span<const char> bytes);

// fsyncs a folder, making renames and creations inside it durable.
void fsync_directory(const std::string& path);

// Throws a usage error naming `flag` and `dir` unless files can be created in `dir`, or, when
// it does not exist yet, in the nearest parent that does (where it would be created): a
// parent that is a regular file, an unreadable path or a refused file fail. It creates and
// removes a file, since access() grants root every permission that a read-only mount refuses.
void check_folder_writable(const std::string& dir, const std::string& flag);

}  // namespace tessera
