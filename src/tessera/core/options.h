// A declarative option table: one list of OptionDefs drives parsing, defaults, `--help` and
// Megatron's argument dump, so they cannot drift. Every subcommand parses with it. A table
// may know flags it does not implement (e.g. all of Megatron-LM's): those are rejected as
// "not supported yet"; anything else is an unknown flag with the closest known one.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace tessera {

enum class OptKind {
  Int,
  Float,
  String,
  Choice,      // String restricted to `choices` ("a|b|c")
  List,        // one or more values (nargs='+')
  StoreTrue,   // switch; value "True" when given
  StoreFalse,  // switch; value "False" when given (dest defaults to True)
};

enum class OptUse {
  Implemented,  // does what Megatron's flag does
  SpeedOnly,    // accepted; only tunes speed on other hardware: a one-line note is printed
};

struct OptionDef {
  const char* flag;           // "--num-layers"
  OptKind kind;
  const char* default_value;  // nullptr: None; StoreTrue: nullptr is False, "None" is None (argparse's default=None)
  const char* help;
  const char* choices = nullptr;  // Choice: the values tessera implements ("a|b")
  OptUse use = OptUse::Implemented;
  const char* dest = nullptr;  // the attribute it writes when not derived from the flag (train: Megatron's)
  // Choice: Megatron's other values ("c|d"), refused as "not supported yet" and named as such
  // by --help.
  const char* unsupported_choices = nullptr;
};

// Megatron's attribute name for a flag: dest, else the flag without dashes, '-' -> '_'.
std::string option_dest(const OptionDef& def);

class ParsedOptions {
 public:
  bool given(std::string_view flag) const { return given_.count(std::string(flag)) > 0; }
  // nullopt when the value is None.
  std::optional<std::string> raw(std::string_view flag) const;
  int64_t get_int(std::string_view flag) const;          // throws if None
  std::optional<int64_t> get_opt_int(std::string_view flag) const;
  double get_float(std::string_view flag) const;
  std::optional<double> get_opt_float(std::string_view flag) const;
  std::string get_string(std::string_view flag) const;  // "" when None
  bool get_bool(std::string_view flag) const;
  std::vector<std::string> get_list(std::string_view flag) const;
  // Records a value derived after parsing (Megatron prints derived values in its dump).
  void set_derived(std::string_view flag, std::string value);

 private:
  friend class OptionTable;
  const OptionDef& def(std::string_view flag) const;
  std::vector<const OptionDef*> defs_;
  std::map<std::string, std::optional<std::string>> values_;
  std::map<std::string, std::vector<std::string>> lists_;
  std::set<std::string> given_;
};

struct OptionTableSettings {
  // Flags recognised but not implemented (rejected as "not supported yet").
  std::function<bool(std::string_view)> not_supported_yet;
  // argparse's allow_abbrev: a unique prefix names a flag (Megatron's training parser turns
  // it off; tools/preprocess_data.py keeps argparse's default, on).
  bool allow_abbrev = false;
};

class OptionTable {
 public:
  OptionTable(std::string program, std::vector<OptionDef> defs, OptionTableSettings settings = {});
  // Parses `--flag value`, `--flag=value`, switches and lists; throws usage errors naming
  // the flag. Flags and choice values that are not supported yet are all named in one error
  // (a Megatron script usually has several). SpeedOnly flags given get one note each on stderr.
  ParsedOptions parse(int argc, char** argv) const;
  void print_help() const;
  // Megatron's "arguments" block (_print_args in megatron/training/arguments.py): dest names
  // sorted case-insensitively.
  void print_arguments(const ParsedOptions& parsed) const;
  const std::vector<OptionDef>& defs() const { return defs_; }

 private:
  const OptionDef* find(std::string_view flag) const;
  std::string program_;
  std::vector<OptionDef> defs_;
  OptionTableSettings settings_;
};

// The known flag closest to `flag` by edit distance.
std::string closest_flag(std::string_view flag, const std::vector<OptionDef>& defs);

}  // namespace tessera
