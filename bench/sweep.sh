#!/usr/bin/env bash
# Concurrency sweep, the shape of the "Rust reverse proxy comparison": for each connection count c,
# `h2load -n $((c*100)) -c c` through each proxy over TLS with HTTP/2 and over TLS with HTTP/1.1
# (`--h1`), optionally plain HTTP/1.1, against aralez, nginx, HAProxy and Aralez 0.95 (Pingora; from
# bench/peers.sh). Each proxy runs one worker/thread pinned to core PROXY_CPU; the backend (nginx,
# `return 200`) and h2load share core LOAD_CPU, as in bench/run.sh.
#
#   bash bench/peers.sh                  # once: Aralez (optional, skipped with a note if missing)
#   cargo build --release && sudo bash bench/sweep.sh
#   CONNS="1 100 500" REQS_PER_CONN=20 bash bench/sweep.sh        # a quick look
#
# Env knobs:
#   CONNS          connection counts (default "1 100 500 1000 2500 5000 10000")
#   REQS_PER_CONN  requests per connection: -n = c * REQS_PER_CONN (default 100, the comparison's)
#   PROTOCOLS      any of "h2 h1 h1c" (default "h2 h1"): h2 = HTTP/2 over TLS (ALPN h2),
#                  h1 = HTTP/1.1 over TLS (h2load --h1), h1c = plain HTTP/1.1 (h2load --h1)
#   PROXIES        any of "aralez nginx haproxy Aralez" (default all four; Aralez = the Pingora-based
#                  Aralez 0.95 installed by bench/peers.sh, skipped with a line in the report if absent)
#   ROUNDS         rounds per point (default 1); each round measures every proxy once, the order
#                  rotated; tables show medians (RSS: the highest; errors: the sum)
#   POOL           idle upstream keep-alive connections of each proxy (default 1024)
#   HEADER_TIMEOUT seconds every proxy gives a new client connection for its TLS handshake and first
#                  request head (default 60: nginx's client_header_timeout and HAProxy's timeout
#                  client by default; aralez's own default is 10). Set for all of them alike:
#                  nginx client_header_timeout, HAProxy timeout client (2.6 bounds the handshake
#                  with it) and http-request, aralez client_header_timeout.
#   POINT_TIMEOUT  seconds allowed for one h2load run (default 600); a run cut short is a failed point
#   MIN_POINT_SECONDS  a point whose h2load run took less is run again, the same command, until the
#                  runs add up to this (default 1; at most MAX_REPS runs, default 200): req/s is the
#                  median run's, latency is over every request of every run
#   ARALEZ_BIN     aralez binary (default target/release/aralez; never built by this script)
#   ARALEZ_EXTRA_YAML  more lines for aralez's main.yaml, for experiments (e.g. "client_idle_timeout: 5";
#                  a client_header_timeout there overrides HEADER_TIMEOUT for aralez)
#   ARALEZ_PEER_BIN  Aralez 0.95 binary (default: bench/peers.sh's install under target/peers)
#   BASE_PORT      first of 10 consecutive localhost ports (default 18280)
#   PROXY_CPU / LOAD_CPU  cores (default 0 / 1)
#   PEER_DEFER     `equal` (default) or `off`: whether nginx and HAProxy defer accepts as aralez does
#   PEER_HEADERS   `equal` (default) or `bare`: whether nginx and HAProxy add the forwarded fields and
#                  request id aralez adds (see bench/lib.sh)
#
# Output: bench/last-sweep.md (markdown tables per protocol: req/s with aralez's ratio to the best
# peer, mean/p99 latency, proxy CPU us/req and peak RSS; summary lines), bench/last-sweep.tsv (the
# numbers, one line per point) and bench/sweep.svg (req/s against connections, log x axis, one
# panel per protocol), drawn by bench/sweep_plot.py (python3, no modules outside the standard library).
# Duration: about sum(CONNS) * REQS_PER_CONN / (req/s) per proxy and protocol, plus ~3 s per point
# to start and check the proxy; the full default sweep takes 20-40 minutes on a 2-core machine.
set -euo pipefail

