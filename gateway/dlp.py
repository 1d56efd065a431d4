"""Data-loss prevention: find, mask and redact sensitive values (SPEC §6).

Pure functions over text and JSON-like values; no Django, no settings. The detector
finds six entity types with exact span bounds:

* ``IBAN``: the whole IBAN, internal spaces included, any case, every country of the
  IBAN registry (per-country length and national structure, ISO 7064 mod-97 check digits).
* ``CREDIT_CARD``: the digits with their separators (spaces or dashes), 13-19 digits,
  Luhn-valid, with an issuer prefix/length that a card network actually uses.
* ``EMAIL``: ``local@domain`` only (never ``mailto:``, ``<>`` or ``key=``); local parts
  and domains in any script (``jürgen.müller@münchen.de``), apostrophes included.
* ``PHONE``: from the ``+`` or first digit to the last digit, ``(0)`` included; a regular
  expression finds candidates, ``phonenumbers`` validates them: international numbers
  (``+``, ``00``), French national ones (overseas departments included); never a date.
* ``NIR``: the French social security number, 15 characters (spaces included).
* ``SECRET``: a whole JWT, a cloud access key id, a whole PEM block, the token of
  ``Bearer <token>``, and the exact value of any credential passed in ``secrets``.

Overlapping candidates are resolved by priority (SECRET > IBAN > CREDIT_CARD > NIR >
EMAIL > PHONE), then by length.

Over escaped JSON text, a ``\\uXXXX`` escape right before a value is a boundary, and an
escaped no-break space inside one is a separator; masking keeps each escape whole.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from bisect import bisect_right
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

import phonenumbers
from phonenumbers import NumberParseException, PhoneNumber

ENTITIES = ("IBAN", "CREDIT_CARD", "EMAIL", "PHONE", "NIR", "SECRET")
ACTIONS = ("mask", "redact")

_PRIORITY = {"SECRET": 0, "IBAN": 1, "CREDIT_CARD": 2, "NIR": 3, "EMAIL": 4, "PHONE": 5}
_ALL = frozenset(ENTITIES)

Span = tuple[str, int, int]


@dataclass(frozen=True)
class Finding:
    """How many values of one entity type were found (never the values themselves)."""

    entity: str
    count: int


def as_findings(counts: dict[str, int]) -> list[Finding]:
    """Counts as a list of :class:`Finding`, in the canonical entity order."""
    return [Finding(e, counts[e]) for e in ENTITIES if counts.get(e)]


# --------------------------------------------------------------------------- helpers

_ASCII_ALNUM = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")
_SPACES = " \u00a0\u202f"
# A value may start right after a non-alphanumeric character, or right after a JSON
# escape such as ``\n`` (the detector runs over escaped JSON text too).
_WORD = frozenset(_ASCII_ALNUM | {"_"})


# A no-break space written as a JSON escape (``ensure_ascii`` output): a separator too.
_ESC_SPACE = r"\\u(?:00[aA]0|202[fF])"
_HEX = frozenset("0123456789abcdefABCDEF")


class _Taken:
    """The spans found so far, merged and sorted, for "which span covers ``text[i]``"
    in O(log n): a linear scan per candidate made texts with thousands of findings
    quadratic. Lower-priority detectors skip such places (they would lose the overlap
    anyway)."""

    @classmethod
    def ahead_of(cls, entity: str, spans: list[Span]) -> _Taken | None:
        """The spans that win over `entity` for sure: of a higher priority, and not
        e-mails (an e-mail candidate may yet be trimmed or dropped by `_resolve`, and
        must not hide the card or phone number under it: "ana@x.fr@4111111111111111.com")."""
        rank = _PRIORITY[entity]
        ahead = [s for s in spans if _PRIORITY[s[0]] < rank and s[0] != "EMAIL"]
        return cls(ahead) if ahead else None

    def __init__(self, spans: list[Span]) -> None:
        self.starts: list[int] = []
        self.ends: list[int] = []
        for a, b in sorted((a, b) for _, a, b in spans):
            if self.ends and a < self.ends[-1]:
                self.ends[-1] = max(self.ends[-1], b)
            else:
                self.starts.append(a)
                self.ends.append(b)

    def end_covering(self, i: int) -> int:
        """End of the span that covers ``text[i]``, else -1."""
        k = bisect_right(self.starts, i) - 1
        return self.ends[k] if k >= 0 and i < self.ends[k] else -1


def _escape_before(text: str, i: int) -> bool:
    """Does a ``\\uXXXX`` JSON escape end right before ``text[i]``?"""
    return (
        i >= 6
        and text[i - 6] == "\\"
        and text[i - 5] == "u"
        and all(c in _HEX for c in text[i - 4 : i])
    )


def _left_ok(text: str, i: int, forbidden: frozenset[str] = _WORD) -> bool:
    """May a value start at ``text[i]``? Not glued to a preceding letter/digit, except
    the end of a JSON escape (``\\n0612345678``, ``n\\u00b0FR76…`` in escaped JSON text).

    Patterns start with a character class (which SRE scans fast) and the left boundary
    is checked here rather than with a leading look-behind (which defeats that scan)."""
    if i == 0:
        return True
    c = text[i - 1]
    if c not in forbidden:
        return True
    if c in "nrtbf" and i >= 2 and text[i - 2] == "\\":
        return True
    return c in _HEX and _escape_before(text, i)


def _left(first: str, forbidden: str = "0-9A-Za-z_") -> str:
    """The left boundary of `_left_ok` as a pattern, to put right after a pattern's first
    character (``first``): not glued to a character of ``forbidden``, unless a JSON
    escape (``\\n``, ``\\u00b0``) ends there. A leading look-behind would defeat SRE's
    scan for the first character; after it, the check runs in C too, so that places
    which cannot start a value never cost a Python step."""
    return (
        f"(?:(?<![{forbidden}]{first})|(?<=\\\\[nrtbf]{first})|(?<=\\\\u[0-9A-Fa-f]{{4}}{first}))"
    )


# --------------------------------------------------------------------------- IBAN


_BBAN_CLASSES = {"n": "[0-9]", "a": "[A-Z]", "c": "[A-Z0-9]"}


def _iban_registry() -> tuple[dict[str, int], dict[str, re.Pattern[str]]]:
    """Country code -> IBAN length, and -> the structure of its national part (BBAN:
    ``5!n5!n11!c2!n``), from python-stdnum's copy of the IBAN registry."""
    text = resources.files("stdnum").joinpath("iban.dat").read_text(encoding="utf-8")
    lengths: dict[str, int] = {}
    structures: dict[str, re.Pattern[str]] = {}
    for line in text.splitlines():
        m = re.match(r'([A-Z]{2}) .*bban="([^"]+)"', line)
        if m:
            parts = re.findall(r"(\d+)!([nac])", m.group(2))
            lengths[m.group(1)] = 4 + sum(int(n) for n, _ in parts)
            structures[m.group(1)] = re.compile(
                "".join(f"{_BBAN_CLASSES[kind]}{{{n}}}" for n, kind in parts)
            )
    return lengths, structures


_IBAN_LENGTHS, _BBAN_STRUCTURES = _iban_registry()


_IBAN_DIGITS = str.maketrans({c: str(10 + k) for k, c in enumerate("ABCDEFGHIJKLMNOPQRSTUVWXYZ")})


