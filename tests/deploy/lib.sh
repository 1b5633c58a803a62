# shellcheck shell=bash
# Sourced by the tests in tests/deploy: process cleanup, free ports, daemons
# started on loopback. Exit code 77 means "skipped" to ctest (SKIP_RETURN_CODE).

VC_TOOLS_DIR="${VC_TOOLS_DIR:-/opt/vericache-tools}"

skip() { echo "SKIP: $*" >&2; exit 77; }
die() { echo "FAIL: $*" >&2; exit 1; }

# Processes this test started; cleanup() stops each by its pid (TERM, then
# KILL after a grace period) and removes the scratch directory.
_vc_pids=()
VC_TMP="$(mktemp -d "${TMPDIR:-/tmp}/vc-deploy-test.XXXXXX")"
track_pid() { _vc_pids+=("$1"); }
cleanup() {
  local pid deadline
  for pid in "${_vc_pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  deadline=$((SECONDS + 10))
  for pid in "${_vc_pids[@]}"; do
    while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  if [[ -n "${VC_KEEP_TMP:-}" ]]; then
    echo "scratch kept in $VC_TMP" >&2
  else
    rm -rf "$VC_TMP"
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# A TCP port on 127.0.0.1 that nothing listens on right now (the caller must
# still cope with losing a race for it).
free_port() {
  local port i
  for ((i = 0; i < 200; i++)); do
    port=$((20000 + RANDOM % 40000))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      echo "$port"
      return 0
    fi
  done
  die "no free port found"
}

# start_daemon NAME BIN ARGS...: runs a VeriCache daemon (which prints
# "<name> listening on HOST:PORT metrics HOST:PORT" once ready) and sets
# DAEMON_PID, DAEMON_ADDR, DAEMON_METRICS. Fails if it exits or is not ready
# within 60 s (workers load a model first).
start_daemon() {
  local name="$1" bin="$2"; shift 2
  local out="$VC_TMP/$name.log" err="$VC_TMP/$name.err"
  "$bin" "$@" >"$out" 2>"$err" &
  DAEMON_PID=$!
  track_pid "$DAEMON_PID"
  local deadline=$((SECONDS + 60))
  until grep -q "listening on" "$out" 2>/dev/null; do
    if ! kill -0 "$DAEMON_PID" 2>/dev/null; then
      die "$name exited early: $(tail -n 5 "$err")"
    fi
    ((SECONDS < deadline)) || die "$name did not report ready in 60 s: $(tail -n 5 "$err")"
    sleep 0.1
  done
  local line
  line="$(grep -m1 "listening on" "$out")"
  DAEMON_ADDR="$(sed -nE 's/.*listening on ([^ ]+).*/\1/p' <<<"$line")"
  DAEMON_METRICS="$(sed -nE 's/.* metrics ([0-9.]+:[0-9]+).*/\1/p' <<<"$line")"
  [[ -n "$DAEMON_ADDR" && -n "$DAEMON_METRICS" ]] || die "cannot read the addresses in $name's line: $line"
}

# start_kvstore BIN: vc-kvstore on free ports (port 0, the data plane too, so
# tests running side by side never collide) with a scratch data dir;
# sets KVSTORE_PID, KVSTORE_ADDR, KVSTORE_METRICS.
start_kvstore() {
  mkdir -p "$VC_TMP/kv"
  start_daemon vc-kvstore "$1" --listen 127.0.0.1:0 --data-listen 127.0.0.1:0 \
    --metrics-listen 127.0.0.1:0 --data-dir "$VC_TMP/kv"
  # shellcheck disable=SC2034  # read by the scripts that source this file
  KVSTORE_PID="$DAEMON_PID" KVSTORE_ADDR="$DAEMON_ADDR" KVSTORE_METRICS="$DAEMON_METRICS"
}
