#!/bin/bash
# OpenRLHF launch flags (flat names of 0.9.x). Fails: LR not rescaled for 64 x 8 = 512 responses per rollout.
#   batchtune check examples/ci/openrlhf/train_ppo_ray_legacy.sh --results examples/ci/evidence/nqm
python3 -m openrlhf.cli.train_ppo_ray \
    --advantage_estimator group_norm \
    --rollout_batch_size 64 \
    --n_samples_per_prompt 8 \
    --train_batch_size 512 \
    --actor_learning_rate 0.48
