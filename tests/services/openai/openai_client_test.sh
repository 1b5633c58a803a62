#!/usr/bin/env bash
# Starts `vericache local --model MODEL_DIR --chat-template ...` (which serves
# the OpenAI API through vc-openai) and runs openai_client_test.mjs against it
# with the official `openai` npm client: every check against the default
# secure cluster (HTTPS, API keys), then a short subset against --insecure
# (plain HTTP).
#   openai_client_test.sh VERICACHE_BINARY
# Exit 77 (skipped, with the reason) when node, the npm packages
# (deploy/scripts/install_tools.sh) or the model are missing.
set -euo pipefail
vericache="$1"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../../.." && pwd)"
tools="${VC_TOOLS_DIR:-/opt/vericache-tools}"
model="${VC_MODELS_DIR:-$repo/../shared/models}/tinystories656K"

skip() { echo "SKIP: $*"; exit 77; }
command -v node >/dev/null 2>&1 || skip "node not found"
[[ -f "$tools/node_modules/openai/package.json" ]] || skip "the openai npm package is not in $tools (run deploy/scripts/install_tools.sh)"
[[ -f "$tools/node_modules/@huggingface/tokenizers/package.json" ]] || skip "@huggingface/tokenizers is not in $tools (run deploy/scripts/install_tools.sh)"
[[ -f "$model/tokenizer.json" ]] || skip "model $model not found"

tmp="$(mktemp -d)"
pid=""
stop_cluster() {
  if [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  fi
  pid=""
}
cleanup() {
  stop_cluster
  rm -rf "$tmp"
}
trap cleanup EXIT

# start_cluster NAME [vericache local flags...]: starts it, waits for its
# endpoints file $tmp/NAME/endpoints.json.
start_cluster() {
  local name="$1"
  shift
  mkdir -p "$tmp/$name"
  "$vericache" local --model "$model" --chat-template "$repo/tests/data/openai/tinystories_chat.jinja" \
    --endpoints-file "$tmp/$name/endpoints.json" --log-dir "$tmp/$name/logs" --worker-threads 1 "$@" \
    >"$tmp/$name/local.out" 2>&1 &
  pid=$!
  for _ in $(seq 1200); do
    [[ -f "$tmp/$name/endpoints.json" ]] && break
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "vericache local $* exited:"; cat "$tmp/$name/local.out"; tail -n 20 "$tmp/$name"/logs/*.log 2>/dev/null || true
      exit 1
    fi
    sleep 0.1
  done
  [[ -f "$tmp/$name/endpoints.json" ]] || { echo "vericache local $* did not start in 120 s"; cat "$tmp/$name/local.out"; exit 1; }
  cat "$tmp/$name/endpoints.json"; echo
}

# run_client NAME [ENV=VALUE...]: the client checks against that cluster.
run_client() {
  local name="$1" status=0
  shift
  env "$@" timeout 420 node "$here/openai_client_test.mjs" "$tmp/$name/endpoints.json" "$vericache" "$model" "$tools" ||
    status=$?
  if ((status != 0)); then
    echo "== daemon logs ($name)"; tail -n 30 "$tmp/$name"/logs/*.log 2>/dev/null || true
    exit "$status"
  fi
}

# The cluster as `vericache local` starts it: secure by default (mutual TLS
# between the daemons, TLS and API keys on the coordinator, which vc-openai
# reaches with the cluster's CA and each caller's own key; the OpenAI API
# itself over HTTPS with a certificate of the cluster CA, which the client
# trusts through NODE_EXTRA_CA_CERTS). Every check.
start_cluster secure
ca="$(node -e 'console.log(JSON.parse(require("fs").readFileSync(process.argv[1], "utf8")).tls_ca || "")' \
  "$tmp/secure/endpoints.json")"
[[ -n "$ca" ]] || { echo "the secure cluster's endpoints file has no tls_ca"; exit 1; }
run_client secure NODE_EXTRA_CA_CERTS="$ca"
stop_cluster

# --insecure: plain HTTP and no API keys; a short subset.
start_cluster insecure --insecure
run_client insecure VC_OPENAI_QUICK=1
