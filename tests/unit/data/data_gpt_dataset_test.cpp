// Megatron's GPT dataset (megatron/core/datasets/gpt_dataset.py and helpers.cpp): a worked
// example whose values were computed with Megatron's own functions, and its cache MD5;
// MT19937 and PCG64 against numpy; document/sample/shuffle indices, blends and samples
// against the numpy re-implementation in tests/reference/data/gpt_dataset_reference.py for
// several sizes, splits, seeds and blends (separate final epoch included); the .npy format;
// masks and position ids; and the cache: N processes started together build it once, separate
// folders get identical arrays, truncated/corrupt/stale caches are rebuilt, Megatron's own
// caches (no side file) are adopted.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <numeric>
#include <random>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "tessera/core/error.h"
#include "tessera/core/mt19937.h"
#include "tessera/data/blended_dataset.h"
#include "tessera/data/dataset_config.h"
#include "tessera/data/gpt_dataset.h"
#include "tessera/data/gpt_dataset_builder.h"
#include "tessera/data/gpt_dataset_cache.h"
#include "tessera/data/gpt_dataset_mock.h"
#include "tessera/data/indexed_dataset.h"
#include "tessera/data/npy.h"

namespace td = tessera::data;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

const std::string kPython = "/usr/bin/python3";
const std::string kReference = std::string(TESSERA_SOURCE_DIR) + "/tests/reference/data/gpt_dataset_reference.py";

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}
void spit(const std::string& path, const std::string& bytes) { std::ofstream(path, std::ios::binary) << bytes; }

bool have_numpy() { return std::system((kPython + " -c 'import numpy' >/dev/null 2>&1").c_str()) == 0; }

// Runs the reference script; returns "" on success, else its output.
std::string run_reference(const std::string& args, const std::string& log) {
  int rc = std::system((kPython + " " + kReference + " " + args + " > " + log + " 2>&1").c_str());
  std::string out = slurp(log);
  std::cout << out;
  return rc == 0 ? std::string() : out;
}

// One document of one sequence per length; token j of sequence i is token(i, j).
std::string write_dataset(const std::string& prefix, const std::vector<int32_t>& lengths, td::IndexDType dtype,
                          const std::function<int32_t(int, int)>& token) {
  fs::create_directories(fs::path(prefix).parent_path());
  td::IndexedDatasetBuilder b(td::bin_path(prefix), dtype);
  for (size_t i = 0; i < lengths.size(); ++i) {
    std::vector<int32_t> t(static_cast<size_t>(lengths[i]));
    for (int j = 0; j < lengths[i]; ++j) t[static_cast<size_t>(j)] = token(static_cast<int>(i), j);
    std::vector<int32_t> l{lengths[i]};
    b.add_document(t, l);
  }
  b.finalize(td::idx_path(prefix));
  return prefix;
}

int32_t hundreds(int i, int j) { return 100 * i + j; }

std::vector<int32_t> random_lengths(uint32_t seed, int n, int lo, int hi) {
  std::mt19937 g(seed);
  std::uniform_int_distribution<int> d(lo, hi);
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(g);
  return v;
}

std::vector<int64_t> values(const td::NpyArray& a) { return a.to_int64(); }

std::vector<int32_t> sample_of(const td::SampleDataset& ds, int64_t i) {
  std::vector<int32_t> out(static_cast<size_t>(ds.sequence_length()) + 1);
  ds.sample(i, out);
  return out;
}

class DataGptDataset : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(TESSERA_BINARY_DIR) / ("gpt_dataset_test_" + std::to_string(::getpid()) + "_" +
                                          ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  td::GPTDatasetConfig config(const std::string& split, int seq, uint32_t seed, const std::string& cache) {
    td::GPTDatasetConfig c;
    c.random_seed = seed;
    c.sequence_length = seq;
    c.blend = td::Blend{{"unused"}, std::nullopt};
    c.split = split;
    c.path_to_cache = cache;
    c.tokenizer = td::gpt2_bpe_tokenizer_identity("gpt2-vocab.json", "gpt2-merges.txt");
    c.eod_id = 50256;
    c.verbose = false;
    c.finalize();
    return c;
  }

  fs::path dir_;
};

// ---- numpy-compatible random numbers --------------------------------------------------------

