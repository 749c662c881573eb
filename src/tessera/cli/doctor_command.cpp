// `tessera doctor`: the pre-flight checklist (doctor/doctor.h), with train's flags.
#include "tessera/cli/commands.h"
#include "tessera/doctor/doctor.h"

namespace tessera::cli {

int run_doctor(int argc, char** argv) { return doctor::run_doctor(argc, argv); }

}  // namespace tessera::cli
