#!/usr/bin/env bash
# Side-by-side reverse proxy benchmark: aralez, nginx and HAProxy in front of the same
# fixed-response backend (an nginx `return 200`), each proxy measured in turn in the same run.
#
#   cargo build --release && sudo bash bench/run.sh
#
# Env knobs:
#   DURATION   seconds of measured load per proxy x scenario (default 10); a 2 s warm-up precedes it
#   SCENARIOS  any of "h1 post h2c" (default all three)
#   PROXIES    any of "aralez nginx haproxy" (default all three)
#   ARALEZ_BIN aralez binary (default target/release/aralez; built with `cargo build --release`
#              only when that default is missing and ARALEZ_BIN was not set)
#   BASE_PORT  first of 6 consecutive localhost ports used (default 18080)
#   RELOAD_MS  if set, aralez's upstreams.yaml is rewritten every RELOAD_MS ms during its measured
#              window (each write a real change, so each one is a full reload); see bench/reload.sh
#   RELOAD_CONTENT  `new` (default) or `same`: the same loop rewriting identical bytes, which aralez
#              skips, to measure what the loop itself costs the load generator
#   PROXY_CPU / LOAD_CPU  cores for the proxy and for backend + load generator (default 0 / 1)
#
# Run it on an otherwise idle machine; it warns when the CPUs were busy just before it started and
# when other processes used CPU during a measured window.
#
# See bench/README.md for what is measured and how.
set -euo pipefail

DURATION=${DURATION:-10}
SCENARIOS=${SCENARIOS:-"h1 post h2c"}
PROXIES=${PROXIES:-"aralez nginx haproxy"}
BASE_PORT=${BASE_PORT:-18080}
PROXY_CPU=${PROXY_CPU:-0}
LOAD_CPU=${LOAD_CPU:-1}
WARMUP=2
OTHER_WARN_PCT=3   # flag a window where other processes used more than this % of the machine

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd "$SCRIPT_DIR/.." && pwd)
OUT_MD="$SCRIPT_DIR/last-run.md"

log() { printf '[bench] %s\n' "$*" >&2; }
die() { printf '[bench] ERROR: %s\n' "$*" >&2; exit 1; }

# ---------------------------------------------------------------- argument checks
[[ "$DURATION" =~ ^[1-9][0-9]*$ ]] || die "DURATION must be a positive integer (seconds), got '$DURATION'"
for s in $SCENARIOS; do
  case "$s" in h1|post|h2c) ;; *) die "unknown scenario '$s' (known: h1 post h2c)";; esac
done
for p in $PROXIES; do
  case "$p" in aralez|nginx|haproxy) ;; *) die "unknown proxy '$p' (known: aralez nginx haproxy)";; esac
done
[[ -n "${SCENARIOS// }" ]] || die "SCENARIOS is empty"
[[ -n "${PROXIES// }" ]] || die "PROXIES is empty"

has_proxy() { [[ " $PROXIES " == *" $1 "* ]]; }

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
[[ " $SCENARIOS " == *" h2c "* ]] && need_cmds+=(h2load)
missing=()
for c in "${need_cmds[@]}"; do command -v "$c" >/dev/null 2>&1 || missing+=("$c"); done
# nginx lives in /usr/sbin, which may not be on a non-root PATH.
export PATH="$PATH:/usr/sbin:/sbin"

stop_system_service() {
  local svc=$1
  if command -v systemctl >/dev/null 2>&1 && [[ -d /run/systemd/system ]]; then
    timeout 30 systemctl disable --now "$svc" >/dev/null 2>&1 || true
  elif [[ -x "/etc/init.d/$svc" ]]; then
    timeout 30 "/etc/init.d/$svc" stop >/dev/null 2>&1 || true
  fi
}

