// Megatron-LM core_r0.10.0's training flags (megatron_flags.inc, generated from Megatron's own
// parser by tests/reference/megatron_namespace.py): which option strings pretrain_gpt.py
// accepts, what kind of value each takes, its default, and the Namespace attribute it writes.
// `tessera train` refuses the ones it lacks as "not supported yet"; `tessera flags` lists them.
#pragma once

#include <span>
#include <string_view>

namespace tessera {

enum class MegatronFlagKind {
  Value,   // one value
  List,    // nargs '*' or '+'
  Switch,  // store_true / store_false: no value
};

struct MegatronFlag {
  const char* name;             // the option string, "--num-layers" (an alias has its own entry)
  MegatronFlagKind kind;
  const char* default_literal;  // the parser's default as Python's repr prints it: "None", "'LayerNorm'"
  const char* dest;             // the Namespace attribute it writes: "--disable-bias-linear" -> "add_bias_linear"
};

// Every flag, in the order Megatron's parse_args adds them.
std::span<const MegatronFlag> megatron_flags();
// The flag named `flag`; nullptr when Megatron core_r0.10.0 has none.
const MegatronFlag* find_megatron_flag(std::string_view flag);
inline bool is_megatron_flag(std::string_view flag) { return find_megatron_flag(flag) != nullptr; }

}  // namespace tessera
