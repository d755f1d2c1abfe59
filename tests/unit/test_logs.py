"""The two log formats: one line per record, the `extra=` fields as JSON keys or as
key=value in text, the line's own keys never overwritten, tracebacks kept on the
line."""

from __future__ import annotations

import json
import logging

import pytest

from timeslice.logs import JsonFormatter, TextFormatter, decision_fields, formatter


def record(message: str = "grant: a holds g", **extra: object) -> logging.LogRecord:
    made = logging.LogRecord("timeslice.decisions", logging.INFO, __file__, 1, message, (), None)
    for key, value in extra.items():
        setattr(made, key, value)
    return made


def test_json_carries_the_fields_as_keys() -> None:
    fields = decision_fields("grant", group="g", job="a", token=3, waited_s=0.5, saved=("b",))
    line = json.loads(JsonFormatter().format(record(**fields)))
    assert line["level"] == "INFO" and line["logger"] == "timeslice.decisions"
    assert line["message"] == "grant: a holds g" and line["time"].endswith("+00:00")
    assert line["decision"] == "grant" and line["group"] == "g" and line["job"] == "a"
    assert line["token"] == 3 and line["node"] == "" and line["waited_s"] == 0.5
    assert line["saved"] == ["b"]


def test_json_is_one_line_even_with_a_traceback_and_keeps_its_own_keys() -> None:
    try:
        raise RuntimeError("boom\nsecond line")
    except RuntimeError:
        import sys

        made = logging.LogRecord("x", logging.ERROR, __file__, 1, "a\nb", (), sys.exc_info())
    setattr(made, "level", "spoofed")  # noqa: B010 - a field named like a line key
    text = JsonFormatter().format(made)
    assert "\n" not in text
    line = json.loads(text)
    assert line["level"] == "ERROR" and line["message"] == "a\nb"
    assert "RuntimeError: boom" in line["exception"]


def test_json_writes_what_it_cannot_carry_as_strings() -> None:
    line = json.loads(JsonFormatter().format(record(when=float("nan"), obj=object())))
    assert line["when"] == "nan" and line["obj"].startswith("<object")


def test_text_appends_the_fields_and_indents_a_traceback() -> None:
    fields = decision_fields("revoke", group="g", job="a", token=4, reason="lease expired")
    text = TextFormatter().format(record("revoke: a lost g", **fields))
    first = text.splitlines()[0]
    assert first.endswith(
        'revoke: a lost g decision=revoke group=g job=a token=4 node=- reason="lease expired"'
    )
    try:
        raise ValueError("x")
    except ValueError:
        import sys

        made = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    lines = TextFormatter().format(made).splitlines()
    assert lines[0].endswith("failed") and all(line.startswith("    ") for line in lines[1:])


def test_an_unknown_format_is_refused() -> None:
    with pytest.raises(ValueError, match="use one of text, json"):
        formatter("xml")
