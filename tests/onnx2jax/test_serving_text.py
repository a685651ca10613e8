"""The incremental detokenizer of streaming (issue 29 item 4): each token's piece of text, joined, equals the
tokenizer's decode of all the ids past the prompt's text (``tokenizer.decode``, the independent reference), with
multi-byte UTF-8 characters split across tokens and the leading spaces of byte-level BPE (the fixtures'
tokenizer) and sentencepiece (a Llama-2-style tokenizer built here: "▁", byte fallback, the first space
stripped); stop strings cut the text where the whole text has them."""

from __future__ import annotations

import pathlib

import pytest
from hypothesis import given, settings, strategies as st
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers

from onnx2jax.serving.text import Detokenizer, IncrementalText, Text

GENAI = pathlib.Path(__file__).parents[1] / "data" / "genai"
BYTE_LEVEL = Tokenizer.from_file(str(GENAI / "llama_gqa" / "tokenizer.json"))
WORDS = ["the", "small", "model", "é", "日本", "naïve", "😀", "hello", "s", "ll", "x", "ü"]


def sentencepiece_tokenizer() -> Tokenizer:
    """A Llama-2-style tokenizer: BPE with byte fallback, spaces as "▁", the decoder stripping the text's first
    space (so a token's leading space depends on what comes before it)."""
    specials = ["<unk>", "<s>", "</s>"]
    pieces = specials + [f"<0x{b:02X}>" for b in range(256)]
    words = ["▁", "t", "h", "e", "s", "m", "a", "l", "▁t", "th", "▁th", "▁the", "▁s", "▁sm", "ma", "▁sma", "ll",
             "▁small", "é", "▁é", "o", "d", "▁m", "▁mo", "▁mod", "▁mode", "▁model"]
    vocab = {p: i for i, p in enumerate(pieces + words)}
    merges = [("▁", "t"), ("t", "h"), ("▁t", "h"), ("▁th", "e"), ("▁", "s"), ("▁s", "m"), ("m", "a"),
              ("▁sm", "a"), ("l", "l"), ("▁sma", "ll"), ("▁", "é"), ("▁", "m"), ("▁m", "o"), ("▁mo", "d"),
              ("▁mod", "e"), ("▁mode", "l")]
    tokenizer = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tokenizer.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tokenizer.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                           decoders.Strip(" ", 1, 0)])
    tokenizer.add_special_tokens([AddedToken(s, special=True) for s in specials])
    return tokenizer


SENTENCEPIECE = sentencepiece_tokenizer()
texts = st.lists(st.sampled_from(WORDS), min_size=1, max_size=4).map(" ".join)
gaps = st.sampled_from(["", " ", "  "])


def _decode(tokenizer: Tokenizer, ids: list[int]) -> str:
    return tokenizer.decode(ids, skip_special_tokens=True)


def _reference(tokenizer: Tokenizer, prompt: list[int], new: list[int]) -> str:
    """The text the new ids add: decode(prompt + new) past decode(prompt)."""
    whole, before = _decode(tokenizer, prompt + new), _decode(tokenizer, prompt)
    assert whole.startswith(before)
    return whole[len(before):]


def _streamed(tokenizer: Tokenizer, prompt: list[int], new: list[int]) -> list[str]:
    stream = IncrementalText(tokenizer, prompt)
    return [stream.add(t) for t in new] + [stream.flush()]


@settings(max_examples=150, deadline=None)
@given(prompt=texts, new=st.lists(st.integers(0, BYTE_LEVEL.get_vocab_size() - 1), max_size=16))
def test_byte_level_pieces_join_to_the_full_decode(prompt, new):
    """Any ids (specials, lone bytes of characters included) after a prompt of text."""
    ids = BYTE_LEVEL.encode(prompt).ids
    assert "".join(_streamed(BYTE_LEVEL, ids, new)) == _reference(BYTE_LEVEL, ids, new)


@settings(max_examples=150, deadline=None)
@given(prompt=texts, lead=gaps, words=st.lists(st.tuples(st.sampled_from(WORDS), gaps), max_size=6),
       special=st.one_of(st.none(), st.tuples(st.integers(0, 8), st.sampled_from([1, 2]))))
def test_sentencepiece_pieces_join_to_the_full_decode(prompt, lead, words, special):
    """Text the model could write (its bytes valid UTF-8, through byte fallback where a character has no
    piece), a special token anywhere, after a prompt of text: the first word keeps its leading space."""
    ids = SENTENCEPIECE.encode(prompt).ids
    new = SENTENCEPIECE.encode(lead + "".join(w + g for w, g in words), add_special_tokens=False).ids
    if special is not None:
        new.insert(min(special[0], len(new)), special[1])
    whole = _decode(SENTENCEPIECE, ids + new)
    if not whole.startswith(_decode(SENTENCEPIECE, ids)):  # byte fallback re-reading the prompt's last bytes
        return
    assert "".join(_streamed(SENTENCEPIECE, ids, new)) == _reference(SENTENCEPIECE, ids, new)


@pytest.mark.parametrize("tokenizer", [BYTE_LEVEL, SENTENCEPIECE], ids=["byte-level", "sentencepiece"])
def test_a_character_split_across_tokens_comes_whole_with_its_last_byte(tokenizer):
    prompt = tokenizer.encode("the").ids
    leading = " " if tokenizer is BYTE_LEVEL else ""  # sentencepiece's normalizer puts the "▁" in front
    new = tokenizer.encode(leading + "日本 é", add_special_tokens=False).ids
    assert len(new) > 3  # each CJK character is several byte tokens in both tokenizers
    pieces = _streamed(tokenizer, prompt, new)
    assert all("\ufffd" not in p for p in pieces)  # never half a character
    assert "".join(pieces) == _reference(tokenizer, prompt, new) and "".join(pieces).strip() == "日本 é"
    assert sum(1 for p in pieces if p) < len(new)  # the first bytes of a character gave nothing


def test_the_first_token_keeps_its_leading_space_in_context():
    prompt = SENTENCEPIECE.encode("the").ids
    new = SENTENCEPIECE.encode("small model", add_special_tokens=False).ids
    assert _decode(SENTENCEPIECE, new) == "small model"  # alone, the decoder strips the first space
    assert _streamed(SENTENCEPIECE, prompt, new) == [" small", " model", ""]


@settings(max_examples=60, deadline=None)
@given(words=st.lists(st.tuples(st.sampled_from(WORDS), gaps), min_size=1, max_size=8),
       stop=st.sampled_from(["model", "é", "ll", "本 ", "x"]))
def test_stop_strings_cut_the_text_where_the_whole_text_has_them(words, stop):
    text = Text(GENAI / "llama_gqa")
    prompt = text.encode("the", special=False)
    new = text.encode("".join(w + g for w, g in words), special=False)
    detok = Detokenizer(text, [stop], prompt)
    given_out = "".join(detok.add([t]) for t in new) + detok.flush()
    whole = _reference(text.tokenizer, prompt, new)
    assert detok.stopped == (stop in whole)
    assert given_out == (whole[:whole.index(stop)] if stop in whole else whole)
