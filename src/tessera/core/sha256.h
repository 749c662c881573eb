// SHA-256 (OpenSSL) as lowercase hex: checksums of checkpoint files and dataset caches.
#pragma once

#include <span>
#include <string>

namespace tessera {

std::string sha256_hex(std::span<const unsigned char> bytes);

// The same digest over bytes that arrive in pieces (a file written from bounded buffers).
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void update(std::span<const unsigned char> bytes);
  // The digest as lowercase hex; the object takes no more updates.
  std::string hex();

 private:
  void* ctx_;  // EVP_MD_CTX
};

}  // namespace tessera
