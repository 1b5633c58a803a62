#!/usr/bin/env bash
# helm lint --strict and helm template of helm/vericache with one values file
# (or the defaults), then every rendered object validated offline
# (validate_manifests.mjs), and NOTES.txt rendered (helm template skips it).
# usage: check_helm_chart.sh REPO_ROOT [VALUES_FILE]   exit 0 pass, 1 fail, 77 skipped
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
repo="${1:?usage: check_helm_chart.sh REPO_ROOT [VALUES_FILE]}"
values="${2:-}"
helm="$VC_TOOLS_DIR/bin/helm"
[[ -x "$helm" ]] || skip "$helm not found; run deploy/scripts/install_tools.sh"
command -v node >/dev/null || die "node not found"
chart="$repo/helm/vericache"
vargs=()
[[ -n "$values" ]] && vargs=(-f "$values")

"$helm" lint --strict "$chart" "${vargs[@]}" || die "helm lint ${values:-(default values)}"
"$helm" template vc "$chart" --namespace vericache "${vargs[@]}" >"$VC_TMP/rendered.yaml" ||
  die "helm template ${values:-(default values)}"
node "$repo/tests/deploy/validate_manifests.mjs" --tools "$VC_TOOLS_DIR" "$VC_TMP/rendered.yaml" ||
  die "rendered manifests are invalid"

# Settings that must not render (default values only): trust, drafter weights.
if [[ -z "$values" ]]; then
  refuse() {  # refuse "why" --set ...
    local why="$1"; shift
    if "$helm" template vc "$chart" --namespace vericache "$@" >/dev/null 2>"$VC_TMP/refused.txt"; then
      die "rendered although $why: $*"
    fi
  }
  refuse "the API would leave the cluster without TLS" \
    --set coordinator.service.type=LoadBalancer --set tls.enabled=false
  refuse "the API would leave the cluster without API keys" \
    --set coordinator.service.type=LoadBalancer --set auth.enabled=false
  refuse "a cert-manager Certificate needs an issuer" --set tls.source=certManager
  refuse "the schema allows only known TLS sources" --set tls.source=selfsigned
  refuse "the schema allows only f32, int8 and int4 drafter weights" --set drafter.draftWeights=int2
  refuse "the schema allows only the cpu and cuda kernel backends" --set verifier.backend=tpu
  refuse "the cuda backend needs a GPU" --set verifier.backend=cuda --set verifier.gpus=0
  grep -q "backend cuda needs gpus >= 1" "$VC_TMP/refused.txt" ||
    die "backend cuda without GPUs refused for another reason: $(cat "$VC_TMP/refused.txt")"
  refuse "quantised drafter weights run on the cpu kernels" \
    --set drafter.draftWeights=int8 --set drafter.backend=cuda
  grep -q "draftWeights int8 needs backend cpu" "$VC_TMP/refused.txt" ||
    die "int8 drafter weights on cuda refused for another reason: $(cat "$VC_TMP/refused.txt")"
  refuse "quantised drafter weights run on one tensor-parallel rank" \
    --set drafter.draftWeights=int4 --set drafter.tensorParallel=2 --set drafter.gpus=2
  refuse "the schema takes model.draftPath relative to model.mountPath" \
    --set model.draftPath=/abs/draft.bin
  # A draft model reaches every verifier and drafter as --draft-model.
  "$helm" template vc "$chart" --namespace vericache --set model.draftPath=draft.bin \
    >"$VC_TMP/draft.yaml" || die "helm template with model.draftPath"
  [[ "$(grep -c -- '- --draft-model=/models/draft.bin' "$VC_TMP/draft.yaml")" == 2 ]] ||
    die "model.draftPath did not reach the verifier and the drafter as --draft-model"
  # Without TLS the probes are gRPC probes again, and the manifests stay valid.
  "$helm" template vc "$chart" --namespace vericache --set tls.enabled=false \
    --set auth.enabled=false --set networkPolicy.enabled=false >"$VC_TMP/plain.yaml" ||
    die "helm template with tls, auth and networkPolicy off"
  node "$repo/tests/deploy/validate_manifests.mjs" --tools "$VC_TOOLS_DIR" "$VC_TMP/plain.yaml" ||
    die "rendered manifests with tls/auth/networkPolicy off are invalid"
fi

# NOTES.txt: render it through a copy of the chart where it is a normal
# template inside a ConfigMap.
cp -r "$chart" "$VC_TMP/chart"
cp "$chart/templates/NOTES.txt" "$VC_TMP/chart/notes.txt"
cat >"$VC_TMP/chart/templates/zz-notes-check.yaml" <<'T'
apiVersion: v1
kind: ConfigMap
metadata:
  name: notes-check
data:
  notes: {{ tpl (.Files.Get "notes.txt") . | quote }}
T
"$helm" template vc "$VC_TMP/chart" --namespace vericache "${vargs[@]}" \
  --show-only templates/zz-notes-check.yaml >"$VC_TMP/notes.yaml" || die "NOTES.txt does not render"
grep -q "no value" "$VC_TMP/notes.yaml" && die "NOTES.txt renders '<no value>': $(grep -o '.\{40\}no value.\{10\}' "$VC_TMP/notes.yaml")"
echo "check_helm_chart: ${values:-default values}: PASS"