TEST(DataMt19937, MatchesNumpyGoldenValues) {
  // From numpy 1.24 (the RandomState that Megatron's gpt_dataset.py seeds with --seed):
  // RandomState(1234).randint(0, 2**32), shuffle of arange(10) and random_sample(3).
  tessera::Mt19937RandomState rs(1234);
  EXPECT_EQ(rs.next_uint32(), 822569775u);
  tessera::Mt19937RandomState sh(1234);
  std::vector<int64_t> a{0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
  sh.shuffle(a);
  EXPECT_EQ(a, (std::vector<int64_t>{7, 2, 9, 1, 0, 8, 4, 5, 6, 3}));
  tessera::Mt19937RandomState d(1234);
  EXPECT_EQ(d.random_sample(), 0.1915194503788923);
  EXPECT_EQ(d.random_sample(), 0.6221087710398319);
  EXPECT_EQ(d.random_sample(), 0.4377277390071145);
  // The same stream as std::mt19937 (init_genrand).
  for (uint32_t seed : {0u, 1u, 42u, 4294967295u}) {
    tessera::Mt19937RandomState m(seed);
    std::mt19937 s(seed);
    for (int i = 0; i < 2000; ++i) ASSERT_EQ(m.next_uint32(), s()) << "seed " << seed << " draw " << i;
  }
}

TEST(DataMt19937, Pcg64MockLengthsMatchNumpy) {
  // numpy.random.default_rng(0).integers(1, 4096, size=100000, dtype=numpy.int32), numpy 1.24.
  std::vector<int32_t> v = td::numpy_default_rng_integers_int32(0, 1, 4096, 100000);
  EXPECT_EQ(std::vector<int32_t>(v.begin(), v.begin() + 10),
            (std::vector<int32_t>{3484, 2609, 2094, 1105, 1261, 168, 309, 68, 718, 3331}));
  int64_t sum = 0;
  for (int32_t x : v) sum += x;
  EXPECT_EQ(sum, 204637097);
  EXPECT_EQ(tessera::sha256_hex({reinterpret_cast<const unsigned char*>(v.data()), v.size() * 4}),
            "ed8f44f17361fd0c689e0af757ac685fff85bc309c50f698ffb2aac84ebd4cea");
}

TEST_F(DataGptDataset, RandomNumbersAndPythonFormsMatchNumpy) {
  if (!have_numpy()) GTEST_SKIP() << "no numpy for " << kPython;
  json spec;
  std::vector<uint32_t> seeds = {0, 1, 42, 1234, 4294967295u};
  std::vector<int64_t> shuffle_sizes = {1, 2, 3, 10, 100, 1000, 70000};
  spec["seeds"] = seeds;
  spec["shuffle_sizes"] = shuffle_sizes;
  for (uint32_t seed : seeds) {
    tessera::Mt19937RandomState rs(seed);
    std::vector<uint32_t> u(1000);
    for (auto& x : u) x = rs.next_uint32();
    td::write_npy(path("mt_" + std::to_string(seed) + "_u32.npy"), td::NpyArray::from_vector(u));
    std::vector<uint64_t> bits(100);
    for (auto& x : bits) {
      double v = rs.random_sample();
      std::memcpy(&x, &v, 8);
    }
    td::write_npy(path("mt_" + std::to_string(seed) + "_double.npy"), td::NpyArray::from_vector(bits));
    for (int64_t n : shuffle_sizes) {
      std::vector<int64_t> a(static_cast<size_t>(n));
      std::iota(a.begin(), a.end(), 0);
      rs.shuffle(a);
      td::write_npy(path("mt_" + std::to_string(seed) + "_shuffle_" + std::to_string(n) + ".npy"),
                    td::NpyArray::from_vector(a));
    }
    td::write_npy(path("mt_" + std::to_string(seed) + "_permutation.npy"), td::NpyArray::from_vector(rs.permutation(500)));
  }
  spec["pcg_seeds"] = {0, 1, 12345};
  spec["pcg_range"] = {1, 4096};
  for (int seed : {0, 1, 12345})
    td::write_npy(path("pcg_" + std::to_string(seed) + ".npy"),
                  td::NpyArray::from_vector(td::numpy_default_rng_integers_int32(static_cast<uint64_t>(seed), 1, 4096, 5000)));
  // Python's float repr, numpy's pairwise sum, json.dumps(indent=4).
  std::mt19937_64 g(7);
  std::uniform_real_distribution<double> u01(0.0, 1.0);
  json reprs = json::array();
  for (double v : {0.0, -0.0, 1.0, 0.1, 0.8, 0.9000000000000001, 1e-05, 0.0001, 1e16, 1e15, 123456789.125, 1.5e-7,
                   2.5e300, -3.25, 1.0 / 3.0, 0.949, 0.999})
    reprs.push_back({{"value", v}, {"repr", td::json_float_repr(v)}});
  for (int i = 0; i < 200; ++i) {
    double v = u01(g) * std::pow(10.0, static_cast<int>(u01(g) * 40) - 20);
    reprs.push_back({{"value", v}, {"repr", td::json_float_repr(v)}});
  }
  spec["float_repr"] = reprs;
  json sums = json::array();
  for (int n : {1, 2, 3, 7, 8, 9, 16, 17, 127, 128, 129, 300, 1000}) {
    std::vector<double> v(static_cast<size_t>(n));
    for (auto& x : v) x = u01(g) * (u01(g) < 0.5 ? 1e-3 : 1e5);
    sums.push_back({{"values", v}, {"sum", td::numpy_sum(v)}});
  }
  spec["sums"] = sums;
  td::PyJson::Object nested{{"a", td::PyJson::Array{}}, {"b", td::PyJson::Object{}},
                            {"c", td::PyJson::Array{true, false, td::PyJson()}}};
  td::PyJson::Array floats;
  for (double v : {0.1, 1.0, 1e-05, 1e16, -0.0, 0.30000000000000004}) floats.emplace_back(v);
  td::PyJson obj(td::PyJson::Object{{"class", "GPTDataset"},
                                    {"path", "dir/\xc3\xbc/\xf0\x9f\x98\x80\"q\\\n\t\x01"},
                                    {"n", td::PyJson()},
                                    {"i", int64_t{-12}},
                                    {"f", std::move(floats)},
                                    {"nested", td::PyJson(std::move(nested))}});
  nlohmann::ordered_json input = nlohmann::ordered_json::parse(R"({"class":"GPTDataset","path":"dir/\u00fc/\ud83d\ude00\"q\\\n\t\u0001","n":null,"i":-12,)"
                           R"("f":[0.1,1.0,1e-05,1e16,-0.0,0.30000000000000004],"nested":{"a":[],"b":{},"c":[true,false,null]}})");
  spec["json"] = json::array({{{"json", input.dump()}, {"dumps", obj.dumps(4)}}});
  spit(path("rng.json"), spec.dump());
  std::string fail = run_reference("--rng " + dir_.string(), path("rng.log"));
  EXPECT_TRUE(fail.empty()) << fail;
}

// ---- configuration ----------------------------------------------------------------------------

