"""deploy/Dockerfile, checked without a Docker daemon or hadolint: its instructions,
as dockerfile-parse reads them, keep the image's rules (multi-stage, base images pinned
by version, a non-root user in the final stage, no ADD of URLs, apt lists removed in
the layer that made them, pip without its cache, the extras as a build argument, no
installer run in the runtime stage, `timeslice` as the entrypoint), and .dockerignore
keeps the build context to what the wheel needs. Each rule is also shown to catch a
Dockerfile that breaks it.

Not checked here: that the image builds and runs (that needs a daemon), what the base
image itself contains, and hadolint's other rules."""

from __future__ import annotations

import io
import json
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.optional import need

dockerfile_parse = need("dockerfile_parse")

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"


@dataclass(frozen=True, kw_only=True)
class Instruction:
    name: str
    value: str
    line: int


@dataclass(frozen=True, kw_only=True)
class Stage:
    image: str  # as written, ${ARG}s resolved from the global ARG defaults
    name: str | None
    instructions: tuple[Instruction, ...]


def arg_defaults(text: str) -> dict[str, str]:
    """Each ARG's default, as written (quotes removed)."""
    defaults = {}
    for entry in parse(text):
        if entry.name == "ARG" and "=" in entry.value:
            key, _, default = entry.value.partition("=")
            defaults[key.strip()] = default.strip().strip("\"'")
    return defaults


def parse(text: str) -> list[Instruction]:
    parser = dockerfile_parse.DockerfileParser(fileobj=io.BytesIO(text.encode()))
    return [
        Instruction(name=entry["instruction"], value=entry["value"], line=entry["startline"] + 1)
        for entry in parser.structure
        if entry["instruction"] != "COMMENT"
    ]


def stages(text: str) -> list[Stage]:
    instructions = parse(text)
    global_args: dict[str, str] = {}
    found: list[tuple[str, str | None, list[Instruction]]] = []
    for entry in instructions:
        if entry.name == "FROM":
            words = entry.value.split()
            words = [word for word in words if not word.startswith("--platform")]
            image = re.sub(
                r"\$\{?(\w+)\}?", lambda m: global_args.get(m.group(1), m.group(0)), words[0]
            )
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            found.append((image, name, []))
        elif not found:
            if entry.name == "ARG" and "=" in entry.value:
                key, _, default = entry.value.partition("=")
                global_args[key.strip()] = default.strip().strip("\"'")
        else:
            found[-1][2].append(entry)
    return [Stage(image=i, name=n, instructions=tuple(body)) for i, n, body in found]


def declared_extras() -> set[str]:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return set(pyproject["project"]["optional-dependencies"])


def problems(text: str) -> list[str]:
    """Every rule of the image that `text` breaks, one line each."""
    found: list[str] = []
    all_stages = stages(text)
    if len(all_stages) < 2:
        found.append("not multi-stage: one FROM")
    for stage in all_stages:
        image = stage.image
        if "$" in image:
            found.append(f"base image {image}: an ARG without a default")
        elif "@sha256:" not in image:
            tag = image.rpartition(":")[2] if ":" in image.rpartition("/")[2] else ""
            if not tag or tag == "latest" or not re.search(r"\d+\.\d+", tag):
                found.append(f"base image {image}: not pinned to a version")
    for entry in parse(text):
        if entry.name == "ADD" and re.search(r"(^|\s)(https?://|git@)", entry.value):
            found.append(f"line {entry.line}: ADD of a URL")
        if entry.name == "RUN":
            if re.search(r"apt-get\s+(-\S+\s+)*(update|install)", entry.value) and (
                "rm -rf /var/lib/apt/lists" not in entry.value
            ):
                found.append(f"line {entry.line}: apt lists left in the layer")
            for command in re.findall(r"pip3?\s[^;&|]*?\b(?:install|wheel)\b[^;&|]*", entry.value):
                if "--no-cache-dir" not in command:
                    found.append(f"line {entry.line}: pip without --no-cache-dir")
    if all_stages:
        final = all_stages[-1]
        users = [e.value.strip() for e in final.instructions if e.name == "USER"]
        if not users:
            found.append("final stage: no USER (runs as root)")
        elif (
            users[-1].partition(":")[0] in {"0", "root"}
            or not users[-1].partition(":")[0].isdigit()
        ):
            found.append(f"final stage: USER {users[-1]} is root or not a fixed uid")
        for entry in final.instructions:
            if entry.name == "RUN" and re.search(r"\b(pip3?|apt-get|apk|gcc|make)\b", entry.value):
                found.append(f"line {entry.line}: the runtime stage installs or builds")
        if not any(e.name == "COPY" and "--from=" in e.value for e in final.instructions):
            found.append("final stage: copies nothing from the build stage")
        entrypoints = [e.value for e in final.instructions if e.name == "ENTRYPOINT"]
        if not entrypoints or json.loads(entrypoints[-1]) != ["timeslice"]:
            found.append('final stage: ENTRYPOINT is not ["timeslice"]')
    found += extras_problems(text, all_stages)
    return found


