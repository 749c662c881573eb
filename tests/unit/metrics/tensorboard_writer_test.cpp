// TensorBoard event files: CRC-32C against published check values, TFRecord framing and Event
// encoding against bytes made by TensorBoard's own Python code (golden values below), and a
// file written by TensorBoardWriter read back by a small reader here. The read-back with
// TensorBoard's EventAccumulator is tests/metrics_area (metrics.tensorboard_reader).
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <bit>
#include <csignal>
#include <ctime>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "tessera/core/error.h"
#include "tessera/core/file_io.h"
#include "tessera/metrics/tensorboard_writer.h"
#include "tessera/metrics/tfrecord.h"

using namespace tessera::metrics;
namespace fs = std::filesystem;

namespace {

std::string bytes(std::initializer_list<uint8_t> b) { return std::string(b.begin(), b.end()); }

fs::path fresh_dir(const std::string& name) {
  fs::path dir = fs::path(TESSERA_BINARY_DIR) / "tests" / "metrics_work" / name;
  fs::remove_all(dir);
  return dir;
}

uint64_t read_le(const std::string& s, size_t pos, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= uint64_t(uint8_t(s.at(pos + i))) << (8 * i);
  return v;
}

// Splits a TFRecord file into its records, checking both CRCs of each.
std::vector<std::string> read_records(const std::string& file) {
  std::vector<std::string> records;
  size_t pos = 0;
  while (pos < file.size()) {
    const std::string len_bytes = file.substr(pos, 8);
    const uint64_t len = read_le(file, pos, 8);
    EXPECT_EQ(read_le(file, pos + 8, 4), masked_crc32c(len_bytes)) << "length CRC at " << pos;
    std::string data = file.substr(pos + 12, len);
    EXPECT_EQ(read_le(file, pos + 12 + len, 4), masked_crc32c(data)) << "data CRC at " << pos;
    records.push_back(std::move(data));
    pos += 12 + len + 4;
  }
  EXPECT_EQ(pos, file.size()) << "a truncated record at the end";
  return records;
}

// A protobuf message's top-level fields: number -> raw payload (varints as their value's
// bytes little-endian, fixed fields as their bytes, length-delimited as their content).
struct Field {
  int wire_type = 0;
  uint64_t varint = 0;
  std::string bytes;
};
std::multimap<uint32_t, Field> parse_message(const std::string& m) {
  std::multimap<uint32_t, Field> fields;
  size_t pos = 0;
  auto varint = [&] {
    uint64_t v = 0;
    for (int shift = 0;; shift += 7) {
      uint8_t b = uint8_t(m.at(pos++));
      v |= uint64_t(b & 0x7f) << shift;
      if (!(b & 0x80)) return v;
    }
  };
  while (pos < m.size()) {
    uint64_t key = varint();
    Field f;
    f.wire_type = int(key & 7);
    if (f.wire_type == 0) f.varint = varint();
    else if (f.wire_type == 1) { f.bytes = m.substr(pos, 8); pos += 8; }
    else if (f.wire_type == 5) { f.bytes = m.substr(pos, 4); pos += 4; }
    else if (f.wire_type == 2) { size_t n = varint(); f.bytes = m.substr(pos, n); pos += n; }
    else ADD_FAILURE() << "unexpected wire type " << f.wire_type;
    fields.emplace(uint32_t(key >> 3), f);
  }
  return fields;
}
double as_double(const Field& f) { return std::bit_cast<double>(read_le(f.bytes, 0, 8)); }
float as_float(const Field& f) { return std::bit_cast<float>(uint32_t(read_le(f.bytes, 0, 4))); }

}  // namespace

