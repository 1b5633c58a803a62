#!/usr/bin/env bash
# The whole test suite: install what is missing, build with warnings as
# errors, run every test, then rebuild and rerun the unit tests under
# AddressSanitizer + UndefinedBehaviorSanitizer.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

bash "$REPO_ROOT/deploy/scripts/install_deps.sh"
if [[ ! -f "$VC_MODELS_DIR/stories260K.bin" ]]; then
  echo "test: test models not found in $VC_MODELS_DIR (set VC_MODELS_DIR); model tests will skip" >&2
fi

echo "== build (build-test/, RelWithDebInfo, -Werror) =="
configure_and_build build-test -DCMAKE_BUILD_TYPE=RelWithDebInfo -DVC_MODELS_DIR="$VC_MODELS_DIR"
echo "== tests =="
(cd "$REPO_ROOT/build-test" && ctest -j "$JOBS" --output-on-failure --timeout 900)

echo "== build (build-asan/, ASan+UBSan) =="
configure_and_build build-asan -DCMAKE_BUILD_TYPE=Debug -DVC_SANITIZE=address,undefined \
  -DVC_BUILD_BENCH=OFF -DCMAKE_CXX_FLAGS=-O1 -DVC_MODELS_DIR="$VC_MODELS_DIR"
echo "== unit tests under ASan+UBSan =="
(cd "$REPO_ROOT/build-asan" && \
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest -j "$JOBS" -L unit --output-on-failure --timeout 900)
echo "== all test stages passed =="
