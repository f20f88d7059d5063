#!/usr/bin/env bash
# Build the pinned llama-cpp-python from its sdist, portable, once per machine; print the wheel's path.
#
#   scripts/build_llamacpp.sh            # the wheel (cached under $SPECDEC_WHEEL_CACHE)
#   scripts/build_llamacpp.sh server     # also llama.cpp's own llama-server from the same sources (bench anchor)
#
# Portable: GGML_NATIVE=OFF, and the CPU kernels built as runtime-loaded variants (GGML_BACKEND_DL +
# GGML_CPU_ALL_VARIANTS): at start ggml loads the best variant the CPU supports, so one build runs on
# AMD and Intel alike. The x86 variant list is trimmed to what x86 servers run (LLAMACPP_CPU_VARIANTS;
# every variant is another compile of ggml's CPU kernels): x64 (any x86-64), haswell (AVX2: Intel since
# 2013, AMD Zen 1-3), skylakex (AVX-512: Skylake-SP, Cascade Lake), icelake (AVX-512 VBMI/VNNI: Ice Lake),
# zen4 (those + AVX-512 BF16: AMD Zen 4/5, Intel Sapphire Rapids and later). The AMX variant is left out on
# purpose: llama.cpp's AMX matmul crashed on an Intel Xeon VM with AMX (the zen4 variant serves those CPUs).
set -euo pipefail

VERSION="${LLAMACPP_VERSION:-0.3.36}"
VARIANTS="${LLAMACPP_CPU_VARIANTS:-x64 haswell skylakex icelake zen4}"
PYTHON="${PYTHON:-python3}"
CACHE="${SPECDEC_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/specdec/wheels}"
FLAVOR="$VERSION-$(echo "$VARIANTS" | tr ' ' '_')"
OUT="$CACHE/llama-cpp-python-$FLAVOR"
JOBS="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"

log() { echo "build_llamacpp: $*" >&2; }

unpack() {  # the pinned sdist, its x86 variant list trimmed; prints the source folder
    local work="$1"
    "$PYTHON" -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$work" >&2
    tar -xzf "$work"/llama_cpp_python-"$VERSION".tar.gz -C "$work"
    local src="$work/llama_cpp_python-$VERSION"
    local lists="$src/vendor/llama.cpp/ggml/src/CMakeLists.txt"
    local keep="${VARIANTS// /|}"
    # x86 variants are one `ggml_add_cpu_backend_variant(NAME FEATURES...)` line each: drop the others.
    sed -i -E "/ggml_add_cpu_backend_variant\((x64|sse42|sandybridge|ivybridge|piledriver|haswell|skylakex|cannonlake|cascadelake|icelake|cooperlake|zen4|alderlake|sapphirerapids)[ )]/{/\((${keep})[ )]/!d}" "$lists"
    # libcommon serves only the multimodal helper, which is not built here.
    sed -i 's/set(LLAMA_BUILD_COMMON ON CACHE BOOL "Build llama.cpp common library" FORCE)/set(LLAMA_BUILD_COMMON OFF CACHE BOOL "" FORCE)/' "$src/CMakeLists.txt"
    echo "$src"
}

build_wheel() {
    local work src
    work="$(mktemp -d)"
    trap 'rm -rf "$work"' RETURN
    src="$(unpack "$work")"
    log "building llama-cpp-python $VERSION (CPU variants: $VARIANTS) into $OUT"
    mkdir -p "$OUT.partial"
    CMAKE_BUILD_PARALLEL_LEVEL="$JOBS" CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON \
        -DCMAKE_INSTALL_BINDIR=llama_cpp/lib -DCMAKE_INSTALL_LIBDIR=llama_cpp/lib -DLLAVA_BUILD=OFF -DGGML_CCACHE=OFF" \
        "$PYTHON" -m pip wheel -q --no-deps -w "$OUT.partial" "$src" >&2
    rm -rf "$OUT" && mv "$OUT.partial" "$OUT"
}

build_server() {  # llama.cpp's own server, same sources and variants: bin/llama-server beside its backends
    local dest="$CACHE/llama-server-$FLAVOR"
    [ -x "$dest/bin/llama-server" ] && { echo "$dest/bin/llama-server"; return; }
    local work src
    work="$(mktemp -d)"
    trap 'rm -rf "$work"' RETURN
    src="$(unpack "$work")/vendor/llama.cpp"
    log "building llama-server (CPU variants: $VARIANTS) into $dest"
    cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DGGML_BACKEND_DL=ON \
        -DGGML_CPU_ALL_VARIANTS=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_EXAMPLES=OFF -DGGML_CCACHE=OFF -DCMAKE_BUILD_RPATH='$ORIGIN' >&2
    cmake --build "$work/build" --target llama-server -j "$JOBS" >&2
    mkdir -p "$dest" && cp -r "$work/build/bin" "$dest/"
    echo "$dest/bin/llama-server"
}

if [ "${1:-}" = "server" ]; then
    build_server
    exit
fi
if ! ls "$OUT"/llama_cpp_python-"$VERSION"-*.whl >/dev/null 2>&1; then
    build_wheel
fi
ls "$OUT"/llama_cpp_python-"$VERSION"-*.whl
