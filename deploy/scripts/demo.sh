#!/usr/bin/env bash
# The main job: install what is missing, build, and run the demo on the test
# models in ../shared/models, ending with a short report.
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
echo "== aidreams260K, greedy, text in and out =="
"$VC" generate --model "$M/aidreams260K.bin" --tokenizer "$M/aidreams260K.tok512.bin" \
  --prompt "I dream of" --max-new-tokens 80
echo
echo "== aidreams260K, seeded sampling (temperature 0.8, top-p 0.9, seed 7) =="
"$VC" generate --model "$M/aidreams260K.bin" --tokenizer "$M/aidreams260K.tok512.bin" \
  --prompt "I dream of" --max-new-tokens 80 --temperature 0.8 --top-p 0.9 --seed 7
echo
echo "== aidreams260K, lossless VeriCache: draft on INT8 KV, verify on full KV =="
"$VC" generate --model "$M/aidreams260K.bin" --tokenizer "$M/aidreams260K.tok512.bin" \
  --prompt "I dream of" --max-new-tokens 80 --mode vericache --compressor int8 --draft-len 16
echo
echo "== stories260K (no tokenizer: token ids in and out), 120 tokens =="
"$VC" generate --model "$M/stories260K.bin" --prompt-ids "1 306 461" --max-new-tokens 120 --ignore-eos

echo
echo "== stories260K: 200-token prompt (the model's own sampled text), 300 new tokens =="
echo "   full KV vs lossless VeriCache vs the lossy baseline"
IDS="1 $("$VC" generate --model "$M/stories260K.bin" --prompt-ids 1 --max-new-tokens 199 \
  --temperature 1 --seed 3 --ignore-eos 2>/dev/null)"
for args in "--mode full" "--mode vericache --compressor snapkv --ratio 0.5 --draft-len auto" \
            "--mode vericache --compressor int8 --draft-len 32" "--mode lossy --compressor snapkv --ratio 0.5"; do
  "$VC" generate --model "$M/stories260K.bin" --prompt-ids "$IDS" --max-new-tokens 300 --ignore-eos \
    $args --json > /tmp/vericache_demo_$$.json
  echo "$args: $(sed -e 's/.*"tokens":\[\([^]]*\)\].*/\1/' /tmp/vericache_demo_$$.json | md5sum | cut -c1-12) (token digest)" \
    "$(grep -o '"mean_accepted":[0-9.]*' /tmp/vericache_demo_$$.json || true)" \
    "$(grep -o '"compression_ratio":[0-9.]*' /tmp/vericache_demo_$$.json || true)" \
    "$(grep -o '"lossy":true' /tmp/vericache_demo_$$.json || true)"
done
rm -f /tmp/vericache_demo_$$.json
echo "(equal digests = identical token streams; VeriCache must match full, lossy usually does not)"
