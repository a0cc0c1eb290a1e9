"""The rollout stage: dataset rows become prompts, prompts become scored, weighed rollouts.

prompts.py   the one prompt encoder (training, `rlvr eval` and the demo all use it)
sampler.py   the seeded epoch order the training prompts are drawn in
collect.py   one step's rollouts: generate -> score -> advantages -> TrainBatch
async_groups.py  rollout.mode async: groups generated ahead, the policy pushed in flight, admitted by staleness
"""
