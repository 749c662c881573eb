#include "tessera/core/options.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>

#include "tessera/core/error.h"
#include "tessera/core/python_format.h"

namespace tessera {
namespace {

bool takes_value(OptKind k) { return k != OptKind::StoreTrue && k != OptKind::StoreFalse; }

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

bool is_choice(const char* choices, const std::string& v) {
  return choices && ("|" + std::string(choices) + "|").find("|" + v + "|") != std::string::npos;
}

std::string comma_list(const char* choices) {
  std::string s;
  for (const char* c = choices; *c; ++c) s += *c == '|' ? std::string(", ") : std::string(1, *c);
  return s;
}

// One error for every flag (or "--flag value") that is Megatron's but not supported yet.
Error not_supported_error(const std::vector<std::string>& items, const std::string& program) {
  const std::string hint = "remove them from the command line; `" + program + " --help` lists what is supported";
  if (items.size() == 1) {
    const bool value = items[0].find(' ') != std::string::npos;
    return usage_error(items[0] + " is a Megatron-LM " + (value ? "value" : "flag") +
                           " that tessera does not support yet",
                       "remove it from the command line; `" + program + " --help` lists what is supported");
  }
  std::string list;
  for (size_t i = 0; i < items.size(); ++i) list += (i ? ", " : "") + items[i];
  return usage_error(std::to_string(items.size()) + " Megatron-LM flags are not supported yet: " + list, hint);
}

void check_number(const OptionDef& d, const std::string& v) {
  char* end = nullptr;
  if (d.kind == OptKind::Int) {
    std::strtoll(v.c_str(), &end, 10);
    if (v.empty() || *end) throw usage_error(std::string(d.flag) + " expects an integer, got '" + v + "'");
  } else if (d.kind == OptKind::Float) {
    std::strtod(v.c_str(), &end);
    if (v.empty() || *end) throw usage_error(std::string(d.flag) + " expects a number, got '" + v + "'");
  } else if (d.kind == OptKind::Choice && !is_choice(d.choices, v)) {
    throw usage_error(std::string(d.flag) + ": invalid choice '" + v + "' (choose from " + comma_list(d.choices) + ")");
  }
}

}  // namespace

std::string option_dest(const OptionDef& def) {
  if (def.dest) return def.dest;
  std::string s(def.flag + 2);
  std::replace(s.begin(), s.end(), '-', '_');
  return s;
}

std::string closest_flag(std::string_view flag, const std::vector<OptionDef>& defs) {
  std::string best;
  size_t best_d = SIZE_MAX;
  for (const OptionDef& d : defs) {
    size_t dist = edit_distance(flag, d.flag);
    if (dist < best_d) best_d = dist, best = d.flag;
  }
  return best;
}

const OptionDef& ParsedOptions::def(std::string_view flag) const {
  for (const OptionDef* d : defs_)
    if (flag == d->flag) return *d;
  TESSERA_CHECK(false, "option " + std::string(flag) + " is not in the table");
  __builtin_unreachable();
}

std::optional<std::string> ParsedOptions::raw(std::string_view flag) const {
  def(flag);
  auto it = values_.find(std::string(flag));
  return it == values_.end() ? std::nullopt : it->second;
}

std::optional<int64_t> ParsedOptions::get_opt_int(std::string_view flag) const {
  auto v = raw(flag);
  if (!v) return std::nullopt;
  return std::strtoll(v->c_str(), nullptr, 10);
}
int64_t ParsedOptions::get_int(std::string_view flag) const {
  auto v = get_opt_int(flag);
  if (!v) throw usage_error("the flag " + std::string(flag) + " is required");
  return *v;
}
std::optional<double> ParsedOptions::get_opt_float(std::string_view flag) const {
  auto v = raw(flag);
  if (!v) return std::nullopt;
  return std::strtod(v->c_str(), nullptr);
}
double ParsedOptions::get_float(std::string_view flag) const {
  auto v = get_opt_float(flag);
  if (!v) throw usage_error("the flag " + std::string(flag) + " is required");
  return *v;
}
std::string ParsedOptions::get_string(std::string_view flag) const { return raw(flag).value_or(""); }
bool ParsedOptions::get_bool(std::string_view flag) const { return raw(flag).value_or("False") == "True"; }
std::vector<std::string> ParsedOptions::get_list(std::string_view flag) const {
  def(flag);
  auto it = lists_.find(std::string(flag));
  return it == lists_.end() ? std::vector<std::string>{} : it->second;
}

void ParsedOptions::set_derived(std::string_view flag, std::string value) {
  def(flag);
  values_[std::string(flag)] = std::move(value);
}

OptionTable::OptionTable(std::string program, std::vector<OptionDef> defs, OptionTableSettings settings)
    : program_(std::move(program)), defs_(std::move(defs)), settings_(std::move(settings)) {}

const OptionDef* OptionTable::find(std::string_view flag) const {
  const OptionDef* prefix_match = nullptr;
  int prefix_matches = 0;
  for (const OptionDef& d : defs_) {
    if (flag == d.flag) return &d;
    if (settings_.allow_abbrev && std::string_view(d.flag).starts_with(flag)) {
      prefix_match = &d;
      ++prefix_matches;
    }
  }
  if (prefix_matches > 1)
    throw usage_error("ambiguous flag " + std::string(flag), "spell it out; see `" + program_ + " --help`");
  return prefix_match;
}

ParsedOptions OptionTable::parse(int argc, char** argv) const {
  ParsedOptions out;
  std::vector<std::string> unsupported;
  for (const OptionDef& d : defs_) {
    out.defs_.push_back(&d);
    const char* dflt = d.kind == OptKind::StoreFalse ? "True" : d.default_value;
    if (d.kind == OptKind::StoreTrue && !dflt) dflt = "False";
    out.values_[d.flag] = dflt && std::string_view(dflt) != "None" ? std::optional<std::string>(dflt) : std::nullopt;
  }
  for (int i = 0; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg.rfind("--", 0) != 0)
      throw usage_error("unexpected argument '" + arg + "'", "flags start with --; see `" + program_ + " --help`");
    std::optional<std::string> inline_value;
    if (auto eq = arg.find('='); eq != std::string::npos) {
      inline_value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
    }
    const OptionDef* d = find(arg);
    if (!d) {
      if (!settings_.not_supported_yet || !settings_.not_supported_yet(arg))
        throw usage_error("unknown flag " + arg, "did you mean " + closest_flag(arg, defs_) + "?");
      unsupported.push_back(arg);
      if (!inline_value)  // its values: everything up to the next flag
        while (i + 1 < argc && std::string_view(argv[i + 1]).rfind("--", 0) != 0) ++i;
      continue;
    }
    out.given_.insert(d->flag);
    if (!takes_value(d->kind)) {
      if (inline_value) throw usage_error(arg + " takes no value");
      out.values_[d->flag] = d->kind == OptKind::StoreTrue ? "True" : "False";
      continue;
    }
    if (d->kind == OptKind::List) {
      std::vector<std::string> values;
      if (inline_value) values.push_back(*inline_value);
      while (i + 1 < argc && std::string_view(argv[i + 1]).rfind("--", 0) != 0) values.push_back(argv[++i]);
      if (values.empty()) throw usage_error(arg + " expects one or more values");
      out.lists_[d->flag] = values;
      out.values_[d->flag] = values.front();
      continue;
    }
    std::string value;
    if (inline_value) {
      value = *inline_value;
    } else {
      if (i + 1 >= argc) throw usage_error(arg + " expects a value");
      value = argv[++i];
    }
    if (d->kind == OptKind::Choice && is_choice(d->unsupported_choices, value)) {
      unsupported.push_back(arg + " " + value);
      continue;
    }
    check_number(*d, value);
    out.values_[d->flag] = value;
    if (d->use == OptUse::SpeedOnly)
      std::fprintf(stderr, "note: %s only tunes speed on other hardware; tessera accepts and ignores it\n", d->flag);
  }
  if (!unsupported.empty()) throw not_supported_error(unsupported, program_);
  for (const OptionDef& d : defs_)
    if (d.use == OptUse::SpeedOnly && !takes_value(d.kind) && out.given(d.flag))
      std::fprintf(stderr, "note: %s only tunes speed on other hardware; tessera accepts and ignores it\n", d.flag);
  return out;
}

