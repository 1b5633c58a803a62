#!/usr/bin/env bash
# Long tier: `vericache soak` for 30 minutes (VC_SOAK_SECONDS) at 8
# requests/s with 10,000 random cancels, then 200 serial cancel-to-freed
# probes. Prints RSS slopes per daemon, p50/p99 TTFT and tokens/s per
# minute; fails on a wrong token, a leak after the run, or a daemon other
# than the store growing faster than 1 MiB per 10 minutes after warm-up.
set -euo pipefail
: "${VC_BUILD_DIR:?}"
seconds="${VC_SOAK_SECONDS:-1800}"
exec "$VC_BUILD_DIR/bin/vericache" soak --seed "${VC_SOAK_SEED:-1313}" --duration "$seconds" \
  --rate 8 --window 60 --warmup 300 --rss-interval 5 --cancels 10000 --cancel-probes 200 \
  --max-rss-slope 1
