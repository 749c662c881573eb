#include "tessera/core/sha256.h"

#include <openssl/evp.h>

#include <algorithm>
#include <memory>

#include "tessera/core/error.h"

namespace tessera {

std::string sha256_hex(std::span<const unsigned char> bytes) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  std::unique_ptr<EVP_MD_CTX, void (*)(EVP_MD_CTX*)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  if (!ctx || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1)
    throw runtime_error("SHA-256 is not available from OpenSSL");
  // In chunks, so that a mapped file is read sequentially.
  constexpr size_t kChunk = size_t{1} << 24;
  for (size_t off = 0; off < bytes.size(); off += kChunk)
    EVP_DigestUpdate(ctx.get(), bytes.data() + off, std::min(kChunk, bytes.size() - off));
  EVP_DigestFinal_ex(ctx.get(), digest, &len);
  static const char kHex[] = "0123456789abcdef";
  std::string hex;
  for (unsigned int i = 0; i < len; ++i) hex += {kHex[digest[i] >> 4], kHex[digest[i] & 15]};
  return hex;
}

}  // namespace tessera
