#!/usr/bin/env bash
# HTTP/3 (issue 17): CPU per request of aralez serving HTTP/3 (`http3: true`) against Caddy
# (Debian's caddy, which serves HTTP/3 itself), and against aralez's own HTTP/2-over-TLS with the
# same load generator.
#
#   cargo build --release && bash bench/h3.sh
#
# Load: oha built with its `http3` feature (`cargo install oha --features http3`, under
# target/peers/oha-h3; this script installs it when missing, never the test command), -c 32
# connections, keep-alive, 12-byte answers from an nginx backend. Each proxy alone on PROXY_CPU
# (aralez `threads: 1`, Caddy GOMAXPROCS=1), oha and the backend on LOAD_CPU; rounds rotated.
# Env knobs: DURATION (8), ROUNDS (3), BASE_PORT (18380, 6 ports), PROXY_CPU / LOAD_CPU (0 / 1),
# ARALEZ_BIN (target/release/aralez), OHA_H3_BIN (target/peers/oha-h3/bin/oha).
set -euo pipefail

DURATION=${DURATION:-8}
ROUNDS=${ROUNDS:-3}
BASE_PORT=${BASE_PORT:-18380}
PROXY_CPU=${PROXY_CPU:-0}
LOAD_CPU=${LOAD_CPU:-1}
CONNS=${CONNS:-32}
WARMUP=2

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd "$SCRIPT_DIR/.." && pwd)
# shellcheck source=bench/lib.sh
source "$SCRIPT_DIR/lib.sh"

ARALEZ_BIN=${ARALEZ_BIN:-$REPO_ROOT/target/release/aralez}
[[ -x "$ARALEZ_BIN" ]] || die "no aralez binary at $ARALEZ_BIN (cargo build --release)"
OHA_H3_BIN=${OHA_H3_BIN:-$(peers_dir)/oha-h3/bin/oha}
if [[ ! -x "$OHA_H3_BIN" ]]; then
  log "building oha $OHA_VERSION with HTTP/3 into $(peers_dir)/oha-h3 (a few minutes)"
  mkdir -p "$(peers_dir)/logs"
  (cd "$(peers_dir)" && CARGO_TARGET_DIR="$(peers_dir)/build/oha-h3" nice -n 19 \
    cargo install oha --version "=$OHA_VERSION" --locked --features http3 --root "$(peers_dir)/oha-h3") \
    >"$(peers_dir)/logs/oha-h3.log" 2>&1 || die "cargo install oha --features http3 failed (see $(peers_dir)/logs/oha-h3.log)"
fi
ensure_tools nginx caddy curl taskset openssl
stop_system_service caddy
CLK_TCK=$(getconf CLK_TCK)

P_BACKEND=$BASE_PORT
P_ARALEZ=$((BASE_PORT + 1)) P_ARALEZ_PLAIN=$((BASE_PORT + 2))
P_CADDY=$((BASE_PORT + 3)) P_CADDY_PLAIN=$((BASE_PORT + 4))
for p in $P_BACKEND $P_ARALEZ $P_ARALEZ_PLAIN $P_CADDY $P_CADDY_PLAIN; do
  port_in_use "$p" && die "port $p is already in use (set BASE_PORT to a free range of 6 ports)"
done
make_run_dir h3
make_cert "$TMP/certs"

{ nginx_common backend; cat <<CONF
http {
    access_log off;
    keepalive_requests 1000000;
$(nginx_temp_paths backend)
    server { listen 127.0.0.1:$P_BACKEND; location / { return 200 "hello, world"; } }
}
CONF
} >"$TMP/backend.conf"

cat >"$TMP/aralez/main.yaml" <<CONF
threads: 1
proxy_address_http: "127.0.0.1:$P_ARALEZ_PLAIN"
proxy_address_tls: "127.0.0.1:$P_ARALEZ"
proxy_certificates: "$TMP/certs"
http3: true
upstreams_conf: "$TMP/aralez/upstreams.yaml"
log_level: error
upstream_keepalive_pool_size: 64
pid_file: "$TMP/aralez/aralez.pid"
upgrade_sock: "$TMP/aralez/aralez.sock"
CONF
cat >"$TMP/aralez/upstreams.yaml" <<CONF
upstreams:
  localhost:
    paths:
      "/":
        healthcheck: false
        servers: ["127.0.0.1:$P_BACKEND"]
CONF

mkdir -p "$TMP/caddy"
cat >"$TMP/caddy/Caddyfile" <<CONF
{
    admin off
    auto_https off
    http_port $P_CADDY_PLAIN
    https_port $P_CADDY
    servers {
        protocols h1 h2 h3
    }
}
https://localhost:$P_CADDY {
    tls $TMP/certs/default.crt $TMP/certs/default.key
    reverse_proxy 127.0.0.1:$P_BACKEND
}
CONF

