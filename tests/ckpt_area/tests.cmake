# Checkpoint area: the safetensors reader under fuzzing.
#
# safetensors_fuzz compiles the reader's sources itself, with AddressSanitizer and
# UndefinedBehaviorSanitizer. With Clang it is a libFuzzer target; with other compilers
# fuzz/safetensors_fuzz.cpp supplies a standalone mutation driver. Either way the CTest entry
# runs it for 30 s; any sanitizer report, crash or non-tessera::Error exception fails it.
set(TESSERA_SAFETENSORS_FUZZ_SOURCES
  ${PROJECT_SOURCE_DIR}/fuzz/safetensors_fuzz.cpp
  ${PROJECT_SOURCE_DIR}/src/tessera/ckpt/safetensors.cpp
  ${PROJECT_SOURCE_DIR}/src/tessera/core/error.cpp
  ${PROJECT_SOURCE_DIR}/src/tessera/core/dtype.cpp
  ${PROJECT_SOURCE_DIR}/src/tessera/core/mapped_file.cpp)
set(TESSERA_FUZZ_SANITIZERS -fsanitize=address,undefined -fno-sanitize-recover=undefined)
if(CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  list(APPEND TESSERA_FUZZ_SANITIZERS -fsanitize=fuzzer)
endif()
add_executable(safetensors_fuzz ${TESSERA_SAFETENSORS_FUZZ_SOURCES})
target_compile_options(safetensors_fuzz PRIVATE ${TESSERA_FUZZ_SANITIZERS} -O1 -g -fno-omit-frame-pointer)
target_link_options(safetensors_fuzz PRIVATE ${TESSERA_FUZZ_SANITIZERS})
target_link_libraries(safetensors_fuzz PRIVATE nlohmann_json::nlohmann_json Threads::Threads)
if(CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  target_compile_definitions(safetensors_fuzz PRIVATE TESSERA_LIBFUZZER)
  add_test(NAME ckpt.safetensors_fuzz COMMAND safetensors_fuzz -max_total_time=30 -rss_limit_mb=2048)
else()
  add_test(NAME ckpt.safetensors_fuzz COMMAND safetensors_fuzz --seconds 30)
endif()
set_tests_properties(ckpt.safetensors_fuzz PROPERTIES
  TIMEOUT 120 LABELS "fuzz;ckpt"
  WORKING_DIRECTORY ${PROJECT_BINARY_DIR}
  ENVIRONMENT "ASAN_OPTIONS=abort_on_error=1:detect_leaks=1;UBSAN_OPTIONS=print_stacktrace=1")

# `tessera ckpt`'s command line (the actions themselves: tests/unit/ckpt/hf_export_test.cpp).
add_test(NAME ckpt.cli_help COMMAND $<TARGET_FILE:tessera> ckpt --help)
add_test(NAME ckpt.cli_unknown_action COMMAND $<TARGET_FILE:tessera> ckpt frobnicate)
add_test(NAME ckpt.cli_inspect_no_checkpoint COMMAND $<TARGET_FILE:tessera> ckpt inspect ${PROJECT_BINARY_DIR}/no-such-checkpoint)
add_test(NAME ckpt.cli_export_bad_flag COMMAND $<TARGET_FILE:tessera> ckpt export-hf a b --iteraton 3)
set_tests_properties(ckpt.cli_help PROPERTIES TIMEOUT 10 LABELS ckpt PASS_REGULAR_EXPRESSION "export-hf DIR OUT")
set_tests_properties(ckpt.cli_unknown_action PROPERTIES TIMEOUT 10 LABELS ckpt WILL_FAIL TRUE)
set_tests_properties(ckpt.cli_inspect_no_checkpoint PROPERTIES TIMEOUT 10 LABELS ckpt WILL_FAIL TRUE)
set_tests_properties(ckpt.cli_export_bad_flag PROPERTIES TIMEOUT 10 LABELS ckpt PASS_REGULAR_EXPRESSION "--iteration")

# Sharded checkpoints through `tessera launch ... train` (up to 8 processes on loopback): a
# bit-exact 3D resume (TP=2 PP=2 DP=2), resharding into one process, TP=4 PP=1 DP=2 and
# TP=1 PP=4, a one-process checkpoint into TP=2 PP=2, inspect / export-hf / import-hf of
# sharded checkpoints, and the padded-vocabulary and missing-shard errors.
add_test(NAME ckpt.reshard
         COMMAND /usr/bin/python3 ${PROJECT_SOURCE_DIR}/tests/integration/checkpoint_reshard_test.py
                 $<TARGET_FILE:tessera>)
set_tests_properties(ckpt.reshard PROPERTIES TIMEOUT 900 LABELS ckpt)
# On the strict test device (host access outside a backend fails naming the place): a TP=2
# save resumed into PP=2 against one CPU process (40 s under ctest -j2).
add_test(NAME ckpt.reshard.strict
         COMMAND /usr/bin/python3 ${PROJECT_SOURCE_DIR}/tests/integration/checkpoint_reshard_test.py
                 $<TARGET_FILE:tessera> --device strict)
set_tests_properties(ckpt.reshard.strict PROPERTIES TIMEOUT 300 LABELS "ckpt;strict")

# Megatron-LM's checkpoint files: the zip container, the restricted pickle reader and torch_dist's
# .metadata under fuzzing (fuzz/torch_checkpoint_fuzz.cpp), built and run as safetensors_fuzz is,
# seeded with .metadata files megatron-core 0.10.0 wrote (fuzz/corpus/dcp/: a plain optimizer's,
# and its distributed optimizer's reformulated fully_sharded_model_space layout).
find_package(ZLIB REQUIRED)
add_executable(torch_checkpoint_fuzz
  ${PROJECT_SOURCE_DIR}/fuzz/torch_checkpoint_fuzz.cpp
  ${PROJECT_SOURCE_DIR}/src/tessera/ckpt/zip_archive.cpp
  ${PROJECT_SOURCE_DIR}/src/tessera/ckpt/pickle.cpp
  ${PROJECT_SOURCE_DIR}/src/tessera/ckpt/torch_file.cpp
  ${PROJECT_SOURCE_DIR}/src/tessera/ckpt/dcp_metadata.cpp
  ${PROJECT_SOURCE_DIR}/src/tessera/core/error.cpp
  ${PROJECT_SOURCE_DIR}/src/tessera/core/dtype.cpp
  ${PROJECT_SOURCE_DIR}/src/tessera/core/mapped_file.cpp)
target_compile_options(torch_checkpoint_fuzz PRIVATE ${TESSERA_FUZZ_SANITIZERS} -O1 -g -fno-omit-frame-pointer)
target_link_options(torch_checkpoint_fuzz PRIVATE ${TESSERA_FUZZ_SANITIZERS})
target_link_libraries(torch_checkpoint_fuzz PRIVATE ZLIB::ZLIB Threads::Threads)
if(CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  target_compile_definitions(torch_checkpoint_fuzz PRIVATE TESSERA_LIBFUZZER)
  add_test(NAME ckpt.torch_checkpoint_fuzz COMMAND torch_checkpoint_fuzz -max_total_time=30 -rss_limit_mb=2048
           ${PROJECT_SOURCE_DIR}/fuzz/corpus/dcp)
else()
  add_test(NAME ckpt.torch_checkpoint_fuzz COMMAND torch_checkpoint_fuzz --seconds 30
           ${PROJECT_SOURCE_DIR}/fuzz/corpus/dcp/gpt_tp2_pp2.metadata
           ${PROJECT_SOURCE_DIR}/fuzz/corpus/dcp/gpt_distopt_tp2_dp2.metadata)
endif()
set_tests_properties(ckpt.torch_checkpoint_fuzz PROPERTIES
  TIMEOUT 120 LABELS "fuzz;ckpt"
  WORKING_DIRECTORY ${PROJECT_BINARY_DIR}
  ENVIRONMENT "ASAN_OPTIONS=abort_on_error=1:detect_leaks=1;UBSAN_OPTIONS=print_stacktrace=1")

# Megatron-LM's --ckpt-format torch end to end (tests/integration/megatron_checkpoint_test.py):
# torch.load of tessera's saves, bit-exact resume (fp32; bf16 TP=2 PP=2 in 4 processes),
# ckpt convert both ways, a Llama TP=2 save's per-rank fc1/QKV rows and its release form,
# the streamed writer's peak memory, the distributed optimizer's distrib_optim.pt (structure,
# layout, resumes at DP=2/4/1 and PP=2), hostile pickles and damaged files.
add_test(NAME ckpt.megatron_format
         COMMAND /usr/bin/python3 ${PROJECT_SOURCE_DIR}/tests/integration/megatron_checkpoint_test.py
                 $<TARGET_FILE:tessera>)
set_tests_properties(ckpt.megatron_format PROPERTIES TIMEOUT 300 LABELS ckpt)

# `ckpt inspect --summary` on a TP 2 checkpoint: parameter count, layout, one line per shard.
add_test(NAME ckpt.inspect_summary
         COMMAND /usr/bin/python3 ${PROJECT_SOURCE_DIR}/tests/ckpt_area/ckpt_summary_test.py $<TARGET_FILE:tessera>)
set_tests_properties(ckpt.inspect_summary PROPERTIES TIMEOUT 180 LABELS ckpt)

# Llama's Hugging Face interop end to end (tests/integration/llama_hf_test.py): --init-from-hf
# of the float64 transformers reference (tests/reference/llama_reference.py) matches its 10
# iterations as one process and as TP=2 x PP=2 x DP=2 (8 processes), import-hf/export-hf give
# back the folder bit for bit and load in transformers, and flag mismatches name the field.
add_test(NAME ckpt.llama_hf
         COMMAND /usr/bin/python3 ${PROJECT_SOURCE_DIR}/tests/integration/llama_hf_test.py $<TARGET_FILE:tessera>)
set_tests_properties(ckpt.llama_hf PROPERTIES TIMEOUT 900 LABELS ckpt)

# Megatron-LM's checkpoints against the real tools, both ways (tests/ckpt_area/megatron_core_test.cpp,
# tests/reference/megatron_core_models.py in the tools venv: megatron-core 0.10.0's GPTModel on
# the CPU): its save of a tiny GPT and Llama loads into tessera with its logits, and tessera's
# --ckpt-format torch save loads strictly into it, with Megatron's Namespace and tessera's logits;
# the same for --moe-grouped-gemm's GroupedMLP / TEGroupedMLP (tests/reference/
# megatron_grouped_experts.py), and its torch_dist keys in the tdist venv.
add_executable(megatron_core_test ${PROJECT_SOURCE_DIR}/tests/ckpt_area/megatron_core_test.cpp)
target_link_libraries(megatron_core_test PRIVATE tessera_all GTest::gtest_main OpenMP::OpenMP_CXX)
target_compile_definitions(megatron_core_test PRIVATE
  TESSERA_SOURCE_DIR="${PROJECT_SOURCE_DIR}" TESSERA_BINARY_DIR="${PROJECT_BINARY_DIR}"
  TESSERA_TOOLS_PYTHON="${TESSERA_TOOLS_VENV}/bin/python" TESSERA_TEST_PYTHON="${TESSERA_TEST_VENV}/bin/python"
  TESSERA_TDIST_PYTHON="${TESSERA_TDIST_VENV}/bin/python" TESSERA_EXE="$<TARGET_FILE:tessera>")
add_dependencies(megatron_core_test tessera)
gtest_discover_tests(megatron_core_test DISCOVERY_TIMEOUT 60 PROPERTIES TIMEOUT 240 LABELS ckpt)

# A Megatron-format checkpoint of a HuggingFaceTokenizer run: ckpt convert / export-hf take the
# Namespace's tokenizer_model, or --tokenizer-model when the file records none.
add_test(NAME ckpt.megatron_tokenizer
         COMMAND ${TESSERA_TOOLS_VENV}/bin/python ${PROJECT_SOURCE_DIR}/tests/ckpt_area/megatron_tokenizer_test.py
                 $<TARGET_FILE:tessera>)
set_tests_properties(ckpt.megatron_tokenizer PROPERTIES TIMEOUT 120 LABELS ckpt)

# Hugging Face folders of transformers 4.47.1 and 5.x (tests/unit/ckpt/hf_versions_test.cpp):
# the saving and checking script (tests/reference/hf_versions.py) runs in the tools venv.
target_compile_definitions(hf_versions_test PRIVATE TESSERA_TOOLS_VENV="${TESSERA_TOOLS_VENV}")

# Llama RoPE as transformers 5 and Llama 3.1/3.2 write it (tests/integration/
# llama_rope_scaling_test.py): --init-from-hf of the float64 reference run with transformers 5
# (base 500000 at sequence 16; rope_type llama3 factor 32 at sequence 1024) matches every
# iteration within 1e-5, and RoPE flags left at the defaults are one error naming the fields.
add_test(NAME ckpt.llama_rope_scaling
         COMMAND /usr/bin/python3 ${PROJECT_SOURCE_DIR}/tests/integration/llama_rope_scaling_test.py
                 $<TARGET_FILE:tessera> ${TESSERA_TOOLS_VENV})
set_tests_properties(ckpt.llama_rope_scaling PROPERTIES TIMEOUT 300 LABELS ckpt)

# Megatron's torch_dist format against megatron-core 0.10.0's own dist_checkpointing
# (tests/ckpt_area/torch_dist_test.cpp, tests/reference/megatron_dist_checkpoint.py in the tdist
# venv): its TP=2 x PP=2 saves of a tiny GPT and Llama load into tessera bit for bit. One CTest
# entry (the reference runs once for every case); skipped without the venv.
add_executable(torch_dist_test ${PROJECT_SOURCE_DIR}/tests/ckpt_area/torch_dist_test.cpp)
target_link_libraries(torch_dist_test PRIVATE tessera_all GTest::gtest OpenMP::OpenMP_CXX)
target_compile_definitions(torch_dist_test PRIVATE
  TESSERA_SOURCE_DIR="${PROJECT_SOURCE_DIR}" TESSERA_BINARY_DIR="${PROJECT_BINARY_DIR}"
  TESSERA_TDIST_VENV="${TESSERA_TDIST_VENV}" TESSERA_EXE="$<TARGET_FILE:tessera>")
add_dependencies(torch_dist_test tessera)
add_test(NAME ckpt.torch_dist COMMAND torch_dist_test)
set_tests_properties(ckpt.torch_dist PROPERTIES TIMEOUT 600 SKIP_RETURN_CODE 77 LABELS ckpt)

# Megatron files in Transformer Engine's layout (Megatron's default --transformer-impl) against
# megatron-core 0.10.0's own TE spec (tests/ckpt_area/megatron_te_test.py, tests/reference/
# megatron_te.py; TE itself is a stand-in, tests/reference/transformer_engine_stub.py): a TE
# GPTModel's checkpoint converted to TP=2 PP=2 (torch, torch_dist) and a tessera train save with
# --transformer-impl transformer_engine load strictly into its TE models; skipped without the venvs.
add_test(NAME ckpt.megatron_te
         COMMAND /usr/bin/python3 ${PROJECT_SOURCE_DIR}/tests/ckpt_area/megatron_te_test.py $<TARGET_FILE:tessera>
                 ${TESSERA_TOOLS_VENV}/bin/python ${TESSERA_TDIST_VENV}/bin/python)
set_tests_properties(ckpt.megatron_te PROPERTIES TIMEOUT 400 SKIP_RETURN_CODE 77 LABELS ckpt)
