"""Token-importance weights: the paper's within-span weighting ablation (1.0 on nouns and verbs, 0.2 elsewhere).

A span's reward ``delta_t`` is multiplied by the weight of its token, so content words carry the full +-1 and
function words, adjectives, numbers and punctuation carry +-0.2 (Text2Grad, Appendix I.1, "Token Importance").

Part-of-speech tags come from TextBlob's bundled Pattern tagger (`textblob.en.taggers.PatternTagger`, PyPI
``textblob==0.20.1``, extra ``pos``): a Brill-style lexicon tagger whose lexicon ships inside the wheel
(``textblob/en/en-lexicon.txt``), so it runs offline with no model or NLTK-data download, in pure Python, at
roughly a millisecond per sentence. spaCy's English models are not published on PyPI by their authors and NLTK's
perceptron tagger needs a separate data download, which is why this one was chosen. Its tags are Penn Treebank
tags; nouns are ``NN*`` (proper nouns included), verbs ``VB*`` (``MD`` modals are not verbs here).

Mapping tags to tokens: each tagged word is located in the decoded response (left to right, exact substring);
a token gets the content weight when its characters overlap a noun or verb, else the other weight. Tokens
without characters (EOS) get the other weight (their label is 0 anyway).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Callable, Sequence

__all__ = [
    "CONTENT_WEIGHT",
    "OTHER_WEIGHT",
    "is_content_tag",
    "locate_tagged_words",
    "importance_weights",
    "pattern_tagger",
    "pos_importance_weights",
]

CONTENT_WEIGHT = 1.0
OTHER_WEIGHT = 0.2

Tagger = Callable[[str], list[tuple[str, str]]]


def is_content_tag(tag: str) -> bool:
    """Penn Treebank noun (NN, NNS, NNP, NNPS) or verb (VB, VBD, VBG, VBN, VBP, VBZ) tags."""
    return tag.startswith("NN") or tag.startswith("VB")


def locate_tagged_words(text: str, tagged: Sequence[tuple[str, str]]) -> list[tuple[int, int, str]]:
    """(start, end, tag) of each tagged word in ``text``, searched left to right; words not found are skipped."""
    out, pos = [], 0
    for word, tag in tagged:
        if not word:
            continue
        at = text.find(word, pos)
        if at < 0:
            continue
        out.append((at, at + len(word), tag))
        pos = at + len(word)
    return out


def importance_weights(
    offsets: Sequence[tuple[int, int]],
    words: Sequence[tuple[int, int, str]],
    *,
    content_weight: float = CONTENT_WEIGHT,
    other_weight: float = OTHER_WEIGHT,
) -> list[float]:
    """One weight per token from located, tagged words.

    Args:
        offsets: (start, end) characters of each token in the decoded response, shape (T, 2).
        words: (start, end, tag) per word (`locate_tagged_words`).

    Returns:
        T weights: ``content_weight`` where the token overlaps a noun or verb, else ``other_weight``.
    """
    content = [(s, e) for s, e, tag in words if is_content_tag(tag)]
    weights = []
    for start, end in offsets:
        hit = end > start and any(s < end and start < e for s, e in content)
        weights.append(content_weight if hit else other_weight)
    return weights


@lru_cache(maxsize=1)
def pattern_tagger() -> Tagger:
    """TextBlob's Pattern tagger as ``fn(text) -> [(word, tag), ...]``; a clear error if textblob is missing."""
    try:
        from textblob.en.taggers import PatternTagger
    except ImportError as exc:
        raise ImportError(
            "reward_weighting 'pos_importance' needs the POS tagger from textblob: pip install 'text2grad[pos]' "
            "(or pip install textblob==0.20.1)", name="textblob",
        ) from exc
    tagger = PatternTagger()
    return lambda text: [(str(w), str(t)) for w, t in tagger.tag(text)]


def pos_importance_weights(
    text: str,
    offsets: Sequence[tuple[int, int]],
    *,
    tagger: Tagger | None = None,
    content_weight: float = CONTENT_WEIGHT,
    other_weight: float = OTHER_WEIGHT,
) -> list[float]:
    """Token-importance weights of one decoded response (tagged with ``tagger``, default `pattern_tagger`)."""
    tagged = (tagger or pattern_tagger())(text) if text.strip() else []
    return importance_weights(
        offsets, locate_tagged_words(text, tagged), content_weight=content_weight, other_weight=other_weight
    )
