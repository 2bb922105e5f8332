"""Training data of the learned small-talk detector: no training example is an utterance of the
evaluation file or a near copy of one (the rule of `near_key` / `NearDuplicates`), the index
agrees with a plain pairwise check, and the shipped model was trained on the current, filtered
data."""

from __future__ import annotations

import difflib
import hashlib
from pathlib import Path

import pytest

from adaptive_rag.pinned import file_sha256
from adaptive_rag.routing.small_talk_model import DEFAULT_MODEL, SmallTalkModel
from adaptive_rag.training.small_talk import (
    NEAR_JACCARD,
    NEAR_RATIO,
    PHRASE_FILES,
    REPO_ROOT,
    Example,
    NearDuplicates,
    build_examples,
    held_out_texts,
    near_key,
)

DATA_DIR = REPO_ROOT.parent / "shared" / "data"

# The shipped model's held-out evaluation file (`make small-talk-model`).
HELD_OUT_FILES = (REPO_ROOT / "lab" / "experiments" / "small_talk_data" / "rasa_demo_nlu.jsonl",)


@pytest.fixture(scope="module")
def held_out() -> NearDuplicates:
    return NearDuplicates(held_out_texts(HELD_OUT_FILES))


def _pairwise_near(a: str, b: str) -> bool:
    """The rule written out plainly, for one pair of texts (no index)."""
    ka, kb = near_key(a), near_key(b)
    if not ka or not kb:
        return False
    ta, tb = set(ka.split()), set(kb.split())
    if ka == kb or len(ta & tb) / len(ta | tb) >= NEAR_JACCARD:
        return True
    if 2 * min(len(ka), len(kb)) / (len(ka) + len(kb)) < NEAR_RATIO:  # no ratio can reach it
        return False
    return (difflib.SequenceMatcher(None, ka, kb, autojunk=False).ratio() >= NEAR_RATIO
            or difflib.SequenceMatcher(None, kb, ka, autojunk=False).ratio() >= NEAR_RATIO)


def test_the_key_drops_case_punctuation_emoji_and_extra_spaces() -> None:
    assert near_key("  What's UP?!  bot 👋 ") == "whats up bot"
    assert near_key("Thank-you, so   much.") == "thank you so much"


def test_equal_after_normalising_word_overlap_and_character_ratio_are_each_near() -> None:
    index = NearDuplicates(["Who designed the robot?", "good evening to everyone", "zebra crossing"])
    assert index.match("who designed the ROBOT") == "who designed the robot"  # equal
    assert index.match("so who designed the robot") is not None  # Jaccard 4/5
    assert index.match("good evenin to everyone") is not None  # one letter less: ratio 0.98
    assert index.match("zebra crosing!") is not None  # a typo of a two-word utterance
    assert index.match("who painted the fence") is None  # Jaccard 2/6, ratio low
    assert index.match("good morning") is None
    assert index.match("") is None and index.match("?!") is None


def test_keep_drops_near_copies_and_counts_them_by_source_and_label() -> None:
    index = NearDuplicates(["hello there my good friend"])
    kept = [e for e in (Example("hello there, my good friend!", "greeting", "written", "g1"),
                        Example("hello there", "greeting", "written", "g2"),
                        Example("what is my balance", "none", "nq", "q1")) if index.keep(e)]
    assert [e.text for e in kept] == ["hello there", "what is my balance"]  # Jaccard 2/5
    assert index.removed == {"written/greeting": 1}


def test_the_index_agrees_with_the_plain_pairwise_rule(held_out: NearDuplicates) -> None:
    """On a fixed sample of unfiltered phrase-bank examples (some of them near copies), the
    indexed filter finds exactly the examples the pairwise rule finds."""
    texts = sorted({e.text for e in build_examples(None)},
                   key=lambda t: hashlib.sha256(t.encode()).digest())[:80]
    held = held_out.keys
    expected = {t for t in texts if any(_pairwise_near(t, h) for h in held)}
    found = {t for t in texts if held_out.match(t) is not None}
    assert found == expected
    assert expected, "the sample should hold near copies, else this test checks nothing"


def test_the_training_data_holds_no_utterance_of_the_evaluation_file_or_near_copy(held_out: NearDuplicates) -> None:
    """The examples `arag smalltalk train` fits on (phrase banks, augmentations, and the data
    directory's `train` questions when it is present)."""
    data_dir = DATA_DIR if (DATA_DIR / "nq-open_dev_natural-questions.jsonl").is_file() else None
    examples = build_examples(data_dir, NearDuplicates(held_out_texts(HELD_OUT_FILES)))
    near = [(e.text, held_out.match(e.text)) for e in examples if held_out.match(e.text) is not None]
    assert near == []
    assert len(examples) > 5000


def test_the_shipped_model_was_trained_on_the_current_filtered_data() -> None:
    """The shipped detector's card: decontaminated against the evaluation file as it is now, with
    this rule, on the phrase banks as they are now (a phrase edit needs a retrain)."""
    card = SmallTalkModel.load(DEFAULT_MODEL).info
    facts = card["decontamination"]
    held = {str(p.relative_to(REPO_ROOT)): file_sha256(p) for p in HELD_OUT_FILES}
    assert facts["held_out"] == held
    assert facts["rule"] == f"near_key equal, word Jaccard >= {NEAR_JACCARD}, or difflib ratio >= {NEAR_RATIO}"
    assert facts["removed"] > 0
    for path in PHRASE_FILES.values():
        assert card["inputs"][f"models/small_talk/{path.name}"] == file_sha256(path), f"{path.name} changed: retrain"


def test_training_refuses_to_run_without_its_held_out_files(tmp_path: Path) -> None:
    from adaptive_rag.training.small_talk import fit_detector

    with pytest.raises(FileNotFoundError, match="held-out"):
        fit_detector(tmp_path, tmp_path / "model.npz", held_out_files=[tmp_path / "missing.jsonl"])
