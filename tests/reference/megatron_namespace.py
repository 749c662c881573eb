#!/usr/bin/env python3
"""tessera's tables of Megatron-LM core_r0.10.0's training arguments, taken from Megatron's own
parser. Regenerates:
  src/tessera/train/megatron_flags.inc      every option string parse_args accepts: its kind,
                                            default and dest (tessera's flag table, `tessera flags`);
  src/tessera/train/megatron_namespace.inc  every attribute of the `args` Namespace a checkpoint
                                            saves, with the parser's default as JSON (tessera's
                                            Namespace writer);
  tests/ckpt_area/megatron_namespace_dests.txt  the same attribute names (test data).

    /opt/tessera/tools-venv/bin/python tests/reference/megatron_namespace.py \
        MEGATRON_LM_CHECKOUT/megatron/training/arguments.py

ARGUMENTS_PY is Megatron-LM's megatron/training/arguments.py at tag core_r0.10.0 (commit
7ee599a25ca15f042c1087176b73ebddb0566d02); megatron-core 0.10.0 must be importable (its
parse_args imports megatron.core). The script runs Megatron's parse_args and validate_args
(with pretrain_gpt.py's defaults) for a tiny run, so the attribute set is what those functions
leave: the parser's dests less the five validate_args deletes, plus what parse_args and
validate_args add. Training then adds TRAINING_ATTRIBUTES before any save (places cited below).
pretrain_gpt.py passes no extra_args_provider, so parse_args' parser holds all its flags.
"""
import importlib.util
import json
import os
import sys
import types

# Set on `args` between validate_args and the first save_checkpoint (core_r0.10.0):
TRAINING_ATTRIBUTES = [
    "padded_vocab_size",  # megatron/training/tokenizer/tokenizer.py build_tokenizer
    "model_type",  # megatron/training/training.py pretrain
    "iteration",  # training.py setup_model_and_optimizer (or checkpointing.py load_checkpoint)
    "num_floating_point_operations_so_far",  # training.py setup_model_and_optimizer
    "do_train", "do_valid", "do_test",  # training.py build_train_valid_test_data_loaders
    "curr_iteration",  # training.py train, every iteration
]
RUN = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
       "--max-position-embeddings", "16", "--micro-batch-size", "1", "--train-iters", "1", "--lr", "1e-3"]
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


