#!/usr/bin/env bash
# The test suite in two tiers (docs/testing.md).
#
#   deploy/scripts/test.sh          per-commit tier (what CI runs, .ci/run):
#     1. build-test/  RelWithDebInfo (-O3, line tables only), -Werror,
#                     everything except the unit tests not labelled
#                     "numerics" (stage 2 runs every unit test); ctest over
#                     what was built, except label "long"; then
#                     lint: private internal/ headers, clang-format over the
#                     tree, clang-tidy over the files changed since
#                     deploy/lint/'s baseline
#     2. build-fuzz/  clang ASan+UBSan (+ libFuzzer coverage hooks): the
#                     unit tests' targets and every fuzz target, one build;
#                     ctest label "unit" under ASan+UBSan
#     3. build-tsan/  clang TSan, the concurrency-heavy unit tests (compiled
#                     at nice 19 while stage 2's tests run)
#     4. every fuzz target (build-fuzz/) for VC_FUZZ_SECONDS (default 6)
#                     over its seed corpus
#   deploy/scripts/test.sh --long   the long tier (builds what it needs):
#     ctest label "long" in build-test/, clang-tidy over every file, every
#     fuzz target for VC_FUZZ_LONG_SECONDS (default 300), then every executable
#     deploy/scripts/long.d/*.sh in name order (stress, crash loops, chaos,
#     soak: each is handed REPO_ROOT, VC_BUILD_DIR and VC_MODELS_DIR in the
#     environment and must stop by itself; a non-zero exit fails the tier).
#
# Each stage prints its wall time; the last line sums them up.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

tier=commit
case "${1:-}" in
  "") ;;
  --long) tier=long ;;
  -h|--help) sed -n '2,26p' "${BASH_SOURCE[0]}"; exit 0 ;;
  *) echo "test.sh: unknown argument '$1' (use --long or nothing)" >&2; exit 2 ;;
esac
# Debug info: line tables only (-g1). Sanitizer reports and backtraces need
# no more, and full -g costs ~35% of the compile time of a gRPC-heavy file and
# 5x its object size (slower links). The code generated is the same.
# The compiler-independent unit tests run in build-fuzz/ (ASan+UBSan) only;
# build-test/ compiles the numerics ones (tests/CMakeLists.txt, VC_UNIT_TESTS).
# The tests' own code is compiled at -O0 (tests/CMakeLists.txt,
# VC_TEST_CXX_OPTIONS): gcc compiles a test file about a fifth faster than at
# -O1, and in this build no test does its own heavy work (the numerics unit
# tests, 173 of them, take 7 s; the integration tests wait on daemons).
REL_FLAGS=(-DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG"
           -DVC_UNIT_TESTS=NUMERICS -DVC_TEST_CXX_OPTIONS=-O0)
DEBUG_G1="-DCMAKE_CXX_FLAGS_DEBUG=-g1"
# ctest's parallelism. The build-test/ stage runs one test more than there
# are cores: its cluster tests mostly wait on daemons and sockets (at -j2 they
# kept ~1.3 of 2 cores busy). The ASan+UBSan unit tests are CPU-bound and run
# one per core. CTEST_JOBS overrides both.
CTEST_JOBS_INTEGRATION="${CTEST_JOBS:-$((JOBS + 1))}"
CTEST_JOBS="${CTEST_JOBS:-$JOBS}"

declare -a STAGE_TIMES=()
STAGE_NAME=""
stage_start=0
stage() {  # stage NAME: ends the previous stage's clock, starts this one's
  stage_end
  STAGE_NAME="$1"
  stage_start=$SECONDS
  echo "== $1 =="
}
stage_end() {
  if [[ -n "$STAGE_NAME" ]]; then
    STAGE_TIMES+=("$(printf '%-52s %5d s' "$STAGE_NAME" $((SECONDS - stage_start)))")
    STAGE_NAME=""
  fi
}
summary() {
  stage_end
  echo "== stage times ($tier tier) =="
  printf '  %s\n' "${STAGE_TIMES[@]}"
  echo "  total: $SECONDS s"
}

