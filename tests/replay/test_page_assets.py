"""The page's style and script are files of their own (timeslice/replay/assets), inlined
whole when a page is built: the page holds them verbatim, every placeholder of the
markup is filled, and nothing in them can end its element early."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import timeslice.replay
from tests.replay.test_page import embedded, timeline
from timeslice.replay.page import embed_json, page_data, render_page

ASSETS = Path(timeslice.replay.__file__).parent / "assets"


def asset(name: str) -> str:
    return (ASSETS / name).read_text(encoding="utf-8")


def element(page: str, start_tag: str, end_tag: str) -> str:
    """The text of the only element of the page that opens with `start_tag`."""
    found = re.findall(re.escape(start_tag) + "(.*?)" + re.escape(end_tag), page, re.S)
    assert len(found) == 1, f"{start_tag} appears {len(found)} times"
    return str(found[0])


def test_the_page_inlines_the_style_and_the_script_verbatim() -> None:
    page = render_page([timeline("run")])
    assert element(page, "<style>", "</style>") == asset("page.css")
    assert element(page, "<script>", "</script>") == asset("page.js")


def test_every_placeholder_of_the_markup_is_filled() -> None:
    runs = [timeline("run")]
    page = render_page(runs, title="a replay")
    assert "%%" in asset("page.html")  # the placeholders this test looks for
    # What is left once the assets and the data are taken out is the markup alone.
    markup = page
    for inlined in (asset("page.css"), asset("page.js"), embed_json(page_data(runs))):
        assert markup.count(inlined) == 1
        markup = markup.replace(inlined, "")
    assert "%%" not in markup
    assert "{" not in markup and "}" not in markup
    assert markup.count("a replay") == 2  # the title and the heading


@pytest.mark.parametrize("title", ["%%SCRIPT%%", "%%DATA%%", "%%NOT_A_FIELD%%", "{title}"])
def test_a_title_is_shown_as_given_never_filled_in(title: str) -> None:
    page = render_page([timeline("run")], title=title)
    assert f"<title>{title}</title>" in page and f"<h1>{title}</h1>" in page
    assert page.count(asset("page.js")) == 1
    assert embedded(page) == page_data([timeline("run")])


@pytest.mark.parametrize(("name", "end_tag"), [("page.js", "</script"), ("page.css", "</style")])
def test_no_asset_can_end_its_element_early(name: str, end_tag: str) -> None:
    text = asset(name).lower()
    assert end_tag not in text and "<!--" not in text