if ((${#missing[@]})); then
  if [[ $(id -u) -ne 0 ]]; then
    die "missing tools: ${missing[*]}; run as root (sudo bash bench/run.sh) to install them with apt-get"
  fi
  command -v apt-get >/dev/null 2>&1 || die "missing tools: ${missing[*]} and no apt-get to install them"
  log "installing missing tools (${missing[*]}) with apt-get"
  export DEBIAN_FRONTEND=noninteractive
  timeout 600 apt-get update -qq || die "apt-get update failed"
  nginx_pkg=nginx-light
  apt-cache show nginx-light >/dev/null 2>&1 || nginx_pkg=nginx
  timeout 900 apt-get install -y -qq "$nginx_pkg" haproxy wrk nghttp2-client util-linux procps curl \
    || die "apt-get install failed"
  # The packages may start (and enable) their system services; we run our own instances only.
  stop_system_service nginx
  stop_system_service haproxy
  for c in "${need_cmds[@]}"; do command -v "$c" >/dev/null 2>&1 || die "'$c' still missing after install"; done
fi

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

port_in_use() {
  # true if something is listening on 127.0.0.1:$1 (or any address)
  if command -v ss >/dev/null 2>&1; then
    ss -Hltn "sport = :$1" 2>/dev/null | grep -q .
  else
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
  fi
}
for p in $P_BACKEND $P_ARALEZ $P_NGINX $P_NGINX_H2 $P_HAPROXY $P_HAPROXY_H2; do
  port_in_use "$p" && die "port $p is already in use (set BASE_PORT to a free range of 6 ports)"
done

# ---------------------------------------------------------------- temp dir and cleanup
TMP=$(mktemp -d /tmp/aralez-bench.XXXXXX)
chmod 755 "$TMP"   # nginx workers run as an unprivileged user when started as root
STARTED_PIDS=()

stop_pid() {
  local pid=$1 i
  kill -0 "$pid" 2>/dev/null || return 0
  kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < 50; i++)); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$pid" 2>/dev/null; then
    pkill -KILL -P "$pid" 2>/dev/null || true
    kill -KILL "$pid" 2>/dev/null || true
  fi
  wait "$pid" 2>/dev/null || true
}

cleanup() {
  local rc=$? pid
  trap - EXIT INT TERM
  for pid in "${STARTED_PIDS[@]}"; do stop_pid "$pid"; done
  rm -rf "$TMP"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Start a long-running server in the background, pinned to a core. taskset execs the program,
# so $! is the server's own pid.
start_bg() {  # start_bg NAME CPU cmd...
  local name=$1 cpu=$2
  shift 2
  taskset -c "$cpu" "$@" >"$TMP/$name.out" 2>&1 &
  LAST_PID=$!
  STARTED_PIDS+=("$LAST_PID")
}

stop_started() {  # stop_started PID: stop it and drop it from the cleanup list
  local pid=$1 keep=() p
  stop_pid "$pid"
  for p in "${STARTED_PIDS[@]}"; do [[ "$p" == "$pid" ]] || keep+=("$p"); done
  STARTED_PIDS=("${keep[@]}")
}

# Wait (bounded, 10 s) until URL answers 200 with the expected body. $3 = extra curl flag or "".
wait_ok() {
  local name=$1 url=$2 flag=${3:-} pid=$4 i code="" ver="" body want_ver=1.1
  [[ "$flag" == --http2-prior-knowledge ]] && want_ver=2
  for ((i = 0; i < 100; i++)); do
    kill -0 "$pid" 2>/dev/null || { cat "$TMP/$name.out" >&2 || true; die "$name exited during startup"; }
    read -r code ver < <(curl -s ${flag:+"$flag"} -o "$TMP/curl.body" -w '%{http_code} %{http_version}\n' \
      --max-time 2 "$url" 2>/dev/null || true) || true
    if [[ "${code:-}" == 200 ]]; then
      body=$(cat "$TMP/curl.body")
      [[ "$body" == "hello, world" ]] || die "$name: $url answered 200 but with body '$body'"
      [[ "$ver" == "$want_ver" ]] || die "$name: $url answered over HTTP/$ver, expected HTTP/$want_ver"
      return 0
    fi
    sleep 0.1
  done
  cat "$TMP/$name.out" >&2 || true
  die "$name: $url did not answer 200 within 10 s (last status: ${code:-none})"
}

# ---------------------------------------------------------------- configs
nginx_common() {  # nginx_common NAME : global part of an nginx config rooted in $TMP/NAME
  local d="$TMP/$1"
  mkdir -p "$d"
  cat <<EOF
worker_processes 1;
daemon off;
master_process on;
pid $d/nginx.pid;
error_log $d/error.log error;
events { worker_connections 1024; }
EOF
}

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

write_nginx_conf() {
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
        listen 127.0.0.1:$P_NGINX;
        listen 127.0.0.1:$P_NGINX_H2 http2;
        location / {
            proxy_pass http://backend;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }
    }
}
EOF
  } >"$TMP/nginx.conf"
}

