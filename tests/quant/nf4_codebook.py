#!/usr/bin/env python3
"""Recomputes the NF4 codebook from the QLoRA paper's recipe and checks runtime/quant/nf4.h's
kNf4Codebook against it bit for bit. Run by ctest as quant.Nf4CodebookIsThePapersNormalQuantiles;
`python3 tests/quant/nf4_codebook.py` prints the table.

The recipe (QLoRA, section 3): quantiles of N(0, 1) at probabilities evenly spaced from
offset = 1 - (1/32 + 1/30) / 2 = 0.9677083 down to 1/2, 8 positive (of 9 points, the last being 0) and 7
negative (of 8 points), plus an exact 0, divided by the largest. The published fp32 values (the
paper's appendix E) come out exactly when the evenly spaced probabilities are fp32 numbers, as the
reference implementation computes them (torch.linspace in fp32: start + i * step for the first
half, end - (steps - 1 - i) * step for the second), the quantiles are taken in double and rounded
to fp32, and the division is done in fp32. Standard library only (statistics.NormalDist)."""
import os
import re
import struct
import sys
from statistics import NormalDist

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def linspace_f32(start, end, steps):
    start, end = f32(start), f32(end)
    step = f32((end - start) / (steps - 1))
    half = steps // 2
    return [f32(start + f32(step * i)) if i < half else f32(end - f32(step * (steps - 1 - i)))
            for i in range(steps)]


def codebook():
    inv_cdf = NormalDist().inv_cdf
    # 1 - (1/32 + 1/30) / 2 = 0.96770833..., written to 7 digits as the reference implementation
    # does; the fp32 of the exact value is another float and moves most entries by a few ulps.
    offset = f32(0.9677083)
    positive = [f32(inv_cdf(p)) for p in linspace_f32(offset, 0.5, 9)[:-1]]
    negative = [f32(-inv_cdf(p)) for p in linspace_f32(offset, 0.5, 8)[:-1]]
    values = sorted(positive + [0.0] + negative)
    largest = max(values)
    return [f32(v / largest) for v in values]


def header_table():
    text = open(os.path.join(ROOT, "runtime", "quant", "nf4.h"), encoding="utf-8").read()
    body = re.search(r"kNf4Codebook\[16\] = \{(.*?)\};", text, re.S).group(1)
    return [f32(float(v.strip().rstrip("f"))) for v in body.split(",") if v.strip()]


def main():
    expected = codebook()
    actual = header_table()
    problems = 0
    for k, (e, a) in enumerate(zip(expected, actual)):
        same = struct.pack("<f", e) == struct.pack("<f", a)
        problems += not same
        print(f"{k:2d} {e!r:>22} {struct.pack('>f', e).hex()} {'ok' if same else f'header {a!r}'}")
    if len(actual) != 16:
        print(f"nf4.h lists {len(actual)} values, not 16")
        problems += 1
    print(f"{16 - problems} of 16 codebook values match the recipe")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
