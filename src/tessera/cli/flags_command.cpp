// `tessera flags`: the status in tessera of every flag of Megatron-LM core_r0.10.0's
// pretrain_gpt.py (train/megatron_flags.inc) and of every `tessera train` flag of tessera's
// own, read from the live option table: "supported", "accepted, no effect" (OptUse::SpeedOnly,
// with the row's help text as the reason) or "not supported yet". A flag in the table whose
// switch or choice value `parse_train_args` refuses as "not supported yet" is reported so, found
// by parsing a small valid command line with it. `--markdown` writes docs/megatron-flags.md
// (scripts/gen-megatron-flags-doc.sh; the test flags.doc fails when the file differs).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/cli/commands.h"
#include "tessera/core/error.h"
#include "tessera/core/options.h"
#include "tessera/launch/launch_options.h"
#include "tessera/train/arguments.h"
#include "tessera/train/megatron_flags.h"

namespace tessera::cli {
namespace {

// The two-server guide's commands (the field guide for moving Megatron-LM GPT training onto
// two accelerator servers), flag by flag, with the values it gives.
// examples/pretrain_gpt_distributed.sh is its launch script for tessera.
struct GuideFlag {
  const char* step;
  const char* flag;
  const char* value;  // nullptr: a switch
};
const GuideFlag kGuidePreprocess[] = {  // step 5: tools/preprocess_data.py -> tessera preprocess
    {"5", "--input", "./alpaca_json.json"},
    {"5", "--output-prefix", "./gpt_pretrain_data/alpaca"},
    {"5", "--tokenizer-type", "GPT2BPETokenizer"},
    {"5", "--vocab-file", "./gpt-tokenizer/gpt2-vocab.json"},
    {"5", "--merge-file", "./gpt-tokenizer/gpt2-merges.txt"},
    {"5", "--append-eod", nullptr},
    {"5", "--log-interval", "1000"},
    {"5", "--workers", "8"},
};
const GuideFlag kGuideLaunch[] = {  // DISTRIBUTED_ARGS: torchrun -> tessera launch
    {"6, 8", "--nproc_per_node", "8"}, {"6, 8", "--nnodes", "1"},
    {"6, 8", "--node_rank", "0"},      {"6, 8", "--master_addr", "localhost"},
    {"6, 8", "--master_port", "6000"},
};
const GuideFlag kGuideTrain[] = {  // pretrain_gpt.py -> tessera train
    {"6", "--num-layers", "24"},
    {"6", "--hidden-size", "1024"},
    {"6", "--num-attention-heads", "16"},
    {"6", "--seq-length", "1024"},
    {"6", "--max-position-embeddings", "1024"},
    {"6, 8", "--micro-batch-size", "4"},
    {"6, 8", "--global-batch-size", "32"},  // 64 on two nodes
    {"6", "--lr", "0.00015"},
    {"6", "--train-iters", "500000"},
    {"6", "--lr-decay-iters", "320000"},
    {"6", "--lr-decay-style", "cosine"},
    {"6", "--min-lr", "1.0e-5"},
    {"6", "--weight-decay", "1e-2"},
    {"6", "--lr-warmup-fraction", ".01"},
    {"6", "--clip-grad", "1.0"},
    {"6", "--fp16", nullptr},
    {"6", "--transformer-impl", "local"},
    {"6", "--no-masked-softmax-fusion", nullptr},
    {"6", "--data-path", "./gpt_pretrain_data/alpaca_text_document"},
    {"6", "--vocab-file", "./gpt-tokenizer/gpt2-vocab.json"},
    {"6", "--merge-file", "./gpt-tokenizer/gpt2-merges.txt"},
    {"6", "--split", "949,50,1"},
    {"6", "--log-interval", "1"},
    {"6", "--save-interval", "10000"},
    {"6", "--eval-interval", "1000"},
    {"6", "--eval-iters", "10"},
    {"6", "--distributed-backend", "nccl"},
    {"6", "--save", "./ckpt"},
    {"6", "--ckpt-format", "torch"},
    {"10", "--tensor-model-parallel-size", "2"},
    {"10", "--pipeline-model-parallel-size", "2"},
};

// Flags and values that common Megatron GPT and Llama-style launch scripts use (Megatron's
// examples/gpt3 script and Llama-2/3 recipes). The statuses are found, not written here.
const std::vector<std::vector<const char*>> kCommonUsages = {
    // GPT-3 style
    {"--use-mcore-models"},
    {"--transformer-impl", "transformer_engine"},
    {"--tensor-model-parallel-size", "2"},
    {"--pipeline-model-parallel-size", "2"},
    {"--sequence-parallel"},
    {"--num-layers-per-virtual-pipeline-stage", "1"},
    {"--use-distributed-optimizer"},
    {"--overlap-grad-reduce"},
    {"--overlap-param-gather"},
    {"--rampup-batch-size", "16", "16", "5859375"},
    {"--train-samples", "146484375"},
    {"--lr-decay-samples", "126953125"},
    {"--lr-warmup-samples", "183105"},
    {"--lr-decay-style", "cosine"},
    {"--adam-beta2", "0.95"},
    {"--init-method-std", "0.006"},
    {"--fp16"},
    {"--bf16"},
    {"--initial-loss-scale", "65536"},
    {"--loss-scale", "1024"},
    {"--recompute-activations"},
    {"--recompute-granularity", "full"},
    {"--recompute-granularity", "selective"},
    {"--recompute-method", "uniform"},
    {"--recompute-method", "block"},
    {"--recompute-num-layers", "1"},
    {"--distribute-saved-activations"},
    {"--use-flash-attn"},
    {"--tokenizer-type", "GPT2BPETokenizer"},
    {"--mock-data"},
    {"--tensorboard-dir", "tb"},
    {"--tensorboard-log-interval", "1"},
    {"--log-timers-to-tensorboard"},
    {"--log-validation-ppl-to-tensorboard"},
    {"--log-memory-to-tensorboard"},
    {"--log-throughput"},
    {"--wandb-project", "p"},
    {"--ckpt-format", "torch_dist"},
    {"--load", "ckpt"},
    {"--use-checkpoint-args"},
    {"--exit-on-missing-checkpoint"},
    {"--manual-gc"},
    {"--num-workers", "2"},
    // Llama style
    {"--swiglu"},
    {"--normalization", "RMSNorm"},
    {"--norm-epsilon", "1e-5"},
    {"--position-embedding-type", "rope"},
    {"--use-rotary-position-embeddings"},
    {"--no-position-embedding"},
    {"--rotary-base", "500000"},
    {"--rotary-percent", "1.0"},
    {"--use-rope-scaling"},
    {"--no-rope-fusion"},
    {"--group-query-attention"},
    {"--num-query-groups", "8"},
    {"--disable-bias-linear"},
    {"--untie-embeddings-and-output-weights"},
    {"--attention-dropout", "0.0"},
    {"--hidden-dropout", "0.0"},
    {"--ffn-hidden-size", "14336"},
    {"--kv-channels", "128"},
    {"--qk-layernorm"},
    {"--apply-layernorm-1p"},
    {"--make-vocab-size-divisible-by", "128"},
    {"--tokenizer-type", "Llama2Tokenizer"},
    {"--tokenizer-type", "HuggingFaceTokenizer"},
    {"--tokenizer-model", "tokenizer.model"},
    {"--attention-softmax-in-fp32"},
    {"--no-masked-softmax-fusion"},
};

enum class Status { Supported, NoEffect, NotSupported };

const char* status_name(Status s) {
  return s == Status::Supported ? "supported" : s == Status::NoEffect ? "accepted, no effect" : "not supported yet";
}

struct FlagStatus {
  Status status = Status::NotSupported;
  std::string note;                       // help text, or the reason
  std::vector<std::string> refused_values;  // choice values refused as not supported yet
  std::string refusal;                    // the refusal of a switch
};

bool says_not_supported(const std::string& message) {
  return message.find("not supported yet") != std::string::npos ||
         message.find("does not support yet") != std::string::npos;
}

// Runs `fn` with stderr (notes, warnings) sent to /dev/null.
template <class Fn>
std::string quietly(Fn&& fn) {
  std::fflush(stderr);
  const int saved = ::dup(2);
  const int null = ::open("/dev/null", O_WRONLY);
  if (null >= 0) ::dup2(null, 2);
  std::string error;
  try {
    fn();
  } catch (const Error& e) {
    error = e.what();
  }
  std::fflush(stderr);
  if (saved >= 0) ::dup2(saved, 2), ::close(saved);
  if (null >= 0) ::close(null);
  return error;
}

std::string run_parser(const std::vector<std::string>& args,
                       const std::function<void(int, char**)>& parse) {
  std::vector<std::string> copy = args;
  std::vector<char*> argv;
  for (std::string& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  return quietly([&] { parse(static_cast<int>(copy.size()), argv.data()); });
}

// The usage error `tessera train` gives for a small valid command line plus `extra` (in a job
// of 8 processes, so tensor and pipeline sizes of 2 are valid layouts); "" when it parses.
std::string probe_train(const std::vector<std::string>& extra) {
  std::vector<std::string> args = {"--num-layers", "4", "--hidden-size", "16", "--num-attention-heads", "4",
                                   "--seq-length", "8", "--max-position-embeddings", "8", "--micro-batch-size", "1",
                                   "--tokenizer-type", "NullTokenizer", "--vocab-size", "16", "--mock-data", "--lr",
                                   "1e-3", "--train-iters", "1"};
  args.insert(args.end(), extra.begin(), extra.end());
  return run_parser(args, [](int argc, char** argv) { parse_train_args(argc, argv, nullptr, 8); });
}

const OptionDef* train_def(std::string_view flag) {
  for (const OptionDef& d : train_option_table().defs())
    if (flag == d.flag) return &d;
  return nullptr;
}

std::vector<std::string> split_choices(const char* choices) {
  std::vector<std::string> out;
  std::string s = choices ? choices : "";
  for (size_t start = 0; start <= s.size();) {
    size_t bar = s.find('|', start);
    if (bar == std::string::npos) bar = s.size();
    out.push_back(s.substr(start, bar - start));
    start = bar + 1;
  }
  return out;
}

FlagStatus train_flag_status(std::string_view flag) {
  static std::map<std::string, FlagStatus, std::less<>> cache;
  if (auto it = cache.find(flag); it != cache.end()) return it->second;
  FlagStatus s;
  const OptionDef* d = train_def(flag);
  if (!d) {
    s.status = Status::NotSupported;
  } else if (d->use == OptUse::SpeedOnly) {
    s.status = Status::NoEffect;
    s.note = std::string("only tunes speed on other hardware: ") + d->help;
  } else {
    s.status = Status::Supported;
    s.note = d->help;
    if (d->kind == OptKind::StoreTrue || d->kind == OptKind::StoreFalse) {
      std::string error = probe_train({d->flag});
      if (says_not_supported(error)) s.status = Status::NotSupported, s.refusal = error;
    } else if (d->kind == OptKind::Choice) {
      for (const std::string& v : split_choices(d->choices))
        if (says_not_supported(probe_train({d->flag, v}))) s.refused_values.push_back(v);
      if (d->unsupported_choices)
        for (const std::string& v : split_choices(d->unsupported_choices)) s.refused_values.push_back(v);
    }
  }
  cache.emplace(std::string(flag), s);
  return s;
}

std::string status_text(const FlagStatus& s) {
  std::string out = status_name(s.status);
  if (!s.refused_values.empty()) {
    out += ", except ";
    for (size_t i = 0; i < s.refused_values.size(); ++i) {
      if (i) out += ", ";
      out += s.refused_values[i];
    }
    out += " (not supported yet)";
  }
  return out;
}

// The guide's and the common scripts' `tessera train` flags are pretrain_gpt.py's: each must be
// a flag of Megatron's parser (megatron_flags.inc), or these lists are wrong.
void check_listed_train_flags() {
  std::vector<std::string> wrong;
  for (const GuideFlag& g : kGuideTrain)
    if (!is_megatron_flag(g.flag)) wrong.push_back(g.flag);
  for (const auto& usage : kCommonUsages)
    if (!is_megatron_flag(usage[0])) wrong.push_back(usage[0]);
  if (wrong.empty()) return;
  std::string list;
  for (const std::string& f : wrong) list += (list.empty() ? "" : ", ") + f;
  throw runtime_error("tessera flags: not flags of Megatron-LM core_r0.10.0's parser: " + list,
                      "fix kGuideTrain / kCommonUsages in src/tessera/cli/flags_command.cpp");
}

// The status of one usage (a flag and its values) from the parser itself.
std::string usage_status(const std::vector<const char*>& usage) {
  const std::string flag = usage[0];
  const OptionDef* d = train_def(flag);
  if (!d) return status_name(Status::NotSupported);
  FlagStatus s = train_flag_status(flag);
  if (s.status == Status::NotSupported) return status_name(s.status);
  if (d->kind == OptKind::Choice || d->kind == OptKind::List || usage.size() > 1) {
    std::vector<std::string> args(usage.begin(), usage.end());
    if (says_not_supported(probe_train(args))) return status_name(Status::NotSupported);
  }
  return status_name(s.status);
}

bool parses_preprocess(const GuideFlag& g) {
  std::vector<std::string> args = {g.flag};
  if (g.value) args.push_back(g.value);
  return run_parser(args, [](int argc, char** argv) { preprocess_option_table().parse(argc, argv); }).empty();
}

bool parses_launch(const GuideFlag& g) {
  std::vector<std::string> args = {g.flag};
  if (g.value) args.push_back(g.value);
  args.push_back("train");
  return run_parser(args, [](int argc, char** argv) { launch::parse_launch_options(argc, argv); }).empty();
}

std::string md(std::string_view text) {  // a table cell
  std::string out;
  for (char c : text) {
    if (c == '|') out += "\\|";
    else if (c == '\n') out += ' ';
    else out += c;
  }
  return out;
}

std::string megatron_default(const MegatronFlag& f) {
  if (f.kind == MegatronFlagKind::Switch) return "switch";
  return std::string("`") + f.default_literal + "`";
}

std::set<std::string> guide_train_flags() {
  std::set<std::string> out;
  for (const GuideFlag& g : kGuideTrain) out.insert(g.flag);
  return out;
}

std::vector<const MegatronFlag*> megatron_flags_sorted() {
  std::vector<const MegatronFlag*> out;
  for (const MegatronFlag& f : megatron_flags()) out.push_back(&f);
  std::sort(out.begin(), out.end(), [](auto* a, auto* b) { return std::strcmp(a->name, b->name) < 0; });
  return out;
}

std::vector<const OptionDef*> tessera_only_flags() {
  std::vector<const OptionDef*> out;
  for (const OptionDef& d : train_option_table().defs())
    if (!is_megatron_flag(d.flag)) out.push_back(&d);
  return out;
}

// Every flag's row, or only those whose status is `only` ("supported" also lists the flags
// supported except for some values; "not supported yet" also lists those values).
void print_text(const std::optional<Status>& only) {
  auto row = [&](const std::string& flag, const FlagStatus& s) {
    if (only && s.status != *only && !(*only == Status::NotSupported && !s.refused_values.empty())) return;
    std::string note = s.refusal.empty() ? s.note : s.refusal;
    std::printf("%-48s %-22s %s\n", flag.c_str(), status_text(s).c_str(), note.c_str());
  };
  for (const MegatronFlag* f : megatron_flags_sorted()) row(f->name, train_flag_status(f->name));
  for (const OptionDef* d : tessera_only_flags()) {
    FlagStatus s = train_flag_status(d->flag);
    s.note = "(tessera's own) " + s.note;
    row(d->flag, s);
  }
}

void print_markdown() {
  const std::set<std::string> guide = guide_train_flags();
  std::map<Status, int> counts;
  std::vector<const MegatronFlag*> flags = megatron_flags_sorted();
  for (const MegatronFlag* f : flags) ++counts[train_flag_status(f->name).status];
  const std::vector<const OptionDef*> own = tessera_only_flags();

  std::printf(
      "# Megatron-LM flags in tessera\n\n"
      "<!-- Generated by `tessera flags --markdown` (scripts/gen-megatron-flags-doc.sh); do not edit.\n"
      "     The test flags.doc fails when this file differs from what the built binary prints. -->\n\n"
      "Every flag of Megatron-LM core_r0.10.0's `pretrain_gpt.py` (%zu option strings, listed in\n"
      "`src/tessera/train/megatron_flags.inc`, generated from Megatron's own parser) and every\n"
      "`tessera train` flag of tessera's own, with its status in `tessera train`, read from the\n"
      "option table that parses its command line:\n\n"
      "- **supported**: does what Megatron's flag does. Values that tessera refuses are named\n"
      "  (\"supported, except TikTokenizer\"); they were found by parsing a small command line with each\n"
      "  value.\n"
      "- **accepted, no effect**: parsed, then ignored with a one-line note, because it only tunes\n"
      "  speed on other hardware; the reason follows.\n"
      "- **not supported yet**: `tessera train` stops before doing anything, with exit status 2 and\n"
      "  `error: --flag is a Megatron-LM flag that tessera does not support yet`; a command line\n"
      "  with several such flags or values gets one error naming them all.\n\n"
      "`tessera flags` prints the same statuses as plain text (`--status \"not supported yet\"`\n"
      "lists only those flags and the refused values). Of the %zu Megatron flags, %d are\n"
      "supported, %d accepted with no effect and %d not supported yet; tessera adds %zu of its own.\n"
      "docs/flags.md describes the supported ones by group.\n\n",
      flags.size(), flags.size(), counts[Status::Supported], counts[Status::NoEffect], counts[Status::NotSupported],
      own.size());

  std::printf(
      "## The two-server guide's commands\n\n"
      "The guide (`tessera preprocess`, then its launch script) with only the program names changed:\n"
      "`tools/preprocess_data.py` → `tessera preprocess`, `torchrun` → `tessera launch`,\n"
      "`pretrain_gpt.py` → `tessera train`. `examples/pretrain_gpt_distributed.sh` is its launch\n"
      "script (one node, or two with `NNODES=2 NODE_RANK=0|1 MASTER_ADDR=<node 0>`). A flag that\n"
      "is not supported yet stops the command; the script keeps the guide's `--fp16` in\n"
      "`PRECISION_ARGS`, which can be set to `--bf16` or to nothing.\n\n"
      "| step | command | flag | guide's value | status in tessera | tessera's note |\n"
      "| --- | --- | --- | --- | --- | --- |\n");
  for (const GuideFlag& g : kGuidePreprocess)
    std::printf("| %s | `tessera preprocess` | `%s` | %s | %s | |\n", g.step, g.flag, g.value ? md(g.value).c_str() : "",
                parses_preprocess(g) ? "supported" : "not supported yet");
  for (const GuideFlag& g : kGuideLaunch)
    std::printf("| %s | `tessera launch` | `%s` | %s | %s | |\n", g.step, g.flag, g.value ? md(g.value).c_str() : "",
                parses_launch(g) ? "supported" : "not supported yet");
  std::vector<std::string> refused;
  for (const GuideFlag& g : kGuideTrain) {
    std::vector<const char*> usage = {g.flag};
    if (g.value) usage.push_back(g.value);
    const std::string status = usage_status(usage);
    if (status == status_name(Status::NotSupported)) refused.push_back(g.flag);
    const FlagStatus fs = train_flag_status(g.flag);
    std::printf("| %s | `tessera train` | `%s` | %s | %s | %s |\n", g.step, g.flag, g.value ? md(g.value).c_str() : "",
                status.c_str(), md(fs.refusal.empty() ? fs.note : fs.refusal).c_str());
  }
  std::printf("\n");
  if (refused.empty()) {
    std::printf("Every `tessera train` flag of the guide is accepted.\n\n");
  } else {
    std::printf("Not supported yet among the guide's `tessera train` flags:");
    for (size_t i = 0; i < refused.size(); ++i) std::printf("%s `%s`", i ? "," : "", refused[i].c_str());
    std::printf(".\n\n");
  }

  std::printf(
      "## Common GPT and Llama-style script flags\n\n"
      "Flags and values from Megatron's GPT-3 example script and Llama-style recipes, each checked\n"
      "with its value.\n\n"
      "| flag and value | status in tessera |\n| --- | --- |\n");
  for (const auto& usage : kCommonUsages) {
    std::string text;
    for (const char* word : usage) {
      if (!text.empty()) text += ' ';
      text += word;
    }
    std::printf("| `%s` | %s |\n", md(text).c_str(), usage_status(usage).c_str());
  }

  std::printf(
      "\n## All Megatron-LM flags\n\n"
      "Alphabetical. \"guide\": used by the two-server guide's launch script. The default is\n"
      "Megatron's parser's, as Python prints it.\n\n"
      "| flag | guide | Megatron default | status in tessera | tessera's note |\n| --- | --- | --- | --- | --- |\n");
  for (const MegatronFlag* f : flags) {
    const FlagStatus s = train_flag_status(f->name);
    std::string note = s.refusal.empty() ? s.note : s.refusal;
    std::printf("| `%s` | %s | %s | %s | %s |\n", f->name, guide.count(f->name) ? "guide" : "",
                md(megatron_default(*f)).c_str(), status_text(s).c_str(), md(note).c_str());
  }

  std::printf("\n## tessera's own `tessera train` flags\n\n| flag | status | what it does |\n| --- | --- | --- |\n");
  for (const OptionDef* d : own) {
    const FlagStatus s = train_flag_status(d->flag);
    std::printf("| `%s` | %s | %s |\n", d->flag, status_text(s).c_str(), md(d->help).c_str());
  }
}

Status parse_status(std::string_view text) {
  for (Status s : {Status::Supported, Status::NoEffect, Status::NotSupported})
    if (text == status_name(s)) return s;
  throw usage_error("--status takes \"supported\", \"accepted, no effect\" or \"not supported yet\", got \"" +
                        std::string(text) + "\"",
                    "e.g. tessera flags --status \"not supported yet\"");
}

}  // namespace

int run_flags(int argc, char** argv) {
  bool markdown = false;
  std::optional<Status> only;
  for (int i = 0; i < argc; ++i) {
    std::string_view a = argv[i];
    if (a == "--markdown") {
      markdown = true;
    } else if (a == "--status") {
      if (i + 1 >= argc) throw usage_error("--status expects a value", "e.g. tessera flags --status \"not supported yet\"");
      only = parse_status(argv[++i]);
    } else if (a == "--help" || a == "-h") {
      std::printf(
          "usage: tessera flags [--status STATUS] [--markdown]\n\n"
          "Prints every flag of Megatron-LM core_r0.10.0's pretrain_gpt.py and every tessera train\n"
          "flag of tessera's own with its status in `tessera train` (supported / accepted, no effect /\n"
          "not supported yet), read from the option table that parses it.\n"
          "  --status S   only the flags with status S: \"supported\", \"accepted, no effect\" or\n"
          "               \"not supported yet\" (which includes the refused values of supported flags)\n"
          "  --markdown   print docs/megatron-flags.md instead (scripts/gen-megatron-flags-doc.sh)\n");
      return 0;
    } else {
      throw usage_error("unknown flag " + std::string(a), "see `tessera flags --help`");
    }
  }
  if (markdown && only) throw usage_error("--status filters the text listing, not --markdown");
  check_listed_train_flags();
  if (markdown) print_markdown();
  else print_text(only);
  return 0;
}

}  // namespace tessera::cli
