"""The rule every new name and external id keeps (`validation.check_identifier`): it shows as what it is,
so an operator who picks a rack, a schedule or a window by what they see acts on that one. Two racks
"r12" and "r12\\u200b" would print alike; a bidi override prints a name reversed."""

from __future__ import annotations

import re
import unicodedata

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rackflow.errors import InvalidArgument
from rackflow.validation import NAME_RULE, check_name, check_rename, check_text, unseen_character

# Each kind of character the rule refuses, with the name the refusal gives it.
UNSEEN = [
    ("\u200b", "U+200B ZERO WIDTH SPACE"),
    ("\u200c", "U+200C ZERO WIDTH NON-JOINER"),
    ("\u200d", "U+200D ZERO WIDTH JOINER"),
    ("\u2060", "U+2060 WORD JOINER"),
    ("\ufeff", "U+FEFF ZERO WIDTH NO-BREAK SPACE"),
    ("\u202a", "U+202A LEFT-TO-RIGHT EMBEDDING"),
    ("\u202e", "U+202E RIGHT-TO-LEFT OVERRIDE"),
    ("\u2066", "U+2066 LEFT-TO-RIGHT ISOLATE"),
    ("\u2069", "U+2069 POP DIRECTIONAL ISOLATE"),
    ("\u00ad", "U+00AD SOFT HYPHEN"),  # another format character (Cf)
    ("\U000e0041", "U+E0041 TAG LATIN CAPITAL LETTER A"),
    ("\u2028", "U+2028 LINE SEPARATOR"),
    ("\u2029", "U+2029 PARAGRAPH SEPARATOR"),
    ("\x07", "U+0007 <control>"),
    ("\x85", "U+0085 <control>"),
    ("\u00a0", "U+00A0 NO-BREAK SPACE"),  # looks like a space, is not one
    ("\u3000", "U+3000 IDEOGRAPHIC SPACE"),
    ("\ufe0f", "U+FE0F VARIATION SELECTOR-16"),  # draws nothing (Default_Ignorable_Code_Point)
    ("\u3164", "U+3164 HANGUL FILLER"),
    ("\u0378", "U+0378 <unassigned>"),
]


@pytest.mark.parametrize(("char", "named"), UNSEEN, ids=[named for _, named in UNSEEN])
def test_an_unseen_character_is_refused_naming_its_code_point_and_position(char: str, named: str) -> None:
    with pytest.raises(InvalidArgument) as refused:
        check_name(f"r12{char}x", "name")
    assert str(refused.value) == f"name: {f'r12{char}x'!r}: {named} at position 4 is not allowed; {NAME_RULE}"


def test_the_refusal_shows_the_name_escaped_so_it_does_not_print_as_another() -> None:
    with pytest.raises(InvalidArgument) as refused:
        check_name("r12\u200b", "schedule.name")
    message = str(refused.value)
    assert message.startswith("schedule.name: 'r12\\u200b': U+200B ZERO WIDTH SPACE at position 4 ")
    assert "\u200b" not in message


@pytest.mark.parametrize(
    ("name", "where"),
    [(" r1", "U+0020 SPACE at position 1 (the start)"), ("r1 ", "U+0020 SPACE at position 3 (the end)")],
)
def test_a_space_at_either_end_is_refused_and_inside_is_fine(name: str, where: str) -> None:
    with pytest.raises(InvalidArgument, match=rf"^name: .*: {re.escape(where)} is not allowed"):
        check_name(name, "name")
    assert check_name("rack 01", "name") == "rack 01"


def test_a_name_not_in_nfc_is_refused_and_its_nfc_form_is_taken() -> None:
    decomposed, composed = "cafe\u0301", "caf\u00e9"
    with pytest.raises(InvalidArgument) as refused:
        check_name(decomposed, "window.name")
    assert str(refused.value).startswith(
        "window.name: 'cafe\\u0301' is not in Unicode normal form NFC; 'caf\\xe9' looks the same"
    )
    assert check_name(composed, "window.name") == composed


@pytest.mark.parametrize("name", ["rack-01", "r12", "nvl-a", "Nacht/Wartung", "拠点-3", "rack_α", "🔥-hot"])
def test_visible_names_are_taken(name: str) -> None:
    assert check_name(name, "name") == name


def test_an_external_id_keeps_the_same_rule() -> None:
    with pytest.raises(InvalidArgument, match=r"^external_id: 'SN\\u200b1': U\+200B ZERO WIDTH SPACE"):
        check_text("SN\u200b1", "external_id", identifier=True)


def test_a_lookup_still_finds_a_name_stored_before_the_rule() -> None:
    """What a lookup checks (no control characters, within the length) lets a stored name through."""
    assert check_text("r12\u200b", "name", required=True) == "r12\u200b"
    assert check_text("r\u202e21", "target_spec.racks[0].name", required=True) == "r\u202e21"


def test_a_rename_keeps_the_name_it_has_and_checks_a_new_one() -> None:
    assert check_rename("r12\u200b", "schedule.name", current="r12\u200b") == "r12\u200b"
    with pytest.raises(InvalidArgument, match=r"^schedule\.name: .*U\+2060 WORD JOINER at position 2"):
        check_rename("r\u206012", "schedule.name", current="r12\u200b")
    assert check_rename("r12", "schedule.name", current="r12\u200b") == "r12"


@given(st.text(max_size=40))
def test_whatever_is_taken_shows_as_itself(name: str) -> None:
    """Any text: refused as INVALID_ARGUMENT, or taken, and then each character draws as itself (Python's
    isprintable: no control, format, separator or unassigned code point, no space but U+0020; a private-use
    character draws as the font has it), no space at either end, in NFC."""
    try:
        check_name(name, "name")
    except InvalidArgument as refused:
        assert str(refused).startswith("name: ")
        return
    assert name == name.strip() and unicodedata.is_normalized("NFC", name)
    assert all(char.isprintable() or unicodedata.category(char) == "Co" for char in name)
    assert unseen_character(name) is None


@given(
    st.text(st.characters(categories=["L", "N", "P", "S"]), min_size=1, max_size=20).map(
        lambda text: unicodedata.normalize("NFC", text)
    ),
    st.sampled_from([char for char, _ in UNSEEN]),
    st.data(),
)
def test_an_unseen_character_anywhere_is_found_where_it_is(name: str, char: str, data: st.DataObject) -> None:
    if unseen_character(name) is not None:  # a symbol that draws nothing (a variation selector, a filler)
        return
    at = data.draw(st.integers(0, len(name)))
    with pytest.raises(InvalidArgument, match=rf" at position {at + 1}\b"):
        check_name(name[:at] + char + name[at:], "name")
