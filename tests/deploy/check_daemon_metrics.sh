#!/usr/bin/env bash
# `promtool check metrics` on what each daemon serves at /metrics: the
# exposition parses and follows Prometheus' naming and help-text rules.
# Starts vc-kvstore, then whichever of the other daemons are given, wired to
# each other on loopback (workers load stories260K from VC_MODELS_DIR).
# usage: check_daemon_metrics.sh VC_KVSTORE_BINARY [--verifier BIN] [--drafter BIN] [--coordinator BIN]
# Exit 0 pass, 1 fail, 77 skipped (promtool not installed).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
kvstore_bin="${1:?usage: check_daemon_metrics.sh VC_KVSTORE_BINARY [--verifier BIN] [--drafter BIN] [--coordinator BIN]}"
shift
declare -A bins=()
while (($#)); do
  case "$1" in
    --verifier|--drafter|--coordinator) bins["${1#--}"]="$2"; shift 2 ;;
    *) die "unknown argument $1" ;;
  esac
done
command -v promtool >/dev/null || skip "promtool not found (Debian package prometheus; deploy/scripts/install_deps.sh)"
command -v curl >/dev/null || die "curl not found"

checked=()
check_metrics() {  # NAME HOST:PORT
  local name="$1" body="$VC_TMP/$1.metrics" out
  curl -fsS --max-time 5 "http://$2/metrics" -o "$body" || die "GET http://$2/metrics ($name) failed"
  grep -q '^vericache_build_info{' "$body" || die "$name: no vericache_build_info in /metrics"
  if ! out="$(promtool check metrics <"$body" 2>&1)"; then
    echo "$out" >&2
    die "promtool check metrics found problems in $name's /metrics"
  fi
  [[ -z "$out" ]] || echo "$out"
  checked+=("$name ($(grep -c '^# TYPE' "$body") families)")
}

start_kvstore "$kvstore_bin"
check_metrics vc-kvstore "$KVSTORE_METRICS"

model="${VC_MODELS_DIR:-$(dirname "${BASH_SOURCE[0]}")/../../../shared/models}/stories260K.bin"
declare -A addr=()
for role in verifier drafter; do
  [[ -n "${bins[$role]:-}" ]] || continue
  [[ -f "$model" ]] || { echo "note: $model not found; vc-$role not checked" >&2; continue; }
  start_daemon "vc-$role" "${bins[$role]}" --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 \
    --model "$model" --kvstore "$KVSTORE_ADDR" --threads 1
  addr[$role]="$DAEMON_ADDR"
  check_metrics "vc-$role" "$DAEMON_METRICS"
done
if [[ -n "${bins[coordinator]:-}" ]]; then
  if [[ -n "${addr[verifier]:-}" && -n "${addr[drafter]:-}" ]]; then
    start_daemon vc-coordinator "${bins[coordinator]}" --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 \
      --kvstore "$KVSTORE_ADDR" --verifiers "${addr[verifier]}" --drafters "${addr[drafter]}"
    check_metrics vc-coordinator "$DAEMON_METRICS"
  else
    echo "note: vc-coordinator not checked (needs a running verifier and drafter)" >&2
  fi
fi
echo "check_daemon_metrics: promtool check metrics passes for: ${checked[*]}"