TEST(DataGptDatasetConfig, SplitBookendsFollowMegatron) {
  // Bookends as Megatron's parse_and_normalize_split and convert_split_vector_to_split_matrix
  // (megatron/core/datasets/blended_megatron_dataset_config.py, utils.py) give them.
  struct Row {
    std::string split;
    int64_t n;
    std::vector<std::optional<std::pair<int64_t, int64_t>>> want;
  };
  using P = std::pair<int64_t, int64_t>;
  std::vector<Row> rows = {
      {"949,50,1", 1000, {P{0, 949}, P{949, 999}, P{999, 1000}}},
      {"949,50,1", 12345, {P{0, 11715}, P{11715, 12333}, P{12333, 12345}}},
      {"969, 30, 1", 1000, {P{0, 969}, P{969, 999}, P{999, 1000}}},
      {"969, 30, 1", 12345, {P{0, 11962}, P{11962, 12333}, P{12333, 12345}}},
      {"99,1,0", 1000, {P{0, 990}, P{990, 1000}, std::nullopt}},
      {"99,1,0", 12345, {P{0, 12222}, P{12222, 12345}, std::nullopt}},
      {"1,1,1", 1000, {P{0, 333}, P{333, 667}, P{667, 1000}}},
      {"1,1,1", 12345, {P{0, 4115}, P{4115, 8230}, P{8230, 12345}}},
  };
  for (const auto& r : rows) {
    td::SplitMatrix m = td::split_matrix_from_string(r.split);
    for (int i = 0; i < 3; ++i) {
      ASSERT_EQ(m[i].has_value(), r.want[i].has_value()) << r.split << " split " << i;
      if (m[i]) {
        EXPECT_EQ(td::split_range(*m[i], r.n), *r.want[i]) << r.split << " N=" << r.n << " split " << i;
      }
    }
    EXPECT_TRUE(m[0]->lo_is_int_zero);
  }
  EXPECT_EQ(td::split_matrix_from_string("0,1,0")[0].has_value(), false);
  EXPECT_FALSE(td::split_matrix_from_string("0,1,0")[1]->lo_is_int_zero);  // 0 + 0.0 is a float
  EXPECT_THROW(td::parse_split_vector("1,2,3,4"), tessera::Error);
  EXPECT_THROW(td::parse_split_vector("0,0,0"), tessera::Error);
  EXPECT_THROW(td::parse_split_vector("1.2.3"), tessera::Error);
}

