#include "tessera/core/error.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>

namespace tessera {

void check_failed(const char* expr, const char* file, int line, const std::string& msg) {
  char host[256] = "?";
  gethostname(host, sizeof(host) - 1);
  const char* rank = std::getenv("RANK");
  std::fprintf(stderr, "tessera: internal check failed at %s:%d (rank %s, host %s): %s: %s\n",
               file, line, rank ? rank : "0", host, expr, msg.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace tessera
