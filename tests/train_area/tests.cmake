# `tessera train` through its command line.
add_test(NAME train_cli
         COMMAND /usr/bin/python3 ${PROJECT_SOURCE_DIR}/tests/integration/train_cli_test.py
                 $<TARGET_FILE:tessera> ${PROJECT_SOURCE_DIR})
set_tests_properties(train_cli PROPERTIES TIMEOUT 300)
