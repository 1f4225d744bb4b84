#!/bin/bash
# verl launch script after a review doubled rollout.n and left everything else alone.
# Fails: the LR was not rescaled for 32 x 16 = 512 responses (the batch passes: it ties the pick, 256).
#   batchtune check examples/ci/verl/train_doubled_n.sh --results examples/ci/evidence/nqm
python3 -m verl.trainer.main_ppo \
    data.train_batch_size=32 \
    actor_rollout_ref.rollout.n=16 \
    actor_rollout_ref.actor.ppo_mini_batch_size=32 \
    actor_rollout_ref.actor.optim.lr=0.96 \
    actor_rollout_ref.rollout.max_num_seqs=256 \
    trainer.n_gpus_per_node=8 trainer.nnodes=1
