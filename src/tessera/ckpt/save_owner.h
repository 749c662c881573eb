// Who made a checkpoint's temporary folder (internal to ckpt/): DIR/iter_N.tmp-<token>/owner.json
// records the process and the machine, so that a later run can tell a save that is still
// running from a folder a killed process left behind (find_stale_checkpoint_saves).
#pragma once

#include <string>

namespace tessera::ckpt_detail {

inline constexpr const char* kSaveOwnerFile = "owner.json";

// Writes TMP/owner.json for this process (fsynced: it must outlive a crash to be of use).
void write_save_owner(const std::string& tmp_dir);

}  // namespace tessera::ckpt_detail
