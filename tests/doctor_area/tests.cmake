# Doctor area: `tessera doctor` end to end (tests/integration/doctor_test.py): clean runs alone,
# under `tessera launch --nproc_per_node 2` and on two network-namespace hosts, and every FAIL
# path. The checks themselves are GoogleTest programs under tests/unit/doctor (DoctorChecks.*,
# DoctorReport.*, DoctorOptions.*, MemoryEstimate.*).
#   ctest --test-dir build -L doctor
add_test(NAME doctor.end_to_end
         COMMAND /usr/bin/python3 ${PROJECT_SOURCE_DIR}/tests/integration/doctor_test.py $<TARGET_FILE:tessera>)
set_tests_properties(doctor.end_to_end PROPERTIES TIMEOUT 240 LABELS doctor SKIP_RETURN_CODE 77 RUN_SERIAL TRUE)

# doctor's memory row equals the largest rank's allocation in `tessera train` (TP 2, PP 2).
add_test(NAME doctor.memory_per_rank
         COMMAND /usr/bin/python3 ${PROJECT_SOURCE_DIR}/tests/doctor_area/memory_per_rank_test.py $<TARGET_FILE:tessera>)
set_tests_properties(doctor.memory_per_rank PROPERTIES TIMEOUT 240 LABELS doctor)
