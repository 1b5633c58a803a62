#!/usr/bin/env bash
# Every metric name the operations artefacts use must be one the daemons
# export. "Used" = names in deploy/prometheus/alerts.yml (expressions and
# texts), in every query of deploy/grafana/dashboards/*.json, and in the
# "Metrics reference" section of docs/operations.md. "Exported" = the
# "vericache_..." string literals in the C++ sources (common/, services/,
# kernels/; tests excluded); a histogram's series X_bucket, X_sum and X_count
# count as exported when X is.
# usage: check_metric_names.sh REPO_ROOT        exit 0 ok, 1 missing names
set -euo pipefail
repo="${1:?usage: check_metric_names.sh REPO_ROOT}"
cd "$repo"
command -v jq >/dev/null || { echo "FAIL: jq is needed (deploy/scripts/install_deps.sh)" >&2; exit 1; }

names='vericache_[a-z0-9_]*[a-z0-9]'
mapfile -t exported < <(grep -rhoE --include='*.cc' --include='*.h' "\"$names\"" common services kernels |
  tr -d '"' | sort -u)
if ((${#exported[@]} == 0)); then
  echo "FAIL: found no \"vericache_...\" literals in common/ services/ kernels/" >&2
  exit 1
fi
declare -A have=()
for n in "${exported[@]}"; do have["$n"]=1; done

# name<TAB>where, one line per use.
uses="$(
  grep -oE "$names" deploy/prometheus/alerts.yml | sed 's|$|\tdeploy/prometheus/alerts.yml|'
  for f in deploy/grafana/dashboards/*.json; do
    jq -r '.. | objects | .expr? // empty' "$f" | grep -oE "$names" | sed "s|\$|\t$f|" || true
  done
  awk '/^## Metrics reference/ {on = 1; next} /^## / {on = 0} on' docs/operations.md |
    grep -oE "$names" | sed 's|$|\tdocs/operations.md (Metrics reference)|' || true
)"

declare -A missing=()
checked=0
while IFS=$'\t' read -r name where; do
  [[ -z "$name" ]] && continue
  checked=$((checked + 1))
  [[ -n "${have[$name]:-}" ]] && continue
  base="${name%_bucket}"; base="${base%_sum}"; base="${base%_count}"
  [[ "$base" != "$name" && -n "${have[$base]:-}" ]] && continue
  missing["$name"]+="${missing[$name]:+, }$where"
done < <(sort -u <<<"$uses")

if ((${#missing[@]})); then
  echo "FAIL: ${#missing[@]} metric name(s) used but not exported by any daemon's C++ source:" >&2
  for n in $(printf '%s\n' "${!missing[@]}" | sort); do
    echo "  $n  (used in ${missing[$n]})" >&2
  done
  exit 1
fi
echo "check_metric_names: $checked uses, all among ${#exported[@]} exported names"
