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

# Executions per target in the gate: 15-20 s each on this project's 2-core AMD machines, 50-90 s
# on its slower Intel ones (2026-12-03).
gate_runs() {
  case "$1" in
    config) echo 300000 ;;
    proxy_header) echo 30000000 ;;
    *) echo 3000000 ;;
  esac
}

log "building ${targets[*]} (stable, no sanitizer)"
built_since=$SECONDS
# 16 codegen units, not cargo-fuzz's 1: every crate of the tree is built again with the coverage
# instrumentation, and with one unit a crate keeps one core busy however many the machine has.
for target in "${targets[@]}"; do cargo fuzz build -s none --codegen-units 16 "$target"; done
log "built in $((SECONDS - built_since)) s"

# One target: fuzzes it, writes its line of the summary to target/fuzz-<target>.result, and
# fails if it crashed.
fuzz_one() {
  local target=$1 corpus bound what out status runs took
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
  cargo fuzz run -s none --codegen-units 16 "$target" "$corpus" -- \
    "${bound[@]}" -max_len=16384 -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    >"$out" 2>&1
  status=$?
  set -e
  runs=$(sed -n 's/^stat::number_of_executed_units: *\([0-9]*\).*/\1/p' "$out" | tail -1)
  [ -n "$runs" ] || runs=$(sed -n 's/^Done \([0-9]*\) runs in.*/\1/p' "$out" | tail -1)
  took=$(sed -n 's/^Done [0-9]* runs in \([0-9]*\) second.*/\1/p' "$out" | tail -1)
  if [ "$status" = 0 ]; then
    echo "$target: ${runs:-?} executions ($what, ${took:-?} s), 0 crashes" >"target/fuzz-$target.result"
    return 0
  fi
  echo "$target: CRASHED after ${runs:-?} executions ($what, exit $status)" >"target/fuzz-$target.result"
  log "$target crashed; libFuzzer said:"
  grep -E "panicked|ERROR|assert|Test unit written|Base64" "$out" | head -20 >&2 || tail -30 "$out" >&2
  return 1
}

# Targets side by side, one per core (FUZZ_JOBS): libFuzzer runs a target on one thread, and a
# gate's fixed seed and number of executions give the same run whatever else is running.
jobs_max="${FUZZ_JOBS:-$(nproc)}"
for target in "${targets[@]}"; do
  rm -f "target/fuzz-$target.result"
  while [ "$(jobs -rp | wc -l)" -ge "$jobs_max" ]; do wait -n || true; done
  fuzz_one "$target" &
done
wait
# A target's verdict is its result file: CRASHED, or none when the run itself failed.
failed=0
for target in "${targets[@]}"; do
  if [ -f "target/fuzz-$target.result" ]; then
    grep -q CRASHED "target/fuzz-$target.result" && failed=1
    log "$(cat "target/fuzz-$target.result")"
  else
    failed=1
    log "$target: no result (see target/fuzz-$target.log)"
  fi
done
exit "$failed"
