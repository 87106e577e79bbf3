"""What the layer tests share."""
import numpy as np
import pytest


def random_neighbourhood(rng, n_src, n_dst, width):
    """(nbr int32[n_dst, width] (-1 where masked), mask): random slots into n_src rows,
    with a node that has no neighbour (0) and one with every slot filled (1)."""
    nbr = rng.integers(0, n_src, (n_dst, width)).astype(np.int32)
    mask = rng.random((n_dst, width)) < 0.6
    mask[0] = False
    mask[1] = True
    return np.where(mask, nbr, -1), mask


@pytest.fixture(name="random_neighbourhood")
def random_neighbourhood_fixture():
    return random_neighbourhood
