#!/usr/bin/env bash
# The mixed load of Aralez's own benchmark page, scaled to this machine: oha GET and oha POST (1 KiB
# JSON body) at once, each with CONNS_EACH connections (default 2 x 1,024) for DURATION seconds,
# picking at random among 60 nested paths over 3 host names, 45 of the 60 URLs HTTPS (TLS terminated
# by the proxy), the rest plain HTTP, all HTTP/1.1. Every proxy routes by host name (3 hosts -> 3
# backend ports of one nginx backend that answers a small JSON naming its host). Proxies: aralez,
# nginx, HAProxy and Aralez 0.95 (Pingora, from bench/peers.sh), each one worker/thread pinned to
# core PROXY_CPU; the backend and both oha processes on core LOAD_CPU.
#
#   bash bench/peers.sh                  # once: oha (required) and Aralez (optional)
#   cargo build --release && sudo bash bench/mixed.sh
#   CONNS_EACH=128 DURATION=10 bash bench/mixed.sh              # a quick look
#
# Env knobs:
#   CONNS_EACH   connections of each of the two oha processes (default 1024)
#   DURATION     seconds of load per proxy (default 30; Aralez's page ran 300)
#   PROXIES      any of "aralez nginx haproxy Aralez" (default all four; Aralez skipped with a line
#                in the report if bench/peers.sh did not install it)
#   ROUNDS       rounds (default 1); each round measures every proxy once, the order rotated; the
#                table shows medians (RSS: the highest; counts: summed)
#   POOL         idle upstream keep-alive connections per backend of each proxy (default 1024)
#   ARALEZ_BIN   aralez binary (default target/release/aralez; never built by this script)
#   ARALEZ_EXTRA_YAML  more lines for aralez's main.yaml, for experiments
#   ARALEZ_PEER_BIN / OHA_BIN  Aralez 0.95 and oha binaries (default: bench/peers.sh's installs)
#   BASE_PORT    first of 12 consecutive localhost ports (default 18380)
#   PROXY_CPU / LOAD_CPU  cores (default 0 / 1)
#   PEER_DEFER `equal` (default) or `off`: whether nginx and HAProxy defer accepts as aralez does
#   PEER_HEADERS `equal` (default) or `bare`: whether nginx and HAProxy add the forwarded fields and
#                request id aralez adds (see bench/lib.sh)
#
# Output: bench/last-mixed.md: per proxy req/s (2xx per second; GET and POST apart), answered
# requests, non-2xx, errors, p50 p90 p99 p99.9 p99.99 over every answered request of both oha
# processes (exact, from oha's per-request sqlite databases), proxy CPU us/req and peak RSS; which
# proxy has the lowest p99 and p99.9. Duration: about PROXIES x (DURATION + 10 s).
set -euo pipefail

CONNS_EACH=${CONNS_EACH:-1024}
DURATION=${DURATION:-30}
PROXIES=${PROXIES:-"aralez nginx haproxy Aralez"}
ROUNDS=${ROUNDS:-1}
POOL=${POOL:-1024}
BASE_PORT=${BASE_PORT:-18380}
PROXY_CPU=${PROXY_CPU:-0}
LOAD_CPU=${LOAD_CPU:-1}
OTHER_WARN_PCT=3
HOSTS=(test.dom.bar test.foo.bar test.yoop.jpo)   # Aralez's benchmark host names

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd "$SCRIPT_DIR/.." && pwd)
OUT_MD="$SCRIPT_DIR/last-mixed.md"
# shellcheck source=bench/lib.sh
source "$SCRIPT_DIR/lib.sh"
check_peer_headers
check_peer_defer

# ---------------------------------------------------------------- argument checks
for v in CONNS_EACH DURATION ROUNDS POOL BASE_PORT; do
  [[ "${!v}" =~ ^[1-9][0-9]*$ ]] || die "$v must be a positive integer, got '${!v}'"
done
check_proxy_names

# ---------------------------------------------------------------- binaries
if [[ -n "${OHA_BIN:-}" ]]; then
  [[ -x "$OHA_BIN" ]] || die "OHA_BIN is not an executable: $OHA_BIN"
elif ! OHA_BIN=$(peer_bin oha "$OHA_VERSION"); then
  die "oha $OHA_VERSION is not installed under $(peers_dir)/oha: run \`bash bench/peers.sh\` first (or set OHA_BIN)"
