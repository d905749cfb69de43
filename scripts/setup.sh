#!/usr/bin/env bash
# Installs the Debian 12 packages Nereus builds with, only those missing.
set -euo pipefail
pkgs=(meson ninja-build g++ pkg-config libboost1.81-dev libucx-dev ucx-utils
      libcapnp-dev capnproto libssl-dev doctest-dev nlohmann-json3-dev libcli11-dev libfmt-dev
      openmpi-bin clang libclang-rt-dev
      python3-dev pybind11-dev libdlpack-dev python3-torch
      librsvg2-bin)  # rsvg-convert: the tests rasterise the plots
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}" >&2
  sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
