#!/usr/bin/env bash
# A real Prometheus server scraping real VeriCache daemons, through the
# project's own scrape configuration (deploy/prometheus/prometheus.yml with
# its file-based targets) and alert rules (deploy/prometheus/alerts.yml).
#
#   prometheus_integration_test.sh VERICACHE_BINARY
#     Starts a whole cluster with `vericache local --endpoints-file F` (plus
#     --metrics if the launcher has it; otherwise metrics are on by default),
#     writes the scrape targets from F (keys coordinator_metrics,
#     kvstore_metrics, verifier[-N]_metrics, drafter[-N]_metrics: "HOST:PORT";
#     coordinator: the gRPC address), starts Prometheus, sends a
#     few `vericache client generate` requests and waits until Prometheus'
#     HTTP API shows vericache_requests_total and
#     vericache_accepted_tokens_per_round_count go up.
#   prometheus_integration_test.sh --kvstore-only VC_KVSTORE_BINARY
#     The Prometheus half alone: scrapes one vc-kvstore and waits for
#     vericache_build_info, checks that every alert rule loaded.
#
# Exit 0 pass, 1 fail, 77 skipped (prometheus/promtool not installed).
# Everything it starts is stopped on exit; VC_KEEP_TMP=1 keeps the scratch dir.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
source "$here/lib.sh"

