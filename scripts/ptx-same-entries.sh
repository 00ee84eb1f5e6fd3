#!/usr/bin/env bash
# Compares the kernel entries of two PTX builds (e.g. main's and a branch's
# target/ptx/halo_kernels.sm_90.ptx): every entry of OLD must have the same body in NEW, ignoring
# comments and basic-block label numbers (which shift when entries are added). Prints each entry's
# verdict and the entries only NEW has; exits 1 if any entry of OLD changed or disappeared.
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: $0 OLD.ptx NEW.ptx" >&2; exit 2; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
split() { # one normalised file per .entry body
  mkdir -p "$2"
  awk -v out="$2" '/\.entry |\.func /{ if (name != "") close(out "/" name); name = ""
      if ($0 ~ /\.entry /) { n = $0; sub(/.*\.entry /, "", n); sub(/\(.*/, "", n); gsub(/ /, "", n); name = n }; next }
    { if (name != "") { gsub(/\$L__BB[0-9]+_/, "$L__BB_"); sub(/[ \t]*\/\/.*$/, ""); if ($0 !~ /^[ \t]*$/) print > (out "/" name) } }' "$1"
}
split "$1" "$tmp/old"; split "$2" "$tmp/new"
bad=0
for f in "$tmp"/old/*; do
  n=$(basename "$f")
  if [ ! -f "$tmp/new/$n" ]; then echo "MISSING $n"; bad=1
  elif cmp -s "$f" "$tmp/new/$n"; then echo "same    $n"
  else echo "CHANGED $n"; bad=1; fi
done
for f in "$tmp"/new/*; do [ -f "$tmp/old/$(basename "$f")" ] || echo "new     $(basename "$f")"; done
exit $bad
