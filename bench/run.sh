#!/usr/bin/env bash
# Side-by-side reverse proxy benchmark: aralez, nginx and HAProxy in front of the same
# fixed-response backend (an nginx `return 200`), each proxy measured in turn in the same run.
#
#   cargo build --release && sudo bash bench/run.sh
#
# Env knobs:
#   DURATION   seconds of measured load per proxy x scenario (default 10); a 2 s warm-up precedes it
#   SCENARIOS  any of "h1 post tcpnew h2c https h2tls tlsnew" (default all seven)
#   PROXIES    any of "aralez nginx haproxy" (default all three)
#   ROUNDS     rounds per scenario (default 1). Each round measures every proxy once, the order
#              rotated from round to round; the table shows each figure's median over the rounds
#              and a line lists every round's CPU us/req, so a noisy host shows as spread, not as a
#              lucky or unlucky single window
#   ARALEZ_BIN aralez binary (default target/release/aralez; built with `cargo build --release`
#              only when that default is missing and ARALEZ_BIN was not set)
#   BASE_PORT  first of 9 consecutive localhost ports used (default 18080)
#   RELOAD_MS  if set, aralez's upstreams.yaml is rewritten every RELOAD_MS ms during its measured
#              window (each write a real change, so each one is a full reload); see bench/reload.sh
#   RELOAD_CONTENT  `new` (default) or `same`: the same loop rewriting identical bytes, which aralez
#              skips, to measure what the loop itself costs the load generator
#   PROXY_CPU / LOAD_CPU  cores for the proxy and for backend + load generator (default 0 / 1)
#   PEER_DEFER `equal` (default) or `off`: whether nginx and HAProxy defer accepts until the first
#              bytes as aralez does (`deferred`, `defer-accept`; see bench/lib.sh)
#   CONNLOAD_RATES  e.g. "tlsnew:1500 tcpnew:6000": after wrk's window in those scenarios, a second
#              window of bench/connload (needs Go) opening new connections at that fixed rate, timed
#              whole (connect, handshake, request) from when each was due; a second table shows it.
#              Off by default (see bench/README.md, "The whole connection at a fixed rate")
#   PEER_HEADERS `equal` (default) or `bare`: whether nginx and HAProxy add the forwarded fields and
#              request id aralez adds (see bench/lib.sh; the tables up to 2026-11-28 were `bare`)
#
# Run it on an otherwise idle machine; it warns when the CPUs were busy just before it started and
# when other processes used CPU during a measured window.
#
# See bench/README.md for what is measured and how. Shared functions live in bench/lib.sh.
set -euo pipefail

DURATION=${DURATION:-10}
ROUNDS=${ROUNDS:-1}
SCENARIOS=${SCENARIOS:-"h1 post tcpnew h2c https h2tls tlsnew"}
PROXIES=${PROXIES:-"aralez nginx haproxy"}
BASE_PORT=${BASE_PORT:-18080}
PROXY_CPU=${PROXY_CPU:-0}
LOAD_CPU=${LOAD_CPU:-1}
CONNLOAD_RATES=${CONNLOAD_RATES:-}
WARMUP=2
OTHER_WARN_PCT=3   # flag a window where other processes used more than this % of the machine

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd "$SCRIPT_DIR/.." && pwd)
OUT_MD="$SCRIPT_DIR/last-run.md"
# shellcheck source=bench/lib.sh
source "$SCRIPT_DIR/lib.sh"

# ---------------------------------------------------------------- argument checks
[[ "$DURATION" =~ ^[1-9][0-9]*$ ]] || die "DURATION must be a positive integer (seconds), got '$DURATION'"
for s in $SCENARIOS; do
  case "$s" in h1|post|tcpnew|h2c|https|h2tls|tlsnew) ;; *) die "unknown scenario '$s' (known: h1 post tcpnew h2c https h2tls tlsnew)";; esac
done
for p in $PROXIES; do
  case "$p" in aralez|nginx|haproxy) ;; *) die "unknown proxy '$p' (known: aralez nginx haproxy)";; esac
