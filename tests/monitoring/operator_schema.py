#!/usr/bin/env python3
"""Check Prometheus Operator objects against the operator's own schemas.

The schemas are the operator's CustomResourceDefinitions (prometheus-operator v0.80.1) as PyPI's
`cloudcoil-models-prometheus-operator` carries them: pydantic models generated from those CRDs, with their types,
required fields, enums and patterns. Reads multi-document YAML files and prints one JSON line per object of group
`monitoring.coreos.com`:

    {"kind": ..., "name": ..., "errors": [...], "unknown": [...]}

`errors` are the schema's violations (path and message); `unknown` the fields the schema does not have, which an
API server serving the operator's CRDs would prune without a word. Exit status 0 when every object is clean, 1 when
one is not, 2 when the input cannot be read.
"""

import json
import sys

import yaml

try:
    from cloudcoil.models.prometheus_operator import v1
except ImportError as e:  # pragma: no cover - the tool's own installation
    print(f"cloudcoil-models-prometheus-operator is not installed ({e}); `make deploy-tools` installs it",
          file=sys.stderr)
    sys.exit(2)

GROUP = "monitoring.coreos.com/"


def unknown_fields(given, kept, path=""):
    """The paths of `given` that `kept` (the model's dump of it) lost."""
    lost = []
    if isinstance(given, dict):
        if not isinstance(kept, dict):
            return [path or "/"]
        for key, value in given.items():
            sub = f"{path}/{key}"
            if key not in kept:
                lost.append(sub)
            else:
                lost.extend(unknown_fields(value, kept[key], sub))
    elif isinstance(given, list) and isinstance(kept, list):
        for i, (g, k) in enumerate(zip(given, kept)):
            lost.extend(unknown_fields(g, k, f"{path}/{i}"))
    return lost


def check(doc):
    kind = doc.get("kind", "")
    model = getattr(v1, kind, None) if doc.get("apiVersion") == GROUP + "v1" else None
    name = (doc.get("metadata") or {}).get("name", "")
    result = {"kind": kind, "name": name, "errors": [], "unknown": []}
    if model is None:
        result["errors"].append(f"{doc.get('apiVersion')}/{kind} is not a kind of the operator's v1 API")
        return result
    try:
        obj = model.model_validate(doc)
    except Exception as e:  # pydantic.ValidationError: one line per violation
        errors = getattr(e, "errors", None)
        if callable(errors):
            for err in errors():
                loc = "/".join(str(p) for p in err.get("loc", ()))
                result["errors"].append(f"/{loc}: {err.get('msg')}")
        else:
            result["errors"].append(str(e))
        return result
    kept = obj.model_dump(by_alias=True, exclude_unset=True, mode="json")
    result["unknown"] = unknown_fields(doc, kept)
    return result


def main(paths):
    clean = True
    for path in paths:
        try:
            with open(path, encoding="utf-8") as f:
                docs = [d for d in yaml.safe_load_all(f) if d]
        except (OSError, yaml.YAMLError) as e:
            print(f"{path}: {e}", file=sys.stderr)
            return 2
        for doc in docs:
            if not str(doc.get("apiVersion", "")).startswith(GROUP):
                continue
            result = check(doc)
            clean = clean and not result["errors"] and not result["unknown"]
            print(json.dumps(result))
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