fi
resolve_proxy_bins
ensure_tools nginx taskset curl pgrep getconf openssl python3
has_proxy haproxy && ensure_tools haproxy
check_cores
fd_budget $((8 * CONNS_EACH + 4096)) $((4 * CONNS_EACH + 1024)) \
  "a proxy may need (2 x $CONNS_EACH client connections and as many upstream ones)"

# ---------------------------------------------------------------- ports, temp dir
P_BACK=($BASE_PORT $((BASE_PORT + 1)) $((BASE_PORT + 2)))
declare -A P_PLAIN=([aralez]=$((BASE_PORT + 3)) [nginx]=$((BASE_PORT + 5)) [haproxy]=$((BASE_PORT + 7)) [Aralez]=$((BASE_PORT + 9)))
declare -A P_TLS=([aralez]=$((BASE_PORT + 4)) [nginx]=$((BASE_PORT + 6)) [haproxy]=$((BASE_PORT + 8)) [Aralez]=$((BASE_PORT + 10)))
P_ADMIN=$((BASE_PORT + 11))
for ((p = BASE_PORT; p <= BASE_PORT + 11; p++)); do
  port_in_use "$p" && die "port $p is already in use (set BASE_PORT to a free range of 12 ports)"
done

make_run_dir mixed

# ---------------------------------------------------------------- the load's files
# The backend's answer for host number I: a small JSON document naming the host.
host_body() { printf '{"host":"%s","status":"ok","items":[{"id":1,"name":"alpha"},{"id":2,"name":"beta"},{"id":3,"name":"gamma"}]}' "${HOSTS[$1]}"; }

# 20 nested paths (1 to 7 segments deep) per host; URL i (0..59) is HTTPS unless i % 4 == 3.
write_load_files() {
  local seg=(api v1 v2 users orders items catalog search static assets img reports stats health
    accounts billing invoices cart session profile) i h depth k path scheme
  local proxy=$1 out="$TMP/urls-$1.txt"
  : >"$out"
  for ((i = 0; i < 60; i++)); do
    h=$((i % 3))
    depth=$((1 + (i / 3) % 7))
    path=""
    for ((k = 0; k < depth; k++)); do path+="/${seg[$(((i / 3 + 3 * k) % 20))]}"; done
    ((depth > 2)) && path+="/$((1000 + i))"
    if ((i % 4 == 3)); then
      echo "http://${HOSTS[$h]}:${P_PLAIN[$proxy]}$path" >>"$out"
    else
      echo "https://${HOSTS[$h]}:${P_TLS[$proxy]}$path" >>"$out"
    fi
  done
}

# A 1 KiB JSON request body.
write_post_body() {
  python3 - "$TMP/body.json" <<'PY'
import json, sys
doc = {"user": "bench", "action": "update", "tags": [], "payload": ""}
doc["payload"] = "x" * (1024 - len(json.dumps(doc)))
with open(sys.argv[1], "w") as f:
    f.write(json.dumps(doc))
PY
  [[ $(stat -c %s "$TMP/body.json") -eq 1024 ]] || die "could not write a 1 KiB JSON body"
}

