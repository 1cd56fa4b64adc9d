# Shared functions of bench/run.sh, sweep.sh, mixed.sh and peers.sh (sourced, not run): tool checks,
# peers installed under target/peers, open-file limits, process start/stop, nginx config heads, CPU and
# memory sampling, load generators and their parsers, TLS certificate and probe, table printing.
#
# Uses these globals of the caller: TMP (temp dir), STARTED_PIDS (array), LOAD_CPU, CLK_TCK,
# OTHER_WARN_PCT, PROXIES; and sets LAST_PID, RPS OK BAD P50_US P99_US MEAN_US SD_US NOTE.

log() { printf '[bench] %s\n' "$*" >&2; }
die() { printf '[bench] ERROR: %s\n' "$*" >&2; exit 1; }

has_proxy() { [[ " $PROXIES " == *" $1 "* ]]; }

# ---------------------------------------------------------------- tools
stop_system_service() {
  local svc=$1
  if command -v systemctl >/dev/null 2>&1 && [[ -d /run/systemd/system ]]; then
    timeout 30 systemctl disable --now "$svc" >/dev/null 2>&1 || true
  elif [[ -x "/etc/init.d/$svc" ]]; then
    timeout 30 "/etc/init.d/$svc" stop >/dev/null 2>&1 || true
  fi
}

