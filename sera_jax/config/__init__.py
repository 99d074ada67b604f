"""The run configuration: schema (``schema.py``), loading (``load.py``), cross-field validation (``validate.py``)."""

from sera_jax.config.errors import MissingPath, UserError
from sera_jax.config.load import from_dict, load_config, parse_override, split_cli
from sera_jax.config.schema import (
                                    BatchSection,
                                    ConfigError,
                                    EndpointSection,
                                    EnvSection,
                                    EvalSection,
                                    JudgeSection,
                                    MethodSection,
                                    ModelSection,
                                    RolloutSection,
                                    RoleSection,
                                    RolesSection,
                                    RunConfig,
                                    TrainSection,
                                    WarmStartSection,
)
from sera_jax.config.validate import check_mesh, validate

__all__ = ["ConfigError", "ModelSection", "MethodSection", "EnvSection", "RolloutSection", "BatchSection",
           "TrainSection", "JudgeSection", "EndpointSection", "EvalSection", "WarmStartSection", "RoleSection", "RolesSection", "RunConfig", "load_config", "from_dict",
           "parse_override", "split_cli", "validate", "check_mesh", "UserError", "MissingPath"]
