#include "tessera/ckpt/checkpoint.h"

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>

#include "tessera/ckpt/safetensors.h"
#include "tessera/core/error.h"
#include "tessera/core/file_io.h"
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
    write_file_synced((fs::path(tmp_dir) / rel).string(), {reinterpret_cast<const char*>(bytes.data()), bytes.size()});
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
  write_file_synced((fs::path(tmp_dir) / "metadata.json").string(), text);
  fsync_directory((fs::path(tmp_dir) / kShard).string());
  fsync_directory(tmp_dir);

  // Replace an existing folder of the same iteration only after the new one is complete.
  const std::string old_dir = final_dir + ".old-" + std::to_string(::getpid());
  const bool replacing = fs::exists(final_dir);
  if (replacing) fs::rename(final_dir, old_dir, ec);
  if (ec) throw runtime_error("cannot move aside " + final_dir + ": " + ec.message());
  fs::rename(tmp_dir, final_dir, ec);
  if (ec) throw runtime_error("cannot rename " + tmp_dir + " to " + final_dir + ": " + ec.message());
  fsync_directory(dir);
  write_file_atomic((fs::path(dir) / kTracker).string(), std::to_string(state.iteration));
  if (replacing) fs::remove_all(old_dir, ec);
}

std::optional<int64_t> latest_checkpoint_iteration(const std::string& dir) {
  const std::string tracker = (fs::path(dir) / kTracker).string();
  if (!fs::exists(tracker)) return std::nullopt;
  const std::string text = read_file(tracker);
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
    meta = nlohmann::json::parse(read_file(meta_path));
  } catch (const nlohmann::json::exception& e) {
    throw runtime_error(meta_path + " is not valid JSON: " + e.what());
  }
  try {
    // Every file's checksum before any tensor is trusted.
    for (const auto& [rel, info] : meta.at("files").items()) {
      const std::string path = (fs::path(it_dir) / rel).string();
      if (!fs::exists(path)) throw runtime_error("checkpoint file " + path + " is missing");
      const std::string bytes = read_file(path);
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
