"""Test data for gateway.dlp: valid values generated with their checksums, lookalikes
and hard negatives, and a labelled corpus of ~200-500 byte records."""

from __future__ import annotations

import json
import random

from stdnum import iban as stdnum_iban
from stdnum import luhn

# --------------------------------------------------------------------------- IBAN

# Country -> BBAN (national part) written as a structure-conforming sample.
BBANS = {
    "FR": "30006000011234567890189",
    "DE": "370400440532013000",
    "GB": "NWBK60161331926819",
    "ES": "21000418450200051332",
    "IT": "X0542811101000000123456",
    "BE": "539007547034",
    "NL": "ABNA0417164300",
    "LU": "0019400644750000",
    "CH": "00762011623852957",
    "PT": "000201231234567890154",
    "AT": "1904300234573201",
    "PL": "109010140000071219812874",
    "IE": "AIBK93115212345678",
    "MC": "11222000010123456789030",
    "NO": "86011117947",
    "SE": "50000000058398257466",
    "DK": "00400440116243",
    "FI": "21000400023442",
    "GR": "01101250000000012300695",
    "RO": "AAAA1B31007593840000",
    "MT": "MALT011000012345MTLCAST001S",
    "SA": "80000000608010167519",
    "BR": "00360305000010009795493P1",
    "LC": "HEMM000100010012001200023015",
    "RU": "04452522540702810400000001234",
}


def make_iban(cc: str, bban: str | None = None, *, spaced: bool = False) -> str:
    """A valid IBAN (check digits computed with python-stdnum)."""
    bban = bban or BBANS[cc]
    number = cc + stdnum_iban.calc_check_digits(cc + "00" + bban) + bban
    return stdnum_iban.format(number) if spaced else number


def bad_iban(cc: str) -> str:
    good = make_iban(cc)
    wrong = (int(good[2:4]) % 97) + 2
    return good[:2] + f"{wrong:02d}" + good[4:]


# --------------------------------------------------------------------------- cards


def make_card(prefix: str, length: int) -> str:
    body = (prefix + "4539148803436467190123")[: length - 1]
    return body + luhn.calc_check_digit(body)


def group(number: str, sizes: list[int], sep: str = " ") -> str:
    out, pos = [], 0
    for s in sizes:
        out.append(number[pos : pos + s])
        pos += s
    return sep.join(out)


CARDS = {
    "visa16": make_card("4", 16),
    "visa13": make_card("4", 13),
    "visa19": make_card("4", 19),
    "mastercard5": make_card("5425", 16),
    "mastercard2": make_card("2221", 16),
    "mastercard2_2720": make_card("2720", 16),
    "amex": make_card("37", 15),
    "discover": make_card("6011", 16),
    "discover19": make_card("6011", 19),
    "jcb": make_card("3530", 16),
    "diners14": make_card("36", 14),
    "diners16": make_card("3056", 16),
    "unionpay": make_card("62", 16),
    "maestro": make_card("6759", 18),
    "cb": make_card("4970", 16),
}

# --------------------------------------------------------------------------- NIR


def make_nir(sex: str, yy: str, mm: str, dept: str, commune: str, order: str) -> str:
    body = sex + yy + mm + dept + commune + order
    num = body.replace("2A", "19").replace("2B", "18")
    key = 97 - int(num) % 97
    return f"{body}{key:02d}"


def spaced_nir(nir: str) -> str:
    return " ".join([nir[0], nir[1:3], nir[3:5], nir[5:7], nir[7:10], nir[10:13], nir[13:]])


NIRS = {
    "metro": make_nir("1", "84", "12", "76", "451", "089"),
    "woman": make_nir("2", "91", "03", "75", "112", "004"),
    "corsica_2a": make_nir("2", "69", "05", "2A", "004", "123"),
    "corsica_2b": make_nir("1", "55", "11", "2B", "033", "045"),
    "overseas_971": make_nir("1", "78", "06", "97", "105", "234"),
    "overseas_974": make_nir("2", "02", "09", "97", "411", "017"),
    "abroad_99": make_nir("1", "63", "07", "99", "352", "101"),
    "unknown_month": make_nir("1", "40", "20", "13", "055", "007"),
}

