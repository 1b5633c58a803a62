#!/usr/bin/env bash
# Static checks of deploy/docker/Dockerfile and .dockerignore, since images
# cannot be built here (no Docker engine, no registry access):
#   - base images resolve through ARG defaults, with pinned tags (no :latest);
#   - every stage referenced by FROM/COPY --from is defined before its use;
#   - every COPY source from the build context exists and survives
#     .dockerignore, and the context holds what the CMake build needs;
#   - every /build/bin/X copied out of a build stage is a CMake executable that
#     the stage's ninja command builds; every ENTRYPOINT binary was copied in;
#   - each daemon target exists, runs as a non-root numeric USER and its
#     repository matches the chart's image.* values;
#   - deploy/docker/runtime_deps.sh, run on the real vc-kvstore binary, names
#     installed Debian packages, and its copy mode gives a library directory
#     with which the binary runs.
# usage: check_dockerfiles.sh REPO_ROOT VC_KVSTORE_BINARY     exit 0 pass, 1 fail
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
repo="${1:?usage: check_dockerfiles.sh REPO_ROOT VC_KVSTORE_BINARY}"
kvstore_bin="${2:?vc-kvstore binary}"
df="$repo/deploy/docker/Dockerfile"
[[ -f "$df" ]] || die "$df not found"

failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

