#!/usr/bin/env bash
# Build the specdec images with the plain `docker build` (no buildx, no BuildKit frontend
# image, nothing from Docker Hub when BASE_IMAGE is local).
#
#   scripts/build_images.sh                 # specdec-cpu:dev and specdec-redis:dev
#
# Environment (all optional):
#   BASE_IMAGE        python3.11 base (default specdec-base:bookworm, made by
#                     scripts/make_base_image.sh when missing and MAKE_BASE=1, the default)
#   TAG               image tag (default dev)
#   BUILD_CA_BUNDLE   CA bundle for pip (default: pip's configured `cert`, if any)
#   BUILD_WHEELHOUSE  directories of wheels, space-separated (default: pip's `find-links`)
#   TORCH_INDEX_URL   (default empty: torch from the wheelhouse / index)
#   PIP_INDEX_URL PIP_EXTRA_INDEX_URL PIP_TRUSTED_HOST APT_MIRROR   passed as build args
#   TIMINGS           file to write {"image": seconds} build times to (JSON)
# Only http(s) index URLs are passed on: a file:// index of this host means nothing in a build.
set -euo pipefail
cd "$(dirname "$0")/.."

BASE_IMAGE="${BASE_IMAGE:-specdec-base:bookworm}"
TAG="${TAG:-dev}"
EXTRA=docker/build-extra
PIP="${PIP:-python3 -m pip}"

pip_config() {  # first value of a pip config key (global / user / site / env), or empty
  $PIP config list 2>/dev/null | sed -n "s/^[^.]*\.$1='\(.*\)'$/\1/p" | head -n1
}
http_only() { tr ' ' '\n' <<<"$1" | grep -E '^https?://' | paste -sd' ' - || true; }

if ! docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
  if [ "${MAKE_BASE:-1}" = 1 ] && [ "$BASE_IMAGE" = specdec-base:bookworm ]; then
    scripts/make_base_image.sh "$BASE_IMAGE"
  else
    echo "build_images: base image $BASE_IMAGE not found" >&2; exit 2
  fi
fi

# Machine-specific inputs go to docker/build-extra (gitignored), read by the builder stage.
find "$EXTRA" -mindepth 1 ! -name README.md ! -name .gitignore -exec rm -rf {} +
ca="${BUILD_CA_BUNDLE-$(pip_config cert)}"
if [ -n "$ca" ]; then cp "$ca" "$EXTRA/ca.crt"; fi
mkdir -p "$EXTRA/wheels"
for dir in ${BUILD_WHEELHOUSE-$(pip_config find-links)}; do
  dir="${dir#file://}"
  [ -d "$dir" ] || continue
  for wheel in "$dir"/*.whl; do
    [ -e "$wheel" ] && { ln -f "$wheel" "$EXTRA/wheels/" 2>/dev/null || cp "$wheel" "$EXTRA/wheels/"; }
  done
done
# llama.cpp's engine: the portable llama-cpp-python wheel (scripts/build_llamacpp.sh, cached per machine) goes into
# the wheelhouse, so the image's pip installs it instead of building llama.cpp natively from the sdist.
llama_wheel="$(scripts/build_llamacpp.sh)"
cp "$llama_wheel" "$EXTRA/wheels/"
echo "build_images: base $BASE_IMAGE, CA bundle ${ca:-none}, wheels: $(ls "$EXTRA/wheels" | wc -l)"

args=(--build-arg "PYTHON_IMAGE=$BASE_IMAGE"
      --build-arg "TORCH_INDEX_URL=${TORCH_INDEX_URL:-}"
      --build-arg "PIP_INDEX_URL=$(http_only "${PIP_INDEX_URL:-}")"
      --build-arg "PIP_EXTRA_INDEX_URL=$(http_only "${PIP_EXTRA_INDEX_URL:-}")"
      --build-arg "PIP_TRUSTED_HOST=${PIP_TRUSTED_HOST:-}")
timings="{}"
build() {  # name dockerfile extra-args...
  local name="$1" file="$2" start end; shift 2
  start=$(date +%s)
  DOCKER_BUILDKIT=0 docker build --pull=false -f "$file" -t "specdec-$name:$TAG" "$@" .
  end=$(date +%s)
  timings=$(python3 -c 'import json,sys; d=json.loads(sys.argv[1]); d[sys.argv[2]]=int(sys.argv[3]); print(json.dumps(d))' \
            "$timings" "specdec-$name:$TAG" "$((end - start))")
}
build redis docker/Dockerfile.redis --build-arg "PYTHON_IMAGE=$BASE_IMAGE" --build-arg "APT_MIRROR=${APT_MIRROR:-}"
build cpu docker/Dockerfile.cpu "${args[@]}"
find "$EXTRA" -mindepth 1 ! -name README.md ! -name .gitignore -exec rm -rf {} +
if [ -n "${TIMINGS:-}" ]; then echo "$timings" > "$TIMINGS"; fi
echo "build_images: $timings"