# ensure_tools CMD...: install what is missing with apt-get (root only), once.
ensure_tools() {
  local c missing=() nginx_pkg
  for c in "$@"; do command -v "$c" >/dev/null 2>&1 || missing+=("$c"); done
  # nginx lives in /usr/sbin, which may not be on a non-root PATH.
  export PATH="$PATH:/usr/sbin:/sbin"
  ((${#missing[@]})) || return 0
  if [[ $(id -u) -ne 0 ]]; then
    die "missing tools: ${missing[*]}; run as root (sudo bash bench/run.sh) to install them with apt-get"
  fi
  command -v apt-get >/dev/null 2>&1 || die "missing tools: ${missing[*]} and no apt-get to install them"
  log "installing missing tools (${missing[*]}) with apt-get"
  export DEBIAN_FRONTEND=noninteractive
  timeout 600 apt-get update -qq || die "apt-get update failed"
  nginx_pkg=nginx-light
  apt-cache show nginx-light >/dev/null 2>&1 || nginx_pkg=nginx
  timeout 900 apt-get install -y -qq "$nginx_pkg" haproxy wrk nghttp2-client util-linux procps curl openssl \
    redis-server || die "apt-get install failed"
  # The packages may start (and enable) their system services; we run our own instances only.
  stop_system_service nginx
  stop_system_service haproxy
  stop_system_service redis-server
  for c in "$@"; do command -v "$c" >/dev/null 2>&1 || die "'$c' still missing after install"; done
}

port_in_use() {
  # true if something is listening on 127.0.0.1:$1 (or any address)
  if command -v ss >/dev/null 2>&1; then
    ss -Hltn "sport = :$1" 2>/dev/null | grep -q .
  else
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
  fi
}

# ---------------------------------------------------------------- processes
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
  # KEEP_TMP=1 keeps the run's files (configs, logs, the load generators' output) for a look.
  if [[ -n "${KEEP_TMP:-}" ]]; then echo "[bench] kept $TMP" >&2; else rm -rf "$TMP"; fi
  exit "$rc"
}

# Start a long-running server in the background, pinned to a core. taskset execs the program,
# so $! is the server's own pid.
start_bg() {  # start_bg NAME CPU cmd...
  local name=$1 cpu=$2
  shift 2
  taskset -c "$cpu" "$@" >"$TMP/load/$name.out" 2>&1 &
  LAST_PID=$!
  STARTED_PIDS+=("$LAST_PID")
}

stop_started() {  # stop_started PID: stop it and drop it from the cleanup list
  local pid=$1 keep=() p
  stop_pid "$pid"
  for p in "${STARTED_PIDS[@]}"; do [[ "$p" == "$pid" ]] || keep+=("$p"); done
  STARTED_PIDS=("${keep[@]}")
}

# Wait (bounded, 10 s) until URL answers 200 with the expected body over HTTP/WANT_VER (1.1 or 2).
# Extra curl arguments (protocol flags, --cacert) follow the pid. The expected body is the global
# WANT_BODY if set, else the run.sh backend's "hello, world".
wait_ok() {  # wait_ok NAME URL WANT_VER PID [curl args...]
  local name=$1 url=$2 want_ver=$3 pid=$4 i code="" ver="" body
  shift 4
  for ((i = 0; i < 100; i++)); do
    kill -0 "$pid" 2>/dev/null || { cat "$TMP/load/$name.out" >&2 || true; die "$name exited during startup"; }
    read -r code ver < <(curl -s "$@" -o "$TMP/curl.body" -w '%{http_code} %{http_version}\n' \
      --max-time 2 "$url" 2>/dev/null || true) || true
    if [[ "${code:-}" == 200 ]]; then
      body=$(cat "$TMP/curl.body")
      [[ "$body" == "${WANT_BODY:-hello, world}" ]] || die "$name: $url answered 200 but with body '$body'"
      [[ "$ver" == "$want_ver" ]] || die "$name: $url answered over HTTP/$ver, expected HTTP/$want_ver"
      return 0
    fi
    sleep 0.1
  done
  cat "$TMP/load/$name.out" >&2 || true
  die "$name: $url did not answer 200 within 10 s (last status: ${code:-none})"
}

# Stop a started server and its children at once (SIGKILL to the whole tree, so that no nginx worker
# is orphaned): for peers whose SIGTERM path sleeps (Aralez 0.95 waits 5 s before exiting), where
# nothing is left to flush in a benchmark.
kill_started() {  # kill_started PID
  local pid=$1 keep=() p tree
  mapfile -t tree < <(pid_tree "$pid")
  kill -KILL "${tree[@]}" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  for p in "${STARTED_PIDS[@]}"; do [[ "$p" == "$pid" ]] || keep+=("$p"); done
  STARTED_PIDS=("${keep[@]}")
}

# Raise this shell's open-file limit (inherited by every process it starts): the hard limit to WANT
# if it is lower and this is allowed (root, unless a container forbids it), then the soft limit to
# the hard one. Sets NOFILE to the soft limit in force.
raise_nofile() {  # raise_nofile WANT
  local want=$1 hard
  hard=$(ulimit -Hn)
  if [[ "$hard" != unlimited ]] && ((hard < want)); then
    ulimit -Hn "$want" 2>/dev/null || true
  fi
  ulimit -Sn "$(ulimit -Hn)" 2>/dev/null || true
  NOFILE=$(ulimit -Sn)
  [[ "$NOFILE" == unlimited ]] && NOFILE=1048576
  return 0
}

# Global part of an nginx config rooted in $TMP/NAME. With CONNS, worker_connections is CONNS and the
# worker's open-file limit NOFILE (set by raise_nofile); without, the 1024 of bench/run.sh.
# With CONNS, the instance named `backend` also sets multi_accept (see below).
nginx_common() {  # nginx_common NAME [CONNS]
  local d="$TMP/$1"
  mkdir -p "$d"
  cat <<EOF
worker_processes 1;
daemon off;
master_process on;
pid $d/nginx.pid;
error_log $d/error.log error;
EOF
  if [[ -n "${2:-}" ]]; then
    # The backend takes every waiting connection at each turn of its loop (multi_accept): with
    # nginx's default of one a turn, a proxy's burst of new upstream connections waits in the
    # backend's accept queue behind thousands of busy connections' events.
    printf 'worker_rlimit_nofile %s;\nevents { worker_connections %s;%s }\n' "$NOFILE" "$2" \
      "$([[ $1 == backend ]] && echo ' multi_accept on;')"
  else
    echo 'events { worker_connections 1024; }'
  fi
}

# The nginx temp paths of an instance rooted in $TMP/NAME (http block lines).
nginx_temp_paths() {  # nginx_temp_paths NAME
  local d="$TMP/$1"
  cat <<EOF
    client_body_temp_path $d/body;
    proxy_temp_path $d/proxy;
    fastcgi_temp_path $d/fastcgi;
    uwsgi_temp_path $d/uwsgi;
    scgi_temp_path $d/scgi;
EOF
}

# ---------------------------------------------------------------- peers (bench/peers.sh)
# Proxies and tools that are not Debian packages, built with `cargo install` into
# $PEERS_DIR/NAME (default target/peers/NAME under the repository). Versions pinned here, so that
# peers.sh and the benchmarks agree.
ARALEZ_PEER_VERSION=${ARALEZ_PEER_VERSION:-0.95.4}
OHA_VERSION=${OHA_VERSION:-1.16.0}

peers_dir() { echo "${PEERS_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/target/peers}"; }

# peer_bin CRATE VERSION: the installed binary's path if `cargo install` recorded CRATE at VERSION in
# its root, else nothing (status 1).
peer_bin() {
  local crate=$1 version=$2 root
  root="$(peers_dir)/$crate"
  [[ -x "$root/bin/$crate" ]] || return 1
  grep -q "^\"$crate $version (" "$root/.crates.toml" 2>/dev/null || return 1
  echo "$root/bin/$crate"
}

# ---------------------------------------------------------------- aralez and Aralez configs
# The main.yaml of aralez (this repository) in DIR for the high-connection benchmarks: one worker,
# errors only, pid file and upgrade socket of its own (so it never meets another aralez on the
# machine), POOL idle upstream connections, and no connection caps below 100,000 (client
# connections: max_connections; open upstream connections: upstream_max_connections, whose default
# 1024 would turn concurrency above 1024 into 503s). Routes: DIR/upstreams.yaml.
aralez_main_yaml() {  # aralez_main_yaml DIR PLAIN_PORT TLS_PORT CERT_DIR POOL
  cat >"$1/main.yaml" <<EOF
threads: 1
proxy_address_http: "127.0.0.1:$2"
proxy_address_tls: "127.0.0.1:$3"
proxy_certificates: "$4"
proxy_tls_grade: medium
upstreams_conf: "$1/upstreams.yaml"
log_level: error
upstream_keepalive_pool_size: $5
upstream_max_connections: 100000
max_connections: 100000
pid_file: "$1/aralez.pid"
upgrade_sock: "$1/aralez.sock"
EOF
  # Experiments: ARALEZ_EXTRA_YAML holds more main.yaml lines (e.g. "client_idle_timeout: 5").
  if [[ -n "${ARALEZ_EXTRA_YAML:-}" ]]; then printf '%s\n' "$ARALEZ_EXTRA_YAML" >>"$1/main.yaml"; fi
}

# The main.yaml of Aralez 0.95 (Pingora) in DIR: the same choices where it has the key (threads,
# pool, TLS grade, log level, pid file, upgrade socket; it has no connection cap). Its certificates
# are read from DIR/certificates (copied from CERT_DIR); its admin API, which it always binds, on
# ADMIN_PORT with config pushes off; health checks every 2 s as aralez's default. Pingora reads the
# same file for its server settings (threads, pid_file, upgrade_sock).
pingora_main_yaml() {  # pingora_main_yaml DIR PLAIN_PORT TLS_PORT CERT_DIR POOL ADMIN_PORT
  mkdir -p "$1/certificates"
  cp "$4/default.crt" "$4/default.key" "$1/certificates/"
  cat >"$1/main.yaml" <<EOF
threads: 1
proxy_address_http: "127.0.0.1:$2"
proxy_address_tls: "127.0.0.1:$3"
proxy_configs: "$1"
proxy_tls_grade: medium
upstreams_conf: "$1/upstreams.yaml"
log_level: error
upstream_keepalive_pool_size: $5
pid_file: "$1/aralez.pid"
upgrade_sock: "$1/aralez.sock"
config_address: "127.0.0.1:$6"
config_api_enabled: false
hc_interval: 2
hc_method: HEAD
EOF
}

# ---------------------------------------------------------------- set-up shared by sweep.sh and mixed.sh
# (bench/run.sh keeps its own: three proxies, nine ports.) Callers set PROXIES, REPO_ROOT,
# PROXY_CPU and LOAD_CPU.

# Dies on a proxy name other than aralez, nginx, haproxy and Aralez, or an empty list.
check_proxy_names() {
  local p
  for p in $PROXIES; do
    case "$p" in aralez|nginx|haproxy|Aralez) ;; *) die "unknown proxy '$p' (known: aralez nginx haproxy Aralez)";; esac
  done
  [[ -n "${PROXIES// }" ]] || die "PROXIES is empty"
}

