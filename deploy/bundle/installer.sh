#!/bin/sh
# lj-runtimekit-k8s-images.@VERSION@.run: the LJ RuntimeKit @VERSION@ images for a site without
# internet access. The container images' OCI archives are embedded after this script (a plain
# tar); everything below is POSIX sh and standard tools (tail, tar, sha256sum or shasum or
# openssl), so it runs on any node or bastion host. Built by deploy/bundle/build-bundle.py from
# deploy/bundle/installer.sh; do not edit the .run by hand (its checksum covers the payload).
# The per-image functions run through each_image and cleanup through trap: not unreachable.
# shellcheck disable=SC2317
set -u

VERSION='@VERSION@'
PAYLOAD_SHA256='@PAYLOAD_SHA256@'
PAYLOAD_BYTES='@PAYLOAD_BYTES@'
# The payload starts on this line (the builder counts the lines of this script).
PAYLOAD_LINE='@PAYLOAD_LINE@'

# Exit codes (also listed by --help).
E_USAGE=2
E_INTEGRITY=3
E_TOOL=4
E_IMAGE=5

PROG=$(basename "$0")
SELF=$0
case $SELF in */*) ;; *) SELF=./$SELF ;; esac

usage() {
  cat <<EOF
Usage: $PROG COMMAND [OPTIONS]

The LJ RuntimeKit $VERSION container images, packed for an offline site.

Commands:
  push REGISTRY/PROJECT   push every image to a registry, name and tag kept:
                          <image>:<tag> becomes REGISTRY/PROJECT/<image>:<tag>
                          (with docker, podman, skopeo or crane: the first one found)
  load                    load every image into this node's container runtime
                          (ctr in containerd namespace k8s.io, nerdctl, or docker)
  list                    show the images inside (name:tag, digest, size)
  verify                  check the payload and every image archive against their checksums

Options:
  --tool=NAME             use this tool instead of the first one found
                          (push: docker|podman|skopeo|crane; load: ctr|nerdctl|docker)
  --insecure              push over plain HTTP / without TLS verification (skopeo, podman,
                          crane; docker takes its insecure registries from daemon.json)
  --namespace=NS          containerd namespace for load with ctr or nerdctl (default k8s.io)
  --workdir=DIR           where the archives are unpacked (default: \$TMPDIR or /tmp;
                          needs about the size of this file free)
  -h, --help              this text

Before any command the installer checks its own payload against the SHA-256 it was built with
and refuses to run when the file is truncated or altered. Log in to the target registry with the
tool itself first (docker login, podman login, skopeo login, crane auth login).

Exit status: 0 done; $E_USAGE usage error; $E_INTEGRITY this file is damaged (download it again);
$E_TOOL no usable tool; $E_IMAGE an image failed (named on stderr; the others were still tried).
EOF
}

say() { printf '%s\n' "$*"; }
err() { printf '%s: %s\n' "$PROG" "$*" >&2; }
die() { code=$1; shift; err "$*"; exit "$code"; }

sha256_of_stdin() {
  if command -v sha256sum >/dev/null 2>&1; then sha256sum | cut -d' ' -f1
  elif command -v shasum >/dev/null 2>&1; then shasum -a 256 | cut -d' ' -f1
  elif command -v openssl >/dev/null 2>&1; then openssl dgst -sha256 | sed 's/^.*= *//'
  else die "$E_TOOL" "no sha256sum, shasum or openssl: cannot check this file's integrity"
  fi
}

payload() { tail -n "+$PAYLOAD_LINE" "$SELF"; }

check_payload() {
  [ -r "$SELF" ] || die "$E_INTEGRITY" "cannot read $SELF"
  bytes=$(payload | wc -c | tr -d ' ')
  if [ "$bytes" != "$PAYLOAD_BYTES" ]; then
    die "$E_INTEGRITY" "$SELF is damaged: its payload is $bytes bytes, $PAYLOAD_BYTES expected (truncated download?). Nothing was done; download it again and check it against SHA256SUMS."
  fi
  sum=$(payload | sha256_of_stdin)
  if [ "$sum" != "$PAYLOAD_SHA256" ]; then
    die "$E_INTEGRITY" "$SELF is damaged: payload SHA-256 $sum, $PAYLOAD_SHA256 expected. Nothing was done; download it again and check it against SHA256SUMS."
  fi
}

WORK=
cleanup() { [ -n "$WORK" ] && rm -rf "$WORK"; }

unpack() { # [member...]: only these (default: everything)
  base=${WORKDIR:-${TMPDIR:-/tmp}}
  WORK=$(mktemp -d "$base/lj-runtimekit-images.XXXXXX") || die "$E_USAGE" "cannot make a directory in $base (--workdir=DIR)"
  trap cleanup EXIT
  trap 'cleanup; exit 130' INT
  trap 'cleanup; exit 143' TERM
  payload | tar -xf - -C "$WORK" "$@" || die "$E_INTEGRITY" "cannot unpack the images into $WORK (disk full? try --workdir=DIR)"
  [ -s "$WORK/images.list" ] || die "$E_INTEGRITY" "the payload has no images.list"
}

