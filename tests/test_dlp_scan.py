"""Each DLP detector reads the whole text: a decoy (a value-shaped string it rejects)
never stops the scan for the values after it; capitals, NIRs without a 2, the card
networks' table edges and the SIRET rule each have a test (issue 15, part 7: mutants of
`gateway/dlp.py` that passed every test)."""

import base64
import json

import pytest

from gateway import dlp
from tests.dlp_corpus import ACCESS_KEY_ID, BEARER_TOKEN, JWT, make_card, make_iban, make_nir

IBAN = make_iban("FR")
CARD = "4111 1111 1111 1111"
NIR = make_nir("1", "84", "12", "76", "451", "089")
BASIC = base64.b64encode(b"user:P4ssw0rd!S3cret").decode()


def found(text: str, **kwargs) -> list[tuple[str, str]]:
    return [(e, text[a:b]) for e, a, b in dlp.detect_spans(text, **kwargs)]


@pytest.mark.parametrize(
    ("decoys", "entity", "value"),
    [
        (["FR12 abc", "xFR7630006000011234567890189", "FR7630006000011234567890188"], "IBAN", IBAN),
        (["A4111111111111111B", "0.4111111111111111", "4111 1111 1111 1112"], "CREDIT_CARD", CARD),
        (["4111 1111 1111 1111 1111 1111 1111", "pan_4111111111111112"], "CREDIT_CARD", CARD),
        (
            ["ref 0612345678abc", "3.0612345678", "06 12 34 56 78 90", "S/N 0612345678"],
            "PHONE",
            "06 12 34 56 78",
        ),
        (["+45.46421134", "+33 6 12 34 56 78 90", "0012345678905"], "PHONE", "+33 6 12 34 56 78"),
        (["184127645108947", "x184127645108946", "1.84.12.76.451.089.47"], "NIR", NIR),
        (["a@b", "icon@2x.png", "@@"], "EMAIL", "ana@example.org"),
        (["eyJhbGciOiJIUzI1NiJ9", "xeyJ" + JWT[3:]], "SECRET", JWT),
        (["xAKIAIOSFODNN7EXAMPLE", "AKIAIOSFODNN7EXAMPLEX"], "SECRET", ACCESS_KEY_ID),
        (
            [
                "xBearer abcdefghijklmnop12",
                "Bearer Proxy-Authorization",
                "Bearer xxxxxxxxxxxxxxxxx",
            ],
            "SECRET",
            BEARER_TOKEN,
        ),
        (["xBasic " + BASIC, "Basic Authorization", "Basic aGVsbG8gd29ybGQ="], "SECRET", BASIC),
        (
            ["http://localhost:8080@x", "password: changeme", "api_key: X-Api-Key"],
            "SECRET",
            "Sup3rS3cretPw",
        ),
    ],
)
def test_a_decoy_never_stops_the_scan_for_the_rest_of_the_text(decoys, entity, value):
    if entity == "SECRET" and value == "Sup3rS3cretPw":
        tail = f"postgres://admin:{value}@db.internal/app"
    elif entity == "SECRET" and value == BEARER_TOKEN:
        tail = f"Authorization: Bearer {value}"
    elif entity == "SECRET" and value == BASIC:
        tail = f"Authorization: Basic {value}"
    else:
        tail = f"ok {value}."
    text = " ; ".join([*decoys, tail])
    assert found(text) == [(entity, value)], text


def test_capitals_are_read_as_any_case():
    assert found("AUTHORIZATION: BEARER abcdefghijklmnop1234") == [
        ("SECRET", "abcdefghijklmnop1234")
    ]
    assert found(f"AUTHORIZATION: BASIC {BASIC}") == [("SECRET", BASIC)]
    assert found(f"Authorization: bearer {BEARER_TOKEN}") == [("SECRET", BEARER_TOKEN)]
    assert found(f"iban {IBAN.lower()}") == [("IBAN", IBAN.lower())]
    # a capital first letter hid "Password=" from its gate ("pass" / "PASS" only)
    assert found("Password=Sup3rS3cretPw!") == [("SECRET", "Sup3rS3cretPw!")]
    assert found("Api_Key: Zx9vQ2LmP7w") == [("SECRET", "Zx9vQ2LmP7w")]
    assert found("PWD=Zx9vQ2LmP7w") == [("SECRET", "Zx9vQ2LmP7w")]
    assert found("pwd: Zx9vQ2LmP7w") == [("SECRET", "Zx9vQ2LmP7w")]
    assert found("Authorization: BeArEr abcdefghijklmnop1234") == [
        ("SECRET", "abcdefghijklmnop1234")
    ]
    assert found("authorization: Basic " + BASIC) == [("SECRET", BASIC)]


