"""Kubernetes resource quantities ("500m", "4Gi", "1e3") as integers."""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

_SUFFIX: dict[str, int | Decimal] = {
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": 1,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
}


def parse(text: str | int | float, milli: bool = False) -> int:
    """The quantity as an integer (rounded up as the apiserver does); ``milli`` gives 1/1000s.

    Raises ValueError with the offending text on anything that is not a quantity.
    """
    if isinstance(text, int | float):
        value = Decimal(str(text))
    else:
        s = text.strip()
        num, suffix = s, ""
        for cand in ("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"):
            if s.endswith(cand):
                num, suffix = s[:-2], cand
                break
        else:
            if s and s[-1] in "numkMGTPE":
                num, suffix = s[:-1], s[-1]
        try:
            value = Decimal(num) * Decimal(_SUFFIX[suffix])
        except (InvalidOperation, KeyError) as e:
            raise ValueError(f"not a resource quantity: {text!r}") from e
        if not value.is_finite():
            raise ValueError(f"not a resource quantity: {text!r}")
    if milli:
        value *= 1000
    whole = int(value.to_integral_value(rounding="ROUND_CEILING"))
    return whole
