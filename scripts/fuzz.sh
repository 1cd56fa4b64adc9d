#!/usr/bin/env bash
# Fuzzes the targets of fuzz/ on stable Rust: cargo-fuzz (libFuzzer, coverage-guided) with
# `--sanitizer none`, the mode cargo-fuzz supports on stable. Each target runs FUZZ_SECONDS
# (default 20) from fuzz/seeds/<target> plus what earlier runs kept in target/fuzz-corpus/.
#
#   bash scripts/fuzz.sh            # every target
#   bash scripts/fuzz.sh path jwt   # some
#
# Prints, per target, the executions run and whether it crashed; exits 1 if any target crashed
# (the input is printed and kept in fuzz/artifacts/<target>/; make it a regression test).
# cargo-fuzz comes from scripts/install-judges.sh (ARALEZ_CARGO_FUZZ names its directory).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

log() { printf '[fuzz] %s\n' "$*" >&2; }

seconds="${FUZZ_SECONDS:-20}"
fuzz_bin="${ARALEZ_CARGO_FUZZ:-$PWD/target/judges/cargo-fuzz/bin}"
export PATH="$fuzz_bin:$PATH"
command -v cargo-fuzz >/dev/null 2>&1 || {
  log "cargo-fuzz not found in $fuzz_bin (run scripts/install-judges.sh)"
  exit 1
}
targets=("$@")
[ "${#targets[@]}" -gt 0 ] || targets=(config path request_head jwt proxy_header)

log "building ${targets[*]} (stable, no sanitizer)"
for target in "${targets[@]}"; do cargo fuzz build -s none "$target"; done

failed=0
summary=()
for target in "${targets[@]}"; do
  corpus="target/fuzz-corpus/$target"
  mkdir -p "$corpus"
  cp -n fuzz/seeds/"$target"/* "$corpus"/ 2>/dev/null || true
  out="target/fuzz-corpus/$target.log"
  set +e
  cargo fuzz run -s none "$target" "$corpus" -- \
    -max_total_time="$seconds" -max_len=16384 -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    >"$out" 2>&1
  status=$?
  set -e
  runs=$(sed -n 's/^Done \([0-9]*\) runs in.*/\1/p' "$out" | tail -1)
  [ -n "$runs" ] || runs=$(sed -n 's/^stat::number_of_executed_units: *\([0-9]*\).*/\1/p' "$out" | tail -1)
  if [ "$status" = 0 ]; then
    summary+=("$target: ${runs:-?} executions in ${seconds}s, 0 crashes")
  else
    failed=1
    summary+=("$target: CRASHED after ${runs:-?} executions (exit $status)")
    log "$target crashed; libFuzzer said:"
    grep -E "panicked|ERROR|assert|Test unit written|Base64" "$out" | head -20 >&2 || tail -30 "$out" >&2
  fi
done
for line in "${summary[@]}"; do log "$line"; done
exit "$failed"
