#include "tessera/core/log.h"

#include <cstdio>

namespace tessera {
namespace {
int g_rank = 0;
int g_world = 1;

void vprint(FILE* f, const char* prefix, const char* fmt, va_list ap) {
  if (prefix) std::fputs(prefix, f);
  std::vfprintf(f, fmt, ap);
  std::fputc('\n', f);
  std::fflush(f);
}
}  // namespace

void set_log_rank(int rank, int world_size) {
  g_rank = rank;
  g_world = world_size;
}
int log_rank() { return g_rank; }
int log_world_size() { return g_world; }

void log_info(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vprint(stdout, nullptr, fmt, ap);
  va_end(ap);
}
void log_warn(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vprint(stderr, "warning: ", fmt, ap);
  va_end(ap);
}
void print_rank_0(const char* fmt, ...) {
  if (g_rank != 0) return;
  va_list ap;
  va_start(ap, fmt);
  vprint(stdout, nullptr, fmt, ap);
  va_end(ap);
}
void print_rank_last(const char* fmt, ...) {
  if (g_rank != g_world - 1) return;
  va_list ap;
  va_start(ap, fmt);
  vprint(stdout, nullptr, fmt, ap);
  va_end(ap);
}

}  // namespace tessera
