"""Exercise 1: WordPiece's greedy longest-match-first encoding of one word (about 30 minutes).

Read first: notebooks/01_wordpiece.ipynb, its last part ("Encoding: BERT's greedy longest match").
Grade it:   python -m pytest exercises/test_01_wordpiece.py

BERT (Devlin et al. 2019) cuts text in two stages: a basic tokenizer splits it into words and punctuation
(tokenizer.basic_tokenize), then each word is cut into PIECES of a fixed vocabulary. The pieces that continue a
word are written with "##" in front, so "unaffable" becomes  un ##aff ##able  and the decoder can glue them back.

The rule is greedy: standing at the start of what is left of the word, take the LONGEST vocabulary piece that
matches there, step past it, repeat. If at some point no piece matches, the whole word is unknown.

Contract
    encode_word(word, vocab) -> list of piece strings
    word    one word as the basic tokenizer leaves it (lowercased, no whitespace)
    vocab   a set of piece strings: "un", "##aff", ... (a piece after the first is looked up WITH its "##")
    - greedy longest-match-first, left to right, as above
    - if no piece matches somewhere in the word, the result is ["[UNK]"]: the WHOLE word, not just the rest
    - a word longer than MAX_WORD_CHARS (100) characters is ["[UNK]"] without looking (BERT's rule)
    - the empty word has no pieces: []

    encode_word("unaffable", {"un", "##aff", "##able", "u", "##n"})  ->  ["un", "##aff", "##able"]
    encode_word("unaffable", {"un", "##aff"})                      ->  ["[UNK]"]      (nothing matches "able")
"""

UNK = "[UNK]"
PREFIX = "##"                 # marks a piece that continues a word
MAX_WORD_CHARS = 100          # BERT's max_input_chars_per_word


def encode_word(word, vocab):
    """Greedy longest-match-first split of `word` into pieces of `vocab` (see the module docstring)."""
    # TODO 1: the two early answers: a word longer than MAX_WORD_CHARS, and the empty word.
    # TODO 2: walk through the word: at `start`, find the longest piece that is in vocab, append it, move on.
    # TODO 3: if nothing matches at `start`, give up on the whole word.
    #
    # Hint 1: keep an index `start` into the word; the loop ends when start == len(word).
    # Hint 2: try end = len(word), len(word) - 1, ..., start + 1 and take the FIRST candidate word[start:end]
    #         that is in the vocabulary: trying the longest first is what makes the match the longest.
    # Hint 3: when start > 0 the candidate is PREFIX + word[start:end]. Python's for ... else runs the else
    #         branch when the loop ended without `break`: exactly "no piece matched".
    raise NotImplementedError("exercise 1: write encode_word (see the TODOs)")
