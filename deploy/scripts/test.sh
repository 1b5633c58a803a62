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

# ThreadSanitizer for the concurrency-heavy units: the thread pool, the copy
# engine and the long-context runtime that drives it, the data plane (TCP and
# UCX servers and clients, fetches and stages, the link pacer) and the
# coordinator's slot clock.
TSAN_TESTS=(thread_pool_test copy_engine_test long_context_runtime_test
            link_pacer_test data_plane_test data_plane_stage_test slot_clock_test)
echo "== build (build-tsan/, TSan: ${TSAN_TESTS[*]}) =="
cmake -S "$REPO_ROOT" -B "$REPO_ROOT/build-tsan" -G Ninja -DVC_WERROR=ON -DCMAKE_BUILD_TYPE=Debug \
  -DCMAKE_CXX_FLAGS=-O1 -DVC_SANITIZE=thread -DVC_BUILD_BENCH=OFF -DVC_CUDA=OFF \
  -DVC_MODELS_DIR="$VC_MODELS_DIR" >/dev/null
ninja -C "$REPO_ROOT/build-tsan" -j "$JOBS" "${TSAN_TESTS[@]}"
echo "== concurrency tests under TSan =="
# UCX_MEM_EVENTS=no: UCX's memory hooks (libucm) crash TSan-instrumented
# threads at start; the data plane does not need them (no registered memory).
for t in "${TSAN_TESTS[@]}"; do
  UCX_MEM_EVENTS=no TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
    "$REPO_ROOT/build-tsan/bin/$t" --gtest_brief=1
done
echo "== all test stages passed =="
