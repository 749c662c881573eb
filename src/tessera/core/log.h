// Logging: printf-style lines to stdout (log) or stderr (warn). print_rank_0 mirrors
// Megatron's helper: only global rank 0 prints.
#pragma once

#include <cstdarg>

namespace tessera {

void set_log_rank(int rank, int world_size);
int log_rank();
int log_world_size();
void log_info(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void log_warn(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void print_rank_0(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void print_rank_last(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

}  // namespace tessera
