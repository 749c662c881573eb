// File helpers for the data layer: whole-file reads with errors that name the file, atomic
// outputs (temporary name, fsync, rename) with cleanup on SIGINT/SIGTERM, and anonymous
// scratch files.
#pragma once

#include <signal.h>

#include <cstdint>
#include <string>
#include <string_view>

namespace tessera::data {

// Reads a whole file; a tessera::Error names the file and the OS reason.
std::string read_file(const std::string& path, std::string_view what = "file");

// Installs SIGINT/SIGTERM handlers (once) that unlink every temporary file of a live
// AtomicFile and then die of the signal as usual. Safe to call many times.
void install_temp_file_cleanup();

// Blocks SIGINT/SIGTERM for its lifetime (so that renaming a pair of outputs is not cut in
// half by a signal), then restores the previous mask; pending signals are delivered after.
class SignalBlock {
 public:
  SignalBlock();
  ~SignalBlock();
  SignalBlock(const SignalBlock&) = delete;
  SignalBlock& operator=(const SignalBlock&) = delete;

 private:
  sigset_t saved_;
};

// A file written under "<path>.tmp.<pid>" and renamed to <path> by commit(). Until then
// nothing exists under <path>; the destructor (an error) and SIGINT/SIGTERM (see
// install_temp_file_cleanup) remove the temporary file. Writes are buffered.
class AtomicFile {
 public:
  explicit AtomicFile(std::string path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t size);
  void flush();
  // Flushes and fsyncs the temporary file (no rename yet).
  void sync();
  // sync() if needed, then rename to the final path and fsync the folder.
  void commit();
  uint64_t size() const { return written_; }
  int fd() const { return fd_; }  // for copy_file_range after flush()
  void note_external_write(uint64_t bytes) { written_ += bytes; }
  const std::string& path() const { return path_; }
  const std::string& temp_path() const { return temp_path_; }

 private:
  std::string path_, temp_path_;
  int fd_ = -1;
  int slot_ = -1;
  bool synced_ = false;
  uint64_t written_ = 0;
  std::string buffer_;
};

// An unnamed file in `dir` (O_TMPFILE, or created and unlinked at once): it never appears
// under any name and vanishes when closed, whatever happens to the process.
class ScratchFile {
 public:
  explicit ScratchFile(const std::string& dir);
  ~ScratchFile();
  ScratchFile(ScratchFile&& other) noexcept;
  ScratchFile& operator=(ScratchFile&&) = delete;
  ScratchFile(const ScratchFile&) = delete;

  void write(const void* data, size_t size);
  void flush();
  // Reads `size` bytes at `offset` (after flush()).
  void read_at(void* out, size_t size, uint64_t offset) const;
  uint64_t size() const { return written_; }
  int fd() const { return fd_; }
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  int fd_ = -1;
  uint64_t written_ = 0;
  std::string buffer_;
};

// Copies `size` bytes from in_fd at in_offset to the end of `out` (kernel copy when possible).
void copy_file_bytes(int in_fd, uint64_t in_offset, uint64_t size, AtomicFile& out,
                     const std::string& in_name);

// The folder part of a path ("." when there is none).
std::string parent_dir(const std::string& path);

}  // namespace tessera::data