def test_a_nir_without_the_digit_two_is_found():
    nir = make_nir("1", "84", "11", "76", "451", "089")
    assert "2" not in nir
    assert found(f"NIR {nir}") == [("NIR", nir)]
    assert found(f"NIR {nir}", entities=["NIR"]) == [("NIR", nir)]


@pytest.mark.parametrize(
    ("prefix", "length", "is_card"),
    [
        ("81", 16, True),  # RuPay
        ("82", 16, True),
        ("80", 16, False),
        ("83", 16, False),
        ("81", 17, False),
        ("5018", 16, True),  # Maestro: 16 to 19 digits
        ("5018", 19, True),
        ("5018", 15, False),
        ("51", 16, True),  # Mastercard 51-55: 16 only
        ("55", 16, True),
        ("51", 19, False),
        ("2221", 16, True),  # Mastercard 2221-2720
        ("2720", 16, True),
        ("2220", 16, False),
        ("2721", 16, False),
        ("2200", 16, True),  # Mir 2200-2204
        ("2204", 19, True),
        ("2205", 16, False),
        ("2131", 15, True),  # legacy JCB
        ("3528", 16, True),  # JCB 3528-3589
        ("3589", 19, True),
        ("3527", 16, False),
        ("3590", 16, False),
        ("34", 15, True),  # Amex: 15 only
        ("37", 15, True),
        ("34", 16, False),
        ("300", 14, True),  # Diners 300-305, 3095, 36, 38, 39
        ("305", 14, True),
        ("306", 14, False),
        ("3095", 14, True),
        ("38", 16, True),
        ("1800", 15, True),  # legacy JCB; no UATP (1x): a NIR clash
        ("1801", 15, False),
        ("4", 13, True),  # Visa 13, 16, 19
        ("4", 14, False),
        ("4", 19, True),
        ("6011", 16, True),  # Discover, UnionPay, RuPay 6x: 16 to 19
        ("62", 19, True),
        ("6011", 15, False),
        ("7", 16, False),
        ("9", 16, False),
    ],
)
def test_the_card_network_table_edges(prefix, length, is_card):
    number = make_card(prefix, length)
    assert found(f"card {number} ok") == ([("CREDIT_CARD", number)] if is_card else [])


def test_a_diners_shaped_number_right_after_siret_is_the_siret():
    siret = make_card("36", 14)  # a SIRET is Luhn-valid, and Diners-shaped if it starts 36
    assert found(f"SIRET {siret}") == []
    assert found(f"siren/siret : {siret}") == []
    assert found(f"numéro {siret}") == [("CREDIT_CARD", siret)]
    far = "SIRET de la société mère, voir l'annexe B du contrat : " + siret
    assert found(far) == [("CREDIT_CARD", siret)]  # more than 40 characters after it
    # only a 14-digit number is read as the SIRET: a card after it is a card
    assert found(f"SIRET 362 521 879 00034 carte {CARD}") == [("CREDIT_CARD", CARD)]
    assert found(f"SIRET {make_card('4', 16)}") == [("CREDIT_CARD", make_card("4", 16))]


def test_a_barcode_is_no_card():
    ean = "4005208908413"  # an EAN-13 whose digits pass Luhn too
    assert dlp._luhn_ok(ean) and dlp._ean_ok(ean)
    assert found(f"item {ean}") == []
    visa13 = make_card("4", 13)
    assert not dlp._ean_ok(visa13)
    assert found(f"card {visa13}") == [("CREDIT_CARD", visa13)]
    assert found(f"EAN {visa13}") == []  # named as a barcode


# ------------------------------------------------ edges found by mutation testing


def test_a_phone_span_never_ends_inside_parentheses():
    assert found("tel +33 6 12 34 56 (78) 9") == []
    assert found("+33 (0)6 12 34 56 78") == [("PHONE", "+33 (0)6 12 34 56 78")]


def test_international_numbers_in_a_list_are_a_list():
    assert found("+33 612345678 612345678") == []
    assert found("+33 6 12 34 56 78 90") == []


@pytest.mark.parametrize("spaced", [False, True])
def test_a_nir_needs_an_order_number(spaced):
    nir = make_nir("1", "84", "12", "76", "451", "000")
    text = " ".join([nir[0], nir[1:3], nir[3:5], nir[5:7], nir[7:10], nir[10:13], nir[13:]])
    assert found(f"NIR {text if spaced else nir}") == []
    good = make_nir("1", "84", "12", "76", "451", "001")
    assert found(f"NIR {good}") == [("NIR", good)]