# --------------------------------------------------------------------------- secrets

JWT = (
    "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9."
    "eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkFsaWNlIiwiaWF0IjoxNTE2MjM5MDIyfQ."
    "SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"
)
ACCESS_KEY_ID = "AKIAIOSFODNN7EXAMPLE"
STS_KEY_ID = "ASIAY34FZKBOKMUTVV7A"
PEM = (
    "-----BEGIN RSA PRIVATE KEY-----\n"
    "MIIBOgIBAAJBAKj34GkxFhD90vcNLYLInFEX6Ppy1tPf9Cnzj4p4WGeKLs1Pt8Qu\n"
    "KUpRKfFLfRYC9AIKjbJTWit+CqvjWYzvQwECAwEAAQ==\n"
    "-----END RSA PRIVATE KEY-----"
)
BEARER_TOKEN = "sk_live_4eC39HqLyjWDarjtT1zdp7dc"

# --------------------------------------------------------------------------- tables

# (entity, value as written) — each is embedded in text and must be found exactly.
POSITIVES: list[tuple[str, str]] = [
    *[("IBAN", make_iban(cc)) for cc in BBANS],
    *[("IBAN", make_iban(cc, spaced=True)) for cc in ("FR", "DE", "GB", "ES", "IT", "BE")],
    ("IBAN", make_iban("FR").lower()),
    ("IBAN", make_iban("DE", spaced=True).lower()),
    *[("CREDIT_CARD", number) for number in CARDS.values()],
    ("CREDIT_CARD", group(CARDS["visa16"], [4, 4, 4, 4])),
    ("CREDIT_CARD", group(CARDS["visa16"], [4, 4, 4, 4], "-")),
    ("CREDIT_CARD", group(CARDS["visa19"], [4, 4, 4, 4, 3])),
    ("CREDIT_CARD", group(CARDS["mastercard2"], [4, 4, 4, 4])),
    ("CREDIT_CARD", group(CARDS["amex"], [4, 6, 5])),
    ("CREDIT_CARD", group(CARDS["amex"], [4, 6, 5], "-")),
    ("CREDIT_CARD", group(CARDS["diners14"], [4, 6, 4])),
    ("CREDIT_CARD", group(CARDS["cb"], [4, 4, 4, 4])),
    ("EMAIL", "alice.martin@example.com"),
    ("EMAIL", "bob+invoices@sub.example.co.uk"),
    ("EMAIL", "j_doe-42@mail.example.fr"),
    ("EMAIL", "ALICE@EXAMPLE.ORG"),
    ("PHONE", "06 12 34 56 78"),
    ("PHONE", "06.12.34.56.78"),
    ("PHONE", "06-12-34-56-78"),
    ("PHONE", "0612345678"),
    ("PHONE", "07 81 23 45 67"),
    ("PHONE", "01 42 68 53 00"),
    ("PHONE", "+33 6 12 34 56 78"),
    ("PHONE", "+33 (0)6 12 34 56 78"),
    ("PHONE", "+33 (0)1 42 68 53 00"),
    ("PHONE", "0033 6 12 34 56 78"),
    ("PHONE", "+33612345678"),
    ("PHONE", "+1 415 555 2671"),
    ("PHONE", "+1 (415) 555-2671"),
    ("PHONE", "+44 20 7946 0958"),
    ("PHONE", "+49 30 12345678"),
    ("PHONE", "+34 612 34 56 78"),
    ("PHONE", "+32 2 555 12 12"),
    *[("NIR", nir) for nir in NIRS.values()],
    *[("NIR", spaced_nir(nir)) for nir in NIRS.values()],
    ("SECRET", JWT),
    ("SECRET", ACCESS_KEY_ID),
    ("SECRET", STS_KEY_ID),
    ("SECRET", PEM),
]