# ---------------------------------------------------------------- configs
write_configs() {
  local i d
  { nginx_common backend "$NOFILE"; cat <<EOF
http {
    access_log off;
    keepalive_requests 1000000;
$(nginx_temp_paths backend)
$(for i in 0 1 2; do cat <<EOS
    server {
        listen 127.0.0.1:${P_BACK[$i]} backlog=65535;
        location / {
            default_type application/json;
            return 200 '$(host_body $i)';
        }
    }
EOS
done)
}
EOF
  } >"$TMP/backend.conf"

  # One server block per host (server_name ignores the port in Host); a default server answers 404
  # for any other name, so that a request routed by the wrong rule cannot pass unnoticed. The listen
  # backlog (raised from nginx's 511, as in sweep.sh) may be given once per address, on the default.
  { nginx_common nginx "$NOFILE"; cat <<EOF
http {
    access_log off;
    keepalive_requests 1000000;
$(nginx_temp_paths nginx)
    ssl_certificate $TMP/certs/default.crt;
    ssl_certificate_key $TMP/certs/default.key;
    ssl_protocols TLSv1.2 TLSv1.3;
$(for i in 0 1 2; do cat <<EOS
    upstream b$i {
        server 127.0.0.1:${P_BACK[$i]};
        keepalive $POOL;
        keepalive_requests 1000000;
    }
    server {
        listen 127.0.0.1:${P_PLAIN[nginx]};
        listen 127.0.0.1:${P_TLS[nginx]} ssl http2;
        server_name ${HOSTS[$i]};
        location / {
            proxy_pass http://b$i;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
$(nginx_equal_headers)
        }
    }
EOS
done)
    server {
        listen 127.0.0.1:${P_PLAIN[nginx]} default_server backlog=65535$(nginx_defer);
        listen 127.0.0.1:${P_TLS[nginx]} ssl http2 default_server backlog=65535$(nginx_defer);
        return 404;
    }
}
EOF
  } >"$TMP/nginx.conf"

  {
    haproxy_head
    haproxy_equal_headers
    for i in 0 1 2; do echo "    use_backend b$i if { req.hdr(host),field(1,:),lower -m str ${HOSTS[$i]} }"; done
    echo "    http-request return status 404 if !{ req.hdr(host),field(1,:),lower -m str ${HOSTS[*]} }"
    for i in 0 1 2; do printf '\nbackend b%s\n    server s1 127.0.0.1:%s pool-max-conn %s\n' "$i" "${P_BACK[$i]}" "$POOL"; done
  } >"$TMP/haproxy.cfg"

  for d in aralez Aralez; do
    {
      echo 'provider: "file"'
      echo 'upstreams:'
      for i in 0 1 2; do printf '  %s:\n    paths:\n      "/":\n        servers: ["127.0.0.1:%s"]\n' "${HOSTS[$i]}" "${P_BACK[$i]}"; done
    } >"$TMP/$d/upstreams.yaml"
  done
  aralez_main_yaml "$TMP/aralez" "${P_PLAIN[aralez]}" "${P_TLS[aralez]}" "$TMP/certs" "$POOL"
  pingora_main_yaml "$TMP/Aralez" "${P_PLAIN[Aralez]}" "${P_TLS[Aralez]}" "$TMP/certs" "$POOL" "$P_ADMIN"
}

# ---------------------------------------------------------------- proxies

# curl arguments that send HOST:PORT to 127.0.0.1 and trust the test certificate
resolve_args() {  # resolve_args PROXY
  local h
  for h in "${HOSTS[@]}"; do
    printf -- '--resolve\n%s:%s:127.0.0.1\n--resolve\n%s:%s:127.0.0.1\n' "$h" "${P_PLAIN[$1]}" "$h" "${P_TLS[$1]}"
  done
  printf -- '--cacert\n%s\n--http1.1\n' "$TMP/certs/default.crt"
}

# Start a proxy, wait until it answers, then check that every host is routed to its own backend over
# plain HTTP and TLS, for GET and POST, and that an unknown host is not served.
start_proxy() {  # start_proxy PROXY -> PROXY_PID
  local proxy=$1 args i url body code
  launch_proxy "$proxy"
  mapfile -t args < <(resolve_args "$proxy")
  WANT_BODY=$(host_body 0) wait_ok "$proxy" "https://${HOSTS[0]}:${P_TLS[$proxy]}/api" 1.1 "$PROXY_PID" "${args[@]}"
  for i in 0 1 2; do
    for url in "https://${HOSTS[$i]}:${P_TLS[$proxy]}/users/7/orders" "http://${HOSTS[$i]}:${P_PLAIN[$proxy]}/static/app.js"; do
      body=$(curl -sS --max-time 5 "${args[@]}" "$url") || die "$proxy: GET $url failed"
      [[ "$body" == "$(host_body $i)" ]] || die "$proxy: GET $url was not routed to ${HOSTS[$i]}'s backend (body: $body)"
      body=$(curl -sS --max-time 5 "${args[@]}" -H 'Content-Type: application/json' --data-binary "@$TMP/body.json" "$url") \
        || die "$proxy: POST $url failed"
      [[ "$body" == "$(host_body $i)" ]] || die "$proxy: POST $url was not routed to ${HOSTS[$i]}'s backend (body: $body)"
    done
  done
  code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 -H "Host: unknown.example" "http://127.0.0.1:${P_PLAIN[$proxy]}/api" || true)
  [[ "$code" != 200 ]] || die "$proxy: a request for an unknown host was answered 200; host routing is not in force"
}