CONNS=${CONNS:-"1 100 500 1000 2500 5000 10000"}
REQS_PER_CONN=${REQS_PER_CONN:-100}
PROTOCOLS=${PROTOCOLS:-"h2 h1"}
PROXIES=${PROXIES:-"aralez nginx haproxy Aralez"}
ROUNDS=${ROUNDS:-1}
POOL=${POOL:-1024}
HEADER_TIMEOUT=${HEADER_TIMEOUT:-60}
POINT_TIMEOUT=${POINT_TIMEOUT:-600}
MIN_POINT_SECONDS=${MIN_POINT_SECONDS:-1}
MAX_REPS=${MAX_REPS:-200}
BASE_PORT=${BASE_PORT:-18280}
PROXY_CPU=${PROXY_CPU:-0}
LOAD_CPU=${LOAD_CPU:-1}
OTHER_WARN_PCT=3

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd "$SCRIPT_DIR/.." && pwd)
OUT_MD="$SCRIPT_DIR/last-sweep.md"
OUT_TSV="$SCRIPT_DIR/last-sweep.tsv"
OUT_SVG="$SCRIPT_DIR/sweep.svg"
# shellcheck source=bench/lib.sh
source "$SCRIPT_DIR/lib.sh"

# ---------------------------------------------------------------- argument checks
for v in REQS_PER_CONN ROUNDS POOL HEADER_TIMEOUT POINT_TIMEOUT BASE_PORT MAX_REPS; do
  [[ "${!v}" =~ ^[1-9][0-9]*$ ]] || die "$v must be a positive integer, got '${!v}'"
done
[[ "$MIN_POINT_SECONDS" =~ ^[0-9]+$ ]] || die "MIN_POINT_SECONDS must be a whole number of seconds, got '$MIN_POINT_SECONDS'"
check_peer_headers
check_peer_defer
[[ -n "${CONNS// }" ]] || die "CONNS is empty"
for c in $CONNS; do [[ "$c" =~ ^[1-9][0-9]*$ ]] || die "CONNS: '$c' is not a positive integer"; done
for p in $PROTOCOLS; do
  case "$p" in h2|h1|h1c) ;; *) die "unknown protocol '$p' (known: h2 h1 h1c)";; esac
done
check_proxy_names
[[ -n "${PROTOCOLS// }" ]] || die "PROTOCOLS is empty"
MAXC=$(printf '%s\n' $CONNS | sort -n | tail -1)

# ---------------------------------------------------------------- binaries
resolve_proxy_bins
ensure_tools nginx h2load taskset curl pgrep getconf openssl python3
has_proxy haproxy && ensure_tools haproxy
check_cores
nginx -V 2>&1 | grep -q -- '--with-http_v2_module' || die "this nginx has no http_v2 module"

# Every proxy holds a client connection and, for a request in flight, an upstream one; h2load and the
# backend hold one per connection too.
fd_budget $((4 * MAXC + 4096)) $((2 * MAXC + 1024)) \
  "a proxy may need at c=$MAXC (a client and an upstream connection per request in flight): points near c=$MAXC can fail with EMFILE for reasons of this machine, not of the proxy"

# ---------------------------------------------------------------- ports, temp dir
P_BACKEND=$BASE_PORT
declare -A P_PLAIN=([aralez]=$((BASE_PORT + 1)) [nginx]=$((BASE_PORT + 3)) [haproxy]=$((BASE_PORT + 5)) [Aralez]=$((BASE_PORT + 7)))
declare -A P_TLS=([aralez]=$((BASE_PORT + 2)) [nginx]=$((BASE_PORT + 4)) [haproxy]=$((BASE_PORT + 6)) [Aralez]=$((BASE_PORT + 8)))
P_ADMIN=$((BASE_PORT + 9))
for ((p = BASE_PORT; p <= BASE_PORT + 9; p++)); do
  port_in_use "$p" && die "port $p is already in use (set BASE_PORT to a free range of 10 ports)"
done

make_run_dir sweep

