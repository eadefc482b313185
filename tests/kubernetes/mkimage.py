#!/usr/bin/env python3
"""Write a one-layer OCI image archive of a directory, for a containerd with no registry to pull from.

    mkimage.py NAME ROOTFS OUT.tar [--entrypoint A,B] [--cmd X,Y] [--env K=V]...

NAME is the reference containerd files it under (`isthmus.local/busybox:1.35`); import the archive with
`ctr -n k8s.io images import OUT.tar`. The layer is an uncompressed tar of ROOTFS with every owner root and every
mtime 0, so the same directory always gives the same digest.
"""
import argparse
import hashlib
import io
import json
import os
import tarfile


def normalised(info):
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    info.mtime = 0
    return info


def layer_of(rootfs):
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for top, dirs, files in os.walk(rootfs):
            dirs.sort()
            rel = os.path.relpath(top, rootfs)
            if rel != ".":
                tar.add(top, arcname=rel, recursive=False, filter=normalised)
            for name in sorted(files):
                tar.add(os.path.join(top, name), arcname=os.path.normpath(os.path.join(rel, name)),
                        recursive=False, filter=normalised)
    return out.getvalue()


def digest(data):
    return "sha256:" + hashlib.sha256(data).hexdigest()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("name")
    ap.add_argument("rootfs")
    ap.add_argument("out")
    ap.add_argument("--entrypoint", default="")
    ap.add_argument("--cmd", default="")
    ap.add_argument("--env", action="append", default=[])
    a = ap.parse_args()
    words = lambda s: [w for w in s.split(",") if w] or None

    layer = layer_of(a.rootfs)
    config = json.dumps({
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "Env": a.env or ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
            "Entrypoint": words(a.entrypoint),
            "Cmd": words(a.cmd),
            "WorkingDir": "/",
        },
        "rootfs": {"type": "layers", "diff_ids": [digest(layer)]},
        "history": [{"created_by": "isthmus tests/kubernetes/mkimage.py"}],
    }, sort_keys=True).encode()
    manifest = json.dumps({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": digest(config),
                   "size": len(config)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": digest(layer),
                    "size": len(layer)}],
    }, sort_keys=True).encode()
    last = a.name.rsplit("/", 1)[-1]
    tag = last.rsplit(":", 1)[1] if ":" in last else "latest"
    index = json.dumps({
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": digest(manifest),
            "size": len(manifest),
            "platform": {"architecture": "amd64", "os": "linux"},
            "annotations": {"io.containerd.image.name": a.name, "org.opencontainers.image.ref.name": tag},
        }],
    }).encode()

    with tarfile.open(a.out, "w") as tar:
        def put(name, data):
            info = normalised(tarfile.TarInfo(name))
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
        put("oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
        put("index.json", index)
        for data in (layer, config, manifest):
            put("blobs/sha256/" + digest(data).split(":", 1)[1], data)
    print(a.name, digest(manifest))


if __name__ == "__main__":
    main()