# ---------------------------------------------------------------- one measurement
# Appends to $TMP/raw.tsv: round proxy <mixed_stats.py fields> cpu_us rss_mb other_pct
measure() {  # measure PROXY ROUND
  local proxy=$1 round=$2 ct=() m pid_get pid_post rc_get=0 rc_post=0 stats ok h
  start_proxy "$proxy"
  for h in "${HOSTS[@]}"; do
    ct+=(--connect-to "$h:${P_PLAIN[$proxy]}:127.0.0.1:${P_PLAIN[$proxy]}" --connect-to "$h:${P_TLS[$proxy]}:127.0.0.1:${P_TLS[$proxy]}")
  done
  rm -f "$TMP"/load/oha-*
  # --insecure as on Aralez's page: rustls refuses the self-signed test certificate, which OpenSSL
  # makes a CA (CaUsedAsEndEntity), and a refused handshake sends oha to another URL, often plain
  # HTTP, which would quietly turn the load into mostly plain HTTP. curl verified the certificate.
  log "$proxy: oha GET and oha POST at once, ${CONNS_EACH} connections each, ${DURATION}s, 60 URLs over ${HOSTS[*]}"
  window_start "$PROXY_PID" "$BACKEND_PID"
  for m in GET POST; do
    local extra=()
    [[ "$m" == POST ]] && extra=(-D "$TMP/body.json" -T application/json)
    timeout $((DURATION + 60)) taskset -c "$LOAD_CPU" "$OHA_BIN" -c "$CONNS_EACH" -z "${DURATION}s" -m "$m" "${extra[@]}" \
      --urls-from-file "$TMP/urls-$proxy.txt" "${ct[@]}" --insecure --worker-threads 1 --no-tui \
      --output-format json -o "$TMP/load/oha-$m.json" --db-url "$TMP/load/oha-$m.db" >"$TMP/load/oha-$m.out" 2>&1 &
    [[ "$m" == GET ]] && pid_get=$! || pid_post=$!
  done
  # Half-way through, count the client connections on each listener (the share that is TLS).
  sleep $((DURATION / 2))
  CONN_SPLIT="$(ss -Htn state established "( sport = :${P_TLS[$proxy]} )" 2>/dev/null | wc -l) TLS / $(ss -Htn state established "( sport = :${P_PLAIN[$proxy]} )" 2>/dev/null | wc -l) plain"
  wait "$pid_get" || rc_get=$?
  wait "$pid_post" || rc_post=$?
  window_end
  kill -0 "$PROXY_PID" 2>/dev/null || log "WARNING: $proxy exited during the run"
  for m in GET POST; do
    [[ -s "$TMP/load/oha-$m.json" ]] || { cat "$TMP/load/oha-$m.out" >&2; die "$proxy: oha $m wrote no summary (exit GET $rc_get, POST $rc_post)"; }
  done
  stats=$(python3 "$SCRIPT_DIR/mixed_stats.py" "$DURATION" "$TMP/load/oha-GET.json" "$TMP/load/oha-POST.json" \
    "$TMP/load/oha-GET.db" "$TMP/load/oha-POST.db") || die "mixed_stats.py failed"
  ok=$(cut -f5 <<<"$stats")
  if ((W_TICKS >= 10)); then CPU_US=$(us_per_req "$W_TICKS" "$ok"); else CPU_US=nan; fi
  log "$proxy: connections half-way $CONN_SPLIT; $(cut -f1 <<<"$stats") req/s (2xx), p50/p90/p99/p99.9/p99.99 $(cut -f9-13 <<<"$stats" | tr '\t' '/') ms, non-2xx $(cut -f6 <<<"$stats"), errors $(cut -f7 <<<"$stats"), cpu $W_TICKS ticks (user $W_USER, sys $W_SYS) -> $CPU_US us/req, rss $RSS_MB MB, other CPU ${OTHER_PCT}%"
  ((OTHER_PCT > OTHER_WARN_PCT)) && log "WARNING: ${OTHER_PCT}% of the machine went to other processes during the run"
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$round" "$proxy" "$stats" "$CPU_US" "$RSS_MB" "$OTHER_PCT" "$CONN_SPLIT" >>"$TMP/raw.tsv"
  kill_started "$PROXY_PID"
}

