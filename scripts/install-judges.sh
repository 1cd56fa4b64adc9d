#!/usr/bin/env bash
# Installs the external TLS/HTTP2 judges that tests/judges.rs runs against the proxy, when missing:
#
#   sslyze     from PyPI, into a venv at target/judges/venv
#   testssl.sh from Debian (package testssl.sh)
#   h2spec     from the Go module proxy, into target/judges/bin
#   grpc-go's interop client and server (grpc-interop-client, grpc-interop-server), likewise
#   slowhttptest from Debian (package slowhttptest)
#   actionlint from the Go module proxy (checks .github/workflows), into target/judges/bin
#   gzip, brotli and zstd from Debian: independent decoders for tests/compression.rs
#   cargo-fuzz from crates.io (cargo install), into target/judges/cargo-fuzz (scripts/fuzz.sh)
#   chromium   from Debian (package chromium), headless, for tests/status_page.rs
#   haproxy    from Debian (package haproxy): the load balancer in front (tests/real_client.rs)
#   redis-server from Debian (package redis-server): the cache's shared tier (tests/cache_redis.rs)
#   pebble and pebble-challtestsrv from Debian (package pebble): the ACME server (tests/acme.rs)
#
# Idempotent: a tool already in place is kept. As root it may apt-get install what it needs
# (python3-venv, golang-go, testssl.sh, chromium). Any failure exits non-zero with a message saying
# which judge could not be installed. On success it prints, on stdout, the lines
#   ARALEZ_SSLYZE=... ARALEZ_TESTSSL=... ARALEZ_H2SPEC=... ARALEZ_GRPC_INTEROP_CLIENT=...
#   ARALEZ_GRPC_INTEROP_SERVER=... ARALEZ_SLOWHTTPTEST=... ARALEZ_CARGO_FUZZ=...
#   ARALEZ_ACTIONLINT=... ARALEZ_CHROMIUM=... ARALEZ_HAPROXY=... ARALEZ_REDIS_SERVER=...
#   ARALEZ_PEBBLE=... ARALEZ_PEBBLE_CHALLTESTSRV=... ARALEZ_H3_PYTHON=... (aioquic's interpreter)
#   ARALEZ_GZIP=... ARALEZ_BROTLI=... ARALEZ_ZSTD=...
# for the caller to export (scripts/test.sh does).
#
#   bash scripts/install-judges.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

JUDGES="$PWD/target/judges"
SSLYZE_VERSION="6.3.1"
AIOQUIC_VERSION="1.7.2"
H2SPEC_MODULE="github.com/summerwind/h2spec/cmd/h2spec@latest"
GRPC_VERSION="v1.85.0"
CARGO_FUZZ_VERSION="0.13.2"
ACTIONLINT_VERSION="v1.7.7"

log() { printf '[judges] %s\n' "$*" >&2; }
fail() {
  log "FAILED: $*"
  exit 1
}

apt_updated=0
apt_install() {
  [ "$(id -u)" = 0 ] || fail "need root to apt-get install $*"
  export DEBIAN_FRONTEND=noninteractive
  if [ "$apt_updated" = 0 ]; then
    apt-get update -qq || fail "apt-get update"
    apt_updated=1
  fi
  log "apt-get install $*"
  apt-get install -y -qq --no-install-recommends "$@" >/dev/null || fail "apt-get install $*"
}

# Python with venv and ensurepip (Debian splits them into python3-venv).
need_venv() {
  command -v python3 >/dev/null 2>&1 || apt_install python3
  if ! python3 -m venv --help >/dev/null 2>&1 || ! python3 -c 'import ensurepip' 2>/dev/null; then
    apt_install python3-venv
  fi
}

# aioquic (an HTTP/3 client independent of quinn and h3), in a venv of its own (its
# cryptography is newer than sslyze's allows).
install_aioquic() {
  local venv="$JUDGES/h3venv"
  if "$venv/bin/python" -c "import aioquic, sys; sys.exit(aioquic.__version__ != '$AIOQUIC_VERSION')" 2>/dev/null; then
    return
  fi
  need_venv
  log "aioquic $AIOQUIC_VERSION into $venv"
  rm -rf "$venv"
  python3 -m venv "$venv" || fail "python3 -m venv $venv (is python3-venv installed?)"
  "$venv/bin/pip" install -q --disable-pip-version-check "aioquic==$AIOQUIC_VERSION" >&2 ||
    fail "pip install aioquic==$AIOQUIC_VERSION"
}

install_sslyze() {
  local venv="$JUDGES/venv"
  if [ -x "$venv/bin/sslyze" ] && "$venv/bin/sslyze" --help >/dev/null 2>&1; then
    return
  fi
  need_venv
  log "sslyze $SSLYZE_VERSION into $venv"
  rm -rf "$venv"
  python3 -m venv "$venv" || fail "python3 -m venv $venv (is python3-venv installed?)"
  "$venv/bin/pip" install -q --disable-pip-version-check "sslyze==$SSLYZE_VERSION" >&2 ||
    fail "pip install sslyze==$SSLYZE_VERSION"
  "$venv/bin/sslyze" --help >/dev/null || fail "sslyze installed but does not run"
}

install_testssl() {
  command -v testssl >/dev/null 2>&1 || command -v testssl.sh >/dev/null 2>&1 ||
    apt_install testssl.sh # pulls openssl, bsdmainutils, dnsutils, procps
  command -v testssl >/dev/null 2>&1 || command -v testssl.sh >/dev/null 2>&1 ||
    fail "testssl.sh is not on PATH after apt-get install testssl.sh"
}