# ---------------------------------------------------------------- configs
write_configs() {
  { nginx_common backend "$NOFILE"; cat <<EOF
http {
    access_log off;
    keepalive_requests 1000000;
$(nginx_temp_paths backend)
    server {
        listen 127.0.0.1:$P_BACKEND backlog=65535;
        location / {
            default_type text/plain;
            return 200 "hello, world\n";
        }
    }
}
EOF
  } >"$TMP/backend.conf"

  # listen backlog raised from nginx's 511 to what HAProxy and Pingora ask for (the kernel caps it
  # at net.core.somaxconn), so that 10,000 connections arriving at once are not dropped at the SYN.
  { nginx_common nginx "$NOFILE"; cat <<EOF
http {
    access_log off;
    keepalive_requests 1000000;
$(nginx_temp_paths nginx)
    upstream backend {
        server 127.0.0.1:$P_BACKEND;
        keepalive $POOL;
        keepalive_requests 1000000;
    }
    server {
        listen 127.0.0.1:${P_PLAIN[nginx]} backlog=65535$(nginx_defer);
        listen 127.0.0.1:${P_TLS[nginx]} ssl http2 backlog=65535$(nginx_defer);
        ssl_certificate $TMP/certs/default.crt;
        ssl_certificate_key $TMP/certs/default.key;
        ssl_protocols TLSv1.2 TLSv1.3;
        client_header_timeout ${HEADER_TIMEOUT}s;
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

  { haproxy_head; haproxy_equal_headers; cat <<EOF
    timeout client ${HEADER_TIMEOUT}s
    timeout http-request ${HEADER_TIMEOUT}s
    default_backend be

backend be
    server s1 127.0.0.1:$P_BACKEND pool-max-conn $POOL
EOF
  } >"$TMP/haproxy.cfg"

  local d
  for d in aralez Aralez; do
    cat >"$TMP/$d/upstreams.yaml" <<EOF
provider: "file"
upstreams:
  DEFAULT:
    paths:
      "/":
        servers: ["127.0.0.1:$P_BACKEND"]
EOF
  done
  aralez_main_yaml "$TMP/aralez" "${P_PLAIN[aralez]}" "${P_TLS[aralez]}" "$TMP/certs" "$POOL"
  # A key may appear once: lines of ARALEZ_EXTRA_YAML that set the bound themselves win.
  grep -q '^client_header_timeout:' "$TMP/aralez/main.yaml" ||
    echo "client_header_timeout: $HEADER_TIMEOUT" >>"$TMP/aralez/main.yaml"
  pingora_main_yaml "$TMP/Aralez" "${P_PLAIN[Aralez]}" "${P_TLS[Aralez]}" "$TMP/certs" "$POOL" "$P_ADMIN"
}

# ---------------------------------------------------------------- proxies

proto_url() {  # proto_url PROXY PROTO
  case "$2" in
    h1c) echo "http://127.0.0.1:${P_PLAIN[$1]}/" ;;
    *) echo "https://127.0.0.1:${P_TLS[$1]}/" ;;
  esac
}

start_proxy() {  # start_proxy PROXY PROTO -> PROXY_PID
  launch_proxy "$1"
  local url
  url=$(proto_url "$1" "$2")
  case "$2" in
    h2) wait_ok "$1" "$url" 2 "$PROXY_PID" --http2 --cacert "$TMP/certs/default.crt" ;;
    h1) wait_ok "$1" "$url" 1.1 "$PROXY_PID" --http1.1 --cacert "$TMP/certs/default.crt" ;;
    h1c) wait_ok "$1" "$url" 1.1 "$PROXY_PID" ;;
  esac
}

proto_title() {
  case "$1" in
    h2) echo "HTTP/2 over TLS 1.3 (ALPN h2)" ;;
    h1) echo "HTTP/1.1 over TLS 1.3 (h2load --h1)" ;;
    h1c) echo "plain HTTP/1.1 (h2load --h1)" ;;
  esac
}

# ---------------------------------------------------------------- one point
# Active TCP opens (connect calls that reached SYN-SENT) on the whole machine so far.
tcp_active_opens() { awk '$1 == "Tcp:" && $6 ~ /^[0-9]+$/ {print $6}' /proc/net/snmp; }

