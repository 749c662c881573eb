#include "tessera/data/gpt_dataset_cache.h"

#include "tessera/core/sha256.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <optional>

#include <nlohmann/json.hpp>

#include "tessera/core/error.h"
#include "tessera/core/log.h"
#include "tessera/data/file_util.h"
#include "tessera/data/indexed_dataset.h"

namespace tessera::data {

namespace {

constexpr int kSideFileFormat = 1;

struct FileStat {
  bool exists = false;
  uint64_t size = 0;
  int64_t mtime_ns = 0, ctime_ns = 0;
  uint64_t inode = 0;
};

FileStat stat_file(const std::string& path) {
  struct stat st{};
  FileStat s;
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return s;
  s.exists = true;
  s.size = static_cast<uint64_t>(st.st_size);
  s.mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000LL + st.st_mtim.tv_nsec;
  s.ctime_ns = static_cast<int64_t>(st.st_ctim.tv_sec) * 1000000000LL + st.st_ctim.tv_nsec;
  s.inode = static_cast<uint64_t>(st.st_ino);
  return s;
}

bool file_exists(const std::string& path) { return stat_file(path).exists; }

nlohmann::json source_record(const std::string& prefix) {
  FileStat idx = stat_file(idx_path(prefix)), bin = stat_file(bin_path(prefix));
  if (!idx.exists || !bin.exists)
    throw runtime_error("dataset " + prefix + ": missing " + (idx.exists ? bin_path(prefix) : idx_path(prefix)));
  return {{"prefix", prefix},
          {"idx_size", idx.size},
          {"idx_mtime_ns", idx.mtime_ns},
          {"idx_ctime_ns", idx.ctime_ns},
          {"idx_inode", idx.inode},
          {"idx_sha256", sha256_file(idx_path(prefix))},
          {"bin_size", bin.size}};
}

nlohmann::json array_record(const NpyArray& a) {
  return {{"dtype", std::string(npy_descr(a.dtype()))}, {"shape", a.shape()}, {"sha256", sha256_hex(a.bytes())}};
}

void write_text_atomic(const std::string& path, const std::string& text) {
  install_temp_file_cleanup();
  AtomicFile f(path);
  f.write(text.data(), text.size());
  f.commit();
}

struct LoadAttempt {
  bool ok = false;
  bool nothing_there = false;  // no file of this entry exists: a first build, not a rebuild
  bool side_missing = false;   // Megatron's files are valid but there is no side file
  std::string reason;
  std::vector<NpyArray> arrays;
};

// What `check` finds wrong with the loaded arrays ("" when nothing).
using ArrayCheck = std::function<std::string(const std::vector<NpyArray>&)>;

// Whether any file of the entry exists: none is a first build, not a rebuild.
bool any_cache_file(const CacheEntry& e) {
  if (file_exists(e.path_of("description.txt")) || file_exists(e.side_file_path())) return true;
  for (const auto& n : e.array_names)
    if (file_exists(e.path_of(n + ".npy"))) return true;
  return false;
}

// The steps below return why the cache cannot be used, or "" when they find nothing wrong.

// Megatron's own files: the expected description, then every array (read into `arrays`), and
// `check` content with them.
std::string load_megatron_files(const CacheEntry& e, const ArrayCheck& check, std::vector<NpyArray>& arrays) {
  const std::string desc_path = e.path_of("description.txt");
  if (!file_exists(desc_path)) return desc_path + " is missing";
  if (read_file(desc_path) != e.description) return desc_path + " does not hold the expected description";
  for (const auto& n : e.array_names) {
    std::string p = e.path_of(n + ".npy");
    if (!file_exists(p)) return p + " is missing";
    arrays.push_back(read_npy(p));  // validates header against the file size
  }
  return check(arrays);
}

// The source datasets as the side file records them, each unchanged since the cache was built.
std::string changed_source(const CacheEntry& e, const nlohmann::json& sources) {
  if (!sources.is_array() || sources.size() != e.source_prefixes.size())
    return e.side_file_path() + " records other source datasets";
  for (size_t i = 0; i < e.source_prefixes.size(); ++i) {
    const auto& rec = sources[i];
    const std::string& prefix = e.source_prefixes[i];
    if (rec.at("prefix").get<std::string>() != prefix) return e.side_file_path() + " records other source datasets";
    FileStat idx = stat_file(idx_path(prefix)), bin = stat_file(bin_path(prefix));
    if (idx.size != rec.at("idx_size").get<uint64_t>() || bin.size != rec.at("bin_size").get<uint64_t>())
      return "the size of " + prefix + ".idx or .bin changed since the cache was built (stale cache)";
    // The .idx is re-hashed only when it may have changed (another mtime, ctime or inode).
    bool same_file = idx.mtime_ns == rec.at("idx_mtime_ns").get<int64_t>() &&
                     idx.ctime_ns == rec.at("idx_ctime_ns").get<int64_t>() &&
                     idx.inode == rec.at("idx_inode").get<uint64_t>();
    if (!same_file && sha256_file(idx_path(prefix)) != rec.at("idx_sha256").get<std::string>())
      return prefix + ".idx changed since the cache was built (stale cache)";
  }
  return "";
}

// The arrays as the side file records them: dtype and shape, and with verify_contents the SHA-256.
std::string changed_array(const CacheEntry& e, const nlohmann::json& records, const std::vector<NpyArray>& arrays) {
  for (size_t i = 0; i < e.array_names.size(); ++i) {
    const auto& rec = records.at(e.array_names[i]);
    const NpyArray& a = arrays[i];
    if (rec.at("dtype").get<std::string>() != npy_descr(a.dtype()) ||
        rec.at("shape").get<std::vector<int64_t>>() != a.shape())
      return e.path_of(e.array_names[i] + ".npy") + " has another dtype or shape than recorded";
    if (e.verify_contents && sha256_hex(a.bytes()) != rec.at("sha256").get<std::string>())
      return e.path_of(e.array_names[i] + ".npy") + " does not match its recorded SHA-256 (corrupt)";
  }
  return "";
}

// tessera's side file (present): valid JSON of this format for this dataset, whose sources and
// arrays are as recorded.
std::string side_file_problem(const CacheEntry& e, const std::vector<NpyArray>& arrays) {
  nlohmann::json side;
  try {
    side = nlohmann::json::parse(read_file(e.side_file_path()));
  } catch (const nlohmann::json::exception&) {
    return e.side_file_path() + " is not valid JSON";
  }
  if (side.value("format", 0) != kSideFileFormat || side.value("base", std::string()) != e.base)
    return e.side_file_path() + " has another format or names another dataset";
  std::string problem = changed_source(e, side.at("sources"));
  if (problem.empty()) problem = changed_array(e, side.at("arrays"), arrays);
  return problem;
}

LoadAttempt try_load(const CacheEntry& e, const ArrayCheck& check) {
  LoadAttempt r;
  if (!any_cache_file(e)) {
    r.nothing_there = true;
    r.reason = "no cache";
    return r;
  }
  try {
    r.reason = load_megatron_files(e, check, r.arrays);
    if (!r.reason.empty()) return r;
    if (!file_exists(e.side_file_path())) {
      r.side_missing = true;
      r.reason = e.side_file_path() + " is missing";
      return r;
    }
    r.reason = side_file_problem(e, r.arrays);
    if (!r.reason.empty()) return r;
  } catch (const Error& ex) {
    r.reason = ex.what();
    r.arrays.clear();
    return r;
  } catch (const nlohmann::json::exception& ex) {
    r.reason = e.side_file_path() + " is malformed (" + ex.what() + ")";
    r.arrays.clear();
    return r;
  }
  r.ok = true;
  return r;
}

void write_side_file(const CacheEntry& e, const std::vector<NpyArray>& arrays) {
  nlohmann::json side;
  side["format"] = kSideFileFormat;
  side["base"] = e.base;
  side["description_md5"] = e.base.substr(0, e.base.find('-'));
  nlohmann::json sources = nlohmann::json::array();
  for (const auto& p : e.source_prefixes) sources.push_back(source_record(p));
  side["sources"] = sources;
  nlohmann::json recs = nlohmann::json::object();
  for (size_t i = 0; i < arrays.size(); ++i) recs[e.array_names[i]] = array_record(arrays[i]);
  side["arrays"] = recs;
  write_text_atomic(e.side_file_path(), side.dump(2) + "\n");
}

}  // namespace

std::string CacheEntry::path_of(const std::string& suffix) const { return dir + "/" + base + "-" + suffix; }
std::string CacheEntry::lock_path() const { return dir + "/" + base + ".lock"; }
std::string CacheEntry::side_file_path() const { return path_of("tessera.json"); }

std::string sha256_file(const std::string& path) {
  MappedFile f(path);
  return sha256_hex(f.bytes());
}

FileLock::FileLock(const std::string& path) {
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    int err = errno;
    throw runtime_error("cannot create the cache lock file " + path + ": " + std::strerror(err),
                        "supply a folder you can write to with --data-cache-path");
  }
  while (::flock(fd_, LOCK_EX) != 0) {
    if (errno == EINTR) continue;
    int err = errno;
    ::close(fd_);
    throw runtime_error("cannot lock " + path + ": " + std::strerror(err),
                        "the cache folder's filesystem must support flock(2); use a local --data-cache-path");
  }
}

