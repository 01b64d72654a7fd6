# The one library of the shell tests: sourced first by each of them.
#   ok TEXT      a check that held
#   bad TEXT     a check that failed (the test goes on, and fails at `finish`)
#   skip TEXT    the whole test cannot run here: exit 77, which ctest shows as skipped
#                (SKIP_RETURN_CODE); under CI=true a skip is a failure (exit 1), since CI
#                installs every tool a test needs (scripts/setup.sh)
#   need CMD...  skip unless every command is on PATH
#   finish       prints "NAME: N passed, M failed" and exits non-zero if any failed or none ran
# A test never skips part of itself and passes: what it cannot check, it skips whole.
# Usage: source "$(dirname "$0")/lib.sh"   (tests under tests/ subfolders: ../lib.sh)
passed=0
failed=0
test_name=$(basename "$0" .sh)

ok() { echo "ok: $1"; passed=$((passed + 1)); }
bad() { echo "FAILED: $1"; failed=$((failed + 1)); }

skip() {
  if [ "${CI:-}" = true ] || [ "${CI:-}" = 1 ]; then
    echo "FAILED: CI=true and this test cannot run: $1"
    exit 1
  fi
  echo "SKIP: $1"
  exit 77
}

need() {
  local c
  for c in "$@"; do
    command -v "$c" >/dev/null 2>&1 || skip "needs $c (scripts/setup.sh installs it)"
  done
}

finish() {
  echo "$test_name: $passed passed, $failed failed"
  [ "$failed" -eq 0 ] && [ "$passed" -gt 0 ]
  exit
}
