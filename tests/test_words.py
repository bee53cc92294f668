"""The words the chapters' prose reads off a build's numbers (toycore.words)."""

from toycore import records, words
from toycore.experiments import persian_rug as rug


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


def test_a_records_label_and_wording_are_said_only_where_they_differ():
    failed = dict(claim="c", passed=False, known_failure=False, outside_regime="")
    assert records.unlabelled_failure_words(failed).startswith("; the recorded row, made before")
    for quiet in (None, {**failed, "passed": True}, {**failed, "known_failure": True}):
        assert records.unlabelled_failure_words(quiet) == ""
    assert records.wording_words(failed, {"claim": "c"}) == ""
    assert records.wording_words(None, {"claim": "c"}) == ""
    assert records.wording_words(failed, {"claim": "d"}) == (
        " (the record tested an earlier wording: “c”)"
    )


def test_the_models_the_relu_model_does_not_beat_in_words():
    assert rug.not_beaten_words(0, 16, 0, 0.01) == "in all 16 models"
    assert (
        rug.not_beaten_words(1, 16, 1, 0.01) == "except in 1 of 16 models, at the sparsest p = 0.01"
    )
    assert (
        rug.not_beaten_words(2, 16, 2, 0.01)
        == "except in 2 of 16 models, all at the sparsest p = 0.01"
    )
    assert rug.not_beaten_words(3, 16, 2, 0.001) == (
        "except in 3 of 16 models, 2 of them at the sparsest p = 0.001"
    )
