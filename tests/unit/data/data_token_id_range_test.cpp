// The data's token ids against a model's vocabulary (data/token_id_range.h): the dtype's bound
// when it fits, else a scan that finds the extreme ids and the first sequence outside.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <vector>

#include "tessera/core/error.h"
#include "tessera/data/token_id_range.h"

namespace td = tessera::data;
namespace fs = std::filesystem;

namespace {

class DataTokenIdRange : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("tessera-token-ids-" + std::to_string(getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Documents of one sequence each.
  std::string write(const std::string& name, td::IndexDType dtype, const std::vector<std::vector<int32_t>>& docs) {
    const std::string prefix = (dir_ / name).string();
    td::IndexedDatasetBuilder b(td::bin_path(prefix), dtype);
    for (const auto& d : docs) {
      b.add_item(d);
      b.end_document();
    }
    b.finalize(td::idx_path(prefix));
    return prefix;
  }
  fs::path dir_;
};

TEST_F(DataTokenIdRange, DtypeBoundSkipsTheScan) {
  const td::IndexedDataset ds(write("u16", td::IndexDType::UInt16, {{1, 2, 3}, {60000}}));
  const td::TokenIdRange r = td::token_id_range(ds, 65536);  // every uint16 fits: nothing read
  EXPECT_FALSE(r.scanned);
  EXPECT_EQ(r.max_id, 65535);
  EXPECT_EQ(r.bytes_read, 0u);
  EXPECT_EQ(td::token_id_problem(ds, r, 65536, "v"), "");
}

TEST_F(DataTokenIdRange, ScanFindsTheLargestIdAndWhereItIs) {
  std::vector<std::vector<int32_t>> docs(3000, std::vector<int32_t>{5, 7, 1023});
  docs[2000] = {4, 15756, 9};  // GPT-2 data under a 1024-id model
  docs[2500] = {20000};
  const td::IndexedDataset ds(write("gpt2ish", td::IndexDType::UInt16, docs));
  td::TokenIdRange r = td::token_id_range(ds, 1024);
  EXPECT_TRUE(r.scanned);
  EXPECT_EQ(r.min_id, 4);
  EXPECT_EQ(r.max_id, 20000);
  EXPECT_EQ(r.bytes_read, 2u * 3u * 3000u - 2u * 2u);
  ASSERT_TRUE(r.first_bad_sequence);
  EXPECT_EQ(*r.first_bad_sequence, 2000u);
  const std::string problem = td::token_id_problem(ds, r, 1024, "1024 ids (NullTokenizer --vocab-size 1000)");
  EXPECT_NE(problem.find(ds.prefix() + " holds token ids up to 20000"), std::string::npos) << problem;
  EXPECT_NE(problem.find("sequence with one outside the vocabulary: 2000, in document 2000"), std::string::npos)
      << problem;
  EXPECT_NE(problem.find("outside [0, 1024)"), std::string::npos) << problem;

  r = td::token_id_range(ds, 20001);  // the largest id fits exactly
  EXPECT_TRUE(r.scanned);
  EXPECT_FALSE(r.first_bad_sequence);
  EXPECT_EQ(td::token_id_problem(ds, r, 20001, "v"), "");
}

TEST_F(DataTokenIdRange, NegativeIdsAreOutsideToo) {
  const td::IndexedDataset ds(write("i32", td::IndexDType::Int32, {{3}, {}, {2, -1}}));
  const td::TokenIdRange r = td::token_id_range(ds, 1 << 30);
  EXPECT_EQ(r.min_id, -1);
  EXPECT_EQ(r.max_id, 3);
  ASSERT_TRUE(r.first_bad_sequence);
  EXPECT_EQ(*r.first_bad_sequence, 2u);
  EXPECT_NE(td::token_id_problem(ds, r, 1 << 30, "v").find("down to -1"), std::string::npos);
}

TEST_F(DataTokenIdRange, TrainerCheckNamesTheDataset) {
  const std::string ok = write("ok", td::IndexDType::UInt16, {{1, 2}, {3}});
  const std::string big = write("big", td::IndexDType::UInt16, {{1, 2}, {3000}});
  td::GPTDatasetConfig c;
  c.blend = td::Blend{{ok, big}, std::nullopt};
  try {
    td::check_token_ids_fit(c, 1024, "1024 ids");
    ADD_FAILURE() << "no error";
  } catch (const tessera::Error& e) {
    EXPECT_NE(std::string(e.what()).find(big + " holds token ids up to 3000"), std::string::npos) << e.what();
    EXPECT_NE(e.hint().find("tessera preprocess"), std::string::npos) << e.hint();
  }
  c.blend = td::Blend{{ok}, std::nullopt};
  ASSERT_EQ(td::check_token_ids_fit(c, 1024, "1024 ids").size(), 1u);
  c.blend.reset();
  c.mock = true;  // mock documents are generated within the vocabulary
  EXPECT_TRUE(td::check_token_ids_fit(c, 16, "16 ids").empty());
}

}  // namespace