def extras_problems(text: str, all_stages: list[Stage]) -> list[str]:
    build = [
        stage
        for stage in all_stages[:-1]
        if any(
            e.name == "ARG" and e.value.split("=")[0].strip() == "EXTRAS"
            for e in stage.instructions
        )
    ]
    if not build:
        return ["no build stage declares ARG EXTRAS"]
    if not any(
        e.name == "RUN" and re.search(r"\$\{?EXTRAS", e.value) for e in build[0].instructions
    ):
        return ["ARG EXTRAS is never used"]
    default = arg_defaults(text).get("EXTRAS", "")
    unknown = {x.strip() for x in default.split(",") if x.strip()} - declared_extras()
    return [f"EXTRAS default names unknown extras {sorted(unknown)}"] if unknown else []


def test_the_dockerfile_keeps_every_rule() -> None:
    assert problems(DOCKERFILE.read_text()) == []


def test_it_is_parsed_into_a_build_and_a_runtime_stage() -> None:
    # the checks above look at what the parser found: make sure it found it
    build, runtime = stages(DOCKERFILE.read_text())
    assert (build.name, runtime.name) == ("build", "runtime")
    assert build.image == runtime.image
    assert re.fullmatch(r"python:3\.11\.\d+-slim-\w+", runtime.image)
    assert [e.value for e in runtime.instructions if e.name == "USER"] == ["10001:10001"]


# name: (text of deploy/Dockerfile, what it is replaced with, the problem expected)
BROKEN = {
    "latest": ("=python:3.11.13-slim-bookworm", "=python:latest", "not pinned"),
    "untagged": ("=python:3.11.13-slim-bookworm", "=python", "not pinned"),
    "one stage": ("FROM ${PYTHON_IMAGE} AS runtime", "", "not multi-stage"),
    "root": ("USER 10001:10001", "USER root", "is root"),
    "no user": ("USER 10001:10001", "", "no USER"),
    "add url": (
        "WORKDIR /src",
        "WORKDIR /src\nADD https://example.org/x.tgz /src/",
        "ADD of a URL",
    ),
    "apt lists": (
        "WORKDIR /src",
        "WORKDIR /src\nRUN apt-get update && apt-get install -y --no-install-recommends gcc",
        "apt lists",
    ),
    "pip cache": ("pip wheel --no-cache-dir", "pip wheel", "without --no-cache-dir"),
    "runtime installs": (
        "COPY --from=build /opt/timeslice /opt/timeslice",
        "COPY --from=build /opt/timeslice /opt/timeslice\nRUN pip install --no-cache-dir gcc",
        "runtime stage installs",
    ),
    "extras unused": ('"${wheel}${EXTRAS:+[${EXTRAS}]}"', '"${wheel}"', "never used"),
    "extras unknown": ('EXTRAS="postgres,', 'EXTRAS="postgre,', "unknown extras"),
    "entrypoint": ('ENTRYPOINT ["timeslice"]', 'ENTRYPOINT ["sh"]', "ENTRYPOINT"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_each_rule_catches_a_dockerfile_that_breaks_it(case: str) -> None:
    old, new, expected = BROKEN[case]
    text = DOCKERFILE.read_text()
    assert old in text, f"the case {case!r} no longer applies to deploy/Dockerfile"
    found = problems(text.replace(old, new, 1))
    assert any(expected in problem for problem in found), found


def test_the_build_context_is_what_the_wheel_needs() -> None:
    lines = [
        line.strip()
        for line in DOCKERIGNORE.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    # everything is left out, then the wheel's sources are let back in
    assert lines[0] == "*"
    allowed = {line[1:].rstrip("/") for line in lines if line.startswith("!")}
    copied = set()
    for stage in stages(DOCKERFILE.read_text()):
        for entry in stage.instructions:
            if entry.name == "COPY" and "--from=" not in entry.value:
                copied.update(entry.value.split()[:-1])
    assert copied == allowed == {"pyproject.toml", "README.md", "timeslice"}
    assert "**/__pycache__" in lines