def load_arguments_module(path):
    """megatron/training/arguments.py without the rest of megatron/training (not on PyPI):
    the two names it imports from there are supplied here."""
    training = types.ModuleType("megatron.training")
    training.__path__ = []
    activations = types.ModuleType("megatron.training.activations")
    activations.squared_relu = lambda x: x
    utils = types.ModuleType("megatron.training.utils")
    utils.update_use_dist_ckpt = lambda args: setattr(args, "use_dist_ckpt", args.ckpt_format != "torch")
    sys.modules.update({"megatron.training": training, "megatron.training.activations": activations,
                        "megatron.training.utils": utils})
    spec = importlib.util.spec_from_file_location("megatron.training.arguments", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_parser(arguments):
    """parse_args' Namespace for RUN, and its parser, captured as parse_args uses it. The
    environment is made the same on every machine: the ranks unset (LOCAL_RANK is
    --local-rank's default), and CUDA_DEVICE_MAX_CONNECTIONS=1, which validate_args requires
    with the default --async-tensor-model-parallel-allreduce."""
    import argparse
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        os.environ.pop(name, None)
    os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"
    captured = []
    real = argparse.ArgumentParser.parse_args

    def capture(self, *a, **k):
        captured.append(self)
        return real(self, *a, **k)

    argparse.ArgumentParser.parse_args = capture
    try:
        sys.argv = ["pretrain_gpt.py"] + RUN
        args = arguments.parse_args()
    finally:
        argparse.ArgumentParser.parse_args = real
    return args, captured[0]


def json_default(value):
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [json_default(v) for v in value]
    return None  # an object (an enum, a dtype): written by tessera for the run, not defaulted


def c_string(text):
    return json.dumps(text)  # a JSON string literal is a valid C++ one


def flag_kind(action):
    """MegatronFlagKind (train/megatron_flags.h) of an argparse action."""
    if action.nargs == 0:
        return "Switch"  # store_true, store_false
    if action.nargs is None:
        return "Value"
    if action.nargs in ("*", "+"):
        return "List"
    raise SystemExit("%s: nargs=%r has no MegatronFlagKind; add one" % (action.option_strings[0], action.nargs))


def write_flags_inc(parser):
    """One MEGATRON_FLAG line per option string (an alias has its own), in the order parse_args
    adds them, under a comment naming the argument group."""
    group_of = {id(a): g.title for g in parser._action_groups for a in g._group_actions}
    actions = [a for a in parser._actions if a.dest != "help"]
    lines, group = [], None
    for a in actions:
        if group_of[id(a)] != group:
            group = group_of[id(a)]
            lines.append("\n// ---- %s ----\n" % group)
        for option in a.option_strings:
            lines.append("MEGATRON_FLAG(%s, %s, %s, %s)\n" % (c_string(option), flag_kind(a), c_string(repr(a.default)),
                                                               c_string(a.dest)))
    count = sum(len(a.option_strings) for a in actions)
    with open(os.path.join(ROOT, "src", "tessera", "train", "megatron_flags.inc"), "w") as f:
        f.write("// Every option string of the parser parse_args builds in Megatron-LM core_r0.10.0's\n"
                "// megatron/training/arguments.py (commit 7ee599a25ca15f042c1087176b73ebddb0566d02),\n"
                "// read from that parser by tests/reference/megatron_namespace.py. Regenerate, do not edit:\n"
                "//   /opt/tessera/tools-venv/bin/python tests/reference/megatron_namespace.py ARGUMENTS_PY\n"
                "// with ARGUMENTS_PY megatron/training/arguments.py of a Megatron-LM checkout at that commit.\n"
                "// MEGATRON_FLAG(option string, kind, default, dest):\n"
                "//   kind     Value (one value), List (nargs '*' or '+'), Switch (store_true / store_false)\n"
                "//   default  the parser's default as Python's repr prints it (LOCAL_RANK unset)\n"
                "//   dest     the Namespace attribute the flag writes; an alias has its own line, same dest\n"
                "// In the order parse_args adds them, by argument group: %d option strings, %d dests.\n"
                % (count, len(actions)))
        f.writelines(lines)
    return count


def write_namespace(args, parser):
    names = sorted(set(vars(args)) | set(TRAINING_ATTRIBUTES))
    defaults = {}
    for a in parser._actions:
        defaults.setdefault(a.dest, json_default(a.default))
    source = ("Megatron-LM core_r0.10.0 (7ee599a25ca15f042c1087176b73ebddb0566d02) megatron/training/arguments.py: "
              "parse_args + validate_args, plus attributes training sets before a save; "
              "generated by tests/reference/megatron_namespace.py")
    with open(os.path.join(ROOT, "tests", "ckpt_area", "megatron_namespace_dests.txt"), "w") as f:
        f.write("# " + source + "\n")
        f.writelines(n + "\n" for n in names)
    with open(os.path.join(ROOT, "src", "tessera", "train", "megatron_namespace.inc"), "w") as f:
        f.write("// Every attribute of the args Namespace a Megatron-LM checkpoint saves, from\n"
                "// " + source + ".\n"
                "// MEGATRON_DEST(name, default as JSON): the default is the parser's (null for\n"
                "// attributes parse_args, validate_args or training set; tessera's writer sets those\n"
                "// for the run). The flags writing each are in megatron_flags.inc.\n")
        for n in names:
            f.write("MEGATRON_DEST(%s, %s)\n" % (c_string(n), c_string(json.dumps(defaults.get(n)))))
    return len(names)


def main():
    arguments = load_arguments_module(sys.argv[1])
    args, parser = run_parser(arguments)
    arguments.validate_args(args, {"tokenizer_type": "GPT2BPETokenizer"})
    flags = write_flags_inc(parser)
    attributes = write_namespace(args, parser)
    print(flags, "option strings,", attributes, "attributes")


if __name__ == "__main__":
    main()
