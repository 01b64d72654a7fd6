# Sourced by the tests that could kill or delete (README: Tests), after tests/lib.sh: runs the
# calling script again inside private mount and pid namespaces (unshare -m -p -f --mount-proc)
# with its own tmpfs on /tmp and on /dev/shm (where ddprun's temporary directories go: what one
# leaves is seen, and nothing of the machine's is there to be damaged).
# The tmpfs hides everything below /tmp and /dev/shm, the checkout and the build too when they
# live there (a clone in /tmp). So what the test uses from them is kept open across the mounts
# and copied into /tmp/bin: the ddprun under test as /tmp/bin/ddprun, each FILE under its own
# name with its own mode. The script itself is read through the descriptor bash holds, and
# tests/lib.sh is sourced before the mounts; anything else of the checkout's, the test names
# here and uses from /tmp/bin. The test runs in /tmp.
# Skips visibly (exit 77) where the namespaces cannot be made, and fails instead under CI=true.
# Usage: source private_ns.sh DDPRUN [FILE...] -- "$0" "$@"
declare -F skip >/dev/null || { echo "private_ns.sh: source tests/lib.sh first" >&2; exit 1; }
ns_files=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do ns_files+=("$1"); shift; done
[ "${1:-}" = -- ] && [ $# -ge 2 ] || { echo "private_ns.sh: usage: source private_ns.sh DDPRUN [FILE...] -- \"\$0\" \"\$@\"" >&2; exit 1; }
shift
if [ "${DDPRUN_IN_PRIVATE_NS:-}" != 1 ]; then
  [ "$(id -u)" -eq 0 ] || skip "this needs root (unshare -m -p, setpriv)"
  unshare -m -p -f --mount-proc true 2>/dev/null || skip "unshare -m -p -f --mount-proc is not allowed here"
  script=$1
  shift
  exec env DDPRUN_IN_PRIVATE_NS=1 unshare -m -p -f --mount-proc --propagation private bash "$script" "$@"
fi
# Opened before the mounts: a descriptor still reaches its file when the tmpfs hides its path.
ns_fds=()
for f in "${ns_files[@]}"; do
  exec {fd}<"$f" || { echo "private_ns.sh: cannot read $f" >&2; exit 1; }
  ns_fds+=("$fd")
done
mount -t tmpfs -o size=512m,mode=1777 tmpfs /tmp || skip "cannot mount a tmpfs on /tmp"
mount -t tmpfs -o size=64m,mode=1777 tmpfs /dev/shm || skip "cannot mount a tmpfs on /dev/shm"
mkdir -p /tmp/bin
for i in "${!ns_files[@]}"; do
  name=$(basename "${ns_files[$i]}")
  ((i)) || name=ddprun
  cp "/proc/$$/fd/${ns_fds[$i]}" "/tmp/bin/$name" || { echo "private_ns.sh: cannot copy ${ns_files[$i]}" >&2; exit 1; }
  fd=${ns_fds[$i]}
  exec {fd}<&-
done
chmod 755 /tmp/bin/ddprun
# The test's working directory (ctest's, in the build) may now be hidden too, where a program that
# goes back to $PWD (pyenv's shims do) fails: the test and its programs run in /tmp.
cd /tmp
unset ns_files ns_fds fd f i name
