#!/usr/bin/env bash
# Builds the five VeriCache images from deploy/docker/Dockerfile and tags them
# as the chart expects (helm/vericache/values.yaml: image.*).
#   deploy/docker/build_images.sh [--registry registry.example.com/] [--tag 0.1.0] [--push]
# Needs a Docker engine (docker buildx / BuildKit) with access to Docker Hub
# for the base images (debian:bookworm, debian:bookworm-slim, nvidia/cuda).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
registry=""
tag="$(sed -nE 's/^appVersion: *"?([^"]+)"?/\1/p' "$repo/helm/vericache/Chart.yaml")"
push=0
while (($#)); do
  case "$1" in
    --registry) registry="$2"; shift 2 ;;
    --tag) tag="$2"; shift 2 ;;
    --push) push=1; shift ;;
    *) echo "usage: build_images.sh [--registry PREFIX/] [--tag TAG] [--push]" >&2; exit 2 ;;
  esac
done
for daemon in vc-kvstore vc-coordinator vc-openai vc-verifier vc-drafter; do
  image="${registry}vericache/${daemon}:${tag}"
  echo "== $image" >&2
  docker build -f "$repo/deploy/docker/Dockerfile" --target "$daemon" -t "$image" "$repo"
  if ((push)); then docker push "$image"; fi
done
