"""Discovery's pure part: Kubernetes Nodes and Pods (their JSON) to the settings the
labels ask for, and the actions that follow a change without fighting an operator."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from timeslice.errors import InvalidArgumentError
from timeslice.orchestrator.discovery import (
    Desired,
    NodeInfo,
    PodInfo,
    SetNodes,
    SetPod,
    desired,
    discovered_pods,
    node_info,
    plan,
    pod_backend,
    pod_info,
)

UID_A = "aaaaaaaa-0000-4000-8000-000000000001"
UID_B = "bbbbbbbb-0000-4000-8000-000000000002"


def node(name: str, *groups: str, **labels: str) -> dict[str, Any]:
    all_labels = {f"group.timeslice.io/{g}": "true" for g in groups} | labels
    return {"kind": "Node", "metadata": {"name": name, "labels": all_labels}}


def pod(
    name: str,
    uid: str,
    job: str | None,
    group: str | None,
    node: str = "n1",
    phase: str = "Running",
) -> dict[str, Any]:
    labels = {}
    if job is not None:
        labels["timeslice.io/job-id"] = job
    if group is not None:
        labels["timeslice.io/group"] = group
    return {
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "rl", "uid": uid, "labels": labels},
        "spec": {"nodeName": node},
        "status": {"phase": phase},
    }


def test_a_node_is_in_the_groups_it_is_labelled_true_for() -> None:
    info = node_info(node("gpu-1", "g1", "g2", **{"group.timeslice.io/g3": "false", "x": "y"}))
    assert info == NodeInfo(name="gpu-1", groups=frozenset({"g1", "g2"}))
    assert node_info(node("gpu-2")).groups == frozenset()


@pytest.mark.parametrize(
    "obj",
    [
        {"metadata": {"labels": {}}},
        {"metadata": "x"},
        node("bad name"),
        {"metadata": {"name": "n", "labels": {"group.timeslice.io/" + "g" * 300: "true"}}},
    ],
)
def test_an_unusable_node_is_refused(obj: dict[str, Any]) -> None:
    with pytest.raises(InvalidArgumentError):
        node_info(obj)


def test_a_pod_is_a_jobs_when_labelled_scheduled_and_running() -> None:
    assert pod_info(pod("p", UID_A, "trainer", "g1")) == PodInfo(
        uid=UID_A, name="rl/p", node="n1", job="trainer", group="g1"
    )
    assert pod_info(pod("p", UID_A, "trainer", None)) is None
    assert pod_info(pod("p", UID_A, None, "g1")) is None
    assert pod_info(pod("p", UID_A, "trainer", "g1", node="")) is None  # not scheduled
    assert pod_info(pod("p", UID_A, "trainer", "g1", phase="Succeeded")) is None
    assert pod_info(pod("p", UID_A, "trainer", "g1", phase="Pending")) is not None
    with pytest.raises(InvalidArgumentError, match="pod_uid"):
        pod_info(pod("p", "../../x", "trainer", "g1"))
    with pytest.raises(InvalidArgumentError, match="job_id"):
        pod_info(pod("p", UID_A, "j" * 300, "g1"))


def test_desired_settings_of_nodes_and_pods() -> None:
    nodes = [
        NodeInfo(name="n2", groups=frozenset({"g"})),
        NodeInfo(name="n1", groups=frozenset({"g", "h"})),
    ]
    pods = [
        PodInfo(uid=UID_B, name="rl/b", node="n1", job="j", group="g"),
        PodInfo(uid=UID_A, name="rl/a", node="n1", job="j", group="g"),  # first by name
        PodInfo(uid=UID_B, name="rl/c", node="n2", job="j", group="g"),
    ]
    want = desired(nodes, pods)
    assert want.group_nodes == {"g": ("n1", "n2"), "h": ("n1",)}
    assert want.pods == {("g", "j", "n1"): UID_A, ("g", "j", "n2"): UID_B}
    assert [p.name for p in want.duplicates] == ["rl/b"]


def test_labelled_groups_get_exactly_their_labelled_nodes() -> None:
    after = Desired(group_nodes={"g": ("n1", "n2")})
    assert plan(Desired(), after, {"g": ("x",)}, {}) == [SetNodes(group="g", nodes=("n1", "n2"))]
    assert plan(Desired(), after, {"g": ("n1", "n2")}, {}) == []  # already so


def test_groups_without_labelled_nodes_are_left_as_set() -> None:
    assert plan(Desired(), Desired(), {"manual": ("m1",)}, {}) == []


def test_an_operators_change_stands_until_the_labels_change() -> None:
    before = Desired(group_nodes={"g": ("n1",)})
    # The operator set g to (n1, m1): the labels did not change, nothing to do.
    assert plan(before, before, {"g": ("n1", "m1")}, {}) == []
    after = Desired(group_nodes={"g": ("n1", "n2")})
    assert plan(before, after, {"g": ("n1", "m1")}, {}) == [SetNodes(group="g", nodes=("n1", "n2"))]


def test_the_last_label_removed_takes_away_only_the_labelled_nodes() -> None:
    before = Desired(group_nodes={"g": ("n1", "n2")})
    assert plan(before, Desired(), {"g": ("n1", "n2", "m1")}, {}) == [
        SetNodes(group="g", nodes=("m1",))
    ]
    assert plan(before, Desired(), {"g": ("n1", "n2")}, {}) == [SetNodes(group="g", nodes=())]
    assert plan(before, Desired(), {"g": ("m1",)}, {}) == []


def test_pods_register_and_are_forgotten() -> None:
    key = ("g", "j", "n1")
    after = Desired(pods={key: UID_A})
    assert plan(Desired(), after, {}, {}) == [SetPod(group="g", job="j", node="n1", pod_uid=UID_A)]
    assert plan(Desired(), after, {}, {key: UID_A}) == []  # registered already (a restart)
    replaced = Desired(pods={key: UID_B})
    assert plan(after, replaced, {}, {key: UID_A}) == [
        SetPod(group="g", job="j", node="n1", pod_uid=UID_B)
    ]
    assert plan(after, Desired(), {}, {key: UID_A}) == [
        SetPod(group="g", job="j", node="n1", pod_uid=None)
    ]


def test_a_backend_someone_else_registered_is_not_forgotten() -> None:
    key = ("g", "j", "n1")
    # The operator registered the job anew: the table has no pod of discovery's.
    assert plan(Desired(pods={key: UID_A}), Desired(), {}, {}) == []


def test_a_pod_gone_while_discovery_was_down_is_forgotten_at_its_start() -> None:
    key = ("g", "j", "n1")
    assert plan(Desired(), Desired(), {}, {key: UID_A}) == [
        SetPod(group="g", job="j", node="n1", pod_uid=None)
    ]


def test_discovered_pods_are_read_back_from_the_tables_backends() -> None:
    backends = {
        "g": {
            "j": {"n1": pod_backend(UID_A), "": pod_backend(UID_B)},
            "k": {"n1": pod_backend(UID_B), "n2": {"cuda": {"explicitTarget": {"pids": [5]}}}},
        }
    }
    by = {("g", "j", "n1"): "timeslice:discovery", ("g", "j", ""): "timeslice:discovery"}
    found = discovered_pods(
        backends, lambda g, j, n: by.get((g, j, n), "ops"), "timeslice:discovery"
    )
    assert found == {("g", "j", "n1"): UID_A}


def test_the_pure_part_imports_no_io() -> None:
    code = (
        "import sys, timeslice.orchestrator.discovery as d;"
        "bad = {'asyncio', 'grpclib', 'sqlalchemy', 'kubernetes_asyncio', 'aiohttp'} & set(sys.modules);"
        "print(sorted(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
