#!/usr/bin/env python3
"""A CAMP-like workflow stage (Daley et al. §3.1.2, §4.3): CAMP-builddb.

CAMP (Community Access MODIS Pipeline) is a Python workflow installed in a Conda environment;
its `builddb` step reads small plain-text "geometa" files and records the mapping of satellite
swaths to sinusoidal tiles in an SQLite database, one small transaction at a time. Daley found it
metadata-bound: Python's start-up searches every directory of a long Python path for every
module it imports, and every SQLite transaction with the default pragmas creates, syncs and
deletes a journal file.

    builddb.py prepare DIR [FILES]   writes FILES geometa files into DIR/geometa and a small
                                     software environment (SITES package directories, each
                                     on the Python path, as Conda's are) into DIR/env
    builddb.py run DIR [--pragmas default|fast] [--transactions N]

`--pragmas fast` sets `synchronous=OFF` and `journal_mode=MEMORY`, the relaxed-consistency
variant of Daley §4.3 (Figure 9), which removes the journal's metadata operations.
"""

import argparse
import os
import sys


# 40 package directories on the path: with them the stage makes about 11.7K metadata and 6.9K
# read/write operations, close to what Daley measured for CAMP-builddb (11963 and 7413).
SITES = 40


def env_dirs(directory):
    return [os.path.join(directory, "env", f"site{k:02d}") for k in range(SITES)]


def prepare(directory, files):
    import compileall
    for k, site in enumerate(env_dirs(directory)):
        pkg = os.path.join(site, f"camp{k:02d}")
        os.makedirs(pkg, exist_ok=True)
        with open(os.path.join(pkg, "__init__.py"), "w") as f:
            f.write(f"from . import grid, swath, io\nNAME = 'camp{k:02d}'\n")
        for mod in ("grid", "swath", "io"):
            with open(os.path.join(pkg, mod + ".py"), "w") as f:
                f.write(f"def {mod}_version():\n    return {k}\n")
    # A real environment ships compiled bytecode: the stage must not write .pyc files.
    compileall.compile_dir(os.path.join(directory, "env"), quiet=1)
    geo = os.path.join(directory, "geometa")
    os.makedirs(geo, exist_ok=True)
    for i in range(files):
        with open(os.path.join(geo, f"MOD03_2016{i:03d}.txt"), "w") as f:
            f.write("# GranuleID StartDateTime ArchiveSet OrbitNumber DayNightFlag "
                    "EastBoundingCoord NorthBoundingCoord SouthBoundingCoord WestBoundingCoord\n")
            for g in range(40):
                lat = -80 + (i * 7 + g * 3) % 160
                lon = -180 + (i * 13 + g * 11) % 360
                f.write(f"MOD03.A2016{i:03d}.{g:04d}.061 2016-01-01 {g:02d}:{g % 60:02d} 61 "
                        f"{1000 + g} D {lon + 10.5:.4f} {lat + 10.5:.4f} {lat:.4f} {lon:.4f}\n")


# What a real analysis code pulls in: numerics, dates, parsing, logging, compression...
# Every import searches sys.path, stat-ing and opening files (Daley §4.2.2).
MODULES = [
    "json", "csv", "sqlite3", "decimal", "fractions", "statistics", "datetime", "calendar",
    "email.mime.text", "email.parser", "http.client", "urllib.request", "xml.etree.ElementTree",
    "xml.dom.minidom", "logging.handlers", "dataclasses", "typing", "pathlib", "tempfile",
    "shutil", "zipfile", "tarfile", "gzip", "bz2", "lzma", "hashlib", "hmac", "base64", "uuid",
    "random", "heapq", "bisect", "textwrap", "difflib", "pprint", "configparser", "pickle",
    "struct", "array", "queue", "concurrent.futures", "asyncio", "unittest", "plistlib",
    "mailbox", "smtplib", "ftplib", "imaplib", "netrc", "optparse", "getopt", "shelve",
    "dbm", "wave", "colorsys", "html.parser", "ipaddress", "secrets", "zoneinfo", "graphlib",
]


def tiles_of(line):
    """The sinusoidal tiles (h, v) a swath's bounding box touches (10-degree tiles)."""
    parts = line.split()
    east, north, south, west = (float(x) for x in parts[6:10])
    h0, h1 = int((west + 180) // 10), int((east + 180) // 10)
    v0, v1 = int((90 - north) // 10), int((90 - south) // 10)
    return parts[0], [(h, v) for h in range(h0, h1 + 1) for v in range(v0, v1 + 1)]


def run(directory, pragmas, transactions):
    import importlib
    # The environment's package directories come first on the path, as in a Conda install:
    # every import below searches all of them.
    sys.path[0:0] = env_dirs(directory)
    for k in range(SITES):
        importlib.import_module(f"camp{k:02d}")
    for m in MODULES:
        importlib.import_module(m)
    import sqlite3

    db_path = os.path.join(directory, "camp.db")
    for suffix in ("", "-journal"):
        if os.path.exists(db_path + suffix):
            os.unlink(db_path + suffix)
    db = sqlite3.connect(db_path)
    if pragmas == "fast":
        db.execute("PRAGMA synchronous=OFF")
        db.execute("PRAGMA journal_mode=MEMORY")
    db.execute("CREATE TABLE swath (granule TEXT PRIMARY KEY, file TEXT)")
    db.execute("CREATE TABLE tile (granule TEXT, h INTEGER, v INTEGER)")
    db.commit()
    geo = os.path.join(directory, "geometa")
    lines = []
    for name in sorted(os.listdir(geo)):
        with open(os.path.join(geo, name)) as f:
            lines.extend((name, line) for line in f if not line.startswith("#"))
    # One transaction per swath, as CAMP's builddb does: many small commits.
    done = 0
    for name, line in lines:
        if done >= transactions:
            break
        granule, tiles = tiles_of(line)
        db.execute("INSERT OR REPLACE INTO swath VALUES (?, ?)", (granule, name))
        db.executemany("INSERT INTO tile VALUES (?, ?, ?)", [(granule, h, v) for h, v in tiles])
        db.commit()
        done += 1
    count = db.execute("SELECT COUNT(*) FROM tile").fetchone()[0]
    db.close()
    print(f"builddb: {done} transactions, {count} tile rows in {db_path}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("dir")
    p.add_argument("files", nargs="?", type=int, default=20)
    r = sub.add_parser("run")
    r.add_argument("dir")
    r.add_argument("--pragmas", choices=["default", "fast"], default="default")
    r.add_argument("--transactions", type=int, default=300)
    a = ap.parse_args()
    if a.cmd == "prepare":
        prepare(a.dir, a.files)
    else:
        run(a.dir, a.pragmas, a.transactions)
    return 0


if __name__ == "__main__":
    sys.exit(main())