# ---------------------------------------------------------------- run
BUSY_PCT=$(busy_pct_1s)
((BUSY_PCT > 10)) && log "WARNING: the machine is ${BUSY_PCT}% busy before the run; numbers will be distorted"
make_cert "$TMP/certs" "${HOSTS[@]}"
write_post_body
for p in $PROXIES; do write_load_files "$p"; done
write_configs
if has_proxy aralez; then
  timeout 30 "$ARALEZ_BIN" check-config -c "$TMP/aralez/main.yaml" >"$TMP/load/check.out" 2>&1 \
    || { cat "$TMP/load/check.out" >&2; die "aralez check-config refused the benchmark config"; }
fi
start_bg backend "$LOAD_CPU" nginx -p "$TMP/backend" -e "$TMP/backend/error.log" -c "$TMP/backend.conf"
BACKEND_PID=$LAST_PID
for i in 0 1 2; do
  WANT_BODY=$(host_body $i) wait_ok backend "http://127.0.0.1:${P_BACK[$i]}/" 1.1 "$BACKEND_PID"
done

T0=$(date +%s)
: >"$TMP/raw.tsv"
for ((round = 0; round < ROUNDS; round++)); do
  for proxy in $(rotate "$round" $PROXIES); do measure "$proxy" "$round"; done
done
ELAPSED=$(($(date +%s) - T0))