write_haproxy_conf() {
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
    bind 127.0.0.1:$P_HAPROXY
    default_backend be

frontend fe_h2c
    bind 127.0.0.1:$P_HAPROXY_H2 proto h2
    default_backend be

backend be
    server s1 127.0.0.1:$P_BACKEND
EOF
}

write_aralez_conf() {
  cat >"$TMP/main.yaml" <<EOF
threads: 1
proxy_address_http: "127.0.0.1:$P_ARALEZ"
upstreams_conf: "$TMP/upstreams.yaml"
log_level: error
EOF
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
# h1 / h2c URL of each proxy
proxy_url() {  # proxy_url PROXY SCENARIO
  local port
  case "$1:$2" in
    aralez:*) port=$P_ARALEZ ;;
    nginx:h2c) port=$P_NGINX_H2 ;;
    nginx:*) port=$P_NGINX ;;
    haproxy:h2c) port=$P_HAPROXY_H2 ;;
    haproxy:*) port=$P_HAPROXY ;;
  esac
  echo "http://127.0.0.1:$port/"
}

start_proxy() {  # start_proxy NAME SCENARIO -> PROXY_PID
  case "$1" in
    aralez)
      write_aralez_conf
      start_bg aralez "$PROXY_CPU" "$ARALEZ_BIN" -c "$TMP/main.yaml"
      ;;
    nginx)
      write_nginx_conf
      start_bg nginx "$PROXY_CPU" nginx -p "$TMP/nginx" -e "$TMP/nginx/error.log" -c "$TMP/nginx.conf"
      ;;
    haproxy)
      write_haproxy_conf
      start_bg haproxy "$PROXY_CPU" haproxy -db -f "$TMP/haproxy.cfg"
      ;;
  esac
  PROXY_PID=$LAST_PID
  # The proxy must answer 200 (with the backend's body) through curl, in the scenario's protocol,
  # before any load.
  if [[ "$2" == h2c ]]; then
    wait_ok "$1" "$(proxy_url "$1" h2c)" --http2-prior-knowledge "$PROXY_PID"
  else
    wait_ok "$1" "$(proxy_url "$1" h1)" "" "$PROXY_PID"
  fi
}

# All pids of a process tree (root first).
pid_tree() {
  local pid=$1 c
  echo "$pid"
  for c in $(pgrep -P "$pid" 2>/dev/null || true); do pid_tree "$c"; done
}

