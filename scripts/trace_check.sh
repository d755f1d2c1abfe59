#!/usr/bin/env bash
# Parse a trace (`timeslice replay --trace FILE.json`) with the Chrome DevTools performance
# panel's trace engine, at the exact version that scripts/trace_check/package-lock.json
# pins, and print what it found as JSON (scripts/trace_check/check.mjs says what). The
# first run installs the engine with `npm ci` into a cache folder named after that lock
# file; nothing is written into the tree. Needs Node.js 18 or later and npm.
#
#   scripts/trace_check.sh trace.json    # 1: the engine failed or dropped a slice
#                                        # 2: npm is missing or the install failed
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
pins="$root/scripts/trace_check"
if [ "$#" != 1 ]; then
  echo "usage: scripts/trace_check.sh TRACE.json" >&2
  exit 2
fi
trace=$(realpath "$1")
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "trace_check: Node.js and npm are not installed (apt-get install nodejs npm)" >&2
  exit 2
fi

lock_hash=$(sha256sum "$pins/package-lock.json" | cut -c 1-16)
tools="${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/timeslice/trace-check-$lock_hash"
if [ ! -f "$tools/node_modules/@paulirish/trace_engine/package.json" ]; then
  echo "installing the DevTools trace engine into $tools" >&2
  # Into a folder of its own first, so that an interrupted install is never taken for a whole one.
  mkdir -p "$(dirname "$tools")"
  partial=$(mktemp -d "$tools.partial.XXXXXX")
  trap 'rm -rf "$partial"' EXIT
  cp "$pins/package.json" "$pins/package-lock.json" "$partial/"
  if ! (cd "$partial" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error >&2); then
    echo "trace_check: npm ci failed" >&2
    exit 2
  fi
  rm -rf "$tools"
  mv -T "$partial" "$tools" 2>/dev/null || true  # another run may have just put it there
  trap - EXIT
  rm -rf "$partial"
fi
# check.mjs imports the engine, so it must sit beside node_modules.
cp "$pins/check.mjs" "$tools/check.mjs.$$"
mv -f "$tools/check.mjs.$$" "$tools/check.mjs"
exec node "$tools/check.mjs" "$trace"
