#!/usr/bin/env bash
# The trainers judge the configs batchtune emits (tests marked `trainers`): verl's Hydra config,
# OpenRLHF's argparse flags, TRL's GRPOConfig. Their pins clash with the project's (verl 0.9.1:
# transformers<5.11; OpenRLHF 0.11.2: transformers==5.15.0; the project tests 5.24), and only their
# config code runs here, so they go into a venv of their own with --no-deps (docs/integrations.md).
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1
VENV="${TRAINERS_VENV:-${TMPDIR:-/tmp}/batchtune-trainers}"
python3 -m venv "$VENV"
PIP="$VENV/bin/python -m pip install -q"
$PIP "torch==2.13.0"  # the CPU wheel on local disk
$PIP -e . pytest pyyaml
$PIP --no-deps verl==0.9.1 openrlhf==0.11.2 hydra-core==1.3.8 omegaconf==2.3.0 antlr4-python3-runtime==4.9.3 \
    trl==1.16.0 accelerate
$PIP datasets  # TRL's AsyncGRPOConfig module imports it
# the flat (legacy_flags) names are judged by OpenRLHF 0.9.10's own train_ppo_ray.py, read from its
# wheel (not installed: one file, run as the test runs the current one)
LEGACY="$VENV/openrlhf-0.9.10"
"$VENV/bin/python" -m pip download -q --no-deps openrlhf==0.9.10 -d "$LEGACY"
"$VENV/bin/python" - "$LEGACY" <<'EOF'
import pathlib, sys, zipfile
out = pathlib.Path(sys.argv[1])
wheel = zipfile.ZipFile(next(out.glob("openrlhf-0.9.10-*.whl")))
name = next(n for n in wheel.namelist() if n.endswith("openrlhf/cli/train_ppo_ray.py"))
(out / "train_ppo_ray.py").write_bytes(wheel.read(name))
EOF
export OPENRLHF_LEGACY_CLI="$LEGACY/train_ppo_ray.py"
# run from an empty folder: a ray/ session folder in the working directory would shadow packages
cd "$(mktemp -d)"
"$VENV/bin/python" -m pytest -q -p no:cacheprovider --rootdir "$OLDPWD" -c "$OLDPWD/pyproject.toml" \
    -m trainers "$OLDPWD"/tests/integrations/test_packages_*.py