def _iban_pattern() -> re.Pattern[str]:
    """Check digits preceded by a country code, then exactly that country's number of
    characters, compact or in groups of four with one separator kind throughout (how
    IBANs are printed), not glued to more letters or digits. All of it runs in C (a
    megabyte of "FR76 " costs no Python step): by the country's first letter, then by
    its second letter and IBAN length, each a look-behind of one character class (an
    alternation of the 89 codes cost microseconds a place)."""
    tree: dict[str, dict[int, str]] = {}
    for cc, length in sorted(_IBAN_LENGTHS.items()):
        seconds = tree.setdefault(cc[0], {})
        seconds[length - 4] = seconds.get(length - 4, "") + cc[1] + cc[1].lower()
    sep = r"(?:[ \-.\u00a0\u202f]|" + _ESC_SPACE + ")"
    names = iter(range(1000))

    def body(n: int) -> str:
        g = f"s{next(names)}"
        fours, rest = divmod(n, 4)
        grouped = f"(?P<{g}>{sep})[A-Za-z0-9]{{4}}(?:(?P={g})[A-Za-z0-9]{{4}}){{{fours - 1}}}"
        if rest:
            grouped += f"(?P={g})[A-Za-z0-9]{{{rest}}}"
        return f"(?:[A-Za-z0-9]{{{n}}}|{grouped})(?![A-Za-z0-9])"

    by_first = [
        f"(?<=[{a}{a.lower()}][A-Za-z][0-9][0-9])(?:"
        + "|".join(f"(?<=[{b}][0-9][0-9])" + body(n) for n, b in lengths.items())
        + ")"
        for a, lengths in tree.items()
    ]
    # Digits are rarer than letters: scan for them. Not glued to a letter or digit
    # before the country code, unless a JSON escape ends there (n\u00b0FR76…).
    return re.compile(
        r"[0-9][0-9](?<=[A-Za-z][A-Za-z][0-9][0-9])"
        r"(?:(?<![A-Za-z0-9]....)|(?<=\\[nrtbf]....)|(?<=\\u[0-9A-Fa-f]{4}....))"
        "(?:" + "|".join(by_first) + ")",
        re.DOTALL,
    )


_IBAN = _iban_pattern()
_SPACE_DROP = str.maketrans("", "", _SPACES + "-.")  # an IBAN's separators
_ESC_SPACE_RE = re.compile(_ESC_SPACE)


def _mod97_ok(iban: str) -> bool:
    """ISO 7064 mod 97-10 over an upper-case compact IBAN."""
    return int((iban[4:] + iban[:4]).translate(_IBAN_DIGITS)) % 97 == 1


def _find_ibans(text: str, out: list[Span]) -> None:
    pos = 0
    while (m := _IBAN.search(text, pos)) is not None:
        start = m.start() - 2
        pos = m.start() + 1  # a rejected candidate may hide another one inside it
        # `_` may stand before one (iban_FR76…, RIB_FR76….pdf): mod 97 and the national
        # structure are evidence enough.
        if not _left_ok(text, start, _ASCII_ALNUM):
            continue
        end = m.end()
        compact = text[start:end].translate(_SPACE_DROP).upper()
        if "\\" in compact:
            compact = _ESC_SPACE_RE.sub("", compact.replace("\\U", "\\u"))
        # The national part's structure too: "BE0927814995 GENT" passes mod 97 once in
        # 97 but a Belgian BBAN is all digits.
        if _mod97_ok(compact) and _BBAN_STRUCTURES[compact[:2]].fullmatch(compact, 4):
            out.append(("IBAN", start, end))
            pos = end


# --------------------------------------------------------------------------- cards

# Dots too ("4111.1111.1111.1111"), but only between groups of a card written all with
# dots: a dot is otherwise a decimal point (see `_find_cards`).
_CARD_SEP = r"(?:[ \-.\u00a0\u202f]|" + _ESC_SPACE + ")"
_END = r"(?![0-9A-Za-z_])"  # a group ends at neither a digit nor a letter
# One candidate per number as written, found in C: a compact number of 13-19 digits; the
# 4-6-5 / 4-6-4 grouping of Amex and Diners (one separator kind); a run of groups of
# four, with an optional short last group, whatever separators join them ("4111-1111
# 1111-1111" as typed: with the network prefix and the Luhn digit, the grouping is
# evidence enough). A group glued to a letter is no group ("4111 1111 1111 1111 3DS"
# ends before "3DS"; "4111111111111111x" is a reference). Only such candidates cost
# Python work: a megabyte of "1 " or of digits is rejected by the pattern alone.
_CARD = re.compile(
    "[1-68]"
    + _left("[1-68]", "0-9A-Za-z+")  # `_` may stand before one: pan_4111…
    + "(?:(?<=[2-68])|(?=800))"  # no network issues 0, 7, 9 or 1 (but JCB's 1800)
    + "(?:[0-9]{12,18}"
    + _END
    + "|[0-9]{3}("
    + _CARD_SEP
    + r")[0-9]{6}\1[0-9]{4,5}"
    + _END
    + "|[0-9]{3}"
    + _END
    + "(?:"
    + _CARD_SEP
    + "[0-9]{4}"
    + _END
    + "){2,}+(?:"
    + _CARD_SEP
    + "[0-9]{1,3}"
    + _END
    + ")?)"
)
_SEP_SPLIT = re.compile("(" + _CARD_SEP + ")")
_SIRET_HINT = re.compile(r"(?i)siret|siren")
# Barcodes are numbers of 8-14 digits too: one named just before is no card.
_BARCODE_HINT = re.compile(r"(?i)\b(?:ean|gtin|upc|isbn|bar ?codes?|codes?[- ]barres?)\b")
_LUHN_DOUBLE = str.maketrans("0123456789", "0246813579")  # 2d, minus 9 past 9


def _luhn_ok(digits: str) -> bool:
    """The Luhn check, summing digits as bytes in C (a digit's byte is 48 + its value)."""
    kept = digits[-1::-2].encode()
    doubled = digits[-2::-2].translate(_LUHN_DOUBLE).encode()
    return (sum(kept) + sum(doubled) - 48 * len(digits)) % 10 == 0


def _ean_ok(digits: str) -> bool:
    """The GS1 check digit of an EAN-13 / GTIN (weights 3 and 1 from the right)."""
    body = digits[:-1]
    total = sum(body[-1::-2].encode()) * 3 + sum(body[-2::-2].encode())
    total -= 48 * (3 * len(body[-1::-2]) + len(body[-2::-2]))
    return (10 - total % 10) % 10 == ord(digits[-1]) - 48


def _card_network_ok(d: str) -> bool:
    """Is there a card network issuing numbers with this prefix and length?"""
    n = len(d)
    p2 = int(d[:2])
    p4 = int(d[:4])
    first = d[0]
    if first == "4":  # Visa (incl. Visa Electron, CB co-branded)
        return n in (13, 16, 19)
    if first == "5":
        if 51 <= p2 <= 55:  # Mastercard 5-series
            return n == 16
        return 16 <= n <= 19  # Maestro / Verve / co-branded debit (50, 56-59)
    if first == "2":
        if 2221 <= p4 <= 2720:  # Mastercard 2-series
            return n == 16
        if 2200 <= p4 <= 2204:  # Mir
            return 16 <= n <= 19
        if p4 == 2131:  # legacy JCB
            return n == 15
        return False
    if first == "3":
        if p2 in (34, 37):  # American Express
            return n == 15
        if 3528 <= p4 <= 3589:  # JCB
            return 16 <= n <= 19
        if p2 in (36, 38, 39) or 300 <= int(d[:3]) <= 305 or p4 == 3095:  # Diners Club
            return 14 <= n <= 19
        return False
    if first == "6":  # Discover, UnionPay, Maestro, RuPay, InstaPayment, ...
        return 16 <= n <= 19
    if first == "1":
        return p4 == 1800 and n == 15  # legacy JCB (UATP 1x is not accepted: NIR clash)
    if first == "8":
        return p2 in (81, 82) and n == 16  # RuPay
    return False


def _find_cards(text: str, out: list[Span]) -> None:
    taken = _Taken.ahead_of("CREDIT_CARD", out)
    pos = 0
    while (m := _CARD.search(text, pos)) is not None:
        start = m.start()
        pos = m.end()
        if taken:
            covered = taken.end_covering(start)
            if covered >= 0:
                pos = covered
                continue
        # The number's first group may be the fraction of a decimal (0.4221165755827173,
        # "42.00 4111 1111 1111 1111"): no card starts there, one may start after it.
        if start >= 2 and text[start - 1] == "." and text[start - 2].isdigit():
            pos = start + 1
            continue
        run = m.group()
        if run.isdigit():  # compact: the common case, without the window search
            if _card_network_ok(run) and _luhn_ok(run) and not _not_a_card(text, start, run):
                out.append(("CREDIT_CARD", start, pos))
            continue
        if _four_by_four(text, start, run, out):
            continue
        _grouped_cards(text, start, run, out)


