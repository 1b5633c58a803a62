#!/usr/bin/env bash
# Starts `vericache local --model MODEL_DIR --chat-template ...` (which serves
# the OpenAI API through vc-openai) and runs openai_client_test.mjs against it
# with the official `openai` npm client.
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
cleanup() {
  if [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT

# The cluster as `vericache local` starts it: secure by default (mutual TLS
# between the daemons, TLS and API keys on the coordinator, which vc-openai
# reaches with the cluster's CA and each caller's own key).
"$vericache" local --model "$model" --chat-template "$repo/tests/data/openai/tinystories_chat.jinja" \
  --endpoints-file "$tmp/endpoints.json" --log-dir "$tmp/logs" --worker-threads 1 >"$tmp/local.out" 2>&1 &
pid=$!
for _ in $(seq 1200); do
  [[ -f "$tmp/endpoints.json" ]] && break
  if ! kill -0 "$pid" 2>/dev/null; then
    echo "vericache local exited:"; cat "$tmp/local.out"; tail -n 20 "$tmp"/logs/*.log 2>/dev/null || true
    exit 1
  fi
  sleep 0.1
done
[[ -f "$tmp/endpoints.json" ]] || { echo "vericache local did not start in 120 s"; cat "$tmp/local.out"; exit 1; }
cat "$tmp/endpoints.json"
status=0
timeout 420 node "$here/openai_client_test.mjs" "$tmp/endpoints.json" "$vericache" "$model" "$tools" || status=$?
if ((status != 0)); then
  echo "== daemon logs"; tail -n 30 "$tmp"/logs/*.log 2>/dev/null || true
fi
exit "$status"
