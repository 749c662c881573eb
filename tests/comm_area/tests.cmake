# Comm area: multi-process runs of the tessera binary. (The store, communicator, Gloo
# multi-process and network-namespace cases are GoogleTest programs under tests/unit/comm,
# discovered as Store.*, InProcessComm.*, GlooComm.*, GlooNetns.*.)
#   ctest --test-dir build -L comm
#
# `tessera bench comm --spawn 2` over loopback, one small sweep per collective with -c 1:
# every element must equal its exact expected value ("Out of bounds values : 0 OK").
foreach(coll all_reduce all_gather reduce_scatter broadcast)
  add_test(NAME comm.bench_${coll}
           COMMAND $<TARGET_FILE:tessera> bench comm --spawn 2 -C ${coll} -b 4K -e 4M -f 32 -n 2 -w 1 -c 1
                   --timeout-minutes 0.5)
  set_tests_properties(comm.bench_${coll} PROPERTIES TIMEOUT 90 LABELS comm
                       PASS_REGULAR_EXPRESSION "Out of bounds values : 0 OK")
endforeach()
# int64 max through the same path.
add_test(NAME comm.bench_all_reduce_i64_max
         COMMAND $<TARGET_FILE:tessera> bench comm --spawn 3 -d int64 -o max -b 8 -e 64K -f 16 -n 2 -w 1 -c 1
                 --timeout-minutes 0.5)
set_tests_properties(comm.bench_all_reduce_i64_max PROPERTIES TIMEOUT 90 LABELS comm
                     PASS_REGULAR_EXPRESSION "Out of bounds values : 0 OK")
# A bad flag is a usage error (exit 2) naming it.
add_test(NAME comm.bench_bad_flag COMMAND $<TARGET_FILE:tessera> bench comm -d float16)
set_tests_properties(comm.bench_bad_flag PROPERTIES TIMEOUT 30 LABELS comm
                     PASS_REGULAR_EXPRESSION "-d takes float, int32 or int64, got 'float16'")
# The host-staged path (tessera's buffers on the strict device, copied through pinned host
# memory around every call) checked the same way.
add_test(NAME comm.bench_all_reduce_staged
         COMMAND $<TARGET_FILE:tessera> bench comm --spawn 2 --device strict -b 4K -e 4M -f 32 -n 2 -w 1 -c 1
                 --timeout-minutes 0.5)
set_tests_properties(comm.bench_all_reduce_staged PROPERTIES TIMEOUT 90 LABELS comm
                     PASS_REGULAR_EXPRESSION "Out of bounds values : 0 OK")
