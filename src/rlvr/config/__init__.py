"""One typed config tree for a run: YAML files plus dotted overrides.

    cfg = load_config("configs/demo.yaml", ["trainer.lr=1e-5", "steps=50"])

Every error (unknown key, bad value, missing file) is raised as `ConfigError` with one line
that names the key, the file and, for a misspelt key, the closest valid one — before
anything starts. Each area's sections live in a module of their own (model.py, rollout.py,
scoring.py, algorithm.py, trainer.py, run.py; the demo's and the server's in demo.py and
serve.py); a component receives only the sections it reads.
"""

from rlvr.config.algorithm import AlgorithmConfig, MaskedISConfig, OverlongPenaltyConfig, RatioBand, RejectionConfig
from rlvr.config.base import ConfigError, Section
from rlvr.config.demo import DemoSpec, ReadinessCheck, SyntheticTaskSpec, TinyModelSpec, WarmStartSpec
from rlvr.config.loading import config_to_run, dump_config, load_config, set_dotted, validate_config
from rlvr.config.model import ArchitectureEstimate, DataConfig, ModelConfig
from rlvr.config.rollout import EngineConfig, EnvConfig, RolloutConfig, SamplingConfig
from rlvr.config.run import CheckpointConfig, EvalConfig, PlacementConfig, RunConfig, TrackingConfig
from rlvr.config.scoring import RewardConfig, SandboxConfig
from rlvr.config.serve import LimitsConfig, ServeConfig, TenantConfig
from rlvr.config.trainer import LoraConfig, MegatronConfig, TrainerConfig

__all__ = [
    "AlgorithmConfig",
    "ArchitectureEstimate",
    "CheckpointConfig",
    "ConfigError",
    "DataConfig",
    "DemoSpec",
    "EngineConfig",
    "EnvConfig",
    "EvalConfig",
    "LimitsConfig",
    "LoraConfig",
    "MaskedISConfig",
    "MegatronConfig",
    "ModelConfig",
    "OverlongPenaltyConfig",
    "PlacementConfig",
    "RatioBand",
    "ReadinessCheck",
    "RejectionConfig",
    "RewardConfig",
    "RolloutConfig",
    "RunConfig",
    "SamplingConfig",
    "SandboxConfig",
    "Section",
    "ServeConfig",
    "SyntheticTaskSpec",
    "TenantConfig",
    "TinyModelSpec",
    "TrackingConfig",
    "TrainerConfig",
    "WarmStartSpec",
    "config_to_run",
    "dump_config",
    "load_config",
    "set_dotted",
    "validate_config",
]