# ---------------------------------------------------------------- report
# raw.tsv columns: 1 round, 2 proxy, 3 ok_rps, 4 get_rps, 5 post_rps, 6 responses, 7 ok, 8 non2xx,
# 9 errors, 10 deadline, 11-15 p50 p90 p99 p99.9 p99.99, 16 statuses, 17 errs, 18 cpu_us, 19 rss_mb,
# 20 other_pct, 21 client connections half-way (TLS / plain)
col() { awk -F'\t' -v x="$1" -v i="$2" '$2 == x {print $i}' "$TMP/raw.tsv"; }
sum() { col "$1" "$2" | awk '{s += $1} END {print s + 0}'; }
num() { awk -v v="$1" 'BEGIN { if (v == "nan" || v == "") print "n/a"; else printf "%.2f", v }'; }
int() { awk -v v="$1" 'BEGIN { if (v == "nan" || v == "") print "n/a"; else printf "%.0f", v }'; }
declare -A P99=() P999=()
REPORT="$TMP/report.md"
{
  echo "# Mixed load (Aralez's benchmark shape): $(for p in $PROXIES; do proxy_label "$p"; done | paste -sd ',' - | sed 's/,/, /g')"
  echo
  echo "- date: $(date -u '+%Y-%m-%d %H:%M:%S UTC'); took ${ELAPSED}s"
  echo "- machine: $(nproc) cores, $(lscpu 2>/dev/null | awk -F: '/^Model name/ {gsub(/^ +/, "", $2); print $2; exit}'), kernel $(uname -r); open-file limit $NOFILE"
  peer_headers_line
  peer_defer_line
  echo "- load: two oha $OHA_VERSION processes at once for ${DURATION}s, each \`-c $CONNS_EACH --urls-from-file\` (one GET, one POST with a 1 KiB JSON body, \`-T application/json\`), HTTP/1.1; 60 URLs: 20 nested paths (1-7 segments) on each of ${HOSTS[*]}, 45 HTTPS and 15 plain. oha keeps each connection to the scheme and port of the URL that opened it and sends any URL on it (Host header with the URL's port), so about 3/4 of the connections are TLS"
  echo "- routing: by host name in every proxy (3 hosts -> 3 backend ports of one nginx, \`return 200\` with a $(host_body 0 | wc -c)-byte JSON naming the host); checked with curl before each load (GET and POST, plain and TLS, each host to its own backend; an unknown host is not answered 200)"
  echo "- pinning: each proxy one worker/thread on core $PROXY_CPU; the backend and both oha processes (1 worker thread each) on core $LOAD_CPU; each proxy started fresh, no warm-up"
  echo "- connection caps: nginx worker_connections $NOFILE; HAProxy maxconn $HAPROXY_MAXCONN; aralez max_connections and upstream_max_connections 100000; idle upstream pool $POOL per backend on every proxy"
  echo "- versions: $(nginx -v 2>&1 | sed 's/^nginx version: //')$(has_proxy haproxy && echo ", $(haproxy -v 2>/dev/null | head -1 | awk '{print "HAProxy " $3}')"), oha $OHA_VERSION, $(openssl version | awk '{print $1, $2}')$(has_proxy aralez && echo ", aralez $ARALEZ_BIN (git $(git -C "$REPO_ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown))")$(has_proxy Aralez && echo ", Aralez $ARALEZ_PEER_VERSION $ARALEZ_PEER_BIN")"
  ((ROUNDS > 1)) && echo "- $ROUNDS rounds, order rotated; medians shown (RSS: the highest round; counts: summed over rounds)"
  echo "- CPUs busy in the 1 s before the run: ${BUSY_PCT}%$( ((BUSY_PCT > 10)) && echo " -- WARNING: machine not idle, numbers distorted")"
  [[ -n "${ARALEZ_EXTRA_YAML:-}" ]] && echo "- aralez main.yaml extra lines (ARALEZ_EXTRA_YAML): \`$(printf '%s' "$ARALEZ_EXTRA_YAML" | paste -sd ';' -)\`"
  [[ -n "$SKIPPED" ]] && echo "- **$SKIPPED**"
  [[ -n "$FD_NOTE" ]] && echo "- **WARNING: $FD_NOTE**"
  echo
  echo "| proxy | req/s (GET + POST) | p50 ms | p90 ms | p99 ms | p99.9 ms | p99.99 ms | answered | non-2xx | errors | cut at deadline | CPU us/req | RSS MB |"
  echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
  for p in $PROXIES; do
    P99[$p]=$(median $(col "$p" 13)) P999[$p]=$(median $(col "$p" 14))
    printf '| %s | %s (%s + %s) | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n' "$(proxy_label "$p")" \
      "$(int "$(median $(col "$p" 3))")" "$(int "$(median $(col "$p" 4))")" "$(int "$(median $(col "$p" 5))")" \
      "$(num "$(median $(col "$p" 11))")" "$(num "$(median $(col "$p" 12))")" "$(num "${P99[$p]}")" \
      "$(num "${P999[$p]}")" "$(num "$(median $(col "$p" 15))")" "$(sum "$p" 6)" "$(sum "$p" 8)" "$(sum "$p" 9)" \
      "$(sum "$p" 10)" "$(median $(col "$p" 18) | sed 's/^nan$/n\/a/')" "$(maximum $(col "$p" 19))"
  done
  echo
  for what in P99 P999; do
    declare -n arr=$what
    best="" bestv=nan
    for p in $PROXIES; do
      v=${arr[$p]}
      [[ "$v" == nan ]] && continue
      if [[ "$bestv" == nan ]] || awk -v a="$v" -v b="$bestv" 'BEGIN {exit !(a < b)}'; then best=$p bestv=$v; fi
    done
    name=p99; [[ "$what" == P999 ]] && name=p99.9
    if [[ -n "$best" ]]; then
      line="- lowest $name: $(proxy_label "$best") ($(num "$bestv") ms)"
      if has_proxy aralez && [[ "$best" != aralez ]]; then line+="; aralez $(num "${arr[aralez]}") ms = $(ratio "${arr[aralez]}" "$bestv") x"; fi
      echo "$line"
    fi
    unset -n arr
  done
  echo
  echo "Notes: req/s = 2xx responses per second of the ${DURATION}s run, both processes together (GET + POST apart in brackets)."
  echo "Percentiles: every answered request of both processes together (any status), from oha's per-request databases;"
  echo "\"errors\" = requests without an answer (connect errors, resets, timeouts), apart from those oha itself cuts at the end"
  echo "of -z (\"cut at deadline\": the requests in flight then, about one per connection, as on Aralez's page). CPU us/req ="
  echo "(utime+stime) of the proxy's processes during the run / 2xx responses; RSS = sum of VmHWM of the proxy's processes."
  echo
  echo "Status codes and error kinds:"
  echo
  for p in $PROXIES; do echo "- $(proxy_label "$p"): statuses $(col "$p" 16 | paste -sd ' ' -); errors $(col "$p" 17 | paste -sd ' ' -); client connections half-way: $(col "$p" 21 | paste -sd ',' - | sed 's/,/, /g')"; done
  hot=$(awk -F'\t' -v w="$OTHER_WARN_PCT" '$20 > w {print $2 " (" $20 "%)"}' "$TMP/raw.tsv" | paste -sd ',' - | sed 's/,/, /g')
  [[ -n "$hot" ]] && { echo; echo "**WARNING: other processes used more than ${OTHER_WARN_PCT}% of the machine during: $hot -- those numbers are distorted.**"; }
  true
} >"$REPORT"

cp "$REPORT" "$OUT_MD"
cat "$REPORT"
log "written to $OUT_MD"
