#include "tessera/comm/unique_id.h"

#include "tessera/core/error.h"

namespace tessera {

std::vector<uint8_t> share_unique_id(Store& store, const std::string& key, bool is_root,
                                     const std::function<std::vector<uint8_t>()>& make,
                                     std::chrono::milliseconds timeout) {
  if (is_root) {
    std::vector<uint8_t> id = make();
    TESSERA_CHECK(!id.empty(), "share_unique_id: the library made an empty id for " + key);
    store.set(key, id);
    return id;
  }
  try {
    store.wait({key}, timeout);
  } catch (const Error& e) {
    throw runtime_error("the communicator's unique id '" + key + "' never arrived from its root rank: " + e.what(),
                        "the root rank publishes it when it creates the communicator: look at its output (it is "
                        "slower, stuck or has failed)");
  }
  return store.get(key);
}

}  // namespace tessera