# images.list: one line per image: ARCHIVE REF DIGEST SHA256 BYTES
each_image() { # callback
  fn=$1
  while read -r archive ref digest sha bytes; do
    [ -n "$archive" ] || continue
    "$fn" "$archive" "$ref" "$digest" "$sha" "$bytes" </dev/null
  done < "$WORK/images.list"
}

FAILED=
fail_image() { # ref message
  err "FAILED $1: $2"
  FAILED="$FAILED $1"
}

finish() { # what
  if [ -n "$FAILED" ]; then
    err "$1 failed for:$FAILED"
    exit "$E_IMAGE"
  fi
}

# ---------------------------------------------------------------------------------- list/verify

list_one() {
  printf '%-78s %-71s %10s  %s\n' "$2" "$3" "$5" "$1"
}

verify_one() {
  sum=$(sha256_of_stdin < "$WORK/$1")
  if [ "$sum" = "$4" ]; then
    say "ok      $2 ($1, sha256:$sum)"
  else
    fail_image "$2" "archive $1 has SHA-256 $sum, $4 expected"
  fi
}

# ---------------------------------------------------------------------------------- push

pick_tool() { # candidates...
  if [ -n "$TOOL" ]; then  # a name main has checked already
    command -v "$TOOL" >/dev/null 2>&1 || die "$E_TOOL" "--tool=$TOOL: $TOOL is not on PATH"
    say "$TOOL"
    return 0
  fi
  for t in "$@"; do
    command -v "$t" >/dev/null 2>&1 || continue
    # A docker client without a reachable daemon cannot do anything: try the next tool.
    if [ "$t" = docker ] && ! docker version --format '{{.Server.Version}}' >/dev/null 2>&1; then
      err "docker found but its daemon is not reachable: skipped"
      continue
    fi
    say "$t"
    return 0
  done
  die "$E_TOOL" "none of $* found on PATH: install one or name it with --tool="
}

target_of() { # ref → DEST/<last path component of the image name>:<tag>
  say "$DEST/${1##*/}"
}

# The archive as an OCI image layout directory (crane reads layouts, not OCI tarballs).
layout_of() {
  dir=$WORK/layout-${1%.tar}
  if [ ! -d "$dir" ]; then
    mkdir -p "$dir" && tar -xf "$WORK/$1" -C "$dir" || return 1
  fi
  say "$dir"
}

# docker load says "Loaded image: NAME" or "Loaded image ID: sha256:..." (an OCI archive's name
# annotation is not read by every docker version): tag whichever it loaded.
tag_loaded() { # docker-load-output target
  docker tag "${1##* }" "$2"
}

# podman pushes only from its own image store: pull the archive in, tag, push, then take out
# again what this run put there (an image the store already held under its name stays).
podman_push() { # archive ref target
  had=false
  podman image exists "$2" 2>/dev/null && had=true
  # shellcheck disable=SC2086
  id=$(podman pull -q "oci-archive:$WORK/$1") && podman tag "$id" "$3" &&
    podman push -q $INSECURE_FLAG "$3"
  rc=$?
  podman rmi "$3" >/dev/null 2>&1
  $had || podman rmi "$2" >/dev/null 2>&1
  return "$rc"
}

push_one() {
  archive=$1 ref=$2 digest=$3
  target=$(target_of "$ref")
  case $PUSH_TOOL in
    crane)
      layout=$(layout_of "$archive") || { fail_image "$ref" "cannot unpack $archive"; return; }
      # shellcheck disable=SC2086
      out=$(crane push $INSECURE_FLAG "$layout" "$target" 2>&1); rc=$? ;;
    skopeo)
      # shellcheck disable=SC2086
      out=$(skopeo copy --quiet --preserve-digests $INSECURE_FLAG "oci-archive:$WORK/$archive" "docker://$target" 2>&1); rc=$? ;;
    podman)
      out=$(podman_push "$archive" "$ref" "$target" 2>&1); rc=$? ;;
    docker)
      out=$( { loaded=$(docker load -q -i "$WORK/$archive") && tag_loaded "$loaded" "$target" &&
        docker push -q "$target"; } 2>&1); rc=$? ;;
  esac
  if [ "$rc" -eq 0 ]; then
    say "pushed  $ref -> $target (built as $digest) with $PUSH_TOOL"
  else
    fail_image "$ref" "$PUSH_TOOL could not push it to $target: $(printf '%s' "$out" | tail -n 5)"
  fi
}

# ---------------------------------------------------------------------------------- load

