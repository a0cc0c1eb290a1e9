"""Planning a run before anything starts: where each process goes (placement.py, which the Ray
backend reserves too), what each device holds (plan.py, from the model's shape in
architecture.py), how the cores of a CPU machine split (cpu_split.py), how long a step takes at
the accelerator's rates (step_time.py, accelerators.py), and the LoRA targets the engine applies
(lora.py). `--dry-run`, `rlvr serve`'s memory check and the rehearsal read it; none of it starts
a process."""
