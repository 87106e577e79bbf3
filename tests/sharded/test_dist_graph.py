"""DistGraph / ShardedGraph against the partition files they load, and the mesh checks:
one partition per device, each process loading only its own partitions."""
import re

import jax
import numpy as np
import pytest

from jgraph.sharded import DistGraph, MeshError, check_parts, local_parts, make_mesh, shard_rows


@pytest.fixture(scope="module")
def dg(cora_parts8, mesh):
    return DistGraph(cora_parts8, mesh)


def blocks(array, num_parts=8):
    """Device k's block of a row-sharded array, k = 0..P-1."""
    return np.asarray(array).reshape(num_parts, -1, *array.shape[1:])


def test_sharded_graph_blocks_equal_the_partition_files_with_documented_padding(dg, cora_parts8):
    g, pg = dg.graph, cora_parts8
    sizes = pg.book.part_sizes()
    edges = [p.num_edges for p in pg.meta.parts]
    n, e = int(sizes.max()), int(max(edges))
    assert (g.num_nodes, g.nodes_per_part, g.edges_per_part, g.num_relations) == (2708, n, e, 1)
    np.testing.assert_array_equal(np.asarray(g.offsets), pg.book.offsets)
    np.testing.assert_array_equal(dg.book.offsets, pg.book.offsets)
    indptr, indices, etype = blocks(g.indptr), blocks(g.indices), blocks(g.etype)
    edge_mask, in_degree, node_mask = blocks(g.edge_mask), blocks(g.in_degree), blocks(g.node_mask)
    assert indptr.shape == (8, n + 1) and indices.shape == (8, e) and node_mask.shape == (8, n)
    for k in range(8):
        part = pg.part(k)
        m, ek = int(sizes[k]), edges[k]
        np.testing.assert_array_equal(indptr[k, :m + 1], part.indptr)
        assert np.all(indptr[k, m + 1:] == ek)                       # padding nodes: no edges
        np.testing.assert_array_equal(indices[k, :ek], part.indices)
        assert np.all(indices[k, ek:] == -1)
        np.testing.assert_array_equal(etype[k, :ek], part.etype)
        assert np.all(etype[k, ek:] == -1)
        assert np.all(edge_mask[k, :ek]) and not np.any(edge_mask[k, ek:])
        np.testing.assert_array_equal(in_degree[k, :m], np.diff(part.indptr))
        assert np.all(in_degree[k, m:] == 0)
        assert np.all(node_mask[k, :m]) and not np.any(node_mask[k, m:])
    assert sizes.min() < n                            # some partition really is padded


def test_device_k_holds_block_k_of_every_row_sharded_array(dg, mesh):
    for array in (dg.graph.indptr, dg.graph.indices, dg.graph.node_mask):
        per = array.shape[0] // 8
        whole = np.asarray(array)
        for shard in array.addressable_shards:
            k = list(mesh.devices.flat).index(shard.device)
            assert shard.index[0].start == k * per
            np.testing.assert_array_equal(np.asarray(shard.data), whole[k * per:(k + 1) * per])


def test_ndata_rows_in_row_order_are_the_original_features_permuted_by_node_map(dg, cora,
                                                                                 cora_parts8):
    node_map = np.asarray(cora_parts8.node_map())
    feat = dg.ndata("feat")
    np.testing.assert_array_equal(feat.to_numpy(), cora.node_data["_N"]["feat"][node_map])
    label = dg.ndata("label")
    np.testing.assert_array_equal(label.to_numpy(), cora.node_data["_N"]["label"][node_map])
    # Padding rows of each block are zeros.
    sizes = dg.book.part_sizes()
    padded = blocks(feat.array)
    for k in range(8):
        assert not np.any(padded[k, sizes[k]:])


@pytest.mark.parametrize("split", ["train", "val", "test"])
def test_split_mask_marks_exactly_the_split_nodes(dg, cora, cora_parts8, split):
    expected = np.zeros(2708, bool)
    expected[cora_parts8.to_new("_N", cora.splits["_N"][split])] = True
    mask = dg.split_mask(split)
    assert mask.dtype == bool
    np.testing.assert_array_equal(mask.to_numpy(), expected)


