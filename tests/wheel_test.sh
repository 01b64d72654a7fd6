#!/usr/bin/env bash
# A pip install of the wheel as a PyTorch user does it, offline: builds the wheel (scripts/build_wheel.sh),
# proves its platform tag from the binaries with objdump (not readelf, which the build script
# uses), installs it with pip --no-index into a fresh virtual environment that sees Debian's
# PyTorch (--system-site-packages), runs a 2-worker PyTorch gloo DDP job with the environment's
# ddprun and `python -m ddprun --version`, and checks that pip uninstall leaves no file of ours.
# Usage: tests/wheel_test.sh BUILD_DIR SOURCE_DIR
source "$(dirname "$0")/lib.sh"
build=$1
src=$2
python=/usr/bin/python3
need objdump readelf strip "$python"
"$python" -c 'import venv, ensurepip, build, setuptools, wheel, torch' 2>/dev/null ||
  skip "needs python3-venv, python3-build, python3-setuptools, python3-wheel, python3-torch (scripts/setup.sh installs them)"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# ---- the wheel -----------------------------------------------------------------------------
if PYTHON=$python "$src/scripts/build_wheel.sh" "$build" "$work/dist" >"$work/build.log" 2>&1; then
  ok "scripts/build_wheel.sh made $(basename "$work"/dist/*.whl)"
else
  bad "scripts/build_wheel.sh failed"; cat "$work/build.log"; finish
fi
wheel=$(ls "$work"/dist/*.whl)
tag=$(basename "$wheel" .whl); tag=${tag##*-}
version=$(sed -n 's/^CMAKE_PROJECT_VERSION:STATIC=//p' "$build/CMakeCache.txt")
[ "$(basename "$wheel")" = "ddprun-$version-py3-none-$tag.whl" ] && ok "named ddprun-$version-py3-none-$tag.whl" ||
  bad "named $(basename "$wheel"), not ddprun-$version-py3-none-PLATFORM.whl"
"$python" - "$wheel" "$tag" >"$work/wheelfile.txt" 2>&1 <<'PY' && ok "its WHEEL file says Tag: py3-none-$tag, Root-Is-Purelib: false" || { bad "its WHEEL file"; cat "$work/wheelfile.txt"; }
import sys, zipfile
wheel, tag = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    text = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/WHEEL"))).decode()
print(text)
assert f"Tag: py3-none-{tag}" in text.splitlines() and "Root-Is-Purelib: false" in text.splitlines()
PY

# The programs the install puts in bin/ (cmake/packaging.cmake), all of them in the wheel.
cmake --install "$build" --prefix "$work/ref" --component bin >/dev/null
programs=$(cd "$work/ref/bin" && ls)
[ -n "$programs" ] && case " $(echo $programs) " in *" ddprun "*" ddprun-store "*) true ;; *) false ;; esac &&
  ok "the install's programs: $(echo $programs)" || bad "the install's bin/ lacks ddprun or ddprun-store: $(echo $programs)"

# ---- a fresh virtual environment, pip install --no-index -------------------------------------
venv=$work/venv
"$python" -m venv --system-site-packages "$venv" && "$venv/bin/pip" --version >/dev/null &&
  ok "python3 -m venv --system-site-packages" || { bad "python3 -m venv"; finish; }
snapshot() { (cd "$venv" && find . | LC_ALL=C sort); }
snapshot >"$work/before.txt"
if "$venv/bin/pip" install --no-index --no-cache-dir "$wheel" >"$work/pip.log" 2>&1; then
  ok "pip install --no-index $(basename "$wheel")"
else
  bad "pip install --no-index"; cat "$work/pip.log"; finish
fi

# ---- the platform tag, proved from the installed binaries with objdump -----------------------
# manylinux_2_X: every NEEDED library is glibc's (on manylinux's allowed list) and X is the
# newest glibc a symbol version asks for (GLIBC_ABI_DT_RELR: 2.36). linux_ARCH otherwise.
glibc_libs=' libc.so.6 libm.so.6 libdl.so.2 librt.so.1 libpthread.so.0 libresolv.so.2 libutil.so.1 libnsl.so.1 ld-linux-x86-64.so.2 ld-linux-aarch64.so.1 '
newest=0 others= arch=
for p in $programs; do
  f=$venv/bin/$p
  if [ "$(head -c4 "$f" | od -An -c | tr -d ' ')" = '177ELF' ] && [ -x "$f" ]; then
    ok "$p is in the environment's bin/ as the program itself (ELF), not a wrapper"
  else
    bad "$p in the environment's bin/ is not the ELF program"; continue
  fi
  objdump -p "$f" >"$work/objdump.txt"
  needed=$(awk '$1 == "NEEDED" {print $2}' "$work/objdump.txt" | tr '\n' ' ')
  case " $needed" in *" libstdc++"*|*" libgcc_s"*) bad "$p loads the C++ runtime ($needed): it must be linked in" ;;
    *) ok "$p links the C++ runtime in (loads: $needed)" ;; esac
  for lib in $needed; do [[ $glibc_libs == *" $lib "* ]] || others+="$p:$lib "; done
  for v in $(sed -n '/^Version References:/,$p' "$work/objdump.txt" | grep -o 'GLIBC_[A-Z0-9_.]*' | sort -u); do
    case $v in GLIBC_ABI_DT_RELR) m=36 ;; GLIBC_2.*) m=${v#GLIBC_2.}; m=${m%%.*} ;; *) others+="$p:$v "; m=0 ;; esac
    ((m > newest)) && newest=$m
  done
  case $(objdump -f "$f" | sed -n 's/^architecture: \([^,]*\).*/\1/p') in
    i386:x86-64) arch=x86_64 ;; aarch64) arch=aarch64 ;; *) arch=unknown ;;
  esac
