"""The replay page: one self-contained HTML file (inline CSS and JavaScript, the
timelines embedded as JSON; nothing is fetched) that draws each run's timeline
and replays it: play, pause, speed, a scrubbing slider with a playhead, the
switches one by one, and the parts of the switch clicked.

The page's markup, style and script are files of their own in `assets/`
(`page.html`, `page.css`, `page.js`; `scripts/lint_assets.sh` lints the last two),
put together here each time a page is built."""

from __future__ import annotations

import html
import json
import re
from collections.abc import Sequence
from importlib.resources import files
from typing import Any

from timeslice.replay.timeline import Timeline

# page.html names what goes where as %%TITLE%%, %%STYLE%%, %%SCRIPT%% and %%DATA%%.
_PLACEHOLDER = re.compile(r"%%([A-Z]+)%%")


def latest(timelines: Sequence[Timeline]) -> int:
    """The index of the most recent run: the one whose record ends last on the wall
    clock. A run without a wall clock (a recorded run that gives none) counts as older
    than any with one; where none has one, or they end at once, the first given."""
    best, best_end = 0, float("-inf")
    for i, tl in enumerate(timelines):
        end = tl.origin + tl.end if tl.origin is not None else float("-inf")
        if end > best_end:
            best, best_end = i, end
    return best


def page_data(timelines: Sequence[Timeline]) -> dict[str, Any]:
    """What the page is drawn from; it opens on run `latest`."""
    return {"runs": [tl.to_dict() for tl in timelines], "latest": latest(timelines)}


def embed_json(data: Any) -> str:
    """`data` as JSON that is safe inside a <script> element."""
    text = json.dumps(data, allow_nan=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def render_page(timelines: Sequence[Timeline], title: str = "timeslice replay") -> str:
    """The whole page for `timelines` (it opens on the most recent, `latest`)."""
    fields = {
        "TITLE": html.escape(title),
        "STYLE": _asset("page.css"),
        "SCRIPT": _asset("page.js"),
        "DATA": embed_json(page_data(timelines)),
    }
    # One pass, so that nothing filled in (a title, the script) is read as a placeholder;
    # a placeholder without a field raises KeyError.
    return _PLACEHOLDER.sub(lambda match: fields[match.group(1)], _asset("page.html"))


def _asset(name: str) -> str:
    """The text of `assets/<name>`, from the installed package."""
    return (files("timeslice.replay") / "assets" / name).read_text(encoding="utf-8")
