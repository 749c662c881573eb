// The doctor's single-process checks and its output, each FAIL path on its own.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "tessera/data/indexed_dataset.h"
#include "tessera/doctor/doctor.h"
#include "tessera/train/arguments.h"
#include "../test_ports.h"

namespace tessera::doctor {
namespace {

namespace fs = std::filesystem;

struct TempDir {
  fs::path path;
  TempDir() {
    char t[] = "/tmp/tessera-doctor-XXXXXX";
    path = mkdtemp(t);
  }
  ~TempDir() { fs::remove_all(path); }
};

ParsedOptions parse(std::vector<std::string> args) {
  std::vector<char*> v;
  for (auto& s : args) v.push_back(s.data());
  return train_option_table().parse(static_cast<int>(v.size()), v.data());
}

TEST(DoctorOptions, StripsItsOwnFlagsAndCheckpointFlags) {
  std::vector<std::string> a = {"--json", "--num-layers", "2",    "--min-free-disk-gb",
                                "0.5",    "--save",       "/ck",  "--doctor-timeout",
                                "3",      "--load",       "--lr", "1"};
  std::vector<char*> v;
  for (auto& s : a) v.push_back(s.data());
  DoctorOptions o = parse_doctor_options(static_cast<int>(v.size()), v.data());
  EXPECT_TRUE(o.json);
  EXPECT_DOUBLE_EQ(o.min_free_disk_gb, 0.5);
  EXPECT_DOUBLE_EQ(o.timeout_seconds, 3);
  EXPECT_EQ(*o.save, "/ck");
  EXPECT_EQ(*o.load, "");
  EXPECT_EQ(o.train_args, (std::vector<std::string>{"--num-layers", "2", "--save", "/ck", "--load", "--lr", "1"}));
  EXPECT_EQ(o.train_args_without_checkpoints, (std::vector<std::string>{"--num-layers", "2", "--lr", "1"}));
  std::vector<std::string> bad = {"--min-free-disk-gb", "lots"};
  std::vector<char*> vb;
  for (auto& s : bad) vb.push_back(s.data());
  EXPECT_THROW(parse_doctor_options(2, vb.data()), Error);
}

TEST(DoctorReport, MergesIdenticalRowsAndRoundTrips) {
  std::vector<Row> r0 = {{"data: x", Status::Pass, "ok", "", ""}, {"disk: y", Status::Pass, "1 GiB", "", ""}};
  std::vector<Row> r1 = {{"data: x", Status::Pass, "ok", "", ""}, {"disk: y", Status::Fail, "0 B", "free it", ""}};
  EXPECT_EQ(deserialize_rows(serialize_rows(r1)).size(), 2u);
  EXPECT_EQ(deserialize_rows(serialize_rows(r1))[1].fix, "free it");
  auto m = merge_rows({r0, r1}, {"a", "b"});
  ASSERT_EQ(m.size(), 3u);
  EXPECT_EQ(m[0].scope, "all ranks");
  EXPECT_EQ(m[2].scope, "rank 1 (b)");
  EXPECT_TRUE(any_failed(m));
  const std::string table = format_table(m);
  EXPECT_NE(table.find("fix: free it"), std::string::npos);
  EXPECT_NE(table.find("1 FAIL"), std::string::npos);
  const std::string json = format_json(m, 2);
  EXPECT_NE(json.find("\"ok\": false"), std::string::npos);
  EXPECT_NE(json.find("\"status\": \"FAIL\""), std::string::npos);
}

TEST(DoctorChecks, MissingAndInvalidDataFail) {
  TempDir t;
  const std::string missing = (t.path / "missing").string();
  const std::string dir = (t.path / "dir").string();  // .idx and .bin are folders: unreadable as files
  fs::create_directories(dir + ".idx");
  fs::create_directories(dir + ".bin");
  const std::string corrupt = (t.path / "corrupt").string();
  std::ofstream(corrupt + ".idx") << "not an index";
  std::ofstream(corrupt + ".bin") << "xx";
  ParsedOptions p = parse({"--data-path", missing, dir, corrupt, "--data-cache-path", (t.path / "cache").string()});
  DataPlan plan = data_plan(p);
  ASSERT_EQ(plan.prefixes.size(), 3u);
  auto rows = check_data(p, plan);
  ASSERT_GE(rows.size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(rows[i].status, Status::Fail) << rows[i].detail;
  EXPECT_NE(rows[0].detail.find("No such file"), std::string::npos) << rows[0].detail;
  EXPECT_NE(rows[1].detail.find("not a regular file"), std::string::npos) << rows[1].detail;
  EXPECT_NE(rows[2].detail.find("invalid"), std::string::npos) << rows[2].detail;
  EXPECT_FALSE(rows[0].fix.empty());
}

TEST(DoctorChecks, MissingVocabFails) {
  ParsedOptions p = parse({"--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", "/nonexistent/vocab.json",
                           "--merge-file", TESSERA_SOURCE_DIR "/tests/data/gpt2/merges.txt"});
  Row r = check_tokenizer(p);
  EXPECT_EQ(r.status, Status::Fail);
  EXPECT_NE(r.detail.find("/nonexistent/vocab.json"), std::string::npos) << r.detail;
  ParsedOptions ok =
      parse({"--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", TESSERA_SOURCE_DIR "/tests/data/gpt2/vocab.json",
             "--merge-file", TESSERA_SOURCE_DIR "/tests/data/gpt2/merges.txt"});
  EXPECT_EQ(check_tokenizer(ok).status, Status::Pass) << check_tokenizer(ok).detail;
}

TEST(DoctorChecks, WrongInterfaceNameFails) {
  auto rows = check_interfaces("nosuchif0", std::nullopt, "127.0.0.1", 29500, 1);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].status, Status::Fail);
  EXPECT_NE(rows[0].detail.find("nosuchif0"), std::string::npos) << rows[0].detail;
  auto lo = check_interfaces("lo", std::string("nosuchnic"), "127.0.0.1", 29500, 2);
  EXPECT_EQ(lo[0].status, Status::Fail);  // loopback with two nodes
  EXPECT_EQ(lo[1].status, Status::Warn);  // NCCL_SOCKET_IFNAME matches nothing
}

TEST(DoctorChecks, ComputeDeviceRowsAndAKernelRun) {
  EXPECT_TRUE(check_compute_device("cpu").empty());  // the devices: cpu row covers it
  const std::vector<Row> strict = check_compute_device("strict");
  ASSERT_EQ(strict.size(), 2u);
  EXPECT_EQ(strict[0].check, "devices: strict");
  EXPECT_NE(strict[0].detail.find(" MiB memory, "), std::string::npos) << strict[0].detail;
  EXPECT_EQ(strict[1].check, "devices: strict kernels");
  EXPECT_EQ(strict[1].status, Status::Pass) << strict[1].detail;
  EXPECT_NE(strict[1].detail.find("max |device - cpu| = 0"), std::string::npos) << strict[1].detail;
  for (const char* spec : {"nosuchbackend", "strict:7", "strict:x"}) {
    const std::vector<Row> bad = check_compute_device(spec);
    ASSERT_EQ(bad.size(), 1u) << spec;
    EXPECT_EQ(bad[0].check, std::string("devices: --device ") + spec);
    EXPECT_EQ(bad[0].status, Status::Fail);
    EXPECT_NE(bad[0].detail.find(spec), std::string::npos) << bad[0].detail;
    EXPECT_FALSE(bad[0].fix.empty()) << spec;
  }
}

TEST(DoctorChecks, ClosedPortFailsWithinTheTimeout) {
  const int port = test_ports::claim();  // nobody listens on it
  const auto t0 = std::chrono::steady_clock::now();
  Row r = probe_tcp("network: store", "127.0.0.1", port, 0.5);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(3));
  EXPECT_EQ(r.status, Status::Fail);
  EXPECT_NE(r.detail.find("unreachable"), std::string::npos) << r.detail;
}

