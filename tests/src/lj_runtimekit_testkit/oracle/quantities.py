"""Kubernetes resource quantities, exactly (``fractions.Fraction``), for the checker.

Written from the API's definition of a quantity (``<signedNumber><suffix>``: binary SI ``Ki`` …
``Ei``, decimal SI ``n u m "" k M G T P E``, or a decimal exponent ``e3``/``E3``), not from the
scheduler's parser: the checker must not share code with what it checks. kube-scheduler sums a
pod's containers as exact quantities and rounds up once (``MilliValue()`` for cpu, ``Value()``
for the rest), so sums here stay exact until :func:`round_up`.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

_BINARY = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_FORM = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+))(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?\d+)?$")


def parse(text: str | int) -> Fraction:
    """The exact value of a quantity; raises ValueError for anything that is not one."""
    if isinstance(text, int):
        return Fraction(text)
    m = _FORM.match(text.strip())
    if m is None:
        raise ValueError(f"not a quantity: {text!r}")
    number, suffix = Fraction(str(m.group(1))), str(m.group(2) or "")
    if suffix in _BINARY:
        return number * Fraction(2) ** _BINARY[suffix]
    if suffix in _DECIMAL:
        return number * Fraction(10) ** _DECIMAL[suffix]
    return number * Fraction(10) ** int(suffix[1:])


def round_up(value: Fraction, milli: bool = False) -> int:
    """``Value()`` (or ``MilliValue()`` with ``milli``) of an exact quantity: rounded up."""
    return math.ceil(value * 1000 if milli else value)