# run_h2load_repeated N C URL OUT LOGFILE ARGS...: h2load once; while the runs so far took less than
# MIN_POINT_SECONDS in all, again (at most MAX_REPS), each the same -n N -c C. A point of a few
# milliseconds (c=1 with 20 requests takes 4 ms) is otherwise decided by noise. Leaves the last run's
# output in OUT, every run's per-request log in LOGFILE, and REPS; with more than one run REP_RPS
# (the median run's req/s), REP_OK and REP_BAD (sums), REP_MEAN_US (mean over all requests).
# Returns the first failing run's exit status.
run_h2load_repeated() {
  local n=$1 c=$2 url=$3 out=$4 logf=$5 rc=0 total_us=0 rps_list="" run_log="$5.run"
  shift 5
  REPS=0 REP_OK=0 REP_BAD=0
  while :; do
    rm -f "$run_log"
    timeout "$POINT_TIMEOUT" taskset -c "$LOAD_CPU" h2load -n "$n" -c "$c" "$@" --log-file="$run_log" "$url" \
      >"$out" 2>&1 || rc=$?
    REPS=$((REPS + 1))
    [[ -f "$run_log" ]] && cat "$run_log" >>"$logf"
    ((rc == 0)) && grep -q '^finished in' "$out" && grep -q '^status codes:' "$out" || return "$rc"
    parse_h2load "$out" "$run_log"
    REP_OK=$((REP_OK + OK)) REP_BAD=$((REP_BAD + BAD)) rps_list+=" $RPS"
    total_us=$(awk -v t="$total_us" -v n="$n" -v r="$RPS" 'BEGIN { printf "%.0f", t + (r > 0 ? n * 1e6 / r : 0) }')
    ((total_us >= MIN_POINT_SECONDS * 1000000 || REPS >= MAX_REPS)) && break
  done
  rm -f "$run_log"
  REP_RPS=$(median $rps_list)
  REP_MEAN_US=$(cut -f3 "$logf" | awk '{ s += $1 } END { if (NR) printf "%.1f", s / NR; else print "nan" }')
}

# Appends one line to $TMP/raw.tsv: proto c round proxy rps ok bad mean_us p99_us cpu_us rss_mb other load_us
# up_conns note
measure_point() {  # measure_point PROXY PROTO C ROUND
  local proxy=$1 proto=$2 c=$3 round=$4 n url out="$TMP/load/h2load.txt" logf="$TMP/load/h2load.log" rc=0 note="" args=()
  n=$((c * REQS_PER_CONN))
  url=$(proto_url "$proxy" "$proto")
  start_proxy "$proxy" "$proto"
  [[ "$proto" == h2 ]] || args+=(--h1)
  [[ "$proto" == h1c ]] || args+=(--tls13-ciphers=TLS_AES_256_GCM_SHA384)
  log "$proto c=$c / $proxy: h2load -n $n -c $c ${args[*]} $url"
  rm -f "$logf"
  local opens_before
  opens_before=$(tcp_active_opens)
  window_start "$PROXY_PID" "$BACKEND_PID"
  run_h2load_repeated "$n" "$c" "$url" "$out" "$logf" "${args[@]}" || rc=$?
  window_end
  # Connections the proxy opened to the backend: every TCP connect on the machine during the
  # point, less h2load's own (c a run).
  UP_CONNS=$(($(tcp_active_opens) - opens_before - c * REPS))
  kill -0 "$PROXY_PID" 2>/dev/null || note="proxy exited during the run"
  if ((rc == 124)); then
    note="h2load cut off after ${POINT_TIMEOUT}s${note:+; $note}"
  elif ((rc != 0)); then
    note="h2load exit $rc: $(grep -v '^progress' "$out" | tail -n 1)${note:+; $note}"
  fi
  if grep -q '^finished in' "$out" && grep -q '^requests:' "$out" && grep -q '^status codes:' "$out"; then
    parse_h2load "$out" "$logf"
    if ((REPS > 1)); then
      RPS=$REP_RPS OK=$REP_OK BAD=$REP_BAD MEAN_US=$REP_MEAN_US
      note="req/s: the median of $REPS runs${note:+; $note}"
    fi
    if [[ "$proto" != h1c ]]; then
      local want=h2
      [[ "$proto" == h1 ]] && want=http/1.1
      grep -q "^Application protocol: $want\$" "$out" || note="ALPN did not give $want${note:+; $note}"
    fi
  else
    RPS=nan OK=0 BAD=$n MEAN_US=nan P99_US=nan
    [[ -n "$note" ]] || note="no h2load summary: $(tail -n 1 "$out")"
  fi
  # Under 10 ticks (0.1 s of CPU) the figure is mostly rounding: n/a.
  if ((W_TICKS >= 10)); then CPU_US=$(us_per_req "$W_TICKS" "$OK"); else CPU_US=nan; fi
  if ((W_LOAD >= 10)); then LOAD_US=$(us_per_req "$W_LOAD" "$OK"); else LOAD_US=nan; fi
  if ((BAD > 0)); then
    note="$BAD of $n requests failed or non-2xx${note:+; $note}"
    log "$proto c=$c / $proxy: h2load's output (without progress lines):"
    grep -v -e '^progress:' -e '^spawning thread' "$out" | head -n 40 >&2 || true
  fi
  log "$proto c=$c / $proxy: $RPS req/s, $OK 2xx, $BAD bad, mean $(fmt_ms "$MEAN_US"), p99 $(fmt_ms "$P99_US"), cpu $W_TICKS ticks (user $W_USER, sys $W_SYS) -> $CPU_US us/req, load side $LOAD_US us/req, upstream connects $UP_CONNS, rss $RSS_MB MB, other CPU ${OTHER_PCT}%${note:+ -- $note}"
  ((OTHER_PCT > OTHER_WARN_PCT)) && log "WARNING: ${OTHER_PCT}% of the machine went to other processes during this point"
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$proto" "$c" "$round" "$proxy" "$RPS" "$OK" "$BAD" \
    "$MEAN_US" "$P99_US" "$CPU_US" "$RSS_MB" "$OTHER_PCT" "$LOAD_US" "$UP_CONNS" "$note" >>"$TMP/raw.tsv"
  rm -f "$logf"
  # Nothing to drain in a benchmark, and Aralez's SIGTERM path sleeps 5 s: stop every proxy at once.
  kill_started "$PROXY_PID"
}

