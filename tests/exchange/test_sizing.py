"""Capacity keys: a key reads back from the text a checkpoint keeps, the older signed
spelling reads as the route it meant, and text that is neither is refused by name."""
import json

import pytest

from jgraph.exchange.sizing import Key, Route, dump


@pytest.mark.parametrize("key", [Key(Route.OWN, 64), Key(Route.STRAIGHT, 64),
                                 Key(Route.STRAIGHT, 1)])
def test_a_key_reads_back_from_its_json_text(key):
    text = json.loads(json.dumps(dump({key: 24})))
    assert {Key.parse(k): v for k, v in text.items()} == {key: 24}


@pytest.mark.parametrize("old,route,length", [("64", Route.OWN, 64), (64, Route.OWN, 64),
                                              ("-64", Route.STRAIGHT, 64),
                                              (-8, Route.STRAIGHT, 8)])
def test_the_signed_keys_of_older_checkpoints_read_as_their_route(old, route, length):
    assert Key.parse(old) == Key(route, length)


@pytest.mark.parametrize("bad", ["sideways:64", "own:many"])
def test_an_unknown_key_is_refused_by_name(bad):
    with pytest.raises(ValueError, match=bad):
        Key.parse(bad)
