"""Writes examples/data/arith.jsonl, the dataset of examples/smollm2-arith.yaml:
every sum a + b with a and b in 0..19, asked in words, one JSON object per line.

    python examples/data/make_arith.py            # rewrites the file next to this script
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def rows() -> list[dict]:
    return [{"prompt": f"What is {a} + {b}?", "answer": str(a + b), "a": a, "b": b}
            for a in range(20) for b in range(20)]


def main(out: Path) -> None:
    out.write_text("".join(json.dumps(r) + "\n" for r in rows()), encoding="utf-8")
    print(f"wrote {out} ({len(rows())} rows)")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).with_name("arith.jsonl"))
