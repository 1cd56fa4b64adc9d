#!/usr/bin/env bash
# The response cache side by side: CPU per request of a cached hit in aralez (`cache:` block),
# nginx (`proxy_cache`) and HAProxy (its `cache` section), all in front of the same nginx backend;
# and aralez's miss path with the cache on against the same requests with no cache configured.
#
#   cargo build --release && sudo bash bench/cache.sh
#
# Scenarios (wrk -t1 -c32, HTTP/1.1 keep-alive, small answer):
#   hit   GET /hit: the backend says `Cache-Control: max-age=3600`; after the warm-up every request
#         is a hit in every proxy (checked: the backend sees no request during the window)
#   miss  GET /miss: the backend says `Cache-Control: no-store`, so every request goes through the
#         cache's lookup, its fetch and its storability check and on to the backend; aralez with the
#         cache block ("aralez") against aralez without one ("aralez-nocache")
#
# Env knobs: DURATION (10), ROUNDS (3), SCENARIOS ("hit miss"), BASE_PORT (18180, 6 ports), PROXY_CPU / LOAD_CPU (0 / 1),
# ARALEZ_BIN (target/release/aralez). Targets (issue 15): hit CPU <= 0.8x nginx's; miss CPU with
# the cache <= 1.05x without.
set -euo pipefail

DURATION=${DURATION:-10}
ROUNDS=${ROUNDS:-3}
SCENARIOS=${SCENARIOS:-"hit miss"}
BASE_PORT=${BASE_PORT:-18180}
PROXY_CPU=${PROXY_CPU:-0}
LOAD_CPU=${LOAD_CPU:-1}
WARMUP=2
OTHER_WARN_PCT=3
PROXIES="aralez aralez-nocache nginx haproxy"
HAPROXY_MAXCONN=1000

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd "$SCRIPT_DIR/.." && pwd)
# shellcheck source=bench/lib.sh
source "$SCRIPT_DIR/lib.sh"

ARALEZ_BIN=${ARALEZ_BIN:-$REPO_ROOT/target/release/aralez}
[[ -x "$ARALEZ_BIN" ]] || die "no aralez binary at $ARALEZ_BIN (cargo build --release)"
ensure_tools nginx haproxy wrk curl taskset
CLK_TCK=$(getconf CLK_TCK)

P_BACKEND=$BASE_PORT
declare -A PORT=([aralez]=$((BASE_PORT + 1)) [aralez-nocache]=$((BASE_PORT + 2)) [nginx]=$((BASE_PORT + 3)) [haproxy]=$((BASE_PORT + 4)))
for p in $P_BACKEND "${PORT[@]}"; do
  port_in_use "$p" && die "port $p is already in use (set BASE_PORT to a free range of 5 ports)"
done
make_run_dir cache

# ---------------------------------------------------------------- configs
{ nginx_common backend; cat <<EOF
http {
    access_log off;
    keepalive_requests 1000000;
$(nginx_temp_paths backend)
    server {
        listen 127.0.0.1:$P_BACKEND;
        default_type text/plain;
        location /hit { add_header Cache-Control "max-age=3600"; return 200 "hello, world"; }
        location /miss { add_header Cache-Control "no-store"; return 200 "hello, world"; }
    }
}
EOF
} >"$TMP/backend.conf"

# nginx's own cache, in memory as far as it goes: the zone's keys in shared memory, bodies in files
# under $TMP (page cache); `proxy_cache_valid` is not set, so the backend's Cache-Control decides.
mkdir -p "$TMP/nginx/cache"
{ nginx_common nginx; cat <<EOF
http {
    access_log off;
    keepalive_requests 1000000;
$(nginx_temp_paths nginx)
    proxy_cache_path $TMP/nginx/cache levels=1:2 keys_zone=c:16m max_size=64m inactive=1h use_temp_path=off;
    upstream backend { server 127.0.0.1:$P_BACKEND; keepalive 64; }
    server {
        listen 127.0.0.1:${PORT[nginx]};
        location / {
            proxy_pass http://backend;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_cache c;
            add_header X-Cache-Status \$upstream_cache_status;
        }
    }
}
EOF
} >"$TMP/nginx.conf"

cat >"$TMP/haproxy.cfg" <<EOF
global
    nbthread 1
    maxconn $HAPROXY_MAXCONN

defaults
    mode http
    timeout connect 5s
    timeout client 60s
    timeout server 60s
    http-reuse always

cache c
    total-max-size 64
    max-age 3600

frontend fe
    bind 127.0.0.1:${PORT[haproxy]}
    http-request cache-use c
    http-response cache-store c
    default_backend be

backend be
    server b 127.0.0.1:$P_BACKEND
EOF

for name in aralez aralez-nocache; do
  dir="$TMP/$name"
  mkdir -p "$dir"
  cat >"$dir/main.yaml" <<EOF
threads: 1
proxy_address_http: "127.0.0.1:${PORT[$name]}"
upstreams_conf: "$dir/upstreams.yaml"
log_level: error
upstream_keepalive_pool_size: 64
pid_file: "$dir/aralez.pid"
upgrade_sock: "$dir/aralez.sock"
EOF
  [[ "$name" == aralez ]] && printf 'cache:\n  storage: memory\n  mem_size_mb: 64\n' >>"$dir/main.yaml"
  cat >"$dir/upstreams.yaml" <<EOF
upstreams:
  127.0.0.1:
    paths:
      "/":
        healthcheck: false
        servers: ["127.0.0.1:$P_BACKEND"]
EOF
done

