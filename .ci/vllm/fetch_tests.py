"""Fetch vLLM's PyPI sdist and unpack its ``tests/`` folder (the only part used).

    python fetch_tests.py DEST

pip cannot build vLLM's sdist here, so the file itself is fetched: its address from PyPI's
simple index (the JSON form, as pip reads it), its SHA-256 checked against the one pinned
here, and only the members under ``vllm-VERSION/tests/`` unpacked into ``DEST/tests``.
"""

from __future__ import annotations

import hashlib
import io
import json
import sys
import tarfile
import urllib.request
from pathlib import Path

VERSION = "0.33.0"
SHA256 = "f4c33c2503d52bb411146afa9618a4f48bed68912f617e6803ac8d76e4c74112"
INDEX = "https://pypi.org/simple/vllm/"


def sdist_url() -> str:
    request = urllib.request.Request(
        INDEX, headers={"Accept": "application/vnd.pypi.simple.v1+json"}
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        files = json.load(response)["files"]
    name = f"vllm-{VERSION}.tar.gz"
    for entry in files:
        if entry["filename"] == name:
            return str(entry["url"])
    raise SystemExit(f"{INDEX} lists no {name}")


def main(dest: str) -> None:
    with urllib.request.urlopen(sdist_url(), timeout=600) as response:
        data = response.read()
    digest = hashlib.sha256(data).hexdigest()
    if digest != SHA256:
        raise SystemExit(f"vllm-{VERSION}.tar.gz has SHA-256 {digest}, not the pinned {SHA256}")
    prefix = f"vllm-{VERSION}/"
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as sdist:
        members = []
        for member in sdist.getmembers():
            if member.name.startswith(prefix + "tests/") and (member.isfile() or member.isdir()):
                member.name = member.name[len(prefix) :]
                members.append(member)
        sdist.extractall(Path(dest), members=members, filter="data")
    print(f"vLLM {VERSION}'s tests/ unpacked into {dest} ({len(members)} entries)")


if __name__ == "__main__":
    main(sys.argv[1])
