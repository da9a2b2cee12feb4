"""``module:attribute`` targets: what they name, and the reasons a bad one is refused."""

from __future__ import annotations

import os.path

import pytest

from vgrpo.import_target import ImportTargetError, first_line, import_target


def test_a_target_names_a_module_attribute_dotted_or_not() -> None:
    assert import_target("os.path:join") is os.path.join
    assert import_target("vgrpo.import_target:ImportTargetError.__name__") == "ImportTargetError"


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("vgrpo.no_such_module:x", "cannot import module 'vgrpo.no_such_module': ModuleNotFoundError: No module named"),
        ("os.path:no_such_function", "module 'os.path' has no attribute 'no_such_function'"),
        ("os.path:join.no_such", "module 'os.path' has no attribute 'join.no_such'"),
    ],
)
def test_a_bad_target_says_why(target: str, message: str) -> None:
    with pytest.raises(ImportTargetError, match="^" + message.replace("(", r"\(").replace(".", r"\.")):
        import_target(target)


def test_first_line_keeps_the_type_and_the_first_line() -> None:
    assert first_line(ValueError("bad\nmore")) == "ValueError: bad"
    assert first_line(KeyError()) == "KeyError"
    err = SyntaxError("invalid syntax", ("m.py", 3, 1, "x ="))
    assert first_line(err) == "SyntaxError: invalid syntax (m.py, line 3)"
