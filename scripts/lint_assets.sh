#!/usr/bin/env bash
# Lint the replay page's script and style (timeslice/replay/assets) with ESLint and
# Stylelint, at the exact versions that scripts/lint_assets/package-lock.json pins.
# The first run installs them with `npm ci` into a cache folder named after that lock
# file; nothing is written into the tree. Needs Node.js 18.18 or later and npm.
#
#   scripts/lint_assets.sh    # exit status 1 if either linter reports a problem
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
pins="$root/scripts/lint_assets"
if ! command -v npm >/dev/null; then
  echo "lint_assets: npm is not installed (apt-get install nodejs npm)" >&2
  exit 2
fi

lock_hash=$(sha256sum "$pins/package-lock.json" | cut -c 1-16)
tools="${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/timeslice/lint-assets-$lock_hash"
if [ ! -x "$tools/node_modules/.bin/eslint" ] || [ ! -x "$tools/node_modules/.bin/stylelint" ]; then
  echo "installing the asset linters into $tools"
  # Into a folder of its own first, so that an interrupted install is never taken for a whole one.
  mkdir -p "$(dirname "$tools")"
  partial=$(mktemp -d "$tools.partial.XXXXXX")
  trap 'rm -rf "$partial"' EXIT
  cp "$pins/package.json" "$pins/package-lock.json" "$partial/"
  (cd "$partial" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error)
  rm -rf "$tools"
  mv "$partial" "$tools"
  trap - EXIT
fi
# The configs import the linters' own packages, so they must sit beside node_modules.
cp "$pins/eslint.config.mjs" "$pins/stylelint.config.mjs" "$tools/"

cd "$root"
status=0
"$tools/node_modules/.bin/eslint" --config "$tools/eslint.config.mjs" --max-warnings 0 \
  timeslice/replay/assets/*.js || status=1
"$tools/node_modules/.bin/stylelint" --config "$tools/stylelint.config.mjs" --max-warnings 0 \
  timeslice/replay/assets/*.css || status=1
if [ "$status" = 0 ]; then
  echo "the replay page's script and style pass ESLint and Stylelint"
fi
exit "$status"
