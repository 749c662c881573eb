# `tessera train` through its command line.
add_test(NAME train_cli
         COMMAND /usr/bin/python3 ${PROJECT_SOURCE_DIR}/tests/integration/train_cli_test.py
                 $<TARGET_FILE:tessera> ${PROJECT_SOURCE_DIR})
# Timeouts are hang guards: at least twice the time under ctest -j3 on a loaded 2-core machine.
set_tests_properties(train_cli PROPERTIES TIMEOUT 600)

# Data parallelism against the single-process run, on loopback and across two network
# namespaces (skipped, exit 77, without the rights to make them).
add_test(NAME train_data_parallel
         COMMAND /usr/bin/python3 ${PROJECT_SOURCE_DIR}/tests/integration/data_parallel_test.py $<TARGET_FILE:tessera>)
set_tests_properties(train_data_parallel PROPERTIES TIMEOUT 300 SKIP_RETURN_CODE 77)

# Checkpoints: bit-exact resume (1 process, DP=2), kill -9 during saves, bad files, flags.
add_test(NAME train_checkpoints
         COMMAND /usr/bin/python3 ${PROJECT_SOURCE_DIR}/tests/integration/checkpoint_test.py $<TARGET_FILE:tessera>)
set_tests_properties(train_checkpoints PROPERTIES TIMEOUT 600)

# Start-up checks of --save (writable), --load (not past --train-iters) and --ckpt-format
# (torch_dist written by default, zarr refused), before any iteration.
add_test(NAME train_startup_checks
         COMMAND /usr/bin/python3 ${PROJECT_SOURCE_DIR}/tests/integration/train_startup_test.py $<TARGET_FILE:tessera>)
set_tests_properties(train_startup_checks PROPERTIES TIMEOUT 120)

# Tensor, pipeline and data parallelism and their products against the single-process run.
add_test(NAME train_model_parallel
         COMMAND /usr/bin/python3 ${PROJECT_SOURCE_DIR}/tests/integration/model_parallel_test.py $<TARGET_FILE:tessera>)
set_tests_properties(train_model_parallel PROPERTIES TIMEOUT 900)
# The two-server guide's layout (2 nodes x 8 processes, TP=2 PP=2 DP=4) on network-namespace
# hosts (skipped, exit 77, without the rights to make them).
add_test(NAME train_model_parallel_two_hosts
         COMMAND /usr/bin/python3 ${PROJECT_SOURCE_DIR}/tests/integration/model_parallel_test.py $<TARGET_FILE:tessera>
                 two-hosts)
set_tests_properties(train_model_parallel_two_hosts PROPERTIES TIMEOUT 600 SKIP_RETURN_CODE 77)

# Context parallelism (the p2p ring, the gathered unfused attention) with TP, SP, PP, DP and the
# distributed optimizer, recomputation, bf16, checkpoints and bad layouts, against one process.
add_test(NAME train_context_parallel
         COMMAND /usr/bin/python3 ${PROJECT_SOURCE_DIR}/tests/integration/context_parallel_test.py $<TARGET_FILE:tessera>)
set_tests_properties(train_context_parallel PROPERTIES TIMEOUT 600)
add_test(NAME train_context_parallel.strict
         COMMAND /usr/bin/python3 ${PROJECT_SOURCE_DIR}/tests/integration/context_parallel_test.py $<TARGET_FILE:tessera>
                 --device strict)
set_tests_properties(train_context_parallel.strict PROPERTIES TIMEOUT 300 LABELS strict)

# --deterministic-mode gives the bits of a log recorded before fused kernels existed; the
# default mode stays near them.
add_test(NAME train_deterministic_mode
         COMMAND /usr/bin/python3 ${PROJECT_SOURCE_DIR}/tests/integration/deterministic_mode_test.py
                 $<TARGET_FILE:tessera>)
set_tests_properties(train_deterministic_mode PROPERTIES TIMEOUT 240)

# 16-bit storage (--bf16): parallel layouts against one bf16 process, bit-exact pure PP, and
# the activation memory against fp32 (estimate and measured).
add_test(NAME train_mixed_precision
         COMMAND /usr/bin/python3 ${PROJECT_SOURCE_DIR}/tests/integration/mixed_precision_test.py $<TARGET_FILE:tessera>)
set_tests_properties(train_mixed_precision PROPERTIES TIMEOUT 600)

# Training robustness through the command line: TensorBoard read back by TensorBoard,
# recomputation, throughput/MFU fields, allocation failure, fp16 loss scaling, bf16.
add_test(NAME train_robustness
         COMMAND /usr/bin/python3 ${PROJECT_SOURCE_DIR}/tests/integration/robustness_test.py $<TARGET_FILE:tessera>
                 ${TESSERA_TEST_VENV})
set_tests_properties(train_robustness PROPERTIES TIMEOUT 300)

# --exit-signal-handler under `tessera launch` (DP=2, TP=2, PP=2): SIGINT/SIGTERM through the
# launcher and bursts straight to the workers; every rank saves the same iteration and returns.
add_test(NAME train_exit_signal
         COMMAND /usr/bin/python3 ${PROJECT_SOURCE_DIR}/tests/integration/exit_signal_test.py $<TARGET_FILE:tessera>)
