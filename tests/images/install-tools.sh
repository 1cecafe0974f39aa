#!/usr/bin/env bash
# Installs from Debian those of the named tools that are missing, and only those:
#   install-tools.sh buildah       `make images` (builds the Dockerfiles without a Docker engine)
#   install-tools.sh debootstrap   `make images` without PYTHON_IMAGE, once: the local base image
#   install-tools.sh skopeo podman tests/bundle_tests, which push with them for real
#   install-tools.sh runc          `make docker` without a Docker engine: BuildKit's OCI worker
# Each caller names what it needs, so that a target never installs another's tools. With
# LJ_RUNTIMEKIT_INSTALL_TOOLS=no nothing is installed: it names what is missing and fails.
set -euo pipefail
(($#)) || { echo "usage: $0 TOOL..." >&2; exit 2; }
missing=()
for tool in "$@"; do
  case $tool in
    buildah | debootstrap | skopeo | podman | runc) ;;
    *) echo "install-tools.sh: no Debian package known for $tool" >&2; exit 2 ;;
  esac
  command -v "$tool" >/dev/null || missing+=("$tool")
done
((${#missing[@]})) || exit 0
if [[ ${LJ_RUNTIMEKIT_INSTALL_TOOLS:-yes} == no ]]; then
  echo "need ${missing[*]}: install them (apt-get install ${missing[*]}), or unset LJ_RUNTIMEKIT_INSTALL_TOOLS" >&2
  exit 1
fi
command -v apt-get >/dev/null || {
  echo "need ${missing[*]}: install them with your distribution's package manager" >&2; exit 1; }
sudo=; ((EUID == 0)) || sudo=sudo
echo "== installing ${missing[*]} (apt-get; LJ_RUNTIMEKIT_INSTALL_TOOLS=no to install them yourself)" >&2
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
