#!/usr/bin/env bash
# Sourced by scripts/test.sh: makes `cargo` a toolchain new enough for this crate (the
# `rust-version` of Cargo.toml). Debian's packaged rustc is too old on Debian 12 (1.63) and
# Ubuntu 22.04 (1.75 in -updates), so when cargo is missing or older, rustup's minimal stable
# toolchain is installed for the current user (into ~/.cargo, ~/.rustup; no root needed, curl is).
# Prints nothing on success but what it installs; returns non-zero when it cannot.

rust_needed() { sed -n 's/^rust-version = "\(.*\)"/\1/p' Cargo.toml; }

# version_at_least HAVE WANT: whether version HAVE >= WANT (dotted numbers).
version_at_least() { [ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -1)" = "$2" ]; }

rust_ready() {
  command -v cargo >/dev/null 2>&1 && command -v rustc >/dev/null 2>&1 &&
    version_at_least "$(rustc --version | cut -d' ' -f2)" "$(rust_needed)"
}

ensure_rust() {
  if ! rust_ready && [ -x "$HOME/.cargo/bin/cargo" ]; then
    export PATH="$HOME/.cargo/bin:$PATH"
  fi
  rust_ready && return 0
  local have
  have=$(rustc --version 2>/dev/null || echo "no rustc")
  printf '[test] %s; Rust %s or newer is needed: installing rustup'"'"'s stable toolchain\n' "$have" "$(rust_needed)" >&2
  if ! command -v curl >/dev/null 2>&1; then
    [ "$(id -u)" = 0 ] || { echo "[test] curl is missing (run as root to install it)" >&2; return 1; }
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq curl ca-certificates >/dev/null || return 1
  fi
  # rustup-init straight from static.rust-lang.org (what sh.rustup.rs fetches too).
  # (It must be called rustup-init: rustup picks its part by its own file name.)
  local dir init
  dir=$(mktemp -d)
  init="$dir/rustup-init"
  curl --proto '=https' --tlsv1.2 -sSf -o "$init" \
    "https://static.rust-lang.org/rustup/dist/$(uname -m)-unknown-linux-gnu/rustup-init" || return 1
  chmod +x "$init"
  "$init" -y --profile minimal --default-toolchain stable --no-modify-path >&2 || return 1
  rm -rf "$dir"
  export PATH="$HOME/.cargo/bin:$PATH"
  rust_ready
}
