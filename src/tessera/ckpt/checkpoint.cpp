#include "tessera/ckpt/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "tessera/ckpt/safetensors.h"
#include "tessera/core/error.h"
#include "tessera/core/sha256.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

constexpr const char* kTracker = "latest_checkpointed_iteration.txt";
constexpr const char* kShard = "mp_rank_00";  // tensor and pipeline parallelism are 1 for now
constexpr int kFormatVersion = 1;

std::string iteration_dir(const std::string& dir, int64_t iteration) {
  char name[32];
  std::snprintf(name, sizeof(name), "iter_%07lld", static_cast<long long>(iteration));
  return (fs::path(dir) / name).string();
}

std::string errno_text() { return std::strerror(errno); }

void fsync_path(const std::string& path, bool directory) {
  int fd = ::open(path.c_str(), (directory ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
  if (fd < 0) throw runtime_error("cannot open " + path + " to sync it: " + errno_text());
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) throw runtime_error("fsync of " + path + " failed: " + errno_text(), "check the disk");
}

void write_file(const std::string& path, const void* data, size_t size) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw runtime_error("cannot write " + path + ": " + errno_text(), "check --save and free disk space");
  const char* p = static_cast<const char*>(data);
  size_t left = size;
  while (left > 0) {
    ssize_t n = ::write(fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const std::string why = errno_text();
      ::close(fd);
      throw runtime_error("writing " + path + " failed: " + why, "check free disk space under --save");
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) throw runtime_error("fsync of " + path + " failed: " + errno_text());
}

// Safetensors bytes of `tensors`, each with its global shape and offset in the metadata.
std::vector<uint8_t> serialize_tensors(const std::vector<NamedTensor>& tensors) {
  std::vector<safetensors::WriteEntry> entries;
  std::map<std::string, std::string> metadata{{"format", "tessera-checkpoint"}};
  for (const NamedTensor& t : tensors) {
    entries.push_back({t.name, t.tensor.dtype, t.tensor.shape, t.tensor.ptr});
    metadata[t.name] = "global_shape=" + shape_str(t.tensor.shape) + ";offset=" + shape_str(Shape(t.tensor.shape.size(), 0));
  }
  return safetensors::serialize(entries, metadata);
}

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw runtime_error("cannot read " + path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void load_tensors(const std::string& path, const std::vector<NamedTensor>& into) {
  safetensors::Reader reader = safetensors::Reader::open(path);
  for (const NamedTensor& t : into) {
    const safetensors::TensorInfo* info = reader.find(t.name);
    if (!info) throw runtime_error(path + " lacks tensor " + t.name, "the checkpoint belongs to another model");
    if (info->shape != t.tensor.shape || info->dtype != t.tensor.dtype)
      throw runtime_error(path + ": tensor " + t.name + " is " + info->dtype_name + " " + shape_str(info->shape) +
                              ", the model expects " + std::string(dtype_name(t.tensor.dtype)) + " " +
                              shape_str(t.tensor.shape),
                          "load with the model flags the checkpoint was saved with (see its metadata.json)");
    std::span<const uint8_t> bytes = reader.bytes(*info);
    std::memcpy(t.tensor.ptr, bytes.data(), bytes.size());
  }
}

}  // namespace

void save_checkpoint(const std::string& dir, const CheckpointState& state, const std::vector<NamedTensor>& model,
                     const std::vector<NamedTensor>& optimizer) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw runtime_error("cannot create --save folder " + dir + ": " + ec.message());
  const std::string final_dir = iteration_dir(dir, state.iteration);
  const std::string tmp_dir = final_dir + ".tmp-" + std::to_string(::getpid());
  fs::remove_all(tmp_dir, ec);
  fs::create_directories(fs::path(tmp_dir) / kShard, ec);
  if (ec) throw runtime_error("cannot create " + tmp_dir + ": " + ec.message(), "check that --save is writable");

  nlohmann::json files = nlohmann::json::object();
  auto write_tensors = [&](const char* file, const std::vector<NamedTensor>& tensors) {
    const std::string rel = std::string(kShard) + "/" + file;
    std::vector<uint8_t> bytes = serialize_tensors(tensors);
    write_file((fs::path(tmp_dir) / rel).string(), bytes.data(), bytes.size());
    files[rel] = {{"sha256", sha256_hex(bytes)}, {"bytes", bytes.size()}};
  };
  write_tensors("model.safetensors", model);
  if (!optimizer.empty()) write_tensors("optimizer.safetensors", optimizer);

  nlohmann::json meta = {{"format", "tessera-checkpoint"},
                         {"format_version", kFormatVersion},
                         {"iteration", state.iteration},
                         {"consumed_train_samples", state.consumed_train_samples},
                         {"consumed_valid_samples", state.consumed_valid_samples},
                         {"scheduler_num_steps", state.scheduler_num_steps},
                         {"optimizer_steps", state.optimizer_steps},
                         {"scheduler", state.scheduler},
                         {"tensor_model_parallel_size", 1},
                         {"pipeline_model_parallel_size", 1},
                         {"args", state.args},
                         {"files", files}};
  const std::string text = meta.dump(2);
  write_file((fs::path(tmp_dir) / "metadata.json").string(), text.data(), text.size());
  fsync_path((fs::path(tmp_dir) / kShard).string(), true);
  fsync_path(tmp_dir, true);

  // Replace an existing folder of the same iteration only after the new one is complete.
  const std::string old_dir = final_dir + ".old-" + std::to_string(::getpid());
  const bool replacing = fs::exists(final_dir);
  if (replacing && std::rename(final_dir.c_str(), old_dir.c_str()) != 0)
    throw runtime_error("cannot move aside " + final_dir + ": " + errno_text());
  if (std::rename(tmp_dir.c_str(), final_dir.c_str()) != 0)
    throw runtime_error("cannot rename " + tmp_dir + " to " + final_dir + ": " + errno_text());
  fsync_path(dir, true);

  const std::string tracker = (fs::path(dir) / kTracker).string();
  const std::string tracker_tmp = tracker + ".tmp-" + std::to_string(::getpid());
  const std::string iteration = std::to_string(state.iteration);
  write_file(tracker_tmp, iteration.data(), iteration.size());
  if (std::rename(tracker_tmp.c_str(), tracker.c_str()) != 0)
    throw runtime_error("cannot replace " + tracker + ": " + errno_text());
  fsync_path(dir, true);
  if (replacing) fs::remove_all(old_dir, ec);
}

