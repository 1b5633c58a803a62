#!/usr/bin/env bash
# Blackbox crash loop for the KV chunk store (RocksDB's db_crashtest, in
# spirit). Each round runs vc-stress load against the store, kill -9s at a
# random moment drawn from the seed, restarts on the same data directory and
# verifies every key against vc-stress's persisted oracle
# (vc-stress --verify-only). Any oracle violation fails the run.
#
#   --mode remote  (default) kill -9 vc-kvstore under `vc-stress --mode remote`
#                  load; every 4th round kills vc-stress at the same moment too
#                  (the oracle must survive its own crash as well).
#   --mode inproc  kill -9 vc-stress itself, which holds the store in-process.
#
# Bounded: --rounds rounds, each wait has a deadline, and --deadline-s caps
# the whole run; the exit trap kills every process this script started.
# Traffic stays on 127.0.0.1 (ports picked by the kernel).
#
# usage: crash_test.sh --stress BIN [--kvstore BIN] [--mode remote|inproc]
#          [--rounds N] [--seed S] [--min-kill-s X] [--max-kill-s X]
#          [--threads N] [--keys N] [--disk-bytes N] [--dram-bytes N]
#          [--ttl-seconds N] [--work-dir DIR] [--deadline-s N]
set -u -o pipefail

STRESS="" KVSTORE="" MODE=remote ROUNDS=4 SEED=0 MIN_KILL=0.3 MAX_KILL=2.0
THREADS=4 KEYS=512 DISK=2097152 DRAM=262144 TTL=0 WORK="" DEADLINE=900
while [[ $# -gt 0 ]]; do
  case "$1" in
    --stress) STRESS=$2; shift 2 ;;
    --kvstore) KVSTORE=$2; shift 2 ;;
    --mode) MODE=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --seed) SEED=$2; shift 2 ;;
    --min-kill-s) MIN_KILL=$2; shift 2 ;;
    --max-kill-s) MAX_KILL=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --keys) KEYS=$2; shift 2 ;;
    --disk-bytes) DISK=$2; shift 2 ;;
    --dram-bytes) DRAM=$2; shift 2 ;;
    --ttl-seconds) TTL=$2; shift 2 ;;
    --work-dir) WORK=$2; shift 2 ;;
    --deadline-s) DEADLINE=$2; shift 2 ;;
    *) echo "crash_test: unknown argument $1" >&2; exit 2 ;;
  esac
done
[[ -x "$STRESS" ]] || { echo "crash_test: --stress must name the vc-stress binary" >&2; exit 2; }
if [[ "$MODE" == remote && ! -x "$KVSTORE" ]]; then
  echo "crash_test: --kvstore must name the vc-kvstore binary in remote mode" >&2; exit 2
fi
[[ "$MODE" == remote || "$MODE" == inproc ]] || { echo "crash_test: --mode remote|inproc" >&2; exit 2; }
[[ "$SEED" == 0 ]] && SEED=$(( ($(date +%s%N) / 1000) % 1000000000 + 1 ))
RANDOM=$SEED
echo "crash_test: mode $MODE, $ROUNDS rounds, seed $SEED (replay with --seed $SEED)"

OWN_WORK=0
if [[ -z "$WORK" ]]; then WORK=$(mktemp -d "${TMPDIR:-/tmp}/vc_crash_XXXXXX"); OWN_WORK=1; fi
mkdir -p "$WORK"
DB="$WORK/db" ORACLE="$WORK/oracle" LOGS="$WORK/logs"
mkdir -p "$LOGS"
STORE_PID="" STRESS_PID="" STORE_ADDR=""
START=$SECONDS

cleanup() {
  [[ -n "$STRESS_PID" ]] && kill -9 "$STRESS_PID" 2>/dev/null
  [[ -n "$STORE_PID" ]] && kill -9 "$STORE_PID" 2>/dev/null
  wait 2>/dev/null
  if [[ $OWN_WORK == 1 && ${KEEP_WORK:-0} != 1 ]]; then rm -rf "$WORK"; fi
}
trap cleanup EXIT

fail() {
  echo "crash_test: FAIL: $*" >&2
  echo "crash_test: logs in $WORK/logs (seed $SEED)" >&2
  OWN_WORK=0  # keep the evidence
  exit 1
}

check_deadline() {
  (( SECONDS - START < DEADLINE )) || fail "over the ${DEADLINE}s deadline"
}

# Starts vc-kvstore on $DB and sets STORE_PID and STORE_ADDR.
start_store() {
  local log="$LOGS/kvstore.$1.out"
  "$KVSTORE" --data-dir "$DB" --listen 127.0.0.1:0 --data-listen 127.0.0.1:0 --metrics-listen "" \
    --disk-budget-bytes "$DISK" --dram-budget-bytes "$DRAM" --ttl-seconds "$TTL" \
    >"$log" 2>"$LOGS/kvstore.$1.err" &
  STORE_PID=$!
  local waited=0
  while ! grep -q "listening on" "$log" 2>/dev/null; do
    kill -0 "$STORE_PID" 2>/dev/null || fail "vc-kvstore exited at start (round $1): $(tail -3 "$LOGS/kvstore.$1.err")"
    (( waited++ < 600 )) || fail "vc-kvstore did not start within 60 s"
    sleep 0.1
  done
  STORE_ADDR=$(sed -n 's/.*listening on \([^ ]*\) .*/\1/p' "$log" | head -1)
  [[ -n "$STORE_ADDR" ]] || fail "cannot read vc-kvstore's address from $log"
}

