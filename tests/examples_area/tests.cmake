# Examples area: the launch scripts of examples/ run tiny. Named examples.* and labelled
# "examples":   ctest --test-dir build -L examples
# examples/pretrain_llama3_8b.sh with 4 layers of width 64 and --mock-data in 8 processes (TP 2
# x PP 2 x DP 2) trains and checkpoints; its full Llama-3-8B size passes --dry-run.
add_test(NAME examples.llama3_8b_tiny
         COMMAND /usr/bin/python3 ${PROJECT_SOURCE_DIR}/tests/integration/llama_example_test.py $<TARGET_FILE:tessera>
                 ${PROJECT_SOURCE_DIR})
set_tests_properties(examples.llama3_8b_tiny PROPERTIES TIMEOUT 600 LABELS examples)