std::optional<int64_t> latest_checkpoint_iteration(const std::string& dir) {
  const std::string tracker = (fs::path(dir) / kTracker).string();
  if (!fs::exists(tracker)) return std::nullopt;
  const std::string text = read_text(tracker);
  char* end = nullptr;
  const long long iteration = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || (*end && !std::isspace(static_cast<unsigned char>(*end))) || iteration < 0)
    throw runtime_error(tracker + " does not hold an iteration number (it holds '" + text.substr(0, 40) + "')",
                        "fix or delete the tracker file");
  return iteration;
}

CheckpointState load_checkpoint(const std::string& dir, int64_t iteration, const std::vector<NamedTensor>& model,
                                const std::vector<NamedTensor>& optimizer, bool load_optimizer) {
  const std::string it_dir = iteration_dir(dir, iteration);
  const std::string meta_path = (fs::path(it_dir) / "metadata.json").string();
  if (!fs::exists(meta_path))
    throw runtime_error("checkpoint " + it_dir + " is missing metadata.json",
                        "it was not written by tessera, or the save did not finish");
  nlohmann::json meta;
  try {
    meta = nlohmann::json::parse(read_text(meta_path));
  } catch (const nlohmann::json::exception& e) {
    throw runtime_error(meta_path + " is not valid JSON: " + e.what());
  }
  try {
    // Every file's checksum before any tensor is trusted.
    for (const auto& [rel, info] : meta.at("files").items()) {
      const std::string path = (fs::path(it_dir) / rel).string();
      if (!fs::exists(path)) throw runtime_error("checkpoint file " + path + " is missing");
      const std::string bytes = read_text(path);
      if (bytes.size() != info.at("bytes").get<size_t>() ||
          sha256_hex({reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size()}) !=
              info.at("sha256").get<std::string>())
        throw runtime_error("checkpoint file " + path + " is corrupt or truncated (checksum mismatch)",
                            "load an earlier iteration (edit " + std::string(kTracker) + ") or re-save");
    }
    load_tensors((fs::path(it_dir) / kShard / "model.safetensors").string(), model);
    if (load_optimizer) {
      if (!meta.at("files").contains(std::string(kShard) + "/optimizer.safetensors"))
        throw runtime_error("checkpoint " + it_dir + " has no optimizer state (saved with --no-save-optim)",
                            "pass --no-load-optim or --finetune");
      load_tensors((fs::path(it_dir) / kShard / "optimizer.safetensors").string(), optimizer);
    }
    CheckpointState s;
    s.iteration = meta.at("iteration").get<int64_t>();
    s.consumed_train_samples = meta.at("consumed_train_samples").get<int64_t>();
    s.consumed_valid_samples = meta.at("consumed_valid_samples").get<int64_t>();
    s.scheduler_num_steps = meta.at("scheduler_num_steps").get<int64_t>();
    s.optimizer_steps = meta.at("optimizer_steps").get<int64_t>();
    s.scheduler = meta.at("scheduler");
    s.args = meta.at("args");
    return s;
  } catch (const nlohmann::json::exception& e) {
    throw runtime_error(meta_path + " lacks a field or has a wrong type: " + e.what());
  }
}

}  // namespace tessera
