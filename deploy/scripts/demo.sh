#!/usr/bin/env bash
# The main job: install what is missing, build, start the local cluster (the
# four daemons on loopback), register shared prefixes, serve a demo workload
# and print a short report (tokens/s, TTFT, acceptance, identical to full-KV
# decoding); then the single-node long-prompt benchmark (VeriCache with an
# int8 drafter against full-KV decoding) and two single-process comparisons
# on the test models.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

bash "$REPO_ROOT/deploy/scripts/install_deps.sh"
echo "== building (build/) =="
configure_and_build build -DCMAKE_BUILD_TYPE=Release -DVC_BUILD_TESTS=OFF | tail -n 1
VC="$REPO_ROOT/build/bin/vericache"
M="$VC_MODELS_DIR"
if [[ ! -f "$M/aidreams260K.bin" ]]; then
  echo "demo: test models not found in $M (set VC_MODELS_DIR)" >&2
  exit 1
fi

echo
echo "== the local cluster: vc-kvstore, vc-verifier, vc-drafter, vc-coordinator on loopback =="
echo "   3 shared prefixes registered, 12 requests per mode, 8 in flight; every output checked"
echo "   against full-KV decoding in this process"
"$VC" demo --model "$M/stories260K.bin"

echo
echo "== single node, long prompt: VeriCache with an int8 drafter vs full-KV decoding (vc_single_node_bench --small) =="
echo "   a random 23.5M-parameter llama2.c-shaped model, 1500-token prompt, 32 new tokens, 2 threads;"
echo "   drafter: the target's weights in int8 over its INT8-compressed KV, draft length 8; the baseline"
echo "   is full-KV decoding in the same process; 3 runs of each, outputs compared token for token"
"$REPO_ROOT/build/bin/vc_single_node_bench" --small --threads 2 --reps 5 --no-fresh

echo
echo "== single process: aidreams260K, lossless VeriCache (draft on INT8 KV, verify on full KV) =="
"$VC" generate --model "$M/aidreams260K.bin" --tokenizer "$M/aidreams260K.tok512.bin" \
  --prompt "I dream of" --max-new-tokens 80 --mode vericache --compressor int8 --draft-len 16

echo
echo "== single process: stories260K, 200-token prompt, 300 new tokens: full vs VeriCache vs lossy =="
IDS="1 $("$VC" generate --model "$M/stories260K.bin" --prompt-ids 1 --max-new-tokens 199 \
  --temperature 1 --seed 3 --ignore-eos 2>/dev/null)"
for args in "--mode full" "--mode vericache --compressor snapkv --ratio 0.5 --draft-len auto" \
            "--mode lossy --compressor snapkv --ratio 0.5"; do
  "$VC" generate --model "$M/stories260K.bin" --prompt-ids "$IDS" --max-new-tokens 300 --ignore-eos \
    $args --json > /tmp/vericache_demo_$$.json
  echo "$args: $(sed -e 's/.*"tokens":\[\([^]]*\)\].*/\1/' /tmp/vericache_demo_$$.json | md5sum | cut -c1-12) (token digest)" \
    "$(grep -o '"mean_accepted":[0-9.]*' /tmp/vericache_demo_$$.json || true)" \
    "$(grep -o '"lossy":true' /tmp/vericache_demo_$$.json || true)"
done
rm -f /tmp/vericache_demo_$$.json
echo "(equal digests = identical token streams; VeriCache must match full, lossy usually does not)"
