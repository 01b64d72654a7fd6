// The store handshake's cryptography, the only part of the rendezvous library that needs
// OpenSSL: the proofs (HMAC-SHA256 of the nonces under the job's secret) and their comparison
// in constant time. A file of its own so that a program without store secrets (`ddprun`, which
// hands such jobs to ddprun-full: launcher/src/without_openssl.cpp) links no OpenSSL.
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "ddprun/common/error.hpp"
#include "ddprun/rendezvous/auth.hpp"

namespace ddprun::rendezvous::auth {
namespace {

std::string hmac(std::string_view secret, std::string_view label, std::string_view a, std::string_view b) {
  std::string msg;
  msg.reserve(label.size() + a.size() + b.size());
  msg.append(label).append(a).append(b);
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (!HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
            reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), out, &len)) {
    throw Error("HMAC-SHA256 failed (OpenSSL)");
  }
  return std::string(reinterpret_cast<char*>(out), len);
}

}  // namespace

std::string server_proof(std::string_view secret, std::string_view cnonce, std::string_view snonce) {
  return hmac(secret, "ddprun-store-server", cnonce, snonce);
}

std::string client_proof(std::string_view secret, std::string_view snonce, std::string_view cnonce) {
  return hmac(secret, "ddprun-store-client", snonce, cnonce);
}

bool equal(std::string_view a, std::string_view b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace ddprun::rendezvous::auth
