#!/usr/bin/env bash
# Checks that xla_ffi/ follows .clang-format; with --fix, reformats it in place.
# Uses the clang-format on PATH (pip install "clang-format==23.1.5", as CI does: other
# versions can format a few constructs differently).
set -euo pipefail
cd "$(dirname "$0")/.."
files=(xla_ffi/*.cc xla_ffi/*.h)
if [ "${1:-}" = "--fix" ]; then
  clang-format -i "${files[@]}"
else
  clang-format --dry-run --Werror "${files[@]}"
  echo "clang_format.sh: ${#files[@]} files formatted as .clang-format says"
fi