need_go() {
  command -v go >/dev/null 2>&1 && return
  if [ -x /usr/local/go/bin/go ]; then
    export PATH="/usr/local/go/bin:$PATH"
  else
    apt_install golang-go ca-certificates
  fi
}

# go_install MODULE@VERSION NAME: builds the module's command into target/judges/bin/NAME.
go_install() {
  local module="$1" name="$2" bin="$JUDGES/bin"
  [ -x "$bin/$name" ] && return
  need_go
  log "$name: go install $module"
  mkdir -p "$bin" "$JUDGES/gobuild"
  GOBIN="$JUDGES/gobuild" go install "$module" >&2 || fail "go install $module"
  local built="$JUDGES/gobuild/$(basename "${module%@*}")"
  [ -x "$built" ] || fail "$name missing from $JUDGES/gobuild after go install $module"
  mv "$built" "$bin/$name"
}

install_slowhttptest() {
  command -v slowhttptest >/dev/null 2>&1 || apt_install slowhttptest
  command -v slowhttptest >/dev/null 2>&1 || fail "slowhttptest is not on PATH after apt-get install"
}

install_chromium() {
  # DejaVu: the page screenshots need some font on a minimal machine.
  command -v chromium >/dev/null 2>&1 || apt_install chromium fonts-dejavu-core
  command -v chromium >/dev/null 2>&1 || fail "chromium is not on PATH after apt-get install chromium"
}

haproxy_path() {
  command -v haproxy 2>/dev/null || { [ -x /usr/sbin/haproxy ] && echo /usr/sbin/haproxy; }
}

redis_path() {
  command -v redis-server 2>/dev/null || { [ -x /usr/bin/redis-server ] && echo /usr/bin/redis-server; }
}

# Only the binary is used: the tests start their own servers on loopback ports. Debian's package
# also enables a system service; it is left as the package sets it up.
install_redis() {
  redis_path >/dev/null || apt_install redis-server
  redis_path >/dev/null || fail "redis-server is not installed after apt-get install redis-server"
}

install_pebble() {
  [ -x /usr/bin/pebble ] && [ -x /usr/bin/pebble-challtestsrv ] || apt_install pebble
  [ -x /usr/bin/pebble ] || fail "pebble is not installed after apt-get install pebble"
  [ -x /usr/bin/pebble-challtestsrv ] || fail "pebble-challtestsrv is missing from the pebble package"
}

install_haproxy() {
  haproxy_path >/dev/null || apt_install haproxy
  haproxy_path >/dev/null || fail "haproxy is not installed after apt-get install haproxy"
}

install_decoders() {
  local tool
  for tool in gzip brotli zstd; do
    command -v "$tool" >/dev/null 2>&1 || apt_install "$tool"
    command -v "$tool" >/dev/null 2>&1 || fail "$tool is not on PATH after apt-get install $tool"
  done
}

install_cargo_fuzz() {
  local root="$JUDGES/cargo-fuzz"
  if [ -x "$root/bin/cargo-fuzz" ] && "$root/bin/cargo-fuzz" --version | grep -q "$CARGO_FUZZ_VERSION"; then
    return
  fi
  command -v c++ >/dev/null 2>&1 || apt_install g++ # libFuzzer is C++
  # --debug: cargo-fuzz only runs cargo and the fuzz binaries, and its unoptimised build took
  # 42 s here instead of 67.
  log "cargo-fuzz $CARGO_FUZZ_VERSION: cargo install --debug"
  cargo install -q --debug cargo-fuzz --version "$CARGO_FUZZ_VERSION" --locked --root "$root" >&2 ||
    fail "cargo install cargo-fuzz $CARGO_FUZZ_VERSION"
}

mkdir -p "$JUDGES"
install_aioquic
install_sslyze
install_testssl
go_install "$H2SPEC_MODULE" h2spec
go_install "google.golang.org/grpc/interop/client@$GRPC_VERSION" grpc-interop-client
go_install "google.golang.org/grpc/interop/server@$GRPC_VERSION" grpc-interop-server
install_slowhttptest
install_chromium
install_decoders
install_cargo_fuzz
go_install "github.com/rhysd/actionlint/cmd/actionlint@$ACTIONLINT_VERSION" actionlint
install_haproxy
install_redis
install_pebble

testssl=$(command -v testssl || command -v testssl.sh)
echo "ARALEZ_SSLYZE=$JUDGES/venv/bin/sslyze"
echo "ARALEZ_H3_PYTHON=$JUDGES/h3venv/bin/python"
echo "ARALEZ_TESTSSL=$testssl"
echo "ARALEZ_H2SPEC=$JUDGES/bin/h2spec"
echo "ARALEZ_GRPC_INTEROP_CLIENT=$JUDGES/bin/grpc-interop-client"
echo "ARALEZ_GRPC_INTEROP_SERVER=$JUDGES/bin/grpc-interop-server"
echo "ARALEZ_SLOWHTTPTEST=$(command -v slowhttptest)"
echo "ARALEZ_CARGO_FUZZ=$JUDGES/cargo-fuzz/bin"
echo "ARALEZ_ACTIONLINT=$JUDGES/bin/actionlint"
echo "ARALEZ_CHROMIUM=$(command -v chromium)"
echo "ARALEZ_HAPROXY=$(haproxy_path)"
echo "ARALEZ_REDIS_SERVER=$(redis_path)"
echo "ARALEZ_PEBBLE=/usr/bin/pebble"
echo "ARALEZ_PEBBLE_CHALLTESTSRV=/usr/bin/pebble-challtestsrv"
echo "ARALEZ_GZIP=$(command -v gzip)"
echo "ARALEZ_BROTLI=$(command -v brotli)"
echo "ARALEZ_ZSTD=$(command -v zstd)"
