#!/usr/bin/env bash
# Build llama.cpp's `llama-server` once, portably, and cache the binary; print its path. The same
# build makes llama.cpp's own benchmarks, `llama-bench` and `llama-batched-bench`, cached beside it
# (the reference the lab's reader-limit experiment measures the service against).
#
#   infra/llama/build_server.sh 0.3.36      # -> $ARAG_CACHE/bin/llama-server-0.3.36
#   infra/llama/build_server.sh 0.3.36 llama-bench   # -> $ARAG_CACHE/bin/llama-bench-0.3.36
#
# The sources are the llama.cpp tree vendored in the llama-cpp-python sdist of that version (PyPI),
# so the server and the embedded model (`llama_cpp`, built by build_wheel.sh) run the same
# llama.cpp. Same portable flags as the wheel: the native build (GGML_NATIVE=ON, the default)
# crashes with SIGSEGV in the AMX kernel on the project's machines. The binary is static against
# ggml/llama (no shared libraries left in a build directory), without the web UI (its assets
# are downloaded from the network otherwise) and without HTTPS (loopback only).
# About 5-6 minutes on 2 cores the first time (niced), then a cache hit takes well under a second.
# Only the binary's path goes to stdout; progress goes to stderr.
#
# Environment: ARAG_CACHE (default ~/.cache/adaptive-rag), LLAMA_CPP_SDIST (an already
# downloaded llama_cpp_python-VERSION.tar.gz, skips the download), LLAMA_BUILD_JOBS (default 2).
set -euo pipefail
version="${1:?usage: build_server.sh LLAMA_CPP_PYTHON_VERSION [llama-server|llama-bench|llama-batched-bench]}"
wanted="${2:-llama-server}"
TOOLS=(llama-server llama-bench llama-batched-bench)
[[ " ${TOOLS[*]} " == *" $wanted "* ]] || { echo "build_server.sh: unknown tool '$wanted' (${TOOLS[*]})" >&2; exit 2; }
bindir="${ARAG_CACHE:-$HOME/.cache/adaptive-rag}/bin"
binary="$bindir/${wanted}-${version}"
mkdir -p "$bindir"

# The wanted tool is cached and runs (the server answers --version; the benchmarks --help).
cached() { [[ -x "$binary" ]] && { "$binary" --version >/dev/null 2>&1 || "$binary" --help >/dev/null 2>&1; }; }

if cached; then
  echo "$binary"
  exit 0
fi

# One build at a time per version (make llama-server and a test fixture may race).
exec 9>"$bindir/.llama-tools-${version}.lock"
flock 9
if cached; then
  echo "$binary"
  exit 0
fi

for tool in cmake c++ make; do
  command -v "$tool" >/dev/null || { echo "build_server.sh: '$tool' not found (apt-get install cmake g++ make, or pip install cmake)" >&2; exit 1; }
done

start=$SECONDS
echo "llama.cpp ${version} tools: building from the llama-cpp-python sdist (about 5-6 minutes, once)" >&2
tmp="$(mktemp -d "${TMPDIR:-/tmp}/arag-llama-server.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT

sdist="${LLAMA_CPP_SDIST:-}"
if [[ -z "$sdist" ]]; then
  python -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==${version}" -d "$tmp" >&2
  sdist="$(compgen -G "$tmp/llama_cpp_python-${version}.tar.gz")"
fi
tar -xzf "$sdist" -C "$tmp"
src="$tmp/llama_cpp_python-${version}/vendor/llama.cpp"
[[ -f "$src/tools/server/CMakeLists.txt" ]] || { echo "no tools/server in $sdist" >&2; exit 1; }

cmake -S "$src" -B "$tmp/build" -DCMAKE_BUILD_TYPE=Release \
  -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
  -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF \
  -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
  -DLLAMA_OPENSSL=OFF >"$tmp/configure.log" 2>&1 \
  || { tail -n 40 "$tmp/configure.log" >&2; exit 1; }
nice -n 10 cmake --build "$tmp/build" --target "${TOOLS[@]}" -j "${LLAMA_BUILD_JOBS:-2}" \
  >"$tmp/build.log" 2>&1 || { tail -n 60 "$tmp/build.log" >&2; exit 1; }

"$tmp/build/bin/llama-server" --version >/dev/null 2>&1 \
  || { echo "built llama-server does not run:" >&2; "$tmp/build/bin/llama-server" --version >&2 || true; exit 1; }
for tool in "${TOOLS[@]}"; do
  cp "$tmp/build/bin/$tool" "$bindir/${tool}-${version}.partial"
  mv -f "$bindir/${tool}-${version}.partial" "$bindir/${tool}-${version}"  # atomic: no half binary
done
echo "llama.cpp ${version} (${TOOLS[*]}): built in $((SECONDS - start)) s, cached" >&2
echo "$binary"
