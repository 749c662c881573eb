#include "tessera/cli/commands.h"
#include "tessera/core/error.h"
namespace tessera::cli {
int run_train(int, char**) { throw runtime_error("train: placeholder"); }
}
