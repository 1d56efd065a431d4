"""gateway.dlp: exact span bounds, checksums, masking, redaction, JSON walk (SPEC §6)."""

from __future__ import annotations

import copy
import json

import pytest

from gateway import dlp
from tests.dlp_corpus import (
    ACCESS_KEY_ID,
    BBANS,
    BEARER_TOKEN,
    CARDS,
    HARD_NEGATIVES,
    JWT,
    NIRS,
    PEM,
    POSITIVES,
    bad_iban,
    labelled_records,
    make_iban,
)


def found(text: str, **kwargs) -> list[tuple[str, str]]:
    return [(e, text[a:b]) for e, a, b in dlp.detect_spans(text, **kwargs)]


POSITIVE_IDS = [f"{e}:{v[:24]}" for e, v in POSITIVES]

CONTEXTS = [
    "{}",
    "Voici la valeur : {}. Merci.",
    "value={}\n",
    "(see {}), then continue",
]


@pytest.mark.parametrize("context", CONTEXTS)
@pytest.mark.parametrize(
    ("entity", "value"), POSITIVES, ids=[f"{e}:{v[:24]}" for e, v in POSITIVES]
)
def test_it_finds_each_entity_with_exact_bounds(entity, value, context):
    text = context.format(value)
    start = text.index(value)
    assert dlp.detect_spans(text) == [(entity, start, start + len(value))]


@pytest.mark.parametrize(
    ("entity", "value"), POSITIVES, ids=[f"{e}:{v[:24]}" for e, v in POSITIVES]
)
def test_it_finds_values_inside_escaped_json_text(entity, value):
    raw = json.dumps({"note": f"line one\n{value}\nline two"})
    escaped = json.dumps(value)[1:-1]
    start = raw.index(escaped)
    assert dlp.detect_spans(raw) == [(entity, start, start + len(escaped))]


def test_it_covers_ibans_of_at_least_15_countries_in_any_case():
    assert len(BBANS) >= 15
    for cc in BBANS:
        for value in (make_iban(cc), make_iban(cc, spaced=True), make_iban(cc).lower()):
            assert found(f"IBAN {value} ok") == [("IBAN", value)], value


def test_it_covers_every_country_of_the_registry():
    assert len(dlp._IBAN_LENGTHS) == 89
    assert dlp._IBAN_LENGTHS["FR"] == 27 and dlp._IBAN_LENGTHS["NO"] == 15


@pytest.mark.parametrize("cc", sorted(BBANS))
def test_it_ignores_ibans_with_a_bad_checksum(cc):
    assert dlp.detect_spans(f"IBAN {bad_iban(cc)} ok") == []


@pytest.mark.parametrize("name", sorted(CARDS))
def test_it_ignores_cards_failing_luhn(name):
    number = CARDS[name]
    wrong = number[:-1] + str((int(number[-1]) + 1) % 10)
    assert dlp.detect_spans(f"card {wrong} exp 12/28") == []


def test_it_finds_every_card_network():
    expected = {
        "visa16": 16,
        "visa19": 19,
        "mastercard5": 16,
        "mastercard2": 16,
        "amex": 15,
        "discover": 16,
        "jcb": 16,
        "diners14": 14,
        "cb": 16,
    }
    for name, length in expected.items():
        assert len(CARDS[name]) == length
        assert found(f"pay with {CARDS[name]} now") == [("CREDIT_CARD", CARDS[name])]


@pytest.mark.parametrize("name", sorted(NIRS))
def test_it_ignores_nirs_with_a_bad_key(name):
    nir = NIRS[name]
    wrong = nir[:-2] + f"{(int(nir[-2:]) % 97) + 1:02d}"
    assert dlp.detect_spans(f"NIR {wrong} ok") == []


def test_it_finds_corsican_overseas_and_foreign_born_nirs():
    for name in ("corsica_2a", "corsica_2b", "overseas_971", "overseas_974", "abroad_99"):
        assert found(f"n° sécu {NIRS[name]}.") == [("NIR", NIRS[name])]
    assert "2A" in NIRS["corsica_2a"] and "2B" in NIRS["corsica_2b"]


@pytest.mark.parametrize("text", HARD_NEGATIVES)
def test_it_finds_nothing_in_hard_negatives(text):
    assert found(text) == []
    assert dlp.scrub_text(text) == (text, {})


def test_it_masks_the_spec_examples_exactly():
    assert dlp.mask_value("IBAN", "FR7630006000011234567890189") == "FR76*******************0189"
    assert (
        dlp.mask_value("IBAN", "FR76 3000 6000 0112 3456 7890 189")
        == "FR76 **** **** **** **** ***0 189"
    )
    text = "virement vers FR76 3000 6000 0112 3456 7890 189 demain"
    assert dlp.scrub_text(text) == (
        "virement vers FR76 **** **** **** **** ***0 189 demain",
        {"IBAN": 1},
    )


