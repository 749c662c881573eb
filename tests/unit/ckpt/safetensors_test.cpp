// safetensors reader and writer: round trip, every malformed-file case as a tessera::Error
// naming the file (and the tensor), and an independent reader (tests/reference/
// safetensors_io.py, struct + json) agreeing byte for byte with what the writer produced.
#include "tessera/ckpt/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

namespace st = tessera::safetensors;
namespace fs = std::filesystem;
using tessera::DType;

namespace {

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(TESSERA_BINARY_DIR) / "Testing" / "tmp" /
           ("safetensors_test_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // A file of: 8-byte length (the header's, unless overridden), header text, data bytes.
  std::string raw_file(const std::string& name, const std::string& header, size_t data_bytes,
                       std::optional<uint64_t> header_len = std::nullopt) {
    std::string p = path(name);
    std::ofstream out(p, std::ios::binary);
    uint64_t n = header_len.value_or(header.size());
    out.write(reinterpret_cast<const char*>(&n), 8);
    out << header;
    for (size_t i = 0; i < data_bytes; ++i) out.put(static_cast<char>(i));
    return p;
  }

  fs::path dir_;
};

// Expects Reader::open(p) to throw a tessera::Error whose message holds every `needle`.
void expect_open_error(const std::string& p, std::initializer_list<std::string> needles) {
  try {
    st::Reader::open(p);
    ADD_FAILURE() << "no error for " << p;
  } catch (const tessera::Error& e) {
    std::string what = e.what();
    EXPECT_NE(what.find(p), std::string::npos) << "error does not name the file: " << what;
    for (const std::string& n : needles)
      EXPECT_NE(what.find(n), std::string::npos) << "error lacks '" << n << "': " << what;
  }
}

std::string tensor_header(const std::string& name, const std::string& dtype, const std::string& shape,
                          const std::string& offsets) {
  return R"({")" + name + R"(":{"dtype":")" + dtype + R"(","shape":)" + shape +
         R"(,"data_offsets":)" + offsets + "}}";
}

struct Sample {
  std::vector<float> f32 = {1.0f, -2.5f, 3.25f, 0.0f, 1e-3f, 65504.0f};
  std::vector<uint16_t> bf16, f16;
  std::vector<int32_t> i32 = {1, -2, 2147483647};
  std::vector<int64_t> i64 = {-5, int64_t{1} << 40};
  std::vector<uint16_t> u16 = {0, 65535, 7};
  std::vector<uint8_t> u8 = {0, 1, 254, 255, 9};
  float scalar = 42.0f;
  Sample() {
    for (float x : f32) {
      bf16.push_back(tessera::f32_to_bf16(x));
      f16.push_back(tessera::f32_to_f16(x));
    }
  }
  std::vector<st::WriteEntry> entries() const {
    return {{"w.f32", DType::F32, {2, 3}, f32.data()},  {"w.bf16", DType::BF16, {3, 2}, bf16.data()},
            {"w.f16", DType::F16, {6}, f16.data()},     {"i32", DType::I32, {3}, i32.data()},
            {"i64", DType::I64, {1, 2}, i64.data()},    {"u16", DType::U16, {3}, u16.data()},
            {"u8", DType::U8, {5, 1}, u8.data()},       {"scalar", DType::F32, {}, &scalar},
            {"empty", DType::F32, {0, 4}, nullptr}};
  }
};

TEST_F(SafetensorsTest, RoundTripsEveryDtype) {
  Sample s;
  const std::string p = path("rt.safetensors");
  st::write(p, s.entries(), {{"format", "pt"}, {"step", "7"}});
  EXPECT_FALSE(fs::exists(p + ".tmp." + std::to_string(getpid()))) << "temp file left behind";

  st::Reader r = st::Reader::open(p);
  ASSERT_EQ(r.tensors().size(), 9u);
  EXPECT_EQ(r.metadata().at("format"), "pt");
  EXPECT_EQ(r.metadata().at("step"), "7");
  for (const st::WriteEntry& e : s.entries()) {
    const st::TensorInfo& t = r.at(e.name);
    ASSERT_TRUE(t.dtype.has_value());
    EXPECT_EQ(*t.dtype, e.dtype) << e.name;
    EXPECT_EQ(t.shape, e.shape) << e.name;
    auto b = r.bytes(t);
    size_t n = static_cast<size_t>(t.numel) * tessera::dtype_size(e.dtype);
    ASSERT_EQ(b.size(), n) << e.name;
    if (n) {
      EXPECT_EQ(std::memcmp(b.data(), e.data, n), 0) << e.name;
    }
  }
  EXPECT_EQ(r.read_f32("w.f32"), s.f32);
  EXPECT_EQ(r.read_f32("scalar"), std::vector<float>{42.0f});
  EXPECT_TRUE(r.read_f32("empty").empty());
  // 16-bit floats widen exactly for values they can represent.
  std::vector<float> f16 = r.read_f32("w.f16");
  for (size_t i = 0; i < s.f32.size(); ++i) EXPECT_EQ(f16[i], tessera::f16_to_f32(s.f16[i]));
  EXPECT_EQ(r.read_f32("w.bf16")[1], -2.5f);
  EXPECT_EQ(r.read_i64("i64"), s.i64);
  EXPECT_EQ(r.read_i64("u16"), (std::vector<int64_t>{0, 65535, 7}));
  EXPECT_EQ(r.read_i64("i32")[2], 2147483647);
  EXPECT_THROW(r.read_f32("i32"), tessera::Error);
  EXPECT_THROW(r.read_i64("w.f32"), tessera::Error);
  EXPECT_THROW(r.at("nope"), tessera::Error);
  // Dropped pages are read again from the file, neighbours included.
  for (const st::WriteEntry& e : s.entries()) r.drop_pages(r.at(e.name));
  EXPECT_EQ(r.read_f32("w.f32"), s.f32);
  EXPECT_EQ(r.read_i64("i64"), s.i64);

  // The header length is a multiple of 8, padded with spaces, as the format writes it.
  std::ifstream in(p, std::ios::binary);
  uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  EXPECT_EQ(n % 8, 0u);
  std::string header(n, '\0');
  in.read(header.data(), static_cast<std::streamsize>(n));
  EXPECT_EQ(header.find_last_not_of(' '), header.rfind('}'));

  // serialize() gives the same bytes as the file.
  std::vector<uint8_t> mem = st::serialize(s.entries(), {{"format", "pt"}, {"step", "7"}});
  std::ifstream again(p, std::ios::binary);
  std::vector<uint8_t> disk((std::istreambuf_iterator<char>(again)), std::istreambuf_iterator<char>());
  EXPECT_EQ(mem, disk);
}

TEST_F(SafetensorsTest, WriteReplacesAtomically) {
  float a = 1, b = 2;
  const std::string p = path("x.safetensors");
  st::write(p, {{"a", DType::F32, {1}, &a}});
  st::write(p, {{"b", DType::F32, {1}, &b}});
  st::Reader r = st::Reader::open(p);
  EXPECT_FALSE(r.contains("a"));
  EXPECT_EQ(r.read_f32("b"), std::vector<float>{2.0f});
  EXPECT_THROW(st::write(path("no/such/dir/x.safetensors"), {{"a", DType::F32, {1}, &a}}), tessera::Error);
  EXPECT_THROW(st::write(p, {{"a", DType::F32, {1}, &a}, {"a", DType::F32, {1}, &b}}), tessera::Error);
  EXPECT_THROW(st::write(p, {{"__metadata__", DType::F32, {1}, &a}}), tessera::Error);
  EXPECT_THROW(st::write(p, {{"a", DType::F32, {-1}, &a}}), tessera::Error);
  EXPECT_EQ(st::Reader::open(p).read_f32("b"), std::vector<float>{2.0f}) << "failed writes must not touch the file";
}

// An independent reader (Python struct + json, strict about padding and contiguous data)
// sees exactly the names, dtypes, shapes, bytes and metadata the writer was given.
TEST_F(SafetensorsTest, PythonReadsWhatWeWrite) {
  Sample s;
  const std::string p = path("py.safetensors"), out = path("py.json");
  st::write(p, s.entries(), {{"format", "pt"}, {"unicode", "\xc3\xa9t\xc3\xa9"}});
  const std::string cmd = std::string("/usr/bin/python3 ") + TESSERA_SOURCE_DIR +
                          "/tests/reference/safetensors_io.py dump " + p + " " + out;
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::ifstream in(out);
  nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_EQ(j["metadata"]["format"], "pt");
  EXPECT_EQ(j["metadata"]["unicode"], "\xc3\xa9t\xc3\xa9");
  auto entries = s.entries();
  ASSERT_EQ(j["tensors"].size(), entries.size());
  for (size_t i = 0; i < entries.size(); ++i) {
    const auto& t = j["tensors"][i];
    const st::WriteEntry& e = entries[i];
    EXPECT_EQ(t["name"], e.name);
    EXPECT_EQ(t["dtype"], std::string(st::dtype_to_name(e.dtype)));
    EXPECT_EQ(t["shape"].get<std::vector<int64_t>>(), e.shape);
    size_t n = 1;
    for (int64_t d : e.shape) n *= static_cast<size_t>(d);
    n *= tessera::dtype_size(e.dtype);
    std::string hex;
    for (size_t k = 0; k < n; ++k) {
      char buf[3];
      std::snprintf(buf, sizeof buf, "%02x", static_cast<const uint8_t*>(e.data)[k]);
      hex += buf;
    }
    EXPECT_EQ(t["hex"], hex) << e.name;
  }
}

TEST_F(SafetensorsTest, MalformedFilesAreErrors) {
  const std::string ok = tensor_header("t", "F32", "[2,3]", "[0,24]");
  // Sanity: the well-formed version opens.
  EXPECT_NO_THROW(st::Reader::open(raw_file("ok", ok, 24)));

  expect_open_error(path("missing"), {"cannot open"});
  expect_open_error(dir_.string(), {"not a regular file"});
  expect_open_error(raw_file("empty", "", 0, 0), {"header of 0 bytes"});
  {
    std::string p = path("seven");
    std::ofstream(p, std::ios::binary) << "1234567";
    expect_open_error(p, {"truncated", "7 bytes"});
  }
  // Header length beyond the file, or absurd.
  expect_open_error(raw_file("len_past", ok, 24, ok.size() + 25), {"runs past the end"});
  expect_open_error(raw_file("len_huge", ok, 24, UINT64_MAX), {"exceeds the limit"});
  expect_open_error(raw_file("len_short", ok, 24, ok.size() - 1), {"not valid JSON"});
  // Truncated data section.
  expect_open_error(raw_file("trunc_data", ok, 20), {"'t'", "run past the data section", "20 bytes"});
  // Offsets.
  expect_open_error(raw_file("off_range", tensor_header("t", "F32", "[2,3]", "[8,32]"), 24), {"'t'", "[8, 32]"});
  expect_open_error(raw_file("off_order", tensor_header("t", "F32", "[2,3]", "[24,0]"), 24), {"'t'", "begin after end"});
  expect_open_error(raw_file("off_neg", tensor_header("t", "F32", "[2,3]", "[-1,23]"), 24), {"'t'", "data_offsets"});
  expect_open_error(raw_file("off_arity", tensor_header("t", "F32", "[2,3]", "[0,24,48]"), 48), {"'t'", "two offsets"});
  expect_open_error(raw_file("off_float", tensor_header("t", "F32", "[2,3]", "[0,24.0]"), 24), {"'t'", "data_offsets"});
  expect_open_error(raw_file("off_huge", tensor_header("t", "F32", "[2,3]", "[18446744073709551615,24]"), 24), {"'t'"});
  // Size that does not match dtype and shape.
  expect_open_error(raw_file("size", tensor_header("t", "F32", "[2,3]", "[0,20]"), 24), {"'t'", "hold 20 bytes", "needs 24"});
  expect_open_error(raw_file("size16", tensor_header("t", "BF16", "[2,3]", "[0,24]"), 24), {"'t'", "needs 12"});
  // Shapes.
  expect_open_error(raw_file("dim_neg", tensor_header("t", "F32", "[-2,3]", "[0,24]"), 24), {"'t'", "non-negative integer"});
  expect_open_error(raw_file("dim_float", tensor_header("t", "F32", "[2.0,3]", "[0,24]"), 24), {"'t'", "non-negative integer"});
  expect_open_error(raw_file("dim_overflow", tensor_header("t", "F32", "[4294967296,4294967296]", "[0,24]"), 24), {"'t'", "overflows"});
  expect_open_error(raw_file("bytes_overflow", tensor_header("t", "F32", "[4611686018427387904]", "[0,24]"), 24), {"'t'", "overflows"});
  expect_open_error(raw_file("shape_type", tensor_header("t", "F32", "\"2x3\"", "[0,24]"), 24), {"'t'", "shape"});
  // Dtypes: unknown is an error; a format dtype tessera lacks opens but cannot be read as float.
  expect_open_error(raw_file("dtype", tensor_header("t", "F31", "[2,3]", "[0,24]"), 24), {"'t'", "unknown dtype 'F31'"});
  {
    st::Reader r = st::Reader::open(raw_file("f64", tensor_header("t", "F64", "[3]", "[0,24]"), 24));
    EXPECT_FALSE(r.at("t").dtype.has_value());
    EXPECT_THROW(r.read_f32("t"), tessera::Error);
  }
  // JSON.
  expect_open_error(raw_file("json_trunc", ok.substr(0, ok.size() - 3), 24), {"not valid JSON"});
  expect_open_error(raw_file("json_garbage", "{not json at all}", 0), {"not valid JSON"});
  expect_open_error(raw_file("json_array", "[1,2,3]", 0), {"does not start with '{'"});
  expect_open_error(raw_file("json_lead", " {}", 0), {"does not start with '{'"});
  expect_open_error(raw_file("json_entry", R"({"t":[1,2]})", 0), {"'t'", "not a JSON object"});
  expect_open_error(raw_file("json_nodtype", R"({"t":{"shape":[1],"data_offsets":[0,4]}})", 4), {"'t'", "dtype"});
  expect_open_error(raw_file("json_dup", R"({"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"t":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})", 2), {"repeats the key 't'"});
  expect_open_error(raw_file("json_utf8", "{\"\xff\":1}", 0), {"not valid JSON"});
  expect_open_error(raw_file("meta", R"({"__metadata__":{"k":1}})", 0), {"__metadata__", "'k'"});
  expect_open_error(raw_file("meta_type", R"({"__metadata__":[]})", 0), {"__metadata__"});
}

TEST_F(SafetensorsTest, EdgeCasesThatAreValid) {
  // Empty header object, zero-size tensors, scalars, trailing padding spaces.
  EXPECT_TRUE(st::Reader::open(raw_file("empty_obj", "{}      ", 0)).tensors().empty());
  st::Reader r = st::Reader::open(raw_file(
      "mixed", R"({"s":{"dtype":"U8","shape":[],"data_offsets":[0,1]},"z":{"dtype":"F32","shape":[3,0],"data_offsets":[1,1]}}   )", 1));
  EXPECT_EQ(r.at("s").numel, 1u);
  EXPECT_EQ(r.at("z").numel, 0u);
  EXPECT_EQ(r.read_i64("s"), std::vector<int64_t>{0});
  // In-memory parsing names its label in errors.
  try {
    st::Reader::from_bytes("memory-label", {1, 2, 3});
    ADD_FAILURE();
  } catch (const tessera::Error& e) {
    EXPECT_NE(std::string(e.what()).find("memory-label"), std::string::npos);
  }
}

}  // namespace
