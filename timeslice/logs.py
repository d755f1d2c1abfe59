"""How the servers' log lines read: `text` for a person, `json` for a log pipeline.

Both forms carry the same fields. A line's fields are what its call passed as
`extra=` (a decision's `decision`, `group`, `job`, `token`, `node`, ...): JSON
writes each as a key of the line's object, beside `time`, `level`, `logger` and
`message`; text appends them to the message as `key=value`. One line per record
in both forms: a message or a traceback with line breaks is escaped in JSON and
indented in text, so a reader splitting on newlines never sees half a record.

Built on the standard `logging` module alone (a Formatter each), so that every
library's records, grpclib's and SQLAlchemy's included, come out the same way.
"""

from __future__ import annotations

import json
import logging
import math
import sys
from datetime import UTC, datetime
from typing import Any, Final, TextIO

LOG_FORMATS: Final = ("text", "json")
LOG_LEVELS: Final = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

# The attributes every LogRecord has: anything else on a record came from `extra=`.
_RECORD_ATTRIBUTES: Final = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {
    "message",
    "asctime",
    "taskName",
}

# The longest a field's value may be in a line (a hostile client's id is bounded
# at decode already; this bounds whatever else a caller passes).
MAX_FIELD_CHARS: Final = 2048


def record_fields(record: logging.LogRecord) -> dict[str, Any]:
    """The fields a log call passed with `extra=`, in the order it gave them."""
    return {k: v for k, v in record.__dict__.items() if k not in _RECORD_ATTRIBUTES}


def _plain(value: Any) -> Any:
    """`value` as JSON can carry it: numbers, strings, booleans, null, and lists of them."""
    if value is None or isinstance(value, bool | int | str):
        return value[:MAX_FIELD_CHARS] if isinstance(value, str) else value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, list | tuple | set | frozenset):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return str(value)[:MAX_FIELD_CHARS]


def _shown(value: Any) -> str:
    """`value` as a text line shows it: key=value stays one token where it can."""
    if value is None or value == "":
        return "-"
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, list | tuple | set | frozenset):
        return ",".join(_shown(v) for v in value) or "-"
    text = str(value)[:MAX_FIELD_CHARS]
    return json.dumps(text) if any(c.isspace() or c in '"=' for c in text) else text


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (ISO 8601, UTC), level, logger, message, the
    record's fields, and `exception` when it carries one."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="microseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in record_fields(record).items():
            line.setdefault(key, _plain(value))  # a field never hides a line's own keys
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exception"] = record.exc_text
        if record.stack_info:
            line["stack"] = record.stack_info
        return json.dumps(line, ensure_ascii=False, allow_nan=False)


class TextFormatter(logging.Formatter):
    """`TIME LEVEL LOGGER: MESSAGE key=value ...`; a traceback below it, indented."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        if fields := record_fields(record):
            head, sep, rest = text.partition("\n")
            pairs = " ".join(f"{k}={_shown(v)}" for k, v in fields.items())
            text = f"{head} {pairs}{sep}{rest}"
        return text.replace("\n", "\n    ")


def formatter(log_format: str) -> logging.Formatter:
    """The formatter of `log_format` ("text" or "json")."""
    if log_format == "json":
        return JsonFormatter()
    if log_format == "text":
        return TextFormatter()
    raise ValueError(f"unknown log format {log_format!r}; use one of {', '.join(LOG_FORMATS)}")


def setup_logging(level: str, log_format: str = "text", stream: TextIO | None = None) -> None:
    """Send every record at `level` and above to `stream` (stderr) in `log_format`:
    the whole process logs one way. As `logging.basicConfig`, it leaves a root
    logger that has handlers already (a program's, a test runner's) as it is."""
    handler_format = formatter(log_format)  # refuses an unknown format first
    root = logging.getLogger()
    if root.handlers:
        return
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(handler_format)
    root.addHandler(handler)
    root.setLevel(level.upper())


def decision_fields(
    decision: str,
    *,
    group: str = "",
    job: str = "",
    token: int | None = None,
    node: str = "",
    **more: Any,
) -> dict[str, Any]:
    """The `extra=` of a decision's line: its kind, and the group, job, fencing
    token and node it concerns (every decision line has these four keys, "" or
    None when it concerns none), then `more`."""
    return {"decision": decision, "group": group, "job": job, "token": token, "node": node, **more}


def announce(message: str, log_format: str, **fields: Any) -> None:
    """Write a server's own word to whoever reads its stderr ("serving on ...",
    "shutting down"), at any log level: as it is in text, as a line of the log
    (logger `timeslice.serve`, INFO) in JSON, so that a pipeline reads every line."""
    if log_format.lower() == "json":
        record = logging.LogRecord("timeslice.serve", logging.INFO, __file__, 0, message, (), None)
        record.__dict__.update(fields)
        message = JsonFormatter().format(record)
    sys.stderr.write(message + "\n")
    sys.stderr.flush()
