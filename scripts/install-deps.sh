#!/usr/bin/env bash
# Installs mcprun's build and test dependencies from Debian's packages. Safe to run twice: it
# only calls apt-get when something is missing.
set -euo pipefail

packages=(
  build-essential cmake
  libboost-dev libyaml-cpp-dev libspdlog-dev libcli11-dev nlohmann-json3-dev libgtest-dev
  python3 python3-torch  # Debian's torch 1.13: the example, the end-to-end tests, torchrun to compare
  iproute2 procps
)
missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" ||
    missing+=("$package")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi
sudo=()
[ "$(id -u)" -eq 0 ] || sudo=(sudo)
echo "install-deps: installing ${missing[*]}"
"${sudo[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
