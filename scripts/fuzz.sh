#!/usr/bin/env bash
# Fuzzes the targets of fuzz/ on stable Rust: cargo-fuzz (libFuzzer, coverage-guided) with
# `--sanitizer none`, the mode cargo-fuzz supports on stable.
#
#   bash scripts/fuzz.sh                      # the gate: every target, reproducible
#   bash scripts/fuzz.sh path jwt             # some targets
#   FUZZ_SECONDS=600 bash scripts/fuzz.sh jwt # explore: 10 minutes, random seed, corpus kept
#
# Two modes:
# - gate (the default, what the test command runs): a fixed seed and a fixed number of executions
#   per target, from a fresh copy of fuzz/seeds/<target>. libFuzzer is deterministic then, so a
#   tree that passes here passes the same way in CI: the test command is a gate, not a lottery.
#   A time bound (FUZZ_GATE_MAX_SECONDS, 120) keeps a slow machine from running long.
# - explore (FUZZ_SECONDS set): a random seed for that many seconds per target, growing the corpus
#   in target/fuzz-corpus/<target> from run to run. Run it before a change lands; what it finds
#   becomes a seed in fuzz/seeds/<target> (so the gate replays it) and a regression test.
#
# Prints, per target, the executions run and whether it crashed; exits 1 if any target crashed
# (the input is printed and kept in fuzz/artifacts/<target>/).
# cargo-fuzz comes from scripts/install-judges.sh (ARALEZ_CARGO_FUZZ names its directory).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

log() { printf '[fuzz] %s\n' "$*" >&2; }

fuzz_bin="${ARALEZ_CARGO_FUZZ:-$PWD/target/judges/cargo-fuzz/bin}"
export PATH="$fuzz_bin:$PATH"
command -v cargo-fuzz >/dev/null 2>&1 || {
  log "cargo-fuzz not found in $fuzz_bin (run scripts/install-judges.sh)"
  exit 1
}
targets=("$@")
[ "${#targets[@]}" -gt 0 ] || targets=(config path request_head jwt proxy_header)

# Executions per target in the gate: about 20 s each on this project's 2-core machines.
gate_runs() {
  case "$1" in
    config) echo 300000 ;;
    proxy_header) echo 30000000 ;;
    *) echo 3000000 ;;
  esac
}

log "building ${targets[*]} (stable, no sanitizer)"
for target in "${targets[@]}"; do cargo fuzz build -s none "$target"; done

failed=0
summary=()
for target in "${targets[@]}"; do
  if [ -n "${FUZZ_SECONDS:-}" ]; then
    corpus="target/fuzz-corpus/$target"
    mkdir -p "$corpus"
    bound=(-max_total_time="$FUZZ_SECONDS")
    what="explore, ${FUZZ_SECONDS}s"
  else
    corpus="target/fuzz-gate/$target"
    rm -rf "$corpus"
    mkdir -p "$corpus"
    bound=(-seed=1 -runs="$(gate_runs "$target")" -max_total_time="${FUZZ_GATE_MAX_SECONDS:-120}")
    what="gate, seed 1"
  fi
  cp -n fuzz/seeds/"$target"/* "$corpus"/ 2>/dev/null || true
  out="target/fuzz-$target.log"
  set +e
  cargo fuzz run -s none "$target" "$corpus" -- \
    "${bound[@]}" -max_len=16384 -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    >"$out" 2>&1
  status=$?
  set -e
  runs=$(sed -n 's/^stat::number_of_executed_units: *\([0-9]*\).*/\1/p' "$out" | tail -1)
  [ -n "$runs" ] || runs=$(sed -n 's/^Done \([0-9]*\) runs in.*/\1/p' "$out" | tail -1)
  if [ "$status" = 0 ]; then
    summary+=("$target: ${runs:-?} executions ($what), 0 crashes")
  else
    failed=1
    summary+=("$target: CRASHED after ${runs:-?} executions ($what, exit $status)")
    log "$target crashed; libFuzzer said:"
    grep -E "panicked|ERROR|assert|Test unit written|Base64" "$out" | head -20 >&2 || tail -30 "$out" >&2
  fi
done
for line in "${summary[@]}"; do log "$line"; done
exit "$failed"
