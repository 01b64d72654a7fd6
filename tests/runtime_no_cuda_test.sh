#!/usr/bin/env bash
# A gloo-only trainer built in a build with the nccl backend needs no CUDA or NCCL library: the
# backend's calls to them live in a plugin that ddprun::runtime loads only for "nccl".
# Usage: tests/runtime_no_cuda_test.sh TRAINER NCCL_PLUGIN BUILD_DIR
source "$(dirname "$0")/lib.sh"
trainer=$1
plugin=$2
build=$3
need readelf ldd
needed() { readelf -d "$1" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' '; }
cuda_re='lib(cuda|cudart|nccl|nvidia|cublas)'

n=$(needed "$trainer")
if ! echo "$n" | grep -q 'libc.so'; then bad "cannot read the trainer's NEEDED entries: '$n'"
elif echo "$n" | grep -Eq "$cuda_re"; then bad "the trainer's NEEDED names a CUDA or NCCL library: $n"; else ok "the trainer's NEEDED: $n"; fi
l=$(ldd "$trainer" | awk '{print $1}' | tr '\n' ' ')
if ! echo "$l" | grep -q 'libc.so'; then bad "ldd cannot read the trainer: '$l'"
elif echo "$l" | grep -Eq "$cuda_re"; then bad "the trainer loads CUDA or NCCL (ldd): $l"; else ok "nothing the trainer loads is CUDA or NCCL (ldd)"; fi
# The check means something: this build has the backend, and its plugin is what links them.
p=$(needed "$plugin")
if echo "$p" | grep -q 'libnccl' && echo "$p" | grep -q 'libcudart'; then ok "the nccl plugin links them: $p"; else bad "the nccl plugin's NEEDED lacks NCCL or CUDA: $p"; fi
if grep -Eq '^Libs.*-l(nccl|cudart)' "$build/ddprun-runtime.pc"; then bad "ddprun-runtime.pc links CUDA or NCCL"; else ok "ddprun-runtime.pc names no CUDA or NCCL library"; fi
if grep -q "^nccl_plugin=.*$(basename "$plugin")" "$build/ddprun-runtime.pc"; then ok "ddprun-runtime.pc names the plugin"; else bad "ddprun-runtime.pc does not name the plugin"; fi
# The trainer runs without CUDA in reach: no library path holds it, and it never asks.
if "$trainer" --steps 5 2>&1 | grep -q RESULT; then ok "the trainer runs as a world of one"; else bad "the trainer does not run as a world of one"; fi
finish