TEST(DataGptDatasetConfig, BlendsAndSampleCounts) {
  td::Blend one = td::blend_from_list({" data/a "});
  EXPECT_EQ(one.prefixes, std::vector<std::string>{"data/a"});
  EXPECT_FALSE(one.weights);
  td::Blend w = td::blend_from_list({"30", "a", "70", "b"});
  EXPECT_EQ(w.prefixes, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(*w.weights, (std::vector<double>{30.0, 70.0}));
  EXPECT_EQ(td::normalize_weights(*w.weights), (std::vector<double>{0.3, 0.7}));
  td::Blend p = td::blend_from_list({"a", "b"});  // even count, not weights: all prefixes
  EXPECT_EQ(p.prefixes, (std::vector<std::string>{"a", "b"}));
  EXPECT_FALSE(p.weights);
  EXPECT_THROW(td::blend_from_list({}), tessera::Error);

  td::SplitSizes s = td::requested_sample_counts(500, std::nullopt, 8, 100, 10);
  EXPECT_EQ(*s[0], 4000);
  EXPECT_EQ(*s[1], (500 / 100 + 1) * 10 * 8);
  EXPECT_EQ(*s[2], 80);
  EXPECT_EQ(*td::requested_sample_counts(500, 4321, 8, 100, 10)[0], 4321);
  EXPECT_NE(td::format_target_sizes(s).find("    validation: 480"), std::string::npos);

  td::DataArgs a;
  a.data_path = std::vector<std::string>{"0.3", "a", "0.7", "b"};
  a.seq_length = 16;
  td::GPTDatasetConfig c = td::make_gpt_dataset_config(a, td::null_tokenizer_identity(100), 100);
  EXPECT_EQ(*c.split, "969, 30, 1");  // Megatron's legacy default
  EXPECT_FALSE(c.mock);
  EXPECT_EQ(c.tokenizer.to_json().dumps(4),
            "{\n    \"class\": \"_NullTokenizer\",\n    \"tokenizer_path\": [\n        null\n    ],\n    \"vocab_size\": \"100\"\n}");
  td::DataArgs m;
  m.mock_data = true;
  m.seq_length = 16;
  m.split = "9,1,0";  // ignored for mock data, as in Megatron
  td::GPTDatasetConfig mc = td::make_gpt_dataset_config(m, td::null_tokenizer_identity(100), 100);
  EXPECT_TRUE(mc.mock);
  EXPECT_EQ(*mc.split, "1,1,1");
  td::DataArgs both = a;
  both.mock_data = true;
  EXPECT_THROW(td::make_gpt_dataset_config(both, td::null_tokenizer_identity(100), 100), tessera::Error);
  td::DataArgs per;
  per.train_data_path = std::vector<std::string>{"a"};
  per.split = "1,1,1";
  per.seq_length = 16;
  EXPECT_THROW(td::make_gpt_dataset_config(per, td::null_tokenizer_identity(100), 100), tessera::Error);
  td::DataArgs none;
  none.seq_length = 16;
  EXPECT_THROW(td::make_gpt_dataset_config(none, td::null_tokenizer_identity(100), 100), tessera::Error);
}

// ---- .npy ----------------------------------------------------------------------------------------

TEST_F(DataGptDataset, NpyBytesAndValidation) {
  std::vector<int32_t> v(24);
  std::iota(v.begin(), v.end(), 0);
  std::string file = path("a.npy");
  td::write_npy(file, td::NpyArray::from_vector(v));
  std::string bytes = slurp(file);
  ASSERT_EQ(bytes.size(), 128u + 96u);  // numpy.save's format 1.0: a 128-byte header here
  EXPECT_EQ(bytes.substr(0, 10), std::string("\x93NUMPY\x01\x00\x76\x00", 10));
  EXPECT_EQ(bytes.substr(10, 58), "{'descr': '<i4', 'fortran_order': False, 'shape': (24,), }");
  EXPECT_EQ(bytes[127], '\n');
  td::NpyArray back = td::read_npy(file);
  EXPECT_EQ(back.dtype(), td::NpyDType::Int32);
  EXPECT_EQ(back.shape(), std::vector<int64_t>{24});
  EXPECT_EQ(back.at(23), 23);
  std::vector<int64_t> rows = {0, 0, 1, 2, 3, 4};
  td::write_npy(path("b.npy"), td::NpyArray::from_vector(rows, {3, 2}));
  EXPECT_EQ(td::read_npy(path("b.npy")).shape(), (std::vector<int64_t>{3, 2}));
  // Truncated, corrupt header, wrong magic: errors naming the file, never a crash.
  spit(path("t.npy"), bytes.substr(0, bytes.size() - 5));
  try {
    td::read_npy(path("t.npy"));
    ADD_FAILURE() << "a truncated .npy was accepted";
  } catch (const tessera::Error& e) {
    EXPECT_NE(std::string(e.what()).find("t.npy"), std::string::npos);
  }
  std::string bad = bytes;
  bad[20] = '#';
  spit(path("h.npy"), bad);
  EXPECT_THROW(td::read_npy(path("h.npy")), tessera::Error);
  spit(path("m.npy"), "NUMPY");
  EXPECT_THROW(td::read_npy(path("m.npy")), tessera::Error);
  for (size_t cut = 0; cut < 128; cut += 7) {
    spit(path("c.npy"), bytes.substr(0, cut));
    EXPECT_THROW(td::read_npy(path("c.npy")), tessera::Error) << cut;
  }
}

// ---- a worked example computed with Megatron's gpt_dataset.py and helpers.cpp ------------------

TEST_F(DataGptDataset, WorkedExampleComputedWithMegatron) {
  std::string prefix = write_dataset(path("data/tiny_text_document"), {5, 3, 7, 4, 6, 2, 8, 3, 5, 4},
                                     td::IndexDType::UInt16, hundreds);
  td::GPTDatasetConfig c = config("8,1,1", 4, 1234, path("cache"));
  auto low = std::make_shared<td::IndexedLowLevelDataset>(prefix);
  td::SplitMatrix m = *c.split_matrix;
  auto [b, e] = td::split_range(*m[0], 10);
  EXPECT_EQ(b, 0);
  EXPECT_EQ(e, 8);
  // The dataset path is hashed exactly as given: the worked example's "data/tiny_text_document".
  td::GPTDataset ds(low, std::string("data/tiny_text_document"), b, e, 20, td::Split::Train, c);
  EXPECT_EQ(ds.plan().tokens_per_epoch, 38);
  EXPECT_EQ(ds.plan().num_epochs, 3);
  EXPECT_TRUE(ds.plan().separate_final_epoch);
  EXPECT_EQ(ds.plan().num_samples_sans_final_epoch, 18);
  EXPECT_EQ(values(ds.document_index()),
            (std::vector<int64_t>{5, 3, 0, 4, 6, 2, 2, 7, 1, 1, 0, 4, 5, 6, 3, 7, 5, 1, 3, 4, 0, 7, 6, 2}));
  EXPECT_EQ(ds.sample_index().dtype(), td::NpyDType::Int32);
  EXPECT_EQ(ds.sample_index().shape(), (std::vector<int64_t>{29, 2}));
  EXPECT_EQ(values(ds.sample_index()),
            (std::vector<int64_t>{0, 0, 1, 2, 2, 2, 3, 1, 3, 5, 4, 3, 4, 7, 5, 3, 6, 0, 6, 4, 7, 1, 8, 2, 10, 0, 10, 4, 11, 3,
                                  12, 1, 13, 3, 13, 7, 14, 3, 16, 0, 17, 2, 18, 3, 19, 3, 20, 1, 21, 0, 22, 1, 22, 5, 23, 1, 23, 5}));
  EXPECT_EQ(ds.shuffle_index().dtype(), td::NpyDType::UInt32);
  EXPECT_EQ(values(ds.shuffle_index()), (std::vector<int64_t>{7, 10, 4, 1, 12, 8, 3, 17, 14, 13, 5, 11, 0, 2, 6, 15, 9, 16,
                                                               18, 24, 27, 25, 23, 26, 19, 22, 21, 20}));
  EXPECT_EQ(ds.size(), 28);
  EXPECT_EQ(sample_of(ds, 0), (std::vector<int32_t>{203, 204, 205, 206, 200}));
  EXPECT_EQ(sample_of(ds, 1), (std::vector<int32_t>{701, 702, 100, 101, 102}));
  EXPECT_EQ(sample_of(ds, 2), (std::vector<int32_t>{405, 600, 601, 602, 603}));
  EXPECT_EQ(ds.sample_sequences(1), (std::vector<int64_t>{7, 1}));
  // The description's MD5 and the cache file names (gpt_dataset.py's
  // _build_document_sample_shuffle_indices).
  EXPECT_EQ(ds.description_hash(), "af001634dc015b1f102ff443df3f2b81");
  for (const char* f : {"description.txt", "document_index.npy", "sample_index.npy", "shuffle_index.npy", "tessera.json"})
    EXPECT_TRUE(fs::exists(path(std::string("cache/af001634dc015b1f102ff443df3f2b81-GPTDataset-train-") + f))) << f;
  EXPECT_EQ(slurp(path("cache/af001634dc015b1f102ff443df3f2b81-GPTDataset-train-description.txt")), ds.description());
  EXPECT_THROW(sample_of(ds, 28), tessera::Error);
  EXPECT_THROW(sample_of(ds, -1), tessera::Error);

  // Without weights, one prefix, the builder gives the same train dataset; valid and test are
  // the one-sequence splits [8, 9) and [9, 10).
  td::GPTDatasetConfig bc = c;
  bc.blend = td::Blend{{prefix}, std::nullopt};
  td::GPTDatasets all = td::build_gpt_datasets(bc, {20, 2, 1});
  auto* train = dynamic_cast<const td::GPTDataset*>(all.train.get());
  ASSERT_NE(train, nullptr);
  EXPECT_EQ(values(train->document_index()), values(ds.document_index()));
  EXPECT_EQ(values(train->shuffle_index()), values(ds.shuffle_index()));
  auto* valid = dynamic_cast<const td::GPTDataset*>(all.valid.get());
  EXPECT_EQ(values(valid->document_index()), (std::vector<int64_t>{8, 8}));  // 2 samples need 9 > 5 tokens: E = 2
  // test: sequence 9 (4 tokens) twice (E = 2); the sample wraps into the second copy.
  EXPECT_EQ(sample_of(*all.test, 0), (std::vector<int32_t>{900, 901, 902, 903, 900}));
}

TEST_F(DataGptDataset, EmptySplitIsAnError) {
  std::string prefix = write_dataset(path("d"), {5, 3, 7}, td::IndexDType::UInt16, hundreds);
  td::GPTDatasetConfig c = config("949,50,1", 4, 1234, path("cache"));
  c.blend = td::Blend{{prefix}, std::nullopt};
  try {
    td::build_gpt_datasets(c, {10, 2, 1});
    ADD_FAILURE() << "an empty split was accepted";
  } catch (const tessera::Error& e) {
    EXPECT_NE(std::string(e.what()).find("split"), std::string::npos) << e.what();
    EXPECT_FALSE(e.hint().empty());
  }
}

// ---- masks and position ids (gpt_dataset.py's _get_ltor_masks_and_position_ids) ----------------

TEST(DataGptDatasetMasks, ResetPositionsEodMaskAndSegments) {
  const int32_t eod = 9;
  std::vector<int32_t> text = {1, 2, eod, 3, 4, 5};  // tokens a b EOD c d
  td::LtorSample s;
  td::make_ltor_sample(text, {eod, -1, false, false, false}, s);
  EXPECT_EQ(s.tokens, (std::vector<int32_t>{1, 2, eod, 3, 4}));
  EXPECT_EQ(s.labels, (std::vector<int32_t>{2, eod, 3, 4, 5}));
  EXPECT_EQ(s.position_ids, (std::vector<int64_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(s.loss_mask, (std::vector<float>{1, 1, 1, 1, 1}));
  EXPECT_TRUE(s.segment_starts.empty());
  td::make_ltor_sample(text, {eod, -1, true, true, true}, s);
  EXPECT_EQ(s.position_ids, (std::vector<int64_t>{0, 1, 2, 0, 1}));
  EXPECT_EQ(s.loss_mask, (std::vector<float>{1, 1, 0, 1, 1}));
  EXPECT_EQ(s.segment_starts, (std::vector<int32_t>{0, 3}));
  // EOD as the last input starts no new block; consecutive EODs each restart positions.
  std::vector<int32_t> t2 = {eod, eod, 7, 8, eod, 1};
  td::make_ltor_sample(t2, {eod, -1, true, true, false}, s);
  EXPECT_EQ(s.position_ids, (std::vector<int64_t>{0, 0, 0, 1, 2}));
  EXPECT_EQ(s.segment_starts, (std::vector<int32_t>{0, 1, 2}));
  // Padding (a kept partial validation sample): labels and tokens 0, no loss.
  std::vector<int32_t> t3 = {4, 5, -1, -1};
  td::make_ltor_sample(t3, {eod, -1, false, false, false}, s);
  EXPECT_EQ(s.tokens, (std::vector<int32_t>{4, 5, 0}));
  EXPECT_EQ(s.labels, (std::vector<int32_t>{5, 0, 0}));
  EXPECT_EQ(s.loss_mask, (std::vector<float>{1, 0, 0}));
}

// ---- mock data ---------------------------------------------------------------------------------

TEST(DataGptDatasetMock, SequencesAndSplits) {
  td::MockLowLevelDataset low(50256);
  EXPECT_EQ(low.sequence_count(), 100000u);
  EXPECT_EQ(low.sequence_length(0), 3484);
  std::vector<int32_t> t(3484);
  low.read_tokens(0, 0, 3484, t.data());
  EXPECT_EQ(t[0], 1);
  EXPECT_EQ(t[3482], 3483);
  EXPECT_EQ(t[3483], 50256);
  td::DataArgs a;
  a.mock_data = true;
  a.seq_length = 512;
  td::GPTDatasetConfig c = td::make_gpt_dataset_config(a, td::gpt2_bpe_tokenizer_identity("v", "m"), 50256);
  c.verbose = false;
  td::GPTDatasets ds = td::build_gpt_datasets(c, {8, 4, 4});
  auto* train = dynamic_cast<const td::GPTDataset*>(ds.train.get());
  ASSERT_NE(train, nullptr);
  EXPECT_EQ(train->cache_dir(), "");  // nothing cached without --data-cache-path
  EXPECT_EQ(train->document_index().size(), 33333u);
  EXPECT_EQ(dynamic_cast<const td::GPTDataset*>(ds.test.get())->document_index().size(), 33333u);
  EXPECT_NE(train->description().find("\"class\": \"MockGPTDataset\""), std::string::npos);
  EXPECT_NE(train->description().find("\"dataset_path\": null"), std::string::npos);
  std::vector<int32_t> s = sample_of(*ds.train, 0);
  EXPECT_EQ(s.size(), 513u);
}

// ---- against the numpy re-implementation ---------------------------------------------------------

struct RefCase {
  std::string name;
  td::DataArgs args;
  td::SplitSizes sizes;
  bool keep_partial_valid = false;
  bool default_cache = false;
};

json blend_json(const td::Blend& b) {
  json j;
  j["prefixes"] = b.prefixes;
  j["weights"] = b.weights ? json(*b.weights) : json(nullptr);
  return j;
}

TEST_F(DataGptDataset, IndicesMatchNumpyReference) {
  if (!have_numpy()) GTEST_SKIP() << "no numpy for " << kPython;
  const std::string A = write_dataset(path("A"), random_lengths(1, 300, 1, 64), td::IndexDType::UInt16, hundreds);
  const std::string B = write_dataset(path("B"), random_lengths(2, 120, 1, 200), td::IndexDType::Int32,
                                      [](int i, int j) { return 1000 * i + j; });
  std::vector<int32_t> c_lengths = random_lengths(3, 80, 0, 30);
  for (size_t i = 60; i < c_lengths.size(); ++i) c_lengths[i] = std::max(c_lengths[i], 3);
  const std::string C = write_dataset(path("C"), c_lengths, td::IndexDType::UInt16, hundreds);

  // Case "exact": sizes chosen from the data so that train has a separate final epoch (E = 3)
  // and valid a joined one (E = 2); test asks for one epoch (no size).
  std::vector<int32_t> a_lengths = random_lengths(1, 300, 1, 64);
  auto tpe = [&](int b, int e) {
    int64_t t = 0;
    for (int i = b; i < e; ++i) t += a_lengths[static_cast<size_t>(i)];
    return t;
  };
  const int seq_exact = 8;
  int64_t per_train = (tpe(0, 100) - 1) / seq_exact, per_valid = (tpe(100, 200) - 1) / seq_exact;

  auto args = [&](std::vector<std::string> data_path, std::string split, uint32_t seed, int seq, std::string cache) {
    td::DataArgs a;
    a.data_path = std::move(data_path);
    a.split = std::move(split);
    a.seed = seed;
    a.seq_length = seq;
    if (!cache.empty()) a.data_cache_path = path(cache);
    return a;
  };
  std::vector<RefCase> cases;
  cases.push_back({"single", args({A}, "90,8,2", 1234, 16, ""), {2000, 30, 5}, false, true});
  cases.push_back({"exact", args({A}, "1,1,1", 7, seq_exact, "cache_exact"), {2 * per_train + 3, 2 * per_valid - 1, std::nullopt}});
  cases.push_back({"weighted", args({"0.3", A, "0.7", B}, "98,2,0", 4294967295u, 32, "cache_w"), {600, 40, 10}});
  cases.push_back({"unweighted", args({A, C}, "90,5,5", 1234, 8, "cache_u"), {100, 10, 10}});
  {
    td::DataArgs a;
    a.train_data_path = std::vector<std::string>{"2", A, "1", B};
    a.valid_data_path = std::vector<std::string>{C};
    a.test_data_path = std::vector<std::string>{A, B};
    a.seed = 99;
    a.seq_length = 16;
    a.data_cache_path = path("cache_per_split");
    cases.push_back({"per_split", a, {300, 20, 15}});
  }
  {
    td::DataArgs a = args({"1", A, "1", B}, "80,20", 5, 16, "cache_renorm");
    a.renormalize_blend_weights = true;
    cases.push_back({"renormalize", a, {250, 30, 0}});
  }
  {
    td::DataArgs a;
    a.mock_data = true;
    a.seq_length = 1024;
    a.seed = 1234;
    a.data_cache_path = path("cache_mock");
    cases.push_back({"mock", a, {64, 16, 8}});
  }
  cases.push_back({"partial_valid", args({A}, "50,50,0", 3, 16, "cache_partial"), {10, 10, 1}, true});

  json manifest;
  manifest["cases"] = json::array();
  std::mt19937 pick(11);
  for (const auto& rc : cases) {
    td::GPTDatasetConfig cfg =
        td::make_gpt_dataset_config(rc.args, td::gpt2_bpe_tokenizer_identity("vocab.json", "merges.txt"), 50256);
    cfg.verbose = false;
    cfg.drop_last_partial_validation_sequence = !rc.keep_partial_valid;
    td::GPTDatasets ds = td::build_gpt_datasets(cfg, rc.sizes);
    json jc;
    jc["name"] = rc.name;
    jc["seed"] = cfg.random_seed;
    jc["seq_length"] = cfg.sequence_length;
    jc["split"] = cfg.split ? json(*cfg.split) : json(nullptr);
    jc["blend"] = cfg.blend ? blend_json(*cfg.blend) : json(nullptr);
    if (cfg.blend_per_split) {
      json per = json::array();
      for (const auto& b : *cfg.blend_per_split) per.push_back(b ? blend_json(*b) : json(nullptr));
      jc["blend_per_split"] = per;
    }
    jc["mock"] = cfg.mock;
    json sizes = json::array();
    for (const auto& s : rc.sizes) sizes.push_back(s ? json(*s) : json(nullptr));
    jc["sizes"] = sizes;
    jc["tokenizer"] = {{"class", "_GPT2BPETokenizer"}, {"tokenizer_path", {"vocab.json", "merges.txt"}}};
    jc["eod"] = 50256;
    jc["cache_dir"] = cfg.path_to_cache ? json(*cfg.path_to_cache) : json(nullptr);
    jc["renormalize"] = cfg.renormalize_blend_weights;
    jc["drop_last_partial_validation_sequence"] = cfg.drop_last_partial_validation_sequence;
    json outputs = json::array();
    for (td::Split s : td::kAllSplits) {
      const auto& d = ds[s];
      if (!d) {
        outputs.push_back(nullptr);
        continue;
      }
      json o;
      o["size"] = d->size();
      if (auto* g = dynamic_cast<const td::GPTDataset*>(d.get())) {
        o["base"] = g->description_hash() + (cfg.mock ? "-MockGPTDataset-" : "-GPTDataset-") + td::split_name(s);
      } else {
        auto* bl = dynamic_cast<const td::BlendedDataset*>(d.get());
        ASSERT_NE(bl, nullptr);
        o["base"] = bl->description_hash() + "-BlendedDataset-" + td::split_name(s);
        json comps = json::array();
        for (const auto& c : bl->datasets())
          comps.push_back({{"base", c->description_hash() + "-GPTDataset-" + td::split_name(s)}});
        o["components"] = comps;
      }
      std::set<int64_t> ids = {0, d->size() / 2, d->size() - 1};
      if (d->size() > 1) ids.insert(1);
      if (rc.keep_partial_valid && s == td::Split::Valid)
        for (int64_t i = 0; i < d->size(); ++i) ids.insert(i);
      for (int k = 0; k < 12; ++k) ids.insert(static_cast<int64_t>(pick() % static_cast<uint32_t>(d->size())));
      std::vector<int32_t> rows;
      for (int64_t i : ids) {
        std::vector<int32_t> t = sample_of(*d, i);
        rows.insert(rows.end(), t.begin(), t.end());
      }
      std::string samples = path(rc.name + "_" + td::split_name(s) + "_samples.npy");
      td::write_npy(samples, td::NpyArray::from_vector(rows, {static_cast<int64_t>(ids.size()), cfg.sequence_length + 1}));
      o["samples"] = samples;
      o["sample_ids"] = std::vector<int64_t>(ids.begin(), ids.end());
      outputs.push_back(o);
    }
    jc["outputs"] = outputs;
    manifest["cases"].push_back(jc);

    if (rc.name == "exact") {
      auto* train = dynamic_cast<const td::GPTDataset*>(ds.train.get());
      auto* valid = dynamic_cast<const td::GPTDataset*>(ds.valid.get());
      EXPECT_EQ(train->plan().num_epochs, 3);
      EXPECT_TRUE(train->plan().separate_final_epoch);
      EXPECT_EQ(valid->plan().num_epochs, 2);
      EXPECT_FALSE(valid->plan().separate_final_epoch);
      EXPECT_FALSE(dynamic_cast<const td::GPTDataset*>(ds.test.get())->num_samples().has_value());
    }
    if (rc.name == "single") {
      EXPECT_TRUE(fs::exists(A + "/cache/GPTDataset_indices"));  // Megatron's default location
      EXPECT_TRUE(dynamic_cast<const td::GPTDataset*>(ds.train.get())->plan().separate_final_epoch);
    }
    if (rc.name == "weighted" || rc.name == "renormalize") {
      EXPECT_EQ(ds.test, nullptr);
    }
  }
  spit(path("manifest.json"), manifest.dump(1));
  std::string fail = run_reference("--manifest " + path("manifest.json"), path("reference.log"));
  EXPECT_TRUE(fail.empty()) << fail;
}

// ---- the cache --------------------------------------------------------------------------------------

class DataGptDatasetCache : public DataGptDataset {
 protected:
  void SetUp() override {
    DataGptDataset::SetUp();
    lengths_ = random_lengths(21, 2000, 1, 300);
    prefix_ = write_dataset(path("corpus"), lengths_, td::IndexDType::UInt16, token);
  }
  td::GPTDatasetConfig cfg(const std::string& cache) {
    td::GPTDatasetConfig c = config("90,7,3", 64, 1234, path(cache));
    c.blend = td::Blend{{prefix_}, std::nullopt};
    return c;
  }
  td::GPTDatasets build(const std::string& cache) { return td::build_gpt_datasets(cfg(cache), {6000, 300, 100}); }
  // The three index arrays of every split, as bytes.
  static std::vector<std::string> arrays(const td::GPTDatasets& ds) {
    std::vector<std::string> out;
    for (td::Split s : td::kAllSplits) {
      auto* g = dynamic_cast<const td::GPTDataset*>(ds[s].get());
      for (const td::NpyArray* a : {&g->document_index(), &g->sample_index(), &g->shuffle_index()})
        out.emplace_back(reinterpret_cast<const char*>(a->bytes().data()), a->bytes().size());
    }
    return out;
  }
  std::string file_of(const td::GPTDatasets& ds, td::Split s, const std::string& suffix) {
    auto* g = dynamic_cast<const td::GPTDataset*>(ds[s].get());
    return g->cache_dir() + "/" + g->description_hash() + "-GPTDataset-" + td::split_name(s) + "-" + suffix;
  }
  static bool built(const td::GPTDatasets& ds, td::Split s) { return ds[s]->built_anew(); }

  static int32_t token(int i, int j) { return (7 * i + j) % 50000; }
  std::vector<int32_t> lengths_;
  std::string prefix_;
};

TEST_F(DataGptDatasetCache, ProcessesStartedTogetherBuildOnce) {
  constexpr int kProcesses = 4;
  int go[2];
  ASSERT_EQ(::pipe(go), 0);
  std::vector<pid_t> kids;
  for (int k = 0; k < kProcesses; ++k) {
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::close(go[1]);
      char c;
      (void)!::read(go[0], &c, 1);  // returns at EOF: all children start together
      int rc = 0;
      std::ofstream out(path("result_" + std::to_string(k)));
      try {
        td::GPTDatasets ds = build("shared_cache");
        for (td::Split s : td::kAllSplits) out << (built(ds, s) ? 1 : 0) << ' ';
        out << '\n';
        for (const auto& a : arrays(ds)) out << tessera::sha256_hex({reinterpret_cast<const unsigned char*>(a.data()), a.size()}) << ' ';
        std::vector<int32_t> s = sample_of(*ds.train, 123);
        out << '\n' << tessera::sha256_hex({reinterpret_cast<const unsigned char*>(s.data()), s.size() * 4}) << '\n';
      } catch (const std::exception& e) {
        out << "error " << e.what() << '\n';
        rc = 3;
      }
      out.close();
      ::_exit(rc);
    }
    kids.push_back(pid);
  }
  ::close(go[0]);
  ::close(go[1]);
  for (pid_t pid : kids) {
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child exit status " << status;
  }
  std::array<int, 3> builds{0, 0, 0};
  std::set<std::string> digests, samples;
  for (int k = 0; k < kProcesses; ++k) {
    std::ifstream in(path("result_" + std::to_string(k)));
    std::string flags, hashes, sample;
    std::getline(in, flags);
    std::getline(in, hashes);
    std::getline(in, sample);
    std::istringstream f(flags);
    for (int s = 0; s < 3; ++s) {
      int b = -1;
      f >> b;
      ASSERT_GE(b, 0) << "process " << k << ": " << flags;
      builds[static_cast<size_t>(s)] += b;
    }
    digests.insert(hashes);
    samples.insert(sample);
  }
  EXPECT_EQ(builds, (std::array<int, 3>{1, 1, 1})) << "each split's cache must be built by exactly one process";
  EXPECT_EQ(digests.size(), 1u) << "all processes must read identical arrays";
  EXPECT_EQ(samples.size(), 1u);
  // And a later process only loads.
  td::GPTDatasets again = build("shared_cache");
  for (td::Split s : td::kAllSplits) EXPECT_FALSE(built(again, s));
}

TEST_F(DataGptDatasetCache, SeparateFoldersHoldIdenticalArrays) {
  td::GPTDatasets a = build("node_a");
  td::GPTDatasets b = build("node_b");
  EXPECT_EQ(arrays(a), arrays(b));
  for (td::Split s : td::kAllSplits)
    for (const char* f : {"document_index.npy", "sample_index.npy", "shuffle_index.npy", "description.txt"})
      EXPECT_EQ(slurp(file_of(a, s, f)), slurp(file_of(b, s, f))) << f;
  // A GPTDataset constructed directly (a third folder) holds the builder's arrays.
  td::GPTDatasetConfig c = cfg("node_c");
  auto low = std::make_shared<td::IndexedLowLevelDataset>(prefix_);
  auto [lo, hi] = td::split_range(*(*c.split_matrix)[0], static_cast<int64_t>(lengths_.size()));
  td::GPTDataset train(low, prefix_, lo, hi, 6000, td::Split::Train, c);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(train.shuffle_index().bytes().data()), train.shuffle_index().bytes().size()),
            arrays(a)[2]);
}

