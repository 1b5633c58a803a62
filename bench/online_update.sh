#!/usr/bin/env bash
# Online compressor update vs an offline-only drafter view, single process:
# acceptance (mean accepted drafts per verify round), folds, and the drafter
# view's bytes (compressed prefix + exact tail: high-water and final) when
# generating to the end of stories260K's context, plus whether the output
# equals full-KV decoding. A request whose acceptance collapses falls back to
# full-KV decoding and drops its drafter view (fallbacks = 1): its byte
# figures stop there.
#   bench/online_update.sh [BUILD_DIR] [MODELS_DIR]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
V="${1:-$ROOT/build}/bin/vericache"
M="${2:-${VC_MODELS_DIR:-$ROOT/../shared/models}}/stories260K.bin"
[[ -x "$V" ]] || { echo "online_update: $V not found (build first)" >&2; exit 2; }
[[ -f "$M" ]] || { echo "online_update: $M not found (set VC_MODELS_DIR)" >&2; exit 2; }
# A 201-token prompt of the model's own text, then 311 tokens to the end.
prompt=$("$V" generate --model "$M" --prompt-ids "1" --max-new-tokens 200 --ignore-eos --json |
  python3 -c 'import json,sys; print(" ".join(map(str, [1] + json.load(sys.stdin)["tokens"])))')
gen=(generate --model "$M" --prompt-ids "$prompt" --max-new-tokens 311 --ignore-eos --json)
full=$("$V" "${gen[@]}")
printf "%-18s %-6s %9s %7s %10s %6s %12s %12s %6s\n" \
  compressor online accepted rounds fallbacks folds peak_bytes final_bytes exact
for spec in "streamingllm --ratio 0.25" "h2o --ratio 0.25" "tova --ratio 0.25" \
            "kivi --bits 2" "kivi --bits 4" "int8"; do
  for online in off on; do
    flags=()
    [[ $online == on ]] && flags=(--online-update)
    # shellcheck disable=SC2086
    out=$("$V" "${gen[@]}" --mode vericache --compressor $spec --draft-len 8 "${flags[@]}")
    FULL="$full" OUT="$out" python3 - "$spec" "$online" <<'PY'
import json, os, sys
spec, online = sys.argv[1].split(), sys.argv[2]
j, full = json.loads(os.environ["OUT"]), json.loads(os.environ["FULL"])
name = spec[0] + ("-" + spec[-1] if len(spec) > 1 else "")
print("%-18s %-6s %9.2f %7d %10d %6d %12d %12d %6s" % (
    name, online, j["mean_accepted"], j["verify_rounds"], j["fallbacks"], j.get("online_folds", 0),
    j["drafter_kv_bytes_peak"], j["drafter_kv_bytes_final"],
    "yes" if j["tokens"] == full["tokens"] else "NO"))
PY
  done
done
