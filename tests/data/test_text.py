"""Captions as word ids: the tokenizer (on real Flickr30k captions too), the vocabulary (deterministic order,
unknown words, JSON file round trip and corrupt files), padded batches and GloVe vectors from tiny files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from rlattention.data.readers.precomp import read_captions
from rlattention.data.text import (
    END_ID,
    PAD_ID,
    SPECIAL_TOKENS,
    START_ID,
    UNK_ID,
    GloveFormatError,
    Vocabulary,
    VocabularyError,
    encode_batch,
    load_glove,
    tokenize,
)

# ------------------------------------------------------------------------------------------------ tokenizer


@pytest.mark.parametrize(
    ("caption", "tokens"),
    [
        ("A dog runs.", ["a", "dog", "runs"]),
        ("  Two  DOGS,\trunning!! ", ["two", "dogs", "running"]),
        ("the woman's hat", ["the", "woman", "'s", "hat"]),
        ("the woman 's hat", ["the", "woman", "'s", "hat"]),  # pre-tokenised precomp spelling: same tokens
        ("they’re here", ["they", "'re", "here"]),  # U+2019
        ("don't stop", ["don", "'t", "stop"]),
        ("a sign saying 'stop'", ["a", "sign", "saying", "stop"]),  # quotes are not clitics
        ("Kids ' Food", ["kids", "food"]),  # a lone apostrophe is dropped
        ("$ 37,000 .", ["37", "000"]),
        ("snake_case", ["snake", "case"]),
        ("Ｃａｆé ﬁsh", ["café", "fish"]),  # NFKC: full-width letters, ligature
        ("Cafe\u0301", ["café"]),  # combining accent composed by NFKC
        ("Straße ÉCOLE", ["straße", "école"]),
        ("", []),
        (" .,;!? ", []),
    ],
)
def test_tokenize(caption: str, tokens: list[str]) -> None:
    assert tokenize(caption) == tokens


def test_tokenize_refuses_bytes() -> None:
    with pytest.raises(TypeError, match="must be a str"):
        tokenize(b"a dog")  # type: ignore[arg-type]


def test_tokenize_real_flickr30k_lines(require_data) -> None:
    folder = require_data("f30k_precomp")
    dev = read_captions(folder / "dev_caps.txt")
    test = read_captions(folder / "test_caps.txt")
    assert tokenize(dev[0]) == "a group of people stand in the back of a truck filled with cotton".split()
    assert tokenize(dev[10]) == "boy in brown shirt with headphones on sits on woman 's shoulders in a crowd".split()
    assert tokenize(dev[121]) == "two rubbish men standing on they 're truck loading trash".split()  # they’re
    assert tokenize(test[3581]) == "protesters holding picket signs up man in center with a blue i 3ny shirt".split()
    assert tokenize(test[4524]) == "8 for iowa state stiff arms a texas am player attempting to tackle him".split()
    assert all(tokenize(caption) for caption in dev + test)  # every real caption has words


# ----------------------------------------------------------------------------------------------- vocabulary


def test_vocabulary_build_order_and_specials() -> None:
    vocab = Vocabulary.build(["b a c", "a b", "a d d"], min_count=1)
    assert vocab.words == [*SPECIAL_TOKENS, "a", "b", "d", "c"]  # by count (3, 2, 2, 1), ties alphabetical
    assert (PAD_ID, START_ID, END_ID, UNK_ID) == (0, 1, 2, 3)
    assert len(vocab) == 8 and "a" in vocab and "z" not in vocab
    assert Vocabulary.build(["a d d", "a b", "b a c"]) == vocab  # caption order does not matter
    assert Vocabulary.build(["b a c", "a b", "a d d"], min_count=2).words[4:] == ["a", "b", "d"]
    assert Vocabulary.build(["b a c", "a b", "a d d"], max_size=2).words[4:] == ["a", "b"]
    with pytest.raises(ValueError, match="min_count"):
        Vocabulary.build(["a"], min_count=0)


def test_vocabulary_encode_decode() -> None:
    vocab = Vocabulary.build(["a red dog", "a blue cat"])
    ids = vocab.encode("A red zebra!")
    assert ids[0] == START_ID and ids[-1] == END_ID and ids[3] == UNK_ID
    assert vocab.encode("A red zebra!", add_start_end=False) == ids[1:-1]
    assert vocab.decode(ids) == "a red <unk>"
    assert vocab.decode([*ids, PAD_ID, PAD_ID]) == "a red <unk>"
    assert vocab.decode(ids + [vocab.word_to_id("cat")]) == "a red <unk>"  # stops at <end>
    assert vocab.decode(np.array(ids), skip_special=False) == "<start> a red <unk> <end>"
    assert vocab.decode(torch.tensor(ids)) == "a red <unk>"
    with pytest.raises(ValueError, match="token id 99 is outside the vocabulary of 9 tokens"):
        vocab.decode([99])


def test_vocabulary_rejects_bad_words() -> None:
    with pytest.raises(VocabularyError, match="listed twice"):
        Vocabulary(["a", "b", "a"])
    with pytest.raises(VocabularyError, match="special token"):
        Vocabulary(["<unk>"])
    with pytest.raises(VocabularyError, match="whitespace"):
        Vocabulary(["a b"])


def test_vocabulary_dev_then_test_gives_unknown_words(require_data) -> None:
    folder = require_data("f30k_precomp")
    vocab = Vocabulary.build(read_captions(folder / "dev_caps.txt"))
    assert 4000 < len(vocab) < 5000 and vocab.words[4:7] == ["a", "in", "the"]
    dev_ids = [vocab.encode(c) for c in read_captions(folder / "dev_caps.txt")[:200]]
    assert not any(UNK_ID in ids for ids in dev_ids)
    tokens, lengths = encode_batch(read_captions(folder / "test_caps.txt"), vocab)
    assert tokens.shape[0] == 5000 and lengths.min() >= 3
    unknown = int((tokens == UNK_ID).sum())
    assert 0 < unknown < 0.1 * int(lengths.sum())  # some test words never occur in dev


def test_vocabulary_save_load_round_trip(tmp_path: Path) -> None:
    vocab = Vocabulary.build(["un café noir", "a dog 's bone", "ein Straße"])
    path = vocab.save(tmp_path / "sub" / "vocab.json")
    assert Vocabulary.load(path) == vocab
    assert json.loads(path.read_text(encoding="utf-8"))["words"] == vocab.words[4:]
    assert "café" in path.read_text(encoding="utf-8")  # UTF-8, not \u escapes
    assert [p.name for p in path.parent.iterdir()] == ["vocab.json"]  # no temporary file left


def test_vocabulary_load_errors(tmp_path: Path) -> None:
    path = tmp_path / "vocab.json"
    with pytest.raises(FileNotFoundError, match="vocab.json"):
        Vocabulary.load(path)
    good = Vocabulary(["a", "b"])
    good.save(path)
    text = path.read_text(encoding="utf-8")
    path.write_text(text[: len(text) // 2], encoding="utf-8")  # truncated
    with pytest.raises(VocabularyError, match=r"vocab\.json: not valid JSON \(line \d+, column \d+"):
        Vocabulary.load(path)
    document = json.loads(text)
    cases = [
        ({**document, "format": "other"}, "key 'format'"),
        ({**document, "version": 2}, "key 'version'"),
        ({**document, "specials": ["<pad>", "<unk>"]}, "key 'specials'"),
        ({**document, "words": "a b"}, "key 'words' must be a list"),
        ({**document, "words": ["a", "a"]}, "key 'words': word 1: 'a' is listed twice"),
        ({**document, "words": ["a", 3]}, "key 'words': word 1: a word must be a non-empty str"),
        ([1, 2], "expected a JSON object"),
    ]
    for content, message in cases:
        path.write_text(json.dumps(content), encoding="utf-8")
        with pytest.raises(VocabularyError, match=rf"vocab\.json: .*{message}"):
            Vocabulary.load(path)
    path.write_bytes(b'{"words": ["\xff"]}')
    with pytest.raises(VocabularyError, match="not UTF-8"):
        Vocabulary.load(path)


# ---------------------------------------------------------------------------------------------------- batches


def test_encode_batch_pads_and_cuts() -> None:
    vocab = Vocabulary.build(["a red dog runs", "a cat"])
    tokens, lengths = encode_batch(["a red dog runs", "a cat", "."], vocab)
    assert tokens.dtype == torch.int64 and lengths.dtype == torch.int64
    assert tokens.shape == (3, 6) and lengths.tolist() == [6, 4, 2]
    assert tokens[0].tolist() == vocab.encode("a red dog runs")
    assert tokens[1].tolist() == [*vocab.encode("a cat"), PAD_ID, PAD_ID]
    assert tokens[2].tolist() == [START_ID, END_ID, 0, 0, 0, 0]
    cut, cut_lengths = encode_batch(["a red dog runs", "a cat"], vocab, max_len=4)
    assert cut.shape == (2, 4) and cut_lengths.tolist() == [4, 4]
    assert cut[0].tolist() == vocab.encode("a red dog runs")[:4]
    bare, bare_lengths = encode_batch(["a cat", "."], vocab, add_start_end=False)
    assert bare.shape == (2, 2) and bare_lengths.tolist() == [2, 0]
    empty, empty_lengths = encode_batch([], vocab)
    assert empty.shape == (0, 0) and empty_lengths.shape == (0,)
    with pytest.raises(ValueError, match="max_len"):
        encode_batch(["a"], vocab, max_len=0)


# ------------------------------------------------------------------------------------------------------ GloVe


def _glove(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "glove.tiny.3d.txt"
    path.write_text(text, encoding="utf-8")
    return path


def test_load_glove_tiny_file(tmp_path: Path) -> None:
    vocab = Vocabulary.build(["the café dog", "the zebra"])  # the, café, dog, zebra
    path = _glove(
        tmp_path,
        "the 0.1 0.2 0.3\n"
        "cat 1 1 1\n"
        "Dog 9 9 9\n"  # cased: used only when no exact line exists
        "dog 0.5 -0.5 1e-1\n"
        "\n"
        "café 2 3 4\n"
        "the 7 7 7\n"  # a later duplicate is ignored
        ". . . 5 5 5\n",  # a word with spaces (840B has a few)
    )
    embeddings, found = load_glove(path, vocab)
    assert embeddings.dtype == np.float32 and embeddings.shape == (len(vocab), 3)
    assert found == 3
    np.testing.assert_allclose(embeddings[vocab.word_to_id("the")], [0.1, 0.2, 0.3], rtol=1e-6)
    np.testing.assert_allclose(embeddings[vocab.word_to_id("dog")], [0.5, -0.5, 0.1], rtol=1e-6)
    np.testing.assert_allclose(embeddings[vocab.word_to_id("café")], [2, 3, 4])
    assert (embeddings[PAD_ID] == 0).all()
    zebra = embeddings[vocab.word_to_id("zebra")]
    assert (np.abs(zebra) <= 0.1).all() and (zebra != 0).any()  # seeded uniform(-0.1, 0.1)
    again, _ = load_glove(path, vocab)
    np.testing.assert_array_equal(again, embeddings)  # deterministic
    zeros, _ = load_glove(path, vocab, dim=3, missing="zeros")
    assert (zeros[vocab.word_to_id("zebra")] == 0).all() and (zeros[UNK_ID] == 0).all()
    cased_only = _glove(tmp_path, "Dog 9 9 9\n")
    vectors, found = load_glove(cased_only, vocab)
    assert found == 1 and (vectors[vocab.word_to_id("dog")] == 9).all()


def test_load_glove_errors(tmp_path: Path) -> None:
    vocab = Vocabulary(["the", "dog"])
    with pytest.raises(FileNotFoundError, match=r"glove\.absent\.txt"):
        load_glove(tmp_path / "glove.absent.txt", vocab)
    path = _glove(tmp_path, "the 0.1 0.2 0.3\ndog 0.1 0.2\n")
    with pytest.raises(GloveFormatError, match=r"glove\.tiny\.3d\.txt: line 2: expected a word and 3 values, found 2"):
        load_glove(path, vocab)
    path = _glove(tmp_path, "the 0.1 0.2 0.3\ncat 0.1 0.2 0.3 0.4\n")  # checked even for words not kept
    with pytest.raises(GloveFormatError, match="line 2: .*found 4 values .*inconsistent vector dimension"):
        load_glove(path, vocab)
    path = _glove(tmp_path, "the 0.1 0.2 0.3\n")
    with pytest.raises(GloveFormatError, match="line 1: expected a word and 4 values, found 3"):
        load_glove(path, vocab, dim=4)
    path = _glove(tmp_path, "the 0.1 0.2 0.3\ndog 0.1 x 0.3\n")
    with pytest.raises(GloveFormatError, match=r"line 2: the 3 values after the word 'dog' must be numbers"):
        load_glove(path, vocab)
    path = _glove(tmp_path, "dog 0.1 nan 0.3\n")
    with pytest.raises(GloveFormatError, match="line 1: the vector of 'dog' holds non-finite values"):
        load_glove(path, vocab)
    path = _glove(tmp_path, "400000 3\nthe 0.1 0.2 0.3\n")
    with pytest.raises(GloveFormatError, match="line 1: .*word2vec header"):
        load_glove(path, vocab)
    path = _glove(tmp_path, "\n\n")
    with pytest.raises(GloveFormatError, match="no vectors"):
        load_glove(path, vocab)
    path.write_bytes(b"the 0.1 0.2 0.3\nd\xffg 1 2 3\n")
    with pytest.raises(GloveFormatError, match="line 2: not UTF-8"):
        load_glove(path, vocab)