TEST_F(DataGptDatasetCache, TruncatedOrCorruptFilesAreRebuilt) {
  std::vector<std::string> want = arrays(build("c"));
  {
    td::GPTDatasets first = build("c");
    std::string f = file_of(first, td::Split::Train, "sample_index.npy");
    std::string bytes = slurp(f);
    first = {};  // unmap
    spit(f, bytes.substr(0, bytes.size() / 2));
  }
  td::GPTDatasets rebuilt = build("c");
  EXPECT_TRUE(built(rebuilt, td::Split::Train));
  EXPECT_FALSE(built(rebuilt, td::Split::Valid));
  EXPECT_EQ(arrays(rebuilt), want);
  // One flipped byte in the data (size unchanged): caught by the recorded SHA-256.
  std::string f = file_of(rebuilt, td::Split::Valid, "shuffle_index.npy");
  rebuilt = {};
  std::string bytes = slurp(f);
  bytes[bytes.size() - 3] ^= 0x40;
  spit(f, bytes);
  td::GPTDatasets again = build("c");
  EXPECT_TRUE(built(again, td::Split::Valid));
  EXPECT_EQ(arrays(again), want);
  // A missing description, a garbled side file: rebuilt as well.
  std::string side = file_of(again, td::Split::Test, "tessera.json");
  again = {};
  spit(side, "{not json");
  EXPECT_TRUE(built(build("c"), td::Split::Test));
}

