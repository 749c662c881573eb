#include "tessera/cli/commands.h"
#include "tessera/core/error.h"
namespace tessera::cli {
int run_preprocess(int, char**) { throw runtime_error("preprocess: placeholder"); }
}
