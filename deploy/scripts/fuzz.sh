#!/usr/bin/env bash
# Builds the libFuzzer targets (build-fuzz/: clang++-14, -fsanitize=fuzzer,
# address,undefined; the same build dir holds the unit tests that
# deploy/scripts/test.sh runs under ASan+UBSan, so the sanitised libraries are
# compiled once for both) and runs each one for a bounded time over its seed
# corpus (tests/fuzz/corpus/<target>/, read only: new inputs go to a scratch
# dir). Any crash, sanitizer report, leak, timeout or broken invariant fails
# the run; the input that did it is kept under $VC_FUZZ_ARTIFACTS (default
# build-fuzz/artifacts/) to reproduce with `build-fuzz/bin/<target> FILE`.
# Prints a table: target, seconds, executions, corpus growth, result.
#
#   deploy/scripts/fuzz.sh [--seconds N] [--jobs J] [--no-build|--build-only]
#                          [--build-also T]... [TARGET...]
#     --seconds N     time per target (default 10; the long tier uses 300)
#     --jobs J        targets run side by side (default $JOBS or nproc)
#     --no-build      use build-fuzz/ as it is
#     --build-only    configure and build build-fuzz/, run nothing
#     --build-also T  also build ninja target T in build-fuzz/ (test.sh: vc_unit_tests)
#     TARGET...       a subset (default: every target, build-fuzz/fuzz_targets.txt)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

seconds=10
jobs="$JOBS"
build=1
run=1
targets=()
also=()
while (($#)); do
  case "$1" in
    --seconds) seconds="$2"; shift 2 ;;
    --jobs) jobs="$2"; shift 2 ;;
    --no-build) build=0; shift ;;
    --build-only) run=0; shift ;;
    --build-also) also+=("$2"); shift 2 ;;
    -h|--help) sed -n '2,19p' "${BASH_SOURCE[0]}"; exit 0 ;;
    -*) echo "fuzz.sh: unknown option $1" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done

BUILD="$REPO_ROOT/build-fuzz"
CXX_FUZZ="${CXX_FUZZ:-clang++-14}"
if ((build)); then
  command -v "$CXX_FUZZ" >/dev/null ||
    { echo "fuzz.sh: $CXX_FUZZ not found (apt-get install clang-14 libclang-rt-14-dev)" >&2; exit 1; }
  # -O1 with line tables: quick to build, still readable sanitizer stacks;
  # assertions stay on (no NDEBUG). No CUDA or benches. Tests are configured
  # (not built unless asked for with --build-also): clang compiles sanitised
  # code ~2.4x faster than gcc here, so test.sh's ASan+UBSan unit tests are
  # built in this dir too, over the same sanitised libraries (only the fuzz
  # targets and the libraries they fuzz get libFuzzer's coverage hooks,
  # -fsanitize=fuzzer-no-link: tests/fuzz/CMakeLists.txt). The tests' own
  # code is compiled at -O0 (VC_TEST_CXX_OPTIONS): clang with ASan+UBSan
  # compiles a gtest file about 2.2x faster than at -O1, and the few tests
  # whose own code is hot keep the libraries' -O1 (vc_test_code_is_hot,
  # tests/CMakeLists.txt; docs/testing.md has the measurements).
  cmake -S "$REPO_ROOT" -B "$BUILD" -G Ninja -DVC_WERROR=ON -DVC_FUZZ=ON \
    -DCMAKE_CXX_COMPILER="$CXX_FUZZ" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -gline-tables-only" \
    -DVC_CUDA=OFF -DVC_BUILD_TESTS=ON -DVC_BUILD_BENCH=OFF -DVC_TEST_CXX_OPTIONS=-O0 \
    -DVC_MODELS_DIR="$VC_MODELS_DIR" >/dev/null
  ninja -C "$BUILD" -j "$JOBS" vc_fuzzers "${also[@]}"
fi
((run)) || exit 0
[[ "$seconds" =~ ^[1-9][0-9]*$ ]] || { echo "fuzz.sh: --seconds needs a positive integer" >&2; exit 2; }
if ((${#targets[@]} == 0)); then
  mapfile -t targets < "$BUILD/fuzz_targets.txt"
fi

ARTIFACTS="${VC_FUZZ_ARTIFACTS:-$BUILD/artifacts}"
WORK="$(mktemp -d /tmp/vc-fuzz-run.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$ARTIFACTS"

# run_one TARGET: one bounded run; its log and a one-line summary in $WORK.
run_one() {
  local t="$1" seeds="$REPO_ROOT/tests/fuzz/corpus/$1"
  local corpus="$WORK/$t.corpus" log="$WORK/$t.log"
  mkdir -p "$corpus"
  [[ -d "$seeds" ]] || { echo "$t: no seed corpus at $seeds" > "$log"; echo "$t 0 0 0 0 no-seeds" > "$WORK/$t.sum"; return; }
  local rc=0
  # -timeout: one input running 10 s is a hang; -rss_limit_mb: a leak or a
  # runaway allocation; -max_len covers the largest seeds (a few KB; the
  # Unigram tokenizer.json with its Precompiled charsmap, ~47 KB).
  ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:symbolize=1" \
  UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1" \
    "$BUILD/bin/$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2560 \
      -max_len=65536 -print_final_stats=1 -artifact_prefix="$ARTIFACTS/$t-" \
      "$corpus" "$seeds" > "$log" 2>&1 || rc=$?
  local execs seeds_n new_n
  execs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)"
  seeds_n="$(find "$seeds" -type f | wc -l)"
  new_n="$(find "$corpus" -type f | wc -l)"
  echo "$t $seconds ${execs:-0} $seeds_n $new_n $([[ $rc == 0 ]] && echo ok || echo "FAILED(rc=$rc)")" > "$WORK/$t.sum"
}
export -f run_one
export BUILD REPO_ROOT ARTIFACTS WORK seconds

start=$SECONDS
printf '%s\n' "${targets[@]}" | xargs -P "$jobs" -I{} bash -c 'run_one "$@"' _ {}

failed=0
printf '%-28s %8s %12s %7s %9s  %s\n' target seconds executions seeds new-units result
for t in "${targets[@]}"; do
  read -r name secs execs seeds_n new_n result < "$WORK/$t.sum"
  printf '%-28s %8s %12s %7s %9s  %s\n' "$name" "$secs" "$execs" "$seeds_n" "$new_n" "$result"
  if [[ "$result" != ok ]]; then
    failed=1
    echo "---- $t: last lines of its log (artifacts in $ARTIFACTS) ----"
    tail -40 "$WORK/$t.log"
  fi
done
echo "fuzz: ${#targets[@]} targets in $((SECONDS - start)) s"
exit "$failed"
