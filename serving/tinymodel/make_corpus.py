"""Write `corpus.txt`: the plain English-like text the tiny model's tokenizer is trained on.

The text is authored here (word lists and sentence patterns written for this repo, no outside
source) and generated with a seeded RNG, so `python -m serving.tinymodel.make_corpus` always
writes the same bytes. The output is committed; the build script only reads it.
"""

from __future__ import annotations

import random
from pathlib import Path

SEED = 20261129
TARGET_BYTES = 400_000

NOUNS = (
    "river city garden engine market window teacher farmer letter bridge mountain village harbor "
    "station library kitchen forest meadow island candle lantern ladder basket compass doctor pilot "
    "sailor baker painter student invoice ledger report budget contract customer server request "
    "token cache replica cluster queue message batch record table column index schedule morning "
    "evening winter summer autumn spring storm cloud thunder valley canyon desert ocean coast "
    "road path journey question answer problem reason story song poem chapter picture model "
    "number measure price cost profit account balance payment order delivery warehouse factory "
    "machine signal network bottle coffee bread apple orange lemon cherry stone metal paper glass"
).split()
ADJECTIVES = (
    "quiet bright heavy gentle ancient modern careful sudden narrow wide golden silver green "
    "small large quick slow honest patient curious tired busy simple complex early late warm cold "
    "distant nearby hidden open empty full fair exact rough smooth clear cloudy steady restless "
    "private public daily monthly hourly cheap costly useful broken fresh"
).split()
VERBS = (
    "carries builds counts measures follows opens closes watches repairs paints writes reads "
    "answers sends receives records prices bills routes caches serves waits travels crosses "
    "gathers sorts checks finishes starts explains remembers forgets finds keeps shares lends "
    "borrows signs approves rejects settles reserves"
).split()
ADVERBS = (
    "slowly quickly carefully quietly often rarely always never soon later today gladly firmly "
    "gently nearly exactly simply openly"
).split()
PLACES = (
    "near the river|across the valley|inside the old station|behind the market|under the bridge|"
    "at the edge of the forest|in the small village|on the northern coast|beside the harbor|"
    "within the cluster|before the deadline|after the storm|during the long winter"
).split("|")
NAMES = (
    "Ada Bruno Clara Dmitri Elena Farid Greta Hugo Ines Jonas Keiko Luca Maya Nils Olga Pavel "
    "Quinn Rosa Sven Talia Umar Vera Wren Xavier Yara Zeno"
).split()
CONNECTIVES = ("and", "but", "so", "while", "because", "although", "until", "when")


def _noun_phrase(rng: random.Random) -> str:
    article = rng.choice(("the", "a", "every", "one", "that", "this"))
    if rng.random() < 0.6:
        return f"{article} {rng.choice(ADJECTIVES)} {rng.choice(NOUNS)}"
    return f"{article} {rng.choice(NOUNS)}"


def _clause(rng: random.Random) -> str:
    subject = rng.choice(NAMES) if rng.random() < 0.4 else _noun_phrase(rng)
    parts = [subject, rng.choice(VERBS), _noun_phrase(rng)]
    if rng.random() < 0.4:
        parts.append(rng.choice(ADVERBS))
    if rng.random() < 0.35:
        parts.append(rng.choice(PLACES))
    return " ".join(parts)


def _sentence(rng: random.Random) -> str:
    roll = rng.random()
    if roll < 0.12:
        count = rng.randint(2, 9999)
        text = f"{rng.choice(NAMES)} counted {count} {rng.choice(NOUNS)}s {rng.choice(PLACES)}"
    elif roll < 0.22:
        text = f"why does {_noun_phrase(rng)} {rng.choice(VERBS)[:-1]} {_noun_phrase(rng)}"
        return text[0].upper() + text[1:] + "?"
    elif roll < 0.55:
        text = f"{_clause(rng)} {rng.choice(CONNECTIVES)} {_clause(rng)}"
    else:
        text = _clause(rng)
    return text[0].upper() + text[1:] + rng.choice((".", ".", ".", "!", ";"))


def generate(seed: int = SEED, target_bytes: int = TARGET_BYTES) -> str:
    rng = random.Random(seed)
    paragraphs: list[str] = []
    size = 0
    while size < target_bytes:
        paragraph = " ".join(_sentence(rng) for _ in range(rng.randint(3, 9)))
        paragraphs.append(paragraph)
        size += len(paragraph) + 2
    return "\n\n".join(paragraphs) + "\n"


def main() -> None:
    path = Path(__file__).with_name("corpus.txt")
    path.write_text(generate(), encoding="utf-8")
    print(f"wrote {path} ({path.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
