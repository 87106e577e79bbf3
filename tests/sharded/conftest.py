"""Shared fixtures for the jgraph.sharded tests: the 8-device mesh, partitioned graphs, and
a hand-made partition book with unequal (and one empty) partitions.

Compiles dominate the cost of these tests, so each module builds its jitted functions
once (module-level, cached) and feeds them many inputs of the same shapes.
"""
import jax
import numpy as np
import pytest

from jgraph.data import Graph, load_dataset
from jgraph.partition import PartitionBook, open_partitions, partition_graph
from jgraph.sharded import make_mesh

# Partition sizes of the hand-made book: unequal, partition 1 empty, partition 4 large
# enough that a whole batch of distinct ids can go to it.
UNEQUAL_SIZES = (5, 0, 12, 7, 70, 3, 9, 16)


def homogeneous_book(sizes) -> PartitionBook:
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    return PartitionBook(offsets, np.stack([offsets[:-1], offsets[1:]], axis=1), ("_N",))


@pytest.fixture(scope="session")
def mesh():
    assert len(jax.devices()) == 8, "tests/conftest.py should give 8 CPU devices"
    return make_mesh(8)


@pytest.fixture(scope="session")
def unequal_book():
    return homogeneous_book(UNEQUAL_SIZES)


@pytest.fixture(scope="session")
def cora():
    return load_dataset("cora")


@pytest.fixture(scope="session")
def cora_parts8(cora, tmp_path_factory):
    """cora METIS-partitioned into 8 parts (one per device), opened."""
    out = tmp_path_factory.mktemp("cora8") / "parts"
    partition_graph(cora, 8, "metis", out)
    return open_partitions(out)


@pytest.fixture(scope="session")
def cora_parts4(cora, tmp_path_factory):
    out = tmp_path_factory.mktemp("cora4") / "parts"
    partition_graph(cora, 4, "random", out)
    return open_partitions(out)


def two_type_graph() -> Graph:
    """users and items, features on both, a train split on users."""
    rng = np.random.default_rng(7)
    num_nodes = {"user": 30, "item": 21}
    edges = {("user", "buys", "item"): np.stack([rng.integers(0, 30, 80), rng.integers(0, 21, 80)]),
             ("item", "bought-by", "user"): np.stack([rng.integers(0, 21, 60),
                                                      rng.integers(0, 30, 60)])}
    node_data = {"user": {"feat": rng.normal(size=(30, 3)).astype(np.float32)},
                 "item": {"feat": rng.normal(size=(21, 2)).astype(np.float32)}}
    splits = {"user": {"train": np.sort(rng.choice(30, 12, replace=False))}}
    return Graph(name="two", num_nodes=num_nodes, edges=edges, node_data=node_data,
                 splits=splits)


@pytest.fixture(scope="session")
def hetero_parts8(tmp_path_factory):
    """(graph, opened 8-part partition directory) of a two-node-type graph."""
    graph = two_type_graph()
    out = tmp_path_factory.mktemp("hetero8") / "parts"
    partition_graph(graph, 8, "random", out)
    return graph, open_partitions(out)
