#!/usr/bin/env bash
# Installs what `make images` needs from Debian when it is missing: buildah (builds the
# Dockerfiles without a Docker engine) and debootstrap (makes the local base image).
set -euo pipefail
missing=()
command -v buildah >/dev/null || missing+=(buildah)
command -v debootstrap >/dev/null || missing+=(debootstrap)
((${#missing[@]})) || exit 0
command -v apt-get >/dev/null || {
  echo "need ${missing[*]}: install them with your distribution's package manager" >&2; exit 1; }
sudo=; ((EUID == 0)) || sudo=sudo
echo "== installing ${missing[*]} (apt-get)" >&2
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
