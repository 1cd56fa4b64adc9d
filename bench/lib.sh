# Shared functions of bench/run.sh, sweep.sh, mixed.sh and peers.sh (sourced, not run): tool checks,
# peers installed under target/peers, open-file limits, process start/stop, nginx config heads, CPU and
# memory sampling; and, from the two files it sources at its end, the load generators and their
# parsers, TLS certificate and probe (bench/lib_load.sh), medians, tables and the peers' equal-work
# knobs (bench/lib_report.sh).
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

# shellcheck source=bench/lib_load.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib_load.sh"
# shellcheck source=bench/lib_report.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib_report.sh"