# run_oha URL DURATION OUTFILE [oha args]: oha's JSON summary into OUTFILE; sets OK and RPS.
run_oha() {
  local url=$1 duration=$2 out=$3
  shift 3
  taskset -c "$LOAD_CPU" "$OHA_H3_BIN" --no-tui --insecure --output-format json -z "${duration}s" -c "$CONNS" "$@" "$url" \
    >"$out" 2>"$out.err" || { cat "$out.err" >&2; die "oha failed on $url"; }
  # Answers per second from the 2xx count over the window (oha's own requestsPerSec counts
  # differently over HTTP/3).
  read -r OK RPS < <(python3 -c '
import json, sys
s = json.load(open(sys.argv[1]))
codes = s.get("statusCodeDistribution", {})
ok = sum(int(n) for c, n in codes.items() if c.startswith("2"))
print(ok, round(ok / float(sys.argv[2])))
' "$out" "$duration")
}

declare -A ROUNDS_CPU RPS_OF
measure() {  # measure NAME PROXY PORT OHA_ARGS...
  local name=$1 proxy=$2 port=$3
  shift 3
  local url="https://localhost:$port/" out="$TMP/load/$name.json"
  case "$proxy" in
    aralez) start_bg aralez "$PROXY_CPU" "$ARALEZ_BIN" -c "$TMP/aralez/main.yaml" ;;
    caddy) start_bg caddy "$PROXY_CPU" env GOMAXPROCS=1 HOME="$TMP/caddy" \
      caddy run --config "$TMP/caddy/Caddyfile" --adapter caddyfile ;;
  esac
  local pid=$LAST_PID
  WANT_BODY="hello, world" wait_ok "$proxy" "$url" 2 "$pid" -k
  run_oha "$url" "$WARMUP" "$TMP/load/warmup.json" "$@"
  window_start "$pid" "$BACKEND_PID"
  run_oha "$url" "$DURATION" "$out" "$@"
  window_end
  ((OK > 0)) || { cat "$out" >&2; die "$name: no 2xx answers"; }
  local us
  us=$(us_per_req "$W_TICKS" "$OK")
  ROUNDS_CPU[$name]+="$us "
  RPS_OF[$name]+="$RPS "
  stop_started "$pid"
  log "$name: $RPS req/s, $us us/req (user $W_USER, sys $W_SYS ticks), RSS ${RSS_MB} MB"
}

start_bg backend "$LOAD_CPU" nginx -p "$TMP/backend" -e "$TMP/backend/error.log" -c "$TMP/backend.conf"
BACKEND_PID=$LAST_PID
WANT_BODY="hello, world" wait_ok backend "http://127.0.0.1:$P_BACKEND/" 1.1 "$BACKEND_PID"

for ((round = 0; round < ROUNDS; round++)); do
  for run in $(rotate "$round" aralez-h3 caddy-h3 aralez-h2); do
    case "$run" in
      aralez-h3) measure aralez-h3 aralez "$P_ARALEZ" --http-version 3 ;;
      caddy-h3) measure caddy-h3 caddy "$P_CADDY" --http-version 3 ;;
      aralez-h2) measure aralez-h2 aralez "$P_ARALEZ" --http2 ;;
    esac
  done
done

h3=$(median ${ROUNDS_CPU[aralez-h3]}) caddy=$(median ${ROUNDS_CPU[caddy-h3]}) h2=$(median ${ROUNDS_CPU[aralez-h2]})
cat <<CONF

## HTTP/3: CPU us per request (median of $ROUNDS rounds of ${DURATION} s, oha -c $CONNS)

$(date -u '+%Y-%m-%d %H:%M UTC'), aralez $(cd "$REPO_ROOT" && git rev-parse --short HEAD 2>/dev/null || echo unknown), $(nproc) cores, $(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo), $(caddy version | awk '{print "Caddy", $1}'), oha $OHA_VERSION (http3)

| scenario | aralez us/req | Caddy us/req | aralez / Caddy | aralez h3 / aralez h2tls |
| --- | ---: | ---: | ---: | ---: |
| h3 | $h3 | $caddy | $(ratio "$h3" "$caddy") | $(ratio "$h3" "$h2") |
| h2tls (oha --http2) | $h2 | | | |

Per round (us/req): aralez h3 ${ROUNDS_CPU[aralez-h3]}/ Caddy h3 ${ROUNDS_CPU[caddy-h3]}/ aralez h2 ${ROUNDS_CPU[aralez-h2]}; req/s aralez h3 ${RPS_OF[aralez-h3]}/ Caddy h3 ${RPS_OF[caddy-h3]}/ aralez h2 ${RPS_OF[aralez-h2]}
CONF
