"""Benchmark helper: a bundle whose target is bundle A's and whose draft is one model of bundle B,
without exporting the target again (a 1.5B fp32 export takes ~20 min here).

    python tools/graft_draft.py --target-bundle engines/coder --draft-from engines/coder05:target \
        --recipe model --out engines/coder-d32
    python tools/graft_draft.py --target-bundle engines/coder --draft-from engines/coder05:draft \
        --recipe model-int4 --out engines/coder-d4

The new folder links A's target/ and tokenizer files and B's model folder as draft/, and writes
a manifest that is A's with the draft entry replaced (its graph paths moved to draft/, its recipe
set: a quantized copy of B's own target is a separate draft for A, not a self-draft). The draft's
export-time parity numbers are B's (against the 0.5B itself, not agreement with A's target).
Same vocabulary is the caller's job (both from the same family's GGUFs here).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from pathlib import Path

from specrt.runtime.bundle.manifest import load_manifest


def graft(target_bundle: Path, draft_from: str, recipe: str, out: Path) -> Path:
    folder, role = draft_from.rsplit(":", 1)
    a, b = load_manifest(target_bundle), load_manifest(folder)
    entry = getattr(b, role)
    if entry is None or entry.vocab_size != a.target.vocab_size:
        raise SystemExit(f"{draft_from}: no {role} model with vocabulary {a.target.vocab_size}")
    out.mkdir(parents=True, exist_ok=False)
    for name in os.listdir(target_bundle):
        if name not in ("draft", "specrt.json", "genai_config.json"):
            os.symlink(Path(target_bundle).resolve() / name, out / name)
    os.symlink(Path(folder).resolve() / role, out / "draft")
    moved = {f: (getattr(entry, f) or "").replace(f"{role}/", "draft/", 1) or None for f in ("graph", "data")}
    draft = dataclasses.replace(entry, recipe=recipe, default_k=0, **moved)
    dataclasses.replace(a, name=out.name, draft=draft).save(out)
    load_manifest(out)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target-bundle", type=Path, required=True)
    ap.add_argument("--draft-from", required=True, help="BUNDLE:target or BUNDLE:draft")
    ap.add_argument("--recipe", required=True, help="recipe recorded for the draft (model, model-int8, model-int4)")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    print(graft(a.target_bundle, a.draft_from, a.recipe, a.out))


if __name__ == "__main__":
    main()
