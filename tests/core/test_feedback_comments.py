"""LLMs often annotate the JSON they write inside a fence with ``//`` or ``/* */`` comments; the parser drops the
comments and keeps ``//`` that is part of a quoted span (URLs)."""

from __future__ import annotations

import pytest

from text2grad.core.feedback import parse_feedback

FENCED_WITH_COMMENTS = """Here is my assessment:
```json
{
  // what worked and what did not
  "critique": "Cites http://example.com correctly", // a trailing note
  "good_spans": ["see https://docs.python.org/3/ for details"],  /* a block
  comment over two lines */
  "poor_spans": ["a // that is text, not a comment"], // none else
}
```"""


def test_comments_in_fenced_json_are_dropped_and_urls_in_spans_survive():
    result = parse_feedback(FENCED_WITH_COMMENTS)
    assert result.ok, result.error
    fb = result.feedback
    assert fb.critique == "Cites http://example.com correctly"
    assert fb.good_spans == ("see https://docs.python.org/3/ for details",)
    assert fb.poor_spans == ("a // that is text, not a comment",)


@pytest.mark.parametrize(
    "text, good",
    [
        ('{"good_spans": ["x"], // why\n "poor_spans": []}', ("x",)),
        ("{'good_spans': ['http://a.b/c'], /* c */ 'poor_spans': []}", ("http://a.b/c",)),
        ('{"good_spans": ["y"]}  // after the object', ("y",)),
    ],
)
def test_line_and_block_comments_in_any_quoting(text, good):
    result = parse_feedback(text)
    assert result.ok, result.error
    assert result.feedback.good_spans == good