TEST(DoctorChecks, DiskBelowThresholdFails) {
  TempDir t;
  EXPECT_EQ(check_disk("disk: x", t.path.string(), 1).status, Status::Pass);
  Row r = check_disk("disk: x", (t.path / "not" / "yet").string(), ~uint64_t{0} / 2);
  EXPECT_EQ(r.status, Status::Fail);
  EXPECT_EQ(check_writable("w", (t.path / "a" / "b").string(), "--save").status, Status::Pass);
}

// A --save under a regular file cannot be created; doctor used to skip past the file to its
// writable folder and pass it.
TEST(DoctorChecks, SaveUnderARegularFileFails) {
  TempDir t;
  std::ofstream(t.path / "file") << "x";
  Row r = check_writable("checkpoints: --save", (t.path / "file" / "ckpt").string(), "--save");
  EXPECT_EQ(r.status, Status::Fail);
  EXPECT_NE(r.detail.find("is a file, not a folder"), std::string::npos) << r.detail;
  EXPECT_NE(r.fix.find("--save"), std::string::npos) << r.fix;
}

TEST(DoctorChecks, ModelTooLargeFailsWithTheFlagsThatHelp) {
  GPTConfig c;
  c.num_layers = 200;
  c.hidden_size = 8192;
  c.num_attention_heads = 64;
  c.kv_channels = 128;
  c.ffn_hidden_size = 4 * 8192;
  c.seq_length = 2048;
  c.max_position_embeddings = 2048;
  c.vocab_size = 50257;
  c.padded_vocab_size = 50304;
  GPTMemoryEstimate e = estimate_gpt_memory(c, 4);
  EXPECT_GT(e.num_parameters, 160'000'000'000LL);
  MemoryInfo m{64ULL << 30, 60ULL << 30};
  Row r = check_memory({RankMemory{0, 0, 0, e}}, {0}, m, 60ULL << 30, 4, 200, 8192);
  EXPECT_EQ(r.status, Status::Fail);
  EXPECT_NE(r.fix.find("--micro-batch-size"), std::string::npos);
  EXPECT_NE(r.fix.find("--num-layers"), std::string::npos);
  EXPECT_EQ(
      check_memory({RankMemory{0, 0, 0, estimate_gpt_memory(c, 1)}}, {0}, MemoryInfo{1ULL << 50, 1ULL << 50},
                   1ULL << 50, 1, 200, 8192)
          .status,
      Status::Pass);
}

TrainArgs tiny_gpt_args(int world_size, std::vector<std::string> layout) {
  std::vector<std::string> a = {"--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4",
                                "--seq-length", "32", "--max-position-embeddings", "32", "--micro-batch-size", "2",
                                "--global-batch-size", "8", "--tokenizer-type", "NullTokenizer", "--vocab-size",
                                "1000", "--mock-data", "--lr", "1e-3", "--train-iters", "1"};
  a.insert(a.end(), layout.begin(), layout.end());
  std::vector<char*> v;
  for (auto& s : a) v.push_back(s.data());
  return parse_train_args(static_cast<int>(v.size()), v.data(), nullptr, world_size);
}

// Each rank's own share (a TP slice, a pipeline stage), as train allocates it, not the whole
// model on every rank; the largest rank is reported and the node's ranks are summed.
TEST(DoctorChecks, MemoryIsEachRanksOwnLayout) {
  const MemoryInfo plenty{1ULL << 40, 1ULL << 40};
  const TrainArgs whole = tiny_gpt_args(1, {});
  const size_t one_rank = estimate_gpt_memory(whole.model, 2).total_bytes();

  const TrainArgs tp = tiny_gpt_args(2, {"--tensor-model-parallel-size", "2"});
  const std::vector<RankMemory> tp_ranks = estimate_memory_per_rank(tp);
  ASSERT_EQ(tp_ranks.size(), 2u);
  EXPECT_LT(tp_ranks[0].estimate.total_bytes(), one_rank * 6 / 10);
  Row r = check_memory(tp_ranks, {0, 1}, plenty, 1ULL << 40, 2, 4, 64);
  char per_rank[64];
  std::snprintf(per_rank, sizeof per_rank, "; per rank %.1f MiB (", tp_ranks[0].estimate.total_bytes() / 1048576.0);
  EXPECT_NE(r.detail.find(per_rank), std::string::npos) << r.detail;
  EXPECT_EQ(r.detail.find("up to"), std::string::npos) << r.detail;  // TP ranks are alike

  const TrainArgs pp = tiny_gpt_args(4, {"--pipeline-model-parallel-size", "2"});
  const std::vector<RankMemory> pp_ranks = estimate_memory_per_rank(pp);
  ASSERT_EQ(pp_ranks.size(), 4u);  // DP 2 x PP 2: ranks 0, 1 on the first stage
  EXPECT_EQ(pp_ranks[0].pp_rank, 0);
  EXPECT_EQ(pp_ranks[2].pp_rank, 1);
  EXPECT_NE(pp_ranks[0].estimate.total_bytes(), pp_ranks[2].estimate.total_bytes());
  for (const RankMemory& m : pp_ranks) {
    EXPECT_LT(m.estimate.total_bytes(), one_rank);
    EXPECT_EQ(m.estimate.total_bytes(), estimate_rank_memory(pp, m.tp_rank, m.pp_rank).total_bytes());
  }
  const RankMemory& top = largest_rank_memory(pp_ranks);
  r = check_memory(pp_ranks, {0, 1}, plenty, 1ULL << 40, 2, 4, 64);
  EXPECT_NE(r.detail.find("per rank up to"), std::string::npos) << r.detail;
  EXPECT_NE(r.detail.find("(rank " + std::to_string(top.rank) + ": tensor 0, pipeline " + std::to_string(top.pp_rank)),
            std::string::npos)
      << r.detail;
  // Two processes need their two estimates: a machine with room for just one of the largest fails.
  const uint64_t room = top.estimate.total_bytes() + 1;
  EXPECT_EQ(check_memory(pp_ranks, {top.rank}, MemoryInfo{room, room}, room, 2, 4, 64).status, Status::Pass);
  EXPECT_EQ(check_memory(pp_ranks, {0, 1}, MemoryInfo{room, room}, room, 2, 4, 64).status, Status::Fail);
}

// Data tokenized with a larger vocabulary than the model's is a FAIL naming the id.
TEST(DoctorChecks, TokenIdsBeyondTheVocabularyFail) {
  TempDir t;
  const std::string prefix = (t.path / "gpt2_text_document").string();
  {
    data::IndexedDatasetBuilder b(data::bin_path(prefix), data::IndexDType::UInt16);
    b.add_item(std::vector<int32_t>{464, 15756, 50256});
    b.end_document();
    b.finalize(data::idx_path(prefix));
  }
  ParsedOptions p = parse({"--data-path", prefix, "--split", "1,0,0"});
  const DataPlan plan = data_plan(p);
  std::vector<Row> rows = check_data(p, plan, VocabularyLimit{1024, "1024 ids (NullTokenizer --vocab-size 1000)"});
  ASSERT_FALSE(rows.empty());
  EXPECT_EQ(rows[0].status, Status::Fail) << rows[0].detail;
  EXPECT_NE(rows[0].detail.find("holds token ids up to 50256"), std::string::npos) << rows[0].detail;
  EXPECT_NE(rows[0].fix.find("--tokenizer-type"), std::string::npos) << rows[0].fix;
  rows = check_data(p, plan, VocabularyLimit{50304, "50304 ids"});
  EXPECT_EQ(rows[0].status, Status::Pass) << rows[0].detail;
  EXPECT_NE(rows[0].detail.find("ids 464..50256 fit"), std::string::npos) << rows[0].detail;
}

}  // namespace
}  // namespace tessera::doctor