# Waits up to $2 seconds for pid $1 (then kills it and sets WAIT_HUNG=1);
# sets WAIT_RC (137 after a kill).
wait_pid() {
  local pid=$1 limit=$2 t=0
  WAIT_HUNG=0
  while kill -0 "$pid" 2>/dev/null; do
    if (( t++ >= limit * 10 )); then kill -9 "$pid" 2>/dev/null; WAIT_HUNG=1; fi
    sleep 0.1
  done
  wait "$pid" 2>/dev/null
  WAIT_RC=$?
}

stress_args() {
  echo --oracle "$ORACLE" --threads "$THREADS" --keys "$KEYS" --disk-bytes "$DISK" \
    --dram-bytes "$DRAM" --ttl-seconds "$TTL" --max-unreachable-s 1 --rpc-timeout-ms 3000
}
target_args() {
  if [[ "$MODE" == remote ]]; then echo --mode remote --store "$STORE_ADDR"; else echo --mode inproc --db "$DB"; fi
}

# A random duration in [MIN_KILL, MAX_KILL] seconds from the seeded RANDOM.
draw_kill_s() {
  awk -v lo="$MIN_KILL" -v hi="$MAX_KILL" -v r="$RANDOM" 'BEGIN { printf "%.2f", lo + (hi - lo) * r / 32767 }'
}

TOTAL_OPS=0 RESOLVED=0 VERIFIED=0
[[ "$MODE" == remote ]] && start_store 0
for (( round = 1; round <= ROUNDS; round++ )); do
  check_deadline
  kill_s=$(draw_kill_s)
  also_stress=0
  [[ "$MODE" == remote && $(( round % 4 )) == 0 ]] && also_stress=1
  out="$LOGS/stress.$round.out"
  # shellcheck disable=SC2046
  "$STRESS" $(target_args) $(stress_args) --seed $(( SEED * 1000 + round )) --duration 30 \
    >"$out" 2>"$LOGS/stress.$round.err" &
  STRESS_PID=$!
  sleep "$kill_s"
  if [[ "$MODE" == remote ]]; then
    kill -9 "$STORE_PID" 2>/dev/null
    [[ $also_stress == 1 ]] && kill -9 "$STRESS_PID" 2>/dev/null
    wait_pid "$STORE_PID" 10 2>/dev/null
    STORE_PID=""
    wait_pid "$STRESS_PID" 20 2>/dev/null
  else
    kill -9 "$STRESS_PID" 2>/dev/null
    wait_pid "$STRESS_PID" 10 2>/dev/null
  fi
  rc=$WAIT_RC
  STRESS_PID=""
  [[ $WAIT_HUNG == 1 ]] && fail "round $round: vc-stress did not stop within 20 s of the store's death"
  # 0: finished before the kill; 3: saw the store go away; 137: killed.
  case $rc in
    0|3|137) ;;
    *) cat "$out" >&2; tail -5 "$LOGS/stress.$round.err" >&2
       fail "round $round: vc-stress exited $rc under load (kill at ${kill_s}s)" ;;
  esac
  ops=$(sed -n 's/.*run [0-9]*: \([0-9]*\) ops.*/\1/p' "$out" | tail -1)
  # Killed before its summary: its last progress line (printed every second).
  [[ -z "$ops" ]] && ops=$(sed -n 's/^vc-stress: progress: \([0-9]*\) ops.*/\1/p' "$LOGS/stress.$round.err" | tail -1)
  TOTAL_OPS=$(( TOTAL_OPS + ${ops:-0} ))
  [[ "$MODE" == remote ]] && start_store "$round"
  vout="$LOGS/verify.$round.out"
  # shellcheck disable=SC2046
  timeout 120 "$STRESS" $(target_args) $(stress_args) --verify-only >"$vout" 2>"$LOGS/verify.$round.err"
  vrc=$?
  if [[ $vrc != 0 ]]; then
    cat "$vout" >&2; tail -5 "$LOGS/verify.$round.err" >&2
    fail "round $round: verify after kill -9 at ${kill_s}s exited $vrc"
  fi
  v=$(sed -n 's/.* \([0-9]*\) keys verified.*/\1/p' "$vout" | tail -1)
  r=$(sed -n 's/.* \([0-9]*\) resolved after a crash.*/\1/p' "$vout" | tail -1)
  VERIFIED=$(( VERIFIED + ${v:-0} )) RESOLVED=$(( RESOLVED + ${r:-0} ))
  echo "crash_test: round $round/$ROUNDS: killed at ${kill_s}s ($([[ $also_stress == 1 ]] && echo "store and vc-stress" || echo "$([[ $MODE == remote ]] && echo store || echo vc-stress)")), ${ops:-0} ops, verify: ${v:-0} keys, ${r:-0} pending outcomes resolved, 0 violations"
done
if [[ -n "$STORE_PID" ]]; then kill -TERM "$STORE_PID" 2>/dev/null; wait_pid "$STORE_PID" 15; STORE_PID=""; fi
echo "crash_test: PASS $ROUNDS kill -9 rounds ($MODE), $TOTAL_OPS store ops under load, $VERIFIED keys verified, $RESOLVED pending outcomes resolved, 0 oracle violations, seed $SEED, $(( SECONDS - START )) s"
