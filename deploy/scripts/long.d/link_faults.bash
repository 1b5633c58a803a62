# Sourced by the long tier's chaos scripts (not run by the tier itself: its
# runner executes *.sh only).
#
# link_fault_flags NAME: prints --link-faults when this run can cut and
# throttle links (root, with ip and tc on the PATH) and VC_CHAOS_LINK_FAULTS
# is not 0; otherwise prints nothing and says on stderr, under NAME, why
# link faults are off.
link_fault_flags() {
  if [[ "${VC_CHAOS_LINK_FAULTS:-1}" != "0" && "$(id -u)" == "0" ]] &&
    command -v ip >/dev/null && command -v tc >/dev/null; then
    echo --link-faults
  else
    echo "$1: link faults off (needs root, ip and tc; VC_CHAOS_LINK_FAULTS=${VC_CHAOS_LINK_FAULTS:-1})" >&2
  fi
}
