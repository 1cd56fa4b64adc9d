#!/usr/bin/env bash
# Instructions per proxied request under callgrind (repeatable whatever else the machine does):
# one worker, nginx `return 200` as the backend, h2load --h1 with 4 keep-alive connections,
# counters zeroed after a warm-up. Needs valgrind, nginx, h2load, curl, python3.
#   bash bench/callgrind.sh target/release/aralez plain 4000       # the plain route
#   bash bench/callgrind.sh target/release/aralez tcpnew 4000      # the plain route, a new connection per request (wrk, about N requests)
#   bash bench/callgrind.sh target/release/aralez policies 4000    # jwt + rate limit + 3+3 headers (issue 4)
#   bash bench/callgrind.sh target/release/aralez accesslog 4000   # plain route, access_log: all (issue 6)
#   bash bench/callgrind.sh target/release/aralez h2c 4000         # plain route, h2c clients (16 streams each)
#   bash bench/callgrind.sh target/release/aralez h2c1 4000        # plain route, 64 h2c clients with 1 stream each (the sweep's shape)
#   bash bench/callgrind.sh target/release/aralez https 4000       # plain's load over TLS 1.3 (HTTP/1.1 keep-alive)
#   bash bench/callgrind.sh target/release/aralez tlsnew 1000      # a new TLS 1.3 connection per request, resumed from a ticket (wrk)
#   bash bench/callgrind.sh target/release/aralez h2tls 4000       # h2c's load over TLS 1.3 (ALPN h2, ECDSA P-256 certificate)
#   bash bench/callgrind.sh target/release/aralez h2tls1 4000      # h2c1's load over TLS 1.3
#   bash bench/callgrind.sh target/release/aralez post 4000        # plain route, POST with a 1 KiB body
#   bash bench/callgrind.sh target/release/aralez cachemiss 4000   # plain route, cache on, backend says no-store (issue 15)
#   bash bench/callgrind.sh target/release/aralez cachehit 4000    # plain route, cache on, every request a hit (issue 15)
#   bash bench/callgrind.sh target/release/aralez cacheoff 4000    # cachemiss's requests and backend, no cache: its baseline
# CG_KEEP=FILE keeps the profile for callgrind_annotate.
# Every mode sends the same `Authorization: Bearer` header, so routes differ only in what they do.
set -euo pipefail
BIN=$1 MODE=$2 N=${3:-4000}
case "$MODE" in plain|tcpnew|tlsnew|policies|accesslog|h2c|h2c1|https|h2tls|h2tls1|post|cachemiss|cachehit|cacheoff) ;; *) echo "mode: plain, tcpnew, tlsnew, policies, accesslog, h2c, h2c1, https, h2tls, h2tls1, post, cachemiss, cachehit or cacheoff" >&2; exit 2;; esac
D=$(mktemp -d /tmp/cgb.XXXX)
LOAD=(--h1 -c 4)
case "$MODE" in h2c|h2tls) LOAD=(-c 4 -m 16) ;; h2c1|h2tls1) LOAD=(-c 64 -m 1) ;; esac
TLS=0; case "$MODE" in https|h2tls|h2tls1|tlsnew) TLS=1 ;; esac
URL=http://127.0.0.1:18193/; [ $TLS = 1 ] && URL=https://127.0.0.1:18194/
if [ "$MODE" = post ]; then
  head -c 1024 /dev/zero | tr '\0' 'x' > $D/body
  LOAD=(--h1 -c 4 -d $D/body)
fi
trap 'kill ${VPID:-} ${NPID:-} 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$D"' EXIT
mkdir -p $D/nginx
BACKEND_CC=""
case "$MODE" in cachemiss|cacheoff) BACKEND_CC='add_header Cache-Control "no-store";' ;; esac
[ "$MODE" = cachehit ] && BACKEND_CC='add_header Cache-Control "max-age=3600";'
cat > $D/nginx.conf <<Y
worker_processes 1; daemon off; pid $D/nginx/pid; error_log $D/nginx/err;
events { worker_connections 256; }
http { access_log off; client_body_temp_path $D/nginx; proxy_temp_path $D/nginx; fastcgi_temp_path $D/nginx;
  uwsgi_temp_path $D/nginx; scgi_temp_path $D/nginx;
  server { listen 127.0.0.1:18080; keepalive_requests 1000000; location / { $BACKEND_CC return 200 "ok\n"; } } }
