"""Copied: tokenizer.WordPiece's own greedy encoding."""
from tokenizer import SPECIAL_TOKENS, WordPiece


def encode_word(word, vocab):
    tok = WordPiece(list(SPECIAL_TOKENS) + sorted(set(vocab) - set(SPECIAL_TOKENS)))
    return [tok.id_to_token(i) for i in tok._wordpiece(word)]
