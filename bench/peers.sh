#!/usr/bin/env bash
# Installs the benchmark peers that are not Debian packages, each with `cargo install --locked` at a
# pinned version into its own root under target/peers/ (never run by the test command):
#   - Aralez (the Pingora-based proxy whose config files aralez reads), crate `aralez`
#   - oha (the load generator of Aralez's own benchmark page), crate `oha`
# An install already recorded at the pinned version is skipped. Prints one line per peer:
#   ARALEZ_PEER_BIN=/path/to/aralez     OHA_BIN=/path/to/oha
#
#   bash bench/peers.sh                      # both (first run: long, see bench/README.md)
#   PEERS=oha bash bench/peers.sh            # only oha
#
# Env knobs:
#   PEERS               which peers: any of "aralez oha" (default both)
#   PEERS_DIR           install roots (default <repo>/target/peers; NAME/bin/NAME under it)
#   ARALEZ_PEER_VERSION Aralez version (default 0.95.4, pinned in bench/lib.sh)
#   OHA_VERSION         oha version (default 1.16.0, pinned in bench/lib.sh)
#   CARGO_JOBS          cargo -j (default 1: the build shares the machine; it runs under nice -n 19)
#   INSTALL_TIMEOUT     seconds allowed for each `cargo install` (default 7200)
#   KEEP_BUILD          1 keeps the build directory ($PEERS_DIR/build/NAME, several GB for Aralez)
#                       after a successful install; by default it is removed. An interrupted or failed
#                       build keeps it, so that the next run resumes where it stopped.
#
# Aralez 0.95 links OpenSSL through Pingora (openssl-sys) and builds aws-lc and other C code: it needs
# a C compiler, make, cmake, perl, pkg-config and the OpenSSL headers. Missing ones are installed with
# apt-get when run as root (otherwise the script says which are missing).
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=bench/lib.sh
source "$SCRIPT_DIR/lib.sh"

PEERS=${PEERS:-"aralez oha"}
CARGO_JOBS=${CARGO_JOBS:-1}
INSTALL_TIMEOUT=${INSTALL_TIMEOUT:-7200}
KEEP_BUILD=${KEEP_BUILD:-0}
DIR=$(peers_dir)

for p in $PEERS; do
  case "$p" in aralez|oha) ;; *) die "unknown peer '$p' (known: aralez oha)";; esac
done
[[ "$CARGO_JOBS" =~ ^[1-9][0-9]*$ ]] || die "CARGO_JOBS must be a positive integer, got '$CARGO_JOBS'"
[[ "$INSTALL_TIMEOUT" =~ ^[1-9][0-9]*$ ]] || die "INSTALL_TIMEOUT must be a positive integer (seconds), got '$INSTALL_TIMEOUT'"

# Build dependencies: commands, plus the OpenSSL headers (pkg-config openssl) for Aralez.
ensure_build_deps() {
  local need=(cc make perl pkg-config) pkgs=(build-essential perl pkg-config) missing=() c
  if [[ " $PEERS " == *" aralez "* ]]; then
    need+=(cmake)
    pkgs+=(cmake libssl-dev)
  fi
  for c in "${need[@]}"; do command -v "$c" >/dev/null 2>&1 || missing+=("$c"); done
  if [[ " $PEERS " == *" aralez "* ]] && command -v pkg-config >/dev/null 2>&1 \
    && ! pkg-config --exists openssl 2>/dev/null; then
    missing+=("OpenSSL headers (libssl-dev)")
  fi
  ((${#missing[@]})) || return 0
  [[ $(id -u) -eq 0 ]] || die "missing build dependencies: ${missing[*]}; run as root to apt-get install ${pkgs[*]}"
  command -v apt-get >/dev/null 2>&1 || die "missing build dependencies: ${missing[*]} and no apt-get to install them"
  log "installing build dependencies (${missing[*]}) with apt-get"
  export DEBIAN_FRONTEND=noninteractive
  timeout 600 apt-get update -qq || die "apt-get update failed"
  timeout 900 apt-get install -y -qq "${pkgs[@]}" || die "apt-get install ${pkgs[*]} failed"
}

# install_peer CRATE VERSION VAR: cargo install unless already there; prints VAR=path.
install_peer() {
  local crate=$1 version=$2 var=$3 bin root build t0 rc=0
  if bin=$(peer_bin "$crate" "$version"); then
    log "$crate $version already installed"
    echo "$var=$bin"
    return 0
  fi
  command -v cargo >/dev/null 2>&1 || die "cargo not found (install Rust with rustup) -- needed to build $crate $version"
  root="$DIR/$crate"
  build="$DIR/build/$crate"
  mkdir -p "$root" "$build" "$DIR/logs"
  log "building $crate $version (cargo install --locked -j $CARGO_JOBS, nice -n 19; log: $DIR/logs/$crate.log); this can take long"
  t0=$(date +%s)
  # Its own target directory (not the repository's shared one, so no cargo lock is held against the
  # repository's builds), kept on failure so that a second run resumes.
  (cd "$DIR" && CARGO_TARGET_DIR="$build" timeout "$INSTALL_TIMEOUT" nice -n 19 \
    cargo install "$crate" --version "=$version" --locked -j "$CARGO_JOBS" --root "$root") \
    >"$DIR/logs/$crate.log" 2>&1 || rc=$?
  if ((rc != 0)); then
    tail -n 30 "$DIR/logs/$crate.log" >&2
    ((rc == 124)) && die "cargo install $crate $version did not finish within ${INSTALL_TIMEOUT}s (log: $DIR/logs/$crate.log); run again to resume"
    die "cargo install $crate $version failed (exit $rc); full log: $DIR/logs/$crate.log"
  fi
  bin=$(peer_bin "$crate" "$version") || die "cargo install $crate $version succeeded but $root/bin/$crate is missing"
  log "$crate $version built in $(($(date +%s) - t0)) s"
  ((KEEP_BUILD)) || rm -rf "$build"
  echo "$var=$bin"
}

ensure_build_deps
for p in $PEERS; do
  case "$p" in
    aralez) install_peer aralez "$ARALEZ_PEER_VERSION" ARALEZ_PEER_BIN ;;
    oha) install_peer oha "$OHA_VERSION" OHA_BIN ;;
  esac
done
