#!/usr/bin/env bash
# Installs the system packages the build needs when they are missing: the
# OpenSSL headers and pkg-config, which librdkafka (rdkafka's `ssl`
# feature, linked against the system's OpenSSL for TLS and SASL) builds
# against. A machine where `pkg-config --exists openssl` succeeds is left
# alone; elsewhere Debian's packages are installed (root and apt-get), or
# the message says what to install.
#
#   bash tests/deps.sh          (tests/run.sh, tests/chaos.sh and .ci/run
#                                run it first)
set -euo pipefail

if command -v pkg-config >/dev/null 2>&1 && pkg-config --exists openssl; then
  exit 0
fi
packages=(libssl-dev pkg-config)
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "deps.sh: the build needs OpenSSL's headers and pkg-config (for librdkafka's TLS and SASL)." >&2
  echo "         Debian/Ubuntu: sudo apt-get install -y ${packages[*]}; Fedora: sudo dnf install openssl-devel pkgconf" >&2
  exit 1
fi
echo "deps.sh: installing ${packages[*]} from Debian's packages" >&2
DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${packages[@]}" >/dev/null 2>&1 ||
  { apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${packages[@]}" >/dev/null; } ||
  { echo "deps.sh: could not install ${packages[*]} with apt-get" >&2; exit 1; }
pkg-config --exists openssl ||
  { echo "deps.sh: ${packages[*]} are installed but pkg-config finds no openssl" >&2; exit 1; }