# Sums of utime and stime (clock ticks) over the given pids: fields 14 and 15 of /proc/<pid>/stat.
# Prints "utime stime".
cpu_ticks() {
  local ut=0 st=0 pid s f
  for pid in "$@"; do
    s=$(cat "/proc/$pid/stat" 2>/dev/null) || die "process $pid vanished during the measurement"
    s=${s##*) }            # drop "pid (comm) "; the remaining fields start at field 3
    read -r -a f <<<"$s"
    ut=$((ut + f[11]))
    st=$((st + f[12]))
  done
  echo "$ut $st"
}

# Machine-wide busy and idle ticks (all CPUs) from /proc/stat: prints "busy idle".
cpu_busy_idle() { awk '/^cpu / {print $2 + $3 + $4 + $7 + $8 + $9, $5 + $6}' /proc/stat; }

# CPU ticks of this shell's reaped children (cutime + cstime, fields 16 and 17): the load generator's
# CPU time is added here when it exits.
child_ticks() {
  local s f
  s=$(<"/proc/$$/stat")
  s=${s##*) }
  read -r -a f <<<"$s"
  echo $((f[13] + f[14]))
}

# Sum of VmHWM (kB) over the given pids.
hwm_kb() {
  local total=0 pid v
  for pid in "$@"; do
    v=$(awk '/^VmHWM:/ {print $2}' "/proc/$pid/status" 2>/dev/null || true)
    total=$((total + ${v:-0}))
  done
  echo "$total"
}

# wrk latency like "245.12us", "1.23ms", "2.00s" -> microseconds
to_us() {
  awk -v v="$1" 'BEGIN {
    n = v + 0; u = v; sub(/^[0-9.]+/, "", u)
    if (u == "us") m = 1; else if (u == "ms") m = 1000; else if (u == "s") m = 1000000;
    else if (u == "m") m = 60000000; else { print "nan"; exit }
    printf "%.1f", n * m }'
}

# ---------------------------------------------------------------- load generators
# Each sets: RPS, OK (2xx responses), BAD (non-2xx/failed), P50_US, P99_US, MEAN_US, SD_US, NOTE
run_wrk() {  # run_wrk URL DURATION OUTFILE [lua script]
  local url=$1 dur=$2 out=$3 script=${4:-}
  timeout $((dur + 30)) taskset -c "$LOAD_CPU" wrk -t1 -c32 -d"${dur}s" --latency \
    ${script:+-s "$script"} "$url" >"$out" 2>&1 || { cat "$out" >&2; die "wrk failed against $url"; }
}

parse_wrk() {  # parse_wrk OUTFILE
  local out=$1 total
  RPS=$(awk '/^Requests\/sec:/ {printf "%.0f", $2}' "$out")
  total=$(awk '/ requests in / {print $1}' "$out")
  BAD=$(awk '/Non-2xx or 3xx responses:/ {print $NF}' "$out")
  BAD=${BAD:-0}
  OK=$((total - BAD))
  P50_US=$(to_us "$(awk '$1 == "50%" {print $2}' "$out")")
  P99_US=$(to_us "$(awk '$1 == "99%" {print $2}' "$out")")
  MEAN_US=$(to_us "$(awk '$1 == "Latency" && NF >= 4 {print $2; exit}' "$out")")
  SD_US=$(to_us "$(awk '$1 == "Latency" && NF >= 4 {print $3; exit}' "$out")")
  NOTE=$(grep -E '^ *Socket errors:' "$out" | sed 's/^ *//' || true)
  [[ -n "$RPS" && -n "$total" ]] || { cat "$out" >&2; die "could not parse wrk output"; }
}

run_h2load() {  # run_h2load URL DURATION OUTFILE [logfile]
  local url=$1 dur=$2 out=$3 logf=${4:-}
  timeout $((dur + 30)) taskset -c "$LOAD_CPU" h2load -c16 -m16 -D "$dur" \
    ${logf:+--log-file="$logf"} "$url" >"$out" 2>&1 || { cat "$out" >&2; die "h2load failed against $url"; }
}

parse_h2load() {  # parse_h2load OUTFILE LOGFILE
  local out=$1 logf=$2 failed
  RPS=$(awk '/^finished in/ {gsub(",", "", $4); printf "%.0f", $4}' "$out")
  OK=$(awk '/^status codes:/ {print $3}' "$out")
  # non-2xx status codes + requests that failed/errored/timed out without a status
  BAD=$(awk '/^status codes:/ {gsub(",", ""); print $5 + $7 + $9}' "$out")
  failed=$(awk '/^requests:/ {gsub(",", ""); print $10 + $12 + $14}' "$out")
  [[ -n "$RPS" && -n "$OK" && -n "$BAD" && -n "$failed" ]] || { cat "$out" >&2; die "could not parse h2load output"; }
  BAD=$((BAD + failed))
  # "time for request:  min  max  mean  sd  +/- sd"
  MEAN_US=$(to_us "$(awk '/^time for request:/ {print $6}' "$out")")
  SD_US=$(to_us "$(awk '/^time for request:/ {print $7}' "$out")")
  # p50/p99 from h2load's per-request log (3rd column: microseconds until end of response)
  if [[ -s "$logf" ]]; then
    read -r P50_US P99_US < <(cut -f3 "$logf" | sort -n | awk '
      { v[NR] = $1 }
      END {
        if (NR == 0) { print "nan nan"; exit }
        i50 = int(NR * 0.50); if (i50 < 1) i50 = 1
        i99 = int(NR * 0.99); if (i99 < 1) i99 = 1
        printf "%.1f %.1f\n", v[i50], v[i99]
      }')
  else
    P50_US=nan P99_US=nan
  fi
  NOTE=""
}

# ---------------------------------------------------------------- one measurement
# Globals filled: RPS OK BAD P50_US P99_US MEAN_US SD_US CPU_US RSS_MB NOTE
measure() {  # measure PROXY SCENARIO
  local proxy=$1 sc=$2 url pids bpids u0 s0 u1 s1 bu0 bs0 bu1 bs1 mb0 mi0 mb1 mi1 c0 c1 other ticks out="$TMP/$1-$2.txt" logf="$TMP/$1-$2.h2log"
  url=$(proxy_url "$proxy" "$sc")
  start_proxy "$proxy" "$sc"
  log "$sc / $proxy: warm-up ${WARMUP}s, then ${DURATION}s against $url"
  case "$sc" in
    h1) run_wrk "$url" "$WARMUP" "$TMP/warmup.txt" ;;
    post) run_wrk "$url" "$WARMUP" "$TMP/warmup.txt" "$TMP/post.lua" ;;
    h2c) run_h2load "$url" "$WARMUP" "$TMP/warmup.txt" ;;
  esac
  mapfile -t pids < <(pid_tree "$PROXY_PID")
  mapfile -t bpids < <(pid_tree "$BACKEND_PID")
  read -r mb0 mi0 < <(cpu_busy_idle)
  read -r bu0 bs0 < <(cpu_ticks "${bpids[@]}")
  read -r u0 s0 < <(cpu_ticks "${pids[@]}")
  c0=$(child_ticks)
  local reloader_pid=""
  if [[ "$proxy" == aralez && -n "${RELOAD_MS:-}" ]]; then
    # Rewrite the routes every RELOAD_MS ms (content changes each time, so each is a real reload).
    taskset -c "$LOAD_CPU" bash -c 'n=0; while :; do n=$((n+1)); [ "$4" = same ] && n=0; { cat "$1"; echo "# reload $n"; } > "$2.tmp"; mv "$2.tmp" "$2"; sleep "$3"; done' \
      _ "$TMP/upstreams.base" "$TMP/upstreams.yaml" "$(awk -v ms="$RELOAD_MS" 'BEGIN {printf "%.3f", ms / 1000}')" "${RELOAD_CONTENT:-new}" &
    reloader_pid=$!
  fi
  case "$sc" in
    h1) run_wrk "$url" "$DURATION" "$out" ;;
    post) run_wrk "$url" "$DURATION" "$out" "$TMP/post.lua" ;;
    h2c) run_h2load "$url" "$DURATION" "$out" "$logf" ;;
  esac
  c1=$(child_ticks)
  if [[ -n "$reloader_pid" ]]; then
    kill "$reloader_pid" 2>/dev/null || true
    wait "$reloader_pid" 2>/dev/null || true
  fi
  read -r u1 s1 < <(cpu_ticks "${pids[@]}")
  read -r bu1 bs1 < <(cpu_ticks "${bpids[@]}")
  read -r mb1 mi1 < <(cpu_busy_idle)
  [[ -n "${u1:-}" && -n "${s1:-}" && -n "${u0:-}" && -n "${s0:-}" ]] || die "could not read the CPU time of $proxy"
  [[ -n "${bu1:-}" && -n "${bu0:-}" && -n "${mb1:-}" && -n "${mb0:-}" ]] || die "could not read the CPU time of the backend/machine"
  ticks=$((u1 + s1 - u0 - s0))
  # CPU used during the window by anything other than the proxy, the backend and the load generator
  # (a compile, say), in % of the machine's total capacity over the window.
  other=$(((mb1 - mb0) - ticks - (bu1 + bs1 - bu0 - bs0) - (c1 - c0)))
  ((other >= 0)) || other=0
  OTHER_PCT=$(awk -v o="$other" -v t=$((mb1 - mb0 + mi1 - mi0)) 'BEGIN {printf "%.0f", (t > 0 ? 100 * o / t : 0)}')
  RSS_MB=$(awk -v k="$(hwm_kb "${pids[@]}")" 'BEGIN {printf "%.1f", k / 1024}')
  case "$sc" in
    h1|post) parse_wrk "$out" ;;
    h2c) parse_h2load "$out" "$logf" ;;
  esac
  rm -f "$logf"
  if ((OK > 0)); then
    CPU_US=$(awk -v d="$ticks" -v hz="$CLK_TCK" -v n="$OK" 'BEGIN {printf "%.2f", d / hz * 1e6 / n}')
  else
    CPU_US=nan
  fi
  stop_started "$PROXY_PID"
  log "$sc / $proxy: ${RPS} req/s, ${OK} 2xx, ${BAD} bad, cpu $ticks ticks (user $((u1 - u0)), sys $((s1 - s0))) -> ${CPU_US} us/req, rss ${RSS_MB} MB, other CPU activity ${OTHER_PCT}%"
  if ((OTHER_PCT > OTHER_WARN_PCT)); then
    log "WARNING: $sc / $proxy: ${OTHER_PCT}% of the machine's CPU went to other processes during the window"
  fi
}