launch() {  # launch PROXY
  case "$1" in
    aralez|aralez-nocache) start_bg "$1" "$PROXY_CPU" "$ARALEZ_BIN" -c "$TMP/$1/main.yaml" ;;
    nginx) start_bg nginx "$PROXY_CPU" nginx -p "$TMP/nginx" -e "$TMP/nginx/error.log" -c "$TMP/nginx.conf" ;;
    haproxy) start_bg haproxy "$PROXY_CPU" haproxy -db -f "$TMP/haproxy.cfg" ;;
  esac
  PROXY_PID=$LAST_PID
}

# ---------------------------------------------------------------- one measurement
declare -A ROUNDS_CPU RPS_OF
measure() {  # measure PROXY SCENARIO
  local proxy=$1 sc=$2 url out="$TMP/load/$1-$2.txt"
  url="http://127.0.0.1:${PORT[$proxy]}/$sc"
  launch "$proxy"
  WANT_BODY="hello, world" wait_ok "$proxy" "$url" 1.1 "$PROXY_PID"
  run_wrk "$url" "$WARMUP" "$TMP/load/warmup.txt"
  if [[ "$sc" == hit && "$proxy" != aralez-nocache ]]; then
    # Every request of the window must be a hit: the proxy says so in its status header.
    local status
    status=$(curl -s -D - -o /dev/null "$url" | tr -d '\r' | awk -F': ' 'tolower($1) == "x-cache-status" {print $2}')
    [[ "$proxy" == haproxy || "$status" == HIT ]] || die "$proxy: /hit is not a cache hit after the warm-up (X-Cache-Status: '$status')"
  fi
  window_start "$PROXY_PID" "$BACKEND_PID"
  local backend0
  backend0=$(cpu_ticks "$BACKEND_PID" | awk '{print $1 + $2}')
  run_wrk "$url" "$DURATION" "$out"
  window_end
  local backend_ticks
  backend_ticks=$(( $(cpu_ticks "$BACKEND_PID" | awk '{print $1 + $2}') - backend0 ))
  parse_wrk "$out"
  ((BAD == 0)) || { cat "$out" >&2; die "$sc / $proxy: $BAD non-2xx answers"; }
  local us
  us=$(us_per_req "$W_TICKS" "$OK")
  ROUNDS_CPU[$proxy/$sc]+="$us "
  RPS_OF[$proxy/$sc]+="$RPS "
  stop_started "$PROXY_PID"
  log "$sc / $proxy: $RPS req/s, $us us/req (user $W_USER, sys $W_SYS ticks), backend $backend_ticks ticks, other CPU ${OTHER_PCT}%"
  if [[ "$sc" == hit && "$proxy" != aralez-nocache ]] && ((backend_ticks > 5)); then
    log "WARNING: $sc / $proxy: the backend worked during the window ($backend_ticks ticks): not all hits"
  fi
}

BUSY_PCT=$(busy_pct_1s)
((BUSY_PCT <= 5)) || log "WARNING: the machine was ${BUSY_PCT}% busy before the run"
start_bg backend "$LOAD_CPU" nginx -p "$TMP/backend" -e "$TMP/backend/error.log" -c "$TMP/backend.conf"
BACKEND_PID=$LAST_PID
WANT_BODY="hello, world" wait_ok backend "http://127.0.0.1:$P_BACKEND/hit" 1.1 "$BACKEND_PID"

for ((round = 0; round < ROUNDS; round++)); do
  if [[ " $SCENARIOS " == *" hit "* ]]; then
    for proxy in $(rotate "$round" aralez nginx haproxy); do measure "$proxy" hit; done
  fi
  if [[ " $SCENARIOS " == *" miss "* ]]; then
    for proxy in $(rotate "$round" aralez aralez-nocache); do measure "$proxy" miss; done
  fi
done

med() { median ${ROUNDS_CPU[$1]:-}; }
hit_a=$(med aralez/hit) hit_n=$(med nginx/hit) hit_h=$(med haproxy/hit)
miss_on=$(med aralez/miss) miss_off=$(med aralez-nocache/miss)
cat <<EOF

## Cache: CPU us per request (median of $ROUNDS rounds of ${DURATION} s, wrk -t1 -c32)

$(date -u '+%Y-%m-%d %H:%M UTC'), aralez $(cd "$REPO_ROOT" && git rev-parse --short HEAD 2>/dev/null || echo unknown), $(nproc) cores, $(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo), nginx $(nginx -v 2>&1 | sed 's/.*nginx\///'), HAProxy $(haproxy -v | awk 'NR == 1 {print $3}')

| scenario | aralez | nginx | HAProxy | aralez / nginx (target <= 0.80) | aralez / HAProxy |
| --- | ---: | ---: | ---: | ---: | ---: |
| hit | $hit_a | $hit_n | $hit_h | $(ratio "$hit_a" "$hit_n") | $(ratio "$hit_a" "$hit_h") |

| scenario | aralez, cache on | aralez, no cache | on / off (target <= 1.05) |
| --- | ---: | ---: | ---: |
| miss | $miss_on | $miss_off | $(ratio "$miss_on" "$miss_off") |

Per round (us/req): hit aralez ${ROUNDS_CPU[aralez/hit]:-}/ nginx ${ROUNDS_CPU[nginx/hit]:-}/ HAProxy ${ROUNDS_CPU[haproxy/hit]:-}; miss on ${ROUNDS_CPU[aralez/miss]:-}/ off ${ROUNDS_CPU[aralez-nocache/miss]:-}
req/s per round: hit aralez ${RPS_OF[aralez/hit]:-}/ nginx ${RPS_OF[nginx/hit]:-}/ HAProxy ${RPS_OF[haproxy/hit]:-}; miss on ${RPS_OF[aralez/miss]:-}/ off ${RPS_OF[aralez-nocache/miss]:-}
EOF
