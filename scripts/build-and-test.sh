#!/usr/bin/env bash
# Builds longattn with every part (warnings are errors) and runs all tests through CTest.
#
#   scripts/build-and-test.sh [build-dir (default build/test)] [extra CMake arguments...]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${1:-$root/build/test}
[ $# -gt 0 ] && shift
"$root/scripts/build.sh" "$build" -DLONGATTN_WARNINGS_AS_ERRORS=ON "$@"
ctest --test-dir "$build" --output-on-failure -j "$(nproc)"