load_one() {
  archive=$1 ref=$2 digest=$3
  case $LOAD_TOOL in
    ctr)
      # ctr names the image from the archive's io.containerd.image.name annotation; check that
      # the name is there afterwards rather than trusting the exit status alone.
      out=$(ctr -n "$NAMESPACE" images import "$WORK/$archive" 2>&1); rc=$?
      if [ "$rc" -eq 0 ] && ! ctr -n "$NAMESPACE" images ls -q 2>&1 | grep -Fqx "$ref"; then
        out="ctr imported $archive but $ref is not listed in namespace $NAMESPACE"; rc=1
      fi ;;
    nerdctl)
      # nerdctl names the image as ctr does; its "Loaded image:" line shortens docker.io names,
      # so ask for the reference itself afterwards.
      out=$(nerdctl --namespace "$NAMESPACE" load -i "$WORK/$archive" 2>&1); rc=$?
      if [ "$rc" -eq 0 ] && ! nerdctl --namespace "$NAMESPACE" image inspect "$ref" >/dev/null 2>&1; then
        out="nerdctl loaded $archive but $ref is not in namespace $NAMESPACE"; rc=1
      fi ;;
    docker)
      out=$( { loaded=$(docker load -q -i "$WORK/$archive") && tag_loaded "$loaded" "$ref"; } 2>&1); rc=$? ;;
  esac
  if [ "$rc" -eq 0 ]; then
    say "loaded  $ref ($digest) with $LOAD_TOOL${NS_SUFFIX}"
  else
    fail_image "$ref" "$LOAD_TOOL could not load $archive: $(printf '%s' "$out" | tail -n 5)"
  fi
}

# ---------------------------------------------------------------------------------- main

COMMAND='' DEST='' TOOL='' INSECURE=false WORKDIR='' NAMESPACE=k8s.io
while [ $# -gt 0 ]; do
  case $1 in
    -h|--help|help) usage; exit 0 ;;
    --tool=*) TOOL=${1#--tool=} ;;
    --tool) [ $# -ge 2 ] || die "$E_USAGE" "--tool needs a value"; TOOL=$2; shift ;;
    --insecure) INSECURE=true ;;
    --namespace=*) NAMESPACE=${1#--namespace=} ;;
    --workdir=*) WORKDIR=${1#--workdir=} ;;
    -*) err "unknown option $1"; usage >&2; exit "$E_USAGE" ;;
    *)
      if [ -z "$COMMAND" ]; then COMMAND=$1
      elif [ "$COMMAND" = push ] && [ -z "$DEST" ]; then DEST=${1%/}
      else err "unexpected argument $1"; usage >&2; exit "$E_USAGE"
      fi ;;
  esac
  shift
done

case $COMMAND in
  push|load|list|verify) ;;
  '') usage >&2; exit "$E_USAGE" ;;
  *) err "unknown command $COMMAND"; usage >&2; exit "$E_USAGE" ;;
esac
case $COMMAND:$TOOL in
  *:|push:docker|push:podman|push:skopeo|push:crane|load:ctr|load:nerdctl|load:docker) ;;
  push:*) die "$E_USAGE" "--tool=$TOOL cannot push; one of: docker podman skopeo crane" ;;
  load:*) die "$E_USAGE" "--tool=$TOOL cannot load; one of: ctr nerdctl docker" ;;
  *) die "$E_USAGE" "--tool is for push and load only" ;;
esac
if [ "$COMMAND" = push ]; then
  case $DEST in
    */*) ;;
    *) die "$E_USAGE" "push needs REGISTRY/PROJECT (e.g. registry.example.com:5000/lj-runtimekit), got '${DEST}'" ;;
  esac
fi

# Nothing happens before the payload is known to be the one this installer was built with.
check_payload
say "lj-runtimekit-k8s-images $VERSION: payload verified (sha256:$PAYLOAD_SHA256)"
if [ "$COMMAND" = list ]; then unpack images.list; else unpack; fi

case $COMMAND in
  list)
    printf '%-78s %-71s %10s  %s\n' IMAGE DIGEST BYTES ARCHIVE
    each_image list_one ;;
  verify)
    each_image verify_one
    finish verify
    say "verify: every image archive matches its checksum" ;;
  push)
    PUSH_TOOL=$(pick_tool docker podman skopeo crane) || exit $?
    INSECURE_FLAG=
    if $INSECURE; then
      case $PUSH_TOOL in
        crane) INSECURE_FLAG=--insecure ;;
        skopeo) INSECURE_FLAG=--dest-tls-verify=false ;;
        podman) INSECURE_FLAG=--tls-verify=false ;;
        docker) err "--insecure: docker pushes to plain HTTP only for registries in its daemon's insecure-registries" ;;
      esac
    fi
    say "pushing to $DEST with $PUSH_TOOL"
    each_image push_one
    finish push
    say "push: every image is in $DEST" ;;
  load)
    LOAD_TOOL=$(pick_tool ctr nerdctl docker) || exit $?
    NS_SUFFIX=
    [ "$LOAD_TOOL" = docker ] || NS_SUFFIX=" (namespace $NAMESPACE)"
    say "loading into this node with $LOAD_TOOL${NS_SUFFIX}"
    each_image load_one
    finish load
    say "load: every image is on this node" ;;
esac
exit 0
