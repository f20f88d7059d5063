#!/bin/sh
# pip in an image build, configured from build args (docker/Dockerfile.*, builder stages only).
#
# Empty PIP_INDEX_URL / PIP_EXTRA_INDEX_URL / PIP_TRUSTED_HOST build args are unset (pip
# would read an empty one as a value); /build-extra/ca.crt, when present, is the CA bundle
# for pip; /build-extra/wheels, when it holds wheels, is searched first.
set -eu
for name in PIP_INDEX_URL PIP_EXTRA_INDEX_URL PIP_TRUSTED_HOST; do
  eval "value=\${$name:-}"
  if [ -z "$value" ]; then unset "$name"; fi
done
if [ -s /build-extra/ca.crt ]; then
  export PIP_CERT=/build-extra/ca.crt
fi
if ls /build-extra/wheels/*.whl >/dev/null 2>&1; then
  export PIP_FIND_LINKS=/build-extra/wheels
fi
export PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
exec python -m pip "$@"
