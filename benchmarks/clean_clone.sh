#!/usr/bin/env bash
# README's first command, literally, on a fresh clone in a fresh venv: install time, `batchtune tune`
# wall time, and the lines a newcomer reads (critical batch, recommendation, probe cost).
#
#   bash benchmarks/clean_clone.sh > benchmarks/out/clean_clone.txt
#
# It also writes what `batchtune tune` printed, whole, to benchmarks/out/clean_clone_tune.txt: the
# output block README.md quotes is that file, so README shows what a newcomer's terminal shows.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
git clone -q "$repo" "$work/batchtune"
python3 -m venv "$work/venv"
# shellcheck disable=SC1091
source "$work/venv/bin/activate"
export PIP_DISABLE_PIP_VERSION_CHECK=1
cd "$work/batchtune"
echo "# clean clone of $(git log -1 --format='%h %cs'), fresh venv; $(nproc) cores, load $(cut -d' ' -f1 /proc/loadavg) at start"
t0=$(date +%s)
pip install -q torch==2.13.0 >/dev/null 2>&1 && pip install -q -e . >/dev/null 2>&1
t1=$(date +%s)
COLUMNS=110 batchtune tune > "$work/tune.txt" 2>&1
t2=$(date +%s)
{
    echo "\$ batchtune tune    # clean clone of $(git log -1 --format='%h'), $(nproc) cores; tune took $((t2 - t1)) s"
    cat "$work/tune.txt"
} > "$repo/benchmarks/out/clean_clone_tune.txt"
echo "README command: pip install torch==2.13.0 && pip install -e . && batchtune tune"
echo "install: $((t1 - t0)) s; batchtune tune: $((t2 - t1)) s"
grep -m1 -E "^Critical training batch" "$work/tune.txt"
grep -m1 -E "^│ P[0-9]+xG[0-9]+:" "$work/tune.txt" | sed 's/^│ /Recommended: /; s/ *│$//'
grep -A2 -E "^Probe cost" "$work/tune.txt"  # rich wraps it at the terminal width
