#!/usr/bin/env bash
# Makes keel's demo corpus: the English text of Debian's `fortunes` package (about 2.5 MB,
# installed by scripts/install-deps.sh), tokenized byte by byte into llm.c shards.
#   scripts/make-demo-data.sh [DIR]     # default DIR: data/demo
# Idempotent: does nothing when DIR already holds train and val shards. Finds
# keel-prepare-data in $KEEL_BUILD_DIR/bin, else build/bin.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-data/demo}
fortunes=/usr/share/games/fortunes

if compgen -G "$out/train_*.bin" >/dev/null && compgen -G "$out/val_*.bin" >/dev/null; then
  echo "make-demo-data: $out already holds shards; nothing to do"
  exit 0
fi

tool=""
for dir in ${KEEL_BUILD_DIR:+"$KEEL_BUILD_DIR/bin"} "$root/build/bin"; do
  if [ -x "$dir/keel-prepare-data" ]; then
    tool="$dir/keel-prepare-data"
    break
  fi
done
if [ -z "$tool" ]; then
  echo "make-demo-data: keel-prepare-data not found in \${KEEL_BUILD_DIR:-unset}/bin or" \
       "$root/build/bin; build keel first (scripts/build.sh)" >&2
  exit 1
fi
if [ ! -d "$fortunes" ]; then
  echo "make-demo-data: $fortunes is missing; install Debian's fortunes package" \
       "(scripts/install-deps.sh)" >&2
  exit 1
fi

# The text files, following symlinks, in name order; *.dat are strfile's binary indexes, and
# the *.u8 links point at files already listed, so each file is read once by its real path.
declare -A seen=()
files=()
while IFS= read -r -d '' f; do
  case "$f" in *.dat) continue ;; esac
  real=$(readlink -f "$f")
  [ -n "${seen[$real]:-}" ] && continue
  seen[$real]=1
  files+=("$real")
done < <(find -L "$fortunes" -maxdepth 1 -type f -print0 | LC_ALL=C sort -z)
if [ ${#files[@]} -eq 0 ]; then
  echo "make-demo-data: no text files in $fortunes" >&2
  exit 1
fi

mkdir -p "$out"
"$tool" --out "$out" --val-fraction 0.1 "${files[@]}"