def _four_by_four(text: str, start: int, run: str, out: list[Span]) -> bool:
    """The grouping most cards are written in, four groups of four joined by one
    separator ("4111 1111 1111 1111"), decided without `_grouped_cards`' window walk,
    whose verdict on it is the same: no window of fewer groups holds 13 digits, so the
    whole number is the only candidate, and its separators, all alike, are dots
    throughout or none. False when `run` is not so written (the walk then decides).
    `tests/test_dlp_linear.py` holds the two to the same answers; `bench/dlp.py` shows
    what it saves on a megabyte of cards."""
    if len(run) != 19 or not run[4] == run[9] == run[14]:
        return False
    digits = run[:4] + run[5:9] + run[10:14] + run[15:]
    if not digits.isdigit():
        return False
    if _card_network_ok(digits) and _luhn_ok(digits) and not _not_a_card(text, start, digits):
        out.append(("CREDIT_CARD", start, start + 19))
    return True


def _grouped_cards(text: str, start: int, run: str, out: list[Span]) -> None:
    """The cards in a run of digit groups `_CARD` found at `start`: every window of
    groups that starts a card, the longest valid one first."""
    parts = _SEP_SPLIT.split(run)
    groups = parts[0::2]
    seps = parts[1::2]
    # A card has at most five groups (4-4-4-4-3): a run of more, beyond one group
    # before the card ("order 1234 4111 1111 1111 1111"), is a list of numbers or a
    # reference.
    if len(groups) > 6:
        return
    lens = [len(g) for g in groups]
    offsets = []
    at = start
    for k, group in enumerate(groups):
        offsets.append(at)
        at += len(group) + (len(seps[k]) if k < len(seps) else 0)
    i = 0
    while i < len(groups):
        found = None
        # A grouped card starts with a group of four; no card starts right after a
        # dot (what follows a dot is a fraction or a version's part).
        if (i == 0 or (lens[i] == 4 and seps[i - 1] != ".")) and (len(groups) == 1 or lens[i] == 4):
            total = 0
            for j in range(i, len(groups)):
                total += lens[j]
                if total > 19:
                    break
                if total < 13:
                    continue
                digits = "".join(groups[i : j + 1])
                dots = seps[i:j].count(".")
                if (
                    dots in (0, j - i)  # dots between all groups, or none
                    and _card_network_ok(digits)
                    and _luhn_ok(digits)
                ):
                    found = (j, digits)  # keep extending: the longest window wins
        if found is None:
            i += 1
            continue
        j, digits = found
        card_start = offsets[i]
        if _not_a_card(text, card_start, digits):
            i = j + 1
            continue
        out.append(("CREDIT_CARD", card_start, offsets[j] + lens[j]))
        i = j + 1


def _not_a_card(text: str, start: int, digits: str) -> bool:
    """A Luhn-valid number that is something else by its context: a SIRET (14 digits,
    Luhn-valid by design, read as a Diners card) right after "SIRET", a barcode (an
    EAN-13 passes Luhn one time in ten) named as one or compact with its GS1 check."""
    before = text[max(0, start - 40) : start]
    if len(digits) == 14 and _SIRET_HINT.search(before):
        return True
    if _may_name_a_barcode(before) and _BARCODE_HINT.search(before):
        return True
    return len(digits) == 13 and _ean_ok(digits)


def _may_name_a_barcode(before: str) -> bool:
    """Whether `_BARCODE_HINT` can match: each of its words holds one of these stems, and
    every letter its case-insensitive match accepts folds to the stem's here. Six
    substring searches in C cost less than the pattern's tries at each of the 40
    characters before every card of a megabyte of them."""
    folded = before.lower()
    if not folded.isascii():
        # Beyond A-Z, the letters Python's case-insensitive matching takes for those of
        # the words (every code point tried): İ (lowered to i and a combining dot) and ı
        # for i, ſ for s. Dropping every combining dot can only let more through.
        folded = folded.replace("\u0307", "").replace("\u0131", "i").replace("\u017f", "s")
    return (
        "ean" in folded
        or "bar" in folded
        or "code" in folded
        or "gtin" in folded
        or "upc" in folded
        or "isbn" in folded
    )


# --------------------------------------------------------------------------- e-mail

# RFC 5322 atext as people write it, the apostrophe included (o'brien@…); letters
# beyond ASCII are taken too (RFC 6531: jürgen.müller@…), tested one by one.
_LOCAL_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._%+-'")
_LOCAL_EDGE = "._%+-'"  # never first: the start of "'ana@x.org'" or ".bob@x.org"
# Labels of letters and digits in any script (münchen.de), hyphens inside.
_DOMAIN = re.compile(r"(?:[^\W_](?:[^\W_]|-)*\.)+[^\W\d_]{2,24}(?![^\W_]|-)")
_RETINA = re.compile(r"\d+(?:\.\d+)?x\.")
_JSON_ESCAPE = re.compile(r"[nrtbf]|u[0-9A-Fa-f]{4}")


# An "@" followed by a domain (not a "@2x." image name): found in C, so that a megabyte
# of "@" or "a@" costs no Python step.
_AT_DOMAIN = re.compile(r"@(?!\d+(?:\.\d+)?x\.)(" + _DOMAIN.pattern + ")")
# A local part has at most 64 characters (RFC 5321); reading back further than this
# would make a megabyte of letters before an "@" cost a Python step per letter.
_LOCAL_MAX = 256


def _find_emails(text: str, out: list[Span]) -> None:
    pos = 0
    while (m := _AT_DOMAIN.search(text, pos)) is not None:
        at = m.start()
        pos = at + 1
        start = at
        limit = max(0, at - _LOCAL_MAX)
        while start > limit:
            c = text[start - 1]
            if (
                c in _HEX
                and _escape_before(text, start)
                and chr(int(text[start - 4 : start], 16)).isalnum()
            ):
                start -= 6  # an escaped letter of the local part (j\u00fcrgen@)
                continue
            if c in _LOCAL_CHARS or (c > "\x7f" and c.isalnum()):
                start -= 1
            else:
                break
        if start and text[start - 1] == "\\":
            # ``\n`` / ``\u003c`` just before: the escape is not part of the address.
            esc = _JSON_ESCAPE.match(text, start)
            if esc:
                start = esc.end()
        while start < at and text[start] in _LOCAL_EDGE:
            start += 1
        if start < at:
            out.append(("EMAIL", start, m.end()))


# --------------------------------------------------------------------------- phone

_PSEP = r"(?:[ .\-\u00a0\u202f]|" + _ESC_SPACE + r"|[ \u00a0]?\([0-9]{1,4}\)[ \u00a0]?)"
# From a "+" ("(+33) 1 …" too) or a "0", groups of digits; a group glued to a letter
# ends the candidate before it ("06 12 34 56 78 24h/24").
_PHONE = re.compile(
    r"(?:\+[0-9]{1,3}\)[ \u00a0]?[0-9]++|\+[ \u00a0]?[0-9]++|00[0-9]*+)(?![A-Za-z_])"
    # at most 17 digits make a phone: a longer run of groups ("06 06 06 …") is read a
    # bounded window at a time, not whole again after each number found in it
    r"(?:" + _PSEP + r"[0-9]++(?![A-Za-z_])){0,17}+"
)
# At least 8 digits from a ``+`` or a ``0`` standing on its own: the cheap gate, in C.
_PHONE_GATE = re.compile(
    r"(?:\+"
    + _left(r"\+", "0-9A-Za-z_+")
    + "|0"
    + _left("0", "0-9A-Za-z_+")
    + r"0)[ \u00a0]?[0-9](?:[0-9 .\-\u00a0\u202f()]|"
    + _ESC_SPACE
    + "){6}"
)
# The rest of a run of digit groups, skipped whole once it read as a list of numbers.
_PHONE_RUN = re.compile(r"(?:" + _PSEP + r"?[0-9]++)*+")
# A date (with a time after it) is no phone: 03.11.2026 14:30, 01 01 2026 08:15.
_DATE_HEAD = re.compile(r"[0-9]{1,2}([./\- ])[0-9]{1,2}\1(?:19|20)[0-9]{2}(?![0-9])")
# Overseas departments dial nationally with a 0 but have country codes of their own.
_OVERSEAS = ("262", "590", "594", "596")
_PGROUP = re.compile(r"[0-9]+")
_FR = "33"
_LIST = -1  # a candidate that is one number of a list: skip the whole run