usage() { echo "usage: $0 VERICACHE_BINARY | --kvstore-only VC_KVSTORE_BINARY" >&2; exit 2; }
mode=cluster
if [[ "${1:-}" == "--kvstore-only" ]]; then mode=kvstore; shift; fi
bin="${1:-}"
[[ -n "$bin" && $# -eq 1 ]] || usage
[[ -x "$bin" ]] || die "$bin is not an executable"

command -v prometheus >/dev/null || skip "prometheus not found (Debian package prometheus; deploy/scripts/install_deps.sh)"
command -v promtool >/dev/null || skip "promtool not found (Debian package prometheus)"
command -v curl >/dev/null || die "curl not found"
command -v jq >/dev/null || die "jq not found"

WAIT_S="${VC_PROM_WAIT_S:-60}"
prom_dir="$VC_TMP/prometheus"
mkdir -p "$prom_dir/targets" "$prom_dir/data"

show_logs() {
  local f
  for f in "$VC_TMP"/*.log "$VC_TMP"/*.err; do
    [[ -s "$f" ]] || continue
    echo "---- last lines of $(basename "$f") ----" >&2
    tail -n 25 "$f" >&2
  done
}
fail() { show_logs; die "$*"; }

# write_targets NAME ADDR...: targets/NAME.json in file_sd format (pool label
# for workers, as prometheus-kubernetes.yml would set it).
write_targets() {
  local name="$1"; shift
  local labels='{}'
  [[ "$name" == verifier || "$name" == drafter ]] && labels='{"pool": "local"}'
  printf '%s\n' "$@" | jq -R . | jq -s --argjson labels "$labels" '[{targets: ., labels: $labels}]' \
    >"$prom_dir/targets/$name.json"
}

# The project's configuration, with a 1 s scrape and evaluation interval.
sed -E 's/^(  (scrape_interval|evaluation_interval)): .*/\1: 1s/; s/^(  scrape_timeout): .*/\1: 1s/' \
  "$repo/deploy/prometheus/prometheus.yml" >"$prom_dir/prometheus.yml"
cp "$repo/deploy/prometheus/alerts.yml" "$prom_dir/alerts.yml"
grep -q 'scrape_interval: 1s' "$prom_dir/prometheus.yml" || die "could not set the scrape interval"

prom_url=""
start_prometheus() {
  promtool check config "$prom_dir/prometheus.yml" >"$VC_TMP/promtool.log" 2>&1 ||
    fail "promtool rejects the generated configuration: $(cat "$VC_TMP/promtool.log")"
  local attempt port pid
  for attempt in 1 2 3; do
    port="$(free_port)"
    prometheus --config.file="$prom_dir/prometheus.yml" --storage.tsdb.path="$prom_dir/data" \
      --web.listen-address="127.0.0.1:$port" --log.level=warn >"$VC_TMP/prometheus.log" 2>&1 &
    pid=$!
    track_pid "$pid"
    prom_url="http://127.0.0.1:$port"
    local deadline=$((SECONDS + 30))
    while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do
      if curl -fsS --max-time 2 "$prom_url/-/ready" >/dev/null 2>&1; then return 0; fi
      sleep 0.2
    done
    kill -0 "$pid" 2>/dev/null && fail "prometheus did not become ready in 30 s"
    grep -q "address already in use" "$VC_TMP/prometheus.log" || fail "prometheus exited"
    echo "port $port was taken, retrying ($attempt)" >&2
  done
  fail "prometheus could not bind a port"
}

# query EXPR: prints the value of the first sample of an instant query, or
# nothing when the result is empty.
query() {
  curl -fsS --max-time 5 --get --data-urlencode "query=$1" "$prom_url/api/v1/query" |
    jq -r 'if .status == "success" then (.data.result[0].value[1] // empty) else error(.error) end'
}
# wait_query SECONDS DESCRIPTION EXPR: until EXPR returns a sample.
wait_query() {
  local limit="$1" what="$2" expr="$3"
  local deadline=$((SECONDS + limit)) v
  while ((SECONDS < deadline)); do
    v="$(query "$expr" 2>/dev/null || true)"
    if [[ -n "$v" ]]; then echo "  $what: $v"; return 0; fi
    sleep 0.5
  done
  echo "targets: $(curl -fsS --max-time 5 "$prom_url/api/v1/targets" |
    jq -c '[.data.activeTargets[] | {job: .labels.job, url: .scrapeUrl, health, lastError}]')" >&2
  fail "Prometheus never showed $what within ${limit}s (query: $expr)"
}

check_rules_loaded() {
  local want got
  want="$(grep -c '^ *- alert:' "$prom_dir/alerts.yml")"
  got="$(curl -fsS --max-time 5 "$prom_url/api/v1/rules" | jq '[.data.groups[].rules[]] | length')"
  [[ "$got" == "$want" ]] || fail "Prometheus loaded $got alert rules, alerts.yml has $want"
  echo "  alert rules loaded: $got"
}

# ---- the Prometheus half alone: one vc-kvstore --------------------------------------
if [[ "$mode" == kvstore ]]; then
  start_kvstore "$bin"
  write_targets kvstore "$KVSTORE_METRICS"
  start_prometheus
  echo "prometheus at $prom_url scraping vc-kvstore metrics at $KVSTORE_METRICS"
  wait_query "$WAIT_S" "vc-kvstore up" 'up{job="vericache-kvstore"} == 1'
  wait_query "$WAIT_S" "vericache_build_info" 'vericache_build_info{job="vericache-kvstore"} == 1'
  wait_query "$WAIT_S" "kvstore entries gauge" 'vericache_kvstore_entries{job="vericache-kvstore",tier="disk"}'
  check_rules_loaded
  echo "prometheus_integration_test (kvstore only): PASS"
  exit 0
fi

# ---- the whole cluster: vericache local ------------------------------------------------------
if ! local_help="$("$bin" local --help 2>&1)"; then
  die "'$(basename "$bin") local' is not available in this build ($local_help); this test needs the" \
    "all-in-one launcher with --endpoints-file and --metrics"
fi
grep -q -- '--endpoints-file' <<<"$local_help" ||
  die "'vericache local' has no --endpoints-file flag; this test needs it"
has_flag() { grep -qE "^[[:space:]]+$1([[:space:]]|\$)" <<<"$local_help"; }
local_args=(--endpoints-file "$VC_TMP/endpoints.json")
if has_flag --metrics; then
  local_args+=(--metrics)
elif ! has_flag --no-metrics; then
  die "'vericache local' has neither --metrics nor --no-metrics; cannot tell whether it serves /metrics"
fi  # with --no-metrics, metrics are on by default
models_dir="${VC_MODELS_DIR:-$repo/../shared/models}"
if has_flag --model && [[ -f "$models_dir/stories260K.bin" ]]; then
  local_args+=(--model "$models_dir/stories260K.bin")
fi
# One compute thread per worker: CI has two cores for four daemons.
has_flag --worker-threads && local_args+=(--worker-threads 1)
# Each daemon's stderr lands in the scratch dir, shown on failure.
has_flag --log-dir && local_args+=(--log-dir "$VC_TMP")
# Extra launcher flags, e.g. VC_LOCAL_ARGS="--verifiers 2".
read -r -a extra <<<"${VC_LOCAL_ARGS:-}"
local_args+=("${extra[@]}")

echo "starting: $bin local ${local_args[*]}"
# Its own session, so cleanup can also reach the daemons it started.
setsid "$bin" local "${local_args[@]}" >"$VC_TMP/local.log" 2>"$VC_TMP/local.err" &
local_pid=$!
track_pid "$local_pid"
stop_local_group() { kill -TERM -- "-$local_pid" 2>/dev/null || true; }
trap 'stop_local_group; cleanup' EXIT

endpoints_ready() {
  jq -e 'has("coordinator_metrics")' "$VC_TMP/endpoints.json" >/dev/null 2>&1
}
deadline=$((SECONDS + 120))
until endpoints_ready; do
  kill -0 "$local_pid" 2>/dev/null || fail "'vericache local' exited before writing its endpoints file"
  ((SECONDS < deadline)) || fail "'vericache local' wrote no endpoints file with coordinator_metrics in 120 s"
  sleep 0.5
done
echo "endpoints: $(jq -c . "$VC_TMP/endpoints.json")"

# Metrics addresses of one daemon kind: keys KIND_metrics, KIND-N_metrics
# (several workers); values "HOST:PORT", "http://HOST:PORT/metrics" or lists.
addresses() {
  jq -r --arg k "$1" 'to_entries[] | select(.key | test("^" + $k + "(-[0-9]+)?_metrics$")) | .value
    | if type == "array" then .[] else . end' "$VC_TMP/endpoints.json" | sed -E 's|^[a-z]+://||; s|/.*$||'
}
ntargets=0
for kind in coordinator kvstore verifier drafter; do
  mapfile -t addrs < <(addresses "$kind")
  ((${#addrs[@]})) || fail "the endpoints file has no ${kind}_metrics"
  write_targets "$kind" "${addrs[@]}"
  ntargets=$((ntargets + ${#addrs[@]}))
done
coordinator="$(jq -r '.coordinator // .coordinator_grpc // .coordinator_address // empty' "$VC_TMP/endpoints.json")"
coordinator="${coordinator#*://}"
[[ -n "$coordinator" ]] || fail "the endpoints file has no coordinator (gRPC) address"

start_prometheus
echo "prometheus at $prom_url, $ntargets targets"
wait_query "$WAIT_S" "all $ntargets targets up" "count(up{job=~\"vericache-.*\"} == 1) == $ntargets"
check_rules_loaded

sum_of() { local v; v="$(query "sum($1)")"; echo "${v:-0}"; }
requests_before="$(sum_of vericache_requests_total)"
rounds_before="$(sum_of vericache_accepted_tokens_per_round_count)"
echo "  before: requests $requests_before, verify rounds $rounds_before"

# A secure cluster (the default) wants its CA and an API key: the endpoints
# file carries both, and the client reads them from it.
client_access=(--coordinator "$coordinator")
if jq -e 'has("api_keys")' "$VC_TMP/endpoints.json" >/dev/null 2>&1; then
  client_access=(--endpoints-file "$VC_TMP/endpoints.json")
fi
n_requests=3
for ((i = 1; i <= n_requests; i++)); do
  if ! timeout 60 "$bin" client generate "${client_access[@]}" --prompt-ids 1,2,3 \
    --max-new-tokens 16 --mode vericache >"$VC_TMP/client-$i.log" 2>&1; then
    fail "request $i failed: $(tail -n 5 "$VC_TMP/client-$i.log")"
  fi
done
echo "  $n_requests requests served"

wait_query "$WAIT_S" "vericache_requests_total up by $n_requests" \
  "sum(vericache_requests_total) - $requests_before >= $n_requests"
wait_query "$WAIT_S" "vericache_accepted_tokens_per_round_count up" \
  "sum(vericache_accepted_tokens_per_round_count) - $rounds_before > 0"
echo "prometheus_integration_test (cluster): PASS"
