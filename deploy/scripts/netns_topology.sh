#!/usr/bin/env bash
# The VeriCache link topology in Linux network namespaces, for experiments
# with real (kernel-shaped) links instead of the data plane's own pacing:
#
#   <prefix>-verifier  --fast link--  <prefix>-store  --slow link--  <prefix>-drafter
#     NET.1.2              (veth)     NET.1.1 / NET.2.1    (veth)        NET.2.2
#
# Each link is a veth pair. The store->verifier (fast) and store->drafter
# (slow) directions, the ones chunk bytes travel, are shaped on the store's
# side with tc: tbf for the rate, netem under it for the delay. The reverse
# directions (requests, ACKs) are left alone. Some kernels ship tbf but not
# netem; asking for a delay there fails with a clear message (and leaves no
# half-built topology) rather than silently building an undelayed link.
#
# Usage: netns_topology.sh up|down|status|exec|addr [flags] [-- command ...]
# Run with --help for the commands and flags. Needs root, ip and tc.
set -euo pipefail

PREFIX="vc"
NET="10.213"
FAST_RATE="10gbit"
SLOW_RATE="1gbit"
FAST_DELAY_MS="0"
SLOW_DELAY_MS="0"
BURST=""

usage() {
  cat <<USAGE
usage: $(basename "$0") COMMAND [flags] [-- command ...]

Builds the store/verifier/drafter namespaces joined by shaped veth links.

commands:
  up                 create (or re-create) the topology; idempotent
  down               delete the topology's namespaces (and with them the links)
  status             show namespaces, addresses and qdiscs of the topology
  exec ROLE -- CMD   run CMD inside namespace <prefix>-ROLE (store|verifier|drafter)
  addr ROLE          print ROLE's address (store: its slow-side address; see
                     also store-fast / store-slow)

flags:
  --prefix NAME         namespace name prefix (default: $PREFIX); namespaces are
                        NAME-store, NAME-verifier, NAME-drafter
  --net A.B             first two octets of the link subnets (default: $NET); the fast
                        link is A.B.1.0/24, the slow link A.B.2.0/24
  --fast-rate RATE      tc rate of store->verifier (default: $FAST_RATE; tc units:
                        kbit, mbit, gbit, or bps for bytes/s)
  --slow-rate RATE      tc rate of store->drafter (default: $SLOW_RATE)
  --fast-delay-ms MS    one-way delay added on store->verifier (default: $FAST_DELAY_MS)
  --slow-delay-ms MS    one-way delay added on store->drafter (default: $SLOW_DELAY_MS)
  --burst SIZE          tbf bucket size, tc units (default: 64kb, or about 1 ms of the
                        rate when that is larger)
  -h, --help            this text

examples:
  $(basename "$0") up --prefix vc --slow-rate 800mbit --slow-delay-ms 2
  $(basename "$0") exec store --prefix vc -- vc-dataplane-probe serve --listen 10.213.2.1:7401
  $(basename "$0") exec drafter --prefix vc -- vc-dataplane-probe fetch --server 10.213.2.1:7401 --link slow
  $(basename "$0") down --prefix vc
USAGE
}

die() {
  echo "netns_topology: $*" >&2
  exit 2
}

COMMAND="${1:-}"
[[ -n "$COMMAND" ]] || { usage >&2; exit 2; }
shift
case "$COMMAND" in
  -h|--help) usage; exit 0 ;;
esac
ROLE=""
if [[ "$COMMAND" == "exec" || "$COMMAND" == "addr" ]]; then
  ROLE="${1:-}"
  [[ -n "$ROLE" && "$ROLE" != --* ]] || die "$COMMAND needs a ROLE (store|verifier|drafter)"
  shift
fi
while [[ $# -gt 0 ]]; do
  case "$1" in
    --prefix) PREFIX="${2:?--prefix needs a value}"; shift 2 ;;
    --net) NET="${2:?--net needs a value}"; shift 2 ;;
    --fast-rate) FAST_RATE="${2:?--fast-rate needs a value}"; shift 2 ;;
    --slow-rate) SLOW_RATE="${2:?--slow-rate needs a value}"; shift 2 ;;
    --fast-delay-ms) FAST_DELAY_MS="${2:?--fast-delay-ms needs a value}"; shift 2 ;;
    --slow-delay-ms) SLOW_DELAY_MS="${2:?--slow-delay-ms needs a value}"; shift 2 ;;
    --burst) BURST="${2:?--burst needs a value}"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    --) shift; break ;;
    *) die "unknown flag '$1' (see --help)" ;;
  esac
done

[[ "$PREFIX" =~ ^[A-Za-z0-9_.-]{1,40}$ ]] || die "--prefix must be 1-40 of [A-Za-z0-9_.-]"
[[ "$NET" =~ ^[0-9]{1,3}\.[0-9]{1,3}$ ]] || die "--net must look like A.B (e.g. 10.213)"
for d in "$FAST_DELAY_MS" "$SLOW_DELAY_MS"; do
  [[ "$d" =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "delays are milliseconds >= 0, got '$d'"
done
for r in "$FAST_RATE" "$SLOW_RATE"; do
  [[ "$r" =~ ^[0-9]+(\.[0-9]+)?([kmgt]?(bit|bps))?$ ]] || die "bad rate '$r' (e.g. 800mbit)"
done

STORE="$PREFIX-store"
VERIFIER="$PREFIX-verifier"
DRAFTER="$PREFIX-drafter"

role_ns() {
  case "$1" in
    store|store-fast|store-slow) echo "$STORE" ;;
    verifier) echo "$VERIFIER" ;;
    drafter) echo "$DRAFTER" ;;
    *) die "unknown role '$1' (store|verifier|drafter)" ;;
  esac
}

