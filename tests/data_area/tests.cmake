# Data area: tokenizer, preprocess and indexed-dataset tests that run the tessera binary or a
# Python reference (tests/reference/data, run with /usr/bin/python3), and the .idx fuzz target.
# Every test is named data.* and labelled "data"; the fuzz run is also labelled "fuzz":
#   ctest --test-dir build -R '^[Dd]ata'          all data tests (GoogleTest ones are Data*)
#   ctest --test-dir build -L data -LE fuzz       without the minute of fuzzing
set(TESSERA_DATA_REF ${PROJECT_SOURCE_DIR}/tests/reference/data)
set(TESSERA_DATA_WORK ${PROJECT_BINARY_DIR}/tests/data_work)

foreach(name indexed_bytes oracle cli user_errors)
  add_test(NAME data.${name}
           COMMAND /usr/bin/python3 ${TESSERA_DATA_REF}/${name}_test.py
                   --tessera $<TARGET_FILE:tessera> --workdir ${TESSERA_DATA_WORK}/${name})
  set_tests_properties(data.${name} PROPERTIES TIMEOUT 300 LABELS data)
endforeach()

# The committed class table (data_tokenizer_test compares ICU's with it) still equals what this
# machine's python3-regex says.
add_test(NAME data.char_classes
         COMMAND /usr/bin/python3 ${TESSERA_DATA_REF}/char_classes.py
                 --check ${PROJECT_SOURCE_DIR}/tests/data/gpt2/regex_char_classes.txt)
set_tests_properties(data.char_classes PROPERTIES TIMEOUT 120 LABELS data)

# ---- idx_fuzz: fuzz/idx_fuzz.cpp against tessera::data::parse_index -------------------------
# With clang++ and libFuzzer (probed once) it is a libFuzzer target built by clang whatever the
# project's compiler; otherwise the host compiler builds it with ASan/UBSan and the standalone
# mutation driver of fuzz/idx_fuzz.cpp. The CTest entry runs it for 55 s.
set(TESSERA_IDX_FUZZ_SOURCES ${PROJECT_SOURCE_DIR}/fuzz/idx_fuzz.cpp
                             ${PROJECT_SOURCE_DIR}/src/tessera/data/index_format.cpp)
set(TESSERA_IDX_FUZZ_DIR ${PROJECT_BINARY_DIR}/fuzz)
file(MAKE_DIRECTORY ${TESSERA_IDX_FUZZ_DIR}/idx_corpus)
find_program(TESSERA_FUZZ_CLANGXX NAMES clang++-14 clang++)
if(TESSERA_FUZZ_CLANGXX AND NOT DEFINED TESSERA_IDX_LIBFUZZER)
  file(WRITE ${TESSERA_IDX_FUZZ_DIR}/probe.cpp
       "#include <cstddef>\n#include <cstdint>\n#include <span>\n"
       "extern \"C\" int LLVMFuzzerTestOneInput(const uint8_t*, size_t) { return 0; }\n")
  execute_process(COMMAND ${TESSERA_FUZZ_CLANGXX} -std=c++20 -fsanitize=fuzzer,address,undefined
                          ${TESSERA_IDX_FUZZ_DIR}/probe.cpp -o ${TESSERA_IDX_FUZZ_DIR}/probe
                  RESULT_VARIABLE probe_rc OUTPUT_QUIET ERROR_QUIET)
  if(probe_rc EQUAL 0)
    set(TESSERA_IDX_LIBFUZZER ON CACHE BOOL "idx_fuzz is built as a libFuzzer target with clang")
  else()
    set(TESSERA_IDX_LIBFUZZER OFF CACHE BOOL "idx_fuzz is built as a libFuzzer target with clang")
  endif()
endif()

if(TESSERA_IDX_LIBFUZZER)
  set(TESSERA_IDX_FUZZ_BIN ${TESSERA_IDX_FUZZ_DIR}/idx_fuzz)
  add_custom_command(
    OUTPUT ${TESSERA_IDX_FUZZ_BIN}
    COMMAND ${TESSERA_FUZZ_CLANGXX} -std=c++20 -O1 -g -fno-omit-frame-pointer -DTESSERA_LIBFUZZER
            -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
            -I${PROJECT_SOURCE_DIR}/src ${TESSERA_IDX_FUZZ_SOURCES} -o ${TESSERA_IDX_FUZZ_BIN}
    DEPENDS ${TESSERA_IDX_FUZZ_SOURCES} ${PROJECT_SOURCE_DIR}/src/tessera/data/index_format.h
            ${PROJECT_SOURCE_DIR}/src/tessera/core/error.h
    COMMENT "Building idx_fuzz (clang, libFuzzer, ASan, UBSan)" VERBATIM)
  add_custom_target(idx_fuzz ALL DEPENDS ${TESSERA_IDX_FUZZ_BIN})
  add_test(NAME data.idx_fuzz
           COMMAND ${TESSERA_IDX_FUZZ_BIN} -max_total_time=55 -timeout=10 -rss_limit_mb=2048
                   -artifact_prefix=${TESSERA_IDX_FUZZ_DIR}/idx-
                   ${TESSERA_IDX_FUZZ_DIR}/idx_corpus ${PROJECT_SOURCE_DIR}/fuzz/corpus/idx)
else()
  add_executable(idx_fuzz ${TESSERA_IDX_FUZZ_SOURCES})
  target_compile_options(idx_fuzz PRIVATE -fsanitize=address,undefined -fno-sanitize-recover=undefined
                                          -O1 -g -fno-omit-frame-pointer)
  target_link_options(idx_fuzz PRIVATE -fsanitize=address,undefined)
  add_test(NAME data.idx_fuzz COMMAND idx_fuzz --seconds 55 ${PROJECT_SOURCE_DIR}/fuzz/corpus/idx/example)
endif()
set_tests_properties(data.idx_fuzz PROPERTIES
  TIMEOUT 120 LABELS "fuzz;data" WORKING_DIRECTORY ${TESSERA_IDX_FUZZ_DIR}
  ENVIRONMENT "ASAN_OPTIONS=abort_on_error=1:detect_leaks=1;UBSAN_OPTIONS=print_stacktrace=1")

# Model-file tokenizers (HuggingFaceTokenizer, Llama2Tokenizer, GPTSentencePieceTokenizer)
# against Megatron's classes on transformers / tokenizers / sentencepiece, which live in the
# test venv of scripts/setup.sh (TESSERA_TEST_VENV, tests/CMakeLists.txt).
foreach(family hf sp)
  add_test(NAME data.model_file_tokenizers_${family}
           COMMAND ${TESSERA_TEST_VENV}/bin/python ${TESSERA_DATA_REF}/model_file_tokenizers_test.py
                   --tessera $<TARGET_FILE:tessera> --workdir ${TESSERA_DATA_WORK}/model_file_tokenizers_${family}
                   -k ${family}_)
  set_tests_properties(data.model_file_tokenizers_${family} PROPERTIES TIMEOUT 600 LABELS data)
endforeach()
# The bad-input cases of the same script.
add_test(NAME data.model_file_tokenizers_errors
         COMMAND ${TESSERA_TEST_VENV}/bin/python ${TESSERA_DATA_REF}/model_file_tokenizers_test.py
                 --tessera $<TARGET_FILE:tessera> --workdir ${TESSERA_DATA_WORK}/model_file_tokenizers_errors
                 -k error_)
set_tests_properties(data.model_file_tokenizers_errors PROPERTIES TIMEOUT 300 LABELS data)
