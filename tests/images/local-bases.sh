#!/usr/bin/env bash
# The two images the components' Dockerfiles build FROM (build args PYTHON_IMAGE and UV_IMAGE):
# a mirror's where given, else made here in buildah's storage — the Debian base (base-image.sh)
# and a uv image holding the venv's pinned uv binary. `make images` builds on them with buildah,
# `make docker` without a Docker engine pushes them to a loopback registry for BuildKit.
# Usage: local-bases.sh   (environment: PYTHON_IMAGE, UV_IMAGE, UV, BUILDAH)
# Prints "<python image> <uv image>" on its last line.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/../.."
: "${BUILDAH:=$here/buildah.sh}"
export BUILDAH

python_image=${PYTHON_IMAGE:-localhost/lj-runtimekit/base-python:bookworm}
if [[ -z ${PYTHON_IMAGE:-} ]]; then
  "$here/install-tools.sh" buildah
  BASE_IMAGE=$python_image "$here/base-image.sh" >/dev/null
fi
if [[ -n ${UV_IMAGE:-} ]]; then
  uv_image=$UV_IMAGE
else
  # Same uv as the Dockerfiles' default image (ghcr.io/astral-sh/uv:<version>), from the venv's
  # pinned binary: one place pins it (the Makefile's UV_VERSION).
  "$here/install-tools.sh" buildah
  uv_version=$(sed -nE 's/^ARG UV_IMAGE=(.*)$/\1/p' components/exporter/Dockerfile)
  uv_version=${uv_version##*:}
  uv_bin=${UV:-.venv/bin/uv}
  have=$("$uv_bin" --version | awk '{print $2}')
  [[ $have == "$uv_version" ]] || {
    echo "$uv_bin is uv $have, the Dockerfiles pin $uv_version: run make setup" >&2; exit 1; }
  uv_image=localhost/lj-runtimekit/uv:$uv_version
  if ! $BUILDAH inspect --type image "$uv_image" >/dev/null 2>&1; then
    echo "== uv image: $uv_image from $uv_bin" >&2
    ctr=$($BUILDAH from scratch)
    $BUILDAH copy --chmod 0755 "$ctr" "$uv_bin" /uv >/dev/null
    $BUILDAH config --entrypoint '["/uv"]' --os linux --arch "$(dpkg --print-architecture)" "$ctr"
    $BUILDAH commit --quiet --rm "$ctr" "$uv_image" >/dev/null
  fi
fi
echo "$python_image $uv_image"