# Join continuation lines; drop comments and blank lines.
mapfile -t lines < <(sed -e 's/\r$//' "$df" | awk '
  /^[[:space:]]*#/ && !cont { next }
  { line = cont ? line " " $0 : $0 }
  /\\$/ { sub(/\\$/, "", line); cont = 1; next }
  { cont = 0; if (line ~ /[^[:space:]]/) print line; line = "" }')

# CMake executables anywhere in the tree.
mapfile -t targets < <(grep -rhoE --include=CMakeLists.txt 'add_executable\(([A-Za-z0-9_-]+)' \
  "$repo/services" "$repo/common" "$repo/kernels" 2>/dev/null | sed 's/add_executable(//' | sort -u)
is_target() { local t; for t in "${targets[@]}"; do [[ "$t" == "$1" ]] && return 0; done; return 1; }

# .dockerignore: ordered patterns relative to the context root, last match
# wins, "!" re-includes; a pattern matches a path, or any path under it.
mapfile -t ignore < <(grep -vE '^\s*(#|$)' "$repo/.dockerignore" 2>/dev/null || true)
in_context() {
  local p="$1" keep=1 pat neg
  for pat in "${ignore[@]}"; do
    neg=0
    [[ "$pat" == !* ]] && { neg=1; pat="${pat#!}"; }
    pat="${pat%/}"
    # shellcheck disable=SC2053
    if [[ "$p" == $pat || "$p" == $pat/* ]]; then keep=$neg; fi
  done
  ((keep))
}

declare -A args=() stages=() stage_text=() stage_copied=()
stage=""
final_stages=()
resolve() {  # expand ${VAR} / $VAR from ARG defaults
  local s="$1" name
  while [[ "$s" =~ \$\{?([A-Za-z_][A-Za-z0-9_]*)\}? ]]; do
    name="${BASH_REMATCH[1]}"
    [[ -n "${args[$name]+x}" ]] || { fail "undefined ARG $name in '$1'"; s="${s//${BASH_REMATCH[0]}/}"; continue; }
    s="${s//${BASH_REMATCH[0]}/${args[$name]}}"
  done
  echo "$s"
}

for line in "${lines[@]}"; do
  read -r instr rest <<<"$line"
  instr="${instr^^}"
  case "$instr" in
    ARG)
      if [[ "$rest" =~ ^([A-Za-z_][A-Za-z0-9_]*)=(.*)$ ]]; then
        v="${BASH_REMATCH[2]}"; v="${v#\"}"; v="${v%\"}"
        [[ -z "$stage" ]] && args["${BASH_REMATCH[1]}"]="$(resolve "$v")"
      fi
      ;;
    FROM)
      read -r image _as name <<<"$rest"
      image="$(resolve "$image")"
      [[ "${_as^^}" == AS && -n "$name" ]] || fail "FROM $rest: every stage needs a name"
      if [[ -z "${stages[$image]:-}" ]]; then
        [[ "$image" == *:* ]] || fail "FROM $image: pin a tag"
        [[ "$image" != *:latest ]] || fail "FROM $image: do not use :latest"
      fi
      stage="$name"
      stages["$stage"]=1
      final_stages+=("$stage")
      ;;
    COPY)
      from=""
      words=()
      read -r -a words <<<"$rest"
      srcs=()
      for w in "${words[@]}"; do
        case "$w" in
          --from=*) from="$(resolve "${w#--from=}")" ;;
          --*) ;;
          *) srcs+=("$(resolve "$w")") ;;
        esac
      done
      dst="${srcs[-1]}"
      unset 'srcs[-1]'
      if [[ -z "$from" ]]; then
        for s in "${srcs[@]}"; do
          [[ "$s" == "." ]] && continue
          [[ -e "$repo/$s" ]] || fail "COPY $s: no such path in the repository"
          in_context "$s" || fail "COPY $s: excluded by .dockerignore"
        done
      elif [[ -n "${stages[$from]:-}" && "$(grep -cvE '^(FROM|$)' <<<"${stage_text[$from]}")" == 0 ]]; then
        :  # a stage that only names an image: any path of that image
      elif [[ -n "${stages[$from]:-}" ]]; then
        for s in "${srcs[@]}"; do
          if [[ "$s" == /build/bin/* ]]; then
            b="${s#/build/bin/}"
            is_target "$b" || fail "COPY --from=$from $s: $b is not a CMake executable"
            grep -qE "ninja .*[[:space:]]$b([[:space:]]|$)" <<<"${stage_text[$from]}" ||
              fail "COPY --from=$from $s: stage $from does not build $b"
          else
            grep -qF -- "$s" <<<"${stage_text[$from]}" ||
              fail "COPY --from=$from $s: nothing in stage $from writes $s"
          fi
        done
      elif [[ "$from" != *:* ]]; then
        fail "COPY --from=$from: no such stage (defined later or misspelt?)"
      fi
      stage_copied["$stage"]+=" $dst"
      ;;
  esac
  [[ -n "$stage" ]] && stage_text["$stage"]+="$line"$'\n'
done

for daemon in vc-kvstore vc-coordinator vc-openai vc-verifier vc-drafter; do
  text="${stage_text[$daemon]:-}"
  [[ -n "$text" ]] || { fail "no stage $daemon"; continue; }
  is_target "$daemon" || fail "$daemon: not a CMake executable (yet?)"
  ep="$(grep -E '^ENTRYPOINT' <<<"$text" | tail -1)"
  bin="$(sed -nE 's/^ENTRYPOINT \["([^"]+)".*/\1/p' <<<"$ep")"
  [[ "$bin" == "/usr/local/bin/$daemon" ]] || fail "$daemon: ENTRYPOINT should be [\"/usr/local/bin/$daemon\"], is: $ep"
  [[ " ${stage_copied[$daemon]:-} " == *" $bin "* ]] || fail "$daemon: ENTRYPOINT $bin is not copied into the stage"
  user="$(grep -E '^USER' <<<"$text" | tail -1 | awk '{print $2}')"
  [[ "$user" =~ ^[1-9][0-9]*(:[1-9][0-9]*)?$ ]] || fail "$daemon: USER must be a numeric non-root uid, is '${user:-unset}'"
  if ! grep -qE "^  ${daemon#vc-}: vericache/$daemon\$" "$repo/helm/vericache/values.yaml"; then
    fail "$daemon: helm/vericache/values.yaml image.${daemon#vc-} is not vericache/$daemon"
  fi
done

# The build context must hold the CMake build and nothing heavy.
for p in CMakeLists.txt common/CMakeLists.txt kernels/CMakeLists.txt proto/CMakeLists.txt \
  services/CMakeLists.txt deploy/scripts/install_deps.sh deploy/docker/runtime_deps.sh; do
  [[ -e "$repo/$p" ]] || fail "$p missing from the repository"
  in_context "$p" || fail "$p is excluded by .dockerignore but the build needs it"
done
for p in .git build build-test/bin/x tests/CMakeLists.txt bench/CMakeLists.txt docs/operations.md helm/vericache/Chart.yaml; do
  in_context "$p" && fail "$p should be excluded by .dockerignore"
done

# runtime_deps.sh on a real binary.
pk="$(bash "$repo/deploy/docker/runtime_deps.sh" packages "$kvstore_bin")" || fail "runtime_deps.sh packages failed"
[[ -n "$pk" ]] || fail "runtime_deps.sh named no packages for vc-kvstore"
for p in $pk; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
    fail "runtime_deps.sh named '$p', which is not an installed Debian package"
done
grep -qx 'libgrpc++1.51' <<<"$pk" || fail "runtime_deps.sh missed libgrpc++1.51 for vc-kvstore: $pk"
bash "$repo/deploy/docker/runtime_deps.sh" copy "$VC_TMP/lib" "$kvstore_bin" 2>/dev/null || fail "runtime_deps.sh copy failed"
resolved="$(LD_LIBRARY_PATH="$VC_TMP/lib" ldd "$kvstore_bin")"
while read -r soname _ path _; do
  [[ "$soname" =~ ^(linux-vdso|ld-linux|libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s)\.so ]] && continue
  [[ "$path" == "$VC_TMP/lib/"* ]] || fail "with the copied libraries, $soname still resolves to $path"
done < <(grep '=>' <<<"$resolved")
LD_LIBRARY_PATH="$VC_TMP/lib" "$kvstore_bin" --help >/dev/null || fail "vc-kvstore does not run with the copied libraries"

if ((failures)); then
  echo "check_dockerfiles: $failures problem(s)" >&2
  exit 1
fi
echo "check_dockerfiles: ${#final_stages[@]} stages, $(wc -w <<<"$pk") runtime packages for vc-kvstore: PASS"