def test_a_nir_with_escaped_no_break_spaces():
    escaped = "\\u00a0".join(["1", "84", "12", "76", "451", "089", NIR[-2:]])
    assert found(f'{{"t": "{escaped}"}}') == [("NIR", escaped)]


def test_an_all_caps_word_is_no_bearer_token():
    assert found("Authorization: Bearer AUTHORIZATIONREQUIRED") == []
    assert found("Authorization: Bearer Authenticationrequired") == []
    assert found("Authorization: Bearer aUtHoRiZaTiOnReQuIrEd") == [
        ("SECRET", "aUtHoRiZaTiOnReQuIrEd")
    ]


def test_a_short_credential_in_base64_of_any_length_is_found():
    token = base64.b64encode(b"user:4821").decode()  # 12 characters
    for garbled in (token + "Q", token + "Q=="):  # a stray character: 13 before padding
        masked, counts = dlp.scrub_text(f"auth {garbled} end", secrets=["4821"])
        assert masked == "auth [SECRET] end" and counts == {"SECRET": 1}, garbled


def test_a_held_credential_masks_only_itself():
    for secret in ('pa"ss', "pässwörd", "x\\y"):
        assert dlp.scrub_text("full rule of null", secrets=[secret]) == ("full rule of null", {})
        raw = json.dumps({"v": secret})  # ensure_ascii: "p\u00e4ssw\u00f6rd"
        assert dlp.scrub_text(raw, secrets=[secret])[0] == '{"v": "[SECRET]"}', secret
        raw = json.dumps({"v": secret}, ensure_ascii=False)
        assert dlp.scrub_text(raw, secrets=[secret])[0] == '{"v": "[SECRET]"}', secret


def test_short_values_keep_a_quarter_at_each_end():
    assert dlp.mask_value("PHONE", "06123456") == "06****56"  # 8: keep 2
    assert dlp.mask_value("EMAIL", "abc@de.f") == "a**@**.f"  # 6: keep 1
    assert dlp.mask_value("EMAIL", "a@b.c") == "*@*.*"  # 3: keep 0
    assert dlp.mask_value("PHONE", "061234567") == "0612*4567"  # 9: keep 4


def test_counts_are_per_finding():
    text = "ana@example.org, bob@example.org and 06 12 34 56 78"
    assert dlp.scrub_text(text)[1] == {"EMAIL": 2, "PHONE": 1}
    assert dlp.contains_findings([text, text]) == {"EMAIL": 4, "PHONE": 2}


def test_keys_masked_alike_are_numbered_in_order():
    value = {"a@example.org": 1, "b@example.org": 2, "c@example.org": 3}
    out, counts = dlp.scrub(value, action="redact")
    assert out == {"[EMAIL]": 1, "[EMAIL]#2": 2, "[EMAIL]#3": 3} and counts == {"EMAIL": 3}


def test_credentials_that_are_not_text_are_ignored():
    value = {"pin": 4821, "s": "4821"}
    assert dlp.contains_findings(value, secrets=[4821, None, "", b"4821"]) == {}
    assert dlp.scrub(value, secrets=[4821, None, ""]) == (value, {})
    assert dlp.detect_spans("x 4821", secrets=["", "4821"]) == [("SECRET", 2, 6)]
    assert dlp.detect_spans("x 4821 MTIzNA==", secrets=[4821, None, b"1234"]) == []


def test_a_grouped_card_after_a_group_of_four_or_of_thirteen_digits():
    assert found(f"order 1234 {CARD}") == [("CREDIT_CARD", CARD)]
    assert found(f"order 5234 {CARD}") == [("CREDIT_CARD", CARD)]  # a run from 5234
    visa13 = make_card("4", 13)
    grouped = f"{visa13[:4]} {visa13[4:8]} {visa13[8:12]} {visa13[12]}"
    assert found(f"card {grouped} ok") == [("CREDIT_CARD", grouped)]


def test_an_address_takes_no_symbol_before_it():
    for before in ("«", "—", "€", "¿"):
        assert found(f"{before}ana@example.org") == [("EMAIL", "ana@example.org")], before
    assert found("«jürgen@example.de»") == [("EMAIL", "jürgen@example.de")]


def test_a_question_or_an_exclamation_ends_the_context_of_a_phone():
    assert found("Résultats du tirage ! 06 12 34 56 78") == [("PHONE", "06 12 34 56 78")]
    assert found("Un souci de commande ? 06 12 34 56 78") == [("PHONE", "06 12 34 56 78")]
    assert found("Résultats du tirage : 06 12 34 56 78") == []


