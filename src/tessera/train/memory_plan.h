// Before anything large is allocated: Megatron's theoretical-memory line and --dry-run's
// checks against this machine, from every rank's own layout (rank_memory.h).
#pragma once

#include "tessera/device/device.h"
#include "tessera/train/arguments.h"

namespace tessera {

// Megatron's "Theoretical memory footprints" line (rank 0 prints it) for the rank that needs
// the most: with TP/PP the ranks hold different shares, and the largest is the one that must fit.
void print_theoretical_memory(const TrainArgs& args, const Device& device);

// --dry-run: whether the `local_ranks` ranks this node runs (global ranks from `first_rank`)
// fit the machine. More than its memory, or than is free now, is a warning naming the figures,
// not an error: a dry run also validates a configuration meant for larger machines.
void check_node_memory(const TrainArgs& args, int first_rank, int local_ranks, const Device& device);

// --dry-run: every dataset prefix of the data flags opens (.idx and .bin present and
// consistent); a missing one is an Error whose hint says what to pass.
void check_data_files(const TrainArgs& args);

}  // namespace tessera
