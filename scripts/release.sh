#!/usr/bin/env bash
# Builds a release binary for one target and packages it, as .github/workflows/release.yml does
# on a tag (and as anyone can here):
#
#   bash scripts/release.sh x86_64-unknown-linux-musl     # static (musl-tools for the C parts)
#   bash scripts/release.sh x86_64-unknown-linux-gnu
#   bash scripts/release.sh aarch64-unknown-linux-musl    # on an aarch64 machine
#
# Leaves dist/aralez-<version>-<target>.tar.gz (the binary, README, sample config) and its
# .sha256. A musl build must be static: the script fails if the binary has an interpreter or
# dynamic dependencies. The binary is smoke-tested before it is packed: --version, and
# check-config on the sample config.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

target="${1:?usage: scripts/release.sh <rust target triple>}"
log() { printf '[release] %s\n' "$*" >&2; }

version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
rustup target add "$target" >/dev/null 2>&1 || log "rustup target add $target failed (not rustup?); trying anyway"

case "$target" in
  *-musl)
    command -v musl-gcc >/dev/null 2>&1 || { log "musl-gcc missing: apt-get install musl-tools"; exit 1; }
    export RUSTFLAGS="${RUSTFLAGS:-} -C target-feature=+crt-static"
    # The C parts (mimalloc, aws-lc) are compiled for musl too.
    arch="${target%%-*}"
    export "CC_${arch}_unknown_linux_musl=musl-gcc"
    ;;
esac

log "building aralez $version for $target"
cargo build --release --locked --target "$target"
bin="target/$target/release/aralez"

if [[ "$target" == *-musl ]]; then
  if readelf -l "$bin" | grep -q 'INTERP' || readelf -d "$bin" | grep -q 'NEEDED'; then
    log "FAILED: $bin is not static:"; readelf -d "$bin" | grep NEEDED >&2 || true
    exit 1
  fi
  log "static: no interpreter, no shared libraries"
fi

host_arch=$(uname -m)
if [[ "$target" == "$host_arch"-* ]]; then
  "$bin" --version
  "$bin" check-config -c config/main.yaml >/dev/null
  log "smoke test passed"
else
  log "not smoke-tested: $target does not run on $host_arch"
fi

stage="dist/aralez-$version-$target"
rm -rf "$stage" && mkdir -p "$stage"
cp "$bin" README.md "$stage/"
# Debug info stays in target/ for profiling; the archive gets the stripped binary.
strip --strip-debug "$stage/aralez" 2>/dev/null || log "strip failed: packing the binary with its debug info"
cp -r config "$stage/config"
rm -f "$stage"/config/*.key
tar -C dist -czf "$stage.tar.gz" "aralez-$version-$target"
(cd dist && sha256sum "aralez-$version-$target.tar.gz" > "aralez-$version-$target.tar.gz.sha256")
rm -rf "$stage"
log "dist/aralez-$version-$target.tar.gz"
