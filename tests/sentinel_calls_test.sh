#!/bin/sh
# The guardian's sentinel runs in the agent's memory with the agent's thread pointer, so its code
# (agent/src/sentinel_main.cpp) must call nothing outside its own file: no C library function
# (errno, locks, lazy binding through the agent's tables), no stack-protector failure path, no
# sanitizer hook, no memset a compiler made of a zero-initialised aggregate. An object file that
# calls anything outside itself lists it as an undefined symbol. It must also be the code that
# calls the kernel itself (a `syscall` or `svc` instruction).
# usage: sentinel_calls_test.sh OBJECT...  (the agent library's objects; sentinel_main's is picked)
set -u
command -v nm >/dev/null && command -v objdump >/dev/null ||
  { echo "skip: no nm/objdump (binutils)"; [ "${CI:-}" = true ] && exit 1; exit 77; }
obj=
for list in "$@"; do  # (ctest passes the target's objects as one list: a;b;c)
  old_ifs=$IFS; IFS=';'
  for o in $list; do case "$o" in */sentinel_main.cpp.o) obj=$o ;; esac; done
  IFS=$old_ifs
done
[ -n "$obj" ] && [ -f "$obj" ] || { echo "FAILED: no sentinel_main.cpp.o among the objects given"; exit 1; }
fail=0
undefined=$(nm -u "$obj" | grep -v '_GLOBAL_OFFSET_TABLE_')
if [ -n "$undefined" ]; then
  echo "FAILED: the sentinel's code calls outside itself:"; echo "$undefined"; fail=1
else
  echo "ok: $(basename "$obj") refers to no symbol outside it"
fi
calls=$(objdump -d "$obj" | grep -cE '\s(syscall|svc\s+#?0x0|svc\s+#0)\b')
if [ "$calls" -ge 1 ]; then echo "ok: it calls the kernel itself ($calls places)"; else echo "FAILED: $calls system call instructions"; fail=1; fi
exit $fail
