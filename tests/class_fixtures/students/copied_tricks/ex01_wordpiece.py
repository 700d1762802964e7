"""Dynamic: a module name computed at run time."""
import importlib


def encode_word(word, vocab):
    tok = importlib.import_module("tok" + "enizer").WordPiece(sorted(vocab))
    return [tok.id_to_token(i) for i in tok._wordpiece(word)]