def _words(*lines: str) -> frozenset[str]:
    return frozenset(" ".join(lines).split())


# Words that say what a number is when it is not a phone, in English and French, in the
# few words before it (a phone word closer to it wins: "Tél. du service lots : …").
_PHONE_WORDS = _words(
    "tel tél tels téléphone telephone phone phones mobile portable cell fax gsm appel "
    "appelez appeler appelle call calling joindre reach whatsapp sms hotline standard "
    "contact contacter",
)
_NOT_PHONE_WORDS = _words(
    # draws, serials, barcodes, postcodes
    "loto lotto lottery loterie tirage tirages draw draws drawn euromillions euromillion "
    "keno boules grille grilles serial série serie séries imei batch lot ean gtin upc isbn "
    "barcode barcodes postcode postcodes postal zip cp cedex "
    # positions, measures, dates and times, counts, identifiers of things
    "gps latitude longitude lat lng lon coordinates coordonnées dimension dimensions "
    "measure measures mesure mesures weight weights poids length longueur distance size "
    "sizes taille tailles date dates dated heure heures hour hours time times horaire "
    "horaires schedule schedules timestamp timestamps départ départs depart arrivée "
    "arrivées departure departures arrival arrivals count counts population compteur "
    "counter version versions build checksum checksums sha sha1 sha256 md5 crc crc32 "
    "commit hash invoice facture order commande montant amount prix price total",
)
_NOT_PHONE_PAIRS = frozenset(
    {
        ("winning", "numbers"),
        ("numéros", "gagnants"),
        ("part", "number"),
        ("part", "no"),
        ("bar", "code"),
        ("code", "barre"),
        ("code", "barres"),
        ("codes", "barres"),
        ("post", "code"),
        ("code", "postal"),
        ("codes", "postaux"),
        ("euro", "millions"),
        ("s", "n"),  # S/N
        ("p", "n"),  # P/N
    }
)
_CONTEXT_WORDS = re.compile(r"[^\W\d_]+|°")
_ASCII_LETTER = re.compile(r"[A-Za-z]")
# Units after a number: a measure or a count, not a phone ("06 12 34 56 78 mm").
_UNIT_WORDS = _words(
    "% ‰ ° € $ £ × eur euro euros usd dollar dollars km cm mm µm nm m m² km² kg mg "
    "tonne tonnes litre litres liter liters ml cl ms µs ns sec secs second seconds seconde "
    "secondes min mins minute minutes hr hrs hour hours heure heures jour jours day days "
    "ans year years byte bytes octet octets kb mb gb tb kib mib gib tib ko mo kwh "
    "mwh kw mw hz khz mhz ghz px pt dpi visits visitors views vues users utilisateurs "
    "habitants inhabitants people personnes downloads téléchargements followers abonnés "
    "votes voix items unités units pcs pièces exemplaires copies clics clicks impressions "
    "requests requêtes hits points pts",
)
_UNIT_AFTER = re.compile(r"[ \u00a0]?([^\W\d_]+²?|[%‰°€$£×])(?!['’])")


def _phone_context_ok(text: str, start: int, end: int) -> bool:
    """Does the text around a valid number read like a phone? Not when one of the four
    words before it (in its clause, within 40 characters) says it is a draw, a serial, a barcode, a
    postcode, a position, a measure, a date or a count, unless a phone word stands
    closer; nor when a unit follows it."""
    unit = _UNIT_AFTER.match(text, end)
    if unit is not None and unit.group(1).lower() in _UNIT_WORDS:
        return False
    before = text[max(0, start - 40) : start]
    # No word before it at all (a list of numbers): nothing to weigh. For ASCII text a
    # word is [A-Za-z] (what `_CONTEXT_WORDS` finds there), sought faster.
    if (_ASCII_LETTER if before.isascii() else _CONTEXT_WORDS).search(before) is None:
        return True
    for stop in ("\n", "\\n", ". ", "; ", "! ", "? "):
        cut = before.rfind(stop)
        if cut != -1:
            before = before[cut + len(stop) :]
    verdict = True
    previous = ""
    # the last four words: "Draw on Friday, questions to 06 …" is a phone
    for word in _CONTEXT_WORDS.findall(before.lower())[-4:]:
        if word in _PHONE_WORDS:
            verdict = True
        elif word in _NOT_PHONE_WORDS or (previous, word) in _NOT_PHONE_PAIRS or word == "°":
            verdict = False
        previous = word
    return verdict


@lru_cache(maxsize=16384)
def _fr_nsn_valid(nsn: str) -> bool:
    if len(nsn) != 9 or nsn[0] == "0":
        return False
    return phonenumbers.is_valid_number(PhoneNumber(country_code=33, national_number=int(nsn)))


@lru_cache(maxsize=16384)
def _intl_valid(digits: str) -> bool:
    try:
        num = phonenumbers.parse("+" + digits, None)
    except NumberParseException:
        return False
    return phonenumbers.is_valid_number(num)


def _phone_valid(cand: str) -> bool:
    """Validate a candidate as ``phonenumbers.parse(cand, "FR")`` + ``is_valid_number``
    would, with a fast path for French numbers."""
    if cand.isascii() and cand.isdigit():  # as `_find_phones` hands it: digits only
        digits = cand
    else:
        digits = "".join(_PGROUP.findall(cand.replace("(0)", "")))
    if cand[0] != "+":
        if digits.startswith("00"):  # French international call prefix
            digits = digits[2:]
        else:
            return len(digits) == 10 and (
                _fr_nsn_valid(digits[1:]) or any(_intl_valid(cc + digits[1:]) for cc in _OVERSEAS)
            )
    if not 7 <= len(digits) <= 15:
        return False
    if digits.startswith(_FR):
        nsn = digits[2:]
        if nsn.startswith("0"):
            nsn = nsn[1:]
        return _fr_nsn_valid(nsn)
    return _intl_valid(digits)


# A French national number as it is written, one separator kind
# throughout, found in C: the ten digits compact, in pairs, 4-2-2-2, 1-3-2-2-2, 1-3-3-3,
# 4-3-3 or 2-4-4. Other cuts of ten digits are something else: two postcodes (06000
# 06100), the tail of a NIR (1 84 12 06 451 089 47), a timetable.
_NSEP = r"(?:[ .\-\u00a0\u202f]|" + _ESC_SPACE + ")"
_FR_NUMBER = re.compile(
    "0"
    + _left("0", "0-9A-Za-z_+")
    + (
        r"(?:[1-9][0-9]{8}"
        r"|[1-9](§)[0-9]{2}\1[0-9]{2}\1[0-9]{2}\1[0-9]{2}"
        r"|[1-9][0-9]{2}(§)[0-9]{2}\2[0-9]{2}\2[0-9]{2}"
        r"|(§)[1-9][0-9]{2}\3[0-9]{2}\3[0-9]{2}\3[0-9]{2}"
        r"|(§)[1-9][0-9]{2}\4[0-9]{3}\4[0-9]{3}"
        r"|[1-9][0-9]{2}(§)[0-9]{3}\5[0-9]{3}"
        r"|[1-9](§)[0-9]{4}\6[0-9]{4}"
        r")(?![0-9A-Za-z_])"
    ).replace("§", _NSEP)
)
_DIGIT_RUN = re.compile(r"[0-9]*")


def _in_a_list(text: str, start: int, end: int, sep: str) -> bool:
    """Is the number at ``text[start:end]``, written with ``sep`` between its groups, one
    of a list of such numbers: "06 12 34 56 78 90", "05 12 23 34 45 48 07" (a draw, a
    timetable), "… 12 06 12 34 56 78"? A group of the size of its last (first) group
    follows (precedes) it with the same separator. "RDV 03.11.2026 06 12 34 56 78" is a
    phone after a year."""
    if text.startswith(sep, end):
        run_end = _DIGIT_RUN.match(text, end + len(sep)).end()
        last = len(text[start:end].rsplit(sep, 1)[-1])
        glued = run_end < len(text) and (text[run_end].isalpha() or text[run_end] == "_")
        if run_end - end - len(sep) == last and not glued:  # "… 78 24h/24" is an hour
            return True
    k = start - len(sep)
    if k >= 1 and text.startswith(sep, k) and text[k - 1].isdigit():
        j = k - 1
        while j > 0 and text[j - 1].isdigit():
            j -= 1
        if k - j == len(text[start:end].split(sep, 1)[0]):
            return True
    return False