# ---------------------------------------------------------------- run
BUSY_PCT=$(busy_pct_1s)
((BUSY_PCT > 10)) && log "WARNING: the machine is ${BUSY_PCT}% busy before the run; numbers will be distorted"
make_cert "$TMP/certs"
write_configs
if has_proxy aralez; then
  timeout 30 "$ARALEZ_BIN" check-config -c "$TMP/aralez/main.yaml" >"$TMP/load/check.out" 2>&1 \
    || { cat "$TMP/load/check.out" >&2; die "aralez check-config refused the benchmark config"; }
fi
start_bg backend "$LOAD_CPU" nginx -p "$TMP/backend" -e "$TMP/backend/error.log" -c "$TMP/backend.conf"
BACKEND_PID=$LAST_PID
wait_ok backend "http://127.0.0.1:$P_BACKEND/" 1.1 "$BACKEND_PID"

T0=$(date +%s)
: >"$TMP/raw.tsv"
for proto in $PROTOCOLS; do
  for c in $CONNS; do
    for ((round = 0; round < ROUNDS; round++)); do
      for proxy in $(rotate "$round" $PROXIES); do
        measure_point "$proxy" "$proto" "$c" "$round"
      done
    done
  done
done
ELAPSED=$(($(date +%s) - T0))

# ---------------------------------------------------------------- aggregate (medians over rounds)
# $OUT_TSV: proto c proxy rps ok bad mean_us p99_us cpu_us rss_mb other_pct load_us up_conns note.
# col FIELD: that field of every round of the current (proto, c, proxy) in raw.tsv.
col() { awk -F'\t' -v p="$proto" -v c="$c" -v x="$proxy" -v i="$1" '$1 == p && $2 == c && $4 == x {print $i}' "$TMP/raw.tsv"; }
{
  printf 'proto\tc\tproxy\trps\tok\tbad\tmean_us\tp99_us\tcpu_us\trss_mb\tother_pct\tload_us\tup_conns\tnote\n'
  for proto in $PROTOCOLS; do
    for c in $CONNS; do
      for proxy in $PROXIES; do
        printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$proto" "$c" "$proxy" \
          "$(median $(col 5))" "$(col 6 | awk '{s += $1} END {print s + 0}')" "$(col 7 | awk '{s += $1} END {print s + 0}')" \
          "$(median $(col 8))" "$(median $(col 9))" "$(median $(col 10))" "$(maximum $(col 11))" "$(maximum $(col 12))" \
          "$(median $(col 13))" "$(median $(col 14))" "$(col 15 | awk 'NF' | paste -sd ';' -)"
      done
    done
  done
} >"$TMP/sweep.tsv"