TEST_F(DataGptDatasetCache, StaleSourceTriggersRebuild) {
  td::GPTDatasets first = build("s");
  std::vector<std::string> old = arrays(first);
  first = {};
  // Same prefix, same sizes of .bin and .idx, other sequence lengths: Megatron would reuse the
  // stale cache (same description); the side file's .idx hash catches it.
  std::vector<int32_t> swapped = lengths_;
  std::swap(swapped[3], swapped[4]);
  ASSERT_NE(swapped[3], swapped[4]);
  write_dataset(prefix_, swapped, td::IndexDType::UInt16, token);
  td::GPTDatasets second = build("s");
  EXPECT_TRUE(built(second, td::Split::Train));
  std::vector<std::string> now = arrays(second);
  EXPECT_NE(now, old);
  second = {};
  // Equal to a fresh build in another folder.
  EXPECT_EQ(now, arrays(build("fresh")));
  // A side file recording another .bin size is stale too.
  td::GPTDatasets third = build("s");
  std::string side = file_of(third, td::Split::Valid, "tessera.json");
  third = {};
  json j = json::parse(slurp(side));
  j["sources"][0]["bin_size"] = j["sources"][0]["bin_size"].get<uint64_t>() + 2;
  spit(side, j.dump());
  EXPECT_TRUE(built(build("s"), td::Split::Valid));
}

