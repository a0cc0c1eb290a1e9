"""Property tests on answer extraction: boxes round-trip, scans never fail, numbers survive."""

from hypothesis import given, settings
from hypothesis import strategies as st

from rlvr.rewards.extract import after_hashes, answer_line, boxed_answers, last_boxed, last_number

# Text that cannot open a box or a group of its own.
plain = st.text(alphabet=st.characters(blacklist_characters="\\{}", blacklist_categories=("Cs",)), max_size=40)


@st.composite
def balanced(draw, depth=3):
    """A brace-balanced LaTeX-ish string, possibly with nested groups and escaped braces."""
    parts = draw(st.lists(plain, min_size=1, max_size=3))
    out = parts[0]
    for part in parts[1:]:
        inner = draw(balanced(depth - 1)) if depth > 0 else ""
        out += draw(st.sampled_from(["{" + inner + "}", "\\{", "\\}", "\\frac{" + inner + "}{2}"])) + part
    return out


@settings(max_examples=80, deadline=None)
@given(prefix=plain, content=balanced(), suffix=plain)
def test_last_box_round_trips(prefix, content, suffix):
    text = f"{prefix}\\boxed{{{content}}}{suffix}"
    expected = content.strip() or None
    assert last_boxed(text) == expected


@settings(max_examples=50, deadline=None)
@given(first=balanced(), second=balanced())
def test_boxes_in_order_and_nested_boxes_stay_whole(first, second):
    text = f"a \\boxed{{{first}}} b \\fbox{{\\boxed{{{second}}}}} c"
    found = boxed_answers(text)
    assert found[-1] == f"\\boxed{{{second}}}".strip()
    if first.strip():
        assert found[0] == first.strip()


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=300))
def test_scans_never_raise_on_any_text(text):
    for fn in (boxed_answers, last_boxed, answer_line, last_number, after_hashes):
        fn(text)
    for answer in boxed_answers(text):
        assert answer and answer == answer.strip()


@settings(max_examples=80, deadline=None)
@given(st.integers(-(10**9), 10**9), plain)
def test_last_number_and_hashes(n, noise):
    noise = "".join(ch for ch in noise if not ch.isdigit() and ch not in "-.,")
    assert last_number(f"1 then {noise} {n}") == str(n)
    assert after_hashes(f"work {noise}\n#### {n:,}") == f"{n:,}"


def test_unbalanced_box_and_token_box():
    assert last_boxed("\\boxed{1} then \\boxed{2") == "1"
    assert last_boxed("\\boxed 7 is it") == "7"
    assert last_boxed("\\boxedx{3}") is None