def test_an_international_number_is_cut_back_to_a_valid_length():
    assert found("Call +44 20 7946 0958 123 4567") == [("PHONE", "+44 20 7946 0958")]


def test_a_number_before_a_phone_makes_it_a_list_only_if_it_is_a_pair():
    assert found("ref 12 06 12 34 56 78") == []
    assert found("bureau 1 06 12 34 56 78") == [("PHONE", "06 12 34 56 78")]
    assert found("en 2026 06 12 34 56 78") == [("PHONE", "06 12 34 56 78")]


def test_an_international_number_with_escaped_no_break_spaces():
    escaped = "\\u00a0".join(["+33", "6", "12", "34", "56", "78"])
    assert found(f'{{"t": "{escaped}"}}') == [("PHONE", escaped)]


def test_an_address_glued_to_a_held_credential_keeps_all_of_its_own_part():
    assert found("s3cr3tvaluejohn@x.org", secrets=["s3cr3tvalue"]) == [
        ("SECRET", "s3cr3tvalue"),
        ("EMAIL", "john@x.org"),
    ]
    assert found(f"s3cr3tvaluejohn@x.org {IBAN}", secrets=["s3cr3tvalue"]) == [
        ("SECRET", "s3cr3tvalue"),
        ("EMAIL", "john@x.org"),
        ("IBAN", IBAN),
    ]


def test_an_escaped_letter_at_the_very_start_belongs_to_the_address():
    assert found("\\u00e9ric@example.org") == [("EMAIL", "\\u00e9ric@example.org")]


def test_a_failed_jwt_start_does_not_hide_a_later_token():
    assert found(f"x eyJ then eyJnope. and {JWT}") == [("SECRET", JWT)]


def test_nothing_is_read_in_a_certificate_whatever_entities_are_asked_for():
    certificate = (
        "-----BEGIN CERTIFICATE-----\n"
        f"MIICCjCCAXOgAwIBAgIU {IBAN} 06 12 34 56 78 ana@example.org\n"
        "-----END CERTIFICATE-----"
    )
    assert found(certificate) == []
    assert found(certificate, entities=["IBAN", "PHONE", "EMAIL"]) == []
    assert found(f"{certificate}\n{IBAN}", entities=["IBAN"]) == [("IBAN", IBAN)]


def test_a_json_escape_at_the_very_start_is_a_boundary():
    assert found("\\n" + IBAN) == [("IBAN", IBAN)]
    assert found("\\t" + JWT) == [("SECRET", JWT)]
    assert found("\\n" + ACCESS_KEY_ID) == [("SECRET", ACCESS_KEY_ID)]


def test_a_barcode_check_digit_of_zero_and_a_gtin_14():
    ean = "4993891774210"  # EAN-13 and Luhn both pass, check digit 0
    assert dlp._ean_ok(ean) and found(f"item {ean}") == []
    gtin = "00496891517282"  # a GTIN-14 that also dials as +49 689 151 7282
    assert dlp._ean_ok(gtin) and found(f"carton {gtin}") == []
    assert found("tel 0049 6891 517282") == [("PHONE", "0049 6891 517282")]


def test_a_word_further_than_forty_characters_back_does_not_count():
    filler = " " + "a" * 33 + " "
    assert found(f"tirage{filler}06 12 34 56 78") == [("PHONE", "06 12 34 56 78")]
    assert found(f"tirage {filler[2:]}06 12 34 56 78") == []


def test_the_trunk_zero_after_the_country_code_is_dropped():
    assert found("+33 06 12 34 56 78") == [("PHONE", "+33 06 12 34 56 78")]


def test_pairs_from_the_start_of_the_text_are_a_list():
    assert found("12 06 12 34 56 78") == []


def test_fewer_than_eight_digits_are_no_phone():
    assert found("+683 4002") == []  # a valid Niue number: too short to tell from a count


def test_a_phone_after_one_inside_a_longer_one_is_found():
    assert found("+33 (0)6 12 34 56 78 ou 07 98 76 54 32") == [
        ("PHONE", "+33 (0)6 12 34 56 78"),
        ("PHONE", "07 98 76 54 32"),
    ]
    # "06 12 34 56 78" inside the international number is skipped, not the end of the scan
    assert found("+33 06 12 34 56 78 ou 07 98 76 54 32") == [
        ("PHONE", "+33 06 12 34 56 78"),
        ("PHONE", "07 98 76 54 32"),
    ]


def test_a_nir_born_in_an_unknown_month_99():
    nir = make_nir("1", "84", "99", "76", "451", "089")
    spaced = " ".join([nir[0], nir[1:3], nir[3:5], nir[5:7], nir[7:10], nir[10:13], nir[13:]])
    assert found(f"NIR {nir}") == [("NIR", nir)]
    assert found(f"NIR {spaced}") == [("NIR", spaced)]


