"""Your own graph as tables: a small shop written as CSV (or Parquet) files with your ids.

    python examples/own_tables.py data/shop [--format parquet]

Writes what a user of a graph database or a data warehouse exports: `items.csv` (an
item's id such as "sku-0042", 8 feature columns, its category as a word, empty where
unknown), `users-0.csv` and `users-1.csv` (ids such as "u-7f3a"), `buys-*.csv` (user id,
item id, quantity) and `follows.csv` (user id, user id), and `schema.yaml`, which tells
`jgraph convert` what each file and column is. Items of a category share a feature
direction and are bought by the same users, so a model can learn the category from
both. docs/own-graph.md walks these tables through convert, partition, train and embed.
Prints (into data/shop):

    wrote 200 items, 300 users, 2,400 purchases, 900 follows (csv) and data/shop/schema.yaml
"""
import argparse
import csv
import os

import numpy as np

CATEGORIES = ["books", "garden", "music", "toys"]

SCHEMA = """\
name: shop
nodes:
  - type: item
    files: items.{ext}
    id: sku
    features: [f0, f1, f2, f3, f4, f5, f6, f7]
    label: {{column: category, classes: [books, garden, music, toys]}}
    split: {{fractions: [0.6, 0.2, 0.2], seed: 0}}
  - type: user
    files: users-*.{ext}
    id: user
edges:
  - relation: [user, buys, item]
    files: buys-*.{ext}
    source: user
    destination: sku
  - relation: [user, follows, user]
    files: follows.{ext}
    source: follower
    destination: followed
"""


def tables(seed: int = 0) -> dict:
    """{file stem: (header, rows)} of the shop."""
    rng = np.random.default_rng(seed)
    n_items, n_users = 200, 300
    items = [f"sku-{k:04d}" for k in rng.permutation(10_000)[:n_items]]
    users = [f"u-{k:04x}" for k in rng.permutation(65_536)[:n_users]]
    category = rng.integers(0, len(CATEGORIES), n_items)
    taste = rng.integers(0, len(CATEGORIES), n_users)          # a user's favourite
    directions = rng.standard_normal((len(CATEGORIES), 8))
    feat = directions[category] + 1.5 * rng.standard_normal((n_items, 8))
    item_rows = [[items[i], *np.round(feat[i], 4).tolist(),
                  "" if i % 9 == 4 else CATEGORIES[category[i]]] for i in range(n_items)]
    buys = []
    for u in range(n_users):
        liked = np.flatnonzero(category == taste[u])
        for i in rng.choice(liked, 6, replace=False).tolist() + \
                rng.integers(0, n_items, 2).tolist():
            buys.append([users[u], items[i], int(rng.integers(1, 4))])
    # Three others a user follows (drawn among the other users: no one follows itself).
    follows = [[users[u], users[v + (v >= u)]] for u in range(n_users)
               for v in rng.choice(n_users - 1, 3, replace=False).tolist()]
    return {"items": (["sku", *(f"f{j}" for j in range(8)), "category"], item_rows),
            "users-0": (["user"], [[u] for u in users[:150]]),
            "users-1": (["user"], [[u] for u in users[150:]]),
            "buys-0": (["user", "sku", "quantity"], buys[:1200]),
            "buys-1": (["user", "sku", "quantity"], buys[1200:]),
            "follows": (["follower", "followed"], follows)}


def write(out: str, fmt: str) -> str:
    """Write the tables and schema.yaml under `out`; returns the schema's path."""
    os.makedirs(out, exist_ok=True)
    ext = "csv" if fmt == "csv" else "parquet"
    for stem, (header, rows) in tables().items():
        path = os.path.join(out, f"{stem}.{ext}")
        if fmt == "csv":
            with open(path, "w", newline="") as f:
                csv.writer(f).writerows([header, *rows])
        else:
            import pyarrow as pa
            import pyarrow.parquet as pq
            columns = list(zip(*rows))
            pq.write_table(pa.table({name: [None if v == "" else v for v in column]
                                     for name, column in zip(header, columns)}), path)
    schema = os.path.join(out, "schema.yaml")
    with open(schema, "w") as f:
        f.write(SCHEMA.format(ext=ext))
    return schema


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", default="data/shop")
    parser.add_argument("--format", choices=["csv", "parquet"], default="csv")
    args = parser.parse_args()
    schema = write(args.out, args.format)
    t = tables()
    count = lambda prefix: sum(len(rows) for stem, (_, rows) in t.items()
                               if stem.startswith(prefix))
    print(f"wrote {count('items'):,} items, {count('users'):,} users, {count('buys'):,} "
          f"purchases, {count('follows'):,} follows ({args.format}) and {schema}")


if __name__ == "__main__":
    main()
