"""Kubernetes resource quantities ("500m", "4Gi", "1e3") as integers."""

from __future__ import annotations

from decimal import Decimal

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


#: The apiserver keeps quantities in an int64; anything larger cannot come from it.
MAX = 2**63 - 1


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
        except (ArithmeticError, KeyError) as e:  # InvalidOperation, Overflow ("1E1000000E")
            raise ValueError(f"not a resource quantity: {text!r}") from e
        if not value.is_finite():
            raise ValueError(f"not a resource quantity: {text!r}")
    if not value.is_finite():
        raise ValueError(f"not a resource quantity: {text!r}")
    if abs(value) > MAX:
        raise ValueError(f"resource quantity out of range (above 2^63-1): {text!r}")
    if milli:
        value *= 1000
    # Checked before int(): "1e999999999" would otherwise build a billion-digit integer.
    if abs(value) > MAX:
        raise ValueError(f"resource quantity out of range (above 2^63-1): {text!r}")
    whole = int(value.to_integral_value(rounding="ROUND_CEILING"))
    return whole
