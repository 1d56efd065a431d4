"""Test data for gateway.dlp: valid values generated with their checksums, lookalikes
and hard negatives, and a labelled corpus of ~200-500 byte records."""

from __future__ import annotations

import base64
import json
import random
import string

import phonenumbers
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


# ------------------------------------------------ precision corpus (issue 15, SPEC §6)
#
# Records labelled with their entities' exact spans, in English and French, and
# entity-free records of every shape that once read as personal data or a secret:
# numbers the numbering plan accepts but that are dates, times, positions, measures,
# serials, draws, barcodes, postcodes or counts; NIR-shaped numbers with a wrong key;
# public material (certificates, public keys, commit ids, checksums, a JWT's header,
# data URIs, header names in prose). Values are generated with their checksums, the
# phones validated with the numbering plan (`phonenumbers`), so each is what it says.

Part = str | tuple[str, str]  # text, or (entity, value)


def _record(parts: list[Part]) -> tuple[str, list[tuple[str, int, int]]]:
    text, spans = "", []
    for part in parts:
        if isinstance(part, tuple):
            entity, value = part
            spans.append((entity, len(text), len(text) + len(value)))
            text += value
        else:
            text += part
    return text, spans


def _escaped(parts: list[Part], ensure_ascii: bool) -> list[Part]:
    """The same parts inside a JSON string: JSON escapes character by character, so the
    escaped parts, joined, are the escaped text (and the spans run over escapes)."""

    def esc(s: str) -> str:
        return json.dumps(s, ensure_ascii=ensure_ascii)[1:-1]

    return (
        ['{"message": "']
        + [(p[0], esc(p[1])) if isinstance(p, tuple) else esc(p) for p in parts]
        + ['"}']
    )


def _b64_block(rng: random.Random, label: str, size: int) -> str:
    body = base64.b64encode(rng.randbytes(size)).decode()
    lines = [body[i : i + 64] for i in range(0, len(body), 64)]
    return f"-----BEGIN {label}-----\n" + "\n".join(lines) + f"\n-----END {label}-----"


def _fr_number(rng: random.Random, first: str) -> str:
    """Ten digits the French numbering plan says are valid, starting with ``first``."""
    while True:
        digits = first + "".join(rng.choices("0123456789", k=10 - len(first)))
        if phonenumbers.is_valid_number(phonenumbers.parse(digits, "FR")):
            return digits


def _pairs(digits: str, sep: str = " ") -> str:
    return sep.join(digits[i : i + 2] for i in range(0, len(digits), 2))


def _nir(rng: random.Random, *, dept: str | None = None, good: bool = True) -> str:
    body = (
        rng.choice("12")
        + f"{rng.randrange(0, 100):02d}"
        + f"{rng.randrange(1, 13):02d}"
        + (dept or f"{rng.randrange(1, 96):02d}")
        + f"{rng.randrange(1, 1000):03d}"
        + f"{rng.randrange(1, 1000):03d}"
    )
    key = 97 - int(body.replace("2A", "19").replace("2B", "18")) % 97
    if not good:
        key = key % 97 + 1
    return f"{body}{key:02d}"


def _ean13(rng: random.Random, prefix: str, *, luhn_too: bool) -> str:
    while True:
        body = prefix + "".join(rng.choices("0123456789", k=12 - len(prefix)))
        odd = sum(int(d) for d in body[1::2]) * 3 + sum(int(d) for d in body[0::2])
        code = body + str((10 - odd % 10) % 10)
        if not luhn_too or luhn.is_valid(code):
            return code


