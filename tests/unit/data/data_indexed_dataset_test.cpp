// Indexed dataset: the worked example of docs/data.md byte for byte, reading back,
// validation of corrupt and truncated files (always an Error, never a crash), merging,
// scratch builders, spilling, and atomic outputs.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "tessera/core/error.h"
#include "tessera/data/indexed_dataset.h"

namespace td = tessera::data;
namespace fs = std::filesystem;

namespace {

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void spit(const std::string& path, const std::string& bytes) { std::ofstream(path, std::ios::binary) << bytes; }

std::string hex(const std::string& s) {
  std::string out;
  char buf[4];
  for (unsigned char c : s) {
    std::snprintf(buf, sizeof(buf), "%02x ", c);
    out += buf;
  }
  return out;
}

class DataIndexedDataset : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(TESSERA_BINARY_DIR) / ("indexed_dataset_test_" + std::to_string(::getpid()) + "_" +
                                          ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // docs/data.md's worked example: documents [10, 20, 50256] and [30, 50256], uint16.
  std::string write_example(const std::string& name) {
    std::string prefix = path(name);
    td::IndexedDatasetBuilder b(td::bin_path(prefix), td::IndexDType::UInt16);
    std::vector<int32_t> d0{10, 20, 50256}, d1{30, 50256};
    std::vector<int32_t> l0{3}, l1{2};
    b.add_document(d0, l0);
    b.add_document(d1, l1);
    b.finalize(td::idx_path(prefix));
    return prefix;
  }

  fs::path dir_;
};

const unsigned char kExampleIdx[82] = {
    0x4d, 0x4d, 0x49, 0x44, 0x49, 0x44, 0x58, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x08, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x03, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x03, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x06, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00};
const unsigned char kExampleBin[10] = {0x0a, 0x00, 0x14, 0x00, 0x50, 0xc4, 0x1e, 0x00, 0x50, 0xc4};

}  // namespace

TEST_F(DataIndexedDataset, WorkedExampleBytes) {
  std::string prefix = write_example("example");
  EXPECT_EQ(hex(slurp(prefix + ".idx")), hex(std::string(reinterpret_cast<const char*>(kExampleIdx), 82)));
  EXPECT_EQ(hex(slurp(prefix + ".bin")), hex(std::string(reinterpret_cast<const char*>(kExampleBin), 10)));
  // Sentence-level variant: one document with sentences of 2 and 3 tokens.
  std::string p2 = path("sentences");
  td::IndexedDatasetBuilder b(td::bin_path(p2), td::IndexDType::UInt16);
  std::vector<int32_t> toks{1, 2, 3, 4, 5}, lens{2, 3};
  b.add_document(toks, lens);
  b.finalize(td::idx_path(p2));
  td::IndexedDataset ds(p2);
  EXPECT_EQ(ds.sequence_count(), 2u);
  EXPECT_EQ(ds.document_count(), 1u);
  EXPECT_EQ(ds.sequence_length(0), 2);
  EXPECT_EQ(ds.sequence_length(1), 3);
  EXPECT_EQ(ds.document_index(1), 2);
}

TEST_F(DataIndexedDataset, ReadBack) {
  td::IndexedDataset ds(write_example("example"));
  EXPECT_EQ(ds.dtype(), td::IndexDType::UInt16);
  EXPECT_EQ(ds.sequence_count(), 2u);
  EXPECT_EQ(ds.document_count(), 2u);
  EXPECT_EQ(ds.sequence_pointer(1), 6);
  EXPECT_EQ(ds.token_count(), 5u);
  td::TokenSpan s = ds.get(0);
  ASSERT_EQ(s.length, 3u);
  EXPECT_EQ(s[0], 10);
  EXPECT_EQ(s[2], 50256);
  td::TokenSpan t = ds.get(0, 1, 1);
  ASSERT_EQ(t.length, 1u);
  EXPECT_EQ(t[0], 20);
  EXPECT_THROW(ds.get(2), tessera::Error);
  EXPECT_THROW(ds.get(1, 1, 2), tessera::Error);
  EXPECT_THROW(ds.get(1, 3), tessera::Error);
}

TEST_F(DataIndexedDataset, EmptyDocumentsAndDtypes) {
  for (auto dtype : {td::IndexDType::UInt8, td::IndexDType::Int8, td::IndexDType::Int16, td::IndexDType::Int32,
                     td::IndexDType::Int64, td::IndexDType::UInt16}) {
    std::string prefix = path("d" + std::to_string(int(dtype)));
    td::IndexedDatasetBuilder b(td::bin_path(prefix), dtype);
    std::vector<int32_t> a{1, 2, 3}, la{3}, none;
    b.add_document(none, none);  // an empty document still adds a boundary
    b.add_document(a, la);
    b.add_item(a);
    b.add_item(none);
    b.end_document();
    b.finalize(td::idx_path(prefix));
    td::IndexedDataset ds(prefix);
    EXPECT_EQ(ds.dtype(), dtype);
    EXPECT_EQ(ds.sequence_count(), 3u);
    EXPECT_EQ(ds.document_count(), 3u);
    EXPECT_EQ(ds.document_index(1), 0);
    EXPECT_EQ(ds.document_index(3), 3);
    EXPECT_EQ(ds.get(1)[2], 3);
  }
  td::IndexedDatasetBuilder b(td::bin_path(path("range")), td::IndexDType::UInt16);
  std::vector<int32_t> big{70000}, l{1};
  EXPECT_THROW(b.add_document(big, l), tessera::Error);
}

