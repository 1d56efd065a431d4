#!/usr/bin/env bash
# `make image`: build deploy/Containerfile here, with no container registry reachable.
#
# 1. The wheels of the runtime lock are built on this machine into deploy/wheels/.
# 2. A base image is made from Debian's packages (debootstrap bookworm with python3), once,
#    and imported as localhost/eai-base:bookworm; the mirror is the one apt uses here.
# 3. buildah builds the recipe unchanged with BASE=that image and PIP_NO_INDEX=1.
# Needs root, buildah and debootstrap (apt-get install buildah debootstrap).
set -euo pipefail
cd "$(dirname "$0")/.."
TAG=${EAI_IMAGE_TAG:-localhost/eai-tool-gateway:dev}
BASE_TAG=localhost/eai-base:bookworm-1
BUILDAH=(buildah --storage-driver vfs)
PY=${PY:-.venv/bin/python}

log() { printf '== %s\n' "$*"; }

log "wheels for the runtime lock (deploy/wheels)"
"$PY" -m pip wheel --quiet --no-deps -r deploy/requirements-runtime.lock -w deploy/wheels
# Requirements with an environment marker false here may hold in the image (Debian's
# Python is 3.11.2): fetch those too.
grep ';' deploy/requirements-runtime.lock | cut -d';' -f1 | xargs -r "$PY" -m pip download --quiet --no-deps -d deploy/wheels

if ! "${BUILDAH[@]}" inspect --type image "$BASE_TAG" >/dev/null 2>&1; then
  log "base image from Debian's packages ($BASE_TAG)"
  mirror=$(sed -n 's/^URIs: *\([^ ]*\/debian\)$/\1/p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -n1)
  [ -n "$mirror" ] || mirror=$(awk '/^deb /{print $2; exit}' /etc/apt/sources.list 2>/dev/null)
  root=$(mktemp -d)
  tarball=$(mktemp --suffix=.tar)
  trap 'rm -rf "$root" "$tarball"' EXIT
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates,libatomic1 \
    bookworm "$root" ${mirror:+"$mirror"} >/dev/null
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  ctr=$("${BUILDAH[@]}" from scratch)
  tar -C "$root" -cf "$tarball" .
  "${BUILDAH[@]}" add "$ctr" "$tarball" /
  "${BUILDAH[@]}" config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env LANG=C.UTF-8 --cmd /bin/sh "$ctr"
  "${BUILDAH[@]}" commit --quiet "$ctr" "$BASE_TAG" >/dev/null
  "${BUILDAH[@]}" rm "$ctr" >/dev/null
fi

log "image $TAG"
"${BUILDAH[@]}" bud --quiet --isolation chroot --layers=false --format docker \
  --build-arg BASE="$BASE_TAG" --build-arg PIP_NO_INDEX=1 \
  -t "$TAG" -f deploy/Containerfile .
"${BUILDAH[@]}" images --format '{{.Name}}:{{.Tag}} {{.Size}}' | grep -F "${TAG#localhost/}" || true
