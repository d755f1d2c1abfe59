"""The page is one self-contained file: nothing fetched, the timelines embedded
as JSON that no label can break out of."""

from __future__ import annotations

import json
import re
from dataclasses import replace

from timeslice.orchestrator import events as ev
from timeslice.replay.page import latest, page_data, render_page
from timeslice.replay.from_journal import timeline_from_journal
from timeslice.replay.timeline import Timeline


def timeline(label: str, job: str = "A") -> Timeline:
    events = [
        ev.SetGroupNodes(now=10.0, group="g", nodes=("n1",)),
        ev.Acquire(now=11.0, group="g", job=job, call_id="c1"),
        ev.SwitchDone(now=12.0, group="g", token=1, restored=False, began=11.5),
    ]
    return timeline_from_journal(
        [(i, e.now, e) for i, e in enumerate(events, 1)], label=label, source="test"
    )


def embedded(page: str) -> object:
    match = re.search(
        r'<script id="replay-data" type="application/json">(.*?)</script>', page, re.S
    )
    assert match is not None
    return json.loads(match.group(1))


def test_the_page_fetches_nothing() -> None:
    page = render_page([timeline("run")])
    assert "<link" not in page and "@import" not in page and "url(" not in page
    assert not re.search(r"""\b(src|href)\s*=""", page)
    assert "fetch(" not in page and "XMLHttpRequest" not in page
    # The only address is the SVG namespace, which names and loads nothing.
    assert set(re.findall(r"https?://[^\s\"'<>]+", page)) == {"http://www.w3.org/2000/svg"}


def test_the_timelines_are_embedded_whole() -> None:
    runs = [timeline("one"), timeline("two", job="B")]
    assert embedded(render_page(runs)) == json.loads(json.dumps(page_data(runs)))


def test_no_label_breaks_out_of_the_page() -> None:
    hostile = "</script><script>alert(1)</script><!--"
    page = render_page([timeline(hostile, job="j</script>")], title="<b>replay</b>")
    assert hostile not in page and "j</script>" not in page
    assert page.count("</script>") == 2  # the data's and the code's
    assert "<title>&lt;b&gt;replay&lt;/b&gt;</title>" in page
    data = embedded(page)
    assert isinstance(data, dict) and data["runs"][0]["label"] == hostile
    assert data["runs"][0]["jobs"] == ["j</script>"]


def test_a_page_without_runs_still_renders() -> None:
    assert embedded(render_page([])) == {"runs": [], "latest": 0}


def test_the_page_opens_on_the_most_recent_run() -> None:
    old, new = timeline("old"), timeline("new")
    later = replace(new, origin=(new.origin or 0) + 3600)
    assert latest([old, later]) == 1 == latest([old, later, old])
    assert latest([later, old]) == 0
    assert embedded(render_page([old, later]))["latest"] == 1  # type: ignore[index]
    # Runs with no wall clock are older than any with one; with none, the first given.
    clockless = replace(old, origin=None)
    assert latest([clockless, old]) == 1
    assert latest([clockless, replace(later, origin=None)]) == 0
    # Ending later, not starting later, is what counts.
    longer = replace(old, end=old.end + 7200)
    assert latest([later, longer]) == 1
