#!/usr/bin/env bash
# Runs scripts/test-libtorch2.sh against stub debootstrap, mount, findmnt and chroot, so that
# every CI run takes the branch a brand-new machine takes (no chroot yet, nothing mounted) and
# the branches of later runs (cached chroot, changed package list, mounts left by a killed run).
# Usage: libtorch2_setup_test.sh [path of test-libtorch2.sh]
# shellcheck disable=SC2016  # the stubs' bodies are single-quoted to expand when they run
set -euo pipefail
SCRIPT=${1:-$(cd "$(dirname "$0")/../.." && pwd)/scripts/test-libtorch2.sh}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
STUBS=$WORK/bin
ROOT=$WORK/cache/trixie
LOG=$WORK/calls.log
MOUNTS=$WORK/mounts  # what the stub mount table holds, one target per line
mkdir -p "$STUBS"
: >"$MOUNTS"

stub() {  # stub NAME BODY: a command that logs its arguments, then runs BODY
  printf '#!/usr/bin/env bash\necho "%s $*" >>"%s"\n%s\n' "$1" "$LOG" "$2" >"$STUBS/$1"
  chmod +x "$STUBS/$1"
}
stub debootstrap 'mkdir -p "$3/etc" "$3/proc" "$3/sys" "$3/dev" "$3/usr/bin"'
stub mount 'echo "${@: -1}" >>"'"$MOUNTS"'"'
stub umount 'grep -vxF -- "${@: -1}" "'"$MOUNTS"'" >"'"$MOUNTS"'.new" || true; mv "'"$MOUNTS"'.new" "'"$MOUNTS"'"'
stub mountpoint 'grep -qxF -- "${@: -1}" "'"$MOUNTS"'"'
stub findmnt 'printf "/\n/proc\n"; cat "'"$MOUNTS"'"'
stub chroot 'exit 0'
stub sudo 'exec "$@"'

run() {  # run [ARGS...]: the script with the stubs first on PATH; its exit status
  : >"$LOG"
  local rc=0
  PATH="$STUBS:$PATH" PIPETRAIN_TRIXIE_ROOT="$ROOT" bash "$SCRIPT" "$@" >"$WORK/out" 2>&1 || rc=$?
  return $rc
}
fail() {
  echo "FAIL: $*"
  echo "--- script output"; cat "$WORK/out"
  echo "--- calls"; cat "$LOG"
  exit 1
}
calls() { grep -c "^$1 " "$LOG" || true; }
leftover_mounts() { grep -c -F -- "$ROOT" "$MOUNTS" || true; }

# 1. A brand-new machine: no chroot, nothing of it mounted.
run || fail "fresh machine: exit status $?"
[ "$(calls debootstrap)" = 1 ] || fail "fresh machine: debootstrap ran $(calls debootstrap) times, expected 1"
grep -q "^debootstrap --variant=minbase trixie $ROOT " "$LOG" || fail "fresh machine: debootstrap arguments"
grep -q "^chroot $ROOT .*apt-get install .*libtorch-dev" "$LOG" || fail "fresh machine: no package install in the chroot"
grep -q "ctest --test-dir /build" "$LOG" || fail "fresh machine: the suite did not run in the chroot"
[ -f "$ROOT/.pipetrain-ready" ] || fail "fresh machine: the chroot was not marked ready"
[ "$(leftover_mounts)" = 0 ] || fail "fresh machine: mounts left after exit: $(cat "$MOUNTS")"
echo "ok: fresh machine"

# 2. The cached chroot: neither debootstrap nor the package install run again.
run || fail "cached chroot: exit status $?"
[ "$(calls debootstrap)" = 0 ] || fail "cached chroot: debootstrap ran again"
if grep -q "apt-get install" "$LOG"; then fail "cached chroot: packages installed again"; fi
grep -q "ctest --test-dir /build" "$LOG" || fail "cached chroot: the suite did not run"
echo "ok: cached chroot"

# 3. A changed package list: the install runs again, debootstrap does not.
echo "an older package list" >"$ROOT/.pipetrain-ready"
run || fail "changed package list: exit status $?"
[ "$(calls debootstrap)" = 0 ] || fail "changed package list: debootstrap ran"
grep -q "apt-get install" "$LOG" || fail "changed package list: no install"
echo "ok: changed package list"

# 4. A run killed during its install left mounts and no ready mark: the mounts under the root
#    (and only those) are taken down before the root is made again.
rm "$ROOT/.pipetrain-ready"
printf '%s\n' "$ROOT/proc" "$ROOT/src" "${ROOT}2" >>"$MOUNTS"
run || fail "mounts left behind: exit status $?"
grep -q "^umount -l $ROOT/src" "$LOG" || fail "mounts left behind: $ROOT/src not unmounted"
grep -q "^umount -l $ROOT/proc" "$LOG" || fail "mounts left behind: $ROOT/proc not unmounted"
if grep -q "^umount -l ${ROOT}2\$" "$LOG"; then fail "mounts left behind: unmounted ${ROOT}2, which is not under the root"; fi
[ "$(calls debootstrap)" = 1 ] || fail "mounts left behind: debootstrap did not run"
echo "ok: mounts left behind"

# 5. --prepare (scripts/test.sh runs it beside the first suite) on a brand-new machine: the
#    chroot and its packages, no build or test, no mounts left; the run after it only tests.
rm -rf "$ROOT"
: >"$MOUNTS"
run --prepare || fail "prepare: exit status $?"
[ "$(calls debootstrap)" = 1 ] || fail "prepare: debootstrap ran $(calls debootstrap) times, expected 1"
grep -q "^chroot $ROOT .*apt-get install .*libtorch-dev" "$LOG" || fail "prepare: no package install"
if grep -q "ctest" "$LOG"; then fail "prepare: the suite ran"; fi
[ -f "$ROOT/.pipetrain-ready" ] || fail "prepare: the chroot was not marked ready"
[ "$(leftover_mounts)" = 0 ] || fail "prepare: mounts left after exit: $(cat "$MOUNTS")"
run || fail "after prepare: exit status $?"
[ "$(calls debootstrap)" = 0 ] || fail "after prepare: debootstrap ran again"
if grep -q "apt-get install" "$LOG"; then fail "after prepare: packages installed again"; fi
grep -q "ctest --test-dir /build" "$LOG" || fail "after prepare: the suite did not run"
echo "ok: prepare, then test"
echo "all libtorch2 setup cases passed"
