"""The printable text spaces: what Gymnasium's own constructors give, without their copies of the charset."""

from __future__ import annotations

from gymnasium import spaces
from gymnasium.vector.utils import batch_space

from envace_gym.spaces import PRINTABLE_CHARSET, batch_text_space, printable_text


def test_printable_text_equals_gymnasiums_text_and_has_its_own_generator():
    a, b = printable_text(), printable_text()
    assert a == spaces.Text(max_length=a.max_length, min_length=0, charset=PRINTABLE_CHARSET)
    a.seed(1)
    expected = [a.sample() for _ in range(2)]
    a.seed(1)
    first = a.sample()
    b.seed(2)  # seeding or sampling another space from the same prototype must not move a's generator
    b.sample()
    assert [first, a.sample()] == expected and a.np_random is not b.np_random
    assert a.contains('{"name": "move", "arguments": {}}\n') and not a.contains("\ud800")


def test_batch_text_space_equals_gymnasiums_batch_space():
    single = printable_text(max_length=20)
    ours, theirs = batch_text_space(single, 3), batch_space(single, 3)
    assert isinstance(ours, spaces.Tuple) and ours == theirs
    assert len({id(s.np_random) for s in ours.spaces}) == 3
    single.seed(7)
    x, y = batch_text_space(single, 3), batch_text_space(single, 3)
    assert x.sample() == y.sample()  # seeded from the seeded space: reproducible, and `single` did not move
    assert all(x.spaces[0].contains(t) for t in x.sample())
