#!/usr/bin/env bash
# One portable build of llama.cpp, cached, serving both the shared inference process and the
# embedded model: print the path of the wanted artifact, building everything once when missing.
#
#   infra/llama/build.sh 0.3.36                       # -> .../bin/llama-server
#   infra/llama/build.sh 0.3.36 llama-bench           # (or llama-batched-bench)
#   infra/llama/build.sh 0.3.36 wheel                 # -> .../llama_cpp_python-0.3.36+arag.KEY-py3-none-linux_x86_64.whl
#   infra/llama/build.sh 0.3.36 dir                   # -> the build's cache directory (nothing built)
#
# Why one build: llama-cpp-python's own wheel build compiles llama.cpp (~5 min on 2 cores) and the
# server build compiled the same sources again (~5 min). Here CMake builds llama.cpp's shared
# libraries and its tools (llama-server, llama-bench, llama-batched-bench) once from the llama.cpp
# tree vendored in the llama-cpp-python sdist (pinned version and sha256), and the wheel is then
# built from that same sdist with `-DLLAMA_BUILD=OFF` (no compilation: the Python package only)
# with those very libraries placed in its `llama_cpp/lib`, where llama_cpp.py (and _ggml.py, which
# ignores LLAMA_CPP_LIB_PATH) load them from. So the wheel installs like any other and needs no
# environment variable at run time, and the server and the embedded model run the same binaries.
# (Building the tools inside the wheel's own CMake build instead would need llama-cpp-python's
# install rules to skip every tool it does not ship, and the tools copied out of its build tree.)
#
# Portable flags: the native build (GGML_NATIVE=ON, the default) crashes with SIGSEGV in the AMX
# kernel on the project's machines, so AVX2/FMA/F16C only. No web UI (its assets are downloaded
# otherwise), no HTTPS, no curl (loopback only; models are never downloaded by llama.cpp), no
# tests or examples; only the targets used are compiled. The libraries carry RUNPATH $ORIGIN and
# unversioned sonames, so the cache directory (tools and libraries side by side) is relocatable.
#
# Cache: $ARAG_CACHE/llama.cpp/VERSION-KEY/, KEY a hash of the sdist's sha256 and the build flags,
# so a change of either builds anew beside the old one and a warm machine never rebuilds (a hit
# takes milliseconds). If ccache is installed, compilations are cached in $ARAG_CACHE/ccache too
# (a build with other flags then recompiles only what they change). About 750 CPU-seconds: 6-7
# minutes on 2 idle cores (reports/setup/).
# Only the artifact's path goes to stdout; progress goes to stderr.
#
# Environment: ARAG_CACHE (default ~/.cache/adaptive-rag), LLAMA_CPP_SDIST (an already downloaded
# llama_cpp_python-VERSION.tar.gz, skips the download), LLAMA_BUILD_JOBS (default: the core
# count), LLAMA_BUILD_NICE (niceness of the compilation, default 10; 0 on a machine of your own).
set -euo pipefail
version="${1:?usage: build.sh LLAMA_CPP_PYTHON_VERSION [llama-server|llama-bench|llama-batched-bench|wheel|dir]}"
wanted="${2:-llama-server}"
TOOLS=(llama-server llama-bench llama-batched-bench)
# the libraries the Python package loads (libllama, libggml, libmtmd) and what they link
PY_LIBS=(libllama.so libggml.so libggml-base.so libggml-cpu.so libmtmd.so)
# sha256 of each pinned sdist (PyPI's digest); a version not listed is refused
declare -A SDIST_SHA256=(
  [0.3.36]=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
)
sha="${SDIST_SHA256[$version]:-}"
[[ -n "$sha" ]] || { echo "build.sh: no pinned sha256 for llama-cpp-python $version (add it to SDIST_SHA256)" >&2; exit 2; }
case "$wanted" in
  llama-server|llama-bench|llama-batched-bench|wheel|dir) ;;
  *) echo "build.sh: unknown artifact '$wanted' (${TOOLS[*]} wheel dir)" >&2; exit 2 ;;
esac

CMAKE_FLAGS=(
  -DCMAKE_BUILD_TYPE=Release
  -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
  -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF
  -DBUILD_SHARED_LIBS=ON -DCMAKE_PLATFORM_NO_VERSIONED_SONAME=ON
  -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON '-DCMAKE_INSTALL_RPATH=$ORIGIN'
  -DLLAMA_BUILD_COMMON=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF
  -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF
)
key="$(printf '%s\n' "$sha" "${CMAKE_FLAGS[@]}" "libs:${PY_LIBS[*]}" | sha256sum | cut -c1-12)"
root="${ARAG_CACHE:-$HOME/.cache/adaptive-rag}/llama.cpp"
dir="$root/${version}-${key}"

artifact() {
  case "$wanted" in
    dir) echo "$dir" ;;
    wheel) compgen -G "$dir/wheel/llama_cpp_python-${version}+arag.${key}-*.whl" | head -n 1 ;;
    *) echo "$dir/bin/$wanted" ;;
  esac
}
# complete (the marker is written last) and the server runs
cached() { [[ -f "$dir/.complete" ]] && "$dir/bin/llama-server" --version >/dev/null 2>&1; }

if [[ "$wanted" == dir ]] || cached; then
  artifact
  exit 0
fi

mkdir -p "$root"
# One build at a time per key (make setup and a test fixture may race).
exec 9>"$root/.${version}-${key}.lock"
flock 9
if cached; then
  artifact
  exit 0
