// `tessera doctor`'s checks across the world communicator: every rank's facts gathered, then
// one row per question (same binary, exact collectives, point-to-point, link speed, dataset
// caches, a slow rank). Every rank calls them in the same order; the rows are rank 0's to print.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tessera/comm/communicator.h"
#include "tessera/doctor/doctor.h"

namespace tessera::doctor {

// What each rank tells the others, gathered as plain bytes (fixed size, no pointers).
struct RankInfo {
  uint64_t build_hash = 0;
  double speed_seconds = 0;  // local_speed_seconds(): a fixed amount of local work
  int32_t node_rank = 0;
  int32_t rank = 0;
  int32_t cache_files = -1;    // index files in the cache folder; -1 without one
  uint64_t cache_listing = 0;  // FNV-1a of their sorted names and sizes
  char host[64] = {0};
};

// A fixed amount of arithmetic and memory traffic; its time tells a slow rank from the others.
double local_speed_seconds();

// Every rank's string, in rank order (lengths first, then the padded bytes).
std::vector<std::string> all_gather_text(Communicator& world, const std::string& mine);

// Gathers every rank's RankInfo into `info` and runs the world's checks; collective, so every
// rank calls it. Throws tessera::Error when a collective fails or times out.
std::vector<Row> world_checks(Communicator& world, const DoctorOptions& opt, const RankInfo& mine,
                              std::vector<RankInfo>& info);

}  // namespace tessera::doctor