TEST_F(DataIndexedDataset, NothingUnderFinalNamesUntilFinalize) {
  std::string prefix = path("partial");
  {
    td::IndexedDatasetBuilder b(td::bin_path(prefix), td::IndexDType::UInt16);
    std::vector<int32_t> a{1, 2}, l{2};
    b.add_document(a, l);
    EXPECT_FALSE(fs::exists(prefix + ".bin"));
    // Destroyed without finalize (an error path): no file is left at all.
  }
  EXPECT_TRUE(fs::is_empty(dir_)) << "leftover files";
  EXPECT_THROW(td::IndexedDatasetBuilder(path("no/such/folder/x.bin"), td::IndexDType::UInt16), tessera::Error);
}

TEST_F(DataIndexedDataset, CorruptFilesAreErrorsNeverCrashes) {
  std::string prefix = write_example("example");
  const std::string idx = slurp(prefix + ".idx"), bin = slurp(prefix + ".bin");
  std::string cp = path("corrupt");
  auto expect_error = [&](const std::string& idx_bytes, const std::string& bin_bytes, const std::string& needle) {
    spit(cp + ".idx", idx_bytes);
    spit(cp + ".bin", bin_bytes);
    try {
      td::IndexedDataset ds(cp);
      ADD_FAILURE() << "no error for " << needle;
    } catch (const tessera::Error& e) {
      std::string m = e.what();
      EXPECT_NE(m.find(cp), std::string::npos) << m;
      EXPECT_NE(m.find(needle), std::string::npos) << m;
    }
  };
  for (size_t n = 0; n < idx.size(); ++n) expect_error(idx.substr(0, n), bin, n < 34 ? "header" : "");
  for (size_t n = 0; n < bin.size(); ++n) expect_error(idx, bin.substr(0, n), "has only");
  auto patched = [&](size_t at, std::string bytes) {
    std::string s = idx;
    s.replace(at, bytes.size(), bytes);
    return s;
  };
  expect_error(patched(0, "X"), bin, "magic");
  expect_error(patched(9, std::string("\x02", 1)), bin, "version 2");
  expect_error(patched(17, std::string("\x09", 1)), bin, "dtype code 9");
  expect_error(patched(18, std::string("\xff\xff\xff\xff\xff\xff\xff\x7f", 8)), bin, "truncated");
  expect_error(patched(26, std::string("\xff\xff\xff\xff\xff\xff\xff\xff", 8)), bin, "truncated");
  expect_error(patched(34, std::string("\xff\xff\xff\xff", 4)), bin, "negative length");
  expect_error(patched(50, std::string("\x07", 1)), bin, "multiple of the item size");
  expect_error(patched(50, std::string("\x00\x00\x00\x00\x00\x00\x00\x40", 8)), bin, "has only");
  expect_error(patched(58, std::string("\x01", 1)), bin, "first document index");
  expect_error(patched(74, std::string("\x01", 1)), bin, "last document index");
  expect_error(patched(66, std::string("\x03", 1)), bin, "document index 1");
  expect_error(idx + "junk", bin, "bytes after its arrays");
  // A multimodal file read as plain carries S extra mode bytes, which are accepted.
  spit(cp + ".idx", idx + std::string(2, '\0'));
  spit(cp + ".bin", bin);
  EXPECT_NO_THROW(td::IndexedDataset ds(cp));
  // Random corruption of the parser's input (in memory; the fuzz target does this at scale):
  // an Error or a view whose every sequence lies inside the .bin.
  std::mt19937 rng(5);
  for (int i = 0; i < 20000; ++i) {
    std::string s = idx;
    int flips = 1 + rng() % 4;
    for (int f = 0; f < flips; ++f) s[rng() % s.size()] ^= static_cast<char>(1 << (rng() % 8));
    uint64_t bin_size = rng() % 16;
    try {
      td::IndexView v = td::parse_index({reinterpret_cast<const unsigned char*>(s.data()), s.size()}, bin_size, "x.idx", "x.bin");
      for (uint64_t q = 0; q < v.sequence_count; ++q)
        ASSERT_LE(v.pointer(q) + v.length(q) * td::dtype_size(v.dtype), static_cast<int64_t>(bin_size));
    } catch (const tessera::Error&) {
    }
  }
}