set_tests_properties(train_exit_signal PROPERTIES TIMEOUT 600)

# Saves that fail (a file-size limit standing in for a full disk; 1 process and DP=2) remove
# their temporary folder; folders left by killed saves are reported, removed when abandoned.
add_test(NAME train_checkpoint_failures
         COMMAND /usr/bin/python3 ${PROJECT_SOURCE_DIR}/tests/integration/checkpoint_failure_test.py $<TARGET_FILE:tessera>)
set_tests_properties(train_checkpoint_failures PROPERTIES TIMEOUT 300)

# A resume that changed --eval-iters gets a validation split as large as it reads; one that
# kept its flags gets Megatron's count.
add_test(NAME train_resume_validation
         COMMAND /usr/bin/python3 ${PROJECT_SOURCE_DIR}/tests/integration/resume_validation_test.py $<TARGET_FILE:tessera>)
set_tests_properties(train_resume_validation PROPERTIES TIMEOUT 600)

# Messages for a new user's mistakes: a schedule that differs from the checkpoint's (each
# setting, both values, its flag), --load at an iter_N folder, --data-path suffix hints
# (train and doctor).
add_test(NAME train_messages
         COMMAND /usr/bin/python3 ${PROJECT_SOURCE_DIR}/tests/integration/train_messages_test.py $<TARGET_FILE:tessera>)
set_tests_properties(train_messages PROPERTIES TIMEOUT 300)

# --enable-cuda-graph's capture checked on the strict device (no allocation, host copy or
# synchronisation inside the captured region; the same bits as without it) and its refusals.
add_test(NAME train_cuda_graph
         COMMAND /usr/bin/python3 ${PROJECT_SOURCE_DIR}/tests/integration/cuda_graph_test.py $<TARGET_FILE:tessera>)
set_tests_properties(train_cuda_graph PROPERTIES TIMEOUT 300 LABELS strict)

# The smallest cases of the train scripts again on the strict test device (host memory that
# refuses host access outside a backend, naming the file and line): one process against the
# CPU bit for bit, TP=2 x DP=2 and PP=2, DP=2 with overlapped buckets, and 1-process
# bit-exact resumes in both checkpoint formats. Labelled "strict":  ctest -L strict
foreach(script model_parallel data_parallel checkpoint)
  add_test(NAME train_${script}.strict
           COMMAND /usr/bin/python3 ${PROJECT_SOURCE_DIR}/tests/integration/${script}_test.py $<TARGET_FILE:tessera>
                   --device strict)
  # Hang guards: 37 s, 13 s and 22 s under ctest -j2 on a shared 2-core machine.
  set_tests_properties(train_${script}.strict PROPERTIES TIMEOUT 300 LABELS strict)
endforeach()

# The distributed optimizer (ZeRO-1) against the single-process run: DP=2, DP=4, TP=2 x DP=2
# and PP=2 x DP=2 with its overlaps off and on, PP=3 x DP=2 interleaved, the optimizer state
# per rank as 1/DP, and checkpoints saved by DP rank, resharded between DP sizes, TP, PP, and
# to and from the non-distributed optimizer; a missing DP shard is named.
add_test(NAME train_distributed_optimizer
         COMMAND /usr/bin/python3 ${PROJECT_SOURCE_DIR}/tests/integration/distributed_optimizer_test.py
                 $<TARGET_FILE:tessera>)
set_tests_properties(train_distributed_optimizer PROPERTIES TIMEOUT 600)

# The Llama family (RMSNorm, RoPE, SwiGLU, grouped-query attention) through the command line:
# parallel layouts and recomputation against one process, the strict device, bf16,
# checkpoints resharded TP=2 -> PP=2 (tessera's and Megatron's format), the memory estimate.
add_test(NAME train_llama_model
         COMMAND /usr/bin/python3 ${PROJECT_SOURCE_DIR}/tests/integration/llama_model_test.py $<TARGET_FILE:tessera>)
set_tests_properties(train_llama_model PROPERTIES TIMEOUT 900)

# Expert parallelism (both dispatchers, with TP + SP, PP, the distributed optimizer) against one
# process, and in --deterministic-mode EP 2 against DP 2 bit for bit, saves and resumes
# included (tests/integration/expert_parallel_test.py).
add_test(NAME train_expert_parallel
         COMMAND /usr/bin/python3 ${PROJECT_SOURCE_DIR}/tests/integration/expert_parallel_test.py $<TARGET_FILE:tessera>)
set_tests_properties(train_expert_parallel PROPERTIES TIMEOUT 600)

# Mixture of experts against float64 transformers (tests/integration/moe_hf_test.py): Mixtral and
# Qwen2-MoE trained 10 iterations with Megatron's router and aux loss, HF import/export, MoE flags.
# With OpenCL built, Mixtral also trains on it (PoCL here).
set(_moe_devices cpu strict)
if(TESSERA_WITH_OPENCL)
  list(APPEND _moe_devices opencl)
endif()
add_test(NAME train_moe_hf
         COMMAND /usr/bin/python3 ${PROJECT_SOURCE_DIR}/tests/integration/moe_hf_test.py $<TARGET_FILE:tessera>
                 ${_moe_devices})
set_tests_properties(train_moe_hf PROPERTIES TIMEOUT 300)
