#!/usr/bin/env bash
# buildah with everything it keeps under the cache, never in the host's container storage:
#   - its own storage (vfs driver: no overlay or fuse needed), config and registries files, and
#     temporary directory (where RUN --mount=type=cache lives, so the uv cache is kept too);
#   - chroot isolation (no runc, no network namespace to set up);
#   - a private mount namespace in which /var/lib is an overlay whose writes land in the cache:
#     containers/image writes its blob-info cache to /var/lib/containers/cache for root and no flag
#     moves it.
# Usage: buildah.sh <buildah arguments>   (same arguments as buildah)
# Environment: LJ_RUNTIMEKIT_CACHE (default ~/.cache/lj-runtimekit).
set -euo pipefail
state=${LJ_RUNTIMEKIT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/lj-runtimekit}/buildah

if [[ ${_LJRK_BUILDAH_NS:-} != "$state" ]]; then
  mkdir -p "$state"/{storage,run,tmp,net,varlib/upper,varlib/work}
  cat > "$state/storage.conf.$$" <<EOF
[storage]
driver = "vfs"
graphroot = "$state/storage"
runroot = "$state/run"
EOF
  cat > "$state/containers.conf.$$" <<EOF
[network]
network_backend = "cni"
network_config_dir = "$state/net"

[engine]
tmp_dir = "$state/tmp"
EOF
  # Fully qualified names only: nothing is looked up on a registry by a short name.
  printf 'unqualified-search-registries = []\nshort-name-mode = "disabled"\n' > "$state/registries.conf.$$"
  for f in storage.conf containers.conf registries.conf; do
    if cmp -s "$state/$f.$$" "$state/$f"; then rm "$state/$f.$$"; else mv "$state/$f.$$" "$state/$f"; fi
  done
  export _LJRK_BUILDAH_NS=$state
  exec unshare --mount --propagation private -- "$0" "$@"
fi

mount -t overlay overlay \
  -o "lowerdir=/var/lib,upperdir=$state/varlib/upper,workdir=$state/varlib/work" /var/lib
export CONTAINERS_STORAGE_CONF=$state/storage.conf CONTAINERS_CONF=$state/containers.conf \
  CONTAINERS_REGISTRIES_CONF=$state/registries.conf TMPDIR=$state/tmp BUILDAH_ISOLATION=chroot
exec buildah "$@"
