"""A small, pure-Python kustomize renderer for the manifests under k8s/.

It supports exactly what those manifests use, and fails loudly on anything else:

* `resources`: YAML files (multi-document) and directories with a kustomization;
* `namespace`: set on every namespaced object;
* `images`: `name` -> `newName` / `newTag` / `digest` on containers and initContainers;
* `patches` (and the older `patchesStrategicMerge`): strategic-merge patches
  matched by kind + name (or by a `target`), and JSON 6902 patches (a YAML list
  of operations) with a `target`.

The strategic merge knows the merge keys of the lists these manifests patch
(containers and volumes by name, env by name, ports by containerPort/port,
volumeMounts by mountPath); other lists are replaced, `key: null` deletes.
Where `kubectl kustomize` exists the unit tests compare both renderings.

    python -m deploy_tools.kustomize_render k8s/overlays/gpu > rendered.yaml
"""

from __future__ import annotations

import copy
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

KUSTOMIZATION_FILES = ("kustomization.yaml", "kustomization.yml", "Kustomization")
SUPPORTED_KEYS = frozenset({
    "apiVersion", "kind", "resources", "namespace", "images", "patches",
    "patchesStrategicMerge",
})
CLUSTER_SCOPED_KINDS = frozenset({
    "Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition",
    "PersistentVolume", "StorageClass", "PriorityClass", "IngressClass",
    "ValidatingWebhookConfiguration", "MutatingWebhookConfiguration", "RuntimeClass",
})
MERGE_KEYS = {
    "containers": ("name",),
    "initContainers": ("name",),
    "ephemeralContainers": ("name",),
    "volumes": ("name",),
    "env": ("name",),
    "volumeMounts": ("mountPath",),
    "imagePullSecrets": ("name",),
    "ports": ("containerPort", "port"),
}
DIRECTIVE = "$patch"

Obj = dict[str, Any]


class KustomizeError(ValueError):
    """The kustomization uses something this renderer does not support, or is wrong."""


@dataclass(frozen=True)
class ResId:
    """Identity of a rendered object."""

    kind: str
    name: str
    namespace: str | None

    @classmethod
    def of(cls, obj: Obj) -> "ResId":
        """The id of a manifest."""
        meta = obj.get("metadata") or {}
        return cls(obj["kind"], meta["name"], meta.get("namespace"))


def load_yaml_documents(path: Path) -> list[Obj]:
    """Non-empty YAML documents of a file."""
    with path.open(encoding="utf-8") as handle:
        return [doc for doc in yaml.safe_load_all(handle) if doc]


def find_kustomization(directory: Path) -> Path:
    """The kustomization file of a directory."""
    for name in KUSTOMIZATION_FILES:
        candidate = directory / name
        if candidate.is_file():
            return candidate
    raise KustomizeError(f"no kustomization file in {directory}")


def render(directory: str | Path) -> list[Obj]:
    """Render the kustomization in `directory` into a list of manifests."""
    directory = Path(directory)
    kustomization = load_yaml_documents(find_kustomization(directory))[0]
    unsupported = set(kustomization) - SUPPORTED_KEYS
    if unsupported:
        raise KustomizeError(f"{directory}: unsupported fields {sorted(unsupported)}")
    objects = _load_resources(directory, kustomization.get("resources", []))
    for patch in _patch_entries(directory, kustomization):
        _apply_patch_entry(objects, patch)
    if kustomization.get("images"):
        for obj in objects:
            _set_images(obj, kustomization["images"])
    if kustomization.get("namespace"):
        for obj in objects:
            _set_namespace(obj, kustomization["namespace"])
    _check_unique(objects)
    return objects


def _load_resources(directory: Path, entries: list[str]) -> list[Obj]:
    """Objects from resource files and sub-kustomizations, in order."""
    objects: list[Obj] = []
    for entry in entries:
        path = (directory / entry).resolve()
        if path.is_dir():
            objects.extend(render(path))
        elif path.is_file():
            objects.extend(load_yaml_documents(path))
        else:
            raise KustomizeError(f"{directory}: resource {entry!r} not found")
    return objects


