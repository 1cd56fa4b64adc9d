#!/usr/bin/env bash
# Runs the whole test suite. On a fresh Debian machine run as root: it installs what it needs.
#
#   bash scripts/test.sh
#
# Every test drives the compiled `aralez` binary or its library over real sockets on 127.0.0.1.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

log() { printf '[test] %s\n' "$*" >&2; }
# How long each phase took, printed at the end: the suite must stay under 30 minutes in CI.
phases=()
phase_start=$SECONDS
phase_done() {
  phases+=("$1 $((SECONDS - phase_start)) s")
  phase_start=$SECONDS
}

need_apt=()
command -v cc >/dev/null 2>&1 || need_apt+=(build-essential)
command -v curl >/dev/null 2>&1 || need_apt+=(curl ca-certificates)
command -v pkg-config >/dev/null 2>&1 || need_apt+=(pkg-config)
if [ "${#need_apt[@]}" -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    log "installing: ${need_apt[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${need_apt[@]}" >/dev/null
  else
    log "missing: ${need_apt[*]} (run as root to install them)"
    exit 1
  fi
fi

# Rust from rustup when cargo is missing or older than Cargo.toml's rust-version (never Debian's
# cargo package: 1.63 on Debian 12 cannot build this crate).
source scripts/rust-toolchain.sh
ensure_rust || {
  log "no Rust toolchain $(rust_needed) or newer, and rustup could not install one"
  exit 1
}

# The external judges of tests/judges.rs (sslyze, testssl.sh, h2spec): installed when missing, and
# required, so a judge that cannot run fails the suite instead of being skipped.
if ! judges=$(bash scripts/install-judges.sh); then
  log "could not install the external judges (see [judges] above); rerun as root or install them by hand"
  exit 1
fi
while IFS="=" read -r name value; do export "$name=$value"; done <<<"$judges"
export ARALEZ_REQUIRE_JUDGES=1
phase_done "setup (toolchain, judges):"

log "cargo $(cargo --version | cut -d' ' -f2): building and running every test"
# Tests start several proxies and backends at once; two cores are plenty, more threads only add noise.
export RUST_TEST_THREADS="${RUST_TEST_THREADS:-4}"
# A one-off build (CI, a fresh clone) gains nothing from incremental caches but their ~2.5 GB.
if [ -n "${CI:-}" ]; then export CARGO_INCREMENTAL=0; fi
mkdir -p target
# The binary without the default features (Cargo.toml's [features]) for tests/features.rs, copied
# aside before the suite's build puts the full one in its place (about 1.7 min of building here).
# A failed build is the test's failure, not the script's: the suite still runs.
if cargo build --locked --no-default-features --bin aralez; then
  mkdir -p target/no-default-features
  cp "${CARGO_TARGET_DIR:-target}/debug/aralez" target/no-default-features/aralez
  export ARALEZ_NO_DEFAULT_FEATURES_BIN="$PWD/target/no-default-features/aralez"
else
  log "cargo build --no-default-features failed: tests/features.rs will fail"
fi
set +e
cargo test --all-targets --locked --no-fail-fast 2>&1 | tee target/test-output.txt
status=${PIPESTATUS[0]}
set -e
phase_done "tests (build and run):"

# Fuzzing (cargo-fuzz on stable): the reproducible gate of scripts/fuzz.sh, a fixed seed and number of
# executions per target; a crash fails the run. FUZZ_SECONDS=N switches it to exploring instead.
log "fuzzing: config, path, request_head, jwt, proxy_header"
set +e
bash scripts/fuzz.sh 2>&1 | tee target/fuzz-output.txt
fuzz_status=${PIPESTATUS[0]}
set -e
phase_done "fuzzing (build and gate):"

# One closing line for the whole run, summed over every test binary.
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($i ~ /^passed/) p += $(i-1); if ($i ~ /^failed/) f += $(i-1); if ($i ~ /^ignored/) s += $(i-1) } }
     END { printf "all tests: %d passed, %d failed, %d skipped\n", p, f, s }' target/test-output.txt
grep -E '^\[fuzz\] [a-z_]+: ' target/fuzz-output.txt || echo "fuzzing: no result (see target/fuzz-output.txt)"
printf 'time: '
printf '%s; ' "${phases[@]}"
printf 'total %d s\n' "$SECONDS"
[ "$status" = 0 ] || exit "$status"
exit "$fuzz_status"
