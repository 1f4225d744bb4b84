#!/bin/bash
# OpenRLHF launch flags (0.10.2 names). Passes.
#   batchtune check examples/ci/openrlhf/train_ppo_ray.sh --results examples/ci/evidence/nqm
python3 -m openrlhf.cli.train_ppo_ray \
    --algo.advantage.estimator group_norm \
    --rollout.batch_size 16 \
    --rollout.n_samples_per_prompt 8 \
    --train.batch_size 128 \
    --actor.adam.lr 0.48
