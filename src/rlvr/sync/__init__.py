"""Weight sync: the trainer's policy reaches the engine after every step, and is checked there.

    check.py     the stale-weight check: engine and trainer logprobs of a fixed probe must agree
    weights.py   `WeightSync`: push the adapter (or full weights), remember the adapter that
                 generated the rollouts still in flight, measure the gap, report sync/* metrics

What the engine does with what it receives (vLLM's in-memory adapter registration, the merged
reload on CPU) is the engine's business: rlvr.engines.
"""
