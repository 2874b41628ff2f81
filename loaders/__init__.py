"""Drop-in training loaders that keep DDP fed. Imports torch; never imports feedbench.

Available now: rank / world discovery and DistributedSampler-exact sharding (:mod:`loaders.dist`).
"""

from loaders.dist import DistInfo, discover, shard_indices

__all__ = ["DistInfo", "discover", "shard_indices"]
