#include "tessera/core/error.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace tessera {

void throw_io_error(const std::string& path, std::string_view action, int err) {
  std::string what = std::string(action) + " " + path + ": " + std::strerror(err);
  std::string hint;
  if (err == ENOENT) hint = "check the path (relative paths are taken from the current folder)";
  else if (err == EACCES || err == EPERM) hint = "check the permissions of the file and its folder";
  else if (err == ENOSPC || err == EDQUOT) hint = "free some space or choose another output folder";
  else if (err == EISDIR) hint = "the path names a folder; give a file";
  throw runtime_error(what, hint);
}

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