def _intl_end(cand: str) -> int | None:
    """End (in ``cand``) of the longest valid international number it starts with,
    ``_LIST`` when that number is one of a list, else None."""
    # Cut points: ends of digit groups outside parentheses, so that a run longer than a
    # phone number can be cut back to a valid number; scanning then resumes after it.
    cuts = []
    ndigits = 0
    groups = list(_PGROUP.finditer(cand))
    for k, g in enumerate(groups):
        ndigits += len(g.group())
        if g.end() == len(cand) or cand[g.end()] != ")":
            cuts.append((g.end(), ndigits, k))
    for end, nd, k in reversed(cuts):
        if nd < 8:
            return None
        if nd <= 17 and _phone_valid(cand[:end]):
            number = cand[:end]
            if _SIGNED_DECIMAL.fullmatch(number):
                return None  # +45.46421134: a coordinate or a signed measure
            if number.isdigit() and len(number) in (13, 14) and _ean_ok(number):
                return None  # 0012345678905: an EAN-13 barcode (or a GTIN-14)
            if 1 <= k < len(groups) - 1:
                sep = cand[groups[k - 1].end() : groups[k].start()]
                nxt = groups[k + 1]
                if cand[end : nxt.start()] == sep and len(nxt.group()) == len(groups[k].group()):
                    return _LIST
            return end
    return None


_SIGNED_DECIMAL = re.compile(r"\+[ \u00a0]?[0-9]{1,3}\.[0-9]+")


def _find_phones(text: str, out: list[Span]) -> None:
    taken = _Taken.ahead_of("PHONE", out)
    intl: list[Span] = []
    if "+" in text or "00" in text:
        _find_intl_phones(text, taken, intl)
        out.extend(intl)
    if intl:
        taken = _Taken(intl + [s for s in out if _PRIORITY[s[0]] < _PRIORITY["PHONE"]])
    ends = {end for _, _, end in intl}  # "01 42 68 53 00/06 12 34 56 78"
    pos = 0
    while (m := _FR_NUMBER.search(text, pos)) is not None:
        start, end = m.span()
        pos = end
        if taken:
            covered = taken.end_covering(start)
            if covered >= 0:
                pos = covered
                continue
        if (
            # not the tail of a decimal, a date or a reference: 3.06…, 2026-06…, 12/06…
            start >= 2
            and text[start - 1] in ".-/"
            and text[start - 2].isdigit()
            and start - 1 not in ends
        ):
            continue
        sep = next((s for s in m.groups() if s is not None), None)
        if sep is not None and _in_a_list(text, start, end, sep):
            pos = _PHONE_RUN.match(text, end).end()
            continue
        if _fr_written_valid(m.group()) and _phone_context_ok(text, start, end):
            out.append(("PHONE", start, end))
            ends.add(end)


@lru_cache(maxsize=16384)
def _fr_written_valid(raw: str) -> bool:
    """`_phone_valid` of a French number as `_FR_NUMBER` found it written, remembered as
    the validators are (a list of numbers repeats them)."""
    return _phone_valid(_digits_of(raw))


def _digits_of(raw: str) -> str:
    if "\\" in raw:
        raw = _ESC_SPACE_RE.sub("", raw)
    return "".join(_PGROUP.findall(raw))


def _find_intl_phones(text: str, taken: _Taken | None, out: list[Span]) -> None:
    """Numbers from a ``+`` or ``00``, validated with their country's numbering plan."""
    pos = 0
    while (g := _PHONE_GATE.search(text, pos)) is not None:
        start = g.start()
        if taken:
            covered = taken.end_covering(start)
            if covered >= 0:
                pos = covered
                continue
        m = _PHONE.match(text, start)
        if m is None:
            pos = start + 1
            continue
        cand = m.group()
        if "\\" in cand:  # escaped no-break spaces: blanks of the same width
            cand = _ESC_SPACE_RE.sub("      ", cand)
        pos = m.end()
        end = _intl_end(cand)
        if end == _LIST:
            pos = _PHONE_RUN.match(text, pos).end()
            continue
        if end is None or not _phone_context_ok(text, start, start + end):
            continue
        out.append(("PHONE", start, start + end))
        pos = start + end


# --------------------------------------------------------------------------- NIR

_S = "(?:[ \u00a0\u202f]|" + _ESC_SPACE + ")?"
# Sex, year, month (01-12, 20-42 and 50-99 for unknown months), department (2A/2B in
# Corsica; overseas ones have three digits and a two-digit commune), commune, order,
# key; a separator may stand only between these groups (1 84 12 76 451 089 46): a
# digit-by-digit separated run ("1 1 1 1 …") is rejected by the pattern, in C.
_NIR_MONTH = "(?:0[1-9]|1[0-2]|[23][0-9]|4[0-2]|[5-9][0-9])"
_NIR = re.compile(
    "[12]"
    + _left("[12]")
    + _S
    + "[0-9]{2}"
    + _S
    + _NIR_MONTH
    + _S
    + "(?:[0-9]{2}|2[ABab])(?:"
    + _S
    + "[0-9]{3}|[0-9]"
    + _S
    + "[0-9]{2})"
    + _S
    + "[0-9]{3}"
    + _S
    + "[0-9]{2}(?![A-Za-z0-9])"
)


# Written with dots or dashes, in its usual groups, one separator throughout:
# 1.84.12.76.451.089.46, 2-84-12-2A-451-089-46.
_NIR_GROUPED = re.compile(
    "[12]"
    + _left("[12]")
    + r"([.\-])[0-9]{2}\1[0-9]{2}\1(?:[0-9]{2}|2[ABab])\1[0-9]{3}\1[0-9]{3}\1[0-9]{2}"
    r"(?![A-Za-z0-9])"
)


def _nir_ok(raw: str) -> bool:
    if len(raw) == 15 and raw.isdigit():  # compact: the key check alone (month: pattern)
        return 97 - int(raw[:13]) % 97 == int(raw[13:]) and raw[5:7] != "00" and raw[10:13] != "000"
    if "\\" in raw:
        raw = _ESC_SPACE_RE.sub("", raw)
    s = "".join(raw.split()).replace(".", "").replace("-", "").upper()
    month = int(s[3:5])
    if not (1 <= month <= 12 or 20 <= month <= 42 or 50 <= month <= 99):
        return False
    dept = s[5:7]
    if dept == "00" or s[10:13] == "000":
        return False
    body = s[:13]
    if dept == "2A":
        body = body[:5] + "19" + body[7:]
    elif dept == "2B":
        body = body[:5] + "18" + body[7:]
    elif not dept.isdigit():
        return False
    return 97 - int(body) % 97 == int(s[13:15])


def _find_nirs(text: str, out: list[Span]) -> None:
    taken = _Taken.ahead_of("NIR", out)
    patterns = (_NIR_GROUPED, _NIR) if "." in text or "-" in text else (_NIR,)
    for pattern in patterns:
        pos = 0
        while (m := pattern.search(text, pos)) is not None:
            if taken:
                covered = taken.end_covering(m.start())
                if covered >= 0:
                    pos = covered
                    continue
            if _nir_ok(m.group()):
                out.append(("NIR", m.start(), m.end()))
                pos = m.end()
            else:
                pos = m.start() + 1


# --------------------------------------------------------------------------- secrets

# One pattern per kind, each starting with a literal or a single class (fast scan), run
# only when its marker occurs in the text.
_PEM_BEGIN = re.compile(r"-----BEGIN [A-Z0-9 ]{1,64}-----")
_PEM_END = re.compile(r"-----END [A-Z0-9 ]{1,64}-----")
# A block cut short (no END line): its base64 lines.
_PEM_TAIL = re.compile(r"(?:[A-Za-z0-9+/=:, \t\r\n-]|\\[nrt])*")
_B64 = r"[A-Za-z0-9_\-]"
# A JWE's five segments (its key segment may be empty, and is random: never a second
# token's "eyJ" header, so two JWS joined by a dot stay two), else a JWS's three.
_JWT = re.compile(
    rf"eyJ{_B64}{{4,}}\.(?:(?!eyJ){_B64}*\.{_B64}{{2,}}\.{_B64}{{2,}}\.{_B64}{{2,}}"
    rf"|{_B64}{{2,}}\.{_B64}*)"
)
_B64_RUN = re.compile(rf"{_B64}*")
_AKID = re.compile(r"A[KS]IA[A-Z0-9]{16}(?![A-Za-z0-9])")
_BEARER = re.compile(r"[Bb][Ee][Aa][Rr][Ee][Rr](?:[ \t]|%20)+([A-Za-z0-9._~+/=\-]{16,})")
_PLACEHOLDER_WORDS = re.compile(
    r"(?i)your|token|here|example|sample|dummy|placeholder|redacted|changeme|insert|xxxx"
)


