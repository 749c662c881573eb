// torch.distributed.checkpoint's `.metadata` (PyTorch 2.5's torch/distributed/checkpoint/
// metadata.py and filesystem.py), the index of a torch_dist checkpoint (torch_dist.h): which
// global keys it holds, each tensor's dtype, global size and chunks (offsets, sizes), and where
// each chunk's bytes are (a .distcp file, offset, length).
//
// The pickle is untrusted: it is read by the restricted reader's DcpMetadata allow-list
// (pickle.h), and every field is checked before use: chunk extents inside the tensor, a storage
// record for every chunk, file names that stay inside the iteration folder, offsets and lengths
// that are positive. Any problem is a tessera::Error naming the file (fuzz/
// torch_checkpoint_fuzz.cpp feeds it mutated .metadata files).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace tessera {

// The parsed .metadata: every tensor key with its chunks and where each chunk's bytes are.
//
// The distributed optimizer's state in its default layout (fully_sharded_model_space,
// megatron/core/optimizer/distrib_optimizer.py sharded_param_state_fs_model_space) is cut into
// flat ranges of each TP-local block, one per data-parallel rank. megatron-core stores an N-D one
// reformulated (megatron/core/dist_checkpointing/strategies/resharding.py): global [X, Y] with
// blocks [x, y] as [X/x, Y/y, x*y], each chunk one block's range [1, 1, len] at [i, j, start],
// and the original shape in Metadata.mcore_data[key]['nd_reformulated_orig_global_shape'].
// Parsing undoes that: such a tensor has its original size, and one chunk per block whose
// `parts` are its ranges in order, together exactly the block's elements.
struct DcpChunk {
  std::vector<int64_t> offsets, sizes;
  std::string file;  // relative to the iteration folder: "__0_1.distcp"
  uint64_t offset = 0, length = 0;
  std::vector<DcpChunk> parts;  // a reformulated block's flat ranges (then file, offset, length unused)
};
struct DcpTensor {
  std::string key;
  std::string dtype;  // "torch.float32", ...
  std::vector<int64_t> size;
  std::vector<DcpChunk> chunks;
};
// A BytesStorageMetadata entry (_extra_state, rng_state, ...: a ShardedObject's torch.save).
struct DcpObject {
  std::string key;  // "rng_state/shard_0.1_2.2"
  DcpChunk where;   // its file, offset and length
};
struct DcpMetadata {
  std::vector<DcpTensor> tensors;
  std::vector<DcpObject> byte_objects;
};
// Parses and checks bytes (the .metadata of `label`); every error names label.
DcpMetadata parse_dcp_metadata(std::span<const uint8_t> bytes, const std::string& label);
DcpMetadata read_dcp_metadata(const std::string& it_dir);

}  // namespace tessera