TEST_F(DataIndexedDataset, MergeLikeMegatron) {
  std::string a = write_example("a");
  std::string b = path("b");
  {
    td::IndexedDatasetBuilder bb(td::bin_path(b), td::IndexDType::UInt16);
    std::vector<int32_t> t{7, 8, 9, 1}, l{1, 3}, none;
    bb.add_document(t, l);
    bb.add_document(none, none);
    bb.finalize(td::idx_path(b));
  }
  std::string m = path("merged");
  td::MergeResult r = td::merge_datasets({a, b}, m);
  EXPECT_EQ(r.sequences, 4u);
  EXPECT_EQ(r.documents, 4u);
  td::IndexedDataset ds(m);
  EXPECT_EQ(ds.sequence_count(), 4u);
  std::vector<int64_t> docs;
  for (uint64_t i = 0; i <= ds.document_count(); ++i) docs.push_back(ds.document_index(i));
  EXPECT_EQ(docs, (std::vector<int64_t>{0, 1, 2, 4, 4}));
  EXPECT_EQ(ds.get(3)[2], 1);
  EXPECT_EQ(slurp(m + ".bin"), slurp(a + ".bin") + slurp(b + ".bin"));
  // The same as writing all documents into one builder.
  std::string direct = path("direct");
  {
    td::IndexedDatasetBuilder d(td::bin_path(direct), td::IndexDType::UInt16);
    std::vector<int32_t> d0{10, 20, 50256}, l0{3}, d1{30, 50256}, l1{2}, t{7, 8, 9, 1}, l{1, 3}, none;
    d.add_document(d0, l0);
    d.add_document(d1, l1);
    d.add_document(t, l);
    d.add_document(none, none);
    d.finalize(td::idx_path(direct));
  }
  EXPECT_EQ(slurp(m + ".idx"), slurp(direct + ".idx"));
  // A folder of datasets: sorted by name, as merge_datasets.py does.
  fs::create_directories(path("dir"));
  for (auto& [from, to] : {std::pair{a, path("dir/x1")}, std::pair{b, path("dir/x0")}}) {
    fs::copy_file(from + ".bin", to + ".bin");
    fs::copy_file(from + ".idx", to + ".idx");
  }
  auto prefixes = td::dataset_prefixes_in(path("dir"));
  ASSERT_EQ(prefixes.size(), 2u);
  EXPECT_EQ(prefixes[0], path("dir/x0"));
  // Mismatched dtypes are refused.
  std::string c = path("c");
  {
    td::IndexedDatasetBuilder cb(td::bin_path(c), td::IndexDType::Int32);
    std::vector<int32_t> t{1}, l{1};
    cb.add_document(t, l);
    cb.finalize(td::idx_path(c));
  }
  EXPECT_THROW(td::merge_datasets({a, c}, path("bad")), tessera::Error);
  EXPECT_FALSE(fs::exists(path("bad.bin")));
}

TEST_F(DataIndexedDataset, ScratchPartitionsAndSpill) {
  // Tiny in-memory bounds force the index arrays through scratch files.
  std::mt19937 rng(11);
  std::vector<std::vector<int32_t>> docs(500);
  for (auto& d : docs) {
    d.resize(rng() % 7);
    for (auto& t : d) t = static_cast<int32_t>(rng() % 50000);
  }
  std::string direct = path("direct"), parted = path("parted");
  {
    td::IndexedDatasetBuilder b(td::bin_path(direct), td::IndexDType::UInt16, 1 << 20);
    for (auto& d : docs) {
      std::vector<int32_t> l;
      if (!d.empty()) l.push_back(static_cast<int32_t>(d.size()));
      b.add_document(d, l);
    }
    b.finalize(td::idx_path(direct));
  }
  {
    td::IndexedDatasetBuilder b(td::bin_path(parted), td::IndexDType::UInt16, 7);
    std::vector<std::unique_ptr<td::IndexedDatasetBuilder>> parts;
    for (int p = 0; p < 3; ++p) parts.push_back(td::IndexedDatasetBuilder::scratch(dir_.string(), td::IndexDType::UInt16, 5));
    // Contiguous blocks so that the merged order equals the direct order.
    for (size_t i = 0; i < docs.size(); ++i) {
      std::vector<int32_t> l;
      if (!docs[i].empty()) l.push_back(static_cast<int32_t>(docs[i].size()));
      parts[i * 3 / docs.size()]->add_document(docs[i], l);
    }
    for (auto& p : parts) b.append(*p);
    b.finalize(td::idx_path(parted));
  }
  EXPECT_EQ(slurp(direct + ".bin"), slurp(parted + ".bin"));
  EXPECT_EQ(slurp(direct + ".idx"), slurp(parted + ".idx"));
  // Scratch files never appear in the folder.
  size_t files = 0;
  for (auto& e : fs::directory_iterator(dir_)) files += e.is_regular_file();
  EXPECT_EQ(files, 4u);
}
