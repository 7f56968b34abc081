#!/usr/bin/env bash
# Compiles and links the C++ extension against another torch's headers and libraries, here,
# without installing it: for the GPU machine's torch (2.11 by default), which has no network.
#
#   scripts/build_against_torch.sh [VERSION [CACHE_DIR]]   # default 2.11.0 ~/.cache/hoccl
#
# Downloads that torch wheel without its dependencies into a cache outside the repository
# (CACHE_DIR/torch-VERSION), unpacks its headers and libraries, compiles every
# core source with the flags setup.py uses (at -O0: a compile check, not a build to run), links
# the objects into a shared library, and reports:
#   - the torch C++ symbols the library needs that the other torch's libraries do not define;
#   - which c10d headers hoccl includes differ from the installed torch's, file by file.
# Not part of CI (it downloads ~500 MB the first time). Exit status: 0 when everything compiled
# and every needed torch symbol exists in the other version.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=${1:-2.11.0}
PY=${PYTHON:-python3}
CACHE="${2:-$HOME/.cache/hoccl}/torch-$VERSION"
mkdir -p "$CACHE"

wheel=$(ls "$CACHE"/torch-"$VERSION"-*.whl 2>/dev/null | head -1 || true)
if [ -z "$wheel" ]; then
  echo "downloading torch $VERSION (no dependencies) into $CACHE"
  $PY -m pip download -q "torch==$VERSION" --no-deps --only-binary=:all: -d "$CACHE"
  wheel=$(ls "$CACHE"/torch-"$VERSION"-*.whl | head -1)
fi
root="$CACHE/unpacked"
if [ ! -d "$root/torch/include" ]; then
  echo "unpacking the headers and libraries of $(basename "$wheel")"
  $PY - "$wheel" "$root" <<'PY'
import sys, zipfile
wheel, root = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    z.extractall(root, [n for n in z.namelist() if n.startswith(("torch/include/", "torch/lib/"))])
PY
fi

inc="$root/torch/include"
lib="$root/torch/lib"
# The other torch's C++ ABI: its libraries' std::string symbols are std::__cxx11 ones or not
# (grep -c, not -q: under pipefail an early exit of grep would fail nm with SIGPIPE).
abi=0
if [ "$(nm -D --defined-only "$lib/libc10.so" | grep -c cxx11 || true)" -gt 0 ]; then abi=1; fi
cuda_flags=()
for dir in "${CUDA_HOME:-}" /usr/local/cuda /usr; do
  if [ -n "$dir" ] && [ -f "$dir/include/cuda.h" ]; then cuda_flags=(-DHOCCL_WITH_CUDA=1 -I"$dir/include"); break; fi
done
py_inc=$($PY -c "import sysconfig; print(sysconfig.get_paths()['include'])")
out="$CACHE/build"
rm -rf "$out"
mkdir -p "$out"
flags=(-O0 -std=c++17 -fPIC -fvisibility=hidden -Wall -Wno-unused-parameter -D_GLIBCXX_USE_CXX11_ABI=$abi
       -DTORCH_API_INCLUDE_EXTENSION_H -DTORCH_EXTENSION_NAME=_C -D_GNU_SOURCE
       -Icuda -I"$inc" -I"$inc/torch/csrc/api/include" -I"$py_inc" "${cuda_flags[@]}")
echo "compiling $(find cuda -name '*.cpp' | wc -l) sources against torch $VERSION (CXX11 ABI $abi${cuda_flags:+, with CUDA})"
export out
printf '%s\n' "${flags[@]}" > "$out/flags"
find cuda -name '*.cpp' | sort | xargs -P "${MAX_JOBS:-2}" -I{} sh -c \
  'o="$out/$(echo {} | tr / _).o"; g++ $(cat "$out/flags") -c {} -o "$o" 2> "$o.log" || { echo "FAILED: {}"; cat "$o.log"; exit 255; }'
g++ -shared -o "$out/_C.so" "$out"/*.o -L"$lib" -lc10 -ltorch_cpu -ltorch -ltorch_python -ldl -lrt
echo "compiled and linked: $out/_C.so"

# Torch symbols the library needs, against what the other torch's libraries define.
torch_only() {  # mangled names whose demangled form is in a torch namespace
  while read -r m; do
    d=$(echo "$m" | c++filt)
    if echo "$d" | grep -qE '^((vtable|typeinfo|typeinfo name) for )?(c10|c10d|at|torch)::'; then echo "$m"; fi
  done
}
needed=$(nm -D --undefined-only "$out/_C.so" | awk '{print $2}' | grep '^_Z' | grep -v '@' | sort -u | torch_only)
defined=$(for l in libc10.so libtorch_cpu.so libtorch.so libtorch_python.so; do
            nm -D --defined-only "$lib/$l" | awk '{print $3}'; done | sort -u)
missing=$(comm -23 <(echo "$needed") <(echo "$defined"))
echo "torch symbols needed: $(echo "$needed" | wc -l); missing from torch $VERSION: $(echo -n "$missing" | grep -c . || true)"
if [ -n "$missing" ]; then echo "$missing" | c++filt | sed 's/^/  missing: /'; fi

# What differs in the c10d headers hoccl includes, against the installed torch.
here=$($PY -c "import os, torch; print(os.path.join(os.path.dirname(torch.__file__), 'include'))")
here_version=$($PY -c "import torch; print(torch.__version__)")
echo "c10d headers hoccl includes that differ between torch $here_version and $VERSION:"
for h in $(grep -rhoE '#include <torch/csrc/distributed/c10d/[A-Za-z_]+\.hpp>' cuda | sort -u | sed 's/#include <//; s/>//'); do
  if ! cmp -s "$here/$h" "$inc/$h"; then
    echo "  $h: $(diff "$here/$h" "$inc/$h" | grep -c '^[<>]') lines differ"
  fi
done
[ -z "$missing" ]