# ---------------------------------------------------------------- report
get() {  # get PROTO C PROXY FIELD (field names of the header of sweep.tsv)
  awk -F'\t' -v p="$1" -v c="$2" -v x="$3" -v f="$4" '
    NR == 1 { for (i = 1; i <= NF; i++) idx[$i] = i; next }
    $1 == p && $2 == c && $3 == x { print $idx[f] }' "$TMP/sweep.tsv"
}
fmt_rps() { awk -v r="$1" 'BEGIN { if (r == "nan" || r == "") print "n/a"; else printf "%.0f", r }'; }
ms2() { awk -v u="$1" 'BEGIN { if (u == "nan" || u == "") print "n/a"; else printf "%.2f", u / 1000 }'; }

# point_table PROTO TITLE CELL: a blank line, "### TITLE", then a row per c and a column per proxy,
# each cell printed by `CELL PROTO C PROXY`.
point_table() {
  local proto=$1 title=$2 cell=$3 c p
  echo
  echo "### $title"
  echo
  printf '| c |'; for p in $PROXIES; do printf ' %s |' "$(proxy_label "$p")"; done; echo
  printf '| ---: |'; for p in $PROXIES; do printf ' ---: |'; done; echo
  for c in $CONNS; do
    printf '| %s |' "$c"
    for p in $PROXIES; do printf ' %s |' "$("$cell" "$proto" "$c" "$p")"; done
    echo
  done
}
latency_cell() { printf '%s / %s' "$(ms2 "$(get "$1" "$2" "$3" mean_us)")" "$(ms2 "$(get "$1" "$2" "$3" p99_us)")"; }
cpu_rss_cell() { printf '%s / %s' "$(get "$1" "$2" "$3" cpu_us | sed 's/^nan$/n\/a/')" "$(get "$1" "$2" "$3" rss_mb)"; }
up_conns_cell() { get "$1" "$2" "$3" up_conns | sed 's/^nan$/n\/a/'; }
load_core_cell() {
  awk -v l="$(get "$1" "$2" "$3" load_us)" -v r="$(get "$1" "$2" "$3" rps)" \
    'BEGIN { if (l == "nan" || l == "" || r == "nan" || r == "") print "n/a"; else printf "%.1f / %.0f %%", l, l * r / 1e4 }'
}