# Builds that overlap a test stage run in the background at nice 19, each in
# its own process group (so a failing run takes it down too), with its output
# in a log that is printed if it fails.
declare -A BG_PID=()
BG_LOGS="$(mktemp -d)"
bg_cleanup() {
  local pid
  for pid in "${BG_PID[@]}"; do kill -- -"$pid" 2>/dev/null || true; done
  rm -rf "$BG_LOGS"
}
trap bg_cleanup EXIT
background() {  # background NAME CMD...: starts CMD
  local name="$1"; shift
  setsid nice -n 19 "$@" >"$BG_LOGS/$name.log" 2>&1 &
  BG_PID[$name]=$!
}
await() {  # await NAME: waits for it; if it failed, prints its log and stops
  if ! wait "${BG_PID[$1]}"; then
    cat "$BG_LOGS/$1.log" >&2
    echo "test: the background $1 step failed (output above)" >&2
    exit 1
  fi
  unset "BG_PID[$1]"
  tail -n 2 "$BG_LOGS/$1.log"
}

# ctest with TMPDIR (which gtest's TempDir() and the daemons'
# temp_directory_path() follow) a fresh directory that must be empty once
# the tests have passed: ctest runs every test case in its own process, so a
# scratch file a test forgets piles up in /tmp, run after run
# (tests/scratch_dir.h). A failing run stops before the check and keeps the
# directory, whose logs the failing test names.
ctest_in_fresh_tmpdir() {  # ctest_in_fresh_tmpdir BUILD_DIR CTEST_ARGS...
  local dir="$1" tmp left
  shift
  tmp="$(mktemp -d)"
  (cd "$dir" && TMPDIR="$tmp" ctest "$@")
  left="$(ls -A "$tmp")"
  if [[ -n "$left" ]]; then
    echo "test: the tests passed but left these in their TMPDIR ($tmp):" >&2
    echo "$left" >&2
    exit 1
  fi
  rmdir "$tmp"
}

bash "$REPO_ROOT/deploy/scripts/install_deps.sh"
if [[ ! -f "$VC_MODELS_DIR/stories260K.bin" ]]; then
  echo "test: test models not found in $VC_MODELS_DIR (set VC_MODELS_DIR); model tests will skip" >&2
fi

