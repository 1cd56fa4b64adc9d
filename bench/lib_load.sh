# Shared functions of the bench scripts, sourced by bench/lib.sh (not run): the load generators
# (wrk, bench/connload) and their parsers, the TLS certificate and the TLS probe. The globals are
# bench/lib.sh's.

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
