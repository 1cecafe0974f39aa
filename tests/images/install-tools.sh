#!/usr/bin/env bash
# Installs from Debian what is missing of: buildah (builds the Dockerfiles without a Docker
# engine) and debootstrap (makes the local base image), which `make images` needs; skopeo and
# podman, two of the push tools of the offline bundle's installer, which tests/bundle_tests runs
# for real (`make test` runs `make images`, so a fresh machine gets them too).
set -euo pipefail
missing=()
command -v buildah >/dev/null || missing+=(buildah)
command -v debootstrap >/dev/null || missing+=(debootstrap)
command -v skopeo >/dev/null || missing+=(skopeo)
command -v podman >/dev/null || missing+=(podman)
((${#missing[@]})) || exit 0
command -v apt-get >/dev/null || {
  echo "need ${missing[*]}: install them with your distribution's package manager" >&2; exit 1; }
sudo=; ((EUID == 0)) || sudo=sudo
echo "== installing ${missing[*]} (apt-get)" >&2
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
