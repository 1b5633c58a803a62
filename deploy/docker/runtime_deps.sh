#!/usr/bin/env bash
# Works out what a VeriCache binary needs at run time, from its ELF
# dependencies (ldd), so the runtime images carry exactly that.
#
#   runtime_deps.sh packages BIN...   print the Debian packages that own the
#                                     shared libraries BIN links (one a line);
#                                     the slim images apt-get install them
#   runtime_deps.sh copy DEST BIN...  copy those libraries (and, with UCX, its
#                                     transport modules) into DEST, for the
#                                     CUDA images whose base is not Debian
#
# Left out: the C library and the dynamic loader, libstdc++ and libgcc_s (the
# base image has its own, same or newer), and the CUDA driver libcuda, which
# the NVIDIA container runtime mounts into GPU pods.
set -euo pipefail

usage() {
  echo "usage: runtime_deps.sh packages BIN... | runtime_deps.sh copy DEST BIN..." >&2
  exit 2
}
(($# >= 2)) || usage
mode="$1"; shift
dest=""
if [[ "$mode" == copy ]]; then dest="$1"; shift; (($#)) || usage; fi
[[ "$mode" == packages || "$mode" == copy ]] || usage

system_lib='^(linux-vdso|ld-linux|libc|libm|libdl|libpthread|librt|libutil|libresolv|libstdc\+\+|libgcc_s|libcuda)\.so'

# resolved_libs FILE...: absolute paths of the non-system libraries they need.
resolved_libs() {
  local f out
  for f in "$@"; do
    out="$(ldd "$f" 2>&1)" || { echo "runtime_deps: ldd $f failed: $out" >&2; return 1; }
    if grep -q "not found" <<<"$out"; then
      echo "runtime_deps: $f has unresolved libraries:" >&2
      grep "not found" <<<"$out" >&2
      return 1
    fi
    awk '$2 == "=>" && $3 ~ /^\// {print $1 " " $3}' <<<"$out"
  done | while read -r soname path; do
    [[ "$soname" =~ $system_lib ]] || echo "$path"
  done | sort -u
}

for b in "$@"; do
  [[ -f "$b" ]] || { echo "runtime_deps: no such file: $b" >&2; exit 1; }
done
mapfile -t libs < <(resolved_libs "$@")

# UCX loads its transports (tcp, shared memory, ...) from a "ucx" directory
# beside libucs at run time; ldd cannot see them.
ucx_modules=()
for l in "${libs[@]}"; do
  if [[ "$(basename "$l")" == libucs.so* && -d "$(dirname "$l")/ucx" ]]; then
    mapfile -t ucx_modules < <(find "$(dirname "$l")/ucx" -maxdepth 1 -name '*.so*' | sort)
  fi
done
if ((${#ucx_modules[@]})); then
  # A module whose own dependencies are missing (e.g. InfiniBand) is skipped
  # by UCX with a warning; keep the ones that resolve here.
  mapfile -t more < <(resolved_libs "${ucx_modules[@]}" 2>/dev/null || true)
  mapfile -t libs < <(printf '%s\n' "${libs[@]}" "${more[@]}" | sed '/^$/d' | sort -u)
fi

case "$mode" in
  packages)
    # One dpkg query for all files (each call reads the whole database). A
    # library may be owned under its symlink's path or its real path.
    mapfile -t files < <(for l in "${libs[@]}" "${ucx_modules[@]}"; do echo "$l"; readlink -f "$l"; done | sort -u)
    owners="$(dpkg -S "${files[@]}" 2>/dev/null || true)"
    for l in "${libs[@]}" "${ucx_modules[@]}"; do
      real="$(readlink -f "$l")"
      pkg="$(awk -v a="$l" -v b="$real" -F': ' '$2 == a || $2 == b {print $1; exit}' <<<"$owners")"
      [[ -n "$pkg" ]] || { echo "runtime_deps: no Debian package owns $l" >&2; exit 1; }
      echo "${pkg%%:*}"
    done | sort -u
    ;;
  copy)
    mkdir -p "$dest"
    for l in "${libs[@]}"; do cp -L "$l" "$dest/$(basename "$l")"; done
    if ((${#ucx_modules[@]})); then
      mkdir -p "$dest/ucx"
      for m in "${ucx_modules[@]}"; do cp -L "$m" "$dest/ucx/$(basename "$m")"; done
    fi
    echo "runtime_deps: copied ${#libs[@]} libraries and ${#ucx_modules[@]} UCX modules into $dest" >&2
    ;;
esac
