"""The project's counter-based random numbers: a 32-bit hash of (key, counter).

Every random choice jgraph makes on the device (the sampler's neighbour draws, the
loader's shuffle, the checkpoints' fingerprints) is `hash32(key, counter)` of a key
derived from the run's seed and what is being drawn, so a result depends on its key
alone: not on the device, the batch position or the mesh size.
"""
from __future__ import annotations

import jax.numpy as jnp

_GOLDEN = 0x9E3779B9


def fmix32(h: jnp.ndarray) -> jnp.ndarray:
    """MurmurHash3's 32-bit finaliser: a bijection of uint32 with full avalanche."""
    h = h ^ (h >> 16)
    h = h * jnp.uint32(0x85EBCA6B)
    h = h ^ (h >> 13)
    h = h * jnp.uint32(0xC2B2AE35)
    return h ^ (h >> 16)


def hash32(key: jnp.ndarray, counter) -> jnp.ndarray:
    """uint32 hash of (key, counter): the counter-based random stream of one key."""
    return fmix32(key + jnp.uint32(_GOLDEN) * (jnp.asarray(counter, jnp.uint32) + 1))
