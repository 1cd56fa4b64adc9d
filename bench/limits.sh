#!/usr/bin/env bash
# Shared limits (issue 18): CPU per request of aralez with a rate limit that never triggers,
# counted in Redis (`limits_store`) against the same limit counted in the process alone.
#
#   cargo build --release && bash bench/limits.sh
#
# wrk -t1 -c32, HTTP/1.1 keep-alive, one client address, `rate_limit: 10000000` on the route;
# the nginx backend answers `return 200`. Each aralez alone on PROXY_CPU, wrk and the backend on
# LOAD_CPU, Redis (Debian's redis-server) beside them; Redis's own CPU is reported apart.
# Env knobs: DURATION (10), ROUNDS (3), BASE_PORT (18280, 4 ports), PROXY_CPU / LOAD_CPU (0 / 1),
# ARALEZ_BIN (target/release/aralez). Target: shared <= 1.15x local.
set -euo pipefail

DURATION=${DURATION:-10}
ROUNDS=${ROUNDS:-3}
BASE_PORT=${BASE_PORT:-18280}
PROXY_CPU=${PROXY_CPU:-0}
LOAD_CPU=${LOAD_CPU:-1}
WARMUP=2
OTHER_WARN_PCT=3

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd "$SCRIPT_DIR/.." && pwd)
# shellcheck source=bench/lib.sh
source "$SCRIPT_DIR/lib.sh"

ARALEZ_BIN=${ARALEZ_BIN:-$REPO_ROOT/target/release/aralez}
[[ -x "$ARALEZ_BIN" ]] || die "no aralez binary at $ARALEZ_BIN (cargo build --release)"
ensure_tools nginx wrk curl taskset redis-server
CLK_TCK=$(getconf CLK_TCK)

P_BACKEND=$BASE_PORT P_REDIS=$((BASE_PORT + 3))
declare -A PORT=([local]=$((BASE_PORT + 1)) [shared]=$((BASE_PORT + 2)))
for p in $P_BACKEND $P_REDIS "${PORT[@]}"; do
  port_in_use "$p" && die "port $p is already in use (set BASE_PORT to a free range of 4 ports)"
done
make_run_dir limits

{ nginx_common backend; cat <<CONF
http {
    access_log off;
    keepalive_requests 1000000;
$(nginx_temp_paths backend)
    server { listen 127.0.0.1:$P_BACKEND; location / { return 200 "hello, world"; } }
}
CONF
} >"$TMP/backend.conf"

for name in local shared; do
  dir="$TMP/$name"
  mkdir -p "$dir"
  cat >"$dir/main.yaml" <<CONF
threads: 1
proxy_address_http: "127.0.0.1:${PORT[$name]}"
upstreams_conf: "$dir/upstreams.yaml"
log_level: error
upstream_keepalive_pool_size: 64
pid_file: "$dir/aralez.pid"
upgrade_sock: "$dir/aralez.sock"
CONF
  [[ "$name" == shared ]] && echo "limits_store: \"redis://127.0.0.1:$P_REDIS/0\"" >>"$dir/main.yaml"
  cat >"$dir/upstreams.yaml" <<CONF
upstreams:
  127.0.0.1:
    paths:
      "/":
        healthcheck: false
        rate_limit: 10000000
        servers: ["127.0.0.1:$P_BACKEND"]
CONF
done

declare -A ROUNDS_CPU RPS_OF
REDIS_TICKS=""
measure() {  # measure PROXY
  local proxy=$1 out="$TMP/load/$1.txt" url="http://127.0.0.1:${PORT[$1]}/"
  start_bg "$proxy" "$PROXY_CPU" "$ARALEZ_BIN" -c "$TMP/$proxy/main.yaml"
  local pid=$LAST_PID
  WANT_BODY="hello, world" wait_ok "$proxy" "$url" 1.1 "$pid"
  run_wrk "$url" "$WARMUP" "$TMP/load/warmup.txt"
  window_start "$pid" "$BACKEND_PID"
  local redis0
  redis0=$(cpu_ticks "$REDIS_PID" | awk '{print $1 + $2}')
  run_wrk "$url" "$DURATION" "$out"
  window_end
  local redis_ticks=$(( $(cpu_ticks "$REDIS_PID" | awk '{print $1 + $2}') - redis0 ))
  parse_wrk "$out"
  ((BAD == 0)) || { cat "$out" >&2; die "$proxy: $BAD non-2xx answers (the limit must never trigger)"; }
  local us
  us=$(us_per_req "$W_TICKS" "$OK")
  ROUNDS_CPU[$proxy]+="$us "
  RPS_OF[$proxy]+="$RPS "
  [[ "$proxy" == shared ]] && REDIS_TICKS+="$redis_ticks "
  stop_started "$pid"
  log "$proxy: $RPS req/s, $us us/req (user $W_USER, sys $W_SYS ticks), Redis $redis_ticks ticks, other CPU ${OTHER_PCT}%"
}

BUSY_PCT=$(busy_pct_1s)
((BUSY_PCT <= 5)) || log "WARNING: the machine was ${BUSY_PCT}% busy before the run"
start_bg backend "$LOAD_CPU" nginx -p "$TMP/backend" -e "$TMP/backend/error.log" -c "$TMP/backend.conf"
BACKEND_PID=$LAST_PID
start_bg redis "$LOAD_CPU" redis-server --port "$P_REDIS" --bind 127.0.0.1 --save "" --appendonly no
REDIS_PID=$LAST_PID
WANT_BODY="hello, world" wait_ok backend "http://127.0.0.1:$P_BACKEND/" 1.1 "$BACKEND_PID"

for ((round = 0; round < ROUNDS; round++)); do
  for proxy in $(rotate "$round" local shared); do measure "$proxy"; done
done

on=$(median ${ROUNDS_CPU[shared]}) off=$(median ${ROUNDS_CPU[local]})
cat <<CONF

## Shared limits: CPU us per request (median of $ROUNDS rounds of ${DURATION} s, wrk -t1 -c32)

$(date -u '+%Y-%m-%d %H:%M UTC'), aralez $(cd "$REPO_ROOT" && git rev-parse --short HEAD 2>/dev/null || echo unknown), $(nproc) cores, $(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo), $(redis-server --version | awk '{print $1, $2, $3}')

| rate_limit counted | aralez us/req | shared / local (target <= 1.15) |
| --- | ---: | ---: |
| in the process (local) | $off | |
| in Redis (limits_store) | $on | $(ratio "$on" "$off") |

Per round (us/req): local ${ROUNDS_CPU[local]}/ shared ${ROUNDS_CPU[shared]}; req/s local ${RPS_OF[local]}/ shared ${RPS_OF[shared]}; Redis CPU ticks per shared window: $REDIS_TICKS
CONF
