"""The replay page in a real browser (headless Chromium, driven by Playwright with
the system's Chromium: no browser is downloaded): it draws as many switches as
the journal holds, shows a switch's parts when it is clicked, plays, and
switches between runs. Skipped where no Chromium is installed, except in CI
(CI=true), where it must run: `.ci/run` installs Debian's chromium."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import pytest

from tests.replay.conftest import journal_rows
from timeslice.replay import load_runs, render_page
from timeslice.replay.timeline import Timeline

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
    # Zooming widens the timeline and keeps every switch and the selection.
    width = float(page.locator("#timeline").get_attribute("width") or "nan")
    page.locator("#zoom").select_option("5")
    assert float(page.locator("#timeline").get_attribute("width") or "nan") == pytest.approx(
        5 * width, abs=5
    )
    assert page.locator("#timeline .switch").count() == len(journal.switches)
    assert page.locator('#timeline .switch[data-switch="0"]').get_attribute("class") == (
        "switch selected"
    )
