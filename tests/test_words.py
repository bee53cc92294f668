"""The words the chapters' prose reads off a build's numbers (toycore.words)."""

from toycore import words


def test_row_ids_in_words():
    assert [words.id_list(ids) for ids in ([], ["b"], ["b", "c"], ["c", "e", "f"])] == [
        "none",
        "b",
        "b and c",
        "c, e and f",
    ]


def test_signed_differences_say_their_side_and_span():
    # written out: 0.427 and 0.784 above, rounded to whole percents
    assert words.signed_span([0.427, 0.784], "it", none="-") == "lies 43% to 78% above it"
    assert words.signed_span([-0.05, -0.0502], "it", none="-") == "lies 5% below it"
    assert words.signed_span([-0.02, 0.09], "it", none="-") == (
        "lies 2% to 9% off it, above it at some cells and below it at others"
    )
    assert words.signed_span([], "it", none="no cell") == "no cell"
