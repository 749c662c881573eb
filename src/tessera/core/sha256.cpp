#include "tessera/core/sha256.h"

#include <openssl/evp.h>

#include <algorithm>

#include "tessera/core/error.h"

namespace tessera {

Sha256::Sha256() : ctx_(EVP_MD_CTX_new()) {
  if (!ctx_ || EVP_DigestInit_ex(static_cast<EVP_MD_CTX*>(ctx_), EVP_sha256(), nullptr) != 1) {
    EVP_MD_CTX_free(static_cast<EVP_MD_CTX*>(ctx_));
    throw runtime_error("SHA-256 is not available from OpenSSL");
  }
}

Sha256::~Sha256() { EVP_MD_CTX_free(static_cast<EVP_MD_CTX*>(ctx_)); }

void Sha256::update(std::span<const unsigned char> bytes) {
  // In chunks, so that a mapped file is read sequentially.
  constexpr size_t kChunk = size_t{1} << 24;
  for (size_t off = 0; off < bytes.size(); off += kChunk)
    EVP_DigestUpdate(static_cast<EVP_MD_CTX*>(ctx_), bytes.data() + off, std::min(kChunk, bytes.size() - off));
}

std::string Sha256::hex() {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(static_cast<EVP_MD_CTX*>(ctx_), digest, &len);
  static const char kHex[] = "0123456789abcdef";
  std::string hex;
  for (unsigned int i = 0; i < len; ++i) hex += {kHex[digest[i] >> 4], kHex[digest[i] & 15]};
  return hex;
}

std::string sha256_hex(std::span<const unsigned char> bytes) {
  Sha256 sha;
  sha.update(bytes);
  return sha.hex();
}

}  // namespace tessera
