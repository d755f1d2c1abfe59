"""`Orchestrator(kubernetes=True)` against a small Kubernetes API server of the tests
(tests/fakes/fake_kubernetes.py): labels on nodes and pods become the groups' nodes
and the jobs' pod backends within a second, and their removal undoes it; a 410
Gone relists; the API server going away and coming back is retried, and granting
goes on meanwhile."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.fakes.fake_kubernetes import FakeKubernetes
from tests.optional import need
from tests.waiting import until
from timeslice.errors import InvalidArgumentError
from timeslice.orchestrator.discovery import pod_backend
from timeslice.orchestrator.kubernetes import DiscoveryLimits
from timeslice.orchestrator.server import Orchestrator
from timeslice.security.principals import DISCOVERY_REGISTRANT

need("kubernetes_asyncio")

pytestmark = pytest.mark.timeout(30)

UID = "aaaaaaaa-0000-4000-8000-000000000001"
JOB = {"timeslice.io/job-id": "trainer", "timeslice.io/group": "g"}
FAST = DiscoveryLimits(retry_min=0.05, retry_max=0.2, page_size=2)


@pytest.fixture
async def kube() -> AsyncIterator[FakeKubernetes]:
    server = FakeKubernetes()
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
async def orch(kube: FakeKubernetes, tmp_path: Path) -> AsyncIterator[Orchestrator]:
    config = tmp_path / "kubeconfig"
    config.write_text(kube.kubeconfig())
    async with Orchestrator(kubernetes=True, kubeconfig=str(config)) as orch:
        assert orch.discovery is not None
        orch.discovery.limits = FAST
        yield orch


def nodes_of(orch: Orchestrator, group: str) -> tuple[str, ...]:
    return orch.table.nodes.get(group, ())


def pod_of(orch: Orchestrator, job: str, node: str) -> dict[str, object] | None:
    return orch.table.job_backends.get("g", {}).get(job, {}).get(node)


async def test_node_labels_become_the_groups_nodes(
    kube: FakeKubernetes, orch: Orchestrator
) -> None:
    kube.put_node("n1", {"group.timeslice.io/g": "true", "other": "x"})
    await until(lambda: nodes_of(orch, "g") == ("n1",), "n1 in g", timeout=1)
    kube.put_node("n2", {"group.timeslice.io/g": "true", "group.timeslice.io/h": "true"})
    await until(lambda: nodes_of(orch, "g") == ("n1", "n2"), "n2 in g", timeout=1)
    assert nodes_of(orch, "h") == ("n2",)
    kube.put_node("n1", {})  # the label removed
    await until(lambda: nodes_of(orch, "g") == ("n2",), "n1 out of g", timeout=1)
    kube.put_node("n2", {"group.timeslice.io/h": "true"})
    await until(lambda: nodes_of(orch, "g") == (), "g has no nodes", timeout=1)
    assert nodes_of(orch, "h") == ("n2",)


async def test_pod_labels_register_the_job_on_its_node(
    kube: FakeKubernetes, orch: Orchestrator
) -> None:
    kube.put_pod("trainer-0", UID, "n1", JOB)
    await until(lambda: pod_of(orch, "trainer", "n1") is not None, "trainer registered", timeout=1)
    assert pod_of(orch, "trainer", "n1") == pod_backend(UID)
    assert orch.table.registrant("g", "trainer", "n1") == DISCOVERY_REGISTRANT
    kube.label_pod(UID, {"timeslice.io/job-id": "trainer"})  # the group label removed
    await until(lambda: pod_of(orch, "trainer", "n1") is None, "trainer forgotten", timeout=1)
    kube.label_pod(UID, JOB)
    await until(lambda: pod_of(orch, "trainer", "n1") is not None, "registered again", timeout=1)
    kube.delete_pod(UID)
    await until(lambda: pod_of(orch, "trainer", "n1") is None, "pod deleted", timeout=1)


async def test_groups_without_labelled_nodes_are_the_operators(
    kube: FakeKubernetes, orch: Orchestrator
) -> None:
    await orch.set_group_nodes("manual", ("m1",))
    kube.put_node("n1", {"group.timeslice.io/g": "true"})
    await until(lambda: nodes_of(orch, "g") == ("n1",), "n1 in g", timeout=1)
    await orch.set_group_nodes("g", ("n1", "m2"))  # an operator adds a node
    kube.put_node("n9", {"unrelated": "x"})
    kube.put_pod("p", UID, "n1", JOB)
    await until(lambda: pod_of(orch, "trainer", "n1") is not None, "trainer registered", timeout=1)
    assert nodes_of(orch, "g") == ("n1", "m2") and nodes_of(orch, "manual") == ("m1",)
    kube.put_node("n1", {})  # the last label: only the labelled node leaves
    await until(lambda: nodes_of(orch, "g") == ("m2",), "n1 out of g", timeout=1)


async def test_a_410_gone_lists_again(kube: FakeKubernetes, orch: Orchestrator) -> None:
    for i in range(5):  # more than a page
        kube.put_node(f"n{i}", {"group.timeslice.io/g": "true"})
    await until(lambda: len(nodes_of(orch, "g")) == 5, "five nodes", timeout=1)
    lists = sum(1 for r in kube.requests if r.startswith("/api/v1/nodes") and "watch" not in r)
    kube.expire_watches()
    kube.put_node("n0", {})  # a change only a new list (or watch from its version) sees
    await until(lambda: len(nodes_of(orch, "g")) == 4, "n0 out", timeout=1)
    relisted = sum(1 for r in kube.requests if r.startswith("/api/v1/nodes") and "watch" not in r)
    assert relisted > lists
    assert any("continue=" in r for r in kube.requests)  # listed in pages


async def test_the_api_server_going_away_and_back(kube: FakeKubernetes, orch: Orchestrator) -> None:
    kube.put_node("n1", {"group.timeslice.io/g": "true"})
    await until(lambda: nodes_of(orch, "g") == ("n1",), "n1 in g", timeout=1)
    await kube.stop()
    # Meanwhile the orchestrator grants as ever.
    grant = await orch.acquire("other", "job-a", wait_timeout=5)
    assert grant.token > 0
    kube.put_node("n2", {"group.timeslice.io/g": "true"})
    kube.put_pod("p", UID, "n2", JOB)
    kube.compact()  # and its history is gone, as after a restart of etcd's watch cache
    await kube.start()
    await until(lambda: nodes_of(orch, "g") == ("n1", "n2"), "n2 in g", timeout=3)
    await until(lambda: pod_of(orch, "trainer", "n2") is not None, "trainer registered", timeout=3)


async def test_a_bad_configuration_fails_the_start(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="no such file"):
        async with Orchestrator(kubernetes=True, kubeconfig=str(tmp_path / "missing")):
            pass
    (tmp_path / "bad").write_text("{}")
    with pytest.raises(InvalidArgumentError, match="kubernetes configuration from"):
        async with Orchestrator(kubernetes=True, kubeconfig=str(tmp_path / "bad")):
            pass
    with pytest.raises(InvalidArgumentError, match="only with kubernetes"):
        Orchestrator(kubeconfig=str(tmp_path / "bad"))