def _check_unique(objects: list[Obj]) -> None:
    """Two objects with the same kind, namespace and name are an error."""
    seen: set[ResId] = set()
    for obj in objects:
        rid = ResId.of(obj)
        if rid in seen:
            raise KustomizeError(f"duplicate object {rid}")
        seen.add(rid)


def _patch_entries(directory: Path, kustomization: Obj) -> list[Obj]:
    """Normalised patch entries: {'docs': [...], 'target': {...} | None}."""
    entries: list[Obj] = []
    for item in kustomization.get("patchesStrategicMerge", []):
        entries.append({"docs": load_yaml_documents(directory / item), "target": None})
    for item in kustomization.get("patches", []):
        if "path" in item:
            docs = load_yaml_documents(directory / item["path"])
        elif "patch" in item:
            docs = [doc for doc in yaml.safe_load_all(item["patch"]) if doc]
        else:
            raise KustomizeError(f"{directory}: patch without path or patch: {item}")
        entries.append({"docs": docs, "target": item.get("target")})
    return entries


def _matches(obj: Obj, target: Obj) -> bool:
    """Does `obj` match a patch target (kind, name, namespace, group, version)?"""
    api_version = obj.get("apiVersion", "")
    group, _sep, version = api_version.rpartition("/")
    actual = {"kind": obj.get("kind"), "name": obj["metadata"].get("name"),
              "namespace": obj["metadata"].get("namespace"), "group": group,
              "version": version}
    for key, wanted in target.items():
        if key not in actual:
            raise KustomizeError(f"unsupported patch target field {key!r}")
        if actual[key] != wanted:
            return False
    return True


def _apply_patch_entry(objects: list[Obj], entry: Obj) -> None:
    """Apply one `patches` entry to every object it targets."""
    docs, target = entry["docs"], entry["target"]
    if len(docs) == 1 and isinstance(docs[0], list):
        if not target:
            raise KustomizeError("a JSON 6902 patch needs a target")
        _apply_to_targets(objects, target, lambda obj: apply_json6902(obj, docs[0]))
        return
    for doc in docs:
        doc_target = target or {"kind": doc["kind"], "name": doc["metadata"]["name"]}
        _apply_to_targets(objects, doc_target,
                          lambda obj, doc=doc: strategic_merge(obj, _without_identity(doc)))


def _apply_to_targets(objects: list[Obj], target: Obj, transform) -> None:
    """Replace each matching object by transform(object); none matching is an error."""
    hits = 0
    for index, obj in enumerate(objects):
        if _matches(obj, target):
            objects[index] = transform(obj)
            hits += 1
    if not hits:
        raise KustomizeError(f"patch target {target} matches no object")


def _without_identity(patch: Obj) -> Obj:
    """A strategic-merge patch minus the fields that only identify its target."""
    body = {k: v for k, v in patch.items() if k not in ("apiVersion", "kind")}
    meta = {k: v for k, v in (body.get("metadata") or {}).items() if k != "name"}
    if meta:
        body["metadata"] = meta
    else:
        body.pop("metadata", None)
    return body


def strategic_merge(base: Any, patch: Any, field_name: str = "") -> Any:
    """Strategic merge of `patch` into a copy of `base` (maps merge, null deletes)."""
    if isinstance(patch, dict) and isinstance(base, dict):
        if patch.get(DIRECTIVE) == "replace":
            return {k: copy.deepcopy(v) for k, v in patch.items() if k != DIRECTIVE}
        merged = copy.deepcopy(base)
        for key, value in patch.items():
            if value is None:
                merged.pop(key, None)
            elif key in merged:
                merged[key] = strategic_merge(merged[key], value, key)
            else:
                merged[key] = copy.deepcopy(value)
        return merged
    if isinstance(patch, list) and isinstance(base, list) and field_name in MERGE_KEYS:
        return _merge_keyed_list(base, patch, MERGE_KEYS[field_name])
    return copy.deepcopy(patch)


def _list_key(item: Any, candidates: tuple[str, ...]) -> tuple[str, Any] | None:
    """(merge key, value) of a list item, trying each candidate key."""
    if isinstance(item, dict):
        for key in candidates:
            if key in item:
                return key, item[key]
    return None