# Texts that contain no finding at all.
HARD_NEGATIVES: list[str] = [
    "order 4111111111111112 must not be a card",  # 16 digits, Luhn fails
    "card 4111 1111 1111 1112",
    bad_iban("FR"),
    bad_iban("DE"),
    "iban FR76 3000 6000 0112 3456 7890 188 is wrong",
    "GB00NWBK60161331926819",
    "order ORD-2026-004512 shipped, ref CMD/2026/11/000123",
    "created 2026-11-30T02:06:36Z, epoch 1701302400, ms 1701302400123",
    "trace 550e8400-e29b-41d4-a716-446655440000 and 0b7a1c4e-0000-4000-8000-000000000000",
    "hosts 192.168.10.254, 10.0.0.1, 0.0.0.0 and 2001:0db8:85a3:0000:0000:8a2e:0370:7334",
    "total 1 234 567,89 EUR, 12 345,00 EUR, USD 1,234,567.89",
    "Authorization: Bearer <YOUR_TOKEN>",
    "Authorization: Bearer xxxxxxxxxxxxxxxxxxxxxxxx",
    "Authorization: Bearer YOUR_ACCESS_TOKEN_HERE",
    "masked FR76*******************0189 and FR76 **** **** **** **** ***0 189",
    "masked [IBAN] [CREDIT_CARD] [SECRET] **** 4111 **** **** 1111",
    "masked 06 12 ** ** 78 and alic********e.com",
    "call mailer.send then jira.search and payments.refund@2.1.0",
    "versions 1.2.3, v10.4.22, 2.0.0-rc.1, python 3.11.9, build 20261130.1",
    "SIRET 362 521 879 00034, SIREN 362 521 879, SIRET 73282932000074",
    "TVA FR40303265045, RCS Paris B 552 100 554",
    "icon@2x.png and logo@3x.jpg",
    "phone-like 12 34 56 78 90 and 612345678 and 0700000000",
    "ticket #123456789012 and PO 000123456789",
    "hash 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
    "AKIA-not-a-key AKIAIOSFODNN7 and eyJ alone",
    "NIR-like 1 84 12 76 451 089 47 (bad key)",
    "coords 48.8566, 2.3522 and temp -12.5",
]

# Entity-free filler used to build records.
FILLER = [
    "The invoice for the quarterly maintenance contract was approved by the finance team.",
    "Please find attached the summary of the incident review held on 2026-11-30.",
    "Tool mailer.send returned status 202 after 134 ms; retry policy: none.",
    "Ticket JIRA-4512 moved to In Progress; estimate 3 story points, sprint 42.",
    'The payload {"amount": 1250.5, "currency": "EUR", "count": 3} was accepted.',
    "Le client a confirmé la commande n° 2026-004512 pour un montant de 1 234,56 EUR.",
    "Build 20261130.1 deployed to eu-west-3 with version 2.14.0 and 3 replicas.",
    "Rappel : la réunion de suivi est prévue jeudi à 14h30 en salle B.",
]


def labelled_records(n: int = 400, seed: int = 7) -> list[tuple[str, list[tuple[str, str]]]]:
    """``n`` records (~200-500 bytes): text and the (entity, value) findings in it.
    About a third are entity-free; some are JSON-escaped."""
    rng = random.Random(seed)
    out: list[tuple[str, list[tuple[str, str]]]] = []
    for i in range(n):
        parts = rng.sample(FILLER, 3)
        labels: list[tuple[str, str]] = []
        if i % 3:
            entity, value = rng.choice(POSITIVES[:-1])  # PEM is long; keep records small
            parts.insert(rng.randrange(4), f"Reference: {value}.")
            labels.append((entity, value))
        if i % 5 == 0:
            parts.append(rng.choice(HARD_NEGATIVES))
        text = " ".join(parts)
        if i % 7 == 0:
            text = json.dumps({"message": text, "step": i}, ensure_ascii=False)
        out.append((text, labels))
    return out


