#!/usr/bin/env bash
# ddprun is linked without OpenSSL, ddprun-full with it (launcher/include/ddprun/launcher/full_program.hpp).
# A reference to any OpenSSL function from an object ddprun links would pull libcrypto back in
# silently (it is a static library): this looks for OpenSSL's symbols in the program itself.
# usage: no_openssl_test.sh DDPRUN DDPRUN_FULL
set -u
core=$1 full=$2
pattern=' [A-Za-z] (SSL_|EVP_|HMAC|RAND_|OPENSSL_|CRYPTO_|ERR_|BIO_|X509_|PEM_|ASN1_|ossl_)'
source "$(dirname "$0")/lib.sh"
need nm
found=$(nm "$core" 2>&1 | grep -E "$pattern" | head -5)
nm "$core" >/dev/null 2>&1 && [ "$(nm "$core" | wc -l)" -gt 1000 ] || { echo "FAILED: nm cannot read $core's symbols"; exit 1; }
if [ -n "$found" ]; then bad "$core holds OpenSSL:"; echo "$found"; else ok "$core holds no OpenSSL symbol"; fi
n=$(nm "$full" | grep -cE "$pattern")
if [ "$n" -gt 100 ]; then ok "$(basename "$full") holds OpenSSL ($n symbols)"; else bad "$full holds $n OpenSSL symbols"; fi
finish
