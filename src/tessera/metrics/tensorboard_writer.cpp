#include "tessera/metrics/tensorboard_writer.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "tessera/core/error.h"
#include "tessera/core/log.h"
#include "tessera/metrics/protobuf_wire.h"
#include "tessera/metrics/tfrecord.h"

namespace tessera::metrics {
namespace {

// Field numbers from tensorflow/core/util/event.proto (message Event) and
// tensorflow/core/framework/summary.proto (Summary, Summary.Value).
namespace event_field {
constexpr uint32_t wall_time = 1;     // double wall_time = 1;
constexpr uint32_t step = 2;          // int64 step = 2;
constexpr uint32_t file_version = 3;  // string file_version = 3;  (oneof what)
constexpr uint32_t summary = 5;       // Summary summary = 5;       (oneof what)
}  // namespace event_field
namespace summary_field {
constexpr uint32_t value = 1;         // Summary: repeated Value value = 1;
}
namespace summary_value_field {
constexpr uint32_t tag = 1;           // Summary.Value: string tag = 1;
constexpr uint32_t simple_value = 2;  // Summary.Value: float simple_value = 2; (oneof value)
}  // namespace summary_value_field

double now_seconds() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

std::string hostname() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0 || buf[0] == '\0') return "localhost";
  return buf;
}

}  // namespace

std::string encode_file_version_event(double wall_time, std::string_view file_version) {
  std::string event;
  pb::append_double(event, event_field::wall_time, wall_time);
  pb::append_bytes(event, event_field::file_version, file_version);
  return event;
}

std::string encode_scalar_event(double wall_time, int64_t step, std::string_view tag, float value) {
  std::string summary_value;
  pb::append_bytes(summary_value, summary_value_field::tag, tag);
  pb::append_float(summary_value, summary_value_field::simple_value, value);
  std::string summary;
  pb::append_bytes(summary, summary_field::value, summary_value);
  std::string event;
  pb::append_double(event, event_field::wall_time, wall_time);
  pb::append_int64(event, event_field::step, step);
  pb::append_bytes(event, event_field::summary, summary);
  return event;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec || !std::filesystem::is_directory(dir)) {
    throw runtime_error("cannot create the TensorBoard folder " + dir + ": " +
                            (ec ? ec.message() : std::string("not a directory")),
                        "pass a writable folder to --tensorboard-dir");
  }
  const double wall_time = now_seconds();
  path_ = (std::filesystem::path(dir) /
           ("events.out.tfevents." + std::to_string(static_cast<int64_t>(wall_time)) + "." +
            hostname())).string();
  // Append, not truncate: a restart within the same second must not erase earlier events;
  // TensorBoard reads a second file_version event in the middle of a file without complaint.
  file_ = std::fopen(path_.c_str(), "ab");
  if (!file_) {
    throw runtime_error("cannot open the TensorBoard events file " + path_ + ": " +
                            std::strerror(errno),
                        "pass a writable folder to --tensorboard-dir");
  }
  try {
    write_record(encode_file_version_event(wall_time, "brain.Event:2"));
  } catch (...) {  // the destructor does not run for a throwing constructor
    std::fclose(file_);
    throw;
  }
}

TensorBoardWriter::~TensorBoardWriter() {
  if (!file_) return;
  if (std::fflush(file_) != 0 || std::ferror(file_))
    log_warn("could not finish the TensorBoard events file %s: %s", path_.c_str(),
             std::strerror(errno));
  std::fclose(file_);
}

void TensorBoardWriter::add_scalar(const std::string& tag, double value, int64_t step) {
  write_record(encode_scalar_event(now_seconds(), step, tag, static_cast<float>(value)));
}

void TensorBoardWriter::flush() {
  if (std::fflush(file_) != 0)
    throw runtime_error("cannot write the TensorBoard events file " + path_ + ": " +
                        std::strerror(errno));
}

void TensorBoardWriter::write_record(std::string_view event) {
  const std::string record = frame_tfrecord(event);
  if (std::fwrite(record.data(), 1, record.size(), file_) != record.size())
    throw runtime_error("cannot write the TensorBoard events file " + path_ + ": " +
                        std::strerror(errno));
}

}  // namespace tessera::metrics
