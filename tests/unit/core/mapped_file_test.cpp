// tessera::MappedFile: errors that name the file, an empty file, the contents, moves, and
// drop_pages handing back exactly the whole pages around a range (measured in the map's
// resident size from /proc/self/smaps).
#include "tessera/core/mapped_file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "../test_support.h"

namespace fs = std::filesystem;
using tessera::MappedFile;
using tessera::testing_support::expect_error;
using tessera::testing_support::scratch_dir;

namespace {

class MappedFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = scratch_dir("mapped_file_test", ::testing::UnitTest::GetInstance()->current_test_info()->name());
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }
  // A file of `size` bytes, byte i being i * 7 mod 256.
  std::string file(const std::string& name, size_t size) const {
    const std::string p = (dir_ / name).string();
    std::ofstream out(p, std::ios::binary);
    for (size_t i = 0; i < size; ++i) out.put(static_cast<char>(i * 7));
    return p;
  }
  static void expect_pattern(const MappedFile& f, size_t size) {
    ASSERT_EQ(f.size(), size);
    ASSERT_EQ(f.bytes().size(), size);
    for (size_t i = 0; i < size; ++i) ASSERT_EQ(f.bytes()[i], static_cast<uint8_t>(i * 7)) << "byte " << i;
  }

  fs::path dir_;
};

// The resident size of the mapping that starts at `start`, in bytes.
uint64_t resident_bytes(const void* start) {
  std::ifstream smaps("/proc/self/smaps");
  char head[32];
  std::snprintf(head, sizeof head, "%lx-", reinterpret_cast<unsigned long>(start));
  bool in_map = false;
  for (std::string line; std::getline(smaps, line);) {
    if (line.rfind(head, 0) == 0) in_map = true;
    if (in_map && line.rfind("Rss:", 0) == 0) {
      uint64_t kb = 0;
      std::istringstream(line.substr(4)) >> kb;
      return kb * 1024;
    }
  }
  ADD_FAILURE() << "no mapping at " << head << " in /proc/self/smaps";
  return 0;
}

TEST_F(MappedFileTest, MissingFileIsAnErrorNamingIt) {
  const std::string p = (dir_ / "missing.bin").string();
  expect_error([&] { MappedFile f(p); }, {"cannot open " + p, "No such file", "check the path"});
}

TEST_F(MappedFileTest, FolderIsNotARegularFile) {
  expect_error([&] { MappedFile f(dir_.string()); }, {dir_.string() + " is not a regular file", "not of a folder"});
}

TEST_F(MappedFileTest, EmptyFileMapsToNothing) {
  MappedFile f(file("empty", 0));
  EXPECT_EQ(f.size(), 0u);
  EXPECT_TRUE(f.bytes().empty());
  EXPECT_GE(f.fd(), 0);
  f.drop_pages(0, 0);  // nothing mapped, nothing to drop
}

TEST_F(MappedFileTest, ContentsSizeAndPath) {
  const std::string p = file("data", 10000);
  MappedFile f(p);
  EXPECT_EQ(f.path(), p);
  expect_pattern(f, 10000);
  uint8_t b = 0;  // the descriptor reads the same file
  ASSERT_EQ(::pread(f.fd(), &b, 1, 9999), 1);
  EXPECT_EQ(b, static_cast<uint8_t>(9999 * 7));
}

TEST_F(MappedFileTest, MovesTransferTheMap) {
  MappedFile a(file("a", 100));
  const uint8_t* data = a.bytes().data();
  MappedFile b(std::move(a));
  EXPECT_EQ(b.bytes().data(), data);
  expect_pattern(b, 100);
  EXPECT_EQ(a.size(), 0u);  // NOLINT(bugprone-use-after-move): the moved-from state is specified
  EXPECT_TRUE(a.bytes().empty());
  EXPECT_EQ(a.fd(), -1);

  MappedFile c(file("c", 300));
  c = std::move(b);
  EXPECT_EQ(c.bytes().data(), data);
  expect_pattern(c, 100);
}

TEST_F(MappedFileTest, DropPagesHandsBackTheWholePagesAroundARange) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  MappedFile f(file("pages", 4 * page - 10));  // the last page partly filled
  expect_pattern(f, 4 * page - 10);         // faults every page in
  const void* start = f.bytes().data();
  ASSERT_EQ(resident_bytes(start), 4 * page);
  f.drop_pages(page + 1, 10);  // inside page 1
  EXPECT_EQ(resident_bytes(start), 3 * page);
  f.drop_pages(3 * page - 1, page - 9);  // the end of page 2 to the end of the file
  EXPECT_EQ(resident_bytes(start), page);
  expect_pattern(f, 4 * page - 10);  // dropped pages read back from the file
}

TEST(MappedFileDeathTest, DropPagesPastTheEndIsAnInternalError) {
  const fs::path dir = scratch_dir("mapped_file_test", "death");
  { std::ofstream((dir / "f").string()) << "abc"; }
  MappedFile f((dir / "f").string());
  EXPECT_DEATH(f.drop_pages(2, 2), "drop_pages past the end");
  fs::remove_all(dir);
}

}  // namespace
