# The few Megatron-LM classes a --ckpt-format torch checkpoint pickles (its args' model_type,
# the rerun state machine's enums), as plain enums with Megatron's member values, so that the
# tests can torch.save and torch.load such checkpoints without Megatron-LM installed.
