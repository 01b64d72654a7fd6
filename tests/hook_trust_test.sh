#!/usr/bin/env bash
# ddprun's progress hook (its sitecustomize for Python workers) cannot be planted, and runs once
# (README: Security). Runs in private mount and pid namespaces, /tmp a fresh tmpfs (mode 1777).
#  1. ddprun in /tmp/bin: `nobody` creates /tmp/share/ddprun/python/sitecustomize.py; root's
#     Python workers must not run it, and ddprun says why it left the hook out;
#  2. the same hook made by root there is used; made group-writable, it is refused;
#  3. two installs nested (a ddprun of another install inside a worker), and one install reached
#     through a symbolic link: no RecursionError, one finder on sys.meta_path, the user's own
#     sitecustomize runs exactly once, and `import sitecustomize` works.
# Usage: tests/hook_trust_test.sh DDPRUN SITECUSTOMIZE_PY
set -u
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/private_ns.sh" "$1" "$2" -- "$0" "$@"
hook_src=/tmp/bin/$(basename "$2")
need /usr/bin/python3 setpriv
export PYTHON_EXEC=/usr/bin/python3
as_nobody() { setpriv --reuid=nobody --regid=nogroup --clear-groups "$@"; }
cat >/tmp/probe.py <<'PY'
import sys
try:
    import sitecustomize  # a script may import it (a RecursionError here was exit 1)
    where = getattr(sitecustomize, "__file__", "?")
except ImportError:
    where = "none"
finders = [f for f in sys.meta_path if type(f).__name__ == "_Finder"]
print("PROBE finders=%d hook=%s" % (len(finders), where), flush=True)
PY

# 1. Planted by nobody beside a binary whose parent (/tmp) anyone can write to.
as_nobody mkdir -p /tmp/share/ddprun/python
as_nobody sh -c 'echo "open(\"/tmp/planted-ran\", \"w\").write(\"ran\")" > /tmp/share/ddprun/python/sitecustomize.py'
/tmp/bin/ddprun --standalone --nproc_per_node=1 /tmp/probe.py >/tmp/planted.log 2>&1
rc=$?
if [ ! -e /tmp/planted-ran ] && [ $rc -eq 0 ] && grep -q "not giving Python workers the progress hook" /tmp/planted.log &&
   grep -q "uid 65534" /tmp/planted.log; then
  ok "a hook planted by nobody in /tmp/share is not run by root's workers, and ddprun says why"
else
  bad "planted hook: ran=$([ -e /tmp/planted-ran ] && echo yes || echo no), exit $rc: $(cat /tmp/planted.log)"
fi
rm -rf /tmp/share /tmp/planted-ran

# 2. Root's own copy there is used; group-writable, it is not.
mkdir -p /tmp/share/ddprun/python && cp "$hook_src" /tmp/share/ddprun/python/sitecustomize.py
/tmp/bin/ddprun --standalone --nproc_per_node=1 /tmp/probe.py >/tmp/trusted.log 2>&1
grep -q "PROBE finders=1 hook=/tmp/share/ddprun/python/sitecustomize.py" /tmp/trusted.log &&
  ! grep -q "not giving" /tmp/trusted.log && ok "root's hook in /tmp/share (a sticky /tmp above it) is used" ||
  bad "root's own hook: $(cat /tmp/trusted.log)"
chmod 775 /tmp/share/ddprun/python
/tmp/bin/ddprun --standalone --nproc_per_node=1 /tmp/probe.py >/tmp/groupw.log 2>&1
grep -q "PROBE finders=0" /tmp/groupw.log && grep -q "writable by group or others (mode 0775)" /tmp/groupw.log &&
  ok "a group-writable hook directory is refused, with its mode named" || bad "group-writable: $(cat /tmp/groupw.log)"
rm -rf /tmp/share

# 3. Two installs, nested; and one reached through a link. The user's sitecustomize counts its runs.
for i in 1 2; do
  mkdir -p /tmp/i$i/bin /tmp/i$i/share/ddprun/python
  cp /tmp/bin/ddprun /tmp/i$i/bin/ddprun && cp "$hook_src" /tmp/i$i/share/ddprun/python/sitecustomize.py
done
mkdir /tmp/user && echo 'open("/tmp/user-ran", "a").write("ran\n")' >/tmp/user/sitecustomize.py
PYTHONPATH=/tmp/user /tmp/i1/bin/ddprun --standalone --nproc_per_node=1 --no_python \
  /tmp/i2/bin/ddprun --standalone --nproc_per_node=2 /tmp/probe.py >/tmp/nested.log 2>&1
rc=$?
runs=$(grep -c ran /tmp/user-ran 2>/dev/null || echo 0)
if [ $rc -eq 0 ] && [ "$(grep -c 'PROBE finders=1 hook=/tmp/i2/' /tmp/nested.log)" = 2 ] && [ "$runs" = 2 ] &&
   ! grep -q RecursionError /tmp/nested.log; then
  ok "two installs nested: one hook per worker, the user's sitecustomize ran once in each of the 2 workers"
else
  bad "nested installs: exit $rc, user's sitecustomize ran $runs times (want 2): $(tail -c 1500 /tmp/nested.log)"
fi
rm -f /tmp/user-ran
ln -s /tmp/i1 /tmp/i1-link
PYTHONPATH=/tmp/i1-link/share/ddprun/python:/tmp/i1/share/ddprun/python:/tmp/user /usr/bin/python3 /tmp/probe.py \
  >/tmp/linked.log 2>&1
rc=$?
runs=$(grep -c ran /tmp/user-ran 2>/dev/null || echo 0)
[ $rc -eq 0 ] && grep -q "PROBE finders=1" /tmp/linked.log && [ "$runs" = 1 ] &&
  ok "one install on the path twice (once through a link): one hook, the user's sitecustomize ran once" ||
  bad "linked install: exit $rc, user's sitecustomize ran $runs times: $(tail -c 1500 /tmp/linked.log)"
finish
