"""Groups, their nodes and their jobs' pods from Kubernetes labels, as the v1alpha1
system names them; pure (no I/O, no clock): the Kubernetes shell
(`timeslice.orchestrator.kubernetes`) feeds it the objects it lists and watches,
and carries out what `plan` returns through the orchestrator's own methods.

- A node labelled `group.timeslice.io/<group>=true` is one of `<group>`'s nodes,
  by its name (the name its agent registers with).
- A pod labelled `timeslice.io/job-id=<job>` and `timeslice.io/group=<group>`,
  scheduled on a node (`spec.nodeName`) and not finished, is that job's on that
  node: the job's backend there is `cuda` on the pod (`pod_uid`), registered as
  `DISCOVERY_REGISTRANT`. Two such pods of one job on one node: the first by
  namespace and name counts, the others are reported.

Discovery does not fight an operator: it acts only on what changes in Kubernetes
(`plan` compares what the labels say now with what they said when it last
acted, not with the table). A group whose labelled nodes change gets exactly
those nodes; a group that loses its last labelled node loses the nodes the labels
had given it and keeps any other; a group no node is labelled for is left as it
is set (`--group-nodes`, `timeslice group-nodes`, agents joining). A job's pod
that goes (or loses its labels) forgets the backend discovery registered, and
only that one: a backend someone else registered since stays.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from timeslice.errors import InvalidArgumentError
from timeslice.ids import check_id, check_node, check_pod_uid

NODE_GROUP_PREFIX: Final = "group.timeslice.io/"
JOB_LABEL: Final = "timeslice.io/job-id"
GROUP_LABEL: Final = "timeslice.io/group"
# Only pods with both labels are listed and watched.
POD_SELECTOR: Final = f"{JOB_LABEL},{GROUP_LABEL}"
# A pod in one of these phases has no processes left.
_FINISHED: Final = frozenset({"Succeeded", "Failed"})

# (group, job, node)
JobKey = tuple[str, str, str]


@dataclass(frozen=True, kw_only=True)
class NodeInfo:
    """What discovery reads of a Node: its name, and the groups it is labelled for."""

    name: str
    groups: frozenset[str] = frozenset()


@dataclass(frozen=True, kw_only=True)
class PodInfo:
    """What discovery reads of a labelled, scheduled, unfinished Pod."""

    uid: str
    name: str  # namespace/name, for logs
    node: str
    job: str
    group: str


@dataclass(frozen=True, kw_only=True)
class Desired:
    """What the labels say: each labelled group's nodes, each job's pod per node;
    and the pods left out because another pod of the job on that node counts."""

    group_nodes: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    pods: Mapping[JobKey, str] = field(default_factory=dict)
    duplicates: tuple[PodInfo, ...] = ()


@dataclass(frozen=True, kw_only=True)
class SetNodes:
    """Make `group` span `nodes` (none: no nodes)."""

    group: str
    nodes: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class SetPod:
    """Register `job`'s backend on `group` and `node` as `cuda` on pod `pod_uid`
    (None: forget it)."""

    group: str
    job: str
    node: str
    pod_uid: str | None


Action = SetNodes | SetPod


def node_info(obj: Mapping[str, Any]) -> NodeInfo:
    """A Node object's name and groups; InvalidArgumentError for one discovery
    cannot use (a bad name, a group label that is not `true` or names a bad id)."""
    metadata = mapping(obj.get("metadata"), "a node's metadata")
    name = metadata.get("name")
    if not isinstance(name, str):
        raise InvalidArgumentError("a node has no name")
    check_node(name)
    groups = set()
    for key, value in mapping(metadata.get("labels") or {}, "a node's labels").items():
        if isinstance(key, str) and key.startswith(NODE_GROUP_PREFIX) and value == "true":
            group = key.removeprefix(NODE_GROUP_PREFIX)
            check_id("group", group)
            groups.add(group)
    return NodeInfo(name=name, groups=frozenset(groups))


def pod_info(obj: Mapping[str, Any]) -> PodInfo | None:
    """A Pod object as discovery sees it: None when it is not a job's now (not both
    labels, not scheduled, finished); InvalidArgumentError when its labels or uid
    are not what ids may be."""
    metadata = mapping(obj.get("metadata"), "a pod's metadata")
    labels = mapping(metadata.get("labels") or {}, "a pod's labels")
    job, group = labels.get(JOB_LABEL), labels.get(GROUP_LABEL)
    if not isinstance(job, str) or not isinstance(group, str) or not job or not group:
        return None
    node = mapping(obj.get("spec") or {}, "a pod's spec").get("nodeName")
    phase = mapping(obj.get("status") or {}, "a pod's status").get("phase")
    if not isinstance(node, str) or not node or phase in _FINISHED:
        return None
    check_id("job_id", job)
    check_id("group", group)
    check_node(node)
    uid = check_pod_uid(metadata.get("uid"))
    name = f"{metadata.get('namespace', '')}/{metadata.get('name', '')}"
    return PodInfo(uid=uid, name=name[:256], node=node, job=job, group=group)


def desired(nodes: Iterable[NodeInfo], pods: Iterable[PodInfo]) -> Desired:
    """What the labels of `nodes` and `pods` say the settings should be."""
    group_nodes: dict[str, list[str]] = {}
    for node in sorted(nodes, key=lambda n: n.name):
        for group in node.groups:
            group_nodes.setdefault(group, []).append(node.name)
    chosen: dict[JobKey, PodInfo] = {}
    duplicates = []
    for pod in sorted(pods, key=lambda p: (p.name, p.uid)):
        key = (pod.group, pod.job, pod.node)
        if key in chosen:
            duplicates.append(pod)
        else:
            chosen[key] = pod
    return Desired(
        group_nodes={group: tuple(names) for group, names in sorted(group_nodes.items())},
        pods={key: pod.uid for key, pod in sorted(chosen.items())},
        duplicates=tuple(duplicates),
    )


def plan(
    before: Desired,
    after: Desired,
    nodes: Mapping[str, tuple[str, ...]],
    discovered: Mapping[JobKey, str],
) -> list[Action]:
    """What to set so that the table follows the labels' change from `before` (what
    discovery last acted on; empty at its start) to `after`, given the table's
    nodes per group now and the pods discovery has registered in it
    (`discovered`). Nothing for what the table already has."""
    actions: list[Action] = []
    for group, wanted in after.group_nodes.items():
        if before.group_nodes.get(group) != wanted and nodes.get(group, ()) != wanted:
            actions.append(SetNodes(group=group, nodes=wanted))
    for group, had in before.group_nodes.items():
        if group not in after.group_nodes:
            current = nodes.get(group, ())
            left = tuple(node for node in current if node not in had)
            if left != current:
                actions.append(SetNodes(group=group, nodes=left))
    for key, uid in after.pods.items():
        if before.pods.get(key) != uid and discovered.get(key) != uid:
            actions.append(SetPod(group=key[0], job=key[1], node=key[2], pod_uid=uid))
    for key in sorted(set(before.pods) | set(discovered)):
        if key not in after.pods and key in discovered:
            actions.append(SetPod(group=key[0], job=key[1], node=key[2], pod_uid=None))
    return actions


def pod_backend(uid: str) -> dict[str, Any]:
    """The backend config (as the table keeps it) of `cuda` on pod `uid`."""
    return {"cuda": {"explicitTarget": {"podUid": uid}}}


def discovered_pods(
    job_backends: Mapping[str, Mapping[str, Mapping[str, Mapping[str, Any]]]],
    registrant: Callable[[str, str, str], str],
    by: str,
) -> dict[JobKey, str]:
    """The pods the table has registered by `by`: (group, job, node) -> pod uid.
    `registrant(group, job, node)` says who registered each backend."""
    found = {}
    for group, jobs in job_backends.items():
        for job, per_node in jobs.items():
            for node, backend in per_node.items():
                if not node or registrant(group, job, node) != by:
                    continue
                target = backend.get("cuda", {}).get("explicitTarget", {})
                uid = target.get("podUid") if isinstance(target, Mapping) else None
                if isinstance(uid, str) and uid:
                    found[(group, job, node)] = uid
    return found


def mapping(value: object, what: str) -> Mapping[str, Any]:
    """`value` if it is a JSON object; InvalidArgumentError naming `what` if not."""
    if not isinstance(value, Mapping):
        raise InvalidArgumentError(f"{what} is not an object")
    return value
