# Sourced by the other scripts: repository paths and the shared build step.
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
export VC_MODELS_DIR="${VC_MODELS_DIR:-$REPO_ROOT/../shared/models}"
JOBS="${JOBS:-$(nproc)}"

# configure_and_build DIR [cmake args...]
configure_and_build() {
  local dir="$1"; shift
  cmake -S "$REPO_ROOT" -B "$REPO_ROOT/$dir" -G Ninja -DVC_WERROR=ON "$@" >/dev/null
  ninja -C "$REPO_ROOT/$dir" -j "$JOBS"
}
