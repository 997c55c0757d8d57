"""Word-level toy tokenizer: token ``i`` is the word ``w{i}``; id 0 is end-of-sequence.

Any other word maps to a stable id through CRC-32, so every text encodes.
"""

from __future__ import annotations

import re
import zlib

VOCAB = 512
EOS = 0
_WORD = re.compile(r"w(\d+)")


def encode(text: str) -> list[int]:
    ids = []
    for word in text.split():
        m = _WORD.fullmatch(word)
        if m and 0 < int(m.group(1)) < VOCAB:
            ids.append(int(m.group(1)))
        else:
            ids.append(1 + zlib.crc32(word.encode()) % (VOCAB - 1))
    return ids


def decode(ids: list[int]) -> str:
    return "".join(f" w{i}" for i in ids if i != EOS)