done
if [ -z "$others" ]; then proved=manylinux_2_${newest}_$arch; else proved=linux_$arch; fi
[ "$tag" = "$proved" ] && ok "objdump proves the tag: $tag (NEEDED glibc only: $([ -z "$others" ] && echo yes || echo "no, $others"); newest GLIBC_2.$newest)" ||
  bad "the wheel claims $tag, the binaries earn $proved (others: ${others:-none}, newest GLIBC_2.$newest)"
if "$python" -c 'import sys, zipfile; sys.exit(any(".so" in n.rsplit("/", 1)[-1] for n in zipfile.ZipFile(sys.argv[1]).namelist()))' "$wheel"; then
  ok "the wheel bundles no shared library (no NCCL, no CUDA)"
else
  bad "the wheel holds a shared library"
fi

# ---- using it: the hook, a DDP job, python -m ddprun ------------------------------------------
export PATH=$venv/bin:$PATH  # as `source venv/bin/activate` does
hook=$venv/share/ddprun/python/sitecustomize.py
cat >"$work/probe.py" <<'PY'
import hashlib, sys
import sitecustomize
print("PROBE", sys.prefix, hashlib.sha256(open(sitecustomize.__file__, "rb").read()).hexdigest())
PY
want="PROBE $venv $(sha256sum "$hook" 2>/dev/null | cut -d' ' -f1)"
got=$(cd "$work" && timeout 60 "$venv/bin/ddprun" --standalone --log_level warn "$work/probe.py" 2>&1 | sed -n 's/^\[default0\]://; /^PROBE /p')
[ -f "$hook" ] && [ "$got" = "$want" ] &&
  ok "the hook is at bin/../share/ddprun/python, and ddprun's Python workers (the environment's python3) load it" ||
  bad "the hook: want '$want', got '$got'"

# ddprun.state: the package beside the hook, which the workers import, is the one pip installed.
cat >"$work/state_probe.py" <<'PY'
import hashlib, os, sys, sysconfig
import ddprun.state
installed = os.path.join(sysconfig.get_paths()["purelib"], "ddprun", "state.py")
same = hashlib.sha256(open(ddprun.state.__file__, "rb").read()).digest() == hashlib.sha256(open(installed, "rb").read()).digest()
print("STATE", os.path.dirname(os.path.dirname(ddprun.state.__file__)), same, ddprun.state.available(), ddprun.state.load())
PY
got=$(cd "$work" && timeout 60 "$venv/bin/ddprun" --standalone --log_level warn "$work/state_probe.py" 2>&1 | sed -n 's/^\[default0\]://; /^STATE /p')
[ "$got" = "STATE $venv/share/ddprun/python True True None" ] &&
  ok "workers import ddprun.state from beside the hook, the same file as the installed package's, with their state area" ||
  bad "ddprun.state in a worker: want 'STATE $venv/share/ddprun/python True True None', got '$got'"

if (cd "$work" && timeout 240 "$venv/bin/ddprun" --standalone --nproc_per_node=2 --log_level warn \
      "$src/examples/ddp_train.py" --epochs 2 --samples 512) >"$work/ddp.txt" 2>&1 &&
   [ "$(grep -c '^\[default[01]\]:RESULT rank=[01] world=2 ' "$work/ddp.txt")" = 2 ] &&
   [ "$(grep -o 'checksum=[^ ]*' "$work/ddp.txt" | sort -u | wc -l)" = 1 ]; then
  ok "a 2-worker PyTorch gloo DDP job under the environment's ddprun: both ranks end with the same parameters"
else
  bad "the 2-worker DDP job"; tail -30 "$work/ddp.txt"
fi

direct=$("$venv/bin/ddprun" --version 2>&1)
via=$(cd "$work" && "$venv/bin/python" -m ddprun --version 2>&1)
[ -n "$direct" ] && [ "$via" = "$direct" ] && ok "python -m ddprun --version: $(echo "$via" | head -1)" ||
  bad "python -m ddprun --version said '$via', ddprun --version '$direct'"
"$venv/bin/ddprun" --no_such_flag >/dev/null 2>&1; rc_direct=$?
(cd "$work" && "$venv/bin/python" -m ddprun --no_such_flag >/dev/null 2>&1); rc_via=$?
[ "$rc_direct" -ne 0 ] && [ "$rc_via" = "$rc_direct" ] && ok "python -m ddprun exits as ddprun does ($rc_via on a bad flag)" ||
  bad "python -m ddprun exited $rc_via, ddprun $rc_direct"

# ---- pip uninstall leaves nothing of ours ------------------------------------------------------
"$venv/bin/pip" uninstall -y ddprun >"$work/uninstall.log" 2>&1 || { bad "pip uninstall -y ddprun"; cat "$work/uninstall.log"; }
snapshot >"$work/after.txt"
# pip removes every file it installed, and the folders that held them, but not the folders above
# those (share/ddprun above share/ddprun/python): empty folders may stay, files may not (every
# file under a folder left behind would be listed itself).
left=$(comm -13 "$work/before.txt" "$work/after.txt" | while read -r p; do [ -d "$venv/$p" ] || echo "$p"; done)
gone=$(comm -23 "$work/before.txt" "$work/after.txt")
if [ -z "$left$gone" ]; then
  ok "pip uninstall -y ddprun leaves no file of ours (empty folders left: $(comm -13 "$work/before.txt" "$work/after.txt" | tr '\n' ' '))"
else
  bad "pip uninstall left files (${left:-none}) or removed others (${gone:-none})"
fi
finish