def test_degrees_equal_the_original_graph_degrees_relabelled(dg, cora, cora_parts8):
    src, dst, _ = cora.homogeneous_edges()
    node_map = np.asarray(cora_parts8.node_map())
    in_deg, out_deg = dg.degrees()
    np.testing.assert_array_equal(in_deg, np.bincount(dst, minlength=2708)[node_map])
    np.testing.assert_array_equal(out_deg, np.bincount(src, minlength=2708)[node_map])


def test_hetero_ndata_and_split_mask_address_rows_by_type_local_id(hetero_parts8, mesh):
    graph, pg = hetero_parts8
    dg = DistGraph(pg, mesh)
    node_map = np.asarray(pg.node_map())
    orig_offsets = graph.type_offsets()
    for t, ntype in enumerate(graph.node_types):
        layout = dg.layout(ntype)
        # Row r of the type is global id to_global(r): original node node_map[that].
        orig = node_map[pg.book.to_global(ntype, np.arange(layout.num_rows))] - orig_offsets[t]
        np.testing.assert_array_equal(dg.ndata("feat", ntype).to_numpy(),
                                      graph.node_data[ntype]["feat"][orig])
    train = graph.splits["user"]["train"]
    _, local = pg.book.to_type_local(pg.to_new("user", train))
    expected = np.zeros(graph.num_nodes["user"], bool)
    expected[local] = True
    np.testing.assert_array_equal(dg.split_mask("train", "user").to_numpy(), expected)
    with pytest.raises(KeyError, match="ntype"):
        dg.ndata("feat")                      # two node types: which one?


# -- the mesh --------------------------------------------------------------------------------


def test_four_partitions_on_eight_devices_is_a_mesh_error_naming_both_counts(cora_parts4, mesh):
    with pytest.raises(MeshError) as err:
        DistGraph(cora_parts4, mesh)
    msg = str(err.value)
    assert re.search(r"\b4 partition", msg) and re.search(r"\b8 cpu device", msg), msg
    assert "--num-parts 8" in msg


def test_make_mesh_with_a_partition_count_unequal_to_the_devices_is_a_mesh_error():
    with pytest.raises(MeshError, match=r"\b3 partition.*\b8 cpu device"):
        make_mesh(num_parts=3)
    with pytest.raises(MeshError, match=r"\b8 partition.*\b4 cpu device"):
        check_parts(8, make_mesh(devices=jax.devices()[:4]))
    assert make_mesh(num_parts=8).size == 8


def test_four_partitions_load_on_a_four_device_mesh(cora_parts4):
    mesh4 = make_mesh(4, devices=jax.devices()[4:])
    dg = DistGraph(cora_parts4, mesh4)
    assert local_parts(mesh4) == [0, 1, 2, 3]
    sizes = cora_parts4.book.part_sizes()
    node_mask = blocks(dg.graph.node_mask, 4)
    assert [int(node_mask[k].sum()) for k in range(4)] == sizes.tolist()


def test_single_process_owns_every_partition_and_loads_each_exactly_once(mesh):
    assert local_parts(mesh) == list(range(8))
    calls = []

    def load(k):
        calls.append(k)
        return np.full((k % 3, 2), k, np.int32)       # unequal blocks, some empty

    array = shard_rows(mesh, 2, (2,), np.int32, load, fill=-1)
    assert sorted(calls) == local_parts(mesh)
    got = blocks(array)
    for k in range(8):
        np.testing.assert_array_equal(got[k], np.where(np.arange(2)[:, None] < k % 3, k, -1)
                                      * np.ones((2, 2), np.int32))


def test_shard_rows_follows_mesh_order_not_device_ids():
    devices = jax.devices()[::-1]
    mesh = make_mesh(devices=devices)
    assert local_parts(mesh) == list(range(8))
    array = shard_rows(mesh, 1, (), np.int32, lambda k: np.array([k]))
    for shard in array.addressable_shards:
        assert int(np.asarray(shard.data)[0]) == devices.index(shard.device)


def test_shard_rows_rejects_a_block_larger_than_rows_per_part(mesh):
    with pytest.raises(MeshError, match="partition 0"):
        shard_rows(mesh, 2, (), np.int32, lambda k: np.zeros(3, np.int32))
