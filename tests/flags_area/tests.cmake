# Flags area: docs/megatron-flags.md against the live option table, and the two-server guide's
# launch script (examples/pretrain_gpt_distributed.sh) at a tiny size. Named flags.* and
# labelled "flags":   ctest --test-dir build -L flags
# flags.doc fails when the doc differs from `tessera flags --markdown`; it prints the command
# that regenerates it (scripts/gen-megatron-flags-doc.sh).
add_test(NAME flags.doc
         COMMAND bash ${PROJECT_SOURCE_DIR}/scripts/gen-megatron-flags-doc.sh --check $<TARGET_FILE:tessera>)
set_tests_properties(flags.doc PROPERTIES TIMEOUT 60 LABELS flags)

# Unsupported flags all named in one error, --help's choices, `tessera flags --status`.
add_test(NAME flags.cli
         COMMAND /usr/bin/python3 ${PROJECT_SOURCE_DIR}/tests/flags_area/flags_cli_test.py $<TARGET_FILE:tessera>)
set_tests_properties(flags.cli PROPERTIES TIMEOUT 120 LABELS flags)

# README.md: the title first, the set-up commands after the first paragraph, links, and its
# train example valid with the tokenizer files it names.
add_test(NAME flags.readme
         COMMAND /usr/bin/python3 ${PROJECT_SOURCE_DIR}/tests/flags_area/readme_test.py $<TARGET_FILE:tessera>
                 ${PROJECT_SOURCE_DIR})
set_tests_properties(flags.readme PROPERTIES TIMEOUT 120 LABELS flags)

# README.md and docs/ against the option tables: every flag they name exists (in its
# subcommand, for command lines), docs/flags.md names every train flag, `tessera --help` and
# --init-from-hf's help name what ckpt does.
add_test(NAME flags.docs
         COMMAND /usr/bin/python3 ${PROJECT_SOURCE_DIR}/tests/flags_area/docs_flags_test.py $<TARGET_FILE:tessera>
                 ${PROJECT_SOURCE_DIR})
set_tests_properties(flags.docs PROPERTIES TIMEOUT 60 LABELS flags)

# One node, 4 processes (TP 2 x PP 2) on loopback, the bundled corpus, a checkpoint; plus the
# guide's full-size single-node configuration with --dry-run.
add_test(NAME flags.example_script
         COMMAND /usr/bin/python3 ${PROJECT_SOURCE_DIR}/tests/flags_area/example_script_test.py
                 $<TARGET_FILE:tessera> ${PROJECT_SOURCE_DIR})
set_tests_properties(flags.example_script PROPERTIES TIMEOUT 300 LABELS flags)

# The same script started as node 0 and node 1 of a two-node job on this machine (2 processes
# each; the script's two-node defaults TP 2 x PP 2); plus the guide's 2 x 8 layout with --dry-run.
add_test(NAME flags.example_script_two_nodes
         COMMAND /usr/bin/python3 ${PROJECT_SOURCE_DIR}/tests/flags_area/example_script_test.py
                 $<TARGET_FILE:tessera> ${PROJECT_SOURCE_DIR} two-nodes)
set_tests_properties(flags.example_script_two_nodes PROPERTIES TIMEOUT 300 LABELS flags)