# Tokens whose form names them (as secret scanners know them), each run only when its
# marker occurs: GitHub, Slack (tokens and webhook paths), Stripe secret and restricted
# keys, Google API keys, OpenAI-style keys. A span is the token.
_TOKENS: tuple[tuple[tuple[str, ...], re.Pattern[str]], ...] = (
    (("ghp_", "gho_", "ghu_", "ghs_", "ghr_"), re.compile(r"gh[pousr]_[A-Za-z0-9]{36,255}")),
    (("github_pat_",), re.compile(r"github_pat_[A-Za-z0-9_]{22,255}")),
    (("xox",), re.compile(r"xox[a-z](?:\.xox[a-z])?-[0-9]+-[A-Za-z0-9-]{6,250}")),
    (("hooks.slack.com",), re.compile(r"(?<=hooks\.slack\.com/services/)[A-Za-z0-9/]{20,}")),
    (("_live_", "_test_"), re.compile(r"[rs]k_(?:live|test)_[A-Za-z0-9]{16,}")),
    (("AIza",), re.compile(r"AIza[0-9A-Za-z_\-]{35}")),
    (
        ("sk-",),
        re.compile(
            # A key has a digit, and a capital or no hyphen: slugs after "sk-" are
            # words joined by hyphens, in lower case.
            r"s(?<![A-Za-z0-9_\-]s)k-(?:[a-z]{2,10}-){0,3}(?=[A-Za-z_\-]{0,64}[0-9])"
            r"(?:(?=[a-z0-9_\-]{0,64}[A-Z])[A-Za-z0-9_\-]{32,512}|[a-z0-9]{32,512}(?![\w-]))"
        ),
    ),
)
_BASIC = re.compile(r"[Bb][Aa][Ss][Ii][Cc](?:[ \t]|%20)+([A-Za-z0-9+/]{8,}={0,2})")
# The password of a URL's userinfo (postgres://user:password@host).
_URL_PASSWORD = re.compile(
    r"[A-Za-z][A-Za-z0-9+.\-]{0,20}://[^\s/:@\"'<>]{0,256}:([^\s/@\"'<>]{1,256})@"
)
# `password=…`, `api_key: …` in free text. Not a bare "secret" (prose: "top secret:
# …"), and not a value that reads as code or a path (`get_password()`,
# `settings.API_KEY`, `/home/user`): see `_key_value_ok`.
_KEY_VALUE = re.compile(
    r"(?i)(?:password|passwd|pwd|client[_-]?secret|secret[_-]?(?:access[_-]?)?key|"
    r"api[_-]?(?:key|secret)|access[_-]?key|auth[_-]?token|access[_-]?token|"
    r"refresh[_-]?token)[\"']?[ \t]*[:=][ \t]*[\"']?([^\s\"'&,;]{6,}+)"
)
# Values that read as code, not as a secret: a call (`get_password()`), a dotted name
# with no digit (`settings.API_KEY`), a variable (`$API_KEY`, `${token}`, `%PASS%`), a
# path with no digit (`/home/user`). Passwords have digits or are not such shapes.
_CODE_LIKE = re.compile(
    r"[A-Za-z_$][\w$.]*\(.*"
    r"|[A-Za-z_]+(?:\.[A-Za-z_]+)+"
    r"|\$[A-Z_][A-Z0-9_]*|\$\{[^}]*\}.*|%[A-Z_][A-Z0-9_]*%"
    r"|/[A-Za-z_./-]*"
)


# An HTTP header's name (X-Api-Key, Proxy-Authorization, WWW-Authenticate): words in one
# case each, joined by hyphens. Prose names headers after "Bearer" or "api_key:".
_HEADER_NAME = re.compile(r"(?:[A-Z]?[a-z]+|[A-Z]+)(?:-(?:[A-Z]?[a-z]+|[A-Z]+))+")


def _key_value_ok(value: str) -> bool:
    return _token_ok(value) and not _CODE_LIKE.fullmatch(value)


def _basic_ok(token: str) -> bool:
    """A Basic credential: base64 of `user:password`."""
    try:
        raw = base64.b64decode(token + "=" * (-len(token) % 4), validate=True).decode()
    except ValueError:  # UnicodeDecodeError too: "Basic Authorization" decodes to noise
        return False
    return ":" in raw and raw.isprintable()


def _token_ok(token: str) -> bool:
    """Could this be a credential rather than a placeholder or a header's name?"""
    if len(set(token)) < 6:
        return False  # xxxxxxxxxxxxxxxxxxxx, ****, 0000000000000000
    if _HEADER_NAME.fullmatch(token):
        return False  # a header's name in prose: "Bearer Proxy-Authorization"
    return not (re.fullmatch(r"[A-Za-z_.\-]+", token) and _PLACEHOLDER_WORDS.search(token))


def _bearer_ok(token: str) -> bool:
    # A word is no token ("Bearer Authentication"); a password may be one.
    word = token.isalpha() and (token.islower() or token.isupper() or token.istitle())
    return not word and _token_ok(token)


def _find_pem_blocks(text: str, out: list[Span], public: list[Span]) -> None:
    """PEM blocks: a private key's is a ``SECRET`` (SPEC §6); a certificate's or a public
    key's is public, and noted in ``public`` so that nothing is read in its base64."""
    # A block runs to the first END line after its BEGIN. That END is looked up once
    # and kept while later BEGINs fall before it (or known to be missing): a search
    # to the end of the text for each BEGIN made many of them quadratic.
    pos = 0
    end_line: re.Match[str] | None = None
    no_end = False
    while (begin := _PEM_BEGIN.search(text, pos)) is not None:
        start = begin.start()
        if not no_end and (end_line is None or end_line.start() < begin.end()):
            end_line = _PEM_END.search(text, begin.end())
            no_end = end_line is None
        if end_line is not None:
            end = end_line.end()
        else:
            end = _PEM_TAIL.match(text, begin.end()).end()
            while end > begin.end() and text[end - 1] in " \t\r\n":
                end -= 1  # a truncated block: up to its last base64 line
        if "PRIVATE KEY" in begin.group():
            out.append(("SECRET", start, end))
        else:
            public.append(("PUBLIC", start, end))
        pos = end


# The markers of `_TOKENS`, in one pattern scanned in C: most texts hold none (a gate per
# form, each a generator, cost most of a short string's scan).
_TOKEN_HINT = re.compile(r"gh[pousr]_|github_pat_|xox|hooks\.slack\.com|_live_|_test_|AIza|sk-")


