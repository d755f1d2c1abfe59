"""The replay page in a real browser (headless Chromium, driven by Playwright with
the system's Chromium: no browser is downloaded): it draws as many switches as
the journal holds, shows a switch's parts when it is clicked, plays, switches
between runs and opens on the most recent, zooms with the wheel and pans with a
drag within bounds, draws the utilisation track the Python side computes, colours
what it draws as its legend says, and shows durations to the data's precision. Skipped where no Chromium is installed, except in CI
(CI=true), where it must run: `.ci/run` installs Debian's chromium."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import pytest

from tests.replay.conftest import journal_rows
from tests.replay.test_timeline import at, fold
from timeslice.orchestrator import events as ev
from timeslice.replay import load_runs, render_page
from timeslice.replay.timeline import Timeline, time_resolution, tracks

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page


def missing(reason: str) -> NoReturn:
    if os.environ.get("CI") == "true":
        pytest.fail(f"the browser test must run in CI: {reason}")
    pytest.skip(reason)


def chromium_path() -> str:
    for candidate in (os.environ.get("TIMESLICE_CHROMIUM"), "chromium", "chromium-browser"):
        if candidate and (found := shutil.which(candidate)):
            return found
    missing("no Chromium installed (apt-get install chromium), or set TIMESLICE_CHROMIUM")


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    executable = chromium_path()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        missing("the playwright package is not installed (pip install -e '.[test]')")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, headless=True)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    yield page
    page.close()
    assert errors == [], f"the page reported errors: {errors}"


def test_the_page_replays_the_journal_switch_by_switch(
    journal_timeline: Timeline,
    page: Page,
    recorded_journal: Path,
    verl_runs_path: Path,
    tmp_path: Path,
) -> None:
    journal = journal_timeline
    recorded = load_runs(verl_runs_path)
    html = tmp_path / "replay.html"
    html.write_text(render_page([journal, *recorded]), encoding="utf-8")

    page.goto(html.as_uri())
    page.wait_for_selector("body[data-ready='1']")
    switches = page.locator("#timeline .switch")
    # As many switches drawn as the journal holds.
    assert switches.count() == len(journal_rows(recorded_journal, "SwitchDone")) > 0
    assert page.locator("#switch-count").get_attribute("data-count") == str(switches.count())
    assert page.locator("#timeline .span.hold").count() == len(journal.spans_of("hold"))

    # Click a handover: its parts and bytes are shown.
    chosen = journal.switches[1]
    assert chosen.restored and chosen.saved
    page.locator(f'#timeline .switch[data-switch="{chosen.index}"]').click()
    details = page.locator("#details")
    assert details.is_visible()
    assert details.get_attribute("data-switch") == str(chosen.index)
    assert "selected" in (switches.nth(chosen.index).get_attribute("class") or "")
    expected = {
        "wait": chosen.wait,
        "duration": chosen.duration,
        "snapshot": chosen.snapshot,
        "restore": chosen.restore,
        "overhead": chosen.overhead,
        "bytes": chosen.moved_bytes,
    }
    for part, value in expected.items():
        row = details.locator(f'tr[data-part="{part}"]')
        assert row.is_visible(), part
        assert float(row.get_attribute("data-value") or "nan") == pytest.approx(value), part
    assert chosen.moved_bytes is not None
    assert f"{chosen.moved_bytes:,} bytes" in details.locator('tr[data-part="bytes"]').inner_text()
    assert f"{chosen.saved[0]} \u2192 {chosen.job}" in page.locator("#details-title").inner_text()
    assert page.locator("#steps tbody tr").count() == len(chosen.steps)

    # Play from the start: the playhead moves, then pause holds it.
    page.locator("#speed").select_option(index=0)
    page.locator("#play").click()
    assert page.locator("#play").inner_text() == "Pause"
    page.wait_for_function("Number(document.getElementById('scrub').value) > 0")
    page.locator("#play").click()
    assert page.locator("#play").inner_text() == "Play"
    held = page.locator("#scrub").input_value()
    page.wait_for_timeout(100)
    assert page.locator("#scrub").input_value() == held
    # Scrub to the middle: the playhead follows (the time axis runs from x=10 to width-10).
    page.locator("#scrub").fill("5000")
    width = float(page.locator("#timeline").get_attribute("width") or "nan")
    playhead = float(page.locator("#playhead").get_attribute("x1") or "nan")
    assert playhead == pytest.approx(10 + (width - 20) / 2)
    assert "t = " in page.locator("#clock").inner_text()
    # Step to the next switch: it is shown, the playhead at its end.
    page.locator("#next").click()
    after = journal.switches[chosen.index + 1]
    assert page.locator("#details").get_attribute("data-switch") == str(after.index)
    span = journal.end - journal.start
    expected = round((after.end - journal.start) / span * 10000)
    assert abs(int(page.locator("#scrub").input_value()) - expected) <= 1

    shot = tmp_path / "replay.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000
    print(f"screenshot of the replay page: {shot}")

    # The other runs, through the selector.
    for index, tl in enumerate(recorded, 1):
        page.locator("#run").select_option(str(index))
        assert page.locator("#timeline .switch").count() == len(tl.switches)
        assert page.locator("#details").is_hidden()
    assert [len(tl.switches) for tl in recorded] == [42, 27]


def test_a_page_with_one_run_hides_the_selector(
    journal_timeline: Timeline, page: Page, tmp_path: Path
) -> None:
    journal = journal_timeline
    html = tmp_path / "one.html"
    html.write_text(render_page([journal]), encoding="utf-8")
    page.goto(html.as_uri())
    page.wait_for_selector("body[data-ready='1']")
    assert page.locator("#run-choice").is_hidden()
    # The list of every switch selects too.
    page.locator("#list summary").click()
    rows = page.locator("#switch-list tbody tr")
    assert rows.count() == len(journal.switches)
    rows.nth(0).click()
    assert page.locator("#details").get_attribute("data-switch") == "0"
    # The arrow keys step from switch to switch.
    page.keyboard.press("ArrowRight")
    assert page.locator("#details").get_attribute("data-switch") == "1"
    page.keyboard.press("ArrowLeft")
    assert page.locator("#details").get_attribute("data-switch") == "0"
    # Zooming in halves the visible range and keeps every switch and the selection.
    assert view(page) == pytest.approx((journal.start, journal.end))
    page.locator("#zoom-in").click()
    page.locator("#zoom-in").click()
    start, end = view(page)
    assert end - start == pytest.approx((journal.end - journal.start) / 4)
    assert page.locator("#timeline .switch").count() == len(journal.switches)
    assert page.locator('#timeline .switch[data-switch="0"]').get_attribute("class") == (
        "switch selected"
    )


# --- zoom, tracks, legend, durations ----------------------------------------------------

ROW = 24  # the page's row height; a track's bars are ROW - 4 high at 100 %


def view(page: Page) -> tuple[float, float]:
    """The visible range of the timeline, once the page has drawn what it was asked to."""
    page.evaluate("() => new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)))")
    timeline = page.locator("#timeline")
    return (
        float(timeline.get_attribute("data-from") or "nan"),
        float(timeline.get_attribute("data-to") or "nan"),
    )


def open_page(page: Page, path: Path, runs: list[Timeline]) -> None:
    path.write_text(render_page(runs), encoding="utf-8")
    page.goto(path.as_uri())
    page.wait_for_selector("body[data-ready='1']")


def failed_switch_run() -> Timeline:
    return fold(
        ev.SetGroupNodes(now=at(0), group="g", nodes=("n1",)),
        ev.Acquire(now=at(0), group="g", job="A", call_id="a1"),
        ev.SwitchDone(now=at(1), group="g", token=1, restored=False, began=at(0)),
        ev.Acquire(now=at(2), group="g", job="B", call_id="b1"),
        ev.Yield(now=at(4), group="g", job="A"),
        ev.SwitchDone(
            now=at(6),
            group="g",
            token=2,
            restored=False,
            error="n1: restore failed",
            began=at(4.5),
            steps=(("n1", "A", "snapshot", 0.5, 64),),
            moved_bytes=64,
        ),
    )


def test_the_wheel_zooms_around_the_pointer_and_a_drag_pans(
    journal_timeline: Timeline, page: Page, tmp_path: Path
) -> None:
    journal = journal_timeline
    open_page(page, tmp_path / "zoom.html", [journal])
    full = journal.end - journal.start
    assert view(page) == pytest.approx((journal.start, journal.end))
    box = page.locator("#timeline").bounding_box()
    assert box is not None
    plot = box["width"] - 20  # the time axis runs from x=10 to width-10
    # The wheel over a quarter of the way in: the view narrows, that time stays put.
    pointer = box["x"] + 10 + plot / 4
    page.mouse.move(pointer, box["y"] + 10)
    under = journal.start + full / 4
    page.mouse.wheel(0, -300)
    start, end = view(page)
    assert end - start < full * 0.7
    assert start + (end - start) / 4 == pytest.approx(under, rel=1e-6, abs=1e-9)
    # Dragging pans by as much time as the pointer moved over, the range kept; it is a
    # pan, not a click: the playhead stays where it was.
    scrub = page.locator("#scrub").input_value()
    page.mouse.down()
    page.mouse.move(pointer - plot / 10, box["y"] + 10, steps=5)
    page.mouse.up()
    moved_start, moved_end = view(page)
    assert moved_end - moved_start == pytest.approx(end - start)
    assert moved_start - start == pytest.approx((end - start) / 10, rel=1e-3)
    assert page.locator("#scrub").input_value() == scrub
    # A click still seeks.
    page.mouse.click(box["x"] + 10 + plot / 2, box["y"] + 10)
    assert page.locator("#scrub").input_value() != scrub
    # Bounded: no narrower than ten of the data's time quanta, no wider than the run.
    for _ in range(40):
        page.mouse.wheel(0, -1000)
    start, end = view(page)
    assert end - start == pytest.approx(10 * time_resolution(journal))
    assert journal.start <= start and end <= journal.end
    for _ in range(40):
        page.mouse.wheel(0, 1000)
    assert view(page) == pytest.approx((journal.start, journal.end))
    # A pan stops at the run's ends; the reset shows the whole run.
    page.locator("#zoom-in").click()
    page.mouse.move(box["x"] + 20, box["y"] + 10)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] - 5, box["y"] + 10, steps=5)
    page.mouse.up()
    assert view(page)[0] == pytest.approx(journal.start)
    page.locator("#zoom-reset").click()
    assert view(page) == pytest.approx((journal.start, journal.end))


def test_the_utilisation_track_is_the_python_one(
    journal_timeline: Timeline, page: Page, tmp_path: Path
) -> None:
    journal = journal_timeline
    open_page(page, tmp_path / "tracks.html", [journal])
    (track,) = tracks(journal)
    bars = page.locator("#timeline rect.usage")
    drawn = bars.evaluate_all(
        """(bars) => bars.map((b) => [Number(b.dataset.window), b.dataset.share,
                                       Number(b.dataset.value), Number(b.getAttribute("height"))])"""
    )
    expected = {
        (i, share): getattr(u, share)
        for i, u in enumerate(track.usage)
        for share in ("busy", "switching", "idle")
        if getattr(u, share) > 0
    }
    assert {(i, share): value for i, share, value, _ in drawn} == pytest.approx(expected)
    for _, _, value, height in drawn:
        assert height == pytest.approx((ROW - 4) * value, abs=1e-6)
    # The journal's switches and holds show: some time working, some switching.
    assert any(u.busy > 0 for u in track.usage) and any(u.switching > 0 for u in track.usage)
    queue = page.locator("#timeline path.queue")
    assert queue.count() == 1
    assert queue.get_attribute("data-max") == str(max(1, max(d for _, d in track.queue)))


def test_the_legend_is_the_palette_drawn(
    journal_timeline: Timeline, page: Page, tmp_path: Path
) -> None:
    open_page(page, tmp_path / "legend.html", [journal_timeline, failed_switch_run()])
    legend = dict(
        page.locator("#legend [data-key]").evaluate_all(
            """(entries) => entries.map((e) => [e.dataset.key,
                   getComputedStyle(e.querySelector(".key")).backgroundColor])"""
        )
    )
    assert len(set(legend.values())) == len(legend)  # one colour, one meaning

    def drawn() -> list[tuple[str, str]]:
        return [
            (kind, colour)
            for kind, colour in page.locator("#timeline [data-kind]").evaluate_all(
                """(nodes) => nodes.map((n) => { const s = getComputedStyle(n);
                       return [n.dataset.kind, n.tagName === "line" || s.fill === "none"
                                               ? s.stroke : s.fill]; })"""
            )
        ]

    kinds = set()
    for index in (0, 1):
        page.locator("#run").select_option(str(index))
        for kind, colour in drawn():
            assert kind in legend, f"{kind} is drawn but not in the legend"
            assert colour == legend[kind], kind
            kinds.add(kind)
    assert {"hold", "wait", "snapshot", "restore", "switch", "failed", "queue", "playhead"} <= kinds
    # Red is for failed switches only: the playhead is not red.
    assert legend["failed"] == "rgb(198, 40, 40)" and legend["playhead"] != legend["failed"]
    assert (
        page.locator("#playhead").evaluate("(n) => getComputedStyle(n).stroke")
        == (legend["playhead"])
    )


def test_the_page_opens_on_the_most_recent_run(
    journal_timeline: Timeline, page: Page, verl_runs_path: Path, tmp_path: Path
) -> None:
    recorded = load_runs(verl_runs_path)  # no wall clock: older than the journal
    open_page(page, tmp_path / "latest.html", [*recorded, journal_timeline])
    assert page.locator("#run").input_value() == str(len(recorded))
    assert page.locator("#switch-count").get_attribute("data-count") == str(
        len(journal_timeline.switches)
    )


@pytest.mark.parametrize(
    ("seconds", "resolution", "shown"),
    [
        (0.000003, 1e-6, "3 \u00b5s"),
        (0.0000004, 1e-6, "< 1 \u00b5s"),
        (0.0123456, 1e-6, "12.35 ms"),
        (5.123456, 1e-6, "5.123 s"),
        (0.014, 1e-3, "14 ms"),
        (1.5, 1e-3, "1.500 s"),
        (12, 1, "12 s"),
        (12.000000001, 1, "12 s"),
        (-2.5, 0.1, "-2.5 s"),
        (125.5, 0.1, "2 min 5.5 s"),
        (179.96, 0.01, "3 min 0.0 s"),
        (7322, 1, "2 h 2 min 2 s"),
        (0, 1e-6, "0 s"),
        (None, 1e-6, "not recorded"),
    ],
)
def test_durations_are_shown_to_the_precision_of_the_data(
    page: Page, tmp_path: Path, seconds: float | None, resolution: float, shown: str
) -> None:
    page.set_content(render_page([]))
    assert (
        page.evaluate(
            "([s, r]) => window.timesliceReplay.formatDuration(s, r)", [seconds, resolution]
        )
        == shown
    )


def test_microsecond_spans_are_not_zero(
    journal_timeline: Timeline, page: Page, tmp_path: Path
) -> None:
    journal = journal_timeline
    assert time_resolution(journal) == 1e-6
    open_page(page, tmp_path / "precision.html", [journal])
    page.locator(f'#timeline .switch[data-switch="{journal.switches[1].index}"]').click()
    text = page.locator("#details").inner_text()
    assert "0.000" not in text and ("ms" in text or "\u00b5s" in text)