def _positive_parts(rng: random.Random, lang: str) -> list[Part]:
    """One labelled value in a sentence of its language."""
    en = lang == "en"
    kind = rng.randrange(16)
    if kind == 0:
        number = _fr_number(rng, rng.choice(["06", "07"]))
        value = rng.choice(
            [
                _pairs(number),
                number,
                _pairs(number, "."),
                "+33 " + _pairs(number[1:])[0:1] + " " + _pairs(number[2:]),
            ]
        )
        lead = rng.choice(
            ["Call me on ", "My mobile: ", "Reach Anna at "]
            if en
            else ["Appelez-moi au ", "Portable : ", "Joignable au "]
        )
        return [
            lead,
            ("PHONE", value),
            rng.choice(
                [".", " after 6pm.", " (evenings)."] if en else [".", " après 18h.", " (le soir)."]
            ),
        ]
    if kind == 1:
        number = _fr_number(rng, rng.choice(["01", "02", "03", "04", "05", "09"]))
        lead = rng.choice(
            ["Office line ", "Front desk: "] if en else ["Standard : ", "Tél. bureau "]
        )
        return [
            lead,
            ("PHONE", _pairs(number)),
            ", Monday to Friday." if en else ", du lundi au vendredi.",
        ]
    if kind == 2:
        value = rng.choice(
            [
                "+44 20 7946 0958",
                "+1 415 555 2671",
                "+49 30 12345678",
                "+32 2 555 12 12",
                "+34 612 34 56 78",
                "+41 44 668 18 00",
            ]
        )
        return ["International: " if en else "Depuis l'étranger : ", ("PHONE", value), "."]
    if kind == 3:
        cc = rng.choice(list(BBANS))
        value = make_iban(cc, spaced=rng.random() < 0.5)
        return [
            "Please wire the deposit to " if en else "Merci de virer l'acompte sur ",
            ("IBAN", value),
            ".",
        ]
    if kind == 4:
        name = rng.choice(list(CARDS))
        value = (
            CARDS[name]
            if rng.random() < 0.5
            else group(CARDS[name], [4, 4, 4, 4])
            if len(CARDS[name]) == 16
            else CARDS[name]
        )
        return ["Card used: " if en else "Carte utilisée : ", ("CREDIT_CARD", value), " exp 12/28."]
    if kind == 5:
        nir = _nir(rng, dept=rng.choice([None, "01", "06", "07", "2A", "2B"]))
        value = spaced_nir(nir) if rng.random() < 0.5 else nir
        return [
            "Social security number " if en else "Numéro de sécurité sociale ",
            ("NIR", value),
            ".",
        ]
    if kind == 6:
        user = rng.choice(["camille.martin", "j.doe", "ana+billing", "françois", "o'brien"])
        value = f"{user}@{rng.choice(['example.com', 'exemple.fr', 'mail.example.org'])}"
        return [
            "Reply to " if en else "Répondre à ",
            ("EMAIL", value),
            " please." if en else " svp.",
        ]
    if kind == 7:
        return [
            "Authorization: Bearer ",
            ("SECRET", "".join(rng.choices(string.ascii_letters + string.digits, k=32))),
            " was rejected." if en else " a été refusé.",
        ]
    if kind == 8:
        return ["token " if en else "jeton ", ("SECRET", JWT), " expired." if en else " expiré."]
    if kind == 9:
        return ["aws_access_key_id=", ("SECRET", ACCESS_KEY_ID), " leaked" if en else " divulgué"]
    if kind == 10:
        label = rng.choice(
            [
                "RSA PRIVATE KEY",
                "EC PRIVATE KEY",
                "PRIVATE KEY",
                "OPENSSH PRIVATE KEY",
                "ENCRYPTED PRIVATE KEY",
            ]
        )
        return ["key:\n" if en else "clé :\n", ("SECRET", _b64_block(rng, label, 120)), "\n"]
    if kind == 11:
        value = "ghp_" + "".join(rng.choices(string.ascii_letters + string.digits, k=36))
        return [
            "GitHub token " if en else "jeton GitHub ",
            ("SECRET", value),
            " revoked." if en else " révoqué.",
        ]
    if kind == 12:
        number = _fr_number(rng, "06")
        return [
            "Tél. : " if not en else "Phone: ",
            ("PHONE", _pairs(number)),
            " / ",
            ("EMAIL", "contact@example.fr"),
            ".",
        ]
    if kind == 13:
        # a NIR of someone born in a department 01-09 holds a mobile-shaped tail
        nir = _nir(rng, dept=f"0{rng.randrange(1, 10)}")
        return ["NIR " if en else "N° sécu ", ("NIR", spaced_nir(nir)), "."]
    if kind == 14:
        number = _fr_number(rng, rng.choice(["06", "07"]))
        return [
            "Draw on Friday; questions to " if en else "Tirage vendredi ; questions au ",
            ("PHONE", _pairs(number)),
            ".",
        ]
    return [
        "password=" if en else "mot de passe : password=",
        ("SECRET", "Sup3r" + "".join(rng.choices(string.digits, k=4)) + "!x"),
        "",
    ]


