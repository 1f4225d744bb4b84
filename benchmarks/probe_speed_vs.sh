#!/usr/bin/env bash
# The NQM probe (`batchtune probe recipes/nqm.toml`, fresh results directory each run) timed side by side
# against the same command at another commit, in turn (A B A B ...), with the ratio taken pair by pair.
# Needs `farm-bench` (this project's development machine has it) and git.
#
#   bash benchmarks/probe_speed_vs.sh REV [RUNS] > benchmarks/out/probe_speed_vs_REV.txt
set -euo pipefail
rev="${1:?usage: probe_speed_vs.sh REV [RUNS]}"
runs="${2:-5}"
repo="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d)"
trap 'git -C "$repo" worktree remove --force "$work/base" >/dev/null 2>&1; rm -rf "$work"' EXIT
git -C "$repo" worktree add -q --detach "$work/base" "$rev"
echo "# A = batchtune probe recipes/nqm.toml at $(git -C "$repo" log -1 --format=%h)$(git -C "$repo" diff --quiet HEAD -- batchtune || echo ' + uncommitted changes'), B = the same at $(git -C "$repo" log -1 --format=%h "$rev"); $(nproc) cores, load $(cut -d' ' -f1 /proc/loadavg) at start"
# `python -m batchtune` from each tree's root imports that tree's package.
farm-bench -n "$runs" --warmup 1 --timeout 1800 \
    --vs "sh -c 'cd $work/base && rm -rf $work/b && python -m batchtune probe recipes/nqm.toml --results $work/b >/dev/null 2>&1'" \
    -- sh -c "cd $repo && rm -rf $work/a && python -m batchtune probe recipes/nqm.toml --results $work/a >/dev/null 2>&1"
