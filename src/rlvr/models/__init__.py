"""Models: folders (HF and Mistral layouts), checkpoint files, MoE layers and routing, imports,
tiny builders, estimates, and building a causal LM through transformers (transformers_classes.py)."""
