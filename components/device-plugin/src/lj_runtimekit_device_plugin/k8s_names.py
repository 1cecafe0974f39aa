"""Kubernetes names, checked as the apiserver checks them (apimachinery's validation package).

Each pattern ends in ``\\Z``, never ``$``: ``$`` also matches before a trailing newline, so
``"gpu\\n"`` would pass a ``^…$`` check and then be refused by the apiserver (or, worse, written
into a label selector). The length limits are the apiserver's.
"""

from __future__ import annotations

import re
from typing import Final

MAX_LABEL: Final = 63
"""A DNS-1123 label, a label value, the name part of a qualified name."""
MAX_SUBDOMAIN: Final = 253
"""A DNS-1123 subdomain, the prefix of a qualified name."""

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z")
_NAME_PART = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?\Z")


def is_dns_label(text: str) -> bool:
    """An RFC 1123 label: a namespace, a Service, most object names (``gpu-0``); 1-63 of
    lower-case letters, digits and ``-``, a letter or digit at each end."""
    return len(text) <= MAX_LABEL and _DNS_LABEL.match(text) is not None


def is_dns_subdomain(text: str) -> bool:
    """An RFC 1123 subdomain: labels joined by ``.`` (``gpu.example.com``), 1-253 characters."""
    return len(text) <= MAX_SUBDOMAIN and _DNS_SUBDOMAIN.match(text) is not None


def is_label_value(text: str) -> bool:
    """A label value: empty, or 1-63 of letters, digits, ``-``, ``_`` and ``.``, a letter or
    digit at each end."""
    return text == "" or (len(text) <= MAX_LABEL and _NAME_PART.match(text) is not None)


def is_qualified_name(text: str) -> bool:
    """A label or annotation key: ``[prefix/]name``, the prefix a DNS-1123 subdomain, the name
    as a non-empty label value (``example.com/gpu.present``, ``app``)."""
    prefix, slash, name = text.rpartition("/")
    if slash and not is_dns_subdomain(prefix):
        return False
    return name != "" and is_label_value(name)