def _negative_text(rng: random.Random, lang: str) -> str:
    """One entity-free snippet of a shape that must not be masked."""
    en = lang == "en"
    kind = rng.randrange(17)
    number = _fr_number(rng, rng.choice(["01", "02", "03", "04", "05", "06", "07", "09"]))
    if kind == 0:  # dates
        d, m, y = rng.randrange(1, 29), rng.randrange(1, 13), rng.randrange(2000, 2031)
        return rng.choice(
            [
                f"on {y}-{m:02d}-{d:02d} at {rng.randrange(24):02d}:{rng.randrange(60):02d}"
                if en
                else f"le {d:02d} {m:02d} {y} à {rng.randrange(24):02d} h {rng.randrange(60):02d}",
                f"Date: {d:02d}.{m:02d}.{y} {rng.randrange(24):02d}:{rng.randrange(60):02d}",
                f"{'from' if en else 'du'} {d:02d} {m:02d} {y} {'to' if en else 'au'} "
                f"{d:02d} {m:02d} {y}",
                f"dates {_pairs(number)}",
                f"{y} {m:02d} {d:02d} {rng.randrange(24):02d} {rng.randrange(60):02d}",
            ]
        )
    if kind == 1:  # times, timetables
        times = sorted(rng.sample(range(5 * 60, 23 * 60), 6))
        table = " ".join(f"{t // 60:02d} {t % 60:02d}" for t in times)
        return rng.choice(
            [
                f"Departures {table}" if en else f"Départs {table}",
                f"{'Opening hours' if en else 'Horaires'} : {table}",
                f"{'times' if en else 'heures'} {_pairs(number)}",
                f"at {times[0] // 60:02d}:{times[0] % 60:02d}:{rng.randrange(60):02d}",
            ]
        )
    if kind == 2:  # GPS positions
        lat, lon = rng.uniform(-60, 60), rng.uniform(-120, 120)
        return rng.choice(
            [
                f"GPS {lat:.6f}, {lon:.6f}",
                f"lat=+{abs(lat):.8f}&lon=+{abs(lon):.8f}",
                f"{'position' if en else 'position'} +{abs(lat):.7f} +{abs(lon):.7f}",
                f"{'coordinates' if en else 'coordonnées'} {_pairs(number)}",
                f"{abs(lat):.0f}°{rng.randrange(60):02d}'{rng.randrange(60):02d}\"N",
            ]
        )
    if kind == 3:  # measures
        return rng.choice(
            [
                f"{_pairs(number)} mm",
                f"{number} {'bytes' if en else 'octets'}",
                f"{'thickness' if en else 'épaisseur'} 0.{number} mm",
                f"{'weight' if en else 'poids'} {_pairs(number)}",
                f"+{number[1:3]} {number[3:6]} {number[6:]} km",
            ]
        )
    if kind == 4:  # serials
        return rng.choice(
            [
                f"S/N {number}",
                f"Serial number: {_pairs(number)}" if en else f"n° de série {number}",
                f"IMEI {number}{rng.randrange(10**5):05d}",
                f"{'batch' if en else 'lot'} {_pairs(number)}",
            ]
        )
    if kind == 5:  # lottery draws
        balls = " ".join(f"{b:02d}" for b in sorted(rng.sample(range(1, 50), 5)))
        stars = " ".join(f"{b:02d}" for b in sorted(rng.sample(range(1, 13), 2)))
        return rng.choice(
            [
                f"{'Winning numbers' if en else 'Numéros gagnants'}: {balls}",
                f"{'Lottery draw' if en else 'Tirage du loto'} : {balls} + {stars}",
                f"EuroMillions {balls} {'stars' if en else 'étoiles'} {stars}",
                f"{balls} {stars} {rng.randrange(1, 11):02d}",
            ]
        )
    if kind == 6:  # barcodes (EAN-13 passing Luhn too)
        ean = _ean13(rng, rng.choice(["4", "40", "5", "3", "0", "00"]), luhn_too=True)
        return rng.choice(
            [
                f"EAN {ean}",
                f"{'barcode' if en else 'code-barres'} {ean}",
                f"{'item' if en else 'article'} {ean}",
                f"GTIN 0{ean}",
            ]
        )
    if kind == 7:  # postcodes
        codes = [
            f"{rng.choice(['01', '06', '07', '09', '04', '02'])}{rng.randrange(0, 1000):03d}"
            for _ in range(3)
        ]
        return rng.choice(
            [
                f"{'postcodes' if en else 'codes postaux'} {' '.join(codes)}",
                f"{codes[0]} {codes[1]}",
                f"CP {codes[0]} {codes[1]} {codes[2]}",
            ]
        )
    if kind == 8:  # big counts
        return rng.choice(
            [
                f"+{rng.randrange(1, 99)} {rng.randrange(100, 999)} {rng.randrange(100, 999)} "
                f"{rng.randrange(100, 999)} {'views' if en else 'vues'}",
                f"population {rng.randrange(1, 99)} {rng.randrange(100, 999)} "
                f"{rng.randrange(100, 999)}",
                f"+{number[1:]} {'users' if en else 'utilisateurs'}",
                f"total {_pairs(number)}",
            ]
        )
    if kind == 9:  # NIR-shaped, wrong key
        nir = _nir(rng, dept=f"0{rng.randrange(1, 10)}", good=False)
        return rng.choice([spaced_nir(nir), nir, f"{'ref' if en else 'réf'} {spaced_nir(nir)}"])
    if kind == 10:  # certificates and public keys
        return rng.choice(
            [
                _b64_block(rng, "CERTIFICATE", 540),
                _b64_block(rng, "PUBLIC KEY", 160),
                _b64_block(rng, "RSA PUBLIC KEY", 140),
                _b64_block(rng, "PGP PUBLIC KEY BLOCK", 300),
                "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAA"
                + base64.b64encode(rng.randbytes(33)).decode()
                + " deploy@ci",
            ]
        )
    if kind == 11:  # git commit ids
        sha = rng.randbytes(20).hex()
        return rng.choice(
            [
                f"commit {sha}",
                f"{'fixed in' if en else 'corrigé dans'} {sha[:7]}",
                f"Merge: {sha[:7]} {rng.randbytes(4).hex()[:7]}",
                f"https://git.example.org/app/commit/{sha}",
            ]
        )
    if kind == 12:  # checksums
        return rng.choice(
            [
                f"sha256 {rng.randbytes(32).hex()}  release.tar.gz",
                f"md5={rng.randbytes(16).hex()}",
                f"SHA1: {rng.randbytes(20).hex().upper()}",
                f"crc32 0x{rng.randbytes(4).hex()} cksum {rng.randrange(10**9, 10**10)} "
                f"{rng.randrange(10**6, 10**8)}",
                f"sha512-{base64.b64encode(rng.randbytes(64)).decode()}",
            ]
        )
    if kind == 13:  # a JWT's decoded header, or its header segment alone
        header = json.dumps(
            {
                "alg": rng.choice(["RS256", "HS256", "ES256"]),
                "typ": "JWT",
                "kid": rng.randbytes(8).hex(),
            }
        )
        segment = base64.urlsafe_b64encode(header.encode()).decode().rstrip("=")
        lead = "the header" if en else "l'en-tête"
        verb = "decodes to" if en else "donne"
        return rng.choice([f"header {header}", f"{lead} {segment} {verb} {header}"])
    if kind == 14:  # data URIs
        return rng.choice(
            [
                "data:image/png;base64,"
                + base64.b64encode(rng.randbytes(rng.randrange(60, 300))).decode(),
                "data:application/json;base64,"
                + base64.b64encode(
                    json.dumps({"n": rng.randrange(10**6), "ok": True}).encode()
                ).decode(),
                '<img src="data:image/gif;base64,'
                'R0lGODlhAQABAIAAAAAAAP///yH5BAEAAAAALAAAAAABAAEAAAIBRAA7">',
            ]
        )
    if kind == 15:  # header names in prose
        return rng.choice(
            [
                "Send it as Bearer X-Amz-Security-Token in the request"
                if en
                else "Envoyez-le comme Bearer X-Amz-Security-Token dans la requête",
                "the gateway reads Bearer Proxy-Authorization first"
                if en
                else "la passerelle lit Bearer Proxy-Authorization d'abord",
                "api_key: X-Api-Key header" if en else "api_key: l'en-tête X-Api-Key",
                "Basic Authorization is deprecated" if en else "Basic Authorization est obsolète",
                "set Authorization: Bearer <token> and X-Request-Id",
            ]
        )
    return rng.choice(FILLER)  # plain prose


