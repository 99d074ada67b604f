"""Meshes (data, fsdp, tensor), multi-host start-up, and the logical → mesh sharding rules."""

from sera_jax.parallel.mesh import AXES, MeshConfig, activate, initialize_distributed, make_mesh
from sera_jax.parallel.rules import SAMPLE_RULES, TRAIN_RULES, check_divisible, mesh_spec, shardings

__all__ = ["AXES", "MeshConfig", "activate", "initialize_distributed", "make_mesh", "SAMPLE_RULES", "TRAIN_RULES",
           "check_divisible", "mesh_spec", "shardings"]
