# Shared functions of the bench scripts, sourced by bench/lib.sh (not run): medians and ratios,
# the tables printed, and the peers' knobs for equal work (forwarding fields, deferred accepts).
# The globals are bench/lib.sh's.

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
