"""A program names an active query by its id or by the ``Query`` that ``add_query`` returned, and the alert policy it
asks for is checked before any arithmetic is done with it: each of these failed as a TypeError from inside
(``unhashable type: 'Query'``, ``unsupported operand type(s) for -: 'str' and 'float'``)."""

from __future__ import annotations

import pytest

from sdqes_edge.demo import DEMO_BUNDLE
from sdqes_edge.errors import UserError
from sdqes_edge.runtime import StreamingDetector

LAMP = "Tell me when the lamp turns on."


@pytest.fixture
def detector():
    detector = StreamingDetector(DEMO_BUNDLE)
    yield detector
    detector.close()


def test_the_query_that_add_query_returned_names_it_to_every_call_that_takes_an_id(detector):
    lamp = detector.add_query(LAMP, "The lamp is on.")
    detector.set_query_message(lamp, "Lamp!")
    assert detector.set_query_policy(lamp, threshold=0.6) is lamp
    assert (lamp.message, lamp.policy.threshold) == ("Lamp!", 0.6)
    assert detector.streams[0].alerts[lamp.id].policy == lamp.policy  # the stream's alert state follows
    detector.remove_query(lamp)
    assert detector.queries.ids == [] and lamp.id not in detector.streams[0].alerts


def test_a_query_no_longer_active_or_of_another_detector_is_refused_in_words(detector):
    lamp = detector.add_query(LAMP)
    detector.remove_query(lamp.id)
    again = detector.add_query(LAMP, query_id=lamp.id)  # the same id, given to another query since
    words = (r"^the query q1 \('Tell me .*'\) is not active here \(removed, or added to another detector\); "
             r"active ids: q1$")
    with pytest.raises(UserError, match=words):
        detector.remove_query(lamp)
    other = StreamingDetector(DEMO_BUNDLE)
    with pytest.raises(UserError, match=words):
        detector.set_query_message(other.add_query(LAMP), "Lamp!")
    other.close()
    assert detector.queries.ids == [again.id] and again.message == LAMP  # the query holding the id now is untouched


@pytest.mark.parametrize("name", [["q1"], 1, None])
def test_a_query_named_by_something_other_than_its_id_or_query_is_refused_in_words(detector, name):
    detector.add_query(LAMP)
    with pytest.raises(UserError, match=r"^a query is named by its id \(text, e.g. 'q1'\) or by the Query add_query "
                                        r"returned, not .*; active ids: q1$"):
        detector.remove_query(name)
    assert detector.queries.ids == ["q1"]


def test_a_threshold_of_text_is_refused_in_words_where_the_bundle_records_a_hysteresis_margin(detector):
    """The demo bundle records an exit margin, which was subtracted from the threshold before it was checked."""
    assert detector.bundle.alert_policy.get("exit_margin")
    with pytest.raises(UserError, match=r"^threshold is a number, not '0\.6'$"):
        detector.add_query(LAMP, threshold="0.6")
    lamp = detector.add_query(LAMP)
    with pytest.raises(UserError, match=r"^threshold is a number, not '0\.6'$"):
        detector.set_query_policy(lamp, threshold="0.6")
    assert lamp.policy.threshold == detector.bundle.default_threshold  # unchanged


def test_a_label_that_is_not_text_is_refused_before_it_picks_a_threshold(detector):
    with pytest.raises(UserError, match=r"^a query's label is text \(or None\), not list$"):
        detector.add_query(LAMP, label=["lamp_on"])
    assert detector.queries.ids == []
