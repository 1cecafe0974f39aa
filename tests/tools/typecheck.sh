#!/usr/bin/env bash
# mypy --strict over the whole tree, one run per group. Test folders hold top-level modules
# (conftest.py, test_settings.py) whose names repeat across components, so each component, and
# each folder of cross-component tests, is checked on its own.
set -euo pipefail
cd "$(dirname "$0")/../.."
MYPY=${MYPY:-.venv/bin/mypy}
# mypy's incremental cache outside the clone, like the binaries (a fresh clone rechecks only what
# changed: each entry holds its source's hash and the mypy version and options that made it).
export MYPY_CACHE_DIR=${MYPY_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/lj-runtimekit/mypy}

run() {
  echo "mypy: $*"
  "$MYPY" "$@"
}

run proto/src tests/src
for c in components/*/; do
  c=${c%/}
  paths=("$c/src")
  [[ -d $c/tests ]] && paths+=("$c/tests")
  [[ -d $c/bench ]] && paths+=("$c/bench")
  run "${paths[@]}"
done
for d in tests/*/; do
  d=${d%/}
  case $d in tests/src | tests/cluster | tests/tools | tests/inventories) continue ;; esac
  if compgen -G "$d/*.py" >/dev/null; then run "$d"; fi
done
