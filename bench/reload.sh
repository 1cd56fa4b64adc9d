#!/usr/bin/env bash
# Cost of hot reloads under load: the h1 scenario for aralez twice in a row, without reloads and
# with one reload every 100 ms, printed side by side.
#
#   cargo build --release && sudo bash bench/reload.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PROXIES=aralez SCENARIOS=h1 DURATION="${DURATION:-10}"
row() { grep -E '^\| aralez ' bench/last-run.md | head -1; }
unset RELOAD_MS
bash bench/run.sh >/dev/null
quiet=$(row)
RELOAD_MS=100 RELOAD_CONTENT=same bash bench/run.sh >/dev/null
control=$(row)
RELOAD_MS=100 bash bench/run.sh >/dev/null
loaded=$(row)
field() { echo "$1" | awk -F'|' -v i="$2" '{gsub(/[ ms]/, "", $i); print $i}'; }
printf '| run | req/s | p50 | p99 | CPU us/req |\n| --- | ---: | ---: | ---: | ---: |\n'
printf '| no reloads | %s | %s ms | %s ms | %s |\n' "$(field "$quiet" 3)" "$(field "$quiet" 4)" "$(field "$quiet" 5)" "$(field "$quiet" 6)"
printf '| same writer loop, identical bytes (no reload) | %s | %s ms | %s ms | %s |\n' "$(field "$control" 3)" "$(field "$control" 4)" "$(field "$control" 5)" "$(field "$control" 6)"
printf '| reload every 100 ms | %s | %s ms | %s ms | %s |\n' "$(field "$loaded" 3)" "$(field "$loaded" 4)" "$(field "$loaded" 5)" "$(field "$loaded" 6)"
awk -v a="$(field "$quiet" 5)" -v b="$(field "$loaded" 5)" -v c="$(field "$quiet" 6)" -v d="$(field "$loaded" 6)" -v e="$(field "$control" 5)" \
  'BEGIN { printf "\np99 with reloads / without: %.2f (against the writer-loop control: %.2f); CPU per request with / without: %.2f\n", b / a, b / e, d / c }'
