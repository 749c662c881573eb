# `tessera launch` through the tessera binary, with /bin/sh workers
# (tests/integration/launch_test.py, one CTest entry per case so they run in parallel and
# fail one by one), and the two-host test in network namespaces (skipped, exit 77, where
# namespaces cannot be made). Every test is named launch.* and labelled "launch":
#   ctest --test-dir build -L launch
set(TESSERA_LAUNCH_CASES
    environment output_prefix_and_filter log_dir kill9_stops_everything launcher_kill9_takes_workers_along
    sigterm_with_grace exit_codes max_restarts two_nodes_on_loopback failure_on_one_node_stops_all join_timeout
    c10d_node_ranks programs)
foreach(name ${TESSERA_LAUNCH_CASES})
  add_test(NAME launch.${name}
           COMMAND /usr/bin/python3 ${PROJECT_SOURCE_DIR}/tests/integration/launch_test.py
                   $<TARGET_FILE:tessera> ${name})
  set_tests_properties(launch.${name} PROPERTIES TIMEOUT 90 LABELS launch)
endforeach()

add_test(NAME launch.two_hosts_netns
         COMMAND /usr/bin/python3 ${PROJECT_SOURCE_DIR}/tests/integration/launch_netns_test.py $<TARGET_FILE:tessera>)
set_tests_properties(launch.two_hosts_netns PROPERTIES TIMEOUT 120 LABELS launch SKIP_RETURN_CODE 77)
