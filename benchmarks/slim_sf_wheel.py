"""Drop Sample Factory's two deathmatch maps from its wheel, in place, so that its
wheels and fastrl's travel to the GPU machine in one transfer.

    python benchmarks/slim_sf_wheel.py .whl/sf/sample_factory-2.1.1-py3-none-any.whl

The GPU machine takes at most 64 MiB (67.1 MB) a call: fastrl's wheels are 39 MB
(vizdoom alone), Sample Factory's 27 MB, and its own wheel's 9.0 MB are 8.5 MB of
freedm.wad and dwango5.wad, compressed: maps of the deathmatch scenarios that
neither doom_battle nor doom_defend_the_center loads. Without them its set is
19 MB, and both sets with the repository ~64 MB. The wheel's RECORD loses their
two lines too, and pip installs what is left as it would the whole wheel.
"""
from __future__ import annotations

import os
import sys
import zipfile

DROPPED = ("sf_examples/vizdoom/doom/scenarios/freedm.wad", "sf_examples/vizdoom/doom/scenarios/dwango5.wad")


def slim(path: str) -> int:
    """Rewrite the wheel at `path` without DROPPED; returns the bytes saved."""
    before, tmp = os.path.getsize(path), path + ".tmp"
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as out:
        for info in src.infolist():
            if info.filename in DROPPED:
                continue
            data = src.read(info.filename)
            if info.filename.endswith(".dist-info/RECORD"):
                data = b"\n".join(line for line in data.split(b"\n")
                                  if line.split(b",")[0].decode() not in DROPPED)
            out.writestr(info, data)
    os.replace(tmp, path)
    return before - os.path.getsize(path)


if __name__ == "__main__":
    if len(sys.argv) != 2 or not sys.argv[1].endswith(".whl"):
        sys.exit("usage: python benchmarks/slim_sf_wheel.py PATH/sample_factory-2.1.1-py3-none-any.whl")
    print(f"{sys.argv[1]}: {slim(sys.argv[1]) / 1e6:.1f} MB smaller")