void OptionTable::print_help() const {
  std::printf("usage: %s [flags]\n\nFlags take Megatron-LM's names and defaults.\n\n", program_.c_str());
  for (const OptionDef& d : defs_) {
    std::string left = d.flag;
    if (d.kind == OptKind::Choice) left += std::string(" {") + d.choices + "}";
    else if (d.kind == OptKind::List) left += " VALUE [VALUE ...]";
    else if (takes_value(d.kind)) left += " VALUE";
    std::string right = d.help;
    if (d.default_value && takes_value(d.kind)) right += std::string(" (default: ") + d.default_value + ")";
    if (d.unsupported_choices)
      right += std::string(" [Megatron's ") + comma_list(d.unsupported_choices) + ": not supported yet]";
    if (d.use == OptUse::SpeedOnly) right += " [accepted, no effect on the CPU backend]";
    std::printf("  %-44s %s\n", left.c_str(), right.c_str());
  }
}

void OptionTable::print_arguments(const ParsedOptions& parsed) const {
  std::vector<std::pair<std::string, std::string>> rows;
  for (const OptionDef& d : defs_) {
    std::string value;
    if (d.kind == OptKind::List) {
      auto list = parsed.get_list(d.flag);
      if (list.empty()) {
        value = "None";
      } else {
        value = "[";
        for (size_t i = 0; i < list.size(); ++i) value += (i ? ", '" : "'") + list[i] + "'";
        value += "]";
      }
    } else {
      auto raw = parsed.raw(d.flag);
      if (!raw) value = "None";
      else if (d.kind == OptKind::Float) value = python_float_repr(std::strtod(raw->c_str(), nullptr));
      else value = *raw;
    }
    rows.emplace_back(option_dest(d), value);
  }
  auto lower = [](std::string s) {
    for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
  };
  std::sort(rows.begin(), rows.end(), [&](const auto& a, const auto& b) { return lower(a.first) < lower(b.first); });
  std::printf("------------------------ arguments ------------------------\n");
  for (const auto& [name, value] : rows) {
    std::string dots(name.size() < 48 ? 48 - name.size() : 0, '.');
    std::printf("  %s %s %s\n", name.c_str(), dots.c_str(), value.c_str());
  }
  std::printf("-------------------- end of arguments ---------------------\n");
  std::fflush(stdout);
}

}  // namespace tessera