role_addr() {
  case "$1" in
    store|store-slow) echo "$NET.2.1" ;;
    store-fast) echo "$NET.1.1" ;;
    verifier) echo "$NET.1.2" ;;
    drafter) echo "$NET.2.2" ;;
    *) die "unknown role '$1'" ;;
  esac
}

need_tools() {
  [[ "$(id -u)" == "0" ]] || die "must run as root (network namespaces and tc)"
  command -v ip >/dev/null || die "'ip' (iproute2) not found"
  command -v tc >/dev/null || die "'tc' (iproute2) not found"
}

ns_exists() { ip netns list | awk '{print $1}' | grep -qx "$1"; }

# Rate in bytes per second from a tc rate string (for the default burst).
rate_bytes() {
  local r="$1" n unit
  n="$(sed -E 's/^([0-9.]+).*/\1/' <<<"$r")"
  unit="$(sed -E 's/^[0-9.]+//' <<<"$r")"
  case "$unit" in
    ""|bit) awk -v n="$n" 'BEGIN{printf "%d", n/8}' ;;
    kbit) awk -v n="$n" 'BEGIN{printf "%d", n*1000/8}' ;;
    mbit) awk -v n="$n" 'BEGIN{printf "%d", n*1000000/8}' ;;
    gbit) awk -v n="$n" 'BEGIN{printf "%d", n*1000000000/8}' ;;
    tbit) awk -v n="$n" 'BEGIN{printf "%d", n*1000000000000/8}' ;;
    bps) awk -v n="$n" 'BEGIN{printf "%d", n}' ;;
    kbps) awk -v n="$n" 'BEGIN{printf "%d", n*1000}' ;;
    mbps) awk -v n="$n" 'BEGIN{printf "%d", n*1000000}' ;;
    gbps) awk -v n="$n" 'BEGIN{printf "%d", n*1000000000}' ;;
    *) die "bad rate '$r'" ;;
  esac
}

# shape NS DEV RATE DELAY_MS: tbf at the root for the rate, netem below it for
# the delay (if any).
shape() {
  local ns="$1" dev="$2" rate="$3" delay="$4" burst="$BURST"
  if [[ -z "$burst" ]]; then
    local ms_bytes
    ms_bytes="$(( $(rate_bytes "$rate") / 1000 ))"
    burst="$(( ms_bytes > 65536 ? ms_bytes : 65536 ))"
  fi
  ip netns exec "$ns" tc qdisc replace dev "$dev" root handle 1: tbf rate "$rate" \
    burst "$burst" latency 200ms
  if [[ "$delay" != "0" ]]; then
    if ! ip netns exec "$ns" tc qdisc replace dev "$dev" parent 1:1 handle 10: netem \
      delay "${delay}ms" limit 100000; then
      do_down
      die "this kernel has no netem qdisc (sch_netem), so a link delay cannot be shaped;" \
          "run without --*-delay-ms and use the data plane's own latency pacing instead"
    fi
  fi
}

do_down() {
  local ns
  for ns in "$STORE" "$VERIFIER" "$DRAFTER"; do
    if ns_exists "$ns"; then ip netns del "$ns"; fi
  done
}

do_up() {
  do_down  # idempotent: always build from scratch
  local ns
  for ns in "$STORE" "$VERIFIER" "$DRAFTER"; do
    ip netns add "$ns"
    ip -n "$ns" link set lo up
  done
  # Both ends are created inside their namespaces, so the short names never
  # clash with another topology or the host.
  ip link add name to-verifier netns "$STORE" type veth peer name to-store netns "$VERIFIER"
  ip link add name to-drafter netns "$STORE" type veth peer name to-store netns "$DRAFTER"
  ip -n "$STORE" addr add "$NET.1.1/24" dev to-verifier
  ip -n "$VERIFIER" addr add "$NET.1.2/24" dev to-store
  ip -n "$STORE" addr add "$NET.2.1/24" dev to-drafter
  ip -n "$DRAFTER" addr add "$NET.2.2/24" dev to-store
  ip -n "$STORE" link set to-verifier up
  ip -n "$STORE" link set to-drafter up
  ip -n "$VERIFIER" link set to-store up
  ip -n "$DRAFTER" link set to-store up
  shape "$STORE" to-verifier "$FAST_RATE" "$FAST_DELAY_MS"
  shape "$STORE" to-drafter "$SLOW_RATE" "$SLOW_DELAY_MS"
  echo "netns_topology: up: $VERIFIER ($NET.1.2) <-fast $FAST_RATE +${FAST_DELAY_MS}ms- $STORE" \
       "($NET.1.1 / $NET.2.1) -slow $SLOW_RATE +${SLOW_DELAY_MS}ms-> $DRAFTER ($NET.2.2)"
}

do_status() {
  local ns
  for ns in "$STORE" "$VERIFIER" "$DRAFTER"; do
    if ! ns_exists "$ns"; then
      echo "$ns: absent"
      continue
    fi
    echo "== $ns"
    ip -n "$ns" -brief addr show | grep -v '^lo' || true
    ip netns exec "$ns" tc qdisc show | grep -v ' dev lo ' || true
  done
}

case "$COMMAND" in
  up) need_tools; do_up ;;
  down) need_tools; do_down ;;
  status) need_tools; do_status ;;
  addr) role_ns "$ROLE" >/dev/null; role_addr "$ROLE" ;;
  exec)
    need_tools
    [[ $# -gt 0 ]] || die "exec needs a command after --"
    ns="$(role_ns "$ROLE")"
    ns_exists "$ns" || die "namespace $ns does not exist (run 'up' first)"
    exec ip netns exec "$ns" "$@"
    ;;
  *) die "unknown command '$COMMAND' (see --help)" ;;
esac