TEST(Crc32c, PublishedCheckValues) {
  EXPECT_EQ(crc32c("123456789"), 0xE3069283u);  // the CRC catalogue's check value for CRC-32C
  EXPECT_EQ(crc32c(""), 0u);
  // RFC 3720 (iSCSI) appendix B.4 test vectors.
  EXPECT_EQ(crc32c(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(crc32c(std::string(32, '\xff')), 0x62A8AB43u);
  std::string ascending;
  for (int i = 0; i < 32; ++i) ascending.push_back(char(i));
  EXPECT_EQ(crc32c(ascending), 0x46DD794Eu);
}

TEST(Crc32c, MaskMatchesTensorBoard) {
  EXPECT_EQ(mask_crc(0), 0xa282ead8u);
  // tensorboard.compat.tensorflow_stub.pywrap_tensorflow.masked_crc32c(b"123456789")
  EXPECT_EQ(masked_crc32c("123456789"), 0xc78ab0e5u);
}

// Golden records: struct.pack("<Q", n) + masked CRCs from TensorBoard's Python code.
TEST(TfRecord, FramingMatchesTensorBoard) {
  EXPECT_EQ(frame_tfrecord(""), bytes({0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x29, 0x03,
                                       0x98, 0x07, 0xd8, 0xea, 0x82, 0xa2}));
  EXPECT_EQ(frame_tfrecord("hello"),
            bytes({0x05, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xea, 0xb2, 0x04, 0x3e, 0x68,
                   0x65, 0x6c, 0x6c, 0x6f, 0xbb, 0x1f, 0x1c, 0x19}));
  EXPECT_EQ(read_records(frame_tfrecord("hello") + frame_tfrecord("")),
            (std::vector<std::string>{"hello", ""}));
}

// Golden events: tensorboard.compat.proto.event_pb2.Event(...).SerializeToString().
TEST(TensorBoardEvent, EncodingMatchesTensorBoardProtobufs) {
  // Event(wall_time=1.5, file_version="brain.Event:2")
  EXPECT_EQ(encode_file_version_event(1.5, "brain.Event:2"),
            bytes({0x09, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xf8, 0x3f, 0x1a, 0x0d, 0x62, 0x72,
                   0x61, 0x69, 0x6e, 0x2e, 0x45, 0x76, 0x65, 0x6e, 0x74, 0x3a, 0x32}));
  // Event(wall_time=1700000000.25, step=42, summary=Summary(value=[Value(tag="lm loss",
  // simple_value=2.5)]))
  EXPECT_EQ(encode_scalar_event(1700000000.25, 42, "lm loss", 2.5f),
            bytes({0x09, 0x00, 0x00, 0x10, 0x40, 0xfc, 0x54, 0xd9, 0x41, 0x10, 0x2a, 0x2a, 0x10,
                   0x0a, 0x0e, 0x0a, 0x07, 0x6c, 0x6d, 0x20, 0x6c, 0x6f, 0x73, 0x73, 0x15, 0x00,
                   0x00, 0x20, 0x40}));
  // step=-3: a negative int64 is a 10-byte varint.
  EXPECT_EQ(encode_scalar_event(0.5, -3, "t", -1.0f),
            bytes({0x09, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xe0, 0x3f, 0x10, 0xfd, 0xff, 0xff,
                   0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, 0x2a, 0x0a, 0x0a, 0x08, 0x0a, 0x01,
                   0x74, 0x15, 0x00, 0x00, 0x80, 0xbf}));
  // step=3000000000 (past int32), simple_value=0.1 (rounded to float).
  EXPECT_EQ(encode_scalar_event(0.5, 3000000000LL, "t", 0.1f),
            bytes({0x09, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xe0, 0x3f, 0x10, 0x80, 0xbc, 0xc1,
                   0x96, 0x0b, 0x2a, 0x0a, 0x0a, 0x08, 0x0a, 0x01, 0x74, 0x15, 0xcd, 0xcc, 0xcc,
                   0x3d}));
}

TEST(TensorBoardWriter, WritesFramedEventsThatReadBack) {
  const fs::path dir = fresh_dir("read_back") / "nested";  // created by the writer
  const double before = double(time(nullptr));
  std::string path;
  {
    TensorBoardWriter writer(dir.string());
    path = writer.path();
    writer.add_scalar("lm loss", 10.25, 1);
    writer.flush();
    writer.add_scalar("learning-rate", 1.0 / 3.0, 2);
    writer.add_scalar("lm loss", 9.5, 3000000000LL);
  }  // the destructor flushes the last two

  const std::string name = fs::path(path).filename().string();
  EXPECT_EQ(fs::path(path).parent_path(), dir);
  EXPECT_EQ(name.rfind("events.out.tfevents.", 0), 0u) << name;
  const long long file_secs = std::stoll(name.substr(std::strlen("events.out.tfevents.")));
  EXPECT_NEAR(double(file_secs), before, 5.0);

  const auto records = read_records(tessera::read_file(path));
  ASSERT_EQ(records.size(), 4u);
  auto first = parse_message(records[0]);
  EXPECT_EQ(first.find(3)->second.bytes, "brain.Event:2");  // Event.file_version
  EXPECT_NEAR(as_double(first.find(1)->second), before, 5.0);  // Event.wall_time

  struct Expected { std::string tag; int64_t step; float value; };
  const std::vector<Expected> expected = {
      {"lm loss", 1, 10.25f}, {"learning-rate", 2, float(1.0 / 3.0)}, {"lm loss", 3000000000LL, 9.5f}};
  for (size_t i = 0; i < expected.size(); ++i) {
    auto event = parse_message(records[i + 1]);
    EXPECT_NEAR(as_double(event.find(1)->second), before, 5.0);
    EXPECT_EQ(int64_t(event.find(2)->second.varint), expected[i].step);  // Event.step
    auto summary = parse_message(event.find(5)->second.bytes);           // Event.summary
    auto value = parse_message(summary.find(1)->second.bytes);           // Summary.value
    EXPECT_EQ(value.find(1)->second.bytes, expected[i].tag);             // Value.tag
    EXPECT_EQ(as_float(value.find(2)->second), expected[i].value);       // Value.simple_value
  }
}

TEST(TensorBoardWriter, FolderThatCannotBeCreatedNamesIt) {
  const fs::path dir = fresh_dir("not_a_folder");
  fs::create_directories(dir);
  std::ofstream(dir / "file") << "x";
  const std::string bad = (dir / "file" / "runs").string();  // below a regular file
  try {
    TensorBoardWriter writer(bad);
    FAIL() << "expected an error";
  } catch (const tessera::Error& e) {
    EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
    EXPECT_EQ(e.exit_code(), 1);
  }
}

// A full disk, simulated with RLIMIT_FSIZE (works as root too): the error names the file.
TEST(TensorBoardWriter, WriteErrorNamesTheFile) {
  const fs::path dir = fresh_dir("write_error");
  rlimit old{};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old), 0);
  auto old_handler = std::signal(SIGXFSZ, SIG_IGN);  // EFBIG instead of a signal
  rlimit small = old;
  small.rlim_cur = 4096;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  std::string path, message;
  try {
    TensorBoardWriter writer(dir.string());
    path = writer.path();
    for (int step = 0; step < 10000; ++step) writer.add_scalar("lm loss", 1.0, step);
    writer.flush();
  } catch (const tessera::Error& e) {
    message = e.what();
  }
  setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, old_handler);
  ASSERT_FALSE(path.empty());
  EXPECT_NE(message.find(path), std::string::npos) << "error: '" << message << "'";
}