done
check_peer_headers
check_peer_defer
check_connload_rates
[[ -n "${SCENARIOS// }" ]] || die "SCENARIOS is empty"
[[ -n "${PROXIES// }" ]] || die "PROXIES is empty"

has_scenario() { [[ " $SCENARIOS " == *" $1 "* ]]; }
is_tls() { [[ "$1" == https || "$1" == h2tls || "$1" == tlsnew ]]; }
TLS_ON=0
for s in $SCENARIOS; do is_tls "$s" && TLS_ON=1; done

# ---------------------------------------------------------------- aralez binary
# Checked first, before installing or starting anything.
if has_proxy aralez; then
  if [[ -n "${ARALEZ_BIN:-}" ]]; then
    # Explicitly given: never build, just require it.
    case "$ARALEZ_BIN" in /*) ;; *) ARALEZ_BIN="$REPO_ROOT/$ARALEZ_BIN";; esac
    [[ -x "$ARALEZ_BIN" ]] || die "aralez binary not found or not executable: $ARALEZ_BIN
        (build it with 'cargo build --release', or drop aralez from PROXIES, e.g. PROXIES=\"nginx haproxy\")"
  else
    ARALEZ_BIN="$REPO_ROOT/target/release/aralez"
    if [[ ! -x "$ARALEZ_BIN" ]]; then
      command -v cargo >/dev/null 2>&1 || die "aralez binary missing ($ARALEZ_BIN) and cargo not found;
        run 'cargo build --release' first, or set PROXIES=\"nginx haproxy\""
      log "aralez binary missing; running 'cargo build --release' in $REPO_ROOT"
      (cd "$REPO_ROOT" && cargo build --release) || die "cargo build --release failed"
      [[ -x "$ARALEZ_BIN" ]] || die "cargo build --release did not produce $ARALEZ_BIN"
    fi
  fi
fi

# ---------------------------------------------------------------- tools
need_cmds=(nginx wrk taskset curl pgrep getconf)
has_proxy haproxy && need_cmds+=(haproxy)
{ has_scenario h2c || has_scenario h2tls; } && need_cmds+=(h2load)
((TLS_ON)) && need_cmds+=(openssl)
ensure_tools "${need_cmds[@]}"
CONNLOAD_BIN=""

NCPU=$(nproc)
((NCPU > PROXY_CPU && NCPU > LOAD_CPU)) || die "need cores $PROXY_CPU and $LOAD_CPU, this machine has $NCPU (set PROXY_CPU/LOAD_CPU)"
nginx -V 2>&1 | grep -q -- '--with-http_v2_module' || die "this nginx has no http_v2 module"
CLK_TCK=$(getconf CLK_TCK)

# ---------------------------------------------------------------- ports
P_BACKEND=$BASE_PORT
P_ARALEZ=$((BASE_PORT + 1))
P_NGINX=$((BASE_PORT + 2))
P_NGINX_H2=$((BASE_PORT + 3))
P_HAPROXY=$((BASE_PORT + 4))
P_HAPROXY_H2=$((BASE_PORT + 5))
P_ARALEZ_TLS=$((BASE_PORT + 6))
P_NGINX_TLS=$((BASE_PORT + 7))
P_HAPROXY_TLS=$((BASE_PORT + 8))

for p in $P_BACKEND $P_ARALEZ $P_NGINX $P_NGINX_H2 $P_HAPROXY $P_HAPROXY_H2 $P_ARALEZ_TLS $P_NGINX_TLS $P_HAPROXY_TLS; do
  port_in_use "$p" && die "port $p is already in use (set BASE_PORT to a free range of 9 ports)"
done

# ---------------------------------------------------------------- temp dir and cleanup
TMP=$(mktemp -d /tmp/aralez-bench.XXXXXX)
chmod 755 "$TMP"   # nginx workers run as an unprivileged user when started as root
# The load generator's output (h2load writes a line per request) goes to a directory of its own:
# aralez watches the directory of upstreams.yaml ($TMP), and every write there would wake its watcher.
mkdir -p "$TMP/load"
STARTED_PIDS=()

trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ---------------------------------------------------------------- configs
# nginx_common (lib.sh) writes the global part of each nginx config.
write_backend_conf() {
  { nginx_common backend; cat <<EOF
http {
    access_log off;
    keepalive_requests 1000000;
    client_body_temp_path $TMP/backend/body;
    proxy_temp_path $TMP/backend/proxy;
    fastcgi_temp_path $TMP/backend/fastcgi;
    uwsgi_temp_path $TMP/backend/uwsgi;
    scgi_temp_path $TMP/backend/scgi;
    server {
        listen 127.0.0.1:$P_BACKEND;
        location / {
            default_type text/plain;
            return 200 "hello, world\n";
        }
    }
}
EOF
  } >"$TMP/backend.conf"
}

# The TLS part of each proxy's config is written only for the TLS scenarios (write_*_conf SCENARIO),
# so the plain scenarios run with exactly the plain configs.
nginx_tls_listen() {
  is_tls "$1" || return 0
  # nginx 1.22 has no TLSv1.3 in its default ssl_protocols; session tickets are on by default and
  # ssl_session_cache is left at its default (none: resumption through tickets only).
  cat <<EOF
        listen 127.0.0.1:$P_NGINX_TLS ssl http2$(nginx_defer);
        ssl_certificate $TMP/certs/default.crt;
        ssl_certificate_key $TMP/certs/default.key;
        ssl_protocols TLSv1.2 TLSv1.3;
EOF
}

write_nginx_conf() {  # write_nginx_conf SCENARIO
  { nginx_common nginx; cat <<EOF
http {
    access_log off;
    keepalive_requests 1000000;
    client_body_temp_path $TMP/nginx/body;
    proxy_temp_path $TMP/nginx/proxy;
    fastcgi_temp_path $TMP/nginx/fastcgi;
    uwsgi_temp_path $TMP/nginx/uwsgi;
    scgi_temp_path $TMP/nginx/scgi;
    upstream backend {
        server 127.0.0.1:$P_BACKEND;
        keepalive 512;
        keepalive_requests 1000000;
    }
    server {
        listen 127.0.0.1:$P_NGINX$(nginx_defer);
        listen 127.0.0.1:$P_NGINX_H2 http2$(nginx_defer);
$(nginx_tls_listen "$1")
        location / {
            proxy_pass http://backend;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
$(nginx_equal_headers)
        }
    }
}
EOF
  } >"$TMP/nginx.conf"
}

write_haproxy_conf() {  # write_haproxy_conf SCENARIO
  cat >"$TMP/haproxy.cfg" <<EOF
global
    nbthread 1
    maxconn 4096

defaults
    mode http
    timeout connect 5s
    timeout client 60s
    timeout server 60s
    http-reuse always

frontend fe_h1
    bind 127.0.0.1:$P_HAPROXY$(haproxy_defer)
$(haproxy_equal_headers)
    default_backend be

frontend fe_h2c
    bind 127.0.0.1:$P_HAPROXY_H2 proto h2$(haproxy_defer)
$(haproxy_equal_headers)
    default_backend be
$(is_tls "$1" && printf '\nfrontend fe_tls\n    bind 127.0.0.1:%s ssl crt %s alpn h2,http/1.1%s\n%s\n    default_backend be\n' "$P_HAPROXY_TLS" "$TMP/haproxy.pem" "$(haproxy_defer)" "$(haproxy_equal_headers)")

backend be
    server s1 127.0.0.1:$P_BACKEND
EOF
}

write_aralez_conf() {  # write_aralez_conf SCENARIO
  cat >"$TMP/main.yaml" <<EOF
threads: 1
proxy_address_http: "127.0.0.1:$P_ARALEZ"
upstreams_conf: "$TMP/upstreams.yaml"
log_level: error
upstream_keepalive_pool_size: 512
EOF
  if is_tls "$1"; then
    cat >>"$TMP/main.yaml" <<EOF
proxy_address_tls: "127.0.0.1:$P_ARALEZ_TLS"
proxy_certificates: "$TMP/certs"
proxy_tls_grade: medium
EOF
  fi
  cat >"$TMP/upstreams.yaml" <<EOF
upstreams:
  DEFAULT:
    paths:
      "/":
        servers: ["127.0.0.1:$P_BACKEND"]
EOF
  cp "$TMP/upstreams.yaml" "$TMP/upstreams.base"
}

write_post_lua() {
  cat >"$TMP/post.lua" <<'EOF'
wrk.method = "POST"
wrk.body = string.rep("a", 1024)
wrk.headers["Content-Type"] = "application/octet-stream"
EOF
}

# ---------------------------------------------------------------- proxies
# URL of each proxy for a scenario
proxy_url() {  # proxy_url PROXY SCENARIO
  local port scheme=http
  is_tls "$2" && scheme=https
  case "$1:$2" in
    aralez:https|aralez:h2tls|aralez:tlsnew) port=$P_ARALEZ_TLS ;;
    aralez:*) port=$P_ARALEZ ;;
    nginx:https|nginx:h2tls|nginx:tlsnew) port=$P_NGINX_TLS ;;
    nginx:h2c) port=$P_NGINX_H2 ;;
    nginx:*) port=$P_NGINX ;;
    haproxy:https|haproxy:h2tls|haproxy:tlsnew) port=$P_HAPROXY_TLS ;;
    haproxy:h2c) port=$P_HAPROXY_H2 ;;
    haproxy:*) port=$P_HAPROXY ;;
  esac
  echo "$scheme://127.0.0.1:$port/"
}

proxy_port() { local p=${1##*:}; echo "${p%/}"; }  # proxy_port URL

start_proxy() {  # start_proxy NAME SCENARIO -> PROXY_PID
  case "$1" in
    aralez)
      write_aralez_conf "$2"
      start_bg aralez "$PROXY_CPU" "$ARALEZ_BIN" -c "$TMP/main.yaml"
      ;;
    nginx)
      write_nginx_conf "$2"
      start_bg nginx "$PROXY_CPU" nginx -p "$TMP/nginx" -e "$TMP/nginx/error.log" -c "$TMP/nginx.conf"
      ;;
    haproxy)
      write_haproxy_conf "$2"
      start_bg haproxy "$PROXY_CPU" haproxy -db -f "$TMP/haproxy.cfg"
      ;;
  esac
  PROXY_PID=$LAST_PID
  # The proxy must answer 200 (with the backend's body) through curl, in the scenario's protocol
  # (over TLS: verifying the test certificate), before any load.
  local url ver=1.1 args=()
  url=$(proxy_url "$1" "$2")
  case "$2" in
    h2c) ver=2 args=(--http2-prior-knowledge) ;;
    h2tls) ver=2 args=(--http2 --cacert "$TMP/certs/default.crt") ;;
    https|tlsnew) args=(--http1.1 --cacert "$TMP/certs/default.crt") ;;
  esac
  wait_ok "$1" "$url" "$ver" "$PROXY_PID" "${args[@]}"
  # With equal work, each proxy's answer must carry the request id it also sent the backend.
  if [[ "$PEER_HEADERS" == equal ]]; then
    curl -s "${args[@]}" -D - -o /dev/null --max-time 2 "$url" | grep -qi '^x-request-id: *[0-9a-f-]\{32,\}' \
      || die "$1: its answer has no X-Request-Id although PEER_HEADERS=equal"
  fi
}

# The load of each scenario. wrk offers no ALPN, so over TLS it speaks HTTP/1.1; h2load is limited
# to the TLS 1.3 suite OpenSSL clients (wrk, s_client) pick first, so that all three proxies
# negotiate the same one whatever their preference.
run_load() {  # run_load SCENARIO URL DURATION OUTFILE [h2load log file]
  local sc=$1 url=$2 dur=$3 out=$4 logf=${5:-}
  case "$sc" in
    h1|https) run_wrk "$url" "$dur" "$out" ;;
    post) run_wrk "$url" "$dur" "$out" -s "$TMP/post.lua" ;;
    tlsnew|tcpnew) run_wrk "$url" "$dur" "$out" -H "Connection: close" ;;
    h2c) run_h2load "$url" "$dur" "$out" "$logf" ;;
    h2tls) run_h2load "$url" "$dur" "$out" "$logf" --tls13-ciphers=TLS_AES_256_GCM_SHA384 ;;
  esac
}

scenario_title() {  # scenario_title SCENARIO
  case "$1" in
    h1) echo "h1: HTTP/1.1 keep-alive GET, small response (wrk -t1 -c32 -d${DURATION}s)" ;;
    post) echo "post: HTTP/1.1 keep-alive POST, 1 KiB body (wrk -t1 -c32 -d${DURATION}s, lua script)" ;;
    tcpnew) echo "tcpnew: a new TCP connection per request, plain HTTP/1.1 (wrk -t1 -c32 -d${DURATION}s -H 'Connection: close')" ;;
    h2c) echo "h2c: HTTP/2 cleartext prior knowledge GET (h2load -c16 -m16 -D ${DURATION})" ;;
    https) echo "https: HTTPS/1.1 keep-alive GET, TLS 1.3 (wrk -t1 -c32 -d${DURATION}s)" ;;
    h2tls) echo "h2tls: HTTP/2 over TLS 1.3, ALPN h2 (h2load -c16 -m16 -D ${DURATION})" ;;
    tlsnew) echo "tlsnew: a new TLS 1.3 connection per request, resumed from a session ticket (wrk -t1 -c32 -d${DURATION}s -H 'Connection: close')" ;;
  esac
}

# ---------------------------------------------------------------- one measurement
# Globals filled: RPS OK BAD P50_US P99_US MEAN_US SD_US CPU_US RSS_MB NOTE
measure() {  # measure PROXY SCENARIO
  local proxy=$1 sc=$2 url out="$TMP/load/$1-$2.txt" logf="$TMP/load/$1-$2.h2log"
  url=$(proxy_url "$proxy" "$sc")
  start_proxy "$proxy" "$sc"
  log "$sc / $proxy: warm-up ${WARMUP}s, then ${DURATION}s against $url"
  TLS_INFO=""
  if is_tls "$sc"; then
    TLS_INFO=$(tls_probe "$(proxy_port "$url")")
  fi
  run_load "$sc" "$url" "$WARMUP" "$TMP/load/warmup.txt"
  window_start "$PROXY_PID" "$BACKEND_PID"
  local reloader_pid=""
  if [[ "$proxy" == aralez && -n "${RELOAD_MS:-}" ]]; then
    # Rewrite the routes every RELOAD_MS ms (content changes each time, so each is a real reload).
    taskset -c "$LOAD_CPU" bash -c 'n=0; while :; do n=$((n+1)); [ "$4" = same ] && n=0; { cat "$1"; echo "# reload $n"; } > "$2.tmp"; mv "$2.tmp" "$2"; sleep "$3"; done' \
      _ "$TMP/upstreams.base" "$TMP/upstreams.yaml" "$(awk -v ms="$RELOAD_MS" 'BEGIN {printf "%.3f", ms / 1000}')" "${RELOAD_CONTENT:-new}" &
    reloader_pid=$!
  fi
  run_load "$sc" "$url" "$DURATION" "$out" "$logf"
  # OTHER_PCT: CPU used during the window by anything but the proxy, the backend and the load
  # generator (a compile, say), in % of the machine's total capacity over the window.
  window_end
  if [[ -n "$reloader_pid" ]]; then
    kill "$reloader_pid" 2>/dev/null || true
    wait "$reloader_pid" 2>/dev/null || true
  fi
  case "$sc" in
    h1|post|tcpnew|https|tlsnew) parse_wrk "$out" ;;
    h2c|h2tls) parse_h2load "$out" "$logf" ;;
  esac
  if [[ "$sc" == h2tls ]] && ! grep -q '^Application protocol: h2$' "$out"; then
    cat "$out" >&2
    die "h2tls / $proxy: h2load did not negotiate h2 with ALPN"
  fi
  rm -f "$logf"
  CPU_US=$(us_per_req "$W_TICKS" "$OK")
  C_OK=""
  local rate
  rate=$(connload_rate "$sc")
  if [[ -n "$rate" ]]; then
    local tls_args=()
    is_tls "$sc" && tls_args=(-tls -ca "$TMP/certs/default.crt")
    log "$sc / $proxy: ${DURATION}s of connload at $rate new connections a second"
    run_connload "127.0.0.1:$(proxy_port "$url")" "$rate" "$DURATION" "$TMP/load/$proxy-$sc.connload" "${tls_args[@]}"
  fi
  stop_started "$PROXY_PID"
  log "$sc / $proxy: ${RPS} req/s, ${OK} 2xx, ${BAD} bad, cpu $W_TICKS ticks (user $W_USER, sys $W_SYS) -> ${CPU_US} us/req, rss ${RSS_MB} MB, other CPU activity ${OTHER_PCT}%"
  if ((OTHER_PCT > OTHER_WARN_PCT)); then
    log "WARNING: $sc / $proxy: ${OTHER_PCT}% of the machine's CPU went to other processes during the window"
  fi
}

# ---------------------------------------------------------------- idle check
# Other work on the machine (a compile, say) distorts every number: measure how busy the CPUs are
# for 1 s before starting and warn if it is more than noise.
BUSY_PCT=$(busy_pct_1s)
if ((BUSY_PCT > 10)); then
  log "WARNING: the machine is ${BUSY_PCT}% busy before the run (something else is running); numbers will be distorted"
fi

# ---------------------------------------------------------------- run
write_backend_conf
write_post_lua
if [[ -n "${CONNLOAD_RATES// }" ]]; then
  CONNLOAD_BIN="$TMP/connload"
  build_connload "$CONNLOAD_BIN"
fi
((TLS_ON)) && make_cert "$TMP/certs"
start_bg backend "$LOAD_CPU" nginx -p "$TMP/backend" -e "$TMP/backend/error.log" -c "$TMP/backend.conf"
BACKEND_PID=$LAST_PID
wait_ok backend "http://127.0.0.1:$P_BACKEND/" 1.1 "$BACKEND_PID"

REPORT="$TMP/report.md"
FAILED=0
{
  echo "# aralez / nginx / HAProxy side by side"
  echo
  echo "- date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  echo "- machine: $(nproc) cores, $(lscpu 2>/dev/null | awk -F: '/^Model name/ {gsub(/^ +/, "", $2); print $2; exit}'), kernel $(uname -r)"
  echo "- proxy pinned to core $PROXY_CPU (1 worker/thread); backend (nginx return 200, 13-byte body) and load generator pinned to core $LOAD_CPU"
  echo "- duration ${DURATION}s measured per proxy x scenario$( ((ROUNDS > 1)) && echo " x round (${ROUNDS} rounds, medians shown)"), after ${WARMUP}s warm-up; each proxy freshly started per measurement"
  echo "- versions: $(nginx -v 2>&1 | sed 's/^nginx version: //')$(has_proxy haproxy && echo ", $(haproxy -v 2>/dev/null | head -1 | awk '{print "HAProxy " $3}')"), $(wrk -v 2>&1 | head -1 | awk '{print "wrk " $2}')$({ has_scenario h2c || has_scenario h2tls; } && echo ", $(h2load --version 2>/dev/null | head -1)")$( ((TLS_ON)) && echo ", $(openssl version | awk '{print $1, $2}')")"
  if has_proxy aralez; then
    echo "- aralez: $ARALEZ_BIN (git $(git -C "$REPO_ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown))"
  fi
  echo "- CPUs busy in the 1 s before the run: ${BUSY_PCT}%$( ((BUSY_PCT > 10)) && echo " -- WARNING: machine not idle, numbers distorted")"
  peer_headers_line
  peer_defer_line
  echo "- CPU us/req = (utime+stime) of all the proxy's processes over the measured window / 2xx responses; RSS = sum of VmHWM"
  if ((TLS_ON)); then
    echo "- TLS: the three proxies serve the same ECDSA P-256 self-signed certificate (made with openssl for the run) on one TLS port each, ALPN h2 + http/1.1; the backend stays plain HTTP"
  fi
} >"$REPORT"

for sc in $SCENARIOS; do
  declare -A R_RPS=() R_P50=() R_P99=() R_MEAN=() R_SD=() R_CPU=() R_RSS=() R_BAD=() R_NOTE=() R_OTHER=() R_TLS=()
  declare -A L_RPS=() L_P50=() L_P99=() L_MEAN=() L_SD=() L_CPU=() L_RSS=() L_OTHER=()
  declare -A C_W50=() C_W99=() C_W999=() C_R50=() C_R99=()
  for ((round = 0; round < ROUNDS; round++)); do
    for proxy in $(rotate "$round" $PROXIES); do
      ((ROUNDS > 1)) && log "$sc: round $((round + 1)) of $ROUNDS"
      measure "$proxy" "$sc"
      L_RPS[$proxy]+=" $RPS" L_P50[$proxy]+=" $P50_US" L_P99[$proxy]+=" $P99_US" L_MEAN[$proxy]+=" $MEAN_US"
      L_SD[$proxy]+=" $SD_US" L_CPU[$proxy]+=" $CPU_US" L_RSS[$proxy]+=" $RSS_MB" L_OTHER[$proxy]+=" $OTHER_PCT"
      R_BAD[$proxy]=$((${R_BAD[$proxy]:-0} + BAD)) R_NOTE[$proxy]=$NOTE R_TLS[$proxy]=$TLS_INFO
      if [[ -n "$C_OK" ]]; then
        C_W50[$proxy]+=" $C_WHOLE50" C_W99[$proxy]+=" $C_WHOLE99" C_W999[$proxy]+=" $C_WHOLE999"
        C_R50[$proxy]+=" $C_REQ50" C_R99[$proxy]+=" $C_REQ99"
        BAD=$((BAD + C_BAD)) R_BAD[$proxy]=$((R_BAD[$proxy] + C_BAD))
      fi
      if ((BAD > 0)); then
        FAILED=1
        log "FAILED: $sc / $proxy had $BAD non-2xx or failed responses"
      fi
    done
  done
  for proxy in $PROXIES; do
    R_RPS[$proxy]=$(median ${L_RPS[$proxy]}) R_P50[$proxy]=$(median ${L_P50[$proxy]}) R_P99[$proxy]=$(median ${L_P99[$proxy]})
    R_MEAN[$proxy]=$(median ${L_MEAN[$proxy]}) R_SD[$proxy]=$(median ${L_SD[$proxy]}) R_CPU[$proxy]=$(median ${L_CPU[$proxy]})
    R_RSS[$proxy]=$(maximum ${L_RSS[$proxy]}) R_OTHER[$proxy]=$(maximum ${L_OTHER[$proxy]})
  done
  {
    case "$sc" in
      h2c|h2tls) print_table "$(scenario_title "$sc")" h2load ;;
      *) print_table "$(scenario_title "$sc")" wrk ;;
    esac
    [[ -n "$(connload_rate "$sc")" ]] && print_connload_table "$sc" "$(connload_rate "$sc")"
    if ((ROUNDS > 1)); then
      echo
      echo "$ROUNDS rounds; the table shows medians (RSS and other CPU activity: the highest round). CPU us/req in each round:"
      echo
      for proxy in $PROXIES; do echo "- $proxy:${L_CPU[$proxy]}"; done
    fi
    if is_tls "$sc"; then
      echo
      echo "TLS as each proxy negotiated it with \`openssl s_client\` before the load (OpenSSL client defaults, as wrk):"
      echo
      for proxy in $PROXIES; do echo "- $proxy: ${R_TLS[$proxy]}"; done
    fi
  } >>"$REPORT"
  unset R_RPS R_P50 R_P99 R_MEAN R_SD R_CPU R_RSS R_BAD R_NOTE R_OTHER R_TLS
  unset L_RPS L_P50 L_P99 L_MEAN L_SD L_CPU L_RSS L_OTHER
  unset C_W50 C_W99 C_W999 C_R50 C_R99
done

if ((FAILED)); then
  printf '\n**Some runs FAILED (non-2xx or failed responses); their numbers are not valid.**\n' >>"$REPORT"
fi

cp "$REPORT" "$OUT_MD"
cat "$REPORT"
log "written to $OUT_MD"
((FAILED == 0)) || exit 1
