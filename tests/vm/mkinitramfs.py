#!/usr/bin/env python3
"""The cgroup v2 VM's initramfs: busybox-static, the init script and the kernel modules the init loads (with the
modules they depend on, read from each module's own .modinfo `depends=`), in the order they load, as an uncompressed
newc cpio archive.

    mkinitramfs.py MODULES_DIR INIT OUT MODULE...    MODULE: a name (9p, 9pnet_virtio, virtio_pci, ...)
"""
import os
import re
import stat
import sys


def index(modules_dir):
    """Module name -> path of its .ko under MODULES_DIR/kernel (names use '_' where files may use '-')."""
    found = {}
    for d, _, files in os.walk(modules_dir):
        for f in files:
            if f.endswith(".ko"):
                found[f[:-3].replace("-", "_")] = os.path.join(d, f)
    return found


def depends(path):
    data = open(path, "rb").read()
    m = re.search(rb"(?:^|\x00)depends=([^\x00]*)\x00", data)
    if not m or not m.group(1):
        return []
    return [n.decode().replace("-", "_") for n in m.group(1).split(b",") if n]


def order(wanted, known):
    out, seen = [], set()

    def visit(name, chain):
        if name in seen:
            return
        if name in chain:
            raise SystemExit(f"mkinitramfs: dependency cycle at {name}")
        if name not in known:
            raise SystemExit(f"mkinitramfs: no module {name} under the kernel's modules")
        for dep in depends(known[name]):
            visit(dep, chain + [name])
        seen.add(name)
        out.append(name)

    for w in wanted:
        visit(w.replace("-", "_"), [])
    return out


class Cpio:
    def __init__(self, f):
        self.f, self.ino = f, 1

    def entry(self, name, mode, data=b"", rdev=(0, 0)):
        name_b = name.encode() + b"\x00"
        hdr = "070701" + "".join(
            f"{v:08x}"
            for v in (self.ino, mode, 0, 0, 1, 0, len(data), 0, 0, rdev[0], rdev[1], len(name_b), 0)
        )
        self.ino += 1
        self.f.write(hdr.encode() + name_b)
        self.f.write(b"\x00" * ((4 - (110 + len(name_b)) % 4) % 4))
        self.f.write(data)
        self.f.write(b"\x00" * ((4 - len(data) % 4) % 4))

    def dir(self, name):
        self.entry(name, stat.S_IFDIR | 0o755)

    def file(self, name, data, mode=0o644):
        self.entry(name, stat.S_IFREG | mode, data)

    def end(self):
        self.entry("TRAILER!!!", 0)


def main():
    if len(sys.argv) < 4:
        raise SystemExit(__doc__)
    modules_dir, init, out, wanted = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
    known = index(modules_dir)
    names = order(wanted, known)
    tmp = out + ".tmp"
    with open(tmp, "wb") as f:
        c = Cpio(f)
        for d in ("bin", "dev", "proc", "sys", "newroot", "modules"):
            c.dir(d)
        c.entry("dev/console", stat.S_IFCHR | 0o600, rdev=(5, 1))
        c.file("bin/busybox", open("/bin/busybox", "rb").read(), 0o755)
        c.file("init", open(init, "rb").read(), 0o755)
        for i, n in enumerate(names):
            c.file(f"modules/{i:02d}-{n}.ko", open(known[n], "rb").read())
        c.end()
    os.replace(tmp, out)
    print(" ".join(names))


if __name__ == "__main__":
    main()
