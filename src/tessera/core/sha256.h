// SHA-256 (OpenSSL) as lowercase hex: checksums of checkpoint files and dataset caches.
#pragma once

#include <span>
#include <string>

namespace tessera {

std::string sha256_hex(std::span<const unsigned char> bytes);

}  // namespace tessera
