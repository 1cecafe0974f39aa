#!/usr/bin/env bash
# Makes the local base image the components' Dockerfiles build on where no image registry is
# reachable: Debian bookworm from this machine's apt mirror (`debootstrap --variant=minbase`) plus
# Debian's python3 (python3-minimal lacks the standard library) and ca-certificates, without docs,
# apt lists or caches. Kept as an OCI archive under the cache, keyed by this recipe, so it is made
# once per machine; loaded into the given buildah storage and tagged $BASE_IMAGE.
#
# Usage: base-image.sh  (environment: BUILDAH, the buildah command with its storage flags;
#                        BASE_IMAGE, the tag to give it; DEBIAN_MIRROR to override the mirror)
# Prints the archive's path on its last line.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

: "${BUILDAH:=$here/buildah.sh}"
: "${BASE_IMAGE:=localhost/lj-runtimekit/base-python:bookworm}"
suite=bookworm
packages=python3,ca-certificates
arch=$(dpkg --print-architecture)

# The mirror this machine's apt uses for the suite (deb822 sources, then one-line ones).
mirror_of_this_machine() {
  local f
  for f in /etc/apt/sources.list.d/*.sources; do
    [[ -f $f ]] || continue
    awk -v s="$suite" 'BEGIN{RS=""} $0 ~ "Suites:[^\n]*[[:space:]]" s "([[:space:]]|$)" {
      for (i = 1; i <= NF; i++) if ($i == "URIs:") { print $(i + 1); exit } }' "$f"
  done | head -n1
  awk -v s="$suite" '$1 == "deb" && $3 == s {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true
}
mirror=${DEBIAN_MIRROR:-$(mirror_of_this_machine | head -n1)}
mirror=${mirror:-http://deb.debian.org/debian}

cache=${LJ_RUNTIMEKIT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/lj-runtimekit}/images
recipe=$(printf '%s\n' "$suite" "$arch" "$packages" "$mirror" | cat - "$0" | sha256sum | cut -c1-16)
archive="$cache/base-python-$suite-$arch-$recipe.tar"
mkdir -p "$cache"

if [[ ! -f $archive ]]; then
  "$here/install-tools.sh" debootstrap
  echo "== base image: debootstrap $suite ($arch) from $mirror with $packages (once per machine)" >&2
  work=$(mktemp -d "$cache/base.XXXXXX")
  trap 'rm -rf "$work"' EXIT
  rootfs="$work/rootfs"
  start=$SECONDS
  # debootstrap reads some variables of its own (COMPONENTS, which make images sets): none leak in.
  env -u COMPONENTS -u ARCH -u SUITE -u TARGET -u MIRRORS \
    debootstrap --variant=minbase --components=main --include="$packages" --arch="$arch" \
    "$suite" "$rootfs" "$mirror" \
    > "$work/debootstrap.log" 2>&1 || { tail -n 30 "$work/debootstrap.log" >&2; exit 1; }
  # Small: no docs, man pages, locales, apt lists, caches or logs; the image's apt points at the
  # same mirror for anyone who extends it.
  rm -rf "$rootfs"/usr/share/{doc,man,info,locale,lintian,linda}/* \
    "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/* "$rootfs"/var/cache/debconf/*-old \
    "$rootfs"/var/log/* "$rootfs"/tmp/* "$rootfs"/root/.cache
  find "$rootfs/usr/lib" -name __pycache__ -type d -prune -exec rm -rf {} +
  # Device nodes come from the container runtime, not from the image.
  find "$rootfs/dev" -mindepth 1 -delete
  tar --numeric-owner --sort=name --mtime=@0 -C "$rootfs" -cf "$work/rootfs.tar" .
  ctr=$($BUILDAH from --name "lj-base-$recipe" scratch)
  $BUILDAH add "$ctr" "$work/rootfs.tar" / >/dev/null
  $BUILDAH config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env LANG=C.UTF-8 --cmd python3 --os linux --arch "$arch" \
    --label "org.opencontainers.image.description=Debian $suite minbase + python3 (LJ RuntimeKit local base)" \
    --label "io.lj-runtimekit.base.recipe=$recipe" "$ctr"
  $BUILDAH commit --quiet --rm "$ctr" "$BASE_IMAGE" >/dev/null
  $BUILDAH push --quiet "$BASE_IMAGE" "oci-archive:$archive.partial:$BASE_IMAGE"
  mv "$archive.partial" "$archive"
  echo "== base image: made in $((SECONDS - start)) s, $(du -h "$archive" | cut -f1) ($archive)" >&2
elif [[ $($BUILDAH inspect --type image --format '{{index .OCIv1.Config.Labels "io.lj-runtimekit.base.recipe"}}' "$BASE_IMAGE" 2>/dev/null) != "$recipe" ]]; then
  echo "== base image: loading $archive" >&2
  id=$($BUILDAH pull --quiet "oci-archive:$archive")
  $BUILDAH tag "$id" "$BASE_IMAGE"
fi
echo "$archive"