# ---------------------------------------------------------------- idle check
# Other work on the machine (a compile, say) distorts every number: measure how busy the CPUs are
# for 1 s before starting and warn if it is more than noise.
read -r b0 i0 < <(cpu_busy_idle)
sleep 1
read -r b1 i1 < <(cpu_busy_idle)
BUSY_PCT=$(awk -v b=$((b1 - b0)) -v i=$((i1 - i0)) 'BEGIN { t = b + i; printf "%.0f", (t > 0 ? 100 * b / t : 0) }')
if ((BUSY_PCT > 10)); then
  log "WARNING: the machine is ${BUSY_PCT}% busy before the run (something else is running); numbers will be distorted"
fi

# ---------------------------------------------------------------- run
write_backend_conf
write_post_lua
start_bg backend "$LOAD_CPU" nginx -p "$TMP/backend" -e "$TMP/backend/error.log" -c "$TMP/backend.conf"
BACKEND_PID=$LAST_PID
wait_ok backend "http://127.0.0.1:$P_BACKEND/" "" "$BACKEND_PID"

fmt_ms() { awk -v u="$1" 'BEGIN { if (u == "nan" || u == "") print "n/a"; else printf "%.3f ms", u / 1000 }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "nan" || b == "nan" || a == "" || b == "" || b + 0 == 0) print "n/a"; else printf "%.2f", a / b }'; }

