#!/usr/bin/env bash
# Cost of the access log: instructions per proxied request under callgrind, access_log off vs all
# (issue 6 asks for < 10%). One worker, nginx `return 200` as the backend, h2load --h1 with 4
# keep-alive connections, counters zeroed after a warm-up. Needs valgrind, nginx, h2load, curl.
#   bash bench/accesslog-callgrind.sh target/release/aralez off 4000
#   bash bench/accesslog-callgrind.sh target/release/aralez all 4000
set -euo pipefail
BIN=$1 MODE=$2 N=${3:-4000}
D=$(mktemp -d /tmp/cg.XXXX)
mkdir -p $D/nginx
cat > $D/nginx.conf <<Y
worker_processes 1; daemon off; pid $D/nginx/pid; error_log $D/nginx/err;
events { worker_connections 256; }
http { access_log off; client_body_temp_path $D/nginx; proxy_temp_path $D/nginx; fastcgi_temp_path $D/nginx;
  uwsgi_temp_path $D/nginx; scgi_temp_path $D/nginx;
  server { listen 127.0.0.1:18080; keepalive_requests 1000000; location / { return 200 "ok\n"; } } }
Y
nginx -c $D/nginx.conf & NPID=$!
cat > $D/upstreams.yaml <<Y
upstreams:
  DEFAULT:
    paths:
      "/": { servers: ["127.0.0.1:18080"] }
Y
cat > $D/main.yaml <<Y
threads: 1
proxy_address_http: "127.0.0.1:18193"
upstreams_conf: "upstreams.yaml"
pid_file: "$D/p.pid"
upgrade_sock: "$D/u.sock"
log_level: warn
access_log: $MODE
log_file: "$D/log"
Y
valgrind --tool=callgrind --callgrind-out-file=$D/cg.%p "$BIN" -c $D/main.yaml >/dev/null 2>$D/vg.err & VPID=$!
for i in $(seq 1 300); do curl -s -o /dev/null -H 'Host: a' http://127.0.0.1:18193/ && break; sleep 0.1; done
h2load --h1 -n 500 -c 4 http://127.0.0.1:18193/ >/dev/null   # warm-up: pools, allocator
sleep 1
callgrind_control -z $VPID >/dev/null
h2load --h1 -n $N -c 4 http://127.0.0.1:18193/ > $D/h2load.out
sleep 1   # let the access log writer finish its batch
callgrind_control -d $VPID >/dev/null
sleep 1
grep -E "succeeded|status codes" $D/h2load.out | tr -s ' ' | head -2
IR=$(cat $D/cg.*.* 2>/dev/null | awk '/^(summary|totals):/ {print $2}' | tail -1)
echo "mode=$MODE requests=$N Ir=$IR per_request=$((IR / N)) access_lines=$(grep -c '^access ' $D/log || true)"
kill $VPID $NPID 2>/dev/null || true; wait 2>/dev/null || true