def _find_secrets(text: str, out: list[Span], public: list[Span]) -> None:
    """Secrets known by their form (the held credentials: `_find_held_secrets`)."""
    low = text.lower()  # for the gates only (any case), never for positions
    if "-----BEGIN" in text:
        _find_pem_blocks(text, out, public)
    if "eyJ" in text:
        pos = 0
        while (i := text.find("eyJ", pos)) != -1:
            m = _JWT.match(text, i)
            if m is None:
                # Every later "eyJ" of this base64url run fails alike (its first segment
                # ends where this one's does): skip the run, or "eyJeyJeyJ…" is quadratic.
                pos = _B64_RUN.match(text, i).end()
                continue
            if _left_ok(text, i):
                out.append(("SECRET", i, m.end()))
            pos = m.end()
    if "AKIA" in text or "ASIA" in text:
        for m in _AKID.finditer(text):
            if _left_ok(text, m.start()):
                out.append(("SECRET", m.start(), m.end()))
    if "bearer" in low:
        for m in _BEARER.finditer(text):
            if not _left_ok(text, m.start()):
                continue
            start, end = m.span(1)
            while end > start and text[end - 1] == ".":
                end -= 1
            if end - start >= 16 and _bearer_ok(text[start:end]):
                out.append(("SECRET", start, end))
    for markers, pattern in _TOKENS if _TOKEN_HINT.search(text) else ():
        if any(m in text for m in markers):
            for m in pattern.finditer(text):
                if _left_ok(text, m.start()) or pattern.pattern.startswith("(?<="):
                    out.append(("SECRET", m.start(), m.end()))
    if "basic" in low:
        for m in _BASIC.finditer(text):
            if _left_ok(text, m.start()) and _basic_ok(m.group(1)):
                out.append(("SECRET", *m.span(1)))
    if "://" in text:
        for m in _URL_PASSWORD.finditer(text):
            if not (m.group(1).isdigit() and len(m.group(1)) <= 5):  # host:port@…
                out.append(("SECRET", *m.span(1)))
    if "pass" in low or "pwd" in low or "secret" in low or "key" in low or "token" in low:
        for m in _KEY_VALUE.finditer(text):
            if _key_value_ok(m.group(1)):
                out.append(("SECRET", *m.span(1)))


def _find_held_secrets(text: str, secrets: Iterable[str], out: list[Span]) -> None:
    """The exact value of each credential the gateway holds, in every form of it."""
    for value in _secret_forms(secrets):
        i = text.find(value)
        while i != -1:
            out.append(("SECRET", i, i + len(value)))
            i = text.find(value, i + len(value))
    held = [s.encode() for s in secrets if isinstance(s, str) and s]
    short = [raw for raw in held if len(raw) < _B64_CORE_MIN]
    if short:
        _find_short_in_base64(text, short, out)


# Held credentials shorter than this (in bytes) have base64 cores short enough to occur by
# chance: their base64 is found by decoding instead (`_find_short_in_base64`).
_B64_CORE_MIN = 9
_B64_TOKEN = re.compile(r"[A-Za-z0-9+/_\-]{2,}={0,2}")


def _find_short_in_base64(text: str, short: list[bytes], out: list[Span]) -> None:
    """A short credential (a PIN, an 8-digit code) inside base64: a base64 token of the
    text that holds one of its cores is decoded, and is a ``SECRET`` whole when the
    credential is in its bytes ("Basic dXNlcjoxMjM0NTY3OA==" for `user:12345678`). No core
    in the text: nothing to decode. Each distinct token is decoded once."""
    cores = _cores_pattern(tuple(short))
    if cores is not None and cores.search(text) is None:
        return
    verdicts: dict[str, bool] = {}
    for m in _B64_TOKEN.finditer(text):
        token = m.group()
        verdict = verdicts.get(token)
        if verdict is None:
            verdict = (cores is None or cores.search(token) is not None) and _holds(token, short)
            verdicts[token] = verdict
        if verdict:
            out.append(("SECRET", m.start(), m.end()))


def _holds(token: str, short: list[bytes]) -> bool:
    """Does the base64 ``token`` (either alphabet, padding or not) decode to bytes
    holding one of ``short``? A stray last character is left out."""
    body = token.rstrip("=")
    body = body[: len(body) - len(body) % 4 if len(body) % 4 == 1 else len(body)]
    if "-" in body or "_" in body:
        body = body.replace("-", "+").replace("_", "/")
    try:
        raw = binascii.a2b_base64(body + "=" * (-len(body) % 4))
    except binascii.Error:
        return False
    return any(secret in raw for secret in short)


@lru_cache(maxsize=256)
def _cores_pattern(short: tuple[bytes, ...]) -> re.Pattern[str] | None:
    """The cores of each short credential's base64 (`_b64_heads`) in one pattern; None
    when one of them has no core (a credential of a byte or two: every token decoded)."""
    cores = [core for raw in short for core in _b64_heads(raw)]
    if not all(cores):
        return None
    return re.compile("|".join(re.escape(c) for c in sorted(set(cores), key=len, reverse=True)))


