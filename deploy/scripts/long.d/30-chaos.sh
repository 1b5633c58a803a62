#!/usr/bin/env bash
# Long tier: `vericache chaos` for 10 minutes (VC_CHAOS_SECONDS) against a
# local cluster of 2 verifiers and 2 drafters: kill -9 / restart of
# drafters, verifiers and the store and SIGSTOP pauses, from a fixed seed
# (VC_CHAOS_SEED) so a failure replays; as root with ip and tc (the long
# tier runs as root), also link cuts and throttles (--link-faults: the
# cluster runs in a network namespace of the tool's own; VC_CHAOS_LINK_FAULTS=0
# turns them off). Fails on any wrong token, unclean failure or leak, and
# unless at least 100 faults and 2,000 requests ran (VC_CHAOS_MIN_FAULTS,
# VC_CHAOS_MIN_REQUESTS: lower them with VC_CHAOS_SECONDS to try the script
# in a minute, e.g. 30 s, 3 faults, 200 requests).
set -euo pipefail
: "${VC_BUILD_DIR:?}"
seed="${VC_CHAOS_SEED:-424242}"
seconds="${VC_CHAOS_SECONDS:-600}"
# shellcheck source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/link_faults.bash"
mapfile -t link < <(link_fault_flags 30-chaos)
exec "$VC_BUILD_DIR/bin/vericache" chaos --seed "$seed" --duration "$seconds" \
  --faults 1000 --requests 1000000 --min-faults "${VC_CHAOS_MIN_FAULTS:-100}" \
  --min-requests "${VC_CHAOS_MIN_REQUESTS:-2000}" "${link[@]}"