if [[ "$tier" == long ]]; then
  stage "build (build-test/, RelWithDebInfo, -Werror)"
  configure_and_build build-test "${REL_FLAGS[@]}" -DVC_MODELS_DIR="$VC_MODELS_DIR"
  # A failing piece fails the tier, but the others still run.
  failed=()
  stage "long tests (ctest -L long)"
  if (cd "$REPO_ROOT/build-test" && ctest -N -L long | grep -q 'Total Tests: [1-9]'); then
    (cd "$REPO_ROOT/build-test" && ctest -j "$CTEST_JOBS" -L long --output-on-failure --timeout 7200) ||
      failed+=("ctest -L long")
  else
    echo "no tests labelled long"
  fi
  stage "clang-tidy (every file, against deploy/lint/)"
  python3 "$REPO_ROOT/deploy/scripts/lint.py" tidy --all --build-dir "$REPO_ROOT/build-test" --jobs "$JOBS" ||
    failed+=("clang-tidy")
  stage "fuzzing (every target, ${VC_FUZZ_LONG_SECONDS:-300} s each)"
  bash "$REPO_ROOT/deploy/scripts/fuzz.sh" --seconds "${VC_FUZZ_LONG_SECONDS:-300}" ||
    failed+=("fuzzing")
  shopt -s nullglob
  for script in "$REPO_ROOT"/deploy/scripts/long.d/*.sh; do
    if [[ ! -x "$script" ]]; then
      echo "long.d: skipping $(basename "$script") (not executable)"
      continue
    fi
    stage "long.d/$(basename "$script")"
    REPO_ROOT="$REPO_ROOT" VC_BUILD_DIR="$REPO_ROOT/build-test" VC_MODELS_DIR="$VC_MODELS_DIR" \
      bash "$script" || failed+=("$(basename "$script")")
  done
  summary
  if ((${#failed[@]})); then
    echo "== long tier FAILED: ${failed[*]} ==" >&2
    exit 1
  fi
  echo "== long tier passed =="
  exit 0
fi

stage "build (build-test/, RelWithDebInfo, -Werror)"
configure_and_build build-test "${REL_FLAGS[@]}" -DVC_MODELS_DIR="$VC_MODELS_DIR"
stage "lint (internal/ includes; clang-format; clang-tidy on files changed since deploy/lint/)"
python3 "$REPO_ROOT/deploy/scripts/lint.py" internal-includes
python3 "$REPO_ROOT/deploy/scripts/lint.py" format
python3 "$REPO_ROOT/deploy/scripts/lint.py" tidy --build-dir "$REPO_ROOT/build-test" --jobs "$JOBS"

# Only the unit tests run under ASan+UBSan, so only their targets are built:
# no daemons, CLI or integration tests, no benches, and no CUDA (nvcc code
# is not sanitised, and the CUDA tests skip without a GPU; build-test/
# compiles the CUDA backend). They share build-fuzz/ with the fuzz targets:
# one set of sanitised libraries, compiled by clang (about 2.4x faster than
# gcc at -fsanitize=address,undefined on this code; fuzz.sh says more).
#
# (Compiling it at nice 19 beside build-test/'s ctest, which keeps only ~1.3
# of the 2 cores busy, slowed that ctest by about as much as it saved:
# docs/testing.md.)
stage "tests (all but label long)"
ctest_in_fresh_tmpdir "$REPO_ROOT/build-test" -j "$CTEST_JOBS_INTEGRATION" -LE long --no-tests=error \
  --output-on-failure --timeout 900

stage "build (build-fuzz/, clang ASan+UBSan: unit tests and fuzz targets)"
bash "$REPO_ROOT/deploy/scripts/fuzz.sh" --build-only --build-also vc_unit_tests

# ThreadSanitizer for the concurrency-heavy units: the thread pool, the
# executor and coroutines (task_test), the copy engine and the long-context
# runtime that drives it, the data plane (TCP and UCX servers and clients,
# fetches and stages, the link pacer) and the coordinator's slot clock (its
# notifications), its request runners (coroutines resumed on the executor by
# the clock's and the lease's callbacks, over fake workers), its admission
# queue (threads waiting in Admit, turns handed over on other threads), its
# worker health tracker (probe thread) and its release-retry queue (retry
# thread). Their build runs in the background
# while the ASan+UBSan tests keep the cores busy: it gets the CPU of the
# stage's tail, where the last long tests run one at a time.
TSAN_TESTS=(thread_pool_test task_test copy_engine_test long_context_runtime_test
            link_pacer_test data_plane_test data_plane_stage_test slot_clock_test
            request_runner_test admission_test worker_health_test release_retry_test)
build_tsan() {
  cmake -S "$REPO_ROOT" -B "$REPO_ROOT/build-tsan" -G Ninja -DVC_WERROR=ON -DCMAKE_BUILD_TYPE=Debug "$DEBUG_G1" \
    -DCMAKE_CXX_COMPILER="${CXX_FUZZ:-clang++-14}" -DCMAKE_CXX_FLAGS=-O1 -DVC_SANITIZE=thread -DVC_BUILD_BENCH=OFF -DVC_CUDA=OFF \
    -DVC_MODELS_DIR="$VC_MODELS_DIR" >/dev/null
  ninja -C "$REPO_ROOT/build-tsan" -j "$JOBS" "$@"
}
export REPO_ROOT JOBS DEBUG_G1 VC_MODELS_DIR
background build-tsan bash -c "set -euo pipefail; $(declare -f build_tsan); build_tsan \"\$@\"" build_tsan "${TSAN_TESTS[@]}"

stage "unit tests under ASan+UBSan (build-tsan/ compiles beside them at nice 19)"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest_in_fresh_tmpdir "$REPO_ROOT/build-fuzz" -j "$CTEST_JOBS" -L unit -LE long --no-tests=error \
  --output-on-failure --timeout 900

stage "build (build-tsan/, TSan: ${#TSAN_TESTS[@]} tests; the rest)"
await build-tsan
stage "concurrency tests under TSan"
# UCX_MEM_EVENTS=no: UCX's memory hooks (libucm) crash TSan-instrumented
# threads at start; the data plane does not need them (no registered memory).
for t in "${TSAN_TESTS[@]}"; do
  UCX_MEM_EVENTS=no TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
    "$REPO_ROOT/build-tsan/bin/$t" --gtest_brief=1
done

stage "fuzzing (build-fuzz/, every target ${VC_FUZZ_SECONDS:-6} s)"
bash "$REPO_ROOT/deploy/scripts/fuzz.sh" --no-build --seconds "${VC_FUZZ_SECONDS:-6}"
summary
echo "== all test stages passed =="