def test_it_masks_other_entities_keeping_separators():
    assert dlp.mask_value("CREDIT_CARD", "4111 1111 1111 1111") == "4111 **** **** 1111"
    assert dlp.mask_value("PHONE", "+33 (0)6 12 34 56 78") == "+33 (0)6 ** ** 56 78"
    assert dlp.mask_value("EMAIL", "alice.martin@example.com") == "alic*.******@******e.com"
    assert dlp.mask_value("SECRET", JWT) == "[SECRET]"
    # 8 letters/digits or fewer: keep n // 4 at each end, never the whole value
    assert dlp.mask_value("EMAIL", "ab@cd.fr") == "a*@**.*r"


@pytest.mark.parametrize("entity", dlp.ENTITIES)
def test_it_redacts_with_typed_placeholders(entity):
    assert dlp.redact_value(entity, "whatever") == f"[{entity}]"


def test_it_redacts_text_and_counts_per_entity():
    text = (
        f"IBAN {make_iban('DE')}, card {CARDS['amex']}, mail bob@example.org, "
        f"tel 06 12 34 56 78, NIR {NIRS['metro']}, key {ACCESS_KEY_ID}"
    )
    out, counts = dlp.scrub_text(text, action="redact")
    assert out == (
        "IBAN [IBAN], card [CREDIT_CARD], mail [EMAIL], tel [PHONE], NIR [NIR], key [SECRET]"
    )
    assert counts == {"IBAN": 1, "CREDIT_CARD": 1, "EMAIL": 1, "PHONE": 1, "NIR": 1, "SECRET": 1}


def test_it_walks_nested_json_keys_too_with_counts_and_never_mutates():
    value = {
        "tool": "mailer.send",
        "to": ["alice@example.com", {"cc": "bob@example.org"}],
        "bob@example.org": {"iban": make_iban("FR", spaced=True)},
        "amount": 1250.5,
        "count": 3,
        "urgent": True,
        "note": None,
        "raw": json.dumps({"card": CARDS["visa16"]}),
    }
    before = copy.deepcopy(value)
    out, counts = dlp.scrub(value)
    assert value == before
    assert counts == {"EMAIL": 3, "IBAN": 1, "CREDIT_CARD": 1}
    assert out["tool"] == "mailer.send"
    assert out["to"][0] == "alic*@******e.com"
    assert out["to"][1]["cc"] == "bob@e*****e.org"
    assert "bob@e*****e.org" in out and "bob@example.org" not in out
    assert out["bob@e*****e.org"]["iban"] == "FR76 **** **** **** **** ***0 189"
    assert (out["amount"], out["count"], out["urgent"], out["note"]) == (1250.5, 3, True, None)
    assert out["raw"] == json.dumps({"card": dlp.mask_value("CREDIT_CARD", CARDS["visa16"])})

    redacted, counts = dlp.scrub(value, action="redact")
    assert redacted["to"] == ["[EMAIL]", {"cc": "[EMAIL]"}]
    assert redacted["[EMAIL]"] == {"iban": "[IBAN]"}


def test_it_keeps_both_keys_when_they_mask_alike():
    out, counts = dlp.scrub({"a@example.org": 1, "b@example.org": 2}, action="redact")
    assert out == {"[EMAIL]": 1, "[EMAIL]#2": 2}
    assert counts == {"EMAIL": 2}


def test_it_masks_held_credentials_wherever_they_appear():
    credential = "s3cr3t-Upstream-Pa$$"
    text = f"echo: {credential} and again {credential}; url=https://x/?k={credential}"
    spans = dlp.detect_spans(text, secrets=[credential])
    assert [text[a:b] for _, a, b in spans] == [credential] * 3
    assert dlp.scrub_text(text, secrets=[credential])[0] == (
        "echo: [SECRET] and again [SECRET]; url=https://x/?k=[SECRET]"
    )
    out, counts = dlp.scrub({"echo": {"headers": [f"X-Key: {credential}"]}}, secrets=[credential])
    assert out == {"echo": {"headers": ["X-Key: [SECRET]"]}} and counts == {"SECRET": 1}
    # its JSON-escaped form in raw JSON text too
    quoted = 'pa"ss\\word'
    raw = json.dumps({"v": quoted})
    assert dlp.scrub_text(raw, secrets=[quoted])[0] == '{"v": "[SECRET]"}'
    # empty credentials are ignored
    assert dlp.detect_spans("nothing here", secrets=["", None]) == []


def test_it_prefers_the_higher_priority_span_on_overlap():
    iban = make_iban("FR")
    text = f"IBAN {iban}"
    assert dlp.detect_spans(text, secrets=[iban[:10]]) == [("SECRET", 5, 15)]
    assert dlp.detect_spans(text, secrets=[iban]) == [("SECRET", 5, 5 + len(iban))]