FILLER_EN_FR = FILLER + [
    "The nightly export finished; 3 files were written to the archive bucket.",
    "Le rapport mensuel a été envoyé à l'équipe comptable ce matin.",
    "Meeting moved to room 4B, bring the Q3 figures.",
    "Merci de valider la note de frais avant vendredi.",
]


def precision_records(
    n: int = 2000, seed: int = 15
) -> list[tuple[str, list[tuple[str, int, int]]]]:
    """``n`` records, half in English and half in French: about 45 % hold one labelled
    value (sometimes beside an entity-free snippet), the rest are entity-free (with one
    or two snippets of the shapes above); one in five is a JSON-escaped message."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        lang = "en" if i % 2 else "fr"
        parts: list[Part] = [rng.choice(FILLER_EN_FR) + " "]
        if rng.random() < 0.45:
            parts += _positive_parts(rng, lang)
            if rng.random() < 0.5:
                parts.append(" " + _negative_text(rng, lang) + ".")
        else:
            parts.append(_negative_text(rng, lang))
            if rng.random() < 0.4:
                parts.append("; " + _negative_text(rng, lang))
            parts.append(".")
        parts.append(" " + rng.choice(FILLER_EN_FR))
        if i % 5 == 0:
            parts = _escaped(parts, ensure_ascii=bool(i % 2))
        out.append(_record(parts))
    return out
