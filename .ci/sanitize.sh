#!/usr/bin/env bash
# The whole test suite against an AddressSanitizer + UndefinedBehaviorSanitizer build of
# the native module, failing on any report (issue 4).
#
# The sanitized build goes into its own virtual environment (system site packages
# visible, so jax/jaxlib/pytest/hypothesis come from the normal install); the normal
# install of jax_ext is left untouched. The build is the one `pip install` makes (build
# isolation pulls the pinned jax/jaxlib 0.10.2 for their FFI headers), so under a newer
# jax it is tested as the released wheels run there. Usage: .ci/sanitize.sh [extra pytest args]
# Env: PYTHON (the interpreter whose packages the suite uses, default python3),
# JAX_EXT_ASAN_VENV (default build/asan-venv-X.Y), HYPOTHESIS_PROFILE (default "ci").
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PYTHON:-python3}
PYVER=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
VENV=${JAX_EXT_ASAN_VENV:-$ROOT/build/asan-venv-$PYVER}
LOGDIR=$ROOT/build/asan-logs

if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv --system-site-packages "$VENV"
  # Where $PY is itself a virtual environment, --system-site-packages sees its base
  # interpreter, not it: its site-packages (jax, pytest, ...) are added by a .pth file.
  "$PY" - "$VENV" <<'PY'
import pathlib, site, sys, sysconfig
if sys.prefix != sys.base_prefix:
    rel = pathlib.Path(sysconfig.get_path("purelib")).relative_to(sys.prefix)
    pth = pathlib.Path(sys.argv[1]) / rel / "_outer_venv.pth"
    pth.write_text("\n".join(site.getsitepackages()) + "\n")
PY
fi
echo "sanitize.sh: building jax_ext with -fsanitize=address,undefined into $VENV"
JAX_EXT_SANITIZE=ON "$VENV/bin/python" -m pip install --quiet --no-deps \
  --force-reinstall -C "build-dir=build/asan-{wheel_tag}" "$ROOT"

# The module the venv imports must be the sanitized one.
SO=$(cd /tmp && "$VENV/bin/python" - <<'PY'
import importlib.util, pathlib
spec = importlib.util.find_spec("jax_ext")
d = pathlib.Path(spec.submodule_search_locations[0])
print(next(d.glob("_jax_ext*.so")))
PY
)
case "$SO" in "$VENV"/*) ;; *) echo "sanitize.sh: venv imports $SO, not its own build" >&2; exit 1;; esac
SYMS=$(nm -D "$SO")  # (not piped into grep -q: pipefail would see nm's SIGPIPE)
if ! grep -q '__asan_report_load' <<<"$SYMS"; then
  echo "sanitize.sh: $SO is not instrumented by ASan" >&2; exit 1
fi
if ! grep -q '__ubsan_handle' <<<"$SYMS"; then
  echo "sanitize.sh: $SO is not instrumented by UBSan" >&2; exit 1
fi
echo "sanitize.sh: testing $SO"

rm -rf "$LOGDIR" && mkdir -p "$LOGDIR"
export LD_PRELOAD="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libubsan.so)"
# detect_leaks with third-party suppressions (see .ci/lsan.supp); malloc_context_size=2
# keeps suppression matching to the direct caller of malloc; allocator_may_return_null:
# an impossible allocation fails as it does without ASan (XLA reports it) instead of
# aborting.
export ASAN_OPTIONS="detect_leaks=1:malloc_context_size=2:allocator_may_return_null=1:halt_on_error=1:log_exe_name=1:log_path=$LOGDIR/asan"
export LSAN_OPTIONS="suppressions=$ROOT/.ci/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:log_exe_name=1:log_path=$LOGDIR/ubsan"
export JAX_EXT_EXPECT_SANITIZED="$SO"  # tests/conftest.py asserts this module is loaded
export HYPOTHESIS_PROFILE=${HYPOTHESIS_PROFILE:-ci}

# -P: do not put the working directory on sys.path (it holds jax_ext/ without the
# compiled module). The suite runs from the repository root so conftest/helpers load.
set +e
"$VENV/bin/python" -P -m pytest -q -p no:cacheprovider tests "$@"
rc=$?
set -e
# Reports land in $LOGDIR/{asan,ubsan}.<exe>.<pid>. Only Python processes can load the
# module; other programs a test happens to spawn (git, run by hypothesis to write a
# patch file on a failure) inherit LD_PRELOAD too, and their own leaks are not ours.
shopt -s nullglob
others=("$LOGDIR"/*)
logs=()
for f in "$LOGDIR"/*.python*; do
  if grep -q 'ERROR: \|runtime error' "$f"; then logs+=("$f"); fi
done
for f in "${others[@]}"; do
  case "$f" in *.python*) ;; *) echo "sanitize.sh: ignoring a report from a non-Python process: $f" >&2;; esac
done
if [ "${#logs[@]}" -ne 0 ]; then
  echo "sanitize.sh: ${#logs[@]} sanitizer report(s):" >&2
  for f in "${logs[@]}"; do echo "=== $f" >&2; head -80 "$f" >&2; done
  exit 1
fi
if [ "$rc" -ne 0 ]; then
  echo "sanitize.sh: pytest failed under the sanitizers (exit $rc)" >&2
  exit "$rc"
fi
echo "sanitize.sh: OK, no sanitizer reports"