REPORT="$TMP/report.md"
AHEAD_MISS=()
CLIFF_LINES=()
PEERS_LIST=$(printf '%s\n' $PROXIES | grep -vx aralez | tr '\n' ' ' || true)
{
  echo "# Concurrency sweep: $(for p in $PROXIES; do proxy_label "$p"; done | paste -sd ',' - | sed 's/,/, /g')"
  echo
  echo "- date: $(date -u '+%Y-%m-%d %H:%M:%S UTC'); sweep took ${ELAPSED}s"
  echo "- machine: $(nproc) cores, $(lscpu 2>/dev/null | awk -F: '/^Model name/ {gsub(/^ +/, "", $2); print $2; exit}'), kernel $(uname -r); open-file limit $NOFILE; net.core.somaxconn $(cat /proc/sys/net/core/somaxconn 2>/dev/null || echo '?'), tcp_max_syn_backlog $(cat /proc/sys/net/ipv4/tcp_max_syn_backlog 2>/dev/null || echo '?')"
  echo "- load: \`h2load -n \$((c*$REQS_PER_CONN)) -c c\` (one h2load thread, 1 request in flight per connection; TLS 1.3 with TLS_AES_256_GCM_SHA384 for every proxy) at c = $CONNS; each proxy started fresh for each point, checked with curl, no warm-up (as the comparison)"
  echo "- pinning: each proxy one worker/thread on core $PROXY_CPU; backend (nginx \`return 200\`, 13-byte body) and h2load on core $LOAD_CPU"
  echo "- connection caps: nginx worker_connections $NOFILE and listen backlog 65535; HAProxy maxconn $HAPROXY_MAXCONN (global and frontend; 100000 unless the open-file limit forbids it); aralez max_connections and upstream_max_connections 100000; Aralez has none. Idle upstream pool $POOL on every proxy; TLS handshake and first request head within ${HEADER_TIMEOUT} s on aralez, nginx and HAProxy (Aralez: its own default)"
  peer_headers_line
  peer_defer_line
  echo "- versions: $(nginx -v 2>&1 | sed 's/^nginx version: //')$(has_proxy haproxy && echo ", $(haproxy -v 2>/dev/null | head -1 | awk '{print "HAProxy " $3}')"), $(h2load --version 2>/dev/null | head -1), $(openssl version | awk '{print $1, $2}')$(has_proxy aralez && echo ", aralez $ARALEZ_BIN (git $(git -C "$REPO_ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown))")$(has_proxy Aralez && echo ", Aralez $ARALEZ_PEER_VERSION $ARALEZ_PEER_BIN")"
  ((ROUNDS > 1)) && echo "- $ROUNDS rounds per point, order rotated; medians shown (RSS: the highest round; failures: summed)"
  echo "- CPUs busy in the 1 s before the run: ${BUSY_PCT}%$( ((BUSY_PCT > 10)) && echo " -- WARNING: machine not idle, numbers distorted")"
  [[ -n "${ARALEZ_EXTRA_YAML:-}" ]] && echo "- aralez main.yaml extra lines (ARALEZ_EXTRA_YAML): \`$(printf '%s' "$ARALEZ_EXTRA_YAML" | paste -sd ';' -)\`"
  [[ -n "$SKIPPED" ]] && echo "- **$SKIPPED**"
  [[ -n "$FD_NOTE" ]] && echo "- **WARNING: $FD_NOTE**"
  for proto in $PROTOCOLS; do
    echo
    echo "## $(proto_title "$proto")"
    echo
    [[ -n "$SKIPPED" ]] && { echo "$SKIPPED."; echo; }
    echo "### req/s"
    echo
    printf '| c |'; for p in $PROXIES; do printf ' %s |' "$(proxy_label "$p")"; done
    has_proxy aralez && [[ -n "${PEERS_LIST// }" ]] && printf ' aralez / best peer |'
    echo
    printf '| ---: |'; for p in $PROXIES; do printf ' ---: |'; done
    has_proxy aralez && [[ -n "${PEERS_LIST// }" ]] && printf ' ---: |'
    echo
    best_self=0
    for c in $CONNS; do
      printf '| %s |' "$c"
      for p in $PROXIES; do
        bad=$(get "$proto" "$c" "$p" bad)
        if ((bad > 0)); then
          printf ' %s (%s failed) |' "$(fmt_rps "$(get "$proto" "$c" "$p" rps)")" "$bad"
        else
          printf ' %s |' "$(fmt_rps "$(get "$proto" "$c" "$p" rps)")"
        fi
      done
      if has_proxy aralez && [[ -n "${PEERS_LIST// }" ]]; then
        own=$(get "$proto" "$c" aralez rps)
        best=nan best_name=""
        for p in $PEERS_LIST; do
          r=$(get "$proto" "$c" "$p" rps)
          if [[ "$r" != nan ]] && { [[ "$best" == nan ]] || awk -v a="$r" -v b="$best" 'BEGIN {exit !(a > b)}'; }; then
            best=$r best_name=$(proxy_label "$p")
          fi
        done
        printf ' %s |' "$(ratio "$own" "$best")"
        # aralez ahead at this point: no failure of its own, and more req/s than every peer
        if (($(get "$proto" "$c" aralez bad) > 0)) || [[ "$own" == nan ]]; then
          AHEAD_MISS+=("$proto c=$c (aralez had failures)")
        elif [[ "$best" != nan ]] && ! awk -v a="$own" -v b="$best" 'BEGIN {exit !(a > b)}'; then
          AHEAD_MISS+=("$proto c=$c ($best_name $(fmt_rps "$best") >= aralez $(fmt_rps "$own"))")
        fi
      fi
      echo
    done
    point_table "$proto" "latency, mean / p99 (ms)" latency_cell
    point_table "$proto" "proxy CPU us/req / peak RSS MB (CPU n/a: under 0.1 s of CPU in the run, too coarse to divide)" cpu_rss_cell
    point_table "$proto" "load core (backend + h2load): CPU us/req / % of the core busy (near 100 %: the load side, not the proxy, sets req/s)" load_core_cell
    point_table "$proto" "connections opened to the backend during the run (each one an accept and a close on the load core)" up_conns_cell
    if has_proxy aralez; then
      own_max=$(maximum $(for c in $CONNS; do get "$proto" "$c" aralez rps; done))
      own_top=$(get "$proto" "$MAXC" aralez rps)
      CLIFF_LINES+=("aralez req/s at $MAXC ($(proto_title "$proto")) = $(awk -v a="$own_top" -v b="$own_max" 'BEGIN { if (a == "nan" || b == "nan" || b == 0) print "n/a"; else printf "%.0f", 100 * a / b }') % of its best point ($(fmt_rps "$own_max") req/s)")
    fi
  done
  echo
  echo "## Summary"
  echo
  if has_proxy aralez && [[ -n "${PEERS_LIST// }" ]]; then
    if ((${#AHEAD_MISS[@]} == 0)); then
      echo "- aralez ahead of every peer at every point: **yes**"
    else
      echo "- aralez ahead of every peer at every point: **no** (not at: $(printf '%s; ' "${AHEAD_MISS[@]}" | sed 's/; $//'))"
    fi
  fi
  for l in "${CLIFF_LINES[@]}"; do echo "- $l"; done
  echo
  echo "Notes: req/s is h2load's (\`finished in ..., N req/s\`: all requests over the whole run, connection setup included); \"failed\" counts"
  echo "non-2xx, failed, errored and timed-out requests. Mean latency is h2load's \"time for request\"; p99 is computed from its"
  echo "per-request log (--log-file). CPU us/req = (utime+stime) of the proxy's processes during the run / 2xx responses;"
  echo "runs shorter than about a second (small c) have coarse CPU figures (10 ms ticks). RSS = sum of VmHWM of the proxy's processes."
  echo "Load core CPU us/req = (utime+stime) of the backend's processes and of h2load during the run / 2xx responses; its busy % is"
  echo "that times req/s: both share one core, so near 100 % the point measures the load side, and proxies within its noise tie."
  notes=$(awk -F'\t' 'NR > 1 && $14 != "" {print "- " $1 " c=" $2 " " $3 ": " $14}' "$TMP/sweep.tsv")
  [[ -n "$notes" ]] && { echo; echo "Problems seen:"; echo; echo "$notes"; }
  hot=$(awk -F'\t' -v w="$OTHER_WARN_PCT" 'NR > 1 { n++ } NR > 1 && $11 > w { k++; if ($11 > m) m = $11; l = l (k > 1 ? ", " : "") $1 " c=" $2 " " $3 }
    END { if (k > 8) printf "%d of %d points (up to %d%%)", k, n, m; else if (k) printf "%s (up to %d%%)", l, m }' "$TMP/sweep.tsv")
  [[ -n "$hot" ]] && { echo; echo "**WARNING: other processes used more than ${OTHER_WARN_PCT}% of the machine during $hot: those numbers are distorted.**"; }
  echo
  echo "Plot: bench/sweep.svg (req/s against connections, log x axis)."
} >"$REPORT"

cp "$TMP/sweep.tsv" "$OUT_TSV"
labels=$(for p in $PROXIES; do printf '%s=%s\t' "$p" "$(proxy_label "$p")"; done)
python3 "$SCRIPT_DIR/sweep_plot.py" "$OUT_TSV" "$OUT_SVG" "$labels" \
  "$(for p in $PROTOCOLS; do printf '%s=%s\t' "$p" "$(proto_title "$p")"; done)*=Concurrency sweep: req/s against connections (h2load -n c*$REQS_PER_CONN -c c)" \
  || die "sweep_plot.py failed"
cp "$REPORT" "$OUT_MD"
cat "$REPORT"
log "written to $OUT_MD, $OUT_TSV and $OUT_SVG"
