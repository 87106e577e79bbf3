"""The ways in for a user's own data: converted once into jgraph's chunked graph.

`jgraph convert SPEC OUT` is this package. What it reads and how:

  tables      CSV / Parquet files that a schema file describes (`schema.py`), read a
              batch at a time (`table_reader.py`), the user's ids kept (`tables.py`:
              `convert_tables`)
  DGL         DGL's and GraphStorm's chunked graph format: its metadata.json checked
              against its files (`dgl_metadata.py`), then converted a block at a time
              (`dgl.py`: `convert_dgl`)
  datasets    anything `jgraph.data.load_dataset` reads; an OGB directory streamed a
              chunk at a time (`convert.py`: `convert`, which also dispatches to DGL's)

Every route writes a chunked graph directory (`jgraph.data.chunked`), the one format
that partitioning and everything after it read, with memory bounded by the batch and
the chunk, not the graph. Nothing here imports pyarrow or JAX until a conversion
starts.
"""
# `convert` itself is imported from jgraph.ingest.convert: a package attribute of that
# name would hide the module (`import jgraph.ingest.convert as m` would give the function).
from jgraph.ingest.dgl import convert_dgl
from jgraph.ingest.schema import Schema, is_schema_file, load_schema
from jgraph.ingest.tables import convert_tables

__all__ = ["Schema", "convert_dgl", "convert_tables", "is_schema_file", "load_schema"]