# Sets ARALEZ_BIN (this repository's build) and ARALEZ_PEER_BIN (Aralez from bench/peers.sh) for the
# proxies in PROXIES; an Aralez that is not installed is dropped from PROXIES, and SKIPPED says why.
resolve_proxy_bins() {
  SKIPPED=""
  if has_proxy aralez; then
    ARALEZ_BIN=${ARALEZ_BIN:-$REPO_ROOT/target/release/aralez}
    case "$ARALEZ_BIN" in /*) ;; *) ARALEZ_BIN="$REPO_ROOT/$ARALEZ_BIN";; esac
    [[ -x "$ARALEZ_BIN" ]] || die "aralez binary not found: $ARALEZ_BIN (cargo build --release, or set ARALEZ_BIN, or drop aralez from PROXIES)"
  fi
  if has_proxy Aralez; then
    if [[ -n "${ARALEZ_PEER_BIN:-}" ]]; then
      [[ -x "$ARALEZ_PEER_BIN" ]] || die "ARALEZ_PEER_BIN is not an executable: $ARALEZ_PEER_BIN"
    elif ! ARALEZ_PEER_BIN=$(peer_bin aralez "$ARALEZ_PEER_VERSION"); then
      SKIPPED="Aralez $ARALEZ_PEER_VERSION (Pingora): skipped, not installed under $(peers_dir)/aralez -- run \`bash bench/peers.sh\` (see bench/README.md)"
      log "$SKIPPED"
      PROXIES=$(printf '%s\n' $PROXIES | grep -vx Aralez | tr '\n' ' ' || true)
      [[ -n "${PROXIES// }" ]] || die "no proxy left to measure"
    fi
  fi
}

# Checks that the proxy's and the load's cores exist; sets CLK_TCK.
check_cores() {
  local ncpu
  ncpu=$(nproc)
  ((ncpu > PROXY_CPU && ncpu > LOAD_CPU)) || die "need cores $PROXY_CPU and $LOAD_CPU, this machine has $ncpu (set PROXY_CPU/LOAD_CPU)"
  CLK_TCK=$(getconf CLK_TCK)
}

# Raises the open-file limit to WANT; FD_NOTE (logged) says so when it stays below NEED, what WHY
# asks for. HAPROXY_MAXCONN is what the limit allows HAProxy (two descriptors a connection and a
# margin: it refuses to start otherwise), 100,000 at most.
fd_budget() {  # fd_budget WANT NEED WHY
  raise_nofile "$1"
  FD_NOTE=""
  if ((NOFILE < $2)); then
    FD_NOTE="open-file limit $NOFILE (could not be raised further here) is below the $2 $3"
    log "WARNING: $FD_NOTE"
  fi
  HAPROXY_MAXCONN=$(((NOFILE - 1000) / 2))
  ((HAPROXY_MAXCONN > 100000)) && HAPROXY_MAXCONN=100000
  return 0
}

# The run's temp dir (TMP, with load/, aralez/ and Aralez/), removed with every process started
# (STARTED_PIDS) on exit.
make_run_dir() {  # make_run_dir NAME
  TMP=$(mktemp -d "/tmp/aralez-$1.XXXXXX")
  chmod 755 "$TMP"   # nginx workers run as an unprivileged user when started as root
  mkdir -p "$TMP/load" "$TMP/aralez" "$TMP/Aralez"
  STARTED_PIDS=()
  trap cleanup EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
}

proxy_label() {
  case "$1" in
    aralez) echo aralez ;;
    nginx) echo nginx ;;
    haproxy) echo HAProxy ;;
    Aralez) echo "Aralez $ARALEZ_PEER_VERSION (Pingora)" ;;
  esac
}

# Starts PROXY from the config write_configs made for it, pinned to PROXY_CPU; sets PROXY_PID.
launch_proxy() {  # launch_proxy PROXY
  case "$1" in
    aralez) start_bg aralez "$PROXY_CPU" "$ARALEZ_BIN" -c "$TMP/aralez/main.yaml" ;;
    nginx) start_bg nginx "$PROXY_CPU" nginx -p "$TMP/nginx" -e "$TMP/nginx/error.log" -c "$TMP/nginx.conf" ;;
    haproxy) start_bg haproxy "$PROXY_CPU" haproxy -db -f "$TMP/haproxy.cfg" ;;
    Aralez) start_bg Aralez "$PROXY_CPU" "$ARALEZ_PEER_BIN" -c "$TMP/Aralez/main.yaml" ;;
  esac
  PROXY_PID=$LAST_PID
}

# The global and defaults sections of HAProxy's config and a frontend `fe` on the plain and TLS
# ports P_PLAIN[haproxy] and P_TLS[haproxy] (certificate $TMP/haproxy.pem).
haproxy_head() {
  cat <<EOF
global
    nbthread 1
    maxconn $HAPROXY_MAXCONN

defaults
    mode http
    maxconn $HAPROXY_MAXCONN
    timeout connect 5s
    timeout client 60s
    timeout server 60s
    http-reuse always

frontend fe
    bind 127.0.0.1:${P_PLAIN[haproxy]}$(haproxy_defer)
    bind 127.0.0.1:${P_TLS[haproxy]} ssl crt $TMP/haproxy.pem alpn h2,http/1.1$(haproxy_defer)
EOF
}

# ---------------------------------------------------------------- measured windows
# window_start PROXY_PID BACKEND_PID and window_end around a measured load: window_end sets
# W_TICKS (CPU ticks of the proxy's processes), W_USER/W_SYS, W_LOAD (ticks of the backend and of
# the load generators this shell reaped), OTHER_PCT (CPU used by anything but
# the proxy, the backend and this shell's reaped children, i.e. the load generators, in % of the
# machine) and RSS_MB (sum of VmHWM of the proxy's processes).
window_start() {
  mapfile -t W_PIDS < <(pid_tree "$1")
  mapfile -t W_BPIDS < <(pid_tree "$2")
  read -r W_MB0 W_MI0 < <(cpu_busy_idle)
  read -r W_BU0 W_BS0 < <(cpu_ticks "${W_BPIDS[@]}")
  read -r W_U0 W_S0 < <(cpu_ticks "${W_PIDS[@]}")
  W_C0=$(child_ticks)
}

window_end() {
  local u1 s1 bu1 bs1 mb1 mi1 c1 other
  c1=$(child_ticks)
  read -r u1 s1 < <(cpu_ticks "${W_PIDS[@]}")
  read -r bu1 bs1 < <(cpu_ticks "${W_BPIDS[@]}")
  read -r mb1 mi1 < <(cpu_busy_idle)
  [[ -n "${u1:-}" && -n "${bu1:-}" && -n "${mb1:-}" ]] || die "could not read CPU times at the end of a window"
  W_USER=$((u1 - W_U0)) W_SYS=$((s1 - W_S0))
  W_TICKS=$((W_USER + W_SYS))
  W_LOAD=$((bu1 + bs1 - W_BU0 - W_BS0 + c1 - W_C0))
  other=$(((mb1 - W_MB0) - W_TICKS - (bu1 + bs1 - W_BU0 - W_BS0) - (c1 - W_C0)))
  ((other >= 0)) || other=0
  OTHER_PCT=$(awk -v o="$other" -v t=$((mb1 - W_MB0 + mi1 - W_MI0)) 'BEGIN {printf "%.0f", (t > 0 ? 100 * o / t : 0)}')
  RSS_MB=$(awk -v k="$(hwm_kb "${W_PIDS[@]}")" 'BEGIN {printf "%.1f", k / 1024}')
}

# CPU microseconds per request: us_per_req TICKS REQUESTS (nan without requests).
us_per_req() { awk -v d="$1" -v hz="$CLK_TCK" -v n="$2" 'BEGIN { if (n > 0) printf "%.2f", d / hz * 1e6 / n; else print "nan" }'; }

# All pids of a process tree (root first).
pid_tree() {
  local pid=$1 c
  echo "$pid"
  for c in $(pgrep -P "$pid" 2>/dev/null || true); do pid_tree "$c"; done
}

# ---------------------------------------------------------------- CPU and memory
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

# Percentage of the machine busy over 1 s: other work (a compile, say) distorts every number.
busy_pct_1s() {
  local b0 i0 b1 i1
  read -r b0 i0 < <(cpu_busy_idle)
  sleep 1
  read -r b1 i1 < <(cpu_busy_idle)
  awk -v b=$((b1 - b0)) -v i=$((i1 - i0)) 'BEGIN { t = b + i; printf "%.0f", (t > 0 ? 100 * b / t : 0) }'
}

# ---------------------------------------------------------------- load generators
# wrk latency like "245.12us", "1.23ms", "2.00s" -> microseconds
to_us() {
  awk -v v="$1" 'BEGIN {
    n = v + 0; u = v; sub(/^[0-9.]+/, "", u)
    if (u == "us") m = 1; else if (u == "ms") m = 1000; else if (u == "s") m = 1000000;
    else if (u == "m") m = 60000000; else { print "nan"; exit }
    printf "%.1f", n * m }'
}

# The parsers set: RPS, OK (2xx responses), BAD (non-2xx/failed), P50_US, P99_US, MEAN_US, SD_US, NOTE
run_wrk() {  # run_wrk URL DURATION OUTFILE [wrk args: -s script, -H header...]
  local url=$1 dur=$2 out=$3
  shift 3
  timeout $((dur + 30)) taskset -c "$LOAD_CPU" wrk -t1 -c32 -d"${dur}s" --latency \
    "$@" "$url" >"$out" 2>&1 || { cat "$out" >&2; die "wrk failed against $url"; }
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

# connload (bench/connload, Go, standard library only): a new connection for every request at a
# fixed rate, timed from when each was due to its answer's end (connect, TLS handshake, request).
# CONNLOAD_RATES ("SCENARIO:RATE ...", e.g. "tlsnew:1500 tcpnew:6000") turns it on in bench/run.sh.
build_connload() {  # build_connload OUTFILE
  command -v go >/dev/null 2>&1 || die "CONNLOAD_RATES needs Go (https://go.dev/dl/ or apt-get install golang-go)"
  (cd "$(dirname "${BASH_SOURCE[0]}")/connload" && GOTOOLCHAIN=local go build -o "$1" .) \
    || die "go build of bench/connload failed"
}

connload_rate() {  # connload_rate SCENARIO: its rate in CONNLOAD_RATES, or nothing
  local pair
  for pair in ${CONNLOAD_RATES:-}; do
    [[ "${pair%%:*}" == "$1" ]] && { echo "${pair#*:}"; return; }
  done
}

check_connload_rates() {
  local pair
  for pair in ${CONNLOAD_RATES:-}; do
    [[ "$pair" =~ ^(tlsnew|tcpnew):[1-9][0-9]*$ ]] \
      || die "CONNLOAD_RATES: '$pair' is not tlsnew:RATE or tcpnew:RATE (new connections a second)"
  done
}

# run_connload ADDR RATE DURATION OUTFILE [connload args...]: sets C_OK C_BAD C_WHOLE50 C_WHOLE99
# C_WHOLE999 C_REQ50 C_REQ99 (microseconds). GC off: the run's garbage is a few hundred MB at most,
# and a collection on the load core would be a tail of the load generator's own.
run_connload() {
  local addr=$1 rate=$2 dur=$3 out=$4
  shift 4
  GOGC=off GOMAXPROCS=1 timeout $((dur + 30)) taskset -c "$LOAD_CPU" "$CONNLOAD_BIN" -a "$addr" -r "$rate" \
    -c 64 -d "${dur}s" "$@" >"$out" 2>&1 || { cat "$out" >&2; die "connload failed against $addr"; }
  C_OK=$(connload_field ok "$out") C_BAD=$(connload_field bad "$out")
  C_WHOLE50=$(connload_field whole_p50 "$out") C_WHOLE99=$(connload_field whole_p99 "$out")
  C_WHOLE999=$(connload_field whole_p999 "$out")
  C_REQ50=$(connload_field request_p50 "$out") C_REQ99=$(connload_field request_p99 "$out")
  [[ -n "$C_OK" && -n "$C_WHOLE99" ]] || { cat "$out" >&2; die "could not parse connload output"; }
}

connload_field() { tr ' ' '\n' <"$2" | awk -F= -v k="$1" '$1 == k {print $2}'; }

run_h2load() {  # run_h2load URL DURATION OUTFILE [logfile [h2load args...]]
  local url=$1 dur=$2 out=$3 logf=${4:-}
  shift 3
  if (($#)); then shift; fi
  timeout $((dur + 30)) taskset -c "$LOAD_CPU" h2load -c16 -m16 -D "$dur" \
    ${logf:+--log-file="$logf"} "$@" "$url" >"$out" 2>&1 || { cat "$out" >&2; die "h2load failed against $url"; }
}

parse_h2load() {  # parse_h2load OUTFILE LOGFILE
  local out=$1 logf=$2 failed
  RPS=$(awk '/^finished in/ {gsub(",", "", $4); printf "%.0f", $4}' "$out")
  OK=$(awk '/^status codes:/ {print $3}' "$out")
  # h2load's "N failed" already counts the responses with a status outside 2xx-3xx and the errored
  # and timed-out requests ("E errored, T timeout" are parts of it), so: 3xx + failed.
  BAD=$(awk '/^status codes:/ {gsub(",", ""); print $5}' "$out")
  failed=$(awk '/^requests:/ {gsub(",", ""); print $10}' "$out")
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
        # nearest rank: the smallest value with at least p of the values at or below it
        i50 = int(NR * 0.50); if (i50 < NR * 0.50) i50++; if (i50 < 1) i50 = 1
        i99 = int(NR * 0.99); if (i99 < NR * 0.99) i99++; if (i99 < 1) i99 = 1
        printf "%.1f %.1f\n", v[i50], v[i99]
      }')
  else
    P50_US=nan P99_US=nan
  fi
  NOTE=""
}

# ---------------------------------------------------------------- TLS
# make_cert DIR [NAMES...]: ECDSA P-256 self-signed pair DIR/default.crt + DIR/default.key for
# CN=localhost, SAN localhost, 127.0.0.1 and any more DNS NAMES, plus DIR/../haproxy.pem (certificate
# and key in one file).
make_cert() {  # make_cert DIR [MORE DNS NAMES...]
  local dir=$1 san=DNS:localhost,IP:127.0.0.1 n
  shift
  for n in "$@"; do san+=",DNS:$n"; done
  mkdir -p "$dir"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 30 -subj /CN=localhost \
    -addext "subjectAltName=$san" \
    -keyout "$dir/default.key" -out "$dir/default.crt" >"$TMP/openssl-req.out" 2>&1 \
    || { cat "$TMP/openssl-req.out" >&2; die "openssl could not make the test certificate"; }
  cat "$dir/default.crt" "$dir/default.key" >"$dir/../haproxy.pem"
}

# One TLS connection with openssl s_client (an HTTP/1.1 GET, so that TLS 1.3 session tickets
# arrive before the server closes): prints the s_client -msg transcript.
s_client_get() {  # s_client_get PORT [s_client args...]
  local port=$1
  shift
  printf 'GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n' |
    timeout 5 openssl s_client -connect "127.0.0.1:$port" -servername localhost -alpn http/1.1 \
      -ign_eof -msg "$@" 2>&1 || true
}

# tls_probe PORT: what the server negotiates with an OpenSSL client and whether it resumes a
# session from one of its tickets. Prints one line, e.g.
# "TLSv1.3, TLS_AES_256_GCM_SHA384, X25519, ECDSA signature; session tickets after a full handshake: 2;
# resumes from a ticket: yes (new tickets: 1)".
tls_probe() {
  local port=$1 full res proto cipher kx sig t1 t2 reused
  full=$(s_client_get "$port" -sess_out "$TMP/probe.sess")
  proto=$(awk -F': *' '/^ *Protocol *:/ {print $2; exit}' <<<"$full")
  cipher=$(awk '/^New, / {print $NF; exit}' <<<"$full")
  kx=$(awk -F': *' '/^Server Temp Key:/ {sub(/,.*/, "", $2); print $2; exit}' <<<"$full")
  sig=$(awk -F': *' '/^Peer signature type:/ {print $2; exit}' <<<"$full")
  t1=$(grep -c '<<< TLS 1.3, Handshake .*NewSessionTicket' <<<"$full" || true)
  if [[ -s "$TMP/probe.sess" ]]; then
    res=$(s_client_get "$port" -sess_in "$TMP/probe.sess")
    t2=$(grep -c '<<< TLS 1.3, Handshake .*NewSessionTicket' <<<"$res" || true)
    if grep -q '^Reused, ' <<<"$res"; then reused="yes (new tickets: $t2)"; else reused="no"; fi
  else
    reused="no session to resume"
  fi
  rm -f "$TMP/probe.sess"
  echo "${proto:-?}, ${cipher:-?}, ${kx:-?}, ${sig:-?} signature; session tickets after a full handshake: $t1; resumes from a ticket: $reused"
}

