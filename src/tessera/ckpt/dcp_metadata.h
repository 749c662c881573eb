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
struct DcpChunk {
  std::vector<int64_t> offsets, sizes;
  std::string file;  // relative to the iteration folder: "__0_1.distcp"
  uint64_t offset = 0, length = 0;
};
struct DcpTensor {
  std::string key;
  std::string dtype;  // "torch.float32", ...
  std::vector<int64_t> size;
  std::vector<DcpChunk> chunks;
};
struct DcpMetadata {
  std::vector<DcpTensor> tensors;
  std::vector<std::string> byte_objects;  // BytesStorageMetadata keys (_extra_state, rng_state, ...)
};
// Parses and checks bytes (the .metadata of `label`); every error names label.
DcpMetadata parse_dcp_metadata(std::span<const uint8_t> bytes, const std::string& label);
DcpMetadata read_dcp_metadata(const std::string& it_dir);

}  // namespace tessera
