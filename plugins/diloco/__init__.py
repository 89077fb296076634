"""The DiLoCo family: replicas that train apart for many inner steps and sync what moved."""