@lru_cache(maxsize=256)
def _b64_heads(raw: bytes) -> tuple[str, ...]:
    """The base64 characters that encode ``raw`` alone at each of the three offsets it
    may start at (those shared with its neighbours left out), in both alphabets."""
    heads = []
    for k in range(3):
        encoded = base64.b64encode(b"\0" * k + raw).decode().rstrip("=")
        core = encoded[-(-8 * k // 6) : (8 * (len(raw) + k)) // 6]
        heads += [core, core.replace("+", "-").replace("/", "_")]
    return tuple(dict.fromkeys(heads))


def _secret_forms(secrets: Iterable[str]) -> list[str]:
    """Each credential as written, its JSON-escaped forms when they differ, and the
    base64 it becomes inside a longer base64 text (a Basic header of `user:secret`)."""
    forms: list[str] = []
    for s in secrets or ():
        if not isinstance(s, str) or not s:
            continue
        for f in (s, json.dumps(s, ensure_ascii=False)[1:-1], json.dumps(s)[1:-1], *_b64_cores(s)):
            if f not in forms:
                forms.append(f)
    return forms


@lru_cache(maxsize=256)
def _b64_cores(secret: str) -> tuple[str, ...]:
    """The base64 characters that encode `secret` alone, at each of the three offsets it
    may start at in the encoded bytes (characters shared with its neighbours are left
    out), in the standard and the URL-safe alphabets. Only for secrets long enough that
    the cores (12 characters or more) cannot occur by chance."""
    raw = secret.encode()
    if len(raw) < _B64_CORE_MIN:
        return ()
    cores = []
    for k in range(3):
        encoded = base64.b64encode(b"\0" * k + raw).decode().rstrip("=")
        core = encoded[-(-8 * k // 6) : (8 * (len(raw) + k)) // 6]
        if len(core) >= 12:
            cores += [core, core.replace("+", "-").replace("/", "_")]
    return tuple(dict.fromkeys(cores))


# --------------------------------------------------------------------------- detection


def _entity_set(entities: Iterable[str]) -> frozenset[str]:
    if entities is ENTITIES:
        return _ALL
    if isinstance(entities, frozenset) and entities <= _ALL:
        return entities
    wanted = frozenset(str(e).upper() for e in entities)
    unknown = wanted - _ALL
    if unknown:
        raise ValueError(f"unknown DLP entities: {sorted(unknown)}")
    return wanted


def detect_spans(
    text: str, *, entities: Iterable[str] = ENTITIES, secrets: Iterable[str] = ()
) -> list[Span]:
    """Sensitive values in ``text`` as ``(entity, start, end)``: str indices, end
    exclusive, sorted by start, non-overlapping."""
    if not text:
        return []
    wanted = _entity_set(entities)
    found: list[Span] = []
    public: list[Span] = []  # certificates and public keys: nothing to find in them
    if "SECRET" in wanted:
        _find_secrets(text, found, public)
    elif "-----BEGIN" in text:
        _find_pem_blocks(text, [], public)
    if "EMAIL" in wanted and "@" in text:
        _find_emails(text, found)
    if "IBAN" in wanted:
        _find_ibans(text, found)
    if "CREDIT_CARD" in wanted:
        _find_cards(text, found)
    if "NIR" in wanted and ("1" in text or "2" in text):
        _find_nirs(text, found)
    if "PHONE" in wanted and ("0" in text or "+" in text):
        _find_phones(text, found)
    if public:
        inside = _Taken(public)
        found = [s for s in found if inside.end_covering(s[1]) < 0]
    if secrets:  # whatever entities a tool names: a held credential is never shown
        _find_held_secrets(text, secrets, found)
    if len(found) > 1:
        found = _resolve(found, text)
    return found


def _resolve(spans: list[Span], text: str) -> list[Span]:
    """Keep spans by priority, then length, dropping any that overlaps one kept; the
    characters kept so far are marked in a bytearray, so each test costs the span's
    length (a sorted list with inserts was quadratic on megabytes of findings).

    E-mails are taken from left to right: one whose local part ran back into a value
    kept before it (an IBAN, the address before it, glued by a dot) keeps its part after
    that value instead of vanishing, or swallowing the address before it."""
    spans.sort(key=lambda s: s[1])
    if all(spans[k][2] <= spans[k + 1][1] for k in range(len(spans) - 1)):
        return spans  # none overlaps (the common case, thousands of findings included)
    ranked = sorted(
        set(spans),
        key=lambda s: (_PRIORITY[s[0]], s[1] if s[0] == "EMAIL" else s[1] - s[2], s[1]),
    )
    cover = bytearray(max(end for _, _, end in ranked))
    kept: list[Span] = []
    for span in ranked:
        entity, start, end = span
        if cover.find(1, start, end) != -1:
            if entity != "EMAIL":
                continue
            start = cover.rfind(1, start, end) + 1
            while start < end and text[start] in _LOCAL_EDGE:
                start += 1
            at = text.find("@", start, end)
            if at <= start:  # nothing left of the local part, or the @ was taken
                continue
            span = (entity, start, end)
        cover[start:end] = b"\x01" * (end - start)
        kept.append(span)
    kept.sort(key=lambda s: s[1])
    return kept


# --------------------------------------------------------------------------- transforms


def mask_value(entity: str, value: str) -> str:
    """Keep the first 4 and the last 4 letters/digits as written, replace every other
    letter or digit with ``*``, keep spaces and separators. A secret becomes ``[SECRET]``.

    A value with 8 letters/digits or fewer would otherwise be shown whole; it keeps
    ``n // 4`` at each end instead (at least half of it is hidden)."""
    if entity == "SECRET":
        return "[SECRET]"
    if "\\" in value:
        # A span over escaped JSON text: an escape is one character, kept whole or
        # masked whole, so the JSON stays valid (06\u00a012…, j\u00fcrgen@…).
        units = _UNITS.findall(value)
        alnum = [_unit_alnum(u) for u in units]
    else:
        return _mask_plain(value)
    n = sum(alnum)
    keep = 4 if n > 8 else n // 4
    out = []
    seen = 0
    for unit, is_alnum in zip(units, alnum, strict=True):
        if is_alnum:
            out.append(unit if seen < keep or seen >= n - keep else "*")
            seen += 1
        else:
            out.append(unit)
    return "".join(out)


def _mask_plain(value: str) -> str:
    """`mask_value` without escapes: the middle masked by one substitution in C (a
    character at a time cost a megabyte of findings half a second)."""
    n = len(_ALNUM.findall(value))
    keep = 4 if n > 8 else n // 4
    head = 0
    for _ in range(keep):
        head = _ALNUM.search(value, head).end()
    tail = len(value)
    for _ in range(keep):
        while not value[tail - 1].isalnum():
            tail -= 1
        tail -= 1
    return value[:head] + _ALNUM.sub("*", value[head:tail]) + value[tail:]


_ALNUM = re.compile(r"[^\W_]")
_UNITS = re.compile(r"\\u[0-9A-Fa-f]{4}|\\.|.", re.DOTALL)


def _unit_alnum(unit: str) -> bool:
    if len(unit) == 1:
        return unit.isalnum()
    return len(unit) == 6 and chr(int(unit[2:], 16)).isalnum()


def redact_value(entity: str, value: str) -> str:
    """A typed placeholder: ``[IBAN]``, ``[CREDIT_CARD]``, ``[SECRET]``, ..."""
    return f"[{entity}]"


def scrub_text(
    text: str,
    *,
    action: str = "mask",
    entities: Iterable[str] = ENTITIES,
    secrets: Iterable[str] = (),
) -> tuple[str, dict[str, int]]:
    """``text`` with every finding masked or redacted, and the counts per entity type
    (only types actually found)."""
    transform = _transform(action)
    spans = detect_spans(text, entities=entities, secrets=secrets)
    if not spans:
        return text, {}
    counts: dict[str, int] = {}
    pieces = []
    pos = 0
    for entity, start, end in spans:
        pieces.append(text[pos:start])
        pieces.append(transform(entity, text[start:end]))
        counts[entity] = counts.get(entity, 0) + 1
        pos = end
    pieces.append(text[pos:])
    return "".join(pieces), counts


def _transform(action: str):
    if action == "mask":
        return mask_value
    if action == "redact":
        return redact_value
    raise ValueError(f"unknown DLP action {action!r} (expected 'mask' or 'redact')")


# Integers of 9 digits or more are read as text: the shortest number a detector finds
# without separators (a phone's national digits, a card, a NIR) has 9.
_NUMERIC_FLOOR = 10**8


def _long_number(v: Any) -> str | None:
    """The digits of a JSON number long enough to hold a finding: an integer, or a
    float with an integral value (`4111111111111111.0`, `4.111111111111111e15`)."""
    if type(v) is float and v.is_integer() and abs(v) < 1e20:
        v = int(v)
    if type(v) is int and not -_NUMERIC_FLOOR < v < _NUMERIC_FLOOR:
        return str(v)
    return None


def _numeric_secrets(secrets: tuple[str, ...]) -> tuple[str, ...]:
    """The held credentials a JSON number can hold: a number's text is digits, a sign, a
    point and an exponent (a PIN of 4 digits echoed as ``1234``)."""
    return tuple(s for s in secrets if any(c.isdigit() for c in s) and set(s) <= _NUMBER_CHARS)


_NUMBER_CHARS = frozenset("0123456789-+.eE")


def _number_text(v: Any, held: tuple[str, ...]) -> str | None:
    """The text of a JSON number to read as text: long enough to hold a finding
    (`_long_number`), or holding a credential the gateway holds, whatever its length."""
    digits = _long_number(v)
    if digits is None and held and type(v) in (int, float):
        written = json.dumps(v)
        if any(secret in written for secret in held):
            return written
    return digits


def scrub(
    value: Any,
    *,
    action: str = "mask",
    entities: Iterable[str] = ENTITIES,
    secrets: Iterable[str] = (),
) -> tuple[Any, dict[str, int]]:
    """Walk a JSON-like value (dict keys and values, lists, tuples, strings) and mask or
    redact every finding. Returns a new structure (the input is never mutated) and the
    counts per entity type. An integer long enough to be a card or a phone number
    (`4111111111111111` sent as a JSON number) is read as its digits: with a finding it
    becomes the masked string. Other numbers, booleans and ``None`` are returned
    unchanged."""
    _transform(action)
    wanted = _entity_set(entities)
    secret_list = tuple(s for s in (secrets or ()) if isinstance(s, str) and s)
    held = _numeric_secrets(secret_list)
    counts: dict[str, int] = {}

    def text(s: str) -> str:
        out, c = scrub_text(s, action=action, entities=wanted, secrets=secret_list)
        for k, v in c.items():
            counts[k] = counts.get(k, 0) + v
        return out

    def walk(v: Any) -> Any:
        if isinstance(v, str):
            return text(v)
        digits = _number_text(v, held)
        if digits is not None:
            masked = text(digits)
            return v if masked == digits else masked
        if isinstance(v, dict):
            new: dict[Any, Any] = {}
            for k, item in v.items():
                nk = text(k) if isinstance(k, str) else k
                if nk in new:  # two keys masked alike: keep both, disambiguated
                    i = 2
                    while f"{nk}#{i}" in new:
                        i += 1
                    nk = f"{nk}#{i}"
                new[nk] = walk(item)
            return new
        if isinstance(v, list):
            return [walk(x) for x in v]
        if isinstance(v, tuple):
            return tuple(walk(x) for x in v)
        return v

    return walk(value), counts


def contains_findings(
    value: Any, *, entities: Iterable[str] = ENTITIES, secrets: Iterable[str] = ()
) -> dict[str, int]:
    """Counts per entity type found anywhere in a JSON-like value (for action ``block``);
    empty when the value is clean."""
    wanted = _entity_set(entities)
    secret_list = tuple(s for s in (secrets or ()) if isinstance(s, str) and s)
    held = _numeric_secrets(secret_list)
    counts: dict[str, int] = {}
    stack = [value]
    while stack:
        v = stack.pop()
        digits = _number_text(v, held)
        if digits is not None:
            v = digits  # as scrub reads it
        if isinstance(v, str):
            for entity, _, _ in detect_spans(v, entities=wanted, secrets=secret_list):
                counts[entity] = counts.get(entity, 0) + 1
        elif isinstance(v, dict):
            stack.extend(k for k in v if isinstance(k, str))
            stack.extend(v.values())
        elif isinstance(v, list | tuple):
            stack.extend(v)
    return counts