REPORT="$TMP/report.md"
FAILED=0
{
  echo "# aralez / nginx / HAProxy side by side"
  echo
  echo "- date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  echo "- machine: $(nproc) cores, $(lscpu 2>/dev/null | awk -F: '/^Model name/ {gsub(/^ +/, "", $2); print $2; exit}'), kernel $(uname -r)"
  echo "- proxy pinned to core $PROXY_CPU (1 worker/thread); backend (nginx return 200, 13-byte body) and load generator pinned to core $LOAD_CPU"
  echo "- duration ${DURATION}s measured per proxy x scenario, after ${WARMUP}s warm-up; each proxy freshly started per scenario"
  echo "- versions: $(nginx -v 2>&1 | sed 's/^nginx version: //')$(has_proxy haproxy && echo ", $(haproxy -v 2>/dev/null | head -1 | awk '{print "HAProxy " $3}')"), $(wrk -v 2>&1 | head -1 | awk '{print "wrk " $2}')$([[ " $SCENARIOS " == *" h2c "* ]] && echo ", $(h2load --version 2>/dev/null | head -1)")"
  if has_proxy aralez; then
    echo "- aralez: $ARALEZ_BIN (git $(git -C "$REPO_ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown))"
  fi
  echo "- CPUs busy in the 1 s before the run: ${BUSY_PCT}%$( ((BUSY_PCT > 10)) && echo " -- WARNING: machine not idle, numbers distorted")"
  echo "- CPU us/req = (utime+stime) of all the proxy's processes over the measured window / 2xx responses; RSS = sum of VmHWM"
} >"$REPORT"

