// The dataset index cache (megatron/core/datasets/gpt_dataset.py's
// _build_document_sample_shuffle_indices): Megatron's files, plus what Megatron lacks.
//
// Files in the cache folder for one dataset, `<base>` = "<md5>-<Class>-<split>":
//   <base>-description.txt       the hashed description (Megatron's)
//   <base>-<array>.npy           the index arrays (Megatron's names, numpy.save's bytes)
//   <base>-tessera.json          side file: the .idx/.bin sizes, .idx mtime/ctime/inode and SHA-256 of every
//                                source dataset, and each array's dtype, shape and SHA-256
//   <base>.lock                  the lock file (flock); it stays, empty
//
// load_or_build():
//   1. Without the lock: if the side file, the description and every array check out, map
//      the arrays read-only and return them (no writes; a read-only cache folder is fine).
//   2. Otherwise take an exclusive flock on the lock file (other processes on the node wait
//      here), check again (someone may have just built it), and if still invalid: remove the
//      side file, build, write each file atomically (temporary name, fsync, rename), and the
//      side file last, as the commit mark. A cache without a side file whose arrays pass the
//      structural check (Megatron's own cache) is adopted: its side file is written, nothing
//      is rebuilt.
// "Valid" means: description.txt equals the description; each source's .idx and .bin sizes
// equal the recorded ones and the .idx SHA-256 too (recomputed only when its mtime, ctime or inode changed);
// every .npy header parses, its size matches its shape, dtype and shape equal the recorded
// ones and pass the caller's structural check, and (verify_contents) the data's SHA-256
// matches. A stale, truncated or corrupt cache is rebuilt, with a warning saying why.
// The build is deterministic, so separate cache folders (nodes without shared storage) hold
// identical arrays.
#pragma once

#include "tessera/core/sha256.h"

#include <functional>
#include <string>
#include <vector>

#include "tessera/data/npy.h"

namespace tessera::data {

struct CacheEntry {
  std::string dir;                       // the cache folder
  std::string base;                      // "<md5>-GPTDataset-train"
  std::string description;               // the text hashed into <md5>
  std::vector<std::string> array_names;  // {"document_index", "sample_index", "shuffle_index"}
  std::vector<std::string> source_prefixes;  // datasets whose .idx/.bin the arrays depend on
  bool verify_contents = true;
  bool verbose = true;

  std::string path_of(const std::string& suffix) const;  // dir/base-suffix
  std::string lock_path() const;                         // dir/base.lock
  std::string side_file_path() const;                    // dir/base-tessera.json
};

struct CacheResult {
  std::vector<NpyArray> arrays;  // in array_names order
  bool built = false;            // this process built (and wrote) them
  bool adopted = false;          // a cache without a side file was accepted and given one
};

// `check(arrays)` returns "" when the loaded arrays have the dtypes and shapes the dataset
// expects, else the reason. `build()` computes the arrays.
CacheResult load_or_build(const CacheEntry& entry, const std::function<std::vector<NpyArray>()>& build,
                          const std::function<std::string(const std::vector<NpyArray>&)>& check);

// Lowercase hex SHA-256 (OpenSSL) of bytes, and of a whole file (mapped).
std::string sha256_file(const std::string& path);

// An exclusive flock(2) on `path` (created if needed) for the object's lifetime.
class FileLock {
 public:
  explicit FileLock(const std::string& path);
  ~FileLock();
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  int fd_ = -1;
};

// mkdir -p; a tessera::Error (with Megatron's hint about --data-cache-path) when it fails.
void make_cache_dir(const std::string& dir);

}  // namespace tessera::data
