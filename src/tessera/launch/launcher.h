// `tessera launch`: serves or joins the rendezvous store, starts this node's workers with the
// environment of worker_env.h, relays their output, and supervises them with the other
// nodes' launchers (rendezvous.h): a failure anywhere stops every worker of every node, a
// signal reaches every worker and, through the store, every node; --max-restarts restarts
// all nodes' workers together.
#pragma once

#include <string>
#include <vector>

#include "tessera/launch/launch_options.h"

namespace tessera::launch {

struct Program {
  std::string path;               // what is executed
  std::vector<std::string> argv;  // argv[0] included
  std::string note;               // printed once when the program was translated, else ""
};

// PROGRAM as given -> what runs:
//   tessera ARGS, or a bare tessera subcommand (`train ARGS`)   -> self_exe [sub] ARGS
//   pretrain_gpt / preprocess_data (the aliases)                -> self_exe train|preprocess ARGS
//   .../pretrain_gpt.py ARGS (unless --no-python)               -> self_exe train ARGS
//   other *.py (unless --no-python), or -m MODULE               -> python3 [-m] ...
//   anything else                                               -> found on PATH or as a path
// Throws a usage error when nothing executable is found.
Program resolve_program(const LaunchOptions& options, const std::string& self_exe,
                        const std::vector<std::string>& tessera_subcommands);

// Runs the job on this node; returns the launcher's exit status (see --help). Throws
// tessera::Error for rendezvous and start-up failures before any worker ran.
int run_launcher(const LaunchOptions& options, const Program& program);

// Whether `host` names an address of this machine (a socket can be bound to it).
bool is_local_address(const std::string& host);

}  // namespace tessera::launch
