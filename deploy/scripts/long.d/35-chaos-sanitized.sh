#!/usr/bin/env bash
# Long tier: `vericache chaos` against daemons built with ASan+UBSan (clang,
# build-fuzz/, the same build as the sanitised unit tests) for 5 minutes
# (VC_CHAOS_SANITIZED_SECONDS), so that a memory error or undefined
# behaviour on a failure path (a worker killed mid-round, a paused store, a
# cancelled lease) is reported where it happens instead of passing unseen
# when the request still comes out right. The tool fails the run on any
# sanitizer report in a daemon's log (`crashes=N` in its summary), besides
# its usual checks. Leak checking is off: daemons that are killed -9 or
# stopped at the end of the run are not expected to free everything. As
# root with ip and tc, link cuts and throttles join the faults, as in
# 30-chaos.sh (VC_CHAOS_LINK_FAULTS=0 turns them off): a data-plane transfer
# torn or stalled mid-chunk is a failure path of its own.
set -euo pipefail
: "${REPO_ROOT:?}" "${VC_MODELS_DIR:?}"
seed="${VC_CHAOS_SANITIZED_SEED:-3434}"
seconds="${VC_CHAOS_SANITIZED_SECONDS:-300}"
targets=(vericache vc-kvstore vc-verifier vc-drafter vc-coordinator)
also=()
for t in "${targets[@]}"; do also+=(--build-also "$t"); done
bash "$REPO_ROOT/deploy/scripts/fuzz.sh" --build-only "${also[@]}"
bin="$REPO_ROOT/build-fuzz/bin"
# shellcheck source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/link_faults.bash"
mapfile -t link < <(link_fault_flags 35-chaos-sanitized)
export ASAN_OPTIONS="detect_leaks=0:${ASAN_OPTIONS:-}"
export UBSAN_OPTIONS="print_stacktrace=1:${UBSAN_OPTIONS:-}"
exec "$bin/vericache" chaos --bin-dir "$bin" --seed "$seed" --duration "$seconds" \
  --faults 1000 --requests 1000000 --min-faults "${VC_CHAOS_SANITIZED_MIN_FAULTS:-20}" \
  --min-requests "${VC_CHAOS_SANITIZED_MIN_REQUESTS:-500}" "${link[@]}"
