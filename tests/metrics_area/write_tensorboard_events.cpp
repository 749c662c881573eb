// write_tensorboard_events DIR [TAG STEP VALUE]...: writes the given scalars through
// tessera::metrics::TensorBoardWriter, flushing after the first one, for
// tensorboard_reader_test.py to read back with TensorBoard's own reader. Prints the file's path.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "tessera/core/error.h"
#include "tessera/metrics/tensorboard_writer.h"

int main(int argc, char** argv) {
  if (argc < 2 || (argc - 2) % 3 != 0) {
    std::fprintf(stderr, "usage: %s DIR [TAG STEP VALUE]...\n", argv[0]);
    return 2;
  }
  try {
    tessera::metrics::TensorBoardWriter writer(argv[1]);
    for (int i = 2; i < argc; i += 3) {
      writer.add_scalar(argv[i], std::strtod(argv[i + 2], nullptr), std::strtoll(argv[i + 1], nullptr, 10));
      if (i == 2) writer.flush();
    }
    std::printf("%s\n", writer.path().c_str());
  } catch (const tessera::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
