// Temporary checkpoint folders: their owner record, a failed save's clean-up, and the search
// for folders that no running save owns.
#include "tessera/ckpt/save_owner.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>
#include <regex>
#include <sstream>

#include <nlohmann/json.hpp>

#include "tessera/ckpt/checkpoint.h"
#include "tessera/core/file_io.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string first_line(const std::string& path) {
  std::ifstream f(path);
  std::string line;
  std::getline(f, line);
  return line;
}

// The machine and boot (the kernel's boot_id), and the PID namespace: a process id means the
// same process only where all three are the same.
std::string boot_id() { return first_line("/proc/sys/kernel/random/boot_id"); }

std::string pid_namespace() {
  std::error_code ec;
  const fs::path target = fs::read_symlink("/proc/self/ns/pid", ec);
  return ec ? "" : target.string();
}

std::string host_name() {
  char buf[256] = {};
  return ::gethostname(buf, sizeof buf - 1) == 0 ? buf : "unknown-host";
}

// Field 22 of /proc/PID/stat (after the parenthesised command, which may hold spaces): when
// the process started, so that a reused process id is not mistaken for the owner.
std::optional<std::string> process_start_time(int64_t pid) {
  const std::string stat = first_line("/proc/" + std::to_string(pid) + "/stat");
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::istringstream fields(stat.substr(close + 1));  // from field 3 on
  std::string field;
  for (int n = 3; n <= 22; ++n)
    if (!(fields >> field)) return std::nullopt;
  return field;
}

std::optional<json> read_owner(const fs::path& folder) {
  std::ifstream f(folder / ckpt_detail::kSaveOwnerFile);
  if (!f) return std::nullopt;
  json owner = json::parse(f, nullptr, false);
  if (owner.is_discarded() || !owner.is_object()) return std::nullopt;
  return owner;
}

// nullopt: a save that is still running owns the folder.
std::optional<StaleCheckpointSave> judge(const fs::path& folder) {
  StaleCheckpointSave s{folder.string(), false, ""};
  const std::optional<json> owner = read_owner(folder);
  if (!owner) {
    s.owner = "it has no readable owner record (a process killed while it made the folder, or an older tessera)";
    return s;
  }
  const int64_t pid = owner->value("pid", int64_t{-1});
  const std::string who = "process " + std::to_string(pid) + " on " + owner->value("host", std::string("?"));
  if (owner->value("boot_id", std::string()) != boot_id()) {
    s.owner = "made by " + who + ", another machine (or this one before a reboot)";
    return s;
  }
  if (owner->value("pid_namespace", std::string()) != pid_namespace()) {
    s.owner = "made by " + who + " in another PID namespace (another container)";
    return s;
  }
  const std::optional<std::string> started = process_start_time(pid);
  if (started && *started == owner->value("start_time", std::string())) return std::nullopt;
  s.removable = true;
  s.owner = "made by " + who + ", which is no longer running";
  return s;
}

}  // namespace

namespace ckpt_detail {

void write_save_owner(const std::string& tmp_dir) {
  const json owner = {{"pid", static_cast<int64_t>(::getpid())},
                      {"start_time", process_start_time(::getpid()).value_or("")},
                      {"host", host_name()},
                      {"boot_id", boot_id()},
                      {"pid_namespace", pid_namespace()}};
  write_file_synced((fs::path(tmp_dir) / kSaveOwnerFile).string(), owner.dump());
}

}  // namespace ckpt_detail

void abandon_checkpoint_save(const std::string& tmp_dir) {
  std::error_code ec;
  fs::remove_all(tmp_dir, ec);
}

std::vector<StaleCheckpointSave> find_stale_checkpoint_saves(const std::string& dir) {
  static const std::regex kTempName(R"(iter_\d+\.tmp-\d+)");
  std::vector<StaleCheckpointSave> out;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    if (!e.is_directory(ec) || !std::regex_match(e.path().filename().string(), kTempName)) continue;
    if (std::optional<StaleCheckpointSave> s = judge(e.path())) out.push_back(*s);
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.path < b.path; });
  return out;
}

}  // namespace tessera