# ------------------------------------------------------------ adversarial shapes (§14)


def _repeat(unit: str):
    """A text of about ``size`` characters made of ``unit`` repeated."""
    return lambda size: unit * (size // len(unit) + 1)


def _deep_json(size: int) -> str:
    """A JSON string escaped again and again: runs of backslashes before quotes."""
    text = 'a "quoted" 06 12 34 56 78 é'
    while len(text) < 4096:
        text = json.dumps(text)
    return (text + " ") * (size // (len(text) + 1) + 1)


def _random(alphabet: str, seed: int):
    def make(size: int) -> str:
        rng = random.Random(seed)
        return "".join(rng.choices(alphabet, k=size))

    return make


# Each makes a text of at least ``size`` characters that once cost (or could cost) a
# detector work per character beyond a single pass: candidate starts everywhere.
ADVERSARIAL_SHAPES = {
    "one-space": _repeat("1 "),
    "two-space": _repeat("2 "),
    "digits": _repeat("1"),
    "zeros": _repeat("0"),
    "digits-spaced-pairs": _repeat("06 "),
    "nir-like": _repeat("184127645108947 "),
    "nir-grouped": _repeat("1 84 12 76 451 089 47 "),
    "nir-dotted": _repeat("1.84.12.76.451.089.47 "),
    "digit-dash": _repeat("1-"),
    "digit-dot": _repeat("1."),
    "plus-33": _repeat("+33 "),
    "plus-33-6": _repeat("+33 6 "),
    "plus": _repeat("+"),
    "plus-digits": _repeat("+1"),
    "paren-zero": _repeat("+33 (0)"),
    "cards-bad-luhn": _repeat("4111 1111 1111 1112 "),
    "card-groups": _repeat("4111 "),
    "at": _repeat("@"),
    "at-domains": _repeat("a@b."),
    "at-letters": _repeat("a@"),
    "dots": _repeat("a."),
    "pem-begin": _repeat("-----BEGIN"),
    "pem-begin-line": _repeat("-----BEGIN PRIVATE KEY-----\n"),
    "pem-end-line": _repeat("-----END PRIVATE KEY-----\n"),
    "dashes": _repeat("-"),
    "eyj": _repeat("eyJ"),
    "eyj-dot": _repeat("eyJhbGciOi."),
    "bearer": _repeat("Bearer "),
    "bearer-token": _repeat("Bearer abcdefghijklmnop1 "),
    "basic": _repeat("Basic "),
    "basic-token": _repeat("Basic dXNlcjpwYXNz "),
    "password": _repeat("password="),
    "akia": _repeat("AKIA"),
    "iban-start": _repeat("FR76"),
    "iban-spaced": _repeat("FR76 "),
    "iban-bad": _repeat("FR7630006000011234567890188 "),
    "url-userinfo": _repeat("a://b:c@"),
    "sk": _repeat("sk-"),
    "escapes": _repeat("\\u00a0"),
    "escaped-digits": _repeat("\\u00a01"),
    "newline-escapes": _repeat("\\n0"),
    "nbsp-digits": _repeat("0\u00a0"),
    "separators": _repeat(" -.\u00a0\u202f"),
    "deep-json-string": _deep_json,
    "random-digits-spaces": _random("0123456789 ", 1),
    "random-base64": _random("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/", 2),
    "random-mixed": _random("0123456789 +-.@()aAzZ:/=\\u", 3),
    "prose": _repeat("Le client a confirmé la commande n° 2026-004512 le 03/11/2026. "),
}


def corpus_records() -> list[tuple[str, list[tuple[str, str]]]]:
    return labelled_records(2000, seed=11)
