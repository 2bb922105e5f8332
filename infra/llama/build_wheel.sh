#!/usr/bin/env bash
# Build llama-cpp-python portably once and cache the wheel.
# The native build (GGML_NATIVE=ON, the default) crashes with SIGSEGV in the AMX kernel on the
# project's machines, so the wheel is built for AVX2/FMA/F16C only. ~5 minutes on 2 cores; the
# wheel is cached under $ARAG_CACHE (default ~/.cache/adaptive-rag) so later setups take seconds.
set -euo pipefail
version="${1:?llama-cpp-python version}"
cache="${ARAG_CACHE:-$HOME/.cache/adaptive-rag}/wheels"
mkdir -p "$cache"
if compgen -G "$cache/llama_cpp_python-${version}-*.whl" >/dev/null; then
  echo "llama-cpp-python ${version}: cached wheel in $cache"
  exit 0
fi
echo "llama-cpp-python ${version}: building a portable wheel (about 5 minutes, once)"
export CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
export CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
python -m pip wheel --no-deps --no-cache-dir "llama-cpp-python==${version}" -w "$tmp"
mv "$tmp"/llama_cpp_python-*.whl "$cache/"
echo "llama-cpp-python ${version}: wheel cached in $cache"
