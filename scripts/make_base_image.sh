#!/usr/bin/env bash
# Build a local Debian bookworm + python3.11 base image without any image registry.
#
#   sudo scripts/make_base_image.sh [TAG]            # default TAG: specdec-base:bookworm
#   docker build --build-arg PYTHON_IMAGE=specdec-base:bookworm -f docker/Dockerfile.cpu .
#
# debootstrap fetches Debian packages from DEBIAN_MIRROR (default deb.debian.org, or
# your mirror / apt proxy) into a directory; `docker import` turns that tree into an
# image. Needs root (debootstrap chroots), debootstrap and a docker engine. The image
# has python3.11 (+ venv, pip bootstrap), ca-certificates and nothing else: no
# compilers, no docs, no apt lists. It is the same base for the CPU image and the
# Redis image (redis-server then comes from Debian too, in docker/Dockerfile.redis).
set -euo pipefail

TAG="${1:-specdec-base:bookworm}"
SUITE="${DEBIAN_SUITE:-bookworm}"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
PACKAGES="python3.11,python3.11-venv,python3-distutils,python3-pip-whl,python3-setuptools-whl,ca-certificates"

for tool in debootstrap docker tar; do
  command -v "$tool" >/dev/null || { echo "make_base_image: $tool not found" >&2; exit 2; }
done
[ "$(id -u)" = 0 ] || { echo "make_base_image: debootstrap needs root" >&2; exit 2; }

root="$(mktemp -d /tmp/specdec-rootfs.XXXXXX)"
trap 'rm -rf "$root"' EXIT

debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$root" "$MIRROR"

# Slim the tree: apt caches and lists, docs, man pages, locales are not needed at run time.
chroot "$root" apt-get clean
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/* "$root"/var/log/* \
       "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/* \
       "$root"/usr/share/locale/* "$root"/tmp/*
# `python` and `python3` like the python:3.11 images.
ln -sf python3.11 "$root/usr/bin/python"
ln -sf python3.11 "$root/usr/bin/python3"

tar --numeric-owner -C "$root" -c . | docker import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'CMD ["python3.11"]' \
  --message "debootstrap $SUITE minbase + python3.11 from $MIRROR" \
  - "$TAG"
docker run --rm "$TAG" python --version
echo "make_base_image: built $TAG"
