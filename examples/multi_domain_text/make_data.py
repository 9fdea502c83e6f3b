"""Synthetic text tasks in three domains, written as verl RL parquet with a ``domain`` routing column.

    python examples/multi_domain_text/make_data.py            # -> examples/multi_domain_text/data/
    python examples/multi_domain_text/make_data.py --out /tmp/mdt --per-domain 500

Domains (one teacher each in ``recipe.yaml``):

- ``arithmetic``: ``Compute 37 + 8 * 3.`` -> ``61``
- ``strings``:    ``Reverse the letters of "planet".`` -> ``tenalp``
- ``sorting``:    ``Sort in ascending order: 9 2 7 4`` -> ``2 4 7 9``

Each row has verl's RLHFDataset columns (``data_source``, ``prompt``, ``ability``,
``reward_model = {"style": "rule", "ground_truth"}``, ``extra_info``) and a top-level ``domain``
column: verl's ``distillation.teacher_key`` and ``mopd.routing_key`` read top-level columns. To add a
domain, add a generator to ``DOMAINS`` and a teacher under ``mopd.teachers``.
"""

from __future__ import annotations

import argparse
import random
import string
from collections import Counter
from pathlib import Path

SYSTEM = "Solve the task. End with one line of the form 'Answer: <answer>'."
WORDS = ["planet", "garden", "silver", "orange", "window", "bridge", "forest", "candle", "rocket", "pencil",
         "marble", "stream", "castle", "jungle", "violet", "anchor", "meadow", "saddle", "harbor", "tunnel"]


def arithmetic(rng: random.Random) -> tuple[str, str]:
    a, b, c = rng.randint(2, 99), rng.randint(2, 12), rng.randint(2, 12)
    op = rng.choice(["+", "-"])
    value = a + b * c if op == "+" else a - b * c
    return f"Compute {a} {op} {b} * {c}.", str(value)


def strings(rng: random.Random) -> tuple[str, str]:
    if rng.random() < 0.5:
        word = rng.choice(WORDS)
    else:
        word = "".join(rng.choices(string.ascii_lowercase, k=rng.randint(4, 8)))
    return f'Reverse the letters of "{word}".', word[::-1]


def sorting(rng: random.Random) -> tuple[str, str]:
    numbers = [rng.randint(0, 99) for _ in range(rng.randint(4, 7))]
    return f"Sort in ascending order: {' '.join(map(str, numbers))}", " ".join(map(str, sorted(numbers)))


DOMAINS = {"arithmetic": arithmetic, "strings": strings, "sorting": sorting}


def make_rows(
    per_domain: int, seed: int, split: str, domains: tuple[str, ...] = tuple(DOMAINS)
) -> list[dict]:
    """``per_domain`` rows of each domain, interleaved (a, s, t, a, s, t, ...), seeded per split."""
    unknown = sorted(set(domains) - set(DOMAINS))
    if unknown:
        raise ValueError(f"domains {unknown} unknown; allowed: {sorted(DOMAINS)}")
    rng = random.Random(f"{seed}-{split}")
    rows = []
    for i in range(per_domain):
        for domain in domains:
            question, answer = DOMAINS[domain](rng)
            rows.append({
                "data_source": f"multi_domain_text/{domain}",
                "prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
                "ability": domain,
                "reward_model": {"style": "rule", "ground_truth": answer},
                "extra_info": {"domain": domain, "index": i, "split": split},
                "domain": domain,
            })
    return rows


def write(out: Path, per_domain: int, val_per_domain: int, seed: int) -> dict[str, Counter]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    out.mkdir(parents=True, exist_ok=True)
    counts = {}
    for split, n in (("train", per_domain), ("val", val_per_domain)):
        rows = make_rows(n, seed, split)
        pq.write_table(pa.Table.from_pylist(rows), out / f"{split}.parquet")
        counts[split] = Counter(r["domain"] for r in rows)
    return counts


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=str(Path(__file__).parent / "data"))
    p.add_argument("--per-domain", type=int, default=256, help="train rows per domain")
    p.add_argument("--val-per-domain", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    counts = write(Path(args.out), args.per_domain, args.val_per_domain, args.seed)
    for split, c in counts.items():
        per = ", ".join(f"{d} {n}" for d, n in c.items())
        print(f"{args.out}/{split}.parquet: {sum(c.values())} rows, {per}")


if __name__ == "__main__":
    main()
