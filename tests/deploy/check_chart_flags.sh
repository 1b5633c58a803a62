#!/usr/bin/env bash
# Checks the flags helm/vericache passes to one daemon against that daemon's
# real flag parser:
#   1. every --flag in the rendered args appears in `DAEMON --help`;
#   2. the daemon's parser accepts the rendered args as they are (names and
#      value syntax: `DAEMON ARGS... --help` parses everything, then prints
#      help and exits 0 instead of starting);
#   3. with the chart's default values, every flag whose value is not
#      deployment-specific (addresses, paths) equals the daemon's own default
#      as --help prints it: the chart's defaults are the daemon's defaults.
# Renders the default values and every file in deploy/helm-values/.
#
# usage: check_chart_flags.sh REPO_ROOT DAEMON_NAME DAEMON_BINARY
# Exit 0 pass, 1 fail, 77 skipped (helm or the npm tools not installed).
set -euo pipefail

repo="${1:?usage: check_chart_flags.sh REPO_ROOT DAEMON_NAME DAEMON_BINARY}"
daemon="${2:?daemon name}"
bin="${3:?daemon binary}"
tools="${VC_TOOLS_DIR:-/opt/vericache-tools}"
helm="$tools/bin/helm"

if [[ ! -x "$helm" ]]; then
  echo "SKIP: $helm not found; run deploy/scripts/install_tools.sh" >&2
  exit 77
fi
command -v jq >/dev/null || { echo "FAIL: jq is needed (deploy/scripts/install_deps.sh)" >&2; exit 1; }
[[ -x "$bin" ]] || { echo "FAIL: $bin is not an executable" >&2; exit 1; }

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

help_text="$("$bin" --help)" || { echo "FAIL: $bin --help exited non-zero" >&2; exit 1; }
declare -A known=() defaults=()
while IFS= read -r line; do
  if [[ "$line" =~ ^[[:space:]]+(--[a-z0-9][a-z0-9-]*) ]]; then
    name="${BASH_REMATCH[1]}"
    known["$name"]=1
    if [[ "$line" =~ \(default:\ (.*)\)$ ]]; then
      value="${BASH_REMATCH[1]}"
      value="${value#\"}"
      value="${value%\"}"
      defaults["$name"]="$value"
    fi
  fi
done <<<"$help_text"

# Flags whose chart value is deployment-specific by design.
deployment_specific=" --listen --metrics-listen --data-dir --data-listen --peer-data-listen --peer-data-advertise --kvstore --verifiers --drafters --model --tokenizer --tls-cert --tls-key --tls-ca --api-keys-file --cluster-secret-file --coordinator --coordinator-tls-ca "

same_value() {  # numbers compare numerically ("20" == "20.0"), the rest as text
  local a="$1" b="$2"
  if [[ "$a" =~ ^-?[0-9.eE+-]+$ && "$b" =~ ^-?[0-9.eE+-]+$ ]]; then
    awk -v a="$a" -v b="$b" 'BEGIN { exit !(a + 0 == b + 0) }'
  else
    [[ "$a" == "$b" ]]
  fi
}

failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

checked=0
values_files=("")
for f in "$repo"/deploy/helm-values/*.yaml; do values_files+=("$f"); done
for values in "${values_files[@]}"; do
  label="${values:-default values}"
  label="${label#"$repo"/}"
  rendered="$tmp/rendered.yaml"
  "$helm" template vc "$repo/helm/vericache" ${values:+-f "$values"} >"$rendered" ||
    { fail "helm template with $label"; continue; }
  node "$repo/tests/deploy/validate_manifests.mjs" --tools "$tools" --args-out "$tmp/args.json" \
    "$rendered" >/dev/null || { fail "rendered manifests of $label are invalid (see the helm test)"; continue; }
  count="$(jq --arg d "$daemon" '[.[] | select(.daemon == $d)] | length' "$tmp/args.json")"
  if [[ "$count" == 0 ]]; then
    # A daemon a values file may switch off (openai.enabled=false).
    [[ -n "$values" && "$daemon" == vc-openai ]] && continue
    fail "$label renders no container running $daemon"
    continue
  fi
  for ((i = 0; i < count; i++)); do
    object="$(jq -r --arg d "$daemon" "[.[] | select(.daemon == \$d)][$i].object" "$tmp/args.json")"
    mapfile -d '' args < <(jq -j --arg d "$daemon" "[.[] | select(.daemon == \$d)][$i].args[] | (., \"\\u0000\")" "$tmp/args.json")
    for arg in "${args[@]}"; do
      name="${arg%%=*}"
      if [[ -z "${known[$name]:-}" ]]; then
        fail "$label, $object: $daemon has no flag $name (from '$arg'; see $daemon --help)"
        continue
      fi
      if [[ -z "$values" && "$deployment_specific" != *" $name "* ]]; then
        value=""
        [[ "$arg" == *=* ]] && value="${arg#*=}"
        if [[ -n "${defaults[$name]+x}" ]]; then
          same_value "$value" "${defaults[$name]}" ||
            fail "chart default $arg differs from $daemon's default ${defaults[$name]}"
        elif [[ -n "$value" && "$value" != "false" ]]; then
          fail "chart default $arg, but $daemon prints no default for $name (false/empty)"
        fi
      fi
    done
    if ! out="$("$bin" "${args[@]}" --help 2>&1 >/dev/null)"; then
      fail "$label, $object: $daemon rejects the rendered args: ${out:-exit non-zero}"
    fi
    checked=$((checked + 1))
  done
done

if ((failures)); then
  echo "check_chart_flags: $daemon: $failures problem(s)" >&2
  exit 1
fi
echo "check_chart_flags: $daemon: $checked rendered containers, every flag known and accepted"