def _merge_keyed_list(base: list, patch: list, candidates: tuple[str, ...]) -> list:
    """Merge list items with equal merge keys; `$patch: delete` removes; new items append."""
    merged = copy.deepcopy(base)
    for item in patch:
        key = _list_key(item, candidates)
        if key is None:
            raise KustomizeError(f"list item without merge key {candidates}: {item}")
        index = next((i for i, old in enumerate(merged) if _list_key(old, candidates) == key),
                     None)
        if isinstance(item, dict) and item.get(DIRECTIVE) == "delete":
            if index is not None:
                merged.pop(index)
        elif index is None:
            merged.append(copy.deepcopy(item))
        else:
            merged[index] = strategic_merge(merged[index], item)
    return merged


def _pointer_parts(pointer: str) -> list[str]:
    """Split a JSON pointer into unescaped reference tokens."""
    if not pointer.startswith("/"):
        raise KustomizeError(f"bad JSON pointer {pointer!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in pointer[1:].split("/")]


def apply_json6902(obj: Obj, operations: list[Obj]) -> Obj:
    """Apply JSON 6902 operations (add, replace, remove) to a copy of `obj`."""
    result = copy.deepcopy(obj)
    for operation in operations:
        op, parts = operation["op"], _pointer_parts(operation["path"])
        parent: Any = result
        for part in parts[:-1]:
            parent = parent[int(part)] if isinstance(parent, list) else parent[part]
        last = parts[-1]
        if isinstance(parent, list):
            index = len(parent) if last == "-" else int(last)
            if op == "add":
                parent.insert(index, copy.deepcopy(operation["value"]))
            elif op == "replace":
                parent[index] = copy.deepcopy(operation["value"])
            elif op == "remove":
                parent.pop(index)
            else:
                raise KustomizeError(f"unsupported JSON 6902 op {op!r}")
        elif op in ("add", "replace"):
            if op == "replace" and last not in parent:
                raise KustomizeError(f"replace of missing path {operation['path']}")
            parent[last] = copy.deepcopy(operation["value"])
        elif op == "remove":
            del parent[last]
        else:
            raise KustomizeError(f"unsupported JSON 6902 op {op!r}")
    return result


def _image_name(image: str) -> str:
    """Image reference without tag or digest."""
    without_digest = image.split("@", 1)[0]
    slash = without_digest.rfind("/")
    colon = without_digest.rfind(":")
    return without_digest[:colon] if colon > slash else without_digest


def _pod_spec(obj: Obj) -> Obj | None:
    """The pod spec inside a workload (or a Pod), if any."""
    spec = obj.get("spec") or {}
    if obj.get("kind") == "Pod":
        return spec
    template = spec.get("jobTemplate", {}).get("spec", spec).get("template")
    return (template or {}).get("spec")


def _set_images(obj: Obj, images: list[Obj]) -> None:
    """Rewrite container images per the `images` list."""
    pod = _pod_spec(obj)
    if not pod:
        return
    for container in pod.get("containers", []) + pod.get("initContainers", []):
        name = _image_name(container["image"])
        rule = next((r for r in images if r["name"] == name), None)
        if rule is None:
            continue
        new_name = rule.get("newName", name)
        if "digest" in rule:
            container["image"] = f"{new_name}@{rule['digest']}"
        else:
            old_tag = container["image"][len(name):]
            container["image"] = f"{new_name}:{rule['newTag']}" if "newTag" in rule \
                else f"{new_name}{old_tag}"


def _set_namespace(obj: Obj, namespace: str) -> None:
    """Set metadata.namespace on namespaced objects."""
    if obj["kind"] not in CLUSTER_SCOPED_KINDS:
        obj.setdefault("metadata", {})["namespace"] = namespace


def main(argv: list[str] | None = None) -> int:
    """CLI: render a kustomization directory to stdout as a YAML stream."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m deploy_tools.kustomize_render DIR", file=sys.stderr)
        return 2
    yaml.safe_dump_all(render(args[0]), sys.stdout, sort_keys=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
