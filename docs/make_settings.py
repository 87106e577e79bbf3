"""Write `docs/settings.md`, the reference of every experiment setting, from the config
dataclasses themselves, so that it cannot drift from them (from the repository's root):

    python docs/make_settings.py docs/settings.md      # write it
    python docs/make_settings.py                       # print it

Each row is one field of `jgraph.Experiment` or of one of its sections: its key as YAML
files and `--set` name it, its type (an enum's choices), its default, and its note from
the class docstring, where each note starts with the field's name and a colon
("path: a built-in name ...", several names sharing one: "hidden, num_layers: ...").
`tests/test_docs.py` regenerates the page and fails when the committed one differs.
"""
from __future__ import annotations

import dataclasses
import enum
import inspect
import re
import sys
import types
import typing

import jgraph  # the config classes by their public names only (jgraph.Experiment, ...)

GENERATOR = "python docs/make_settings.py docs/settings.md"

# Notes for fields that their class's docstring does not describe yet (by key). Move
# each into the docstring and drop it here: `tests/test_docs.py` fails while a note
# stands here for a field that the docstring now describes.
SUPPLEMENT = {
    "model.heads": "GAT's attention heads; a hidden layer concatenates their rows, so "
                   "model.hidden is heads x the per-head width.",
    "model.out_heads": "GAT's heads in the output layer, averaged.",
    "model.attn_dropout": "GAT's dropout of the attention weights.",
    "model.negative_slope": "GAT's LeakyReLU slope in the attention scores.",
    "model.residual": "GAT: add a residual connection to each layer.",
}


def sections() -> list[tuple[str, type]]:
    """("", Experiment) for the top-level keys, then (name, class) of each section."""
    hints = typing.get_type_hints(jgraph.Experiment)
    return [("", jgraph.Experiment)] + [
        (f.name, hints[f.name]) for f in dataclasses.fields(jgraph.Experiment)
        if dataclasses.is_dataclass(hints[f.name])]


def docstring_notes(cls: type) -> tuple[str, dict[str, tuple[list[str], str]]]:
    """(the text before the first note, {field: (the names its note starts with, the
    note)}) of a config class's docstring.

    A note starts where one or more field names followed by ": " begin the docstring,
    a line, or a sentence (after ". " or "; "), and runs to the next note."""
    names = sorted((f.name for f in dataclasses.fields(cls)), key=len, reverse=True)
    name = "|".join(map(re.escape, names))
    text = " ".join(inspect.cleandoc(cls.__doc__ or "").split())
    text = re.sub(r"^Fields: ", "", text)
    heads = list(re.finditer(rf"(?:^|(?<=\. )|(?<=; ))((?:{name})(?:, (?:{name}))*): ", text))
    notes = {}
    for head, following in zip(heads, [*heads[1:], None]):
        note = text[head.end():following.start() if following else len(text)].strip()
        group = head[1].split(", ")
        for field in group:
            notes[field] = (group, note.rstrip(";"))
    return text[:heads[0].start()].strip() if heads else text, notes


def type_name(kind) -> str:
    """A field's type as a YAML user reads it."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return " or ".join(type_name(a) for a in inner) + " or null"
    if origin is tuple:
        return f"list of {type_name(args[0])}"
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return "one of " + ", ".join(f"`{m.value}`" for m in kind)
    return {str: "string", int: "int", float: "float", bool: "bool"}.get(kind, str(kind))


def yaml_value(value) -> str:
    """A default as YAML writes it."""
    if isinstance(value, enum.Enum):
        value = value.value
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return "[" + ", ".join(yaml_value(v) for v in value) + "]"
    if value == "":
        return '""'
    return str(value)


def field_notes() -> dict[str, str]:
    """{key: note} for every setting: its docstring note (that of the first of a group
    of names sharing one, "see" it for the others), a pointer to the note that names it
    ("see train.calibrate_capacities"), or its SUPPLEMENT entry."""
    notes = {}
    for section, cls in sections():
        prefix = f"{section}." if section else ""
        _, own = docstring_notes(cls)
        for f in dataclasses.fields(cls):
            if dataclasses.is_dataclass(typing.get_type_hints(cls)[f.name]):
                continue
            key = prefix + f.name
            if f.name in own:
                group, note = own[f.name]
                notes[key] = (note if len(group) == 1 else f"see `{prefix}{group[0]}`."
                              if f.name != group[0] else f"{', '.join(group)}: {note}")
            elif key in SUPPLEMENT:
                notes[key] = SUPPLEMENT[key]
            else:
                named_in = [k for k, (_, note) in own.items()
                            if re.search(rf"\b{f.name}\b", note)]
                notes[key] = f"see `{prefix}{named_in[0]}`." if named_in else ""
    return notes


def render() -> str:
    """The whole page."""
    notes = field_notes()
    _, experiment_notes = docstring_notes(jgraph.Experiment)
    out = [
        "# Settings",
        "",
        f"<!-- Generated by `{GENERATOR}` from the config dataclasses' docstrings: edit "
        "those and run it again (tests/test_docs.py checks this page is current). -->",
        "",
        "Every setting of an experiment, as a YAML config file (`experiments/*.yaml`) or "
        "`--set section.key=value` names it. A config sets some of them; the rest keep the "
        "defaults below. An unknown key, or a value of the wrong type or out of range, "
        "stops the run with one line naming the key. The same sections configure "
        "`jgraph bench` ([benchmarks.md](benchmarks.md)). From Python they are "
        "`jgraph.Experiment` and its sections "
        + ", ".join(f"`jgraph.{cls.__name__}`" for s, cls in sections() if s) + ".",
        "",
        "```text",
        "jgraph train experiments/sage_cora.yaml --set model.hidden=128 "
        "train.fanouts=[15,10] exchange.cache=0.1",
        "```",
        "",
    ]
    for section, cls in sections():
        hints = typing.get_type_hints(cls)
        intro, _ = docstring_notes(cls)
        title = f"`{section}`" if section else "Top level"
        out += [f"## {title}", ""]
        group, about = experiment_notes.get(section, ([], "")) if section else ([], "")
        intro = intro or (about if len(group) == 1 else "")
        if intro:
            out += [intro[0].upper() + intro[1:], ""]
        out += ["| key | type | default | meaning |", "|---|---|---|---|"]
        prefix = f"{section}." if section else ""
        for f in dataclasses.fields(cls):
            if dataclasses.is_dataclass(hints[f.name]):
                continue
            key = prefix + f.name
            cells = [f"`{key}`", type_name(hints[f.name]), f"`{yaml_value(f.default)}`",
                     notes[key]]
            out.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
        out.append("")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    text = render()
    if argv:
        with open(argv[0], "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
