#!/usr/bin/env bash
# Builds the wheel for PyPI inside a manylinux_2_28 container (AlmaLinux 8, glibc 2.28), for the
# container's architecture (x86_64 or aarch64): ddprun's C++ dependencies built from pinned
# sources as static libraries (Debian 12's versions), ddprun built against them with DT_RELR
# off (glibc 2.28 has no packed relocations), then scripts/build_wheel.sh, then auditwheel's
# own verdict on the tag. Needs the network (sources, pip); NOT run by the test suite.
# Usage (from the checkout's root, as root in the container; github-workflow.yml does this):
#   docker run --rm -v "$PWD:/src" -w /src --env-file packaging/wheel/publish/checksums.env \
#     quay.io/pypa/manylinux_2_28_x86_64 packaging/wheel/publish/manylinux_build.sh
#   (quay.io/pypa/manylinux_2_28_aarch64 on an arm64 runner or under qemu for aarch64)
# The wheel lands in dist/ (named ddprun-VERSION-py3-none-manylinux_2_28_ARCH.whl when the
# programs need nothing newer than glibc 2.28).
set -euo pipefail
src=$(pwd)
deps=/opt/ddprun-deps
jobs=$(nproc)
python=/opt/python/cp311-cp311/bin/python
export PATH=$deps/bin:$PATH PKG_CONFIG_PATH=$deps/lib/pkgconfig:$deps/lib64/pkgconfig
export CFLAGS="-O2 -fPIC" CXXFLAGS="-O2 -fPIC"

dnf install -y -q hwloc-devel perl-IPC-Cmd perl-FindBin m4 gettext-devel >/dev/null  # hwloc: headers only, ddprun opens it at run time
"$python" -m pip install -q build setuptools wheel
mkdir -p /tmp/deps && cd /tmp/deps

fetch() {  # URL SHA256 -> unpacked into the current folder
  curl -fsSL -o src.tar "$1"
  echo "$2  src.tar" | sha256sum -c - >/dev/null || { echo "checksum mismatch: $1" >&2; exit 1; }
  rm -rf unpacked && mkdir unpacked && tar -xf src.tar -C unpacked --strip-components=1 && rm src.tar
}
cmake_dep() {  # build and install the unpacked CMake project with extra flags
  cmake -S unpacked -B unpacked/build -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=$deps \
    -DCMAKE_POSITION_INDEPENDENT_CODE=ON -DBUILD_SHARED_LIBS=OFF "$@" >/dev/null
  cmake --build unpacked/build -j"$jobs" >/dev/null && cmake --install unpacked/build >/dev/null
}
# The checksums come from checksums.env (filled in by the maintainer; empty ones stop the build).
fetch https://zlib.net/fossils/zlib-1.2.13.tar.gz "${ZLIB_SHA256:?}" && cmake_dep
fetch https://github.com/tukaani-project/xz/releases/download/v5.4.6/xz-5.4.6.tar.gz "${XZ_SHA256:?}" && cmake_dep
fetch https://sourceware.org/pub/bzip2/bzip2-1.0.8.tar.gz "${BZIP2_SHA256:?}" &&
  make -C unpacked -j"$jobs" libbz2.a CFLAGS="$CFLAGS" >/dev/null && install -D -m644 unpacked/libbz2.a $deps/lib/libbz2.a &&
  install -D -m644 unpacked/bzlib.h $deps/include/bzlib.h
fetch https://sourceware.org/elfutils/ftp/0.188/elfutils-0.188.tar.bz2 "${ELFUTILS_SHA256:?}" &&  # libdw.a for ddprun-stack
  (cd unpacked && ./configure -q --prefix=$deps --disable-debuginfod --disable-libdebuginfod --without-zstd \
     CPPFLAGS=-I$deps/include LDFLAGS=-L$deps/lib >/dev/null && make -j"$jobs" >/dev/null && make install >/dev/null)
fetch https://www.openssl.org/source/openssl-3.0.13.tar.gz "${OPENSSL_SHA256:?}" &&
  (cd unpacked && ./Configure no-shared no-tests --prefix=$deps --libdir=lib >/dev/null && make -j"$jobs" >/dev/null && make install_sw >/dev/null)
fetch https://archives.boost.io/release/1.81.0/source/boost_1_81_0.tar.gz "${BOOST_SHA256:?}" &&
  (cd unpacked && ./bootstrap.sh --with-libraries=program_options --prefix=$deps >/dev/null &&
   ./b2 -j"$jobs" link=static variant=release cxxflags=-fPIC install >/dev/null)
fetch https://github.com/fmtlib/fmt/archive/refs/tags/9.1.0.tar.gz "${FMT_SHA256:?}" && cmake_dep -DFMT_TEST=OFF -DFMT_DOC=OFF
fetch https://github.com/gabime/spdlog/archive/refs/tags/v1.10.0.tar.gz "${SPDLOG_SHA256:?}" && cmake_dep -DSPDLOG_FMT_EXTERNAL=ON -DSPDLOG_BUILD_EXAMPLE=OFF
fetch https://github.com/nlohmann/json/archive/refs/tags/v3.11.2.tar.gz "${JSON_SHA256:?}" && cmake_dep -DJSON_BuildTests=OFF
fetch https://github.com/facebookincubator/gloo/archive/5b143513263133af2b95547e97c07cebeb72bf72.tar.gz "${GLOO_SHA256:?}" && cmake_dep

cd "$src"
cmake -S . -B build-wheel -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_PREFIX_PATH=$deps \
  -DDDPRUN_BUILD_TESTS=OFF -DDDPRUN_BUILD_BENCH=OFF -DDDPRUN_LINKER_RELR=OFF -DOPENSSL_ROOT_DIR=$deps
PYTHON=$python DDPRUN_JOBS=$jobs scripts/build_wheel.sh build-wheel dist
auditwheel show dist/ddprun-*.whl  # PyPA's own reading of the tag: must agree with the file name
