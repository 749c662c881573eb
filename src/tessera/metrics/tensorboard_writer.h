// TensorBoard event files written natively (what Megatron's --tensorboard-dir gets from
// torch.utils.tensorboard.SummaryWriter), without TensorFlow or protobuf libraries.
// A file is a sequence of TFRecords (tfrecord.h), each holding one tensorflow.Event:
// first {wall_time, file_version: "brain.Event:2"}, then one {wall_time, step, summary} per
// scalar. TensorBoard reads every file whose name contains "tfevents" in the folder.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

namespace tessera::metrics {

// The serialized Event messages, exposed so tests can check the bytes.
std::string encode_file_version_event(double wall_time, std::string_view file_version);
std::string encode_scalar_event(double wall_time, int64_t step, std::string_view tag, float value);

// One events file in `dir`. Not thread-safe; use one writer per folder at a time (a second
// writer started within the same second on the same host appends to the same file).
class TensorBoardWriter {
 public:
  // Creates `dir` if needed and opens `dir/events.out.tfevents.<unix seconds>.<hostname>`,
  // appending (never truncating an existing file), then writes the file_version event.
  // A tessera::Error (runtime) naming the folder or file when that fails.
  explicit TensorBoardWriter(const std::string& dir);
  ~TensorBoardWriter();  // flushes; an error here is only warned about (destructors can't throw)
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // Appends Event{wall_time: now, step, summary{value{tag, simple_value: float(value)}}};
  // simple_value is a float in summary.proto, so the value is rounded to float.
  void add_scalar(const std::string& tag, double value, int64_t step);
  // Hands buffered records to the OS, so a running TensorBoard sees them (no fsync).
  void flush();

  const std::string& path() const { return path_; }

 private:
  void write_record(std::string_view event);

  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace tessera::metrics
