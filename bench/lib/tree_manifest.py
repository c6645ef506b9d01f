#!/usr/bin/env python3
# The tree under a directory, one line per entry, for comparing a job's view of a cache
# instance with the PFS after the drain (bench/cache_fsstress.sh): D dir mode, F file mode size
# sha256, L symlink target, O other (FIFO, socket, device: type), H hard-link groups.
import os, sys, hashlib, stat
root = sys.argv[1]
out = []
inodes = {}
for d, dirs, files in os.walk(root):
    dirs[:] = sorted(x for x in dirs if x != '.surge-through')
    rel = os.path.relpath(d, root)
    st = os.lstat(d)
    out.append(f"D {rel} {stat.S_IMODE(st.st_mode):o}")
    for f in sorted(files):
        p = os.path.join(d, f); r = os.path.relpath(p, root)
        st = os.lstat(p)
        if stat.S_ISLNK(st.st_mode):
            out.append(f"L {r} -> {os.readlink(p)}")
        elif stat.S_ISREG(st.st_mode):
            hd = hashlib.sha256()
            with open(p, 'rb') as fh:
                for chunk in iter(lambda: fh.read(8 << 20), b''):
                    hd.update(chunk)
            h = hd.hexdigest()[:16]
            inodes.setdefault(st.st_ino, []).append(r)
            out.append(f"F {r} {stat.S_IMODE(st.st_mode):o} {st.st_size} {h}")
        else:
            out.append(f"O {r} {stat.S_IFMT(st.st_mode):o}")
for names in inodes.values():
    if len(names) > 1:
        out.append("H " + " = ".join(sorted(names)))
print("\n".join(sorted(out)))
