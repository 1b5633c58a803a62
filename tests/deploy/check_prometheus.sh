#!/usr/bin/env bash
# promtool on the project's Prometheus files:
#   check config   deploy/prometheus/prometheus.yml, and prometheus-kubernetes.yml
#                  with its Kubernetes discovery swapped for a static list when
#                  this promtool lacks Kubernetes discovery (Debian builds it
#                  without; the relabelling rules are still checked);
#   check rules    deploy/prometheus/alerts.yml;
#   test rules     deploy/prometheus/alerts_test.yml, against alerts.yml with
#                  the annotations stripped (promtool compares them verbatim);
#   and every alert carries severity, summary, description and runbook.
# usage: check_prometheus.sh REPO_ROOT     exit 0 pass, 1 fail, 77 skipped
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
repo="${1:?usage: check_prometheus.sh REPO_ROOT}"
prom="$repo/deploy/prometheus"
command -v promtool >/dev/null || skip "promtool not found (Debian package prometheus; deploy/scripts/install_deps.sh)"
yaml_js="$VC_TOOLS_DIR/node_modules/yaml/dist/index.js"
[[ -f "$yaml_js" ]] || skip "$yaml_js not found; run deploy/scripts/install_tools.sh"

cp "$prom/prometheus.yml" "$prom/alerts.yml" "$VC_TMP/"
promtool check config "$VC_TMP/prometheus.yml" || die "promtool check config prometheus.yml"

cp "$prom/prometheus-kubernetes.yml" "$VC_TMP/k8s.yml"
if ! out="$(promtool check config "$VC_TMP/k8s.yml" 2>&1)"; then
  if grep -q "field kubernetes_sd_configs not found" <<<"$out"; then
    echo "promtool has no Kubernetes discovery: checking prometheus-kubernetes.yml with a static target list"
    sed -E 's/^(\s*)kubernetes_sd_configs:/\1static_configs:/; s/^(\s*)- role: pod$/\1- targets: []/' \
      "$prom/prometheus-kubernetes.yml" >"$VC_TMP/k8s.yml"
    grep -q kubernetes_sd_configs "$VC_TMP/k8s.yml" && die "could not swap the discovery"
    promtool check config "$VC_TMP/k8s.yml" || die "promtool check config prometheus-kubernetes.yml"
  else
    echo "$out" >&2
    die "promtool check config prometheus-kubernetes.yml"
  fi
fi

promtool check rules "$prom/alerts.yml" || die "promtool check rules alerts.yml"

mkdir -p "$VC_TMP/unit"
cp "$prom/alerts_test.yml" "$VC_TMP/unit/"
node --input-type=module -e '
  import { readFileSync, writeFileSync } from "node:fs";
  const YAML = (await import(process.argv[1])).default;
  const doc = YAML.parse(readFileSync(process.argv[2], "utf8"));
  const problems = [];
  let n = 0;
  for (const g of doc.groups) for (const r of g.rules) {
    if (!r.alert) continue;
    n++;
    for (const k of ["summary", "description", "runbook"]) {
      if (!(r.annotations?.[k] ?? "").trim()) problems.push(`${r.alert}: no ${k} annotation`);
    }
    if (!["warning", "critical"].includes(r.labels?.severity)) problems.push(`${r.alert}: severity must be warning or critical`);
    delete r.annotations;
  }
  if (problems.length) { console.error(problems.join("\n")); process.exit(1); }
  writeFileSync(process.argv[3], YAML.stringify(doc));
  console.log(`${n} alerts have severity, summary, description and runbook`);
' "file://$yaml_js" "$prom/alerts.yml" "$VC_TMP/unit/alerts.yml" || die "alert annotations"

# Every alert in alerts.yml must have a unit test.
for a in $(grep -oE '^ *- alert: *[A-Za-z]+' "$prom/alerts.yml" | awk '{print $3}'); do
  grep -q "alertname: $a\$" "$prom/alerts_test.yml" || die "alert $a has no test in alerts_test.yml"
done
(cd "$VC_TMP/unit" && promtool test rules alerts_test.yml) || die "promtool test rules alerts_test.yml"
echo "check_prometheus: PASS"
