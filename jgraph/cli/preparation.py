"""The flags of a graph's preparation (`jgraph.data.prepare.Preparation`), shared by
`jgraph partition` and `jgraph convert`: one flag per step, in the order the steps run,
and the link prediction split (`jgraph partition` only)."""
from __future__ import annotations

import argparse

from jgraph.data import GraphError
from jgraph.data.prepare import HeldOut, Preparation

# {step: (flag, help)} of the steps that a switch asks for; the other steps
# (held_out, normalize_features) take values.
SWITCHES = {
    "remove_self_loops": ("--remove-self-loops", "drop self-loop edges"),
    "symmetrize": ("--symmetrize",
                   "add every edge's reverse and deduplicate (same-type relations)"),
    "reverse_relations": ("--add-reverse",
                          "add a reverse relation rev_<name> for every relation"),
    "dedup": ("--dedup", "drop duplicate edges"),
    "self_loops": ("--self-loops", "give every node one self-loop (same-type relations)"),
}


def add_flags(parser: argparse.ArgumentParser, *, link: bool, note: str = "") -> None:
    """The preparation's flags on `parser`; `link`: with --link-split and its settings.
    `note` ends each switch's help (how the command applies it)."""
    for step, (flag, help_text) in SWITCHES.items():
        parser.add_argument(flag, dest=step, action="store_true", help=help_text + note)
    parser.add_argument("--normalize-features", nargs="?", const="feat", metavar="NAME",
                        help="scale each row of node array NAME (default feat) to sum 1")
    if not link:
        return
    parser.add_argument("--link-split", metavar="VAL,TEST",
                        help="for link prediction: hold out these fractions of each "
                             "relation's edges as val and test positives (after "
                             "--remove-self-loops, before the other steps; pairs if the "
                             "graph is or is made undirected) and store them with the "
                             "partition, as `jgraph train` with task: link does "
                             "(link.val_fraction, link.test_fraction)")
    parser.add_argument("--eval-negatives", type=int,
                        help="with --link-split: fixed negatives per val/test positive "
                             "(default: 1000)")
    parser.add_argument("--split-seed", type=int,
                        help="with --link-split: seeds the held-out edges and their "
                             "negatives (default: 0)")


def from_args(args: argparse.Namespace) -> Preparation:
    """The preparation the flags of `add_flags` ask for."""
    held_out = None
    if hasattr(args, "link_split"):
        fractions = link_fractions(args.link_split)
        given = [f for f, v in (("--eval-negatives", args.eval_negatives),
                                ("--split-seed", args.split_seed)) if v is not None]
        if fractions is None and given:
            raise GraphError(f"{' and '.join(given)} only apply with --link-split VAL,TEST")
        if fractions is not None:
            held_out = HeldOut(*fractions, eval_negatives=(HeldOut.eval_negatives
                                                           if args.eval_negatives is None
                                                           else args.eval_negatives),
                               seed=args.split_seed or 0)
    return Preparation(held_out=held_out, normalize_features=args.normalize_features,
                       **{step: getattr(args, step) for step in SWITCHES})


def asked_flags(preparation: Preparation) -> list[str]:
    """The flags that ask for `preparation`'s steps, for messages."""
    flags = {**{step: flag for step, (flag, _) in SWITCHES.items()},
             "held_out": "--link-split", "normalize_features": "--normalize-features"}
    return [flags[step] for step in preparation.steps]


def link_fractions(text: str | None) -> tuple[float, float] | None:
    """--link-split VAL,TEST as two fractions, or None."""
    if text is None:
        return None
    try:
        val, test = (float(x) for x in text.split(","))
    except ValueError:
        raise GraphError(f"--link-split {text!r}: give two fractions VAL,TEST, e.g. "
                         f"0.1,0.1") from None
    return val, test
