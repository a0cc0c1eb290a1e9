"""trainer.backend=megatron: megatron-core's GPTModel as the policy, split by tensor and expert
parallel, converted from the HF folder; the only package that imports megatron."""