TEST_F(DataGptDatasetCache, MegatronCacheWithoutSideFileIsAdopted) {
  td::GPTDatasets first = build("m");
  std::vector<std::string> want = arrays(first);
  std::string side = file_of(first, td::Split::Train, "tessera.json");
  first = {};
  ASSERT_TRUE(fs::remove(side));
  td::GPTDatasets second = build("m");
  EXPECT_FALSE(built(second, td::Split::Train));  // loaded, not rebuilt
  EXPECT_TRUE(fs::exists(side));
  EXPECT_EQ(arrays(second), want);
}

TEST_F(DataGptDatasetCache, BlendedCacheAndBounds) {
  std::string other = write_dataset(path("other"), random_lengths(5, 500, 1, 100), td::IndexDType::UInt16, hundreds);
  td::GPTDatasetConfig c = cfg("blend_cache");
  c.blend = td::Blend{{prefix_, other}, std::vector<double>{2.0, 1.0}};
  td::GPTDatasets a = td::build_gpt_datasets(c, {3000, 200, 50});
  auto* bl = dynamic_cast<const td::BlendedDataset*>(a.train.get());
  ASSERT_NE(bl, nullptr);
  EXPECT_TRUE(bl->built_anew());
  EXPECT_EQ(bl->size(), static_cast<int64_t>(std::ceil(3000 * (2.0 / 3.0) * 1.005)) +
                            static_cast<int64_t>(std::ceil(3000 * (1.0 / 3.0) * 1.005)));
  std::string di = path("blend_cache/" + bl->description_hash() + "-BlendedDataset-train-dataset_index.npy");
  EXPECT_TRUE(fs::exists(di));
  td::GPTDatasets b = td::build_gpt_datasets(c, {3000, 200, 50});
  EXPECT_FALSE(b.train->built_anew());
  EXPECT_EQ(sample_of(*a.train, 77), sample_of(*b.train, 77));
  // Blending indices: the largest deficit first, ties to the lower index.
  std::vector<int16_t> idx(6);
  std::vector<int64_t> sidx(6);
  std::vector<double> w = {0.5, 0.5};
  td::build_blending_indices(idx, sidx, w, 6);
  EXPECT_EQ(idx, (std::vector<int16_t>{0, 1, 0, 1, 0, 1}));
  EXPECT_EQ(sidx, (std::vector<int64_t>{0, 0, 1, 1, 2, 2}));
  std::vector<int64_t> sizes = {1, 3};
  std::vector<int16_t> ei(4);
  std::vector<int64_t> es(4);
  td::build_exhaustive_blending_indices(ei, es, sizes);
  EXPECT_EQ(std::count(ei.begin(), ei.end(), 0), 1);
  EXPECT_EQ(std::count(ei.begin(), ei.end(), 1), 3);
}

}  // namespace