FileLock::~FileLock() {
  if (fd_ >= 0) {
    ::flock(fd_, LOCK_UN);
    ::close(fd_);
  }
}

void make_cache_dir(const std::string& dir) {
  std::string partial;
  size_t pos = 0;
  while (pos != std::string::npos) {
    pos = dir.find('/', pos + 1);
    partial = dir.substr(0, pos);
    if (partial.empty()) continue;
    if (::mkdir(partial.c_str(), 0755) != 0 && errno != EEXIST) {
      int err = errno;
      throw runtime_error("Failed to write dataset materials to the data cache directory " + dir + ": cannot create " +
                              partial + ": " + std::strerror(err),
                          "supply a directory to which you have write access with --data-cache-path");
    }
  }
  struct stat st{};
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    throw runtime_error(dir + " is not a directory", "supply a cache directory with --data-cache-path");
}

CacheResult load_or_build(const CacheEntry& e, const std::function<std::vector<NpyArray>()>& build,
                          const std::function<std::string(const std::vector<NpyArray>&)>& check) {
  CacheResult result;
  LoadAttempt first = try_load(e, check);
  if (first.ok) {
    result.arrays = std::move(first.arrays);
    return result;
  }
  if (first.side_missing && ::access(e.dir.c_str(), W_OK) != 0) {
    // Megatron's cache in a folder we cannot write: use it as Megatron would, unverified.
    if (e.verbose) print_rank_0(" > using the read-only dataset cache %s/%s-* without a side file", e.dir.c_str(), e.base.c_str());
    result.arrays = std::move(first.arrays);
    return result;
  }
  first.arrays.clear();  // unmap before anyone replaces the files
  make_cache_dir(e.dir);
  FileLock lock(e.lock_path());
  LoadAttempt again = try_load(e, check);
  if (again.ok) {
    result.arrays = std::move(again.arrays);
    return result;
  }
  if (again.side_missing) {
    // Megatron's own cache (or one whose side file was lost): structurally sound, adopt it.
    write_side_file(e, again.arrays);
    if (e.verbose) print_rank_0(" > adopted the dataset cache %s-* (written without a side file)", e.base.c_str());
    result.arrays = std::move(again.arrays);
    result.adopted = true;
    return result;
  }
  if (!again.nothing_there) log_warn("rebuilding the dataset cache %s/%s-*: %s", e.dir.c_str(), e.base.c_str(), again.reason.c_str());
  again.arrays.clear();
  if (::unlink(e.side_file_path().c_str()) != 0 && errno != ENOENT) {
    int err = errno;
    throw runtime_error("cannot remove " + e.side_file_path() + ": " + std::strerror(err),
                        "supply a directory to which you have write access with --data-cache-path");
  }
  result.arrays = build();
  TESSERA_CHECK(result.arrays.size() == e.array_names.size(), "cache build returned the wrong number of arrays");
  write_text_atomic(e.path_of("description.txt"), e.description);
  for (size_t i = 0; i < e.array_names.size(); ++i) write_npy(e.path_of(e.array_names[i] + ".npy"), result.arrays[i]);
  write_side_file(e, result.arrays);
  result.built = true;
  return result;
}

}  // namespace tessera::data