# ---------------------------------------------------------------- report
# median / maximum of numbers (words like nan are skipped); rotate N WORDS...: the words shifted by N.
median() { printf '%s\n' "$@" | awk '/^[0-9]+([.][0-9]+)?$/' | sort -g | awk '{ v[n++] = $1 } END { if (n == 0) print "nan"; else print (n % 2 ? v[(n - 1) / 2] : (v[n / 2 - 1] + v[n / 2]) / 2) }'; }
maximum() { printf '%s\n' "$@" | awk '/^[0-9]+([.][0-9]+)?$/ && (n++ == 0 || $1 > m) { m = $1 } END { print (n ? m : "nan") }'; }
rotate() { local n=$1; shift; local k=$((n % $#)); echo "${@:k+1}" "${@:1:k}"; }
fmt_ms() { awk -v u="$1" 'BEGIN { if (u == "nan" || u == "") print "n/a"; else printf "%.3f ms", u / 1000 }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "nan" || b == "nan" || a == "" || b == "" || b + 0 == 0) print "n/a"; else printf "%.2f", a / b }'; }

# print_table TITLE LOADGEN: one scenario's markdown table and notes, from the R_* arrays.
# LOADGEN is wrk or h2load (which latency note to print).
print_table() {
  local title=$1 loadgen=$2 proxy cr pr w
  echo
  echo "## $title"
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
  if [[ "$loadgen" == h2load ]]; then
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
}

# print_connload_table SCENARIO RATE: the connload window's medians over the rounds (C_* arrays).
print_connload_table() {
  local proxy w99 pr
  echo
  echo "The same proxies at a fixed $2 new connections a second (bench/connload, 64 workers, open loop):"
  echo "the whole connection, from when it was due to its answer's end, and the request alone (from"
  echo "its write, wrk's span); medians of the rounds."
  echo
  echo "| proxy | whole p50 | whole p99 | whole p99.9 | request p50 | request p99 | whole p99 ratio to nginx |"
  echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"
  for proxy in $PROXIES; do
    [[ -n "${C_W99[$proxy]:-}" ]] || continue
    w99=$(median ${C_W99[$proxy]})
    pr=n/a
    [[ -n "${C_W99[nginx]:-}" ]] && pr=$(ratio "$w99" "$(median ${C_W99[nginx]})")
    echo "| $proxy | $(fmt_ms "$(median ${C_W50[$proxy]})") | $(fmt_ms "$w99") | $(fmt_ms "$(median ${C_W999[$proxy]})") | $(fmt_ms "$(median ${C_R50[$proxy]})") | $(fmt_ms "$(median ${C_R99[$proxy]})") | $pr |"
  done
  echo
  echo "whole p99 in each round:"
  echo
  for proxy in $PROXIES; do [[ -n "${C_W99[$proxy]:-}" ]] && echo "- $proxy:${C_W99[$proxy]}"; done
}

# ---------------------------------------------------------------- equal work for the peers
# aralez adds X-Forwarded-For, -Proto and -Host and an X-Request-Id to every backend request and the
# X-Request-Id to every answer (SPEC §6.2). With PEER_HEADERS=equal (the default) nginx and HAProxy
# are configured to do the same, so that every proxy writes, and the backend and load generator
# parse, the same fields; PEER_HEADERS=bare leaves them at plain proxying (the tables up to
# 2026-11-28 were measured that way). aralez's and nginx's request ids are 32 hex digits, HAProxy's
# uuid() 36 characters. Aralez 0.95 (Pingora) is left as it is configured.
check_peer_headers() {
  PEER_HEADERS=${PEER_HEADERS:-equal}
  case "$PEER_HEADERS" in equal|bare) ;; *) die "PEER_HEADERS must be 'equal' or 'bare', got '$PEER_HEADERS'";; esac
}

# Lines for an nginx `location` that proxies (PEER_HEADERS=equal), else nothing.
nginx_equal_headers() {
  [[ "${PEER_HEADERS:-equal}" == equal ]] || return 0
  cat <<'EOF'
            proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
            proxy_set_header X-Forwarded-Proto $scheme;
            proxy_set_header X-Forwarded-Host $http_host;
            proxy_set_header X-Request-Id $request_id;
            add_header X-Request-Id $request_id always;
EOF
}

# Lines for an HAProxy frontend (PEER_HEADERS=equal), else nothing.
haproxy_equal_headers() {
  [[ "${PEER_HEADERS:-equal}" == equal ]] || return 0
  cat <<'EOF'
    option forwardfor
    http-request set-header X-Forwarded-Proto https if { ssl_fc }
    http-request set-header X-Forwarded-Proto http if !{ ssl_fc }
    http-request set-header X-Forwarded-Host %[req.hdr(host)]
    unique-id-format %[uuid()]
    unique-id-header X-Request-Id
    http-response set-header X-Request-Id %[unique-id]
EOF
}

# The report line saying which it was.
peer_headers_line() {
  if [[ "${PEER_HEADERS:-equal}" == equal ]]; then
    echo "- forwarded fields: every proxy adds X-Forwarded-For, -Proto, -Host and X-Request-Id to the backend request and X-Request-Id to the answer (aralez always does; nginx and HAProxy configured to, PEER_HEADERS=equal)"
  else
    echo "- forwarded fields: aralez adds X-Forwarded-For, -Proto, -Host and X-Request-Id to the backend request and X-Request-Id to the answer; nginx and HAProxy add nothing (PEER_HEADERS=bare)"
  fi
}

# ---------------------------------------------------------------- deferred accept for the peers
# aralez's listeners hand a connection over when its first bytes arrive (TCP_DEFER_ACCEPT, its
# default: README, `tcp.tcp_defer_accept`). With PEER_DEFER=equal (the default) nginx's proxy
# listeners say `deferred` and HAProxy's binds `defer-accept`, which set the same socket option;
# PEER_DEFER=off leaves both at their own default, off (every table before 2026-12-05 07:30 was
# measured with no proxy deferring). Aralez 0.95 (Pingora) is left as it is.
check_peer_defer() {
  PEER_DEFER=${PEER_DEFER:-equal}
  case "$PEER_DEFER" in equal|off) ;; *) die "PEER_DEFER must be 'equal' or 'off', got '$PEER_DEFER'";; esac
}

# The parameter for an nginx proxy `listen` (PEER_DEFER=equal), else nothing.
nginx_defer() {
  [[ "${PEER_DEFER:-equal}" == equal ]] && printf ' deferred'
  return 0
}

# The option for an HAProxy proxy `bind` (PEER_DEFER=equal), else nothing.
haproxy_defer() {
  [[ "${PEER_DEFER:-equal}" == equal ]] && printf ' defer-accept'
  return 0
}

# The report line saying which it was.
peer_defer_line() {
  if [[ "${PEER_DEFER:-equal}" == equal ]]; then
    echo "- deferred accept: aralez, nginx (\`deferred\`) and HAProxy (\`defer-accept\`) take a connection when its first bytes arrive (TCP_DEFER_ACCEPT, PEER_DEFER=equal); Aralez 0.95 does not"
  else
    echo "- deferred accept: aralez only (its default); nginx, HAProxy and Aralez 0.95 take a connection as its handshake ends (PEER_DEFER=off)"
  fi
}