def test_it_bounds_emails_to_local_at_domain():
    text = 'mailto:alice@example.com <bob@example.org> key=carol@example.net "dan@x.io".'
    assert found(text) == [
        ("EMAIL", "alice@example.com"),
        ("EMAIL", "bob@example.org"),
        ("EMAIL", "carol@example.net"),
        ("EMAIL", "dan@x.io"),
    ]


def test_it_bounds_bearer_tokens_and_ignores_placeholders():
    assert found(f"Authorization: Bearer {BEARER_TOKEN}") == [("SECRET", BEARER_TOKEN)]
    assert found(f'{{"Authorization": "Bearer {BEARER_TOKEN}"}}') == [("SECRET", BEARER_TOKEN)]
    assert found(f"Authorization: Bearer {JWT}.") == [("SECRET", JWT)]
    for placeholder in ("<YOUR_TOKEN>", "xxxxx", "xxxxxxxxxxxxxxxxxxxx", "YOUR_API_TOKEN_HERE"):
        assert found(f"Authorization: Bearer {placeholder}") == []


def test_it_bounds_pem_blocks_and_access_key_ids():
    text = f"key:\n{PEM}\nend"
    assert found(text) == [("SECRET", PEM)]
    raw = json.dumps({"key": PEM})
    escaped = json.dumps(PEM)[1:-1]
    assert found(raw) == [("SECRET", escaped)]
    assert found(f"aws_access_key_id={ACCESS_KEY_ID}") == [("SECRET", ACCESS_KEY_ID)]
    assert found("AKIAIOSFODNN7EXAMPLEX") == []


def test_it_finds_french_phone_forms_and_international_numbers():
    forms = [
        "06 12 34 56 78",
        "06.12.34.56.78",
        "06-12-34-56-78",
        "0612345678",
        "+33 6 12 34 56 78",
        "+33 (0)6 12 34 56 78",
        "0033 6 12 34 56 78",
        "+33612345678",
        "+1 (415) 555-2671",
        "+44 20 7946 0958",
    ]
    text = " ; ".join(forms)
    assert found(text) == [("PHONE", f) for f in forms]
    assert found("rappel au 06 12 34 56 78 2026 merci") == [("PHONE", "06 12 34 56 78")]


def test_it_never_alters_dotted_tool_names():
    for name in ("mailer.send", "jira.search", "payments.refund", "crm.contacts.get"):
        assert dlp.scrub_text(f"tool {name} called")[0] == f"tool {name} called"
        assert dlp.scrub({"tool": name, name: name})[0] == {"tool": name, name: name}


def test_it_filters_entities():
    text = f"mail bob@example.org iban {make_iban('FR')}"
    assert [e for e, _, _ in dlp.detect_spans(text, entities=["IBAN"])] == ["IBAN"]
    assert [e for e, _, _ in dlp.detect_spans(text, entities=("email",))] == ["EMAIL"]
    assert dlp.scrub_text(text, entities=[])[0] == text


def test_it_rejects_unknown_actions_and_entities():
    with pytest.raises(ValueError):
        dlp.scrub("x", action="block")
    with pytest.raises(ValueError):
        dlp.detect_spans("x", entities=["PASSPORT"])


def test_it_reports_findings_for_blocking():
    value = {"a": ["bob@example.org", {"k": f"card {CARDS['visa16']}"}], "n": 3}
    assert dlp.contains_findings(value) == {"EMAIL": 1, "CREDIT_CARD": 1}
    assert dlp.contains_findings({"tool": "mailer.send", "n": 1}) == {}
    assert dlp.as_findings({"EMAIL": 2, "IBAN": 1}) == [
        dlp.Finding("IBAN", 1),
        dlp.Finding("EMAIL", 2),
    ]


def test_it_finds_nothing_in_already_masked_output():
    for text, _ in labelled_records(200, seed=3):
        masked, _ = dlp.scrub_text(text)
        assert dlp.detect_spans(masked) == []
        redacted, _ = dlp.scrub_text(text, action="redact")
        assert dlp.detect_spans(redacted) == []


def test_it_labels_the_corpus_exactly():
    tp = fp = fn = 0
    flagged_clean = 0
    for text, labels in labelled_records(600, seed=5):
        expected = set()
        for entity, value in labels:
            start = text.index(value) if value in text else text.index(json.dumps(value)[1:-1])
            end = start + (len(value) if value in text else len(json.dumps(value)[1:-1]))
            expected.add((entity, start, end))
        got = set(dlp.detect_spans(text))
        tp += len(expected & got)
        fp += len(got - expected)
        fn += len(expected - got)
        flagged_clean += bool(got and not labels)
    assert (fp, fn, flagged_clean) == (0, 0, 0)
    assert tp > 300