Y
nginx -c $D/nginx.conf & NPID=$!
SECRET=bench-secret
if [ "$MODE" = policies ]; then
  cat > $D/upstreams.yaml <<Y
upstreams:
  DEFAULT:
    paths:
      "/":
        servers: ["127.0.0.1:18080"]
        healthcheck: false
        authorization: { type: jwt, data: "$SECRET" }
        rate_limit: 10000000
        server_headers: ["X-A:1", "X-B:2", "X-C:3"]
        client_headers: ["X-D:4", "X-E:5", "X-F:6"]
Y
else
  printf 'upstreams:\n  DEFAULT:\n    paths:\n      "/": { servers: ["127.0.0.1:18080"], healthcheck: false }\n' > $D/upstreams.yaml
fi
TOKEN=$(python3 - "$SECRET" <<'PY'
import base64, hmac, hashlib, json, sys, time
b64 = lambda b: base64.urlsafe_b64encode(b).rstrip(b"=")
head = b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
body = b64(json.dumps({"sub": "bench", "exp": int(time.time()) + 3600}).encode())
sig = b64(hmac.new(sys.argv[1].encode(), head + b"." + body, hashlib.sha256).digest())
print((head + b"." + body + b"." + sig).decode())
PY
)
ACCESS=off; [ "$MODE" = accesslog ] && ACCESS=all
cat > $D/main.yaml <<Y
threads: 1
proxy_address_http: "127.0.0.1:18193"
upstreams_conf: "upstreams.yaml"
pid_file: "$D/p.pid"
upgrade_sock: "$D/u.sock"
log_level: warn
access_log: $ACCESS
log_file: "$D/log"
Y
case "$MODE" in cachemiss|cachehit) printf 'cache:\n  mem_size_mb: 64\n' >> $D/main.yaml ;; esac
if [ $TLS = 1 ]; then
  # shellcheck source=bench/lib.sh
  source "$(dirname "$0")/lib.sh"
  TMP=$D make_cert "$D/certs"
  printf 'proxy_address_tls: "127.0.0.1:18194"\nproxy_certificates: "%s"\n' "$D/certs" >> $D/main.yaml
fi
valgrind --tool=callgrind --compress-strings=no --callgrind-out-file=$D/cg.%p "$BIN" -c $D/main.yaml >/dev/null 2>$D/vg.err & VPID=$!
AUTH="Authorization: Bearer $TOKEN"
# A request with Authorization is never stored (RFC 9111 §3.5): the cache modes send none.
case "$MODE" in cachemiss|cachehit|cacheoff) AUTH="X-Bench: 1" ;; esac
for i in $(seq 1 300); do curl -ksf -o /dev/null -H "$AUTH" "$URL" && break; sleep 0.1; done
# tcpnew, tlsnew: a new connection per request (wrk, for a time; N becomes the count it made).
# wrk resumes each TLS connection from a ticket of an earlier one.
load() {  # load REQUESTS
  if [ "$MODE" = tcpnew ]; then
    wrk -t1 -c4 -d"$(( $1 / 400 + 1 ))s" -H "$AUTH" -H "Connection: close" "$URL"
  elif [ "$MODE" = tlsnew ]; then
    wrk -t1 -c4 -d"$(( $1 / 40 + 1 ))s" -H "$AUTH" -H "Connection: close" "$URL"
  else
    h2load "${LOAD[@]}" -n "$1" -H "$AUTH" "$URL"
  fi
}
load 500 >/dev/null   # warm-up: pools, allocator
sleep 1
callgrind_control -z $VPID >/dev/null
load $N > $D/h2load.out
[[ "$MODE" == tcpnew || "$MODE" == tlsnew ]] && N=$(awk '/requests in/ {print $1}' $D/h2load.out)
sleep 1   # let the access log writer finish its batch
callgrind_control -d $VPID >/dev/null
sleep 1
grep -E "succeeded|status codes|requests in|Non-2xx|Socket errors" $D/h2load.out | tr -s " " | head -3 || true
IR=$(cat $D/cg.*.* 2>/dev/null | awk '/^(summary|totals):/ {print $2}' | tail -1)
echo "mode=$MODE requests=$N Ir=$IR per_request=$((IR / N)) access_lines=$(grep -c '^access ' $D/log || true)"
[ -n "${CG_KEEP:-}" ] && cp "$(ls -S $D/cg.*.* | head -1)" "$CG_KEEP"
true
