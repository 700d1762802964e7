"""Exercise 1 as a student writes it from the stub's hints: an index into the word, end tried from the longest
candidate down, for ... else for "no piece matched"."""
UNK = "[UNK]"
PREFIX = "##"
MAX_WORD_CHARS = 100


def encode_word(word, vocab):
    if len(word) > MAX_WORD_CHARS:
        return [UNK]
    if word == "":
        return []
    pieces = []
    start = 0
    while start < len(word):
        for end in range(len(word), start, -1):
            candidate = word[start:end]
            if start > 0:
                candidate = PREFIX + candidate
            if candidate in vocab:
                pieces.append(candidate)
                start = end
                break
        else:
            return [UNK]
    return pieces
