#!/usr/bin/env bash
# The Grafana dashboards: structure and freshness (check_dashboards.mjs), then
# promtool parses and evaluates every panel query.
# usage: check_dashboards.sh REPO_ROOT     exit 0 pass, 1 fail, 77 skipped
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
repo="${1:?usage: check_dashboards.sh REPO_ROOT}"
command -v node >/dev/null || die "node not found"
node "$repo/tests/deploy/check_dashboards.mjs" "$repo" "$VC_TMP/queries_test.yml" || die "dashboard structure"
command -v promtool >/dev/null || skip "promtool not found: queries not parsed (Debian package prometheus)"
(cd "$VC_TMP" && promtool test rules queries_test.yml) || die "a dashboard query does not parse or evaluate"
echo "check_dashboards: PASS"