for sc in $SCENARIOS; do
  declare -A R_RPS=() R_P50=() R_P99=() R_MEAN=() R_SD=() R_CPU=() R_RSS=() R_BAD=() R_NOTE=() R_OTHER=()
  for proxy in $PROXIES; do
    measure "$proxy" "$sc"
    R_RPS[$proxy]=$RPS R_P50[$proxy]=$P50_US R_P99[$proxy]=$P99_US R_MEAN[$proxy]=$MEAN_US R_SD[$proxy]=$SD_US
    R_CPU[$proxy]=$CPU_US R_RSS[$proxy]=$RSS_MB R_BAD[$proxy]=$BAD R_NOTE[$proxy]=$NOTE R_OTHER[$proxy]=$OTHER_PCT
    if ((BAD > 0)); then
      FAILED=1
      log "FAILED: $sc / $proxy had $BAD non-2xx or failed responses"
    fi
  done
  {
    echo
    case "$sc" in
      h1) echo "## h1: HTTP/1.1 keep-alive GET, small response (wrk -t1 -c32 -d${DURATION}s)" ;;
      post) echo "## post: HTTP/1.1 keep-alive POST, 1 KiB body (wrk -t1 -c32 -d${DURATION}s, lua script)" ;;
      h2c) echo "## h2c: HTTP/2 cleartext prior knowledge GET (h2load -c16 -m16 -D ${DURATION})" ;;
    esac
    echo
    echo "| proxy | req/s | p50 | p99 | CPU us/req | RSS MB | CPU ratio to nginx | p99 ratio to nginx |"
    echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    for proxy in $PROXIES; do
      if ((R_BAD[$proxy] > 0)); then
        echo "| $proxy | FAILED: ${R_BAD[$proxy]} non-2xx/failed responses | | | | | | |"
        continue
      fi
      if has_proxy nginx && ((R_BAD[nginx] == 0)); then
        cr=$(ratio "${R_CPU[$proxy]}" "${R_CPU[nginx]}")
        pr=$(ratio "${R_P99[$proxy]}" "${R_P99[nginx]}")
      else
        cr=n/a pr=n/a
      fi
      echo "| $proxy | ${R_RPS[$proxy]} | $(fmt_ms "${R_P50[$proxy]}") | $(fmt_ms "${R_P99[$proxy]}") | ${R_CPU[$proxy]} | ${R_RSS[$proxy]} | $cr | $pr |"
    done
    echo
    if [[ "$sc" == h2c ]]; then
      echo "h2load prints no percentiles: p50/p99 above are computed from its per-request log (--log-file)."
      echo "Mean ± sd of request time as h2load prints them:"
    else
      echo "Latency mean ± sd as wrk prints them:"
    fi
    echo
    for proxy in $PROXIES; do
      ((R_BAD[$proxy] > 0)) && continue
      w=""
      ((R_OTHER[$proxy] > OTHER_WARN_PCT)) && w=" -- WARNING: machine not idle, numbers distorted"
      echo "- $proxy: $(fmt_ms "${R_MEAN[$proxy]}") ± $(fmt_ms "${R_SD[$proxy]}")${R_NOTE[$proxy]:+ (${R_NOTE[$proxy]})}; other CPU activity during the window: ${R_OTHER[$proxy]}%$w"
    done
  } >>"$REPORT"
  unset R_RPS R_P50 R_P99 R_MEAN R_SD R_CPU R_RSS R_BAD R_NOTE R_OTHER
done

if ((FAILED)); then
  printf '\n**Some runs FAILED (non-2xx or failed responses); their numbers are not valid.**\n' >>"$REPORT"
fi

cp "$REPORT" "$OUT_MD"
cat "$REPORT"
log "written to $OUT_MD"
((FAILED == 0)) || exit 1