def test_a_truncated_private_key_runs_to_its_last_line():
    block = "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\nAAAA"
    assert found(f"key {block}\n\n") == [("SECRET", block)]
    assert found(f"key {block} \t") == [("SECRET", block)]


def test_a_held_credential_with_a_quote_and_an_accent():
    secret = 'pä"ss'
    for ensure_ascii in (True, False):
        raw = json.dumps({"v": secret}, ensure_ascii=ensure_ascii)
        assert dlp.scrub_text(raw, secrets=[secret])[0] == '{"v": "[SECRET]"}', raw


def test_an_escaped_value_of_eight_keeps_two_at_each_end():
    assert dlp.mask_value("EMAIL", "ab\\u00e9d@ef.gh") == "ab**@**.gh"


def test_numbers_are_read_as_text_when_long_or_holding_a_credential():
    card = 4111111111111111
    assert dlp.scrub({"card": card}) == ({"card": "4111********1111"}, {"CREDIT_CARD": 1})
    assert dlp.scrub({"card": -card})[1] == {"CREDIT_CARD": 1}
    assert dlp.contains_findings({"card": float(card)}) == {"CREDIT_CARD": 1}
    assert dlp.scrub({"pin": 48213377}, secrets=["48213377"]) == (
        {"pin": "[SECRET]"},
        {"SECRET": 1},
    )
    assert dlp.scrub({"n": 99999999}) == ({"n": 99999999}, {})


def test_a_card_of_five_groups_after_one_more_group_but_not_in_a_longer_run():
    visa19 = make_card("4", 19)
    grouped = " ".join([visa19[:4], visa19[4:8], visa19[8:12], visa19[12:16], visa19[16:]])
    assert found(f"order 5234 {grouped}") == [("CREDIT_CARD", grouped)]  # six groups
    assert found(f"order 5234 5678 {grouped}") == []  # seven: a list of numbers


def test_a_value_right_where_a_held_credential_ends():
    assert found("pw-06 12 34 56 78", secrets=["pw-"]) == [
        ("SECRET", "pw-"),
        ("PHONE", "06 12 34 56 78"),
    ]


def test_a_letter_between_a_digit_and_a_phone_is_no_list():
    assert found("Bât 1a 06 12 34 56 78") == [("PHONE", "06 12 34 56 78")]


def test_a_nir_needs_a_department_and_a_month_that_exist():
    assert found(f"NIR {make_nir('1', '84', '12', '00', '451', '089')}") == []
    assert found("NIR 1.84.43.76.451.089.57") == []  # no month 43
    assert found("NIR 1.84.42.76.451.089.41") == [("NIR", "1.84.42.76.451.089.41")]


@pytest.mark.parametrize("encode", [base64.b64encode, base64.urlsafe_b64encode])
def test_a_short_credential_in_either_base64_alphabet(encode):
    token = encode(b"user:????").decode()  # "/" in one alphabet, "_" in the other
    masked, counts = dlp.scrub_text(f"auth {token} end", secrets=["????"])
    assert masked == "auth [SECRET] end" and counts == {"SECRET": 1}


def test_the_word_lists_are_the_words_given():
    assert dlp._words("tel fax", "sms  mobile") == frozenset({"tel", "fax", "sms", "mobile"})
    assert {"tirage", "serial", "ean", "postcode", "gps", "date"} <= dlp._NOT_PHONE_WORDS
    assert {"tél", "phone", "portable"} <= dlp._PHONE_WORDS and "mm" in dlp._UNIT_WORDS


def test_a_degree_sign_before_a_number_makes_it_a_position():
    assert found("45° 06 12 34 56 78") == []


def test_an_address_whose_at_sign_a_credential_took_is_dropped():
    assert found("ana.x@y.org and bob@b.co", secrets=["x@y"]) == [
        ("SECRET", "x@y"),
        ("EMAIL", "bob@b.co"),
    ]


def test_escaped_values_of_five_and_nine_keep_a_quarter_or_four():
    assert dlp.mask_value("EMAIL", "ab\\u00e9@c.d") == "a**@*.d"  # 5: keep 1
    assert dlp.mask_value("PHONE", "06\\u00a01234567") == "06\\u00a012*4567"  # 9: keep 4


def test_tuples_are_walked_too():
    assert dlp.scrub({"t": ("ana@example.org", 3)}) == (
        {"t": ("ana@e*****e.org", 3)},
        {"EMAIL": 1},
    )
