// `tessera ckpt inspect --summary`: one screen for a tessera checkpoint: iteration, layout,
// the model's parameter count and dtypes, sizes, and one line per shard folder. Reads the
// safetensors headers only (no checksums: the full `ckpt inspect` verifies every file).
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace tessera::cli {

// `it_dir` is the iteration's folder, `meta` its metadata.json. Returns the exit status: 1 when
// a tensor file cannot be read.
int print_checkpoint_summary(const std::string& it_dir, int64_t iteration, bool latest, const nlohmann::json& meta);

// Which optimizer saved the checkpoint and how its state is laid out (metadata.json `meta`).
std::string optimizer_description(const nlohmann::json& meta);

}  // namespace tessera::cli