fi

for tool in cmake c++ make; do
  command -v "$tool" >/dev/null || { echo "build.sh: '$tool' not found (apt-get install cmake g++ make)" >&2; exit 1; }
done

start=$SECONDS
echo "llama.cpp ${version} (${key}): one build of the libraries, ${TOOLS[*]} and the Python wheel (6-7 minutes on 2 idle cores, once)" >&2
tmp="$(mktemp -d "${TMPDIR:-/tmp}/arag-llama.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT

sdist="${LLAMA_CPP_SDIST:-}"
if [[ -z "$sdist" ]]; then
  # the sdist only (--no-binary for this package alone: its build requirements come as wheels, not
  # built from source one by one, which takes minutes without a warm pip cache)
  python -m pip download -q --no-deps --no-binary llama-cpp-python "llama-cpp-python==${version}" -d "$tmp" >&2
  sdist="$(compgen -G "$tmp/llama_cpp_python-${version}.tar.gz")"
fi
echo "$sha  $sdist" | sha256sum -c --quiet - >&2 || { echo "build.sh: $sdist does not match the pinned sha256" >&2; exit 1; }
tar -xzf "$sdist" -C "$tmp"
pkg="$tmp/llama_cpp_python-${version}"
src="$pkg/vendor/llama.cpp"
[[ -f "$src/tools/server/CMakeLists.txt" ]] || { echo "no tools/server in $sdist" >&2; exit 1; }

launcher=()
if command -v ccache >/dev/null; then
  export CCACHE_DIR="${ARAG_CACHE:-$HOME/.cache/adaptive-rag}/ccache"
  launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
cmake -S "$src" -B "$tmp/build" "${CMAKE_FLAGS[@]}" "${launcher[@]}" >"$tmp/configure.log" 2>&1 \
  || { tail -n 40 "$tmp/configure.log" >&2; exit 1; }
# llama-server and the benchmarks; the libraries they link (libllama, libggml*, libmtmd) with them
nice -n "${LLAMA_BUILD_NICE:-10}" cmake --build "$tmp/build" --target "${TOOLS[@]}" llama mtmd \
  -j "${LLAMA_BUILD_JOBS:-$(nproc)}" >"$tmp/build.log" 2>&1 || { tail -n 60 "$tmp/build.log" >&2; exit 1; }
built="$tmp/build/bin"
"$built/llama-server" --version >/dev/null 2>&1 \
  || { echo "built llama-server does not run:" >&2; "$built/llama-server" --version >&2 || true; exit 1; }
echo "llama.cpp ${version}: compiled in $((SECONDS - start)) s" >&2

# The Python package from the same sdist, without its own llama.cpp build, the libraries above in
# llama_cpp/lib. The sdist's .gitignore ignores every `lib/` directory, which scikit-build-core
# honours when it collects the package's files: the copy drops it.
mkdir -p "$pkg/llama_cpp/lib"
for lib in "${PY_LIBS[@]}"; do cp "$built/$lib" "$pkg/llama_cpp/lib/"; done
if (cd "$pkg/llama_cpp/lib" && ldd ./*.so | grep -q "not found"); then
  echo "build.sh: the Python package's libraries miss a dependency:" >&2
  (cd "$pkg/llama_cpp/lib" && ldd ./*.so | grep "not found") >&2
  exit 1
fi
rm -f "$pkg/.gitignore"
# A local version label names this build (0.3.36+arag.KEY still satisfies `==0.3.36`), so pip
# replaces a llama-cpp-python of the same release built elsewhere (or with other flags) instead
# of keeping it as "already installed".
sed -i "s/^__version__ = \"${version}\"\$/__version__ = \"${version}+arag.${key}\"/" "$pkg/llama_cpp/__init__.py"
grep -q "^__version__ = \"${version}+arag.${key}\"\$" "$pkg/llama_cpp/__init__.py" \
  || { echo "build.sh: no __version__ = \"${version}\" in llama_cpp/__init__.py" >&2; exit 1; }
CMAKE_ARGS="-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF" python -m pip wheel -q --no-deps --no-cache-dir "$pkg" \
  -w "$tmp/wheel" >&2
wheel="$(compgen -G "$tmp/wheel/llama_cpp_python-${version}+arag.${key}-*.whl")"
python - "$wheel" "${PY_LIBS[@]}" <<'EOF' || exit 1
import sys, zipfile
names = set(zipfile.ZipFile(sys.argv[1]).namelist())
missing = [lib for lib in sys.argv[2:] if f"llama_cpp/lib/{lib}" not in names]
if missing:
    sys.exit(f"build.sh: the wheel lacks {missing}")
EOF

# Into the cache: tools and every shared library they link, side by side (RUNPATH $ORIGIN); the
# directory is renamed into place whole, the marker last.
stage="$root/.${version}-${key}.partial"
rm -rf "$stage" "$dir"
mkdir -p "$stage/bin" "$stage/wheel"
for tool in "${TOOLS[@]}"; do cp "$built/$tool" "$stage/bin/"; done
cp "$built"/*.so "$stage/bin/"
cp "$wheel" "$stage/wheel/"
printf '%s\n' "llama-cpp-python ${version} sdist sha256 ${sha}" "${CMAKE_FLAGS[@]}" >"$stage/build-flags.txt"
mv "$stage" "$dir"
touch "$dir/.complete"
echo "llama.cpp ${version} (${key}): built in $((SECONDS - start)) s, cached in $dir" >&2
artifact
