#!/usr/bin/env bash
# Makes sure the pinned toolchain can build plugins for wasm32-wasip2.
#
#   bash plugins/wasm-target.sh      (or source it and call ensure_wasm_target)
#
# rustup installs the targets that rust-toolchain.toml lists only when it
# installs the toolchain itself; a machine that already had 1.95.0 lacks
# the target. With rustup present the target is added here; without it,
# the message says what to install.
ensure_wasm_target() {
  local target=wasm32-wasip2 root
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  if command -v rustup >/dev/null 2>&1; then
    if (cd "$root" && rustup target list --installed) | grep -qx "$target"; then
      return 0
    fi
    echo "outboxd: adding the $target target to the pinned toolchain (rustup target add $target)" >&2
    (cd "$root" && rustup target add "$target" >&2) || {
      echo "outboxd: 'rustup target add $target' failed; run it by hand in $root and retry" >&2
      return 1
    }
    return 0
  fi
  local sysroot
  sysroot=$(cd "$root" && rustc --print sysroot 2>/dev/null) || sysroot=
  if [[ -n "$sysroot" && -d "$sysroot/lib/rustlib/$target/lib" ]]; then
    return 0
  fi
  echo "outboxd: the $target target is missing and rustup is not installed." >&2
  echo "         Install rustup (https://rustup.rs), then run: rustup target add $target" >&2
  echo "         or install your distribution's Rust standard library for $target." >&2
  return 1
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  set -euo pipefail
  ensure_wasm_target
fi
